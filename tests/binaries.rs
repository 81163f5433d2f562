//! The binaries as a user runs them: exit codes and the main job's output.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::pedantic)] // test code: a failed unwrap is a failed test

use std::process::Command;

fn imaged() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_imaged"));
    // Keep the environment's IMAGED_* settings out of these runs.
    c.env_remove("RUST_LOG");
    c
}

#[test]
fn bad_configuration_exits_64_naming_the_key_and_value() {
    let out = imaged().args(["--set", "runtime.mailbox_capacity=0", "check-config"]).output().expect("run imaged");
    assert_eq!(out.status.code(), Some(64));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("runtime.mailbox_capacity") && err.contains("\"0\""), "{err}");

    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("bad.toml");
    std::fs::write(&file, "[pull]\nregistry_pull_qps = -1\n").expect("write");
    let out = imaged().arg("--config").arg(&file).arg("check-config").output().expect("run imaged");
    assert_eq!(out.status.code(), Some(64));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("invalid configuration: registryPullQPS (--registry-qps) -1 must not be a negative number"),
        "{err}"
    );

    let out =
        imaged().env("IMAGED_GC__IMAGE_GC_HIGH_THRESHOLD_PERCENT", "120").arg("check-config").output().expect("run");
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("imageGCHighThresholdPercent"));

    let out = imaged().arg("--no-such-flag").output().expect("run imaged");
    assert_eq!(out.status.code(), Some(64), "usage errors exit 64 too");
}

#[test]
fn simulate_refuses_configuration_flags_it_would_ignore() {
    let out =
        imaged().args(["--set", "gc.gc_period=1m", "simulate", "--seed", "1", "--steps", "1"]).output().expect("run");
    assert_eq!(out.status.code(), Some(64));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("imaged simulate takes no --config") && err.contains("each seed draws"), "{err}");
}

#[test]
fn a_duration_run_cannot_use_is_refused_by_check_config_and_run_alike() {
    // `runtime.deadlines.image_status = "20000y"` aborted `imaged run` at
    // start (a crash loop under systemd) while check-config accepted it;
    // "175200000h" is the same 20,000 years in Go's units.
    for key in ["runtime.deadlines.image_status", "pull.pull_deadline"] {
        let set = format!("{key}=175200000h");
        for cmd in ["check-config", "run"] {
            let out = imaged().args(["--set", &set, cmd]).output().expect("run imaged");
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(64), "{cmd} {set}: {err}");
            assert!(
                err.contains(&format!(
                    "invalid value \"175200000h\" for {key}: too large: at most 2562047h47m16.854775807s"
                )),
                "{cmd} {set}: {err}"
            );
        }
    }
}

#[test]
fn an_unreachable_runtime_exits_69() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sock = dir.path().join("none.sock");
    let api = dir.path().join("api.sock");
    let out = imaged()
        .args([
            "--runtime-endpoint",
            &format!("unix://{}", sock.display()),
            "--set",
            "runtime.startup_timeout=300ms",
            "--set",
            &format!("daemon.socket={}", api.display()),
            "--set",
            "daemon.metrics_address=127.0.0.1:0",
            "run",
        ])
        .output()
        .expect("run imaged");
    assert_eq!(out.status.code(), Some(69), "{}", String::from_utf8_lossy(&out.stderr));
}

/// The number after `label` on the summary line that starts with it.
fn figure(text: &str, label: &str) -> u64 {
    let line = text
        .lines()
        .map(str::trim_start)
        .find(|l| l.starts_with(label))
        .unwrap_or_else(|| panic!("no {label:?} line in:\n{text}"));
    let digits: String = line[label.len()..].trim_start().chars().take_while(char::is_ascii_digit).collect();
    digits.parse().unwrap_or_else(|_| panic!("no number after {label:?} in {line:?}"))
}

#[test]
fn the_main_job_replays_a_node_workload_on_the_embedded_runtime() {
    let out = imaged().arg("demo").output().expect("run imaged");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("imagectl --socket "), "the API is served while it runs:\n{text}");
    // Not a terminal: plain progress lines, no cursor movement.
    assert!(!text.contains('\x1b'), "{text}");
    assert!(text.lines().filter(|l| l.starts_with('[')).count() >= 2, "progress lines:\n{text}");
    let pods = figure(&text, "pods started");
    let pulls = figure(&text, "CRI pulls made");
    let requests = figure(&text, "requests needing a pull");
    let shared = figure(&text, "shared pulls");
    let backoffs = figure(&text, "back-offs");
    let freed = figure(&text, "GC freed");
    assert!(pods > 200, "{text}");
    assert!(pulls > 0 && shared > 0 && requests >= pulls + shared, "{text}");
    assert!(backoffs > 0, "the missing image and the canary without its secret back off:\n{text}");
    assert!(freed > 0, "the disk fills up and GC frees space:\n{text}");
    // The private registry's password (in the demo's pull secret) never shows.
    let all = format!("{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(!all.contains("demo-billing-token"), "{all}");
    for want in [
        "never started: ",
        "What imaged did better than the kubelet (measured in this run)",
        "The kubelet makes one PullImage call per such request",
        "p99 ",
    ] {
        assert!(text.contains(want), "missing {want:?} in:\n{text}");
    }
}

