//! Node credentials: config-file and plugin entries in one keyring, and
//! their place after pod secrets.

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;

use super::*;
use crate::credentials::secrets::{DOCKER_CONFIG_JSON_KEY, DOCKER_CONFIG_JSON_TYPE, PullSecret};
use crate::credentials::{lookup_credentials, node_files::DockerConfigSearch};

/// A node with `config.json` = `config` and one plugin answering `auth`
/// (a JSON object) for `*.io` images, its runs counted.
struct Node {
    dir: tempfile::TempDir,
    node: NodeCredentials,
}

impl Node {
    fn new(config: &str, plugin_auth: Option<&str>) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        std::fs::write(root.join("config.json"), config).expect("write");
        let mut settings = NodeCredentialSettings {
            search: DockerConfigSearch { config_json_dirs: vec![root.to_path_buf()], dockercfg_dirs: vec![] },
            ..NodeCredentialSettings::default()
        };
        if let Some(auth) = plugin_auth {
            let bin = root.join("bin");
            std::fs::create_dir_all(&bin).expect("mkdir");
            let count = root.join("count");
            let script = format!(
                "#!/bin/sh\necho run >> '{}'\ncat >/dev/null\ncat <<'EOF'\n{{\"apiVersion\":\"credentialprovider.kubelet.k8s.io/v1\",\"kind\":\"CredentialProviderResponse\",\"cacheKeyType\":\"Image\",\"auth\":{auth}}}\nEOF\n",
                count.display()
            );
            std::fs::write(bin.join("node-plugin"), script).expect("write");
            std::fs::set_permissions(bin.join("node-plugin"), std::fs::Permissions::from_mode(0o755)).expect("chmod");
            let conf = root.join("providers.yaml");
            std::fs::write(
                &conf,
                "apiVersion: kubelet.config.k8s.io/v1\nkind: CredentialProviderConfig\nproviders:\n  - name: node-plugin\n    matchImages: [\"*.io\", \"*.*.io\"]\n    defaultCacheDuration: 1m\n    apiVersion: credentialprovider.kubelet.k8s.io/v1\n",
            )
            .expect("write");
            settings.provider_config = Some(conf);
            settings.provider_bin_dir = Some(bin);
        }
        let node = NodeCredentials::from_settings(&settings).expect("registers");
        Self { dir, node }
    }

    fn runs(&self) -> usize {
        std::fs::read_to_string(self.dir.path().join("count")).map_or(0, |s| s.lines().count())
    }
}

fn users(creds: &[Credential]) -> Vec<&str> {
    creds.iter().map(|c| c.username.as_str()).collect()
}

#[tokio::test]
async fn files_come_before_plugins_as_in_the_kubelets_union_keyring() {
    let n = Node::new(
        r#"{"auths":{"reg.io":{"username":"file","password":"f"},"other.io":{"username":"file-other","password":"f"}}}"#,
        Some(
            r#"{"reg.io":{"username":"plugin","password":"p"},"reg.io/team":{"username":"plugin-team","password":"p"}}"#,
        ),
    );
    // The kubelet 1.36 unions its node keyring (files) and the pod's plugin
    // keyring: every file match first, then the plugins' (most specific
    // key first within each).
    assert_eq!(users(&n.node.lookup("reg.io/team/app").await), ["file", "plugin-team", "plugin"]);
    assert_eq!(users(&n.node.lookup("reg.io/app").await), ["file", "plugin"]);
    assert_eq!(users(&n.node.lookup("other.io/app").await), ["file-other"]);
    assert!(users(&n.node.lookup("quay.example/app").await).is_empty());
    assert!(n.node.lookup("reg.io/app").await.iter().all(|c| c.source.is_none()), "node credentials have no source");
}

#[tokio::test]
async fn without_plugins_the_file_alone_answers() {
    let n = Node::new(r#"{"auths":{"reg.io":{"auth":"ZmlsZTpwdw=="}}}"#, None);
    let creds = n.node.lookup("reg.io/app").await;
    assert_eq!(users(&creds), ["file"]);
    assert_eq!(creds[0].password.expose(), "pw");
}

#[tokio::test]
async fn pod_secrets_come_first_and_a_bad_secret_stops_before_any_plugin_runs() {
    let n = Node::new(
        r#"{"auths":{"reg.io":{"username":"file","password":"f"}}}"#,
        Some(r#"{"reg.io":{"username":"plugin","password":"p"}}"#),
    );
    let secret = |json: &str| {
        PullSecret::new("ns", "regcred", DOCKER_CONFIG_JSON_TYPE).with_data(DOCKER_CONFIG_JSON_KEY, json.to_string())
    };
    let good = [secret(r#"{"auths":{"reg.io":{"username":"pod","password":"s"}}}"#)];
    let auths = lookup_credentials(&good, Some(&n.node), "reg.io/app:1").await.expect("lookup");
    let got: Vec<(&str, &str)> = auths.iter().map(|a| (a.username.as_str(), a.server_address.as_str())).collect();
    assert_eq!(got, [("pod", "reg.io"), ("file", "reg.io"), ("plugin", "reg.io")]);
    assert_eq!(n.runs(), 1);

    let bad = [secret("{broken")];
    let err = lookup_credentials(&bad, Some(&n.node), "reg.io/app:1").await.expect_err("bad secret");
    assert!(err.to_string().contains("ns/regcred"), "{err}");
    assert_eq!(n.runs(), 1, "no plugin run for a request that fails on its secrets");

    assert!(lookup_credentials(&[], None, "reg.io/app").await.expect("anonymous").is_empty());
    assert!(lookup_credentials(&[], Some(&NodeCredentials::none()), "Bad:Image").await.expect("no sources").is_empty());
}

#[test]
fn settings_without_plugins_need_no_files_on_disk() {
    let s = NodeCredentialSettings { search: DockerConfigSearch::none(), ..NodeCredentialSettings::default() };
    assert!(NodeCredentials::from_settings(&s).expect("nothing to register").is_empty());
    let bin_only = NodeCredentialSettings { provider_bin_dir: Some(Path::new("/nonexistent").into()), ..s.clone() };
    assert_eq!(
        NodeCredentials::from_settings(&bin_only).expect_err("no bin dir").to_string(),
        "plugin binary directory /nonexistent did not exist"
    );
    let tmp = tempfile::tempdir().expect("tempdir");
    let config_empty = NodeCredentialSettings { provider_bin_dir: Some(tmp.path().into()), ..s };
    assert_eq!(
        NodeCredentials::from_settings(&config_empty).expect_err("no config").to_string(),
        "credential provider config path is empty"
    );
}
