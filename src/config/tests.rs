#![allow(clippy::pedantic)] // test code: pedantic lints are for what ships
use super::*;
use crate::actors::pull_queue::{Concurrency, ThrottleMode};
use crate::cri::{CriEndpoint, Rpc};
use crate::ensure::PresenceWindow;
use std::path::PathBuf;
use std::time::Duration;

fn env(pairs: &[(&str, &str)]) -> Option<HashMap<String, String>> {
    Some(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect())
}

#[test]
fn defaults_match_the_documented_file() {
    let c = Config::defaults().expect("defaults load");
    assert_eq!(c.endpoint, RuntimeEndpoint::Embedded { socket: None });
    assert_eq!(c.cri, CriSettings::default());
    assert_eq!(c.cri.deadlines.get(Rpc::PullImage), None);
    assert_eq!(c.cri.deadlines.get(Rpc::ImageStatus), Some(Duration::from_secs(120)));
    assert_eq!(c.log, LogSettings { format: LogFormat::Text, filter: "info".into() });
    assert_eq!(c.embedded_state_dir, None);
}

#[test]
fn the_embedded_state_dir_is_a_path_and_a_file_there_is_refused_naming_the_key() {
    let c = Config::from_toml("[runtime]\nembedded_state_dir = \"/var/lib/imaged-embedded\"").unwrap();
    assert_eq!(c.embedded_state_dir, Some(PathBuf::from("/var/lib/imaged-embedded")));
    let file = tempfile::NamedTempFile::new().unwrap();
    let toml = format!("[runtime]\nembedded_state_dir = {:?}", file.path().display().to_string());
    let err = Config::from_toml(&toml).unwrap_err().to_string();
    assert!(err.contains("runtime.embedded_state_dir") && err.contains("is not a directory"), "{err}");
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
        ..Sources::default()
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
fn durations_past_gos_largest_are_refused_in_every_section() {
    // Each of these panicked in tonic, tokio or std before it was bounded
    // (tonic's set_timeout at the first pull, the gateway's deadline at start).
    let keys = [
        ("pull", "pull_deadline"),
        ("pull", "slow_pull_warning"),
        ("pull", "stall_warning"),
        ("pull", "stall_timeout"),
        ("runtime", "connect_timeout"),
        ("runtime", "startup_timeout"),
        ("runtime.deadlines", "image_status"),
        ("runtime.deadlines", "pull_image"),
        ("daemon", "shutdown_grace"),
        ("gc", "image_minimum_gc_age"),
        ("gc", "image_maximum_gc_age"),
        ("credentials", "cache_period"),
        ("credentials", "provider_timeout"),
        ("backoff", "max"),
        ("backoff", "gc_interval"),
    ];
    for (section, key) in keys {
        // One nanosecond past Go's largest duration, and far past it.
        for big in ["2562047h47m16.854775808s", "175200000h"] {
            let toml = format!("[{section}]\n{key} = \"{big}\"\n");
            let err = Config::from_toml(&toml).expect_err(&toml).to_string();
            assert_eq!(
                err,
                format!(
                    "configuration: invalid value \"{big}\" for {section}.{key}: \
                     too large: at most 2562047h47m16.854775807s (Go's largest duration)"
                ),
                "{toml}"
            );
        }
    }
    // Go's largest duration itself is accepted.
    let c = Config::from_toml("[pull]\npull_deadline = \"2562047h47m16.854775807s\"\n").expect("the bound");
    assert_eq!(c.pull.pull_deadline, Some(crate::domain::limits::MAX_DURATION));
}

#[test]
fn unknown_keys_and_wrong_types_are_rejected_by_name() {
    let err = Config::from_toml("[runtime]\nendpont = \"x\"").expect_err("typo").to_string();
    assert!(err.contains("endpont"), "{err}");
    let err = Config::from_toml("[runtime]\nmailbox_capacity = \"lots\"").expect_err("type").to_string();
    assert!(err.contains("mailbox_capacity") || err.contains("lots"), "{err}");
    let err =
        Config::load(&Sources { overrides: vec!["gc.gc_period=1m".into(), "noequals".into()], ..Default::default() })
            .expect_err("override");
    assert!(err.to_string().contains("--set number 2 has no \"=\""), "named by its place, not echoed: {err}");
    let missing = Sources { file: Some("/nonexistent/imaged.toml".into()), ..Default::default() };
    let err = Config::load(&missing).expect_err("missing file").to_string();
    assert!(err.contains("/nonexistent/imaged.toml"), "{err}");
}

#[test]
fn pull_defaults_are_the_kubelets() {
    let c = Config::defaults().expect("defaults");
    assert_eq!(c.pull, PullQueueSettings::default());
    assert_eq!(c.pull.concurrency, Concurrency::Serial);
    assert_eq!(c.pull.capacity, Some(10));
    assert_eq!((c.pull.qps, c.pull.burst), (5.0, 10));
    assert_eq!(c.backoff, BackoffSettings::default());
    assert_eq!(c.ensure, EnsureSettings::default());
}

#[test]
fn serialize_and_max_parallel_follow_kubelet_defaulting() {
    let mode = |toml: &str| Config::from_toml(toml).map(|c| c.pull.concurrency);
    assert_eq!(mode("").unwrap(), Concurrency::Serial);
    assert_eq!(mode("[pull]\nmax_parallel_image_pulls = 4").unwrap(), Concurrency::Parallel(Some(4)));
    assert_eq!(mode("[pull]\nmax_parallel_image_pulls = 1").unwrap(), Concurrency::Serial);
    assert_eq!(mode("[pull]\nserialize_image_pulls = false").unwrap(), Concurrency::Parallel(None));
    assert_eq!(
        mode("[pull]\nserialize_image_pulls = false\nmax_parallel_image_pulls = 1").unwrap(),
        Concurrency::Parallel(Some(1))
    );
    let err = mode("[pull]\nserialize_image_pulls = true\nmax_parallel_image_pulls = 3").unwrap_err().to_string();
    assert!(err.contains("invalid configuration: maxParallelImagePulls cannot be larger than 1 unless SerializeImagePulls (--serialize-image-pulls) is set to false"), "{err}");
    let err = mode("[pull]\nmax_parallel_image_pulls = 0").unwrap_err().to_string();
    assert!(err.contains("invalid configuration: maxParallelImagePulls 0 must be a positive number"), "{err}");
}

#[test]
fn the_per_registry_limit_is_off_by_default_and_validated() {
    let limit = |toml: &str| Config::from_toml(toml).map(|c| c.pull.registry_limit);
    assert_eq!(limit("").unwrap(), None, "off, as the kubelet");
    assert_eq!(limit("[pull]\nmax_parallel_pulls_per_registry = 0").unwrap(), None);
    assert_eq!(limit("[pull]\nmax_parallel_image_pulls = 8\nmax_parallel_pulls_per_registry = 3").unwrap(), Some(3));
    // One per registry is allowed with serial pulls (it changes nothing there).
    assert_eq!(limit("[pull]\nmax_parallel_pulls_per_registry = 1").unwrap(), Some(1));
    let err = limit("[pull]\nmax_parallel_pulls_per_registry = 2").unwrap_err().to_string();
    assert!(err.contains("pull.max_parallel_pulls_per_registry") && err.contains("serial"), "{err}");
    let err =
        limit("[pull]\nmax_parallel_image_pulls = 8\nmax_parallel_pulls_per_registry = -1").unwrap_err().to_string();
    assert!(err.contains("pull.max_parallel_pulls_per_registry") && err.contains("-1"), "{err}");
}

#[test]
fn transient_retries_are_off_by_default_and_bounded() {
    use crate::actors::pull_queue::Retries;
    let retries = |toml: &str| Config::from_toml(toml).map(|c| c.pull.retries);
    assert_eq!(retries("").unwrap().times, 0, "off: the kubelet");
    assert_eq!(
        retries("[pull]\ntransient_retries = 3\ntransient_retry_delay = \"500ms\"").unwrap(),
        Retries { times: 3, delay: Duration::from_millis(500) }
    );
    for (toml, key) in [
        ("transient_retries = -1", "pull.transient_retries"),
        ("transient_retries = 11", "pull.transient_retries"),
        ("transient_retry_delay = \"1d\"", "pull.transient_retry_delay"),
        ("transient_retries = 2\ntransient_retry_delay = \"0s\"", "pull.transient_retry_delay"),
    ] {
        let err = retries(&format!("[pull]\n{toml}")).unwrap_err().to_string();
        assert!(err.contains(key), "{toml}: {err}");
    }
}

#[test]
fn registries_own_rates_and_limits_are_read_and_validated() {
    use crate::actors::pull_queue::RegistryRate;
    let pull = |toml: &str| Config::from_toml(toml).map(|c| c.pull);
    let none = pull("").unwrap();
    assert!(none.registry_rates.is_empty() && none.registry_limits.is_empty(), "none: the kubelet");
    let p = pull(
        "[pull]\nserialize_image_pulls = false\n\
         [[pull.registries]]\nregistry = \"docker.io\"\nqps = 0.05\nburst = 20\n\
         [[pull.registries]]\nregistry = \" registry.example.com:5000 \"\nmax_parallel = 3\n\
         [[pull.registries]]\nregistry = \"quay.io\"\nqps = 2\n",
    )
    .unwrap();
    assert_eq!(
        p.registry_rates,
        [
            RegistryRate { registry: "docker.io".into(), qps: 0.05, burst: 20 },
            RegistryRate { registry: "quay.io".into(), qps: 2.0, burst: 1 },
        ],
        "only registries with a rate; burst 0 is 1"
    );
    assert_eq!(p.registry_limits, std::collections::HashMap::from([("registry.example.com:5000".to_string(), 3)]));
    // From --set too, as a list of tables.
    let c = set(&[r#"pull.registries=[{ registry = "docker.io", qps = 1.5 }]"#]).unwrap();
    assert_eq!(c.pull.registry_rates, [RegistryRate { registry: "docker.io".into(), qps: 1.5, burst: 1 }]);
    for (toml, key, says) in [
        ("registry = \"\"", "pull.registries[0].registry", "registry host"),
        ("registry = \"https://docker.io\"", "pull.registries[0].registry", "without a scheme"),
        ("registry = \"docker.io/library\"", "pull.registries[0].registry", "without a scheme or path"),
        ("registry = \"index.docker.io\"", "pull.registries[0].registry", "write that"),
        ("registry = \"a.io\"\nqps = -1", "pull.registries[0].qps", "0 or more"),
        ("registry = \"a.io\"\nqps = nan", "pull.registries[0].qps", "finite"),
        ("registry = \"a.io\"\nburst = -2", "pull.registries[0].burst", "between 0"),
        ("registry = \"a.io\"\nmax_parallel = -1", "pull.registries[0].max_parallel", "0 or more"),
        ("registry = \"a.io\"\nmax_parallel = 2", "pull.registries[0].max_parallel", "serial"),
        ("registry = \"a.io\"\nqps = \"fast\"", "pull.registries.qps", "number"),
        ("registry = \"a.io\"\ntoken = \"x\"", "pull.registries.token", "unknown"),
        ("qps = 1", "registry", "missing"),
        ("registry = \"https://robot:hunter2@quay.io\"", "pull.registries[0].registry", "without credentials"),
    ] {
        let err = pull(&format!("[[pull.registries]]\n{toml}")).unwrap_err().to_string();
        assert!(err.contains(key) && err.contains(says), "{toml}: {err}");
        assert!(!err.contains("hunter2"), "{toml}: {err}");
    }
    let err = pull("[[pull.registries]]\nregistry = \"a.io\"\n[[pull.registries]]\nregistry = \"a.io\"\nqps = 1")
        .unwrap_err()
        .to_string();
    assert!(err.contains("pull.registries[1].registry") && err.contains("one rule per registry"), "{err}");
}

#[test]
fn resetting_back_off_on_new_credentials_or_registry_recovery_is_opt_in() {
    let reset = |toml: &str| Config::from_toml(toml).map(|c| c.ensure.reset_backoff_on_credential_change);
    assert!(!reset("").unwrap(), "off: the kubelet waits out the back-off");
    assert!(reset("[backoff]\nreset_on_credential_change = true").unwrap());
    let err = reset("[backoff]\nreset_on_credential_change = \"maybe\"").unwrap_err().to_string();
    assert!(err.contains("reset_on_credential_change"), "{err}");
    let recovery = |toml: &str| Config::from_toml(toml).map(|c| c.ensure.reset_backoff_on_registry_recovery);
    assert!(!recovery("").unwrap(), "off: the kubelet waits out the back-off");
    assert!(recovery("[backoff]\nreset_on_registry_recovery = true").unwrap());
}

#[test]
fn presence_checks_go_out_in_a_growing_window_by_default() {
    let window = |toml: &str| Config::from_toml(toml).map(|c| c.ensure.presence_window());
    assert_eq!(window("").unwrap(), Some(PresenceWindow::new(8, None)));
    assert_eq!(window("[pull]\npresence_check_window = 4").unwrap(), Some(PresenceWindow::new(4, None)));
    // With a cap, the window grows up to it; a cap below the start is kept.
    assert_eq!(window("[pull]\npresence_check_concurrency = 32").unwrap(), Some(PresenceWindow { start: 8, cap: 32 }));
    assert_eq!(window("[pull]\npresence_check_concurrency = 2").unwrap(), Some(PresenceWindow::fixed(2)));
    // No window: the limit alone is fixed; with neither, all at once (the kubelet).
    let no_window = "[pull]\npresence_check_window = 0\n";
    assert_eq!(window(&format!("{no_window}presence_check_concurrency = 3")).unwrap(), Some(PresenceWindow::fixed(3)));
    assert_eq!(window(&format!("{no_window}presence_check_concurrency = 0")).unwrap(), None);
    for key in ["presence_check_concurrency", "presence_check_window"] {
        let err = window(&format!("[pull]\n{key} = -3")).unwrap_err().to_string();
        assert!(err.contains(&format!("pull.{key}")) && err.contains("-3"), "{err}");
    }
}

#[test]
fn pull_values_are_validated_with_kubelet_texts() {
    let err = Config::from_toml("[pull]\nregistry_pull_qps = -1.5").unwrap_err().to_string();
    assert!(
        err.contains("invalid configuration: registryPullQPS (--registry-qps) -1.5 must not be a negative number"),
        "{err}"
    );
    let err = Config::from_toml("[pull]\nregistry_burst = -2").unwrap_err().to_string();
    assert!(
        err.contains("invalid configuration: registryBurst (--registry-burst) -2 must not be a negative number"),
        "{err}"
    );
    assert_eq!(Config::from_toml("[pull]\nregistry_burst = 0").unwrap().pull.burst, 10);
    let err = Config::from_toml("[pull]\nthrottle_mode = \"queue\"").unwrap_err().to_string();
    assert!(err.contains("pull.throttle_mode") && err.contains("queue"), "{err}");
    let c = Config::from_toml("[pull]\nthrottle_mode = \"wait\"\npull_deadline = \"5m\"\nqueue_capacity = 0").unwrap();
    assert_eq!(c.pull.throttle_mode, ThrottleMode::Wait);
    assert_eq!(c.pull.pull_deadline, Some(Duration::from_secs(300)));
    assert_eq!(c.pull.capacity, None);
    assert_eq!(c.pull.slow_pull_warning, Some(Duration::from_secs(60)), "the default");
    let slow =
        |v: &str| Config::from_toml(&format!("[pull]\nslow_pull_warning = {v:?}")).map(|c| c.pull.slow_pull_warning);
    assert_eq!(slow("0s").unwrap(), None);
    assert_eq!(slow("5m").unwrap(), Some(Duration::from_secs(300)));
    let err = slow("soon").unwrap_err().to_string();
    assert!(err.contains("pull.slow_pull_warning") && err.contains("soon"), "{err}");
    assert_eq!(c.pull.stall_warning, Some(Duration::from_secs(60)), "the default");
    let stall = |v: &str| Config::from_toml(&format!("[pull]\nstall_warning = {v:?}")).map(|c| c.pull.stall_warning);
    assert_eq!(stall("0s").unwrap(), None);
    assert_eq!(stall("90s").unwrap(), Some(Duration::from_secs(90)));
    let err = stall("never").unwrap_err().to_string();
    assert!(err.contains("pull.stall_warning") && err.contains("never"), "{err}");
    assert_eq!(c.pull.stall_timeout, None, "off by default, as the kubelet");
    let c = Config::from_toml("[pull]\nstall_timeout = \"2m\"").unwrap();
    assert_eq!(c.pull.stall_timeout, Some(Duration::from_secs(120)));
    assert_eq!(c.pull.min_download_rate, 0, "no floor by default");
    let rate =
        |v: &str| Config::from_toml(&format!("[pull]\nmin_download_rate = {v:?}")).map(|c| c.pull.min_download_rate);
    assert_eq!(rate("100Ki").unwrap(), 102_400);
    assert_eq!(rate(" 1M ").unwrap(), 1_000_000);
    assert_eq!(rate("1.5k").unwrap(), 1500);
    for bad in ["fast", "-1", "10KB/s", "99999999999999999999Ei"] {
        let err = rate(bad).unwrap_err().to_string();
        assert!(err.contains("pull.min_download_rate") && err.contains(bad.trim()) && err.contains("100Ki"), "{err}");
    }
    let err = Config::from_toml("[pull]\nstall_warning = \"0s\"\nmin_download_rate = \"1Mi\"").unwrap_err().to_string();
    assert!(err.contains("pull.min_download_rate") && err.contains("both are \"0s\""), "{err}");
    let c = Config::from_toml("[pull]\nstall_warning = \"0s\"\nstall_timeout = \"2m\"\nmin_download_rate = \"1Mi\"")
        .unwrap();
    assert_eq!(c.pull.min_download_rate, 1 << 20, "over the timeout alone");
    let err = Config::from_toml("[backoff]\ninitial = \"0s\"").unwrap_err().to_string();
    assert!(err.contains("backoff"), "{err}");
    let c = Config::from_toml("[backoff]\nmax = \"60s\"\ngc_interval = \"0s\"").unwrap();
    assert_eq!(c.backoff.delays.max, Duration::from_secs(60));
    assert_eq!(c.backoff.gc_interval, None);
}

#[test]
fn gc_defaults_and_kubelet_validation_texts() {
    let c = Config::defaults().expect("defaults");
    assert_eq!((c.gc.high_threshold_percent, c.gc.low_threshold_percent), (85, 80));
    assert_eq!((c.gc.min_age, c.gc.max_age), (Duration::from_secs(120), Duration::ZERO));
    assert_eq!(c.gc.node_status_max_images, Some(50));
    assert_eq!(c.state_dir, None);
    assert!(!c.gc.disabled());
    let cases = [
        (
            "[gc]\nimage_gc_high_threshold_percent = 101",
            "invalid configuration: imageGCHighThresholdPercent (--image-gc-high-threshold) 101 must be between 0 and 100, inclusive",
        ),
        (
            "[gc]\nimage_gc_low_threshold_percent = -1",
            "invalid configuration: imageGCLowThresholdPercent (--image-gc-low-threshold) -1 must be between 0 and 100, inclusive",
        ),
        (
            "[gc]\nimage_gc_low_threshold_percent = 85",
            "invalid configuration: imageGCLowThresholdPercent (--image-gc-low-threshold) 85 must be less than imageGCHighThresholdPercent (--image-gc-high-threshold) 85",
        ),
        (
            "[gc]\nimage_maximum_gc_age = \"1m\"",
            "invalid configuration: imageMaximumGCAge 1m0s must be greater than imageMinimumGCAge 2m0s",
        ),
        (
            "[gc]\nnode_status_max_images = -2",
            "invalid configuration: nodeStatusMaxImages (--node-status-max-images) -2 must be -1 or greater",
        ),
    ];
    for (toml, text) in cases {
        let err = Config::from_toml(toml).expect_err(toml).to_string();
        assert!(err.contains(text), "{toml}: {err}");
    }
    // A rule between two keys names both: the operator set the other one.
    let err =
        Config::from_toml("[gc]\nimage_gc_high_threshold_percent = 50").expect_err("below the low 80").to_string();
    assert_eq!(
        err,
        "configuration: invalid value \"80\" for gc.image_gc_low_threshold_percent: invalid configuration: \
         imageGCLowThresholdPercent (--image-gc-low-threshold) 80 must be less than imageGCHighThresholdPercent \
         (--image-gc-high-threshold) 50 (gc.image_gc_high_threshold_percent is 50)"
    );
    let err = Config::from_toml("[gc]\nimage_maximum_gc_age = \"10m\"\nimage_minimum_gc_age = \"1h\"")
        .expect_err("max below min")
        .to_string();
    assert!(err.contains("gc.image_maximum_gc_age") && err.contains("gc.image_minimum_gc_age is \"1h\""), "{err}");
    let off = Config::from_toml("[gc]\nimage_gc_high_threshold_percent = 100").unwrap();
    assert!(off.gc.disabled());
    let all = Config::from_toml("[gc]\nnode_status_max_images = -1\npinned_images = [\"registry.k8s.io/*\"]\n[state]\ndir = \"/var/lib/imaged\"").unwrap();
    assert_eq!(all.gc.node_status_max_images, None);
    assert_eq!(all.gc.pinned_images, ["registry.k8s.io/*"]);
    assert_eq!(all.state_dir, Some(PathBuf::from("/var/lib/imaged")));
}

#[test]
fn credentials_defaults_are_the_kubelets() {
    let c = Config::defaults().expect("defaults load");
    let s = &c.credentials;
    assert_eq!(
        s.search,
        crate::credentials::DockerConfigSearch::kubelet_default(std::path::Path::new("/var/lib/kubelet"))
    );
    assert_eq!(s.search.config_json_dirs.first(), Some(&PathBuf::from("/var/lib/kubelet")));
    assert_eq!(s.search.config_json_dirs.last(), Some(&PathBuf::from("/.docker")));
    assert_eq!(s.search.dockercfg_dirs.last(), Some(&PathBuf::from("/")));
    assert_eq!(s.cache_period, Duration::from_secs(300));
    assert_eq!(s.provider_config, None);
    assert_eq!(s.provider_bin_dir, None);
    assert_eq!(s.provider_timeout, Duration::from_secs(60));
    assert!(s.metrics.same_registry(&c.pull.metrics), "plugin metrics go to the one registry");
}

#[test]
fn credentials_keys_are_read_and_validated_by_name() {
    let c = Config::from_toml(
        "[credentials]\nroot_dir = \"/r\"\nconfig_json_dirs = [\"/etc/imaged\"]\ncache_period = \"0s\"\n\
         provider_config = \"/etc/imaged/providers\"\nprovider_bin_dir = \"/usr/libexec/imaged\"\nprovider_timeout = \"5s\"\n",
    )
    .expect("valid");
    let s = c.credentials;
    assert_eq!(s.search.config_json_dirs, vec![PathBuf::from("/etc/imaged")]);
    assert_eq!(s.search.dockercfg_dirs.first(), Some(&PathBuf::from("/r")), "unset list keeps the kubelet's order");
    assert_eq!(s.cache_period, Duration::ZERO);
    assert_eq!(s.provider_config, Some(PathBuf::from("/etc/imaged/providers")));
    assert_eq!(s.provider_bin_dir, Some(PathBuf::from("/usr/libexec/imaged")));
    assert_eq!(s.provider_timeout, Duration::from_secs(5));

    let off = Config::from_toml("[credentials]\nconfig_json_dirs = []\ndockercfg_dirs = []\nroot_dir = \"\"\n")
        .expect("both lists empty: files off, root_dir unused");
    assert!(off.credentials.search.is_empty());

    for (toml, key, reason) in [
        ("[credentials]\ncache_period = \"soon\"", "credentials.cache_period", "not a Go duration"),
        ("[credentials]\nprovider_timeout = \"0s\"", "credentials.provider_timeout", "must be more than 0s"),
        ("[credentials]\nroot_dir = \"\"", "credentials.root_dir", "must be a directory path"),
        ("[credentials]\nconfig_json_dirs = [\"\"]", "credentials.config_json_dirs", "must not be empty"),
        (
            "[credentials]\nprovider_bin_dir = \"/bin\"",
            "credentials.provider_config",
            "credential provider config path is empty",
        ),
        (
            "[credentials]\nprovider_config = \"/c.yaml\"",
            "credentials.provider_bin_dir",
            "plugin binary directory is required",
        ),
    ] {
        let err = Config::from_toml(toml).expect_err(toml).to_string();
        assert!(err.contains(&format!("for {key}: ")) && err.contains(reason), "{toml}: {err}");
    }
    let err = Config::from_toml("[credentials]\nhelpers = true").expect_err("unknown key").to_string();
    assert!(err.contains("helpers"), "{err}");
}

#[test]
fn metrics_address_defaults_to_loopback_and_can_be_turned_off() {
    let c = Config::defaults().expect("defaults");
    assert_eq!(c.daemon.socket, PathBuf::from("/run/imaged/imaged.sock"));
    assert_eq!((c.daemon.socket_group.as_deref(), c.daemon.max_request_bytes), (None, 4 << 20));
    assert_eq!(c.daemon.metrics_address, Some("127.0.0.1:9464".parse().expect("addr")));
    let c = Config::from_toml("[daemon]\nmetrics_address = \"[::1]:9000\"").expect("ipv6 loopback");
    assert_eq!(c.daemon.metrics_address, Some("[::1]:9000".parse().expect("addr")));
    let c = Config::from_toml("[daemon]\nmetrics_address = \"\"").expect("off");
    assert_eq!(c.daemon.metrics_address, None);
}

#[test]
fn a_non_loopback_metrics_address_needs_the_explicit_allowance() {
    let err = Config::from_toml("[daemon]\nmetrics_address = \"0.0.0.0:9464\"").expect_err("refused");
    let text = err.to_string();
    assert!(text.contains("daemon.metrics_address") && text.contains("\"0.0.0.0:9464\""), "{text}");
    assert!(text.contains("not a loopback address") && text.contains("daemon.metrics_allow_non_loopback"), "{text}");
    let c = Config::from_toml("[daemon]\nmetrics_address = \"10.0.0.5:9464\"\nmetrics_allow_non_loopback = true")
        .expect("allowed");
    assert_eq!(c.daemon.metrics_address, Some("10.0.0.5:9464".parse().expect("addr")));
}

#[test]
fn a_metrics_address_that_is_not_ip_and_port_is_rejected() {
    for bad in ["localhost:9464", "127.0.0.1", "127.0.0.1:http"] {
        let err = Config::from_toml(&format!("[daemon]\nmetrics_address = \"{bad}\"")).expect_err(bad);
        let text = err.to_string();
        assert!(text.contains("daemon.metrics_address") && text.contains("not an IP address and port"), "{text}");
    }
}

#[test]
fn credential_verification_policy_and_allowlist_are_parsed_and_validated_naming_the_key() {
    use crate::pull_records::{VerificationPolicy, VerifyPolicy};
    let c = Config::defaults().expect("defaults load");
    assert_eq!(c.verification, VerifyPolicy::default());
    assert_eq!(c.verification.policy, VerificationPolicy::NeverVerifyPreloadedImages);

    let c = Config::from_toml(
        "[credential_verification]\npolicy = \"NeverVerifyAllowlistedImages\"\nallowlist = [\"docker.io/library/nginx\", \"registry.example.com/team/*\"]\n",
    )
    .expect("valid");
    assert_eq!(c.verification.policy, VerificationPolicy::NeverVerifyAllowlistedImages);
    assert!(c.verification.allowlist.matches("registry.example.com/team/app"));
    assert!(c.verification.allowlist.matches("docker.io/library/nginx"));

    let e = Config::from_toml("[credential_verification]\npolicy = \"Sometimes\"\n").unwrap_err().to_string();
    assert_eq!(
        e,
        "configuration: invalid value \"Sometimes\" for credential_verification.policy: \
         unknown image pull credential verification policy: Sometimes"
    );
    let e = Config::from_toml("[credential_verification]\nallowlist = [\"docker.io/library/nginx\", \"nginx:1.27\"]\n")
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        "configuration: invalid value \"nginx:1.27\" for credential_verification.allowlist: \
         neither tag nor digest is accepted in an image reference: nginx:1.27"
    );
    let e =
        Config::from_toml("[credential_verification]\nallowlist = [\"registry.io/*/x\"]\n").unwrap_err().to_string();
    assert!(
        e.contains("credential_verification.allowlist") && e.contains("only patterns ending with '/*' are allowed"),
        "{e}"
    );
    let e = Config::from_toml("[credential_verification]\nverify = true\n").unwrap_err().to_string();
    assert!(e.contains("verify"), "unknown key rejected: {e}");
}

#[test]
fn the_cri_front_is_off_by_default_and_never_its_own_runtime() {
    let c = Config::defaults().unwrap();
    assert_eq!(c.cri_server.socket, None);
    assert!(c.cri_server.pin_sandbox_image);
    assert!(!c.cri_server.refuse_remove_pinned);
    assert!(!c.cri_server.refuse_remove_in_use);
    assert_eq!(c.cri_server.priority_namespaces, ["kube-system"]);
    let static_pods: Vec<_> = c.cri_server.priority.iter().filter_map(|r| r.annotation.clone()).collect();
    assert_eq!(
        static_pods,
        [("kubernetes.io/config.source".into(), "file".into()), ("kubernetes.io/config.source".into(), "http".into())]
    );
    let on = Config::from_toml("[cri_server]\nsocket = \"/run/imaged/cri.sock\"\nsocket_group = \"kube\"").unwrap();
    assert_eq!(on.cri_server.socket, Some(PathBuf::from("/run/imaged/cri.sock")));
    assert_eq!(on.cri_server.socket_group.as_deref(), Some("kube"));
    let e = Config::from_toml(
        "[runtime]\nendpoint = \"unix:///run/imaged/cri.sock\"\n[cri_server]\nsocket = \"/run/imaged/cri.sock\"",
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("cri_server.socket") && e.contains("imaged would call itself"), "{e}");
    // The CRI socket on the API's path: said as such, not found at bind
    // time as "another process is serving on it".
    let e =
        Config::from_toml("[daemon]\nsocket = \"/run/imaged/x.sock\"\n[cri_server]\nsocket = \"/run/imaged/x.sock\"")
            .unwrap_err()
            .to_string();
    assert!(e.contains("cri_server.socket") && e.contains("is also daemon.socket"), "{e}");
    let e = Config::from_toml("[cri_server]\nsocket_group = \"a b\"").unwrap_err().to_string();
    assert!(e.contains("cri_server.socket_group"), "{e}");
}

#[test]
fn every_mailbox_comes_from_the_config_and_its_defaults_agree_with_the_actors() {
    let c = Config::defaults().expect("defaults");
    assert_eq!(c.gc.detector_mailbox_capacity, crate::actors::detector::DEFAULT_MAILBOX_CAPACITY);
    assert_eq!(c.gc.executor_mailbox_capacity, crate::actors::gc_executor::DEFAULT_MAILBOX_CAPACITY);
    assert_eq!(c.gc.refresher_mailbox_capacity, crate::actors::cache_refresher::DEFAULT_MAILBOX_CAPACITY);
    assert_eq!(c.daemon.event_buffer, 1024);
    let set = Config::from_toml(
        "[gc]\ndetector_mailbox_capacity = 7\nexecutor_mailbox_capacity = 8\nrefresher_mailbox_capacity = 9\n\
         [daemon]\nevent_buffer = 10",
    )
    .expect("config");
    let gc = &set.gc;
    assert_eq!((gc.detector_mailbox_capacity, gc.executor_mailbox_capacity, gc.refresher_mailbox_capacity), (7, 8, 9));
    assert_eq!(set.daemon.event_buffer, 10);
    for key in ["gc.detector_mailbox_capacity", "gc.executor_mailbox_capacity", "daemon.event_buffer"] {
        let (section, name) = key.split_once('.').expect("dotted");
        for bad in ["0", "-1", "1000001"] {
            let err = Config::from_toml(&format!("[{section}]\n{name} = {bad}")).expect_err(bad).to_string();
            assert!(err.contains(key) && err.contains("must be from 1 to 1000000"), "{key} = {bad}: {err}");
        }
    }
}

#[test]
fn a_toml_error_names_its_key_and_line() {
    let err =
        Config::from_toml("[pull]\n# a comment\nqueue_capacity = 99999999999999999999\n").unwrap_err().to_string();
    assert!(err.contains("pull.queue_capacity"), "{err}");
    assert!(err.contains("99999999999999999999") && err.contains("line 3"), "{err}");
    let err = Config::from_toml("[gc]\nimage_minimum_gc_age = 2m\n").unwrap_err().to_string();
    assert!(err.contains("gc.image_minimum_gc_age") && err.contains("line 2"), "{err}");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("imaged.toml");
    std::fs::write(&file, "[pull]\nqueue_capacity = 99999999999999999999\n").unwrap();
    let sources = Sources { file: Some(file.clone()), ..Sources::default() };
    let err = Config::load(&sources).unwrap_err().to_string();
    assert!(err.contains("pull.queue_capacity") && err.contains(&file.display().to_string()), "{err}");
}

#[test]
fn a_float_for_an_integer_key_is_refused_naming_it() {
    // The config crate rounded these: `nan` became 0 (then blamed on
    // gc.image_gc_low_threshold_percent), `1e30` became i64::MAX.
    for (toml, key, value) in [
        ("[gc]\nimage_gc_high_threshold_percent = nan", "gc.image_gc_high_threshold_percent", "NaN"),
        ("[gc]\nkeep_newest_tags_per_repo = 2.5", "gc.keep_newest_tags_per_repo", "2.5"),
        ("[daemon]\nmax_request_bytes = 1e30", "daemon.max_request_bytes", "1000000000000000000000000000000"),
        ("[runtime]\nmailbox_capacity = -inf", "runtime.mailbox_capacity", "-inf"),
        ("[gc]\nimage_gc_high_threshold_percent = false", "gc.image_gc_high_threshold_percent", "false"),
    ] {
        match Config::from_toml(toml) {
            Err(ConfigError::Invalid { key: k, value: v, reason }) => {
                assert_eq!((k.as_str(), v.as_str(), reason.as_str()), (key, value, "must be an integer"), "{toml}")
            }
            other => panic!("{toml}: {other:?}"),
        }
    }
    // A number for a boolean key is refused the same way.
    match Config::from_toml("[pull]\nsingle_flight = 2") {
        Err(ConfigError::Invalid { key, value, reason }) => {
            assert_eq!(
                (key.as_str(), value.as_str(), reason.as_str()),
                ("pull.single_flight", "2", "must be true or false")
            )
        }
        other => panic!("{other:?}"),
    }
    // Floats stay floats where the default is one.
    assert!(Config::from_toml("[pull]\nregistry_pull_qps = 2.5").is_ok());
}

// === properties ===

mod props {
    use proptest::prelude::*;

    use super::*;
    use crate::testing::props::config;

    /// Every `(section, key)` of the documented defaults with a scalar or
    /// array value (`[[cri_server.priority]]` tables left out).
    fn keys() -> Vec<(String, String)> {
        fn walk(prefix: &str, t: &toml::Table, out: &mut Vec<(String, String)>) {
            for (k, v) in t {
                match v {
                    toml::Value::Table(sub) => {
                        let p = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
                        walk(&p, sub, out);
                    }
                    toml::Value::Array(a) if a.iter().any(|x| x.is_table()) => {}
                    _ => out.push((prefix.to_string(), k.clone())),
                }
            }
        }
        let mut out = Vec::new();
        walk("", &toml::from_str(DEFAULT_TOML).unwrap(), &mut out);
        out
    }

    /// A TOML string literal holding `s` (JSON's escapes are TOML's).
    fn string_literal(s: &str) -> String {
        serde_json::to_string(s).unwrap()
    }

    /// A TOML value as text: of every type, at and past every bound.
    fn value() -> impl Strategy<Value = String> {
        prop_oneof![
            any::<i64>().prop_map(|n| n.to_string()),
            (-2i64..2_000_000).prop_map(|n| n.to_string()),
            "-?[0-9]{19,30}",
            any::<f64>().prop_filter("TOML float", |f| f.is_finite()).prop_map(|f| format!("{f:?}")),
            Just("nan".to_string()),
            Just("-inf".to_string()),
            any::<bool>().prop_map(|b| b.to_string()),
            "[-+]?[0-9.]{0,25}(ns|us|ms|s|m|h|d|y|years)?".prop_map(|s| string_literal(&s)),
            any::<String>().prop_map(|s| string_literal(&s)),
            prop::collection::vec(any::<String>(), 0..3)
                .prop_map(|v| format!("[{}]", v.iter().map(|s| string_literal(s)).collect::<Vec<_>>().join(", "))),
            Just("{ a = 1 }".to_string()),
        ]
    }

    /// Text that is TOML-ish: section headers, `key = value` lines with
    /// known and unknown keys, and stray bytes.
    fn tomlish() -> impl Strategy<Value = String> {
        let keys = keys();
        let sections: Vec<String> = keys.iter().map(|(s, _)| s.clone()).collect();
        let names: Vec<String> = keys.iter().map(|(_, k)| k.clone()).collect();
        let line = prop_oneof![
            prop::sample::select(sections).prop_map(|s| format!("[{s}]")),
            (prop::sample::select(names), value()).prop_map(|(k, v)| format!("{k} = {v}")),
            ("\\PC{0,10}", value()).prop_map(|(k, v)| format!("{k} = {v}")),
            "\\PC{0,20}",
            any::<String>(),
        ];
        prop::collection::vec(line, 0..6).prop_map(|l| l.join("\n"))
    }

    proptest! {
        #![proptest_config(config(128))]

        #[test]
        fn any_text_loads_or_is_refused_without_a_panic(text in any::<String>()) {
            let _ = Config::from_toml(&text);
        }

        #[test]
        fn toml_ish_text_loads_or_is_refused_without_a_panic(text in tomlish()) {
            let _ = Config::from_toml(&text);
        }

        #[test]
        fn a_bad_value_is_refused_naming_its_key(
            (section, key) in prop::sample::select(keys()),
            v in value(),
        ) {
            let text = format!("[{section}]\n{key} = {v}\n");
            if let Err(e) = Config::from_toml(&text) {
                let msg = e.to_string();
                prop_assert!(msg.contains(&key), "{:?}: {} does not name {}", text, msg, key);
                // A refused value names its own key, or (a rule between keys)
                // names it in the reason.
                if let ConfigError::Invalid { key: named, reason, .. } = &e {
                    let full = format!("{section}.{key}");
                    prop_assert!(named.contains(&full) || reason.contains(&full), "{:?}: {}", text, msg);
                }
            }
        }
    }
}

#[test]
fn durations_are_read_with_gos_grammar_only() {
    let age = |v: &str| Config::from_toml(&format!("[gc]\nimage_minimum_gc_age = \"{v}\"\n")).map(|c| c.gc.min_age);
    for (text, want) in [
        ("2m", Duration::from_secs(120)),
        ("2m0s", Duration::from_secs(120)),
        ("1h30m", Duration::from_secs(5400)),
        ("1.5h", Duration::from_secs(5400)),
        ("500ms", Duration::from_millis(500)),
        ("1500us", Duration::from_micros(1500)),
        ("1500µs", Duration::from_micros(1500)),
        ("0", Duration::ZERO),
        (" 90s ", Duration::from_secs(90)),
    ] {
        assert_eq!(age(text).expect(text), want, "{text}");
    }
    // humantime read "1M" as a month and "2min" as two minutes; Go reads
    // neither. The error names the key, the value and Go's own message, and
    // says what to write.
    let err = |v: &str| age(v).expect_err(v).to_string();
    assert_eq!(
        err("2min"),
        "configuration: invalid value \"2min\" for gc.image_minimum_gc_age: not a Go duration \
         (time: unknown unit \"min\" in duration \"2min\"); write a number and a unit (ns, us, ms, s, m, h), \
         e.g. \"500ms\", \"10s\", \"2m\", \"1h30m\": here \"2m0s\""
    );
    assert!(err("1day").ends_with("here \"24h0m0s\""), "{}", err("1day"));
    assert!(
        err("1M").contains("there is no month or year unit (\"M\" is not minutes: those are \"m\")"),
        "{}",
        err("1M")
    );
    assert!(err("1y").contains("there is no month or year unit"), "{}", err("1y"));
    assert!(err("10").contains("time: missing unit in duration \"10\""), "{}", err("10"));
    assert!(err("2 m").contains("not a Go duration"), "{}", err("2 m"));
    assert_eq!(err("-5s"), "configuration: invalid value \"-5s\" for gc.image_minimum_gc_age: must not be negative");
}

#[test]
fn the_defaults_and_the_documented_file_use_go_durations() {
    // Every duration in config/default.toml parses with Go's grammar (the
    // defaults load at all only if so) and is written as Go would accept it.
    let table: toml::Table = toml::from_str(DEFAULT_TOML).expect("parses");
    let mut durations = 0;
    for (section, keys) in &table {
        let Some(keys) = keys.as_table() else { continue };
        for (key, v) in keys {
            if let Some(text) = v.as_str()
                && text.chars().next().is_some_and(|c| c.is_ascii_digit())
                && text.ends_with(|c: char| c.is_ascii_alphabetic())
            {
                durations += 1;
                assert!(crate::domain::go_text::parse_duration(text).is_ok(), "{section}.{key} = {text:?}");
            }
        }
    }
    assert!(durations >= 15, "found {durations} duration keys");
}

/// Sources that set keys in every layer: a file (with a list of tables and
/// an optional key), a KubeletConfiguration, the environment and flags.
fn every_layer(dir: &tempfile::TempDir) -> Sources {
    let file = dir.path().join("imaged.toml");
    std::fs::write(
        &file,
        "[pull]\nthrottle_mode = \"wait\"\nserialize_image_pulls = false\n\
         [gc]\npinned_images = [\"registry.k8s.io/*\", \"quay.io/\\\"q\\\"/*\"]\ngc_period = \"90s\"\n\
         [credentials]\nconfig_json_dirs = [\"/etc/imaged\"]\n\
         [[cri_server.priority]]\nnamespace = \"team-a\"\npriority = 7\n\
         [[cri_server.priority]]\nlabel = \"tier=web\"\nannotation = \"a=b\"\npriority = -3\n",
    )
    .expect("write");
    let kubelet = dir.path().join("kubelet.yaml");
    std::fs::write(&kubelet, include_str!("../../tests/fixtures/kubelet-config.yaml")).expect("write");
    Sources {
        file: Some(file),
        kubelet_config: Some(kubelet),
        env: env(&[("IMAGED_BACKOFF__MAX", "7m"), ("IMAGED_RUNTIME__DEADLINES__LIST_IMAGES", "45s")]),
        overrides: vec!["daemon.shutdown_grace=12s".into(), "pull.registry_burst=33".into()],
    }
}

#[test]
fn the_printed_configuration_reads_back_to_the_same_configuration() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sources = every_layer(&dir);
    let loaded = Config::load_full(&sources).expect("loads");
    assert_ne!(loaded.config, Config::defaults().expect("defaults"), "the layers changed something");
    for show_origin in [false, true] {
        let printed = loaded.effective.to_toml(show_origin);
        let file = dir.path().join(format!("printed-{show_origin}.toml"));
        std::fs::write(&file, &printed).expect("write");
        // Only the printed file: no KubeletConfiguration, environment or flags.
        let again = Config::load_full(&Sources { file: Some(file.clone()), ..Sources::default() })
            .unwrap_or_else(|e| panic!("{e}\n{printed}"));
        assert_eq!(again.config, loaded.config, "{printed}");
        // And printing that gives the same text, but for the origins.
        assert_eq!(again.effective.to_toml(false), loaded.effective.to_toml(false));
    }
    // The defaults print and read back too.
    let defaults = Config::load_full(&Sources::default()).expect("defaults");
    let printed = defaults.effective.to_toml(false);
    assert_eq!(Config::from_toml(&printed).expect("reads back"), defaults.config);
    assert!(!printed.starts_with('\n') && printed.starts_with("[runtime]\n"), "{printed}");
}

#[test]
fn each_key_names_the_layer_its_value_came_from() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sources = every_layer(&dir);
    let e = Config::load_full(&sources).expect("loads").effective;
    let file = sources.file.clone().expect("file");
    let kubelet = sources.kubelet_config.clone().expect("kubelet");
    assert_eq!(e.origin("log.format"), Origin::Default);
    assert_eq!(e.origin("pull.throttle_mode"), Origin::File(file.clone()));
    assert_eq!(e.origin("cri_server.priority"), Origin::File(file.clone()));
    assert_eq!(e.origin("cri_server.priority.namespace"), Origin::File(file.clone()));
    assert_eq!(
        e.origin("gc.image_gc_high_threshold_percent"),
        Origin::Kubelet { file: kubelet.clone(), field: "imageGCHighThresholdPercent" }
    );
    // The file set serializeImagePulls' key too; the KubeletConfiguration
    // comes later and wins.
    assert_eq!(
        e.origin("pull.serialize_image_pulls"),
        Origin::Kubelet { file: kubelet.clone(), field: "serializeImagePulls" }
    );
    assert_eq!(e.origin("backoff.max"), Origin::Environment("IMAGED_BACKOFF__MAX".into()));
    assert_eq!(
        e.origin("runtime.deadlines.list_images"),
        Origin::Environment("IMAGED_RUNTIME__DEADLINES__LIST_IMAGES".into())
    );
    assert_eq!(e.origin("daemon.shutdown_grace"), Origin::Flag);
    // The KubeletConfiguration set registryBurst; the flag wins.
    assert_eq!(e.origin("pull.registry_burst"), Origin::Flag);

    let shown = e.to_toml(true);
    for line in [
        "format = \"text\"  # default",
        &format!("throttle_mode = \"wait\"  # file {}", file.display()),
        &format!(
            "image_minimum_gc_age = \"5m30s\"  # KubeletConfiguration {} field imageMinimumGCAge",
            kubelet.display()
        ),
        "max = \"7m\"  # environment IMAGED_BACKOFF__MAX",
        "shutdown_grace = \"12s\"  # flag",
        "registry_burst = 33  # flag",
        &format!("[[cri_server.priority]]  # file {}", file.display()),
    ] {
        assert!(shown.lines().any(|l| l == line), "no line {line:?} in:\n{shown}");
    }
}