#[test]
fn the_main_job_needs_the_embedded_runtime_and_names_the_alternative() {
    let out = imaged()
        .args(["--runtime-endpoint", "unix:///nonexistent/containerd.sock", "demo"])
        .output()
        .expect("run imaged");
    assert_eq!(out.status.code(), Some(64));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("run `imaged run` and drive it with `imagectl`"), "{err}");
}

#[test]
fn a_bad_credential_provider_setup_exits_64_with_the_kubelets_text_in_check_config_and_run() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bin = dir.path().join("no-such-bin");
    let conf = dir.path().join("providers.yaml");
    std::fs::write(&conf, "apiVersion: kubelet.config.k8s.io/v1\nkind: CredentialProviderConfig\nproviders: []\n")
        .expect("write");
    let set = |k: &str, v: &std::path::Path| format!("credentials.{k}={}", v.display());
    let socket = format!("daemon.socket={}", dir.path().join("api.sock").display());
    let run = |cmd: &str| {
        imaged()
            .args(["--set", &set("provider_config", &conf), "--set", &set("provider_bin_dir", &bin)])
            .args(["--set", &socket, "--set", "daemon.metrics_address=", cmd])
            .output()
            .expect("run imaged")
    };
    for cmd in ["check-config", "run"] {
        let out = run(cmd);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{cmd}: {err}");
        assert!(
            err.contains(&format!(
                "configuration: Failed to register CRI auth plugins: plugin binary directory {} did not exist",
                bin.display()
            )),
            "{cmd}: {err}"
        );
    }

    std::fs::create_dir_all(&bin).expect("mkdir");
    for cmd in ["check-config", "run"] {
        let out = run(cmd);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{cmd}: {err}");
        assert!(
            err.contains("failed to validate credential provider config: providers: Required value: at least 1 item in plugins is required"),
            "{cmd}: {err}"
        );
    }

    // A typo'd field refuses the file, in check-config and in `imaged run`, as the kubelet (1.33+).
    std::fs::write(
        &conf,
        "apiVersion: kubelet.config.k8s.io/v1\nkind: CredentialProviderConfig\nproviders:\n  - name: p\n    matchImage: [r.io]\n    defaultCacheDuration: 1m\n    apiVersion: credentialprovider.kubelet.k8s.io/v1\n",
    )
    .expect("write");
    let want = format!(
        "Failed to register CRI auth plugins: error decoding config \"{}\": strict decoding error: unknown field \"providers[0].matchImage\"",
        conf.display()
    );
    for cmd in ["check-config", "run"] {
        let out = run(cmd);
        assert_eq!(out.status.code(), Some(64), "{cmd}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(&want), "{cmd}: {err}");
    }
}

#[test]
fn a_socket_group_that_does_not_exist_exits_64_in_check_config_and_run() {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = format!("daemon.socket={}", dir.path().join("api.sock").display());
    for cmd in ["check-config", "run"] {
        let out = imaged()
            .args(["--set", "daemon.socket_group=no-such-group-imaged", "--set", &socket])
            .args(["--set", "daemon.metrics_address=", cmd])
            .output()
            .expect("run imaged");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{cmd}: {err}");
        assert!(
            err.contains("invalid value \"no-such-group-imaged\" for daemon.socket_group: no such group on this host"),
            "{cmd}: {err}"
        );
    }
    assert!(!dir.path().join("api.sock").exists(), "refused before binding");
}

