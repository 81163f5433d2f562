use std::path::Path;

use super::*;

/// `(dir name, file name, content)` written under a temp dir.
type File<'a> = (&'a str, &'a str, &'a str);

fn write(root: &Path, files: &[File]) {
    for (dir, name, content) in files {
        let d = root.join(dir);
        std::fs::create_dir_all(&d).expect("mkdir");
        std::fs::write(d.join(name), content).expect("write");
    }
}

/// config.json in a, b; .dockercfg in c, d (all under `root`).
fn search(root: &Path) -> DockerConfigSearch {
    DockerConfigSearch {
        config_json_dirs: vec![root.join("a"), root.join("b")],
        dockercfg_dirs: vec![root.join("c"), root.join("d")],
    }
}

fn users(k: &Keyring, image: &str) -> Vec<(String, String)> {
    k.lookup(image).into_iter().map(|c| (c.username, c.password.expose().to_string())).collect()
}

const JSON_A: &str = r#"{"auths":{"reg.io":{"username":"a","password":"pa"}}}"#;
const JSON_B: &str = r#"{"auths":{"reg.io":{"username":"b","password":"pb"}}}"#;
const CFG_C: &str = r#"{"reg.io":{"username":"c","password":"pc"}}"#;
const CFG_D: &str = r#"{"reg.io":{"username":"d","password":"pd"}}"#;

