use super::*;

fn pod_secret(config: &str) -> PullSecret {
    PullSecret::new("team", "regcred", DOCKER_CONFIG_JSON_TYPE)
        .with_uid("uid-1")
        .with_data(DOCKER_CONFIG_JSON_KEY, config)
}

fn node() -> Keyring {
    let mut k = Keyring::new();
    k.add("https://index.docker.io/v1/", Credential::new("node-hub", "hub-pass", "")).expect("valid key");
    k.add("registry.example.com:5000", Credential::new("node-reg", "reg-pass", "")).expect("valid key");
    k
}

fn summary(auths: &[AuthConfig]) -> Vec<(&str, &str, &str)> {
    auths.iter().map(|a| (a.username.as_str(), a.password.expose(), a.server_address.as_str())).collect()
}

#[test]
fn pod_secrets_come_before_node_credentials() {
    let secrets =
        [pod_secret(r#"{"auths":{"registry.example.com:5000/team":{"username":"pod","password":"pod-pass"}}}"#)];
    let node = node();
    type Row<'a> = (&'a str, &'a str, &'a str);
    let cases: &[(&str, Vec<Row>)] = &[
        (
            "registry.example.com:5000/team/app:1.0",
            vec![
                ("pod", "pod-pass", "registry.example.com:5000"),
                ("node-reg", "reg-pass", "registry.example.com:5000"),
            ],
        ),
        ("registry.example.com:5000/other/app", vec![("node-reg", "reg-pass", "registry.example.com:5000")]),
        ("busybox", vec![("node-hub", "hub-pass", "")]),
        (
            "docker.io/user/app@sha256:0000000000000000000000000000000000000000000000000000000000000000",
            vec![("node-hub", "hub-pass", "")],
        ),
        ("quay.io/app", vec![]),
    ];
    for (image, want) in cases {
        let got = credentials_for_image(&secrets, Some(&node), image).expect("lookup");
        assert_eq!(summary(&got), *want, "{image}");
    }
    // Without node credentials, only the secrets.
    let got = credentials_for_image(&secrets, None, "registry.example.com:5000/team/app").expect("lookup");
    assert_eq!(summary(&got), vec![("pod", "pod-pass", "registry.example.com:5000")]);
    assert!(credentials_for_image(&[], None, "busybox").expect("lookup").is_empty());
}

#[test]
fn union_keyring_keeps_sources() {
    let secrets = [pod_secret(r#"{"auths":{"*.example.com":{"username":"pod","password":"pod-pass"}}}"#)];
    let node = node();
    let union = make_docker_keyring(&secrets, Some(&node)).expect("decodes");
    assert!(union.secrets().is_some());
    let found = union.lookup("a.example.com/app");
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].source.as_ref().map(|s| s.name.as_str()), Some("regcred"));
    assert_eq!(found[0].key, "*.example.com");
    let named = image_repo("a.example.com/app").expect("valid");
    assert_eq!(found[0].to_auth_config(&named).server_address, "a.example.com");
    let none = make_docker_keyring(&[PullSecret::new("team", "x", "Opaque")], Some(&node)).expect("decodes");
    assert!(none.secrets().is_none());
    assert_eq!(none.lookup("busybox").len(), 1);
}

#[test]
fn a_bad_secret_or_image_fails_the_lookup_without_leaking() {
    let secrets = [pod_secret(r#"{"auths":{"r.io":{"password":"hunter2""#)];
    let err = credentials_for_image(&secrets, Some(&node()), "busybox").expect_err("bad secret");
    assert!(matches!(err, CredentialError::Secret { .. }), "{err:?}");
    assert!(err.to_string().starts_with("pull secret \"team/regcred\": .dockerconfigjson: invalid JSON"), "{err}");
    assert!(!err.to_string().contains("hunter2") && !format!("{err:?}").contains("hunter2"));

    let err = credentials_for_image(&[], None, "Busybox").expect_err("bad image");
    assert!(matches!(err, CredentialError::InvalidImage { .. }), "{err:?}");
    assert!(err.to_string().starts_with("couldn't parse image name \"Busybox\""), "{err}");
}

#[test]
fn auth_configs_are_redacted_in_debug() {
    let secrets = [pod_secret(r#"{"auths":{"r.io":{"username":"u","password":"hunter2"}}}"#)];
    let auths = credentials_for_image(&secrets, None, "r.io/app").expect("lookup");
    assert_eq!(auths.len(), 1);
    let dump = format!("{auths:?} {auths:#?}");
    assert!(!dump.contains("hunter2"), "{dump}");
    assert_eq!(auths[0].password.expose(), "hunter2");
}
