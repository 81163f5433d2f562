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

/// The documents of a manifest.
fn documents(text: &str) -> Vec<Value> {
    serde_yaml_ng::Deserializer::from_str(text).map(|d| Value::deserialize(d).expect("yaml")).collect()
}

/// kustomize's strategic merge, for what the layouts patch: maps merge key
/// by key, lists of objects merge by `name` (containers, env, volumes,
/// volumeMounts), anything else is replaced.
fn strategic_merge(base: &mut Value, patch: &Value) {
    match (base, patch) {
        (Value::Mapping(b), Value::Mapping(p)) => {
            for (k, v) in p {
                match b.get_mut(k) {
                    Some(existing) => strategic_merge(existing, v),
                    None => {
                        b.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        (Value::Sequence(b), Value::Sequence(p)) if p.iter().all(|i| i.get("name").is_some()) => {
            for item in p {
                match b.iter_mut().find(|x| x.get("name") == item.get("name")) {
                    Some(existing) => strategic_merge(existing, item),
                    None => b.push(item.clone()),
                }
            }
        }
        (b, p) => *b = p.clone(),
    }
}

/// The DaemonSet manifests: the base (kubeadm's layout) and each layout
/// rendered as `kubectl apply -k deploy/kubernetes/layouts/NAME` would.
fn daemonset_layouts() -> Vec<(String, Vec<Value>)> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/kubernetes");
    let kustomization: Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(root.join("kustomization.yaml")).expect("read"))
            .expect("yaml");
    assert_eq!(kustomization["resources"][0].as_str(), Some("imaged-daemonset.yaml"));
    let mut out = vec![("kubeadm".to_string(), documents(DAEMONSET))];
    for layout in ["eks", "gke", "aks"] {
        let dir = root.join("layouts").join(layout);
        let k: Value = serde_yaml_ng::from_str(&std::fs::read_to_string(dir.join("kustomization.yaml")).expect("read"))
            .expect("yaml");
        assert_eq!(k["resources"][0].as_str(), Some("../.."), "{layout}: the base");
        let patch_file = k["patches"][0]["path"].as_str().expect("a patch file");
        let patch: Value =
            serde_yaml_ng::from_str(&std::fs::read_to_string(dir.join(patch_file)).expect("read")).expect("yaml");
        let mut docs = documents(DAEMONSET);
        let ds = docs.iter_mut().find(|d| d["kind"] == "DaemonSet").expect("a DaemonSet");
        assert_eq!((patch["kind"].as_str(), patch["metadata"]["name"].as_str()), (Some("DaemonSet"), Some("imaged")));
        strategic_merge(ds, &patch);
        out.push((layout.to_string(), docs));
    }
    out
}

fn env_of(container: &Value) -> Vec<(String, String)> {
    container["env"]
        .as_sequence()
        .expect("env")
        .iter()
        .map(|e| (e["name"].as_str().unwrap_or("").to_string(), e["value"].as_str().unwrap_or("").to_string()))
        .collect()
}

#[test]
fn every_daemonset_layout_mounts_the_kubelets_files_and_probes_what_matters() {
    for (layout, docs) in daemonset_layouts() {
        let ds = docs.iter().find(|d| d["kind"] == "DaemonSet").expect("a DaemonSet");
        let pod = &ds["spec"]["template"]["spec"];
        assert_eq!(pod["hostNetwork"], Value::Bool(true), "{layout}: loopback endpoints need the node's network");
        let c = &pod["containers"][0];
        let env = env_of(c);
        let var = |name: &str| env.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
        let cfg = load_with_env(&env);

        // Probes: up (startup) and alive (liveness) are /healthz, ready is
        // /readyz (the runtime answers), on the address imaged serves them.
        let addr = cfg.daemon.metrics_address.expect("metrics served");
        assert!(addr.ip().is_loopback());
        for (probe, path) in
            [("startupProbe", "/healthz"), ("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")]
        {
            let get = &c[probe]["httpGet"];
            assert_eq!(get["path"].as_str(), Some(path), "{layout} {probe}");
            assert_eq!(get["port"].as_u64(), Some(u64::from(addr.port())), "{layout} {probe}");
            assert_eq!(get["host"].as_str(), Some(addr.ip().to_string().as_str()), "{layout} {probe}");
        }

        // The kubelet config comes from a variable, not one path.
        let args: Vec<&str> = c["args"].as_sequence().expect("args").iter().filter_map(Value::as_str).collect();
        assert_eq!(args, ["--kubelet-config=$(KUBELET_CONFIG)", "run"], "{layout}");
        let kubelet_config = var("KUBELET_CONFIG").unwrap_or_else(|| panic!("{layout}: KUBELET_CONFIG"));

        // Every file imaged reads of the kubelet's is mounted from the same
        // path on the node: the kubelet's own paths then work unchanged.
        let mounts: Vec<(String, String)> = c["volumeMounts"]
            .as_sequence()
            .expect("mounts")
            .iter()
            .map(|m| (m["name"].as_str().unwrap_or("").to_string(), m["mountPath"].as_str().unwrap_or("").to_string()))
            .collect();
        let host_path = |volume: &str| {
            pod["volumes"].as_sequence().expect("volumes").iter().find(|v| v["name"] == volume).map(|v| {
                v["hostPath"]["path"].as_str().unwrap_or_else(|| panic!("{layout}: {volume} is a hostPath")).to_string()
            })
        };
        let mounted_from_the_node = |path: &str| {
            mounts.iter().any(|(volume, at)| {
                std::path::Path::new(path).starts_with(at) && host_path(volume).as_deref() == Some(at.as_str())
            })
        };
        let provider_config = var("IMAGED_CREDENTIALS__PROVIDER_CONFIG").unwrap_or_default();
        let provider_bin = var("IMAGED_CREDENTIALS__PROVIDER_BIN_DIR").unwrap_or_default();
        assert_eq!(provider_config.is_empty(), provider_bin.is_empty(), "{layout}: both or neither");
        assert_eq!(cfg.credentials.provider_config.is_some(), !provider_config.is_empty());
        let mut needed = vec!["/run/containerd", "/var/lib/imaged", "/run/imaged", "/var/lib/kubelet/config.json"];
        needed.push("/root/.docker/config.json");
        for p in [&kubelet_config, &provider_config, &provider_bin] {
            if !p.is_empty() {
                needed.push(p);
            }
        }
        for path in needed {
            assert!(mounted_from_the_node(path), "{layout}: {path} is not mounted from the node: {mounts:?}");
        }
        assert_eq!(var("HOME").as_deref(), Some("/root"), "{layout}: $HOME/.docker is /root/.docker");
        if kubelet_config.is_empty() {
            assert!(cfg.endpoint != imaged::config::RuntimeEndpoint::Embedded { socket: None }, "{layout}: a runtime");
        }
        assert_eq!(cfg.state_dir.as_deref(), Some(std::path::Path::new("/var/lib/imaged")));
    }
}

#[test]
fn the_daemonset_and_its_layouts_pass_the_kubernetes_schema() {
    let Some(validate) = tool("kubernetes-validate", &["--version"]) else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    for (layout, docs) in daemonset_layouts() {
        let text: Vec<String> = docs.iter().map(|d| serde_yaml_ng::to_string(d).expect("yaml")).collect();
        let file = dir.path().join(format!("{layout}.yaml"));
        std::fs::write(&file, text.join("---\n")).expect("write");
        let out = std::process::Command::new(&validate).arg("--strict").arg(&file).output().expect("run");
        let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "{layout}: {said}");
        assert_eq!(said.matches(" passed for resource ").count(), 2, "{layout}: {said}");
    }
}

/// `name` if it runs (`args` succeed); `None` where it is not installed,
/// which CI does not accept (`.ci/run` installs it).
fn tool(name: &str, args: &[&str]) -> Option<String> {
    let found = std::process::Command::new(name).args(args).output().is_ok_and(|o| o.status.success());
    if found {
        return Some(name.to_string());
    }
    assert!(std::env::var_os("CI").is_none(), "{name} is required in CI (.ci/run installs it)");
    eprintln!("skipped: {name} is not installed");
    None
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
    assert!(UNIT.contains("ExecStart=/usr/local/bin/imaged --kubelet-config ${KUBELET_CONFIG} run"));
    assert!(UNIT.lines().any(|l| l == "Environment=KUBELET_CONFIG=/var/lib/kubelet/config.yaml"));
    // Credential plugins reach their cloud, and the kubelet's files stay
    // visible; the drop-in takes the network away again.
    assert!(!UNIT.lines().any(|l| l.starts_with("IPAddressDeny=")), "plugins call cloud APIs");
    assert!(UNIT.lines().any(|l| l == "ProtectHome=read-only"), "/root/.docker stays readable");
    assert!(!UNIT.lines().any(|l| l == "ProtectHome=yes"));
    let drop_in = include_str!("../deploy/systemd/no-credential-plugins.conf");
    for line in ["IPAddressDeny=any", "IPAddressAllow=localhost", "RestrictAddressFamilies="] {
        assert!(drop_in.lines().any(|l| l == line), "{line}");
    }
}

/// The units as systemd would load them, checked by `systemd-analyze
/// verify` where it runs: with ExecStart pointing at the built binary (it
/// checks that it is executable) and the drop-in in `imaged.service.d/`.
#[test]
fn systemd_analyze_verifies_the_units_and_the_drop_in() {
    if tool("systemd-analyze", &["--version"]).is_none() {
        return;
    }
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy");
    for (unit, extra) in
        [("systemd/imaged.service", None), ("kubelet-path/imaged.service", Some("kubelet-path/imaged-cri.socket"))]
    {
        let dir = tempfile::tempdir().expect("tempdir");
        let text = std::fs::read_to_string(root.join(unit)).expect("read");
        assert!(text.contains("/usr/local/bin/imaged "), "{unit}");
        std::fs::write(
            dir.path().join("imaged.service"),
            text.replace("/usr/local/bin/imaged ", &format!("{} ", env!("CARGO_BIN_EXE_imaged"))),
        )
        .expect("write");
        std::fs::create_dir(dir.path().join("imaged.service.d")).expect("mkdir");
        std::fs::copy(
            root.join("systemd/no-credential-plugins.conf"),
            dir.path().join("imaged.service.d/no-credential-plugins.conf"),
        )
        .expect("copy");
        let mut units = vec!["imaged.service".to_string()];
        if let Some(extra) = extra {
            let name = std::path::Path::new(extra).file_name().expect("name");
            std::fs::copy(root.join(extra), dir.path().join(name)).expect("copy");
            units.push(name.to_string_lossy().into_owned());
        }
        let out = std::process::Command::new("systemd-analyze")
            .args(["verify", "--man=no"])
            .args(&units)
            .current_dir(dir.path())
            // The temp dir first (its drop-ins too), then the system's.
            .env("SYSTEMD_UNIT_PATH", format!("{}:", dir.path().display()))
            .output()
            .expect("systemd-analyze");
        let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        // verify exits 0 on unknown keys and bad values too, so any word is a failure.
        assert!(out.status.success() && said.trim().is_empty(), "{unit}: {said}");
    }
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
    assert!(a.cri_server.refuse_remove_in_use, "(a): the kubelet's GC cannot remove an image a pod was just given");
    assert!(patch_a.get("imageGCHighThresholdPercent").is_none(), "(a): the kubelet's GC stays as it is");

    let (b, patch_b) = kubelet_path_config("setup-b-imaged-gc");
    assert_eq!(patch_b["imageGCHighThresholdPercent"].as_u64(), Some(100), "(b): the kubelet's GC is off");
    assert_eq!(patch_b["imageMaximumGCAge"].as_str(), Some("0s"));
    let policy = b.gc.policy();
    assert!(!policy.is_disabled(), "(b): imaged collects");
    assert!(!b.cri_server.refuse_remove_in_use, "(b): the kubelet does not remove images");
    assert_eq!((policy.high_threshold_percent, policy.low_threshold_percent), (85, 80));
    for (setup, patch) in [("a", &patch_a), ("b", &patch_b)] {
        assert_eq!(patch["imageServiceEndpoint"].as_str(), Some("unix:///run/imaged/cri.sock"), "({setup})");
        assert_eq!(patch["serializeImagePulls"].as_bool(), Some(false), "({setup})");
        assert_eq!(patch["registryPullQPS"].as_u64(), Some(0), "({setup})");
    }
}

/// The sample names imaged exports, from a registry with a series in
/// every family.
fn exported_sample_names() -> std::collections::BTreeSet<String> {
    use imaged::cri::{CriError, Rpc};
    let m = imaged::metrics::Metrics::default();
    m.image_pulled(1, std::time::Duration::from_secs(1));
    m.image_garbage_collected("space", 1);
    drop(m.ensure_request(imaged::domain::pull_policy::PullPolicy::IfNotPresent));
    m.mustpull_check(imaged::domain::pull_record::MustPullResult::CredentialRecordFound);
    m.credential_plugin_ran("p", std::time::Duration::from_millis(1), true);
    m.set_credential_provider_config("sha256:ab");
    m.single_flight_joined();
    m.throttle_waited();
    m.throttle_rejected();
    m.pull_failed("registry.example", "unauthorized");
    m.slow_pull_blocking();
    m.backoff_reset(imaged::metrics::BackoffResetReason::Cleared, 1);
    m.cri_call(Rpc::Version, std::time::Duration::from_millis(1), Some(&CriError::deadline_exceeded()));
    m.gc_run(true);
    m.store_recovered();
    m.set_config_info(&[("image_gc_high_threshold_percent", "85".into())]);
    let scrape = imaged::testing::Scrape::parse(&m.encode_prometheus()).expect("parses");
    scrape.samples.into_iter().map(|s| s.name).collect()
}

/// Every `imaged_*` metric `text` (PromQL) names is one imaged exports.
fn assert_names_exported(what: &str, text: &str, exported: &std::collections::BTreeSet<String>) -> usize {
    let mut used = 0;
    for (i, _) in text.match_indices("imaged_") {
        // A label value or a word inside another name is not a metric.
        if text[..i].ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_') {
            continue;
        }
        let name: String = text[i..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
        assert!(exported.contains(&name), "{what}: {name} is not a metric imaged exports");
        used += 1;
    }
    used
}

#[test]
fn the_alert_rules_check_and_pass_their_unit_tests_on_metrics_imaged_exports() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/prometheus");
    let rules = std::fs::read_to_string(dir.join("imaged-alerts.yaml")).expect("read");
    let exported = exported_sample_names();
    let doc: Value = serde_yaml_ng::from_str(&rules).expect("yaml");
    let mut alerts = 0;
    for group in doc["groups"].as_sequence().expect("groups") {
        for rule in group["rules"].as_sequence().expect("rules") {
            let expr = rule["expr"].as_str().expect("expr");
            let name = rule["alert"].as_str().expect("an alert");
            assert!(name.starts_with("Imaged"), "{name}");
            assert!(rule["labels"]["severity"].as_str().is_some(), "{name}: severity");
            assert!(rule["annotations"]["summary"].as_str().is_some(), "{name}: summary");
            if name != "ImagedDown" {
                assert!(assert_names_exported(name, expr, &exported) > 0, "{name} uses imaged's metrics");
            }
            alerts += 1;
        }
    }
    assert!(alerts >= 5, "{alerts} alerts");
    let Some(promtool) = tool("promtool", &["--version"]) else { return };
    for args in [&["check", "rules", "imaged-alerts.yaml"][..], &["test", "rules", "imaged-alerts.test.yaml"][..]] {
        let out = std::process::Command::new(&promtool).args(args).current_dir(&dir).output().expect("promtool");
        let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success() && said.contains("SUCCESS"), "promtool {args:?}: {said}");
    }
}