// === input errors: each names the key (and the file), in the user's terms ===

fn set(overrides: &[&str]) -> Result<Config, ConfigError> {
    Config::load(&Sources { overrides: overrides.iter().map(|o| o.to_string()).collect(), ..Sources::default() })
}

#[test]
fn a_qps_that_is_not_a_finite_number_is_refused_as_such() {
    for v in ["nan", "NaN", "inf", "-inf", "infinity", "1e999"] {
        let err = set(&[&format!("pull.registry_pull_qps={v}")]).expect_err(v).to_string();
        assert!(err.contains("pull.registry_pull_qps") && err.contains("must be a finite number"), "{v}: {err}");
        assert!(!err.contains("negative"), "{v}: {err}");
    }
    let err = Config::from_toml("[pull]\nregistry_pull_qps = nan").unwrap_err().to_string();
    assert!(err.contains("must be a finite number"), "{err}");
}

#[test]
fn an_unknown_key_names_its_file_its_dotted_path_and_its_line() {
    let dir = tempfile::tempdir().unwrap();
    for (text, key, line) in [
        ("[gc]\nimage_gc_high_threshold_percent = 90\nbogus = 1\n", "gc.bogus", 3),
        ("# top\n\n[runtime.deadlines]\nbogus = \"1s\"\n", "runtime.deadlines.bogus", 4),
        ("bogus = 1\n", "bogus", 1),
        ("[pull.nested]\nx = 1\n", "pull.nested", 1),
        ("[[cri_server.priority]]\nnamespce = \"a\"\npriority = 1\n", "cri_server.priority.namespce", 2),
    ] {
        let file = dir.path().join("imaged.toml");
        std::fs::write(&file, text).unwrap();
        let err = Config::load(&Sources { file: Some(file.clone()), ..Sources::default() }).expect_err(text);
        let msg = err.to_string();
        assert!(matches!(err, ConfigError::UnknownKey { .. }), "{text}: {msg}");
        assert!(msg.contains(&format!("unknown key {key} ({}, line {line})", file.display())), "{text}: {msg}");
    }
}

