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

// === properties ===

#[allow(clippy::pedantic)] // test code: pedantic lints are for what ships
mod props {
    use std::collections::BTreeMap;

    use base64::Engine as _;
    use base64::engine::general_purpose::STANDARD;
    use proptest::prelude::*;
    use serde_json::json;

    use super::*;
    use crate::testing::props::{config, marker};

    /// One registry's credentials, the password a marker.
    #[derive(Debug, Clone)]
    struct Cred {
        username: String,
        password: String,
        /// Written as `auth` (base64 of `user:password`) instead of the two fields.
        as_auth: bool,
    }

    fn creds() -> impl Strategy<Value = BTreeMap<String, Cred>> {
        prop::collection::btree_map(
            "[a-z0-9]{1,10}(\\.[a-z]{2,5})?(:[0-9]{2,5})?",
            ("[a-z0-9_]{0,10}", marker(), any::<bool>()).prop_map(|(username, password, as_auth)| Cred {
                username,
                password,
                as_auth,
            }),
            0..5,
        )
    }

    fn auth_of(c: &Cred) -> String {
        STANDARD.encode(format!("{}:{}", c.username, c.password))
    }

    fn entries_json(creds: &BTreeMap<String, Cred>) -> Value {
        let mut m = Map::new();
        for (registry, c) in creds {
            let entry = if c.as_auth {
                json!({ "auth": auth_of(c) })
            } else {
                json!({ "username": c.username, "password": c.password })
            };
            m.insert(registry.clone(), entry);
        }
        Value::Object(m)
    }

    /// Every secret value of `creds`: none may appear in an error.
    fn secret_values(creds: &BTreeMap<String, Cred>) -> Vec<String> {
        creds.values().flat_map(|c| [c.password.clone(), auth_of(c)]).collect()
    }

    fn assert_hides(text: &str, secrets: &[String]) -> Result<(), TestCaseError> {
        for s in secrets {
            prop_assert!(!text.contains(s.as_str()), "{:?} leaked in {:?}", s, text);
        }
        Ok(())
    }

    /// What may be wrong with a manifest, and what the error must name.
    #[derive(Debug, Clone, Copy)]
    enum Fault {
        None,
        Kind,
        ApiVersion,
        NoName,
        NameNotAString,
        DataNotAnObject,
        DataNotBase64,
        DataNotAString,
        ConfigNotJson,
        AuthNotBase64,
        PasswordNotAString,
        AuthsNotAnObject,
    }

