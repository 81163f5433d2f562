//! The files in `deploy/` agree with imaged: the DaemonSet probes the
//! endpoints on the address imaged is configured to serve them on, and the
//! systemd unit's settings are valid configuration.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

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
    const PATCH: &str = include_str!("../deploy/kubelet-path/kubelet-config-patch.yaml");
    const CRICTL: &str = include_str!("../deploy/kubelet-path/crictl.yaml");
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
    assert_eq!(cfg.pull.concurrency.to_string(), "parallel(4)", "imaged's own limits apply, not the kubelet's");
}