#[test]
fn check_config_prints_toml_that_config_reads_back_and_shows_origins() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fixture = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/kubelet-config.yaml");
    let out = imaged()
        .env("IMAGED_BACKOFF__MAX", "7m")
        .args(["--kubelet-config", fixture, "--set", "pull.throttle_mode=wait", "check-config"])
        .output()
        .expect("run imaged");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let printed = String::from_utf8(out.stdout).expect("utf-8");
    for line in ["image_gc_high_threshold_percent = 90", "throttle_mode = \"wait\"", "max = \"7m\""] {
        assert!(printed.lines().any(|l| l == line), "no {line:?} in:\n{printed}");
    }
    let file = dir.path().join("effective.toml");
    std::fs::write(&file, &printed).expect("write");
    // Fed back alone, the file gives the same configuration, printed the same.
    let again = imaged().arg("--config").arg(&file).arg("check-config").output().expect("run imaged");
    assert!(again.status.success(), "{}", String::from_utf8_lossy(&again.stderr));
    assert_eq!(String::from_utf8_lossy(&again.stdout), printed);

    let shown = imaged()
        .env("IMAGED_BACKOFF__MAX", "7m")
        .args(["--kubelet-config", fixture, "--set", "pull.throttle_mode=wait", "check-config", "--show-origin"])
        .output()
        .expect("run imaged");
    let shown = String::from_utf8_lossy(&shown.stdout);
    for line in [
        format!(
            "image_gc_high_threshold_percent = 90  # KubeletConfiguration {fixture} field imageGCHighThresholdPercent"
        ),
        "throttle_mode = \"wait\"  # flag".to_string(),
        "max = \"7m\"  # environment IMAGED_BACKOFF__MAX".to_string(),
        "format = \"text\"  # default".to_string(),
    ] {
        assert!(shown.lines().any(|l| l == line), "no {line:?} in:\n{shown}");
    }
}

#[test]
fn unknown_kubelet_configuration_fields_are_logged_as_the_kubelet_logs_them() {
    let dir = tempfile::tempdir().expect("tempdir");
    let k = dir.path().join("kubelet.yaml");
    std::fs::write(
        &k,
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nimageMinimumGCAg: 5m\nimageGCHighThresholdPercent: 90\n",
    )
    .expect("write");
    let out = imaged().arg("--kubelet-config").arg(&k).arg("check-config").output().expect("run imaged");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("WARN")
            && err.contains("Using lenient decoding as strict decoding failed")
            && err.contains(r#"err=strict decoding error: unknown field "imageMinimumGCAg""#)
            && err.contains(&k.display().to_string()),
        "{err}"
    );
    // The fields it knows are applied all the same.
    assert!(String::from_utf8_lossy(&out.stdout).contains("image_gc_high_threshold_percent = 90"));
}

#[test]
fn kubelet_config_fields_reach_the_configuration_and_bad_ones_exit_64() {
    let fixture = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/kubelet-config.yaml");
    let out = imaged().args(["--kubelet-config", fixture, "check-config"]).output().expect("run imaged");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        stdout.contains("image_gc_high_threshold_percent = 90\n") && stdout.contains("registry_burst = 20\n"),
        "{stdout}"
    );
    assert!(stdout.contains("endpoint = \"unix:///run/containerd/containerd.sock\"\n"), "{stdout}");

    let dir = tempfile::tempdir().expect("tempdir");
    let bad = dir.path().join("kubelet.yaml");
    std::fs::write(
        &bad,
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nimageMinimumGCAge: soon\n",
    )
    .expect("write");
    let out = imaged().arg("--kubelet-config").arg(&bad).arg("check-config").output().expect("run imaged");
    assert_eq!(out.status.code(), Some(64));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&bad.display().to_string()) && err.contains("field imageMinimumGCAge:"), "{err}");
}

#[test]
fn a_configuration_file_that_is_a_device_or_too_large_is_refused_by_name() {
    let dir = tempfile::tempdir().expect("tempdir");
    let big = dir.path().join("big.toml");
    std::fs::write(&big, "# padding\n".repeat(500_000)).expect("write");
    for (file, why) in [("/dev/zero", "not a regular file"), (big.to_str().expect("path"), "larger than 4194304 bytes")]
    {
        for bin in [env!("CARGO_BIN_EXE_imaged"), env!("CARGO_BIN_EXE_imagectl")] {
            let args: &[&str] = if bin.ends_with("imaged") { &["check-config"] } else { &["status"] };
            let out = std::process::Command::new(bin).args(["--config", file]).args(args).output().expect("run");
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(64), "{bin} --config {file}: {err}");
            assert!(err.contains(&format!("{file}: {why}")), "{bin} --config {file}: {err}");
        }
    }
    // The KubeletConfiguration file too.
    let out = imaged().args(["--kubelet-config", "/dev/zero", "check-config"]).output().expect("run");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{err}");
    assert!(err.contains("/dev/zero") && err.contains("not a regular file"), "{err}");
}