#[test]
fn the_grafana_dashboard_queries_metrics_imaged_exports_in_valid_promql() {
    let text = include_str!("../deploy/grafana/imaged-dashboard.json");
    let dash: serde_json::Value = serde_json::from_str(text).expect("the dashboard is JSON");
    assert_eq!(dash["uid"], "imaged");
    let exported = exported_sample_names();
    let panels = dash["panels"].as_array().expect("panels");
    let mut ids = std::collections::BTreeSet::new();
    let mut exprs = Vec::new();
    for p in panels {
        assert!(ids.insert(p["id"].as_u64().expect("id")), "panel ids are unique");
        let grid = &p["gridPos"];
        assert!(grid["x"].as_u64().expect("x") + grid["w"].as_u64().expect("w") <= 24, "{p}");
        if p["type"] == "row" {
            continue;
        }
        assert_eq!(p["datasource"]["uid"], "${datasource}", "{}", p["title"]);
        for t in p["targets"].as_array().expect("targets") {
            let expr = t["expr"].as_str().expect("expr");
            assert!(
                assert_names_exported(p["title"].as_str().unwrap_or(""), expr, &exported) > 0
                    || expr.starts_with("up{")
            );
            exprs.push(expr.to_string());
        }
    }
    assert!(exprs.len() >= 15, "{} queries", exprs.len());
    // promtool parses each query, as a recording rule with Grafana's
    // variables filled in.
    let Some(promtool) = tool("promtool", &["--version"]) else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let rules: Vec<serde_json::Value> = exprs
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let e = e.replace("$__rate_interval", "5m").replace("$job", ".*").replace("$instance", ".*");
            serde_json::json!({ "record": format!("dashboard:query_{i}"), "expr": e })
        })
        .collect();
    let file = dir.path().join("dashboard-rules.json");
    let doc = serde_json::json!({ "groups": [{ "name": "dashboard", "rules": rules }] });
    std::fs::write(&file, serde_json::to_string(&doc).expect("json")).expect("write");
    let out = std::process::Command::new(&promtool).args(["check", "rules"]).arg(&file).output().expect("promtool");
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "promtool: {said}");
}