#[test]
fn search_order_and_first_valid_file_wins() {
    // (files present, whose credentials are used: None = no valid file)
    let cases: &[(&str, &[File], Option<&str>)] = &[
        ("first config.json", &[("a", "config.json", JSON_A), ("b", "config.json", JSON_B)], Some("a")),
        ("second config.json", &[("b", "config.json", JSON_B), ("c", ".dockercfg", CFG_C)], Some("b")),
        (
            "an undecodable config.json is skipped",
            &[("a", "config.json", "{not json"), ("b", "config.json", JSON_B)],
            Some("b"),
        ),
        (
            "a bad auth field makes the file invalid",
            &[("a", "config.json", r#"{"auths":{"reg.io":{"auth":"!!"}}}"#), ("b", "config.json", JSON_B)],
            Some("b"),
        ),
        (
            "any config.json before any .dockercfg",
            &[("c", ".dockercfg", CFG_C), ("b", "config.json", JSON_B)],
            Some("b"),
        ),
        ("legacy fallback", &[("c", ".dockercfg", CFG_C), ("d", ".dockercfg", CFG_D)], Some("c")),
        ("bad legacy skipped", &[("c", ".dockercfg", "[1]"), ("d", ".dockercfg", CFG_D)], Some("d")),
        (
            "config.json under a .dockercfg dir is not read",
            &[("c", "config.json", JSON_A), ("a", ".dockercfg", CFG_C)],
            None,
        ),
        ("nothing there", &[], None),
    ];
    for (name, files, want) in cases {
        let dir = tempfile::tempdir().expect("tempdir");
        write(dir.path(), files);
        let s = search(dir.path());
        match (read_docker_config(&s), want) {
            (Ok(found), Some(w)) => {
                let k = config_keyring(&found.config, "test");
                assert_eq!(users(&k, "reg.io/app"), vec![(w.to_string(), format!("p{w}"))], "{name}");
                assert!(found.path.starts_with(dir.path().join(w)), "{name}: {}", found.path.display());
            }
            (Err(e), None) => {
                let c = dir.path().join("c").display().to_string();
                let d = dir.path().join("d").display().to_string();
                assert_eq!(
                    e.to_string(),
                    format!("couldn't find valid .dockercfg after checking in [{c} {d}]"),
                    "{name}"
                );
            }
            (got, want) => panic!("{name}: got {got:?}, want {want:?}"),
        }
    }
}

#[test]
fn an_empty_config_json_is_valid_and_wins() {
    let dir = tempfile::tempdir().expect("tempdir");
    write(dir.path(), &[("a", "config.json", "{}"), ("c", ".dockercfg", CFG_C)]);
    let found = read_docker_config(&search(dir.path())).expect("valid");
    assert!(found.config.entries.is_empty());
}

#[test]
fn only_auths_are_read_and_auth_overrides_user_and_password() {
    let dir = tempfile::tempdir().expect("tempdir");
    // base64("u1:p1") padded, base64("user2:pw2") unpadded (len % 4 != 0).
    let json = r#"{
        "auths": {
            "padded.io": {"username": "ignored", "password": "ignored", "auth": "dTE6cDE="},
            "raw.io": {"auth": "dXNlcjI6cHcy"},
            "https://index.docker.io/v1/": {"username": "hub", "password": "hubpw"}
        },
        "credHelpers": {"helper.io": "ecr-login"},
        "credsStore": "desktop",
        "HttpHeaders": {"User-Agent": "x"}
    }"#;
    write(dir.path(), &[("a", "config.json", json)]);
    let found = read_docker_config(&search(dir.path())).expect("valid");
    let k = config_keyring(&found.config, "test");
    assert_eq!(users(&k, "padded.io/x"), vec![("u1".into(), "p1".into())]);
    assert_eq!(users(&k, "raw.io/x"), vec![("user2".into(), "pw2".into())]);
    assert_eq!(users(&k, "docker.io/library/busybox"), vec![("hub".into(), "hubpw".into())]);
    assert!(k.lookup("helper.io/x").is_empty(), "credHelpers are not supported");
}

#[test]
fn kubelet_default_order() {
    let s = DockerConfigSearch::kubelet_order(
        Path::new("/var/lib/kubelet"),
        Some(Path::new("/work")),
        Path::new("/home/u"),
    );
    let strs = |v: &[PathBuf]| v.iter().map(|p| p.display().to_string()).collect::<Vec<_>>();
    assert_eq!(strs(&s.config_json_dirs), ["/var/lib/kubelet", "/work", "/home/u/.docker", "/.docker"]);
    assert_eq!(strs(&s.dockercfg_dirs), ["/var/lib/kubelet", "/work", "/home/u", "/"]);
    assert_eq!(
        NoDockerConfig(s.dockercfg_dirs).to_string(),
        "couldn't find valid .dockercfg after checking in [/var/lib/kubelet /work /home/u /]"
    );
}

#[test]
fn errors_never_show_values() {
    let dir = tempfile::tempdir().expect("tempdir");
    write(
        dir.path(),
        &[("a", "config.json", r#"{"auths":{"reg.io":{"password":"hunter2","auth":"hunter2-not-base64"}}}"#)],
    );
    let found = read_docker_config(&search(dir.path()));
    assert!(found.is_err());
    let e = parse_docker_config_json(br#"{"auths":{"reg.io":{"password":"hunter2","auth":"hunter2-not-base64"}}}"#)
        .expect_err("bad auth");
    let text = e.to_string();
    assert!(text.contains("unable to parse auth field") && !text.contains("hunter2"), "{text}");
}

#[tokio::test(start_paused = true)]
async fn re_read_at_most_once_per_period() {
    let dir = tempfile::tempdir().expect("tempdir");
    write(dir.path(), &[("a", "config.json", JSON_A)]);
    let files = NodeConfigFiles::new(search(dir.path()), DEFAULT_CACHE_PERIOD);
    assert_eq!(users(&*files.keyring().await, "reg.io/x"), vec![("a".into(), "pa".into())]);

    // Changed on disk: still the cached content until the period is over.
    write(dir.path(), &[("a", "config.json", JSON_B)]);
    tokio::time::advance(DEFAULT_CACHE_PERIOD.checked_sub(Duration::from_secs(1)).unwrap()).await;
    assert_eq!(users(&*files.keyring().await, "reg.io/x"), vec![("a".into(), "pa".into())]);
    tokio::time::advance(Duration::from_secs(1)).await;
    assert_eq!(users(&*files.keyring().await, "reg.io/x"), vec![("b".into(), "pb".into())]);

    // Removed: an empty keyring is cached too, then the new file is seen.
    std::fs::remove_file(dir.path().join("a/config.json")).expect("rm");
    tokio::time::advance(DEFAULT_CACHE_PERIOD).await;
    assert!(files.keyring().await.is_empty());
    write(dir.path(), &[("d", ".dockercfg", CFG_D)]);
    assert!(files.keyring().await.is_empty());
    tokio::time::advance(DEFAULT_CACHE_PERIOD).await;
    assert_eq!(users(&*files.keyring().await, "reg.io/x"), vec![("d".into(), "pd".into())]);
}

#[tokio::test]
async fn zero_period_re_reads_every_time() {
    let dir = tempfile::tempdir().expect("tempdir");
    write(dir.path(), &[("a", "config.json", JSON_A)]);
    let clock = crate::clock::ManualClock::new();
    let files = NodeConfigFiles::new(search(dir.path()), Duration::ZERO).with_clock(clock.clock());
    assert_eq!(users(&*files.keyring().await, "reg.io/x"), vec![("a".into(), "pa".into())]);
    write(dir.path(), &[("a", "config.json", JSON_B)]);
    assert_eq!(users(&*files.keyring().await, "reg.io/x"), vec![("b".into(), "pb".into())]);
}

#[tokio::test]
async fn no_valid_file_is_logged_with_the_kubelets_text() {
    let buf = crate::testing::LogLines::default();
    let writer = buf.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let dir = tempfile::tempdir().expect("tempdir");
    write(dir.path(), &[("a", "config.json", r#"{"auths":{"reg.io":{"password":"hunter2","auth":"!!"}}}"#)]);
    let files = NodeConfigFiles::new(search(dir.path()), DEFAULT_CACHE_PERIOD);
    {
        let _guard = tracing::subscriber::set_default(subscriber);
        assert!(files.keyring().await.is_empty());
    }
    let log = buf.text();
    let (c, d) = (dir.path().join("c").display().to_string(), dir.path().join("d").display().to_string());
    assert!(
        log.contains(&format!(
            "Docker config file not found: couldn't find valid .dockercfg after checking in [{c} {d}]"
        )),
        "{log}"
    );
    assert!(log.contains("unable to parse auth field") && !log.contains("hunter2"), "{log}");
}