#[test]
fn a_quoted_number_in_a_file_is_refused_but_text_from_set_and_the_environment_parses() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("imaged.toml");
    for (text, key, reason) in [
        (
            "[gc]\nimage_gc_high_threshold_percent = \"85\"\n",
            "gc.image_gc_high_threshold_percent",
            "must be a number, not a string",
        ),
        ("[pull]\nregistry_pull_qps = \"5\"\n", "pull.registry_pull_qps", "must be a number, not a string"),
        ("[pull]\nsingle_flight = \"true\"\n", "pull.single_flight", "must be true or false, not a string"),
        // And the other way: true or a fraction for a string key.
        ("[gc]\nsandbox_image = true\n", "gc.sandbox_image", "must be a string"),
        ("[gc]\ngc_period = 1.5\n", "gc.gc_period", "must be a string"),
    ] {
        std::fs::write(&file, text).unwrap();
        match Config::load(&Sources { file: Some(file.clone()), ..Sources::default() }) {
            Err(ConfigError::Invalid { key: k, reason: r, .. }) => {
                assert_eq!(k, key, "{text}");
                assert!(r.contains(reason) && r.contains(&format!("({}, line 2)", file.display())), "{text}: {r}");
            }
            other => panic!("{text}: {other:?}"),
        }
    }
    let c = Config::load(&Sources {
        env: env(&[("IMAGED_PULL__REGISTRY_PULL_QPS", "2.5"), ("IMAGED_PULL__SINGLE_FLIGHT", "false")]),
        overrides: vec!["gc.image_gc_high_threshold_percent=90".into(), "pull.registry_burst=7".into()],
        ..Sources::default()
    })
    .expect("text from --set and the environment");
    assert_eq!((c.pull.qps, c.pull.single_flight, c.gc.high_threshold_percent, c.pull.burst), (2.5, false, 90, 7));
}

