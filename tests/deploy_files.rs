//! The files in `deploy/` agree with imaged: the DaemonSet probes the
//! endpoints on the address imaged is configured to serve them on, and the
//! systemd unit's settings are valid configuration.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::pedantic)] // test code: a failed unwrap is a failed test

use std::collections::HashMap;

use imaged::config::{Config, Sources};
use serde::Deserialize;
use serde_yaml_ng::Value;

const DAEMONSET: &str = include_str!("../deploy/kubernetes/imaged-daemonset.yaml");
const UNIT: &str = include_str!("../deploy/systemd/imaged.service");

fn load_with_env(vars: &[(String, String)]) -> Config {
    // Every setting must load through the configuration as the daemon would.
    let env: HashMap<String, String> = vars.iter().filter(|(k, _)| k.starts_with("IMAGED_")).cloned().collect();
    Config::load(&Sources { env: Some(env), ..Sources::default() }).expect("the deployed settings are valid")
}

#[test]
fn the_daemonset_probes_the_configured_loopback_endpoints() {
    let docs: Vec<Value> =
        serde_yaml_ng::Deserializer::from_str(DAEMONSET).map(|d| Value::deserialize(d).expect("yaml")).collect();
    let ds = docs.iter().find(|d| d["kind"] == "DaemonSet").expect("a DaemonSet");
    let pod = &ds["spec"]["template"]["spec"];
    assert_eq!(pod["hostNetwork"], Value::Bool(true), "loopback endpoints need the node's network");
    let c = &pod["containers"][0];
    let env: Vec<(String, String)> = c["env"]
        .as_sequence()
        .expect("env")
        .iter()
        .map(|e| (e["name"].as_str().unwrap_or("").to_string(), e["value"].as_str().unwrap_or("").to_string()))
        .collect();
    let cfg = load_with_env(&env);
    let addr = cfg.daemon.metrics_address.expect("metrics served");
    assert!(addr.ip().is_loopback());
    for (probe, path) in [("readinessProbe", "/readyz"), ("livenessProbe", "/healthz"), ("startupProbe", "/readyz")] {
        let get = &c[probe]["httpGet"];
        assert_eq!(get["path"].as_str(), Some(path), "{probe}");
        assert_eq!(get["port"].as_u64(), Some(u64::from(addr.port())), "{probe}");
        assert_eq!(get["host"].as_str(), Some(addr.ip().to_string().as_str()), "{probe}");
    }
    let args: Vec<&str> = c["args"].as_sequence().expect("args").iter().filter_map(Value::as_str).collect();
    assert_eq!(args.last(), Some(&"run"));
    let mounts: Vec<&str> =
        c["volumeMounts"].as_sequence().expect("mounts").iter().filter_map(|m| m["mountPath"].as_str()).collect();
    for needed in ["/run/containerd", "/var/lib/imaged", "/run/imaged", "/var/lib/kubelet/config.yaml"] {
        assert!(mounts.contains(&needed), "{needed} is mounted: {mounts:?}");
    }
    let state = env.iter().find(|(k, _)| k == "IMAGED_STATE__DIR").map(|(_, v)| v.as_str());
    assert_eq!(state, Some("/var/lib/imaged"));
    assert_eq!(cfg.state_dir.as_deref(), Some(std::path::Path::new("/var/lib/imaged")));
}

#[test]
fn the_systemd_unit_settings_are_valid_configuration() {
    let env: Vec<(String, String)> = UNIT
        .lines()
        .filter_map(|l| l.strip_prefix("Environment="))
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    assert!(env.iter().any(|(k, _)| k == "IMAGED_DAEMON__METRICS_ADDRESS"));
    let cfg = load_with_env(&env);
    assert!(cfg.daemon.metrics_address.is_some_and(|a| a.ip().is_loopback()));
    for line in ["Restart=on-failure", "StateDirectory=imaged", "RuntimeDirectory=imaged", "NoNewPrivileges=yes"] {
        assert!(UNIT.lines().any(|l| l == line), "{line}");
    }
    assert!(UNIT.contains("--kubelet-config /var/lib/kubelet/config.yaml run"));
}