    impl Fault {
        /// The text the error must hold (`None`: no error).
        fn names(self) -> Option<&'static str> {
            Some(match self {
                Fault::None => return None,
                Fault::Kind => "kind must be \"Secret\"",
                Fault::ApiVersion => "apiVersion must be \"v1\"",
                Fault::NoName => "metadata.name is required",
                Fault::NameNotAString => "metadata.name: expected a string",
                Fault::DataNotAnObject => "data: expected an object",
                Fault::DataNotBase64 => "data[\".dockerconfigjson\"]: illegal base64 data",
                Fault::DataNotAString => "data[\".dockerconfigjson\"]: expected a string",
                Fault::ConfigNotJson => ".dockerconfigjson: invalid JSON",
                Fault::AuthNotBase64 => "].auth: unable to parse auth field",
                Fault::PasswordNotAString => "].password: expected a string",
                Fault::AuthsNotAnObject => "auths: expected an object",
            })
        }
    }

    fn fault() -> impl Strategy<Value = Fault> {
        prop::sample::select(vec![
            Fault::None,
            Fault::Kind,
            Fault::ApiVersion,
            Fault::NoName,
            Fault::NameNotAString,
            Fault::DataNotAnObject,
            Fault::DataNotBase64,
            Fault::DataNotAString,
            Fault::ConfigNotJson,
            Fault::AuthNotBase64,
            Fault::PasswordNotAString,
            Fault::AuthsNotAnObject,
        ])
    }

    /// A `kubernetes.io/dockerconfigjson` Secret manifest with `fault`
    /// (never more than one), and the secret values it holds.
    fn manifest(
        name: &str,
        namespace: &str,
        creds: &BTreeMap<String, Cred>,
        fault: Fault,
        bad: &str,
    ) -> (Value, Vec<String>) {
        let mut secrets = secret_values(creds);
        secrets.push(bad.to_string());
        let mut config = json!({ "auths": entries_json(creds) });
        match fault {
            Fault::AuthNotBase64 => {
                config["auths"]["bad.io"] = json!({ "auth": format!("{bad}!*") });
            }
            Fault::PasswordNotAString => {
                config["auths"]["bad.io"] = json!({ "username": "u", "password": [bad] });
            }
            Fault::AuthsNotAnObject => config["auths"] = json!([bad]),
            _ => {}
        }
        let config_text = match fault {
            Fault::ConfigNotJson => format!("{{\"auths\": {bad}"),
            _ => config.to_string(),
        };
        let data = match fault {
            Fault::DataNotAnObject => json!([STANDARD.encode(&config_text)]),
            Fault::DataNotBase64 => json!({ ".dockerconfigjson": format!("{bad}!*") }),
            Fault::DataNotAString => json!({ ".dockerconfigjson": { "v": bad } }),
            _ => json!({ ".dockerconfigjson": STANDARD.encode(&config_text) }),
        };
        secrets.push(STANDARD.encode(&config_text));
        let mut metadata = json!({ "name": name, "namespace": namespace, "uid": "u-1" });
        match fault {
            Fault::NoName => {
                metadata.as_object_mut().unwrap().remove("name");
            }
            Fault::NameNotAString => metadata["name"] = json!(7),
            _ => {}
        }
        let manifest = json!({
            "apiVersion": if matches!(fault, Fault::ApiVersion) { "v2" } else { "v1" },
            "kind": if matches!(fault, Fault::Kind) { "ConfigMap" } else { "Secret" },
            "metadata": metadata,
            "type": DOCKER_CONFIG_JSON_TYPE,
            "data": data,
        });
        (manifest, secrets)
    }

    /// Any JSON value, a few levels deep.
    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(|n| json!(n)),
            any::<f64>().prop_filter("finite", |f| f.is_finite()).prop_map(|f| json!(f)),
            "\\PC{0,12}".prop_map(Value::String),
            Just(json!("auths")),
            Just(json!("dXNlcjpwYXNz")),
        ];
        leaf.prop_recursive(4, 48, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                prop::collection::btree_map(
                    prop_oneof![
                        "\\PC{0,8}",
                        prop::sample::select(vec!["auths", "Auths", "auth", "username", "password", "HttpHeaders"])
                            .prop_map(str::to_string),
                    ],
                    inner,
                    0..6,
                )
                .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    fn sorted(config: DockerConfig) -> Vec<(String, String, String)> {
        let mut v: Vec<_> =
            config.entries.into_iter().map(|(k, e)| (k, e.username, e.password.expose().to_string())).collect();
        v.sort();
        v
    }

    proptest! {
        #![proptest_config(config(256))]

        #[test]
        fn any_bytes_as_a_manifest_or_config_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
            if let Ok(s) = PullSecret::from_manifest(&bytes) {
                let _ = s.docker_config();
            }
            let _ = PullSecret::from_manifest_json(&bytes);
            let _ = parse_docker_config_json(&bytes);
            let _ = parse_dockercfg(&bytes);
        }

        #[test]
        fn any_json_as_a_manifest_or_config_never_panics(v in json_value(), yaml in any::<bool>()) {
            let bytes = if yaml { serde_yaml_ng::to_string(&v).unwrap().into_bytes() } else { v.to_string().into_bytes() };
            if let Ok(s) = PullSecret::from_manifest(&bytes) {
                let _ = s.docker_config();
            }
            let _ = parse_docker_config_json(&bytes);
            let _ = parse_dockercfg(&bytes);
            // As a config, under `auths` too.
            let _ = parse_docker_config_json(json!({ "auths": v }).to_string().as_bytes());
        }

        #[test]
        fn a_config_json_round_trips(creds in creds(), legacy in any::<bool>()) {
            let (doc, parsed) = if legacy {
                let doc = entries_json(&creds).to_string();
                let parsed = parse_dockercfg(doc.as_bytes());
                (doc, parsed)
            } else {
                let doc = json!({ "auths": entries_json(&creds), "HttpHeaders": { "User-Agent": "x" } }).to_string();
                let parsed = parse_docker_config_json(doc.as_bytes());
                (doc, parsed)
            };
            let parsed = parsed.map_err(|e| TestCaseError::fail(format!("{doc}: {e}")))?;
            let want: Vec<_> =
                creds.iter().map(|(k, c)| (k.clone(), c.username.clone(), c.password.clone())).collect();
            prop_assert_eq!(sorted(parsed), want);
        }

        #[test]
        fn a_manifest_is_read_or_refused_naming_the_field_never_a_secret(
            name in "[a-z][a-z0-9-]{0,12}",
            namespace in "[a-z][a-z0-9-]{0,12}",
            creds in creds(),
            fault in fault(),
            bad in marker(),
            yaml in any::<bool>(),
        ) {
            let (m, secrets) = manifest(&name, &namespace, &creds, fault, &bad);
            let bytes = if yaml { serde_yaml_ng::to_string(&m).unwrap().into_bytes() } else { m.to_string().into_bytes() };
            let parsed = PullSecret::from_manifest(&bytes);
            if let Ok(s) = &parsed {
                assert_hides(&format!("{s:?}"), &secrets)?;
            }
            let result = parsed.and_then(|s| s.docker_config().map(|c| (s, c)));
            match (result, fault.names()) {
                (Ok((s, config)), None) => {
                    prop_assert_eq!(s.id(), format!("{namespace}/{name}"));
                    let want: Vec<_> =
                        creds.iter().map(|(k, c)| (k.clone(), c.username.clone(), c.password.clone())).collect();
                    prop_assert_eq!(sorted(config.expect("a docker config")), want);
                }
                (Ok(_), Some(want)) => prop_assert!(false, "accepted, wanted {:?}", want),
                (Err(e), None) => prop_assert!(false, "refused: {}", e),
                (Err(e), Some(want)) => {
                    let text = e.to_string();
                    prop_assert!(text.contains(want), "{:?} does not say {:?}", text, want);
                    if !matches!(fault, Fault::NoName | Fault::NameNotAString) {
                        prop_assert!(text.contains(&format!("{namespace}/{name}")), "{:?} does not name the secret", text);
                    }
                    assert_hides(&text, &secrets)?;
                    assert_hides(&format!("{e:?}"), &secrets)?;
                }
            }
        }

        #[test]
        fn a_damaged_manifest_never_shows_a_secret(
            creds in creds(),
            bad in marker(),
            yaml in any::<bool>(),
            cut in any::<prop::sample::Index>(),
            flip in any::<prop::sample::Index>(),
            byte in any::<u8>(),
        ) {
            let (m, secrets) = manifest("regcred", "team", &creds, Fault::None, &bad);
            let mut bytes = if yaml { serde_yaml_ng::to_string(&m).unwrap().into_bytes() } else { m.to_string().into_bytes() };
            let i = flip.index(bytes.len());
            bytes[i] = byte;
            bytes.truncate(cut.index(bytes.len() + 1));
            let result = PullSecret::from_manifest(&bytes).and_then(|s| s.docker_config().map(|_| s));
            if let Err(e) = result {
                assert_hides(&e.to_string(), &secrets)?;
                assert_hides(&format!("{e:?}"), &secrets)?;
            }
        }
    }
}

#[test]
fn deeply_nested_yaml_is_refused_before_it_is_parsed() {
    let deep = format!("a: {}1{}", "{a: ".repeat(50_000), "}".repeat(50_000));
    let err = PullSecret::from_manifest(deep.as_bytes()).unwrap_err().to_string();
    assert!(err.contains("nested deeper than 64 levels"), "{err}");
    // Brackets in quoted scalars and comments do not count; a real Secret passes.
    let fine = "apiVersion: v1\nkind: Secret\nmetadata: {name: regcred, namespace: team}  # {{{{\n\
                type: kubernetes.io/dockerconfigjson\nstringData:\n  .dockerconfigjson: '{\"auths\":{\"r.io\":{\"auth\":\"YWw6aHVudGVyMjI=\"}}}'\n";
    assert_eq!(flow_depth(fine.as_bytes()), 1);
    let secret = PullSecret::from_manifest(fine.as_bytes()).expect("a real Secret");
    assert_eq!(entries(&secret), vec![triple("r.io", "al", "hunter22")]);
}