#[test]
fn the_key_schema_has_every_key_of_the_raw_configuration() {
    // Every key the schema knows deserializes (none is unknown to the raw
    // structs), and each section's fields, as serde lists them, are the
    // schema's: an optional key added to a Raw struct must be added to
    // `schema::OPTIONAL_KEYS` too.
    let schema = super::schema::schema().expect("schema");
    let _: raw::RawConfig = toml::Value::Table(schema.clone()).try_into().expect("the schema deserializes");
    fn fields(err: &str) -> Vec<String> {
        // "expected one of `a`, `b`", or "expected `a`" for one field.
        let list = err.split("expected ").nth(1).expect("a field list");
        let list = list.strip_prefix("one of ").unwrap_or(list);
        let list = list.lines().next().unwrap_or_default();
        list.split([',', '`']).map(str::trim).filter(|f| !f.is_empty() && *f != "or").map(str::to_string).collect()
    }
    for section in [
        "runtime",
        "pull",
        "backoff",
        "gc",
        "credential_verification",
        "state",
        "daemon",
        "cri_server",
        "log",
        "credentials",
    ] {
        let mut t = schema.clone();
        t.get_mut(section).and_then(|s| s.as_table_mut()).expect(section).insert("zz_unknown".into(), 1.into());
        let err = toml::Value::Table(t).try_into::<raw::RawConfig>().expect_err(section).to_string();
        let mut want: Vec<String> = schema[section].as_table().unwrap().keys().cloned().collect();
        let mut got = fields(&err);
        want.sort();
        got.sort();
        assert_eq!(got, want, "{section}");
    }
}

