use super::*;

/// Padded base64 of `al:hunter22`, its unpadded form, and `bob:pa:ss`
/// (length a multiple of 4, no padding).
const AUTH_PADDED: &str = "YWw6aHVudGVyMjI=";
const AUTH_RAW: &str = "YWw6aHVudGVyMjI";
const AUTH_COLONS: &str = "Ym9iOnBhOnNz";
/// Every secret value used below; none may appear in an error or `Debug`.
const SECRETS: &[&str] = &["hunter22", "hunter2", "s3cret", AUTH_PADDED, AUTH_RAW, AUTH_COLONS, "pa:ss", "topsecret"];

fn secret(type_: &str, key: &str, data: &str) -> PullSecret {
    PullSecret::new("team", "regcred", type_).with_uid("uid-1").with_data(key, data)
}

fn json_secret(data: &str) -> PullSecret {
    secret(DOCKER_CONFIG_JSON_TYPE, DOCKER_CONFIG_JSON_KEY, data)
}

fn entries(secret: &PullSecret) -> Vec<(String, String, String)> {
    let config = secret.docker_config().expect("decodes").expect("is a docker config");
    config.entries.into_iter().map(|(k, e)| (k, e.username, e.password.expose().to_string())).collect()
}

fn assert_no_secret(text: &str) {
    for s in SECRETS {
        assert!(!text.contains(s), "{s:?} leaked in {text:?}");
    }
}

fn triple(k: &str, u: &str, p: &str) -> (String, String, String) {
    (k.to_string(), u.to_string(), p.to_string())
}

