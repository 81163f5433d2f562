use super::*;

fn env(pairs: &[(&str, &str)]) -> Option<HashMap<String, String>> {
    Some(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect())
}

#[test]
fn defaults_match_the_documented_file() {
    let c = Config::defaults().expect("defaults load");
    assert_eq!(c.endpoint, RuntimeEndpoint::Embedded { socket: None });
    assert_eq!(c.cri, CriConfig::default());
    assert_eq!(c.cri.deadlines.get(Rpc::PullImage), None);
    assert_eq!(c.cri.deadlines.get(Rpc::ImageStatus), Some(Duration::from_secs(120)));
    assert_eq!(c.log, LogConfig { format: LogFormat::Text, filter: "info".into() });
}

#[test]
fn file_then_env_then_overrides_win_in_that_order() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("imaged.toml");
    std::fs::write(&file, "[runtime]\nendpoint = \"unix:///from/file.sock\"\nmailbox_capacity = 7\n").expect("write");
    let sources = Sources {
        file: Some(file.clone()),
        env: env(&[
            ("IMAGED_RUNTIME__MAILBOX_CAPACITY", "9"),
            ("IMAGED_CONTAINERD_ENV", "/not/a/config/key"),
            ("PATH", "/bin"),
        ]),
        overrides: vec!["runtime.deadlines.pull_image=5m".into()],
    };
    let c = Config::load(&sources).expect("loads");
    assert_eq!(c.endpoint, RuntimeEndpoint::Cri(CriEndpoint::Unix("/from/file.sock".into())));
    assert_eq!(c.cri.mailbox_capacity, 9);
    assert_eq!(c.cri.deadlines.get(Rpc::PullImage), Some(Duration::from_secs(300)));

    let over = Sources { overrides: vec!["runtime.endpoint=tcp://127.0.0.1:9".into()], ..sources };
    let c = Config::load(&over).expect("loads");
    assert_eq!(c.endpoint, RuntimeEndpoint::Cri(CriEndpoint::Tcp("127.0.0.1:9".into())));
}

#[test]
fn bad_values_are_rejected_naming_key_and_value() {
    let cases = [
        ("[runtime]\nendpoint = \"http://x\"", "runtime.endpoint", "http://x"),
        ("[runtime]\nmailbox_capacity = 0", "runtime.mailbox_capacity", "0"),
        ("[runtime]\nconnect_timeout = \"ten\"", "runtime.connect_timeout", "ten"),
        ("[runtime]\nconnect_timeout = \"0s\"", "runtime.connect_timeout", "0s"),
        ("[runtime.deadlines]\npull_image = \"-1s\"", "runtime.deadlines.pull_image", "-1s"),
        ("[log]\nformat = \"xml\"", "log.format", "xml"),
        ("[log]\nfilter = \"imaged=loud\"", "log.filter", "imaged=loud"),
    ];
    for (toml, key, value) in cases {
        let err = Config::from_toml(toml).expect_err(toml).to_string();
        assert!(err.contains(key) && err.contains(value), "{toml}: {err}");
    }
}

#[test]
fn unknown_keys_and_wrong_types_are_rejected_by_name() {
    let err = Config::from_toml("[runtime]\nendpont = \"x\"").expect_err("typo").to_string();
    assert!(err.contains("endpont"), "{err}");
    let err = Config::from_toml("[runtime]\nmailbox_capacity = \"lots\"").expect_err("type").to_string();
    assert!(err.contains("mailbox_capacity") || err.contains("lots"), "{err}");
    let err = Config::load(&Sources { overrides: vec!["noequals".into()], ..Default::default() }).expect_err("override");
    assert!(err.to_string().contains("noequals"), "{err}");
    let missing = Sources { file: Some("/nonexistent/imaged.toml".into()), ..Default::default() };
    let err = Config::load(&missing).expect_err("missing file").to_string();
    assert!(err.contains("/nonexistent/imaged.toml"), "{err}");
}