#[test]
fn a_list_key_takes_a_list_literal_from_set_and_the_environment() {
    let c = set(&[r#"gc.pinned_images=["registry.k8s.io/*", "quay.io/team/*"]"#]).expect("a list literal");
    assert_eq!(c.gc.pinned_images, ["registry.k8s.io/*", "quay.io/team/*"]);
    assert!(set(&["gc.pinned_images=[]"]).expect("the empty list").gc.pinned_images.is_empty());
    let c = set(&[r#"credentials.config_json_dirs=["/etc/imaged"]"#]).expect("an optional list key");
    assert_eq!(c.credentials.search.config_json_dirs, [PathBuf::from("/etc/imaged")]);
    let c = set(&[r#"cri_server.priority=[{ namespace = "team-a", priority = 7 }]"#]).expect("a list of tables");
    assert_eq!(c.cri_server.priority.len(), 1);
    let c = Config::load(&Sources {
        env: env(&[("IMAGED_CRED_IGNORED", "x"), ("IMAGED_GC__PINNED_IMAGES", r#"["docker.io/library/*"]"#)]),
        ..Sources::default()
    })
    .expect("from the environment");
    assert_eq!(c.gc.pinned_images, ["docker.io/library/*"]);
    // Not a list, or not a list of strings: named, with the syntax to use.
    for (o, reason) in [
        ("gc.pinned_images=registry.k8s.io/*", "must be a list"),
        ("gc.pinned_images=[registry.k8s.io/*]", "not a list"),
        ("gc.pinned_images=[1, 2]", "must be a list of strings"),
    ] {
        match set(&[o]) {
            Err(ConfigError::Invalid { key, reason: r, .. }) => {
                assert_eq!(key, "gc.pinned_images", "{o}");
                assert!(r.contains(reason) && r.contains(r#"["a", "b"]"#), "{o}: {r}");
            }
            other => panic!("{o}: {other:?}"),
        }
    }
}

#[test]
fn a_table_given_where_none_belongs_is_refused_without_showing_it() {
    for o in [
        r#"gc.image_gc_high_threshold_percent={password="hunter2"}"#,
        r#"pull.registry_pull_qps={password="hunter2"}"#,
        r#"pull.single_flight={password="hunter2"}"#,
        r#"gc.pinned_images=[{password="hunter2"}]"#,
        r#"gc.pinned_images={password="hunter2"}"#,
    ] {
        let err = set(&[o]).expect_err(o).to_string();
        let key = o.split_once('=').map_or(o, |(k, _)| k);
        assert!(err.contains(key), "the key is named: {o}: {err}");
        assert!(!err.contains("hunter2"), "{o}: {err}");
    }
    for toml in [
        "[gc]\nimage_gc_high_threshold_percent = { password = \"hunter2\" }",
        "[gc]\npinned_images = [{ password = \"hunter2\" }]",
        "[pull]\nsingle_flight = { password = \"hunter2\" }",
    ] {
        let err = Config::from_toml(toml).expect_err(toml).to_string();
        assert!(!err.contains("hunter2"), "{toml}: {err}");
    }
}

#[test]
fn a_table_key_given_a_single_value_says_so_without_internal_names() {
    for key in ["gc", "pull", "runtime", "runtime.deadlines", "credentials", "cri_server", "state", "log"] {
        let err = set(&[&format!("{key}=hunter2")]).expect_err(key).to_string();
        assert!(err.contains(&format!("for {key}: expected a table of settings, got a single value")), "{key}: {err}");
        assert!(!err.contains("Raw") && !err.contains("struct"), "{key}: {err}");
        assert!(!err.contains("hunter2"), "the value may be a secret: not echoed: {err}");
    }
    for toml in [
        "gc = 5",
        "[runtime]\ndeadlines = \"2m\"",
        "[cri_server]\npriority = [5]",
        "cri_server = [1]",
        "credentials = \"hunter2\"",
    ] {
        let err = Config::from_toml(toml).expect_err(toml).to_string();
        assert!(!err.contains("Raw") && !err.contains("struct") && err.contains("table"), "{toml}: {err}");
        assert!(!err.contains("hunter2"), "{toml}: {err}");
    }
}

#[test]
fn an_integer_past_64_bits_from_set_or_the_environment_is_out_of_range_for_its_key() {
    let key = "gc.image_gc_high_threshold_percent";
    for v in ["99999999999999999999999", "-99999999999999999999999"] {
        match set(&[&format!("{key}={v}")]) {
            Err(ConfigError::Invalid { key: k, value, reason }) => {
                assert_eq!((k.as_str(), value.as_str()), (key, v));
                assert!(reason.contains("out of range"), "{reason}");
            }
            other => panic!("{v}: {other:?}"),
        }
    }
    let err = Config::load(&Sources {
        env: env(&[("IMAGED_PULL__QUEUE_CAPACITY", "18446744073709551616")]),
        ..Sources::default()
    })
    .expect_err("past 64 bits")
    .to_string();
    assert!(err.contains("pull.queue_capacity") && err.contains("out of range"), "{err}");
    // Text that is no integer at all says so (the config crate read "true" as 1).
    for v in ["abc", "2.5", "true"] {
        let err = set(&[&format!("{key}={v}")]).expect_err(v).to_string();
        assert!(err.contains(key) && err.contains("must be an integer"), "{v}: {err}");
        assert!(!err.contains("invalid type"), "{v}: {err}");
    }
}

#[test]
fn an_unknown_key_from_set_or_the_environment_names_where_it_was_given() {
    let err = set(&["gc.bogus=1"]).expect_err("unknown").to_string();
    assert!(err.contains("unknown key gc.bogus (--set gc.bogus=…)"), "{err}");
    // A mistyped key's value is not echoed: it may be a secret.
    for o in [
        "credentials.pasword=hunter2",
        "registry.password=hunter2",
        "gc.sandbox_image.tag=hunter2",
        "credentials={pasword=\"hunter2\"}",
        "credentials={pasword=hunter2}",
        "hunter2",
    ] {
        let err = set(&[o]).expect_err(o).to_string();
        assert!(!err.contains("hunter2"), "{o}: {err}");
        if o.contains('=') && !o.contains('{') {
            assert!(err.contains(&format!("(--set {}=…)", o.split('=').next().unwrap_or_default())), "{o}: {err}");
        }
    }
    let err = Config::load(&Sources { env: env(&[("IMAGED_GC__BOGUS", "1")]), ..Sources::default() })
        .expect_err("unknown")
        .to_string();
    assert!(err.contains("unknown key gc.bogus (environment IMAGED_GC__BOGUS)"), "{err}");
}

#[test]
fn a_variable_with_one_underscore_after_a_section_is_refused_naming_the_one_meant() {
    let load = |vars: &[(&str, &str)]| Config::load(&Sources { env: env(vars), ..Sources::default() });
    let err = load(&[("IMAGED_GC_IMAGE_MINIMUM_GC_AGE", "5m")]).expect_err("mistyped").to_string();
    assert_eq!(
        err,
        "configuration: environment IMAGED_GC_IMAGE_MINIMUM_GC_AGE is not a configuration variable: a section and its key \
         are joined by two underscores (IMAGED_GC__IMAGE_MINIMUM_GC_AGE, the key gc.image_minimum_gc_age)"
    );
    // A section with an underscore of its own; the value is never echoed.
    let err = load(&[("IMAGED_CRI_SERVER_SOCKET", "hunter2")]).expect_err("mistyped").to_string();
    assert!(err.contains("(IMAGED_CRI_SERVER__SOCKET, the key cri_server.socket)"), "{err}");
    assert!(!err.contains("hunter2"), "{err}");
    // Other IMAGED_* variables are tools' and tests', not configuration.
    let c = load(&[("IMAGED_SIM_SEEDS", "9"), ("IMAGED_FOO", "1"), ("IMAGED_GC", "x"), ("IMAGED_GC__GC_PERIOD", "7m")])
        .expect("not configuration variables");
    assert_eq!(c.gc.gc_period, std::time::Duration::from_secs(420));
}

#[test]
fn the_prefetch_list_is_normalised_deduplicated_and_kept_from_gc_unless_told_not_to() {
    let c = Config::defaults().expect("defaults load");
    assert_eq!(
        c.prefetch,
        PrefetchSettings { images: vec![], refresh: Some(Duration::from_secs(15 * 60)), keep: true },
        "nothing declared by default"
    );
    let c = Config::from_toml(
        "[gc]\npinned_images = [\"registry.k8s.io/*\"]\n\
         [prefetch]\nimages = [\"redis:7\", \"docker.io/library/redis:7\", \"quay.io/a/b\"]\nrefresh = \"0s\"",
    )
    .expect("loads");
    assert_eq!(c.prefetch.images, ["docker.io/library/redis:7", "quay.io/a/b:latest"], "as the runtime names them");
    assert_eq!(c.prefetch.refresh, None, "0s: only at start");
    assert_eq!(c.gc.pinned_images, ["registry.k8s.io/*", "docker.io/library/redis:7", "quay.io/a/b:latest"]);
    let c = Config::from_toml("[prefetch]\nimages = [\"redis:7\"]\nkeep = false").expect("loads");
    assert_eq!((c.prefetch.images.len(), c.gc.pinned_images.len()), (1, 0), "keep = false: prefetched only");
    let e = Config::from_toml("[prefetch]\nimages = [\"Redis:7\"]").unwrap_err().to_string();
    assert!(e.contains("prefetch.images") && e.contains("Redis:7") && e.contains("not an image reference"), "{e}");
    let e = Config::from_toml("[prefetch]\nrefresh = \"15min\"").unwrap_err().to_string();
    assert!(e.contains("prefetch.refresh"), "{e}");
}

#[test]
fn a_bad_value_in_a_later_list_table_names_that_tables_line() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("imaged.toml");
    let text = "[[cri_server.priority]]\nnamespace = \"a\"\npriority = 5\n\n[[cri_server.priority]]\nnamespace = \"b\"\npriority = \"x\"\n";
    std::fs::write(&file, text).unwrap();
    match Config::load(&Sources { file: Some(file.clone()), ..Sources::default() }) {
        Err(ConfigError::Invalid { key, reason, .. }) => {
            assert_eq!(key, "cri_server.priority.priority");
            assert!(reason.contains(&format!("({}, line 7)", file.display())), "the second rule's line: {reason}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn keys_set_through_a_table_value_name_the_flag_as_their_origin() {
    let sources = Sources {
        overrides: vec![r#"runtime.deadlines={version="1m"}"#.into(), r#"gc={gc_period="7m"}"#.into()],
        ..Sources::default()
    };
    let loaded = Config::load_full(&sources).expect("loads");
    assert_eq!(loaded.config.gc.gc_period, Duration::from_secs(420));
    let e = loaded.effective;
    assert_eq!(e.origin("runtime.deadlines.version"), Origin::Flag);
    assert_eq!(e.origin("gc.gc_period"), Origin::Flag);
    assert_eq!(e.origin("runtime.deadlines.image_status"), Origin::Default, "a key the table did not set");
    assert!(e.to_toml(true).contains("version = \"1m\"  # flag"), "{}", e.to_toml(true));
}

#[test]
fn keys_set_through_a_table_value_in_the_environment_name_the_variable() {
    let sources = Sources { env: env(&[("IMAGED_RUNTIME__DEADLINES", r#"{version="1m"}"#)]), ..Sources::default() };
    let loaded = Config::load_full(&sources).expect("loads");
    let e = loaded.effective;
    let var = Origin::Environment("IMAGED_RUNTIME__DEADLINES".into());
    assert_eq!(e.origin("runtime.deadlines.version"), var);
    assert_eq!(e.origin("runtime.deadlines.image_status"), Origin::Default, "a key the table did not set");
}

#[test]
fn the_effective_values_name_every_leaf_and_a_change_names_its_keys() {
    let load = |overrides: &[&str]| {
        let sources = Sources { overrides: overrides.iter().map(|s| s.to_string()).collect(), ..Default::default() };
        Config::load_full(&sources).expect("loads").effective.values()
    };
    let before = load(&[]);
    // Inner tables by their dotted path; a list of tables is one value.
    assert_eq!(before.get("runtime.deadlines.version"), Some(&toml::Value::String("2m".into())));
    assert_eq!(before.get("gc.image_gc_high_threshold_percent"), Some(&toml::Value::Integer(85)));
    assert!(before.contains_key("cri_server.priority"), "{:?}", before.keys().collect::<Vec<_>>());
    assert!(!before.keys().any(|k| k.starts_with("cri_server.priority.")), "the list is one value");
    assert!(!before.contains_key("runtime.deadlines"), "a table is not a value of its own");
    assert_eq!(changed_keys(&before, &before), Vec::<String>::new());
    let after = load(&[
        "runtime.deadlines.version=1m",
        "pull.queue_capacity=4",
        "pull.serialize_image_pulls=false",
        "cri_server.priority=[]",
    ]);
    // Set in one only (serialize_image_pulls is unset by default) counts.
    assert_eq!(
        changed_keys(&before, &after),
        ["cri_server.priority", "pull.queue_capacity", "pull.serialize_image_pulls", "runtime.deadlines.version"]
    );
    assert_eq!(changed_keys(&after, &before), changed_keys(&before, &after));
}

#[test]
fn a_value_written_otherwise_has_the_same_meaning_and_a_new_one_does_not() {
    let s = |v: &str| toml::Value::String(v.into());
    let i = toml::Value::Integer;
    assert!(same_meaning("gc.gc_period", Some(&s("5m")), Some(&s("300s"))));
    assert!(same_meaning("gc.gc_period", None, Some(&s("5m0s"))), "unset is the default");
    assert!(same_meaning("runtime.deadlines.version", Some(&s("2m")), Some(&s("120s"))));
    assert!(!same_meaning("gc.gc_period", Some(&s("5m")), Some(&s("6m"))));
    assert!(!same_meaning("pull.queue_capacity", Some(&i(10)), Some(&i(4))));
    assert!(!same_meaning("runtime.deadlines.version", None, Some(&s("1m"))));
    // Refused alone (the low threshold must stay under the high one): different.
    assert!(!same_meaning("gc.image_gc_low_threshold_percent", Some(&i(90)), Some(&i(90))));
    assert!(!same_meaning("no.such_key", Some(&i(1)), Some(&i(1))));
}

#[test]
fn a_value_refused_after_loading_names_where_it_was_given() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("imaged.toml");
    std::fs::write(&file, "[gc]\nimage_gc_high_threshold_percent = 85\ngc_period = \"5 minutes\"\n").unwrap();
    let reason = |sources: &Sources| match Config::load(sources) {
        Err(ConfigError::Invalid { key, reason, .. }) => (key, reason),
        other => panic!("{other:?}"),
    };
    let (key, r) = reason(&Sources { file: Some(file.clone()), ..Sources::default() });
    assert_eq!(key, "gc.gc_period");
    assert!(r.ends_with(&format!("({}, line 3)", file.display())), "{r}");

    // A later layer that gives the key is the one named.
    let env = std::collections::HashMap::from([("IMAGED_GC__GC_PERIOD".to_string(), "1day".to_string())]);
    let (key, r) = reason(&Sources { file: Some(file.clone()), env: Some(env), ..Sources::default() });
    assert_eq!(key, "gc.gc_period");
    assert!(r.ends_with("(environment IMAGED_GC__GC_PERIOD)"), "{r}");
    let (_, r) = reason(&Sources {
        file: Some(file.clone()),
        overrides: vec!["gc.gc_period=2min".into()],
        ..Sources::default()
    });
    assert!(r.ends_with("here \"2m0s\" (command line)"), "{r}");

    // Inside a list of tables: the item refused, not the first one.
    let rules = dir.path().join("rules.toml");
    let text = "[pull]\n[[pull.registries]]\nregistry = \"a.io\"\nqps = 1\n\n[[pull.registries]]\nregistry = \"b.io\"\nqps = -1\n";
    std::fs::write(&rules, text).unwrap();
    let (key, r) = reason(&Sources { file: Some(rules.clone()), ..Sources::default() });
    assert_eq!(key, "pull.registries[1].qps");
    assert!(r.ends_with(&format!("({}, line 8)", rules.display())), "{r}");

    // A default refused beside another key (a cross-key check) names no place.
    let (key, r) =
        reason(&Sources { overrides: vec!["gc.image_gc_high_threshold_percent=5".into()], ..Sources::default() });
    assert_eq!(key, "gc.image_gc_low_threshold_percent");
    assert!(r.ends_with("(gc.image_gc_high_threshold_percent is 5)"), "the default has no place: {r}");
}
