//! `EnsureImageExists` against the embedded runtime's credential-requiring
//! remote, with node credentials: a node `config.json` alone, or an exec
//! credential-provider plugin alone, supplies the right password; pod
//! secrets come first; no anonymous fallback once credentials matched.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::pedantic)] // test code: a failed unwrap is a failed test

mod support;

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use imaged::actors::backoff_registry::BackoffSettings;
use imaged::actors::pull_queue::{Concurrency, PullQueueSettings};
use imaged::credentials::{CredentialProviders, DockerConfigSearch, NodeConfigFiles, NodeCredentials, PullSecret};
use imaged::cri::Rpc;
use imaged::domain::ImageErrorKind;
use imaged::domain::pull_policy::PullPolicy;
use imaged::embedded::RemoteImage;
use imaged::ensure::*;
use imaged::testing::start_manager;
use support::fixture::{Runtime, runtime};

const PRIVATE: &str = "registry.example.com/team/app:v1";

struct Flow {
    rt: Runtime,
    manager: ImageManager,
}

async fn flow(node: NodeCredentials) -> Flow {
    let rt = runtime().await;
    rt.runtime.add_remote(RemoteImage::new(PRIVATE, 10).private("team", "s3cret")).expect("add");
    let pull = PullQueueSettings { concurrency: Concurrency::Parallel(None), qps: 0.0, ..PullQueueSettings::default() };
    let manager = start_manager(&rt.gateway, &pull, &BackoffSettings::default(), EnsureSettings::default())
        .await
        .expect("manager starts")
        .manager
        .with_node_credentials(Arc::new(node));
    Flow { rt, manager }
}

impl Flow {
    async fn ensure(&self, uid: &str, secrets: Vec<PullSecret>) -> Result<EnsureOk, EnsureError> {
        let mut r = EnsureImageRequest::new(uid, PRIVATE, PullPolicy::Always);
        r.pod.namespace = "default".into();
        r.pod.name = format!("pod-{uid}");
        r.pull_secrets = secrets;
        self.manager.ensure_image_exists(&r).await
    }

    fn pulls(&self) -> u64 {
        self.rt.runtime.stats().calls(Rpc::PullImage)
    }
}

/// Node config files: `config.json` in `dir` only.
fn files_in(dir: &Path, config: &str) -> NodeConfigFiles {
    std::fs::write(dir.join("config.json"), config).expect("write");
    let search = DockerConfigSearch { config_json_dirs: vec![dir.to_path_buf()], dockercfg_dirs: vec![] };
    NodeConfigFiles::new(search, Duration::from_secs(300))
}

/// A plugin answering `password` for registry.example.com.
fn plugin_in(dir: &Path, password: &str) -> CredentialProviders {
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).expect("mkdir");
    let script = format!(
        "#!/bin/sh\ncat >/dev/null\ncat <<'EOF'\n{{\"apiVersion\":\"credentialprovider.kubelet.k8s.io/v1\",\"kind\":\"CredentialProviderResponse\",\"cacheKeyType\":\"Registry\",\"auth\":{{\"registry.example.com\":{{\"username\":\"team\",\"password\":\"{password}\"}}}}}}\nEOF\n"
    );
    std::fs::write(bin.join("example-provider"), script).expect("write");
    std::fs::set_permissions(bin.join("example-provider"), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let conf = dir.join("providers.yaml");
    std::fs::write(
        &conf,
        "apiVersion: kubelet.config.k8s.io/v1\nkind: CredentialProviderConfig\nproviders:\n  - name: example-provider\n    matchImages: [\"*.example.com\"]\n    defaultCacheDuration: 10m\n    apiVersion: credentialprovider.kubelet.k8s.io/v1\n",
    )
    .expect("write");
    CredentialProviders::register(
        &conf,
        &bin,
        Duration::from_secs(60),
        imaged::clock::Clock::new(),
        &imaged::metrics::Metrics::default(),
    )
    .expect("registers")
}

fn secret(password: &str) -> PullSecret {
    let json = format!(r#"{{"auths":{{"registry.example.com":{{"username":"team","password":"{password}"}}}}}}"#);
    PullSecret::new("default", "regcred", "kubernetes.io/dockerconfigjson").with_data(".dockerconfigjson", json)
}

#[actix::test]
async fn only_the_node_config_file_supplies_the_credentials() {
    let dir = tempfile::tempdir().expect("tempdir");
    let files = files_in(dir.path(), r#"{"auths":{"registry.example.com":{"auth":"dGVhbTpzM2NyZXQ="}}}"#);
    let f = flow(NodeCredentials::new(Some(files), CredentialProviders::default())).await;
    f.ensure("u1", vec![]).await.expect("the node's config.json works");
    assert_eq!(f.pulls(), 1);

    // A pod secret with a wrong password is tried first, then the node's.
    f.ensure("u2", vec![secret("wrong")]).await.expect("the node's credentials after the secret's");
    assert_eq!(f.pulls(), 3);
}

#[actix::test]
async fn only_the_plugin_supplies_the_credentials() {
    let dir = tempfile::tempdir().expect("tempdir");
    let files = files_in(dir.path(), r#"{"auths":{"other.example.org":{"username":"x","password":"y"}}}"#);
    let f = flow(NodeCredentials::new(Some(files), plugin_in(dir.path(), "s3cret"))).await;
    f.ensure("u1", vec![]).await.expect("the plugin's credentials work");
    assert_eq!(f.pulls(), 1);
}

#[actix::test]
async fn wrong_node_credentials_fail_without_an_anonymous_try() {
    let dir = tempfile::tempdir().expect("tempdir");
    let files = files_in(dir.path(), r#"{"auths":{"registry.example.com":{"username":"team","password":"nope"}}}"#);
    let f = flow(NodeCredentials::new(Some(files), plugin_in(dir.path(), "also-nope"))).await;
    let e = f.ensure("u1", vec![]).await.expect_err("both wrong");
    assert_eq!(e.kind, ImageErrorKind::ErrImagePull);
    assert!(e.message.contains("401 Unauthorized"), "{}", e.message);
    assert!(!e.message.contains("nope"), "{}", e.message);
    assert_eq!(f.pulls(), 2, "the file's and the plugin's credentials, no anonymous pull");

    // A right pod secret wins before any node credential is tried.
    f.ensure("u2", vec![secret("s3cret")]).await.expect("the secret works");
    assert_eq!(f.pulls(), 3);
}

#[actix::test]
async fn no_matching_credentials_pull_anonymously() {
    let dir = tempfile::tempdir().expect("tempdir");
    let files = files_in(dir.path(), r#"{"auths":{"other.example.org":{"username":"x","password":"y"}}}"#);
    let f = flow(NodeCredentials::new(Some(files), CredentialProviders::default())).await;
    let e = f.ensure("u1", vec![]).await.expect_err("anonymous");
    assert!(e.message.contains("401 Unauthorized"), "{}", e.message);
    assert_eq!(f.pulls(), 1);
}
