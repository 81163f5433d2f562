#![allow(clippy::pedantic)] // test code: pedantic lints are for what ships
use std::path::Path;
use std::time::Duration;

use super::*;
use crate::actors::pull_queue::Concurrency;
use crate::config::{Config, ConfigError, RuntimeEndpoint, Sources};

const FIXTURE: &str = include_str!("../../tests/fixtures/kubelet-config.yaml");

fn minimal(extra: &str) -> String {
    format!("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n{extra}")
}

fn write(dir: &tempfile::TempDir, name: &str, text: &str) -> std::path::PathBuf {
    let p = dir.path().join(name);
    std::fs::write(&p, text).expect("write");
    p
}

#[test]
fn go_durations_parse_like_go() {
    let cases = [
        ("0", 0),
        ("0s", 0),
        ("2m0s", 120_000),
        ("5m30s", 330_000),
        ("1h30m", 5_400_000),
        ("168h0m0s", 604_800_000),
        ("1.5s", 1_500),
        ("300ms", 300),
        ("+10s", 10_000),
        ("-0", 0),
    ];
    for (text, ms) in cases {
        assert_eq!(parse_go_duration(text), Ok(Duration::from_millis(ms)), "{text}");
    }
    assert_eq!(parse_go_duration("1500us"), Ok(Duration::from_micros(1500)));
    assert_eq!(parse_go_duration("7ns"), Ok(Duration::from_nanos(7)));
    assert_eq!(parse_go_duration("-1m"), Err("must not be negative".into()));
    for bad in ["", "10", "1d", "m", "1.2.3s", "abc"] {
        assert!(parse_go_duration(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn a_kubeadm_configuration_yields_its_image_fields_and_ignores_the_rest() {
    let k = KubeletImageFields::parse(Path::new("/var/lib/kubelet/config.yaml"), FIXTURE).expect("parses");
    assert_eq!(k.serialize_image_pulls, Some(false));
    assert_eq!(k.max_parallel_image_pulls, Some(4));
    assert_eq!(k.registry_pull_qps, Some(10.0));
    assert_eq!(k.registry_burst, Some(20));
    assert_eq!(k.image_gc_high_threshold_percent, Some(90));
    assert_eq!(k.image_gc_low_threshold_percent, Some(70));
    assert_eq!(k.image_minimum_gc_age, Some(Duration::from_secs(330)));
    assert_eq!(k.image_maximum_gc_age, Some(Duration::from_secs(168 * 3600)));
    assert_eq!(k.image_pull_credentials_verification_policy.as_deref(), Some("NeverVerifyAllowlistedImages"));
    assert_eq!(
        k.preloaded_images_verification_allowlist,
        Some(vec!["registry.k8s.io/*".to_string(), "docker.io/library/nginx".to_string()])
    );
    assert_eq!(k.container_runtime_endpoint.as_deref(), Some("unix:///run/containerd/containerd.sock"));
    assert_eq!(k.image_service_endpoint, None);
    assert_eq!(k.pod_sandbox_image, None);
    // Every field kubeadm writes is one the kubelet knows.
    assert_eq!(k.unknown_fields, Vec::<String>::new());
    assert_eq!(k.strict_decoding_error(), None);
}

#[test]
fn unknown_fields_are_named_as_the_kubelets_strict_decoding_names_them() {
    let text = minimal(
        "imageMinimumGCAg: 5m\n\
         authentication:\n  x509:\n    clientCAFile: /ca.crt\n    clientCertFile: /x\n  anonymus:\n    enabled: false\n\
         evictionHard:\n  any.signal.name: 1%\n\
         featureGates:\n  SomeGate: true\n\
         logging:\n  format: json\n  whatever: 1\n\
         shutdownGracePeriodByPodPriority:\n- priority: 1\n  shutdownGracePeriodSeconds: 10\n- priority: 2\n  seconds: 5\n\
         registerWithTaints:\n- key: a\n  effect: NoSchedule\n  efect: x\n\
         podSandboxImage: registry.k8s.io/pause:3.10\n\
         imageGCHighThresholdPercent: 90\n",
    );
    let k = KubeletImageFields::parse(Path::new("k.yaml"), &text).expect("parses");
    assert_eq!(
        k.unknown_fields,
        [
            "imageMinimumGCAg",
            "authentication.x509.clientCertFile",
            "authentication.anonymus",
            "shutdownGracePeriodByPodPriority[1].seconds",
            "registerWithTaints[0].efect",
        ]
    );
    assert_eq!(
        k.strict_decoding_error().as_deref(),
        Some(
            "strict decoding error: unknown field \"imageMinimumGCAg\", unknown field \"authentication.x509.clientCertFile\", \
             unknown field \"authentication.anonymus\", unknown field \"shutdownGracePeriodByPodPriority[1].seconds\", \
             unknown field \"registerWithTaints[0].efect\""
        )
    );
    // The known fields are read all the same (the kubelet decodes leniently).
    assert_eq!(k.image_gc_high_threshold_percent, Some(90));
    assert_eq!(k.image_minimum_gc_age, None, "the misspelled field is ignored");
}

#[test]
fn the_fields_are_layered_between_the_file_and_the_environment() {
    let dir = tempfile::tempdir().expect("tempdir");
    let kubelet = write(&dir, "kubelet.yaml", FIXTURE);
    let file = write(&dir, "imaged.toml", "[pull]\nregistry_burst = 3\nqueue_capacity = 7\n");
    let env = [("IMAGED_GC__IMAGE_GC_LOW_THRESHOLD_PERCENT".to_string(), "60".to_string())].into_iter().collect();
    let sources = Sources {
        file: Some(file),
        kubelet_config: Some(kubelet),
        env: Some(env),
        overrides: vec!["pull.registry_pull_qps=2".into()],
    };
    let c = Config::load(&sources).expect("loads");
    assert_eq!(
        c.pull.concurrency,
        Concurrency::Parallel(Some(4)),
        "serializeImagePulls false, maxParallelImagePulls 4"
    );
    assert_eq!(c.pull.burst, 20, "the kubelet file wins over the config file");
    assert_eq!(c.pull.capacity, Some(7), "keys the kubelet file does not set stay the file's");
    assert_eq!(c.pull.qps, 2.0, "flags win over the kubelet file");
    assert_eq!(c.gc.low_threshold_percent, 60, "the environment wins over the kubelet file");
    assert_eq!(c.gc.high_threshold_percent, 90);
    assert_eq!(c.gc.min_age, Duration::from_secs(330));
    assert_eq!(c.gc.max_age, Duration::from_secs(168 * 3600));
    assert_eq!(
        c.verification.policy,
        crate::pull_records::VerificationPolicy::NeverVerifyAllowlistedImages,
        "imagePullCredentialsVerificationPolicy is applied"
    );
    assert!(c.verification.allowlist.matches("registry.k8s.io/pause"), "and the allowlist");
    assert!(!c.verification.allowlist.matches("quay.io/team/app"));
    assert_eq!(
        c.endpoint,
        RuntimeEndpoint::Cri(crate::cri::CriEndpoint::Unix("/run/containerd/containerd.sock".into()))
    );
}

#[test]
fn a_bad_value_names_the_file_and_the_field() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cases = [
        ("imageMinimumGCAge: 2 minutes", "imageMinimumGCAge", "\"2 minutes\""),
        ("imageMaximumGCAge: -5m", "imageMaximumGCAge", "must not be negative"),
        ("serializeImagePulls: sometimes", "serializeImagePulls", "is not true or false"),
        ("registryPullQPS: -1", "registryPullQPS", "-1 must not be a negative number"),
        ("registryBurst: lots", "registryBurst", "is not a 32-bit integer"),
        ("maxParallelImagePulls: 0", "maxParallelImagePulls", "0 must be a positive number"),
        ("imageGCHighThresholdPercent: 101", "imageGCHighThresholdPercent", "must be between 0 and 100"),
        (
            "preloadedImagesVerificationAllowlist: registry.k8s.io/*",
            "preloadedImagesVerificationAllowlist",
            "not a list",
        ),
    ];
    for (yaml, field, says) in cases {
        let path = write(&dir, "kubelet.yaml", &minimal(yaml));
        let err = Config::load(&Sources { kubelet_config: Some(path.clone()), ..Sources::default() }).expect_err(yaml);
        let text = err.to_string();
        assert!(matches!(err, ConfigError::Kubelet(_)), "{text}");
        assert!(text.contains(&path.display().to_string()), "{text}");
        assert!(text.contains(&format!("field {field}:")), "{text}");
        assert!(text.contains(says), "{text}");
    }
}

#[test]
fn values_imaged_refuses_are_blamed_on_the_kubelet_field_unless_overridden() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Parallel pulls with serialization on: the kubelet's own validation text.
    let path = write(&dir, "kubelet.yaml", &minimal("serializeImagePulls: true\nmaxParallelImagePulls: 3"));
    let sources = Sources { kubelet_config: Some(path.clone()), ..Sources::default() };
    let text = Config::load(&sources).expect_err("refused").to_string();
    assert!(text.contains(&path.display().to_string()) && text.contains("field maxParallelImagePulls:"), "{text}");
    assert!(text.contains("cannot be larger than 1 unless SerializeImagePulls"), "{text}");
    // Low above high.
    let path = write(&dir, "kubelet.yaml", &minimal("imageGCHighThresholdPercent: 50\nimageGCLowThresholdPercent: 60"));
    let sources = Sources { kubelet_config: Some(path.clone()), ..Sources::default() };
    let text = Config::load(&sources).expect_err("refused").to_string();
    assert!(text.contains("field imageGCLowThresholdPercent:"), "{text}");
    // A flag fixes it.
    let fixed = Sources { overrides: vec!["gc.image_gc_low_threshold_percent=40".into()], ..sources };
    assert_eq!(Config::load(&fixed).expect("fixed by a flag").gc.low_threshold_percent, 40);
}

#[test]
fn a_file_that_is_not_a_kubelet_configuration_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (text, says) in [
        ("apiVersion: v1\nkind: Pod\n", "want apiVersion \"kubelet.config.k8s.io/v1beta1\""),
        ("kind: KubeletConfiguration\n", "apiVersion \"\""),
        ("- a\n- b\n", "not a YAML mapping"),
        ("{ unclosed", "not a YAML mapping"),
    ] {
        let path = write(&dir, "k.yaml", text);
        let err = KubeletImageFields::read(&path).expect_err(text).to_string();
        assert!(err.contains(&path.display().to_string()) && err.contains(says), "{err}");
    }
    let err = KubeletImageFields::read(Path::new("/nonexistent/kubelet.yaml")).expect_err("missing").to_string();
    assert!(err.contains("/nonexistent/kubelet.yaml") && err.contains("cannot read it"), "{err}");
}

#[test]
fn an_empty_endpoint_is_not_set_and_pod_sandbox_image_maps() {
    let k = KubeletImageFields::parse(
        Path::new("k.yaml"),
        &minimal(
            "containerRuntimeEndpoint: \"\"\npodSandboxImage: registry.k8s.io/pause:3.9\nimageServiceEndpoint: unix:///x.sock",
        ),
    )
    .expect("parses");
    let o = k.overrides();
    assert!(o.contains(&("gc.sandbox_image", KeyValue::Str("registry.k8s.io/pause:3.9".into()), "podSandboxImage")));
    assert!(o.contains(&("runtime.endpoint", KeyValue::Str("unix:///x.sock".into()), "imageServiceEndpoint")));
    // And the kubelet's default eviction thresholds (no evictionHard set).
    let defaults = KeyValue::List(vec!["15%".into(), "10%".into()]);
    assert!(o.contains(&("gc.eviction_available", defaults, "evictionHard (unset: the kubelet's defaults)")));
    assert_eq!(o.len(), 3);
    assert_eq!(k.unknown_fields, Vec::<String>::new(), "podSandboxImage is read by imaged");
}

#[test]
fn durations_are_handed_on_in_gos_own_text() {
    let k =
        KubeletImageFields::parse(Path::new("k.yaml"), &minimal("imageMinimumGCAge: 90s\nimageMaximumGCAge: 1.5ms\n"))
            .expect("parses");
    let o = k.overrides();
    assert!(o.contains(&("gc.image_minimum_gc_age", KeyValue::Str("1m30s".into()), "imageMinimumGCAge")), "{o:?}");
    assert!(o.contains(&("gc.image_maximum_gc_age", KeyValue::Str("1.5ms".into()), "imageMaximumGCAge")), "{o:?}");
}

#[test]
fn in_the_kubelets_path_imaged_talks_to_the_container_runtime_endpoint() {
    // The kubelet's image calls go to imaged (imageServiceEndpoint), its
    // container calls to containerd: imaged forwards to containerd.
    let dir = tempfile::tempdir().expect("tempdir");
    let yaml = "containerRuntimeEndpoint: unix:///run/containerd/containerd.sock\n\
                imageServiceEndpoint: unix:///run/imaged/cri.sock";
    let path = write(&dir, "kubelet.yaml", &minimal(yaml));
    let cfg = Config::load(&Sources { kubelet_config: Some(path), ..Sources::default() }).expect("accepted");
    let containerd = crate::cri::CriEndpoint::Unix("/run/containerd/containerd.sock".into());
    assert_eq!(cfg.endpoint, crate::config::RuntimeEndpoint::Cri(containerd));
}

// === properties ===

mod props {
    use proptest::prelude::*;

    use super::*;
    use crate::domain::go_text::duration as go_duration;
    use crate::testing::props::config;

    /// The KubeletConfiguration fields imaged reads.
    const FIELDS: [&str; 13] = [
        "serializeImagePulls",
        "maxParallelImagePulls",
        "registryPullQPS",
        "registryBurst",
        "imageGCHighThresholdPercent",
        "imageGCLowThresholdPercent",
        "imageMinimumGCAge",
        "imageMaximumGCAge",
        "imagePullCredentialsVerificationPolicy",
        "preloadedImagesVerificationAllowlist",
        "podSandboxImage",
        "containerRuntimeEndpoint",
        "imageServiceEndpoint",
    ];

    /// A YAML value as text, of every type and at the bounds.
    fn yaml_value() -> impl Strategy<Value = String> {
        prop_oneof![
            any::<i64>().prop_map(|n| n.to_string()),
            (-2i64..200).prop_map(|n| n.to_string()),
            "-?[0-9]{19,30}",
            any::<f64>().prop_map(|f| format!("{f:?}")),
            Just(".nan".to_string()),
            any::<bool>().prop_map(|b| b.to_string()),
            Just("null".to_string()),
            Just("~".to_string()),
            (0..=i64::MAX as u64).prop_map(|ns| format!("{:?}", go_duration(Duration::from_nanos(ns)))),
            "[-+]?[0-9.]{0,25}(ns|us|ms|s|m|h|d)?".prop_map(|s| format!("{s:?}")),
            any::<String>().prop_map(|s| serde_json::to_string(&s).unwrap()),
            prop::collection::vec(any::<String>(), 0..3).prop_map(|v| serde_json::to_string(&v).unwrap()),
            Just("[1, [2], {a: b}]".to_string()),
            Just("{a: 1}".to_string()),
            Just("&x [*x]".to_string()),
        ]
    }

    proptest! {
        #![proptest_config(config(256))]

        #[test]
        fn any_text_parses_or_is_refused_without_a_panic(text in any::<String>()) {
            let _ = KubeletImageFields::parse(Path::new("k.yaml"), &text);
            let _ = KubeletImageFields::parse(Path::new("k.yaml"), &minimal(&text));
        }

        #[test]
        fn a_bad_field_is_refused_naming_it(field in prop::sample::select(FIELDS.to_vec()), v in yaml_value()) {
            let text = minimal(&format!("{field}: {v}\n"));
            match KubeletImageFields::parse(Path::new("k.yaml"), &text) {
                Ok(_) => {}
                Err(KubeletConfigError::Field { field: named, file, .. }) => {
                    prop_assert_eq!(named, field, "{:?}", text);
                    prop_assert_eq!(file, Path::new("k.yaml"));
                }
                // Not a mapping at all (e.g. an unbalanced flow value): the file is named.
                Err(e @ KubeletConfigError::File { .. }) => prop_assert!(e.to_string().contains("k.yaml"), "{}", e),
            }
        }

        #[test]
        fn go_durations_are_read_as_written(ns in 0..=i64::MAX as u64, max in any::<bool>()) {
            let field = if max { "imageMaximumGCAge" } else { "imageMinimumGCAge" };
            let d = Duration::from_nanos(ns);
            let text = minimal(&format!("{field}: {:?}\n", go_duration(d)));
            let k = KubeletImageFields::parse(Path::new("k.yaml"), &text).unwrap();
            prop_assert_eq!(if max { k.image_maximum_gc_age } else { k.image_minimum_gc_age }, Some(d));
        }
    }
}

#[test]
fn eviction_thresholds_for_the_image_filesystem_follow_the_kubelets_defaulting() {
    let lines = |extra: &str| {
        let k = KubeletImageFields::parse(Path::new("k.yaml"), &minimal(extra)).expect(extra);
        k.eviction_available
    };
    let owned = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    // No evictionHard: the kubelet's defaults.
    assert_eq!(lines(""), (owned(&["15%", "10%"]), "evictionHard (unset: the kubelet's defaults)"));
    // One set: it replaces the defaults (signals left out have none).
    assert_eq!(
        lines("evictionHard:\n  memory.available: 100Mi\n  imagefs.available: 20%\n"),
        (owned(&["20%"]), "evictionHard")
    );
    assert_eq!(lines("evictionHard:\n  memory.available: 100Mi\n"), (owned(&[]), "evictionHard"));
    // Unless merged with them.
    assert_eq!(
        lines("mergeDefaultEvictionSettings: true\nevictionHard:\n  nodefs.available: 5Gi\n"),
        (owned(&["15%", "5Gi"]), "evictionHard")
    );
    // Soft thresholds come on top; 0% and 100% are no threshold.
    assert_eq!(
        lines(
            "evictionHard:\n  imagefs.available: 0%\n  nodefs.available: 10%\n\
             evictionSoft:\n  imagefs.available: 25%\n  nodefs.available: 100%\n"
        ),
        (owned(&["10%", "25%"]), "evictionHard, evictionSoft")
    );
    let dir = tempfile::tempdir().expect("tempdir");
    for (yaml, field, says) in [
        ("evictionHard:\n  imagefs.available: lots\n", "evictionHard", "imagefs.available: \"lots\" is neither"),
        ("evictionSoft:\n  nodefs.available: 120%\n", "evictionSoft", "nodefs.available: \"120%\" must be between"),
        ("evictionHard: 15%\n", "evictionHard", "is not a map"),
        ("mergeDefaultEvictionSettings: often\n", "mergeDefaultEvictionSettings", "is not true or false"),
    ] {
        let path = write(&dir, "kubelet.yaml", &minimal(yaml));
        let err = Config::load(&Sources { kubelet_config: Some(path), ..Sources::default() }).expect_err(yaml);
        let text = err.to_string();
        assert!(text.contains(&format!("field {field}:")) && text.contains(says), "{yaml}: {text}");
    }
    // Layered onto gc.eviction_available, the kubelet's fields named as its origin.
    let path = write(&dir, "kubelet.yaml", &minimal("evictionHard:\n  imagefs.available: 2Gi\n"));
    let loaded = Config::load_full(&Sources { kubelet_config: Some(path), ..Sources::default() }).expect("loads");
    assert_eq!(loaded.config.gc.eviction_available, [crate::gc::eviction::AvailableThreshold::Bytes(2 << 30)]);
    assert!(loaded.effective.to_toml(true).contains("evictionHard"), "{}", loaded.effective.to_toml(true));
}

#[test]
fn the_zeros_kubeadm_writes_read_as_unset_as_the_kubelets_defaulting_reads_them() {
    // kubeadm writes every duration; the kubelet's defaulting turns these
    // zeros into its defaults (burst 10, minimum age 2m, timeout 2m).
    let dir = tempfile::tempdir().expect("tempdir");
    let yaml = "imageMinimumGCAge: 0s\nruntimeRequestTimeout: 0s\nregistryBurst: 0\n\
                imageMaximumGCAge: 0s\nregistryPullQPS: 0\nnodeStatusMaxImages: 0\n";
    let k = KubeletImageFields::parse(Path::new("k.yaml"), &minimal(yaml)).expect("parses");
    let keys: Vec<&str> = k.overrides().iter().map(|(key, _, _)| *key).collect();
    for unset in ["gc.image_minimum_gc_age", "pull.registry_burst", "runtime.deadlines.image_status"] {
        assert!(!keys.contains(&unset), "{unset}: {keys:?}");
    }
    // Zeros that mean something to the kubelet are handed on.
    for (key, value) in [
        ("gc.image_maximum_gc_age", KeyValue::Str("0s".into())),
        ("pull.registry_pull_qps", KeyValue::Float(0.0)),
        ("gc.node_status_max_images", KeyValue::Int(0)),
    ] {
        assert!(k.overrides().iter().any(|(k, v, _)| *k == key && *v == value), "{key}: {:?}", k.overrides());
    }
    // Through a configuration file whose keys the kubelet's zeros leave alone.
    let kubelet = write(&dir, "kubelet.yaml", &minimal(yaml));
    let file =
        write(&dir, "imaged.toml", "[gc]\nimage_minimum_gc_age = \"3m\"\n[runtime.deadlines]\nversion = \"7s\"\n");
    let c = Config::load(&Sources { file: Some(file), kubelet_config: Some(kubelet), ..Sources::default() })
        .expect("loads");
    assert_eq!(c.gc.min_age, Duration::from_secs(180));
    assert_eq!(c.cri.deadlines.get(crate::cri::Rpc::Version), Some(Duration::from_secs(7)));
    assert_eq!(c.gc.node_status_max_images, Some(0));
}

#[test]
fn the_request_timeout_is_every_cri_calls_deadline_but_the_pulls() {
    let dir = tempfile::tempdir().expect("tempdir");
    let kubelet = write(&dir, "kubelet.yaml", &minimal("runtimeRequestTimeout: 4m30s\nnodeStatusMaxImages: -1\n"));
    let loaded =
        Config::load_full(&Sources { kubelet_config: Some(kubelet.clone()), ..Sources::default() }).expect("loads");
    use crate::cri::Rpc;
    for rpc in [
        Rpc::Version,
        Rpc::ListImages,
        Rpc::ImageStatus,
        Rpc::RemoveImage,
        Rpc::ListContainers,
        Rpc::ListPodSandbox,
        Rpc::ContainerStatus,
    ] {
        assert_eq!(loaded.config.cri.deadlines.get(rpc), Some(Duration::from_secs(270)), "{rpc:?}");
    }
    assert_eq!(loaded.config.cri.deadlines.get(Rpc::PullImage), None, "a pull has no deadline, as in the kubelet");
    // The kubelet sets none on ImageFsInfo either; imaged keeps its own.
    assert_eq!(loaded.config.cri.deadlines.get(Rpc::ImageFsInfo), Some(Duration::from_secs(120)));
    assert_eq!(loaded.config.gc.node_status_max_images, None, "-1: every image");
    assert_eq!(
        loaded.effective.origin("runtime.deadlines.list_images"),
        crate::config::Origin::Kubelet { file: kubelet.clone(), field: "runtimeRequestTimeout" }
    );

    // A value the kubelet refuses is refused naming the kubelet's field.
    let bad = write(&dir, "bad.yaml", &minimal("nodeStatusMaxImages: -2\n"));
    let e = Config::load(&Sources { kubelet_config: Some(bad), ..Sources::default() }).expect_err("refused");
    let text = e.to_string();
    assert!(text.contains("nodeStatusMaxImages") && text.contains("must be -1 or greater"), "{text}");
    assert!(text.contains("bad.yaml"), "{text}");
}