#[test]
fn docker_config_table() {
    type Entries = Vec<(String, String, String)>;
    let cases: Vec<(&str, PullSecret, Entries)> = vec![
        (
            "dockerconfigjson",
            json_secret(
                r#"{"auths":{"registry.io":{"username":"u","password":"s3cret","email":"e@x"}},"HttpHeaders":{"X":"y"}}"#,
            ),
            vec![triple("registry.io", "u", "s3cret")],
        ),
        (
            "dockercfg",
            secret(
                DOCKERCFG_TYPE,
                DOCKERCFG_KEY,
                r#"{"https://index.docker.io/v1/":{"username":"u","password":"s3cret"}}"#,
            ),
            vec![triple("https://index.docker.io/v1/", "u", "s3cret")],
        ),
        (
            "padded auth overrides username/password",
            json_secret(&format!(
                r#"{{"auths":{{"r.io":{{"username":"x","password":"topsecret","auth":"{AUTH_PADDED}"}}}}}}"#
            )),
            vec![triple("r.io", "al", "hunter22")],
        ),
        (
            "unpadded auth",
            json_secret(&format!(r#"{{"auths":{{"r.io":{{"auth":"{AUTH_RAW}"}}}}}}"#)),
            vec![triple("r.io", "al", "hunter22")],
        ),
        (
            "auth split at the first colon",
            json_secret(&format!(r#"{{"auths":{{"r.io":{{"auth":"{AUTH_COLONS}"}}}}}}"#)),
            vec![triple("r.io", "bob", "pa:ss")],
        ),
        (
            "empty auth does not override",
            json_secret(r#"{"auths":{"r.io":{"username":"u","password":"s3cret","auth":""}}}"#),
            vec![triple("r.io", "u", "s3cret")],
        ),
        (
            "field names case-insensitive, unknown fields and nulls ignored",
            json_secret(
                r#"{"Auths":{"r.io":{"Username":"u","PASSWORD":"s3cret","email":null,"x":1}},"credsStore":"desktop"}"#,
            ),
            vec![triple("r.io", "u", "s3cret")],
        ),
        ("null entry", json_secret(r#"{"auths":{"r.io":null}}"#), vec![triple("r.io", "", "")]),
        ("no auths", json_secret(r#"{"credHelpers":{"r.io":"ecr"}}"#), vec![]),
        ("null document", json_secret("null"), vec![]),
    ];
    for (name, secret, want) in cases {
        assert_eq!(entries(&secret), want, "{name}");
    }
}

#[test]
fn other_secrets_are_ignored() {
    let cases = [
        secret("Opaque", DOCKER_CONFIG_JSON_KEY, "not json"),
        secret(DOCKER_CONFIG_JSON_TYPE, DOCKERCFG_KEY, "not json"),
        secret(DOCKERCFG_TYPE, DOCKER_CONFIG_JSON_KEY, "not json"),
        secret(DOCKER_CONFIG_JSON_TYPE, DOCKER_CONFIG_JSON_KEY, ""),
        secret(DOCKERCFG_TYPE, DOCKERCFG_KEY, ""),
        secret("kubernetes.io/basic-auth", "password", "hunter2"),
    ];
    for s in &cases {
        assert_eq!(s.docker_config(), Ok(None), "{s:?}");
    }
    assert_eq!(secrets_keyring(&cases), Ok(None));
}

#[test]
fn bad_configs_fail_naming_the_secret_never_the_content() {
    let cases: Vec<(&str, PullSecret, &str)> = vec![
        (
            "bad auth base64",
            json_secret(r#"{"auths":{"r.io":{"auth":"!!hunter2!!"}}}"#),
            r#"pull secret "team/regcred": .dockerconfigjson: auths["r.io"].auth: unable to parse auth field, must be formatted as base64(username:password)"#,
        ),
        (
            "auth without colon",
            json_secret(r#"{"auths":{"r.io":{"auth":"aHVudGVyMg=="}}}"#),
            r#"pull secret "team/regcred": .dockerconfigjson: auths["r.io"].auth: unable to parse auth field, must be formatted as base64(username:password)"#,
        ),
        (
            "padded auth with a wrong length",
            json_secret(r#"{"auths":{"r.io":{"auth":"YWw6aHVudGVyMjI=="}}}"#),
            "unable to parse auth field",
        ),
        (
            "undecodable JSON",
            json_secret(r#"{"auths":{"r.io":{"password":"hunter2"#),
            r#"pull secret "team/regcred": .dockerconfigjson: invalid JSON (unexpected end of input at line 1 column 37)"#,
        ),
        (
            "syntax error",
            json_secret(r#"{"auths":{"r.io":{"password":"s3cret" hunter2}}}"#),
            "invalid JSON (syntax error at line 1 column",
        ),
        (
            "password of the wrong type",
            json_secret(r#"{"auths":{"r.io":{"password":12345678}}}"#),
            r#"pull secret "team/regcred": .dockerconfigjson: auths["r.io"].password: expected a string"#,
        ),
        ("entry not an object", json_secret(r#"{"auths":{"r.io":"hunter2"}}"#), r#"auths["r.io"]: expected an object"#),
        ("top level not an object", json_secret(r#"["hunter2"]"#), "(top level): expected an object"),
        (
            "bad HttpHeaders",
            json_secret(r#"{"auths":{},"HttpHeaders":{"X":1}}"#),
            "HttpHeaders: expected an object of strings",
        ),
        (
            "dockercfg",
            secret(DOCKERCFG_TYPE, DOCKERCFG_KEY, r#"{"r.io":{"auth":"hunter2!"}}"#),
            r#"pull secret "team/regcred": .dockercfg: ["r.io"].auth: unable to parse auth field"#,
        ),
    ];
    for (name, secret, want) in cases {
        let err = secret.docker_config().expect_err(name);
        let text = err.to_string();
        assert!(text.contains(want), "{name}: {text}");
        assert_no_secret(&text);
        assert_no_secret(&format!("{err:?}"));
        assert!(!text.contains("12345678"), "{text}");
        // The whole lookup fails, even after a good secret.
        let good = json_secret(r#"{"auths":{"r.io":{"username":"u","password":"s3cret"}}}"#);
        assert_eq!(secrets_keyring(&[good, secret]).map(|_| ()), Err(err), "{name}");
    }
}

#[test]
fn keyring_from_secrets_keeps_secret_order_and_sources() {
    let first = json_secret(r#"{"auths":{"https://r.io/v2/":{"username":"a","password":"s3cret"}}}"#);
    let mut second =
        secret(DOCKERCFG_TYPE, DOCKERCFG_KEY, r#"{"r.io":{"username":"b","password":"hunter2"},"bad host":{}}"#);
    second.name = "other".into();
    second.uid = "uid-2".into();
    let keyring = secrets_keyring(&[first, PullSecret::new("team", "opaque", "Opaque"), second])
        .expect("decodes")
        .expect("has configs");
    let found = keyring.lookup("r.io/app");
    let got: Vec<(&str, &str)> =
        found.iter().map(|c| (c.username.as_str(), c.source.as_ref().map_or("", |s| s.secret_uid.as_str()))).collect();
    assert_eq!(got, vec![("a", "uid-1"), ("b", "uid-2")]);
    let source = found[1].source.clone().expect("source");
    assert_eq!((source.namespace.as_str(), source.name.as_str()), ("team", "other"));
    assert_eq!(keyring.index(), vec!["r.io"]);
    assert_no_secret(&format!("{found:?} {keyring:?}"));
}

#[test]
fn manifest_parsing() {
    use base64::Engine as _;
    let config = r#"{"auths":{"r.io":{"username":"u","password":"hunter2"}}}"#;
    let encoded = base64::engine::general_purpose::STANDARD.encode(config);
    let manifest = format!(
        r#"{{"apiVersion":"v1","kind":"Secret","metadata":{{"name":"regcred","namespace":"team","uid":"uid-1"}},
            "type":"kubernetes.io/dockerconfigjson","data":{{".dockerconfigjson":"{encoded}"}}}}"#
    );
    let s = PullSecret::from_manifest_json(manifest.as_bytes()).expect("valid manifest");
    assert_eq!(s, json_secret(config));
    assert_eq!(entries(&s), vec![triple("r.io", "u", "hunter2")]);
    assert_no_secret(&format!("{s:?}"));

    // stringData is plain text and overrides data; defaults for namespace/type.
    let string_data = serde_json::json!({
        "metadata": {"name": "plain"},
        "type": DOCKER_CONFIG_JSON_TYPE,
        "data": {".dockerconfigjson": "e30=", "other": null},
        "stringData": {".dockerconfigjson": config},
    })
    .to_string();
    let s = PullSecret::from_manifest_json(string_data.as_bytes()).expect("valid manifest");
    assert_eq!((s.namespace.as_str(), s.name.as_str(), s.uid.as_str()), ("default", "plain", ""));
    assert_eq!(s.data.get("other"), Some(&Vec::new()));
    assert_eq!(entries(&s), vec![triple("r.io", "u", "hunter2")]);
    let opaque = PullSecret::from_manifest_json(br#"{"metadata":{"name":"x"}}"#).expect("valid manifest");
    assert_eq!(opaque.type_, "Opaque");
}

#[test]
fn bad_manifests_name_the_secret_never_the_content() {
    let cases: &[(&str, &str)] = &[
        (
            r#"{"metadata":{"name":"s","namespace":"ns"},"data":{"k":"hunter2!"}}"#,
            r#"Secret manifest "ns/s": data["k"]: illegal base64 data"#,
        ),
        (
            r#"{"metadata":{"name":"s"},"data":{"k":"aHVudGVyMg"}}"#,
            r#"Secret manifest "default/s": data["k"]: illegal base64 data"#,
        ),
        (
            r#"{"metadata":{"name":"s"},"stringData":{"k":12345678}}"#,
            r#"Secret manifest "default/s": stringData["k"]: expected a string"#,
        ),
        (r#"{"metadata":{"name":"s"},"data":"hunter2"}"#, r#"Secret manifest "default/s": data: expected an object"#),
        (
            r#"{"kind":"ConfigMap","metadata":{"name":"s"},"data":{"p":"hunter2"}}"#,
            r#"Secret manifest "default/s": kind must be "Secret""#,
        ),
        (r#"{"apiVersion":"v2","metadata":{"name":"s"}}"#, r#"Secret manifest "default/s": apiVersion must be "v1""#),
        (
            r#"{"metadata":{"namespace":"ns"},"stringData":{"p":"hunter2"}}"#,
            r#"Secret manifest "<unnamed>": metadata.name is required"#,
        ),
        (
            r#"{"metadata":{"name":"s","password":"hunter2""#,
            r#"Secret manifest "<unnamed>": invalid JSON (unexpected end of input"#,
        ),
        (r#"["hunter2"]"#, r#"Secret manifest "<unnamed>": (top level): expected an object"#),
        (r#"{"metadata":"hunter2"}"#, r#"Secret manifest "<unnamed>": metadata: expected an object"#),
    ];
    for (manifest, want) in cases {
        let err = PullSecret::from_manifest_json(manifest.as_bytes()).expect_err(manifest);
        let text = err.to_string();
        assert!(text.starts_with(want), "{manifest}: {text}");
        assert_no_secret(&text);
        assert_no_secret(&format!("{err:?}"));
        assert!(!text.contains("12345678"));
    }
}

#[test]
fn debug_of_secrets_and_entries_is_redacted() {
    let s = json_secret(r#"{"auths":{"r.io":{"username":"u","password":"hunter2"}}}"#);
    let config = s.docker_config().expect("decodes").expect("config");
    let dump = format!("{s:?} {s:#?} {config:?} {config:#?}");
    assert_no_secret(&dump);
    assert!(dump.contains(".dockerconfigjson") && dump.contains("<redacted>"), "{dump}");
}

#[test]
fn yaml_manifests_parse_like_json_ones() {
    use base64::Engine as _;
    let config = r#"{"auths":{"r.io":{"username":"u","password":"hunter2"}}}"#;
    let encoded = base64::engine::general_purpose::STANDARD.encode(config);
    let yaml = format!(
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: regcred\n  namespace: team\n  uid: uid-1\n\
         type: kubernetes.io/dockerconfigjson\ndata:\n  .dockerconfigjson: {encoded}\n"
    );
    let from_yaml = PullSecret::from_manifest_yaml(yaml.as_bytes()).expect("valid YAML manifest");
    assert_eq!(from_yaml, json_secret(config));
    assert_eq!(PullSecret::from_manifest(yaml.as_bytes()).expect("detected as YAML"), from_yaml);
    let json = format!(
        r#"  {{"apiVersion":"v1","kind":"Secret","metadata":{{"name":"regcred","namespace":"team","uid":"uid-1"}},
            "type":"kubernetes.io/dockerconfigjson","data":{{".dockerconfigjson":"{encoded}"}}}}"#
    );
    assert_eq!(PullSecret::from_manifest(json.as_bytes()).expect("detected as JSON"), from_yaml);

    // stringData as a YAML block scalar; the document separator is fine.
    let block = "---\nkind: Secret\nmetadata: {name: plain}\ntype: kubernetes.io/dockerconfigjson\nstringData:\n  .dockerconfigjson: |\n    {\"auths\":{\"r.io\":{\"auth\":\"dTpodW50ZXIy\"}}}\n";
    let s = PullSecret::from_manifest(block.as_bytes()).expect("valid");
    assert_eq!(entries(&s), vec![triple("r.io", "u", "hunter2")]);
}

#[test]
fn bad_yaml_manifests_name_the_secret_never_the_content() {
    let cases: &[(&str, &str)] = &[
        (
            "metadata:\n  name: s\n  namespace: ns\ndata:\n  k: hunter2!\n",
            r#"Secret manifest "ns/s": data["k"]: illegal base64 data"#,
        ),
        (
            "metadata: {name: s}\nstringData:\n  k: 12345678\n",
            r#"Secret manifest "default/s": stringData["k"]: expected a string"#,
        ),
        (
            "kind: ConfigMap\nmetadata: {name: s}\ndata: {p: hunter2}\n",
            r#"Secret manifest "default/s": kind must be "Secret""#,
        ),
        (
            "metadata: {namespace: ns}\nstringData: {p: hunter2}\n",
            r#"Secret manifest "<unnamed>": metadata.name is required"#,
        ),
        ("metadata: {name: s\n  password: hunter2", r#"Secret manifest "<unnamed>": invalid YAML (at line"#),
        ("metadata: {name: s}\ndata: {p: \"hunter2\"\n", r#"Secret manifest "<unnamed>": invalid YAML"#),
        ("- hunter2\n", r#"Secret manifest "<unnamed>": (top level): expected an object"#),
        ("a: 1\n---\nb: hunter2\n", r#"Secret manifest "<unnamed>": invalid YAML"#),
        ("metadata: {name: s}\ndata: {? [hunter2] : x}\n", r#"Secret manifest "<unnamed>": invalid YAML"#),
    ];
    for (manifest, want) in cases {
        let err = PullSecret::from_manifest(manifest.as_bytes()).expect_err(manifest);
        let text = err.to_string();
        assert!(text.starts_with(want), "{manifest}: {text}");
        assert_no_secret(&text);
        assert_no_secret(&format!("{err:?}"));
        assert!(!text.contains("12345678"));
    }
}

#[test]
fn auth_wrapped_across_lines_decodes_as_gos_decoder_does() {
    // Go's base64 decoder skips \r and \n anywhere; the kubelet picks the
    // padded alphabet when the trimmed field ends in `=`.
    let cases = [
        ("Zm9vOm\nJhcg==\n", "foo", "bar"),
        ("Zm9vOmJh\r\ncg==", "foo", "bar"),
        ("YWw6aHVu\ndGVyMjI=", "al", "hunter22"),
        ("YWw6aHVudGVyMjI\n\n", "al", "hunter22"),
        ("\nYWw6\naHVudGVyMjI", "al", "hunter22"),
    ];
    for (auth, user, pass) in cases {
        let json = serde_json::json!({ "auths": { "r.io": { "auth": auth } } }).to_string();
        let config = parse_docker_config_json(json.as_bytes()).unwrap_or_else(|e| panic!("{auth:?}: {e}"));
        let [(key, entry)] = config.entries.as_slice() else { panic!("{auth:?}: one entry") };
        assert_eq!(key, "r.io");
        assert_eq!((entry.username.as_str(), entry.password.expose()), (user, pass), "{auth:?} in config.json");
        let cfg = serde_json::json!({ "r.io": { "auth": auth } }).to_string();
        let secret = secret(DOCKERCFG_TYPE, DOCKERCFG_KEY, &cfg);
        assert_eq!(entries(&secret), vec![triple("r.io", user, pass)], "{auth:?} in a .dockercfg Secret");
    }
    // Other white space is not skipped, as in Go.
    let json = r#"{"auths":{"r.io":{"auth":"Zm9v Om Jhcg=="}}}"#;
    assert!(parse_docker_config_json(json.as_bytes()).is_err(), "a space inside auth is refused");
}