#[test]
fn the_kubelet_path_files_agree_on_the_cri_socket() {
    const PATH_UNIT: &str = include_str!("../deploy/kubelet-path/imaged.service");
    const PATCH: &str = include_str!("../deploy/kubelet-path/setup-a-kubelet-gc/kubelet-config-patch.yaml");
    const CRICTL: &str = include_str!("../deploy/kubelet-path/crictl.yaml");
    const SOCKET_UNIT: &str = include_str!("../deploy/kubelet-path/imaged-cri.socket");
    let env: Vec<(String, String)> = PATH_UNIT
        .lines()
        .filter_map(|l| l.strip_prefix("Environment="))
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let cfg = load_with_env(&env);
    let socket = cfg.cri_server.socket.expect("the unit serves the CRI front");
    let endpoint = format!("unix://{}", socket.display());
    let patch: Value = serde_yaml_ng::from_str(PATCH).expect("yaml");
    assert_eq!(patch["imageServiceEndpoint"].as_str(), Some(endpoint.as_str()));
    assert_eq!(patch["serializeImagePulls"].as_bool(), Some(false), "the kubelet must not serialize before imaged");
    assert_eq!(patch["registryPullQPS"].as_u64(), Some(0), "nor throttle");
    let crictl: Value = serde_yaml_ng::from_str(CRICTL).expect("yaml");
    assert_eq!(crictl["image-endpoint"].as_str(), Some(endpoint.as_str()));
    assert_eq!(crictl["runtime-endpoint"], patch["containerRuntimeEndpoint"]);
    assert!(PATH_UNIT.contains("Before=kubelet.service"), "up before the kubelet, which exits without it");
    // Socket activation: systemd holds the socket imaged serves.
    let listen = SOCKET_UNIT.lines().find_map(|l| l.strip_prefix("ListenStream=")).expect("ListenStream");
    assert_eq!(Some(std::path::Path::new(listen)), cri_socket_of(&env).as_deref());
    let fd_name = SOCKET_UNIT.lines().find_map(|l| l.strip_prefix("FileDescriptorName=")).expect("a name");
    assert_eq!(fd_name, imaged::api::server::CRI_FD_NAME, "the name imaged takes the socket by");
    assert!(SOCKET_UNIT.contains("Service=imaged.service") && SOCKET_UNIT.contains("Before=kubelet.service"));
    assert!(PATH_UNIT.contains("Requires=containerd.service imaged-cri.socket"));
    assert_eq!(cfg.pull.concurrency.to_string(), "parallel(4)", "imaged's own limits apply, not the kubelet's");
}

fn cri_socket_of(env: &[(String, String)]) -> Option<std::path::PathBuf> {
    env.iter().find(|(k, _)| k == "IMAGED_CRI_SERVER__SOCKET").map(|(_, v)| v.into())
}

/// imaged as the kubelet-path unit runs it with one set-up's files: the
/// unit's environment, then the set-up's `imaged.env` (systemd lets an
/// EnvironmentFile win over Environment=), and the kubelet's config with
/// the set-up's patch as `--kubelet-config`.
fn kubelet_path_config(setup: &str) -> (Config, Value) {
    const PATH_UNIT: &str = include_str!("../deploy/kubelet-path/imaged.service");
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/kubelet-path").join(setup);
    let env_file = std::fs::read_to_string(dir.join("imaged.env")).expect("imaged.env");
    let mut env: HashMap<String, String> = PATH_UNIT
        .lines()
        .filter_map(|l| l.strip_prefix("Environment="))
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    for line in env_file.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')) {
        let (k, v) = line.split_once('=').expect("KEY=value");
        env.insert(k.to_string(), v.to_string());
    }
    let patch_file = dir.join("kubelet-config-patch.yaml");
    let patch: Value = serde_yaml_ng::from_str(&std::fs::read_to_string(&patch_file).expect("patch")).expect("yaml");
    let sources = Sources { env: Some(env), kubelet_config: Some(patch_file), ..Sources::default() };
    (Config::load(&sources).expect("the set-up's settings are valid"), patch)
}

#[test]
fn set_up_a_leaves_gc_to_the_kubelet_and_set_up_b_to_imaged() {
    let (a, patch_a) = kubelet_path_config("setup-a-kubelet-gc");
    assert!(a.gc.policy().is_disabled(), "(a): imaged does not collect beside the kubelet: {:?}", a.gc.policy());
    assert!(a.cri_server.pin_sandbox_image, "(a): imaged pins the sandbox image for the kubelet's GC");
    assert!(patch_a.get("imageGCHighThresholdPercent").is_none(), "(a): the kubelet's GC stays as it is");

    let (b, patch_b) = kubelet_path_config("setup-b-imaged-gc");
    assert_eq!(patch_b["imageGCHighThresholdPercent"].as_u64(), Some(100), "(b): the kubelet's GC is off");
    assert_eq!(patch_b["imageMaximumGCAge"].as_str(), Some("0s"));
    let policy = b.gc.policy();
    assert!(!policy.is_disabled(), "(b): imaged collects");
    assert_eq!((policy.high_threshold_percent, policy.low_threshold_percent), (85, 80));
    for (setup, patch) in [("a", &patch_a), ("b", &patch_b)] {
        assert_eq!(patch["imageServiceEndpoint"].as_str(), Some("unix:///run/imaged/cri.sock"), "({setup})");
        assert_eq!(patch["serializeImagePulls"].as_bool(), Some(false), "({setup})");
        assert_eq!(patch["registryPullQPS"].as_u64(), Some(0), "({setup})");
    }
}
