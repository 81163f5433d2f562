//! Secrets stay secret: failing authenticated pulls against the embedded
//! runtime's credential-requiring remote, with a wrong password from a pod
//! secret, from the node's `config.json`, from a credential-provider
//! plugin, and from a plugin in service-account token mode (KEP-4412) that
//! gets the pod's token and hands it back as the password. Every log line (all levels, all threads), every event, every
//! error text, the metrics scrape and the `Debug` output of the request,
//! the credentials and the manager are captured; no password and no base64 `auth` string may
//! appear in any of them.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::pedantic)] // test code: a failed unwrap is a failed test

mod support;

use std::os::unix::fs::PermissionsExt as _;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use base64::Engine as _;
use imaged::actors::backoff_registry::BackoffSettings;
use imaged::actors::pull_queue::{Concurrency, PullQueueSettings};
use imaged::credentials::{
    CredentialProviders, DockerConfigSearch, NodeConfigFiles, NodeCredentials, PullSecret, lookup_credentials,
};
use imaged::domain::ImageErrorKind;
use imaged::domain::pull_policy::PullPolicy;
use imaged::embedded::RemoteImage;
use imaged::ensure::*;
use imaged::testing::{EventLog, LogLines, TakeEvents, start_manager};
use support::fixture::runtime;

const PRIVATE: &str = "registry.example.com/team/app:v1";
const SECRET_PW: &str = "pw-from-secret-7Qz";
const FILE_PW: &str = "pw-from-file-K3v";
const PLUGIN_PW: &str = "pw-from-plugin-Xe9";
/// The pod's service-account token (a token plugin gets it and returns it as the password).
const SA_TOKEN: &str = "eyJhbGciOiJSUzI1NiJ9.sa-token-Wq8";

fn b64(s: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}

/// The texts that must never show: each password and its `auth` strings
/// (padded and unpadded).
fn forbidden() -> Vec<String> {
    let mut out = Vec::new();
    for pw in [SECRET_PW, FILE_PW, PLUGIN_PW, SA_TOKEN] {
        out.push(pw.to_string());
        let auth = b64(&format!("team:{pw}"));
        out.push(auth.trim_end_matches('=').to_string());
        out.push(auth);
    }
    out
}

#[actix::test]
async fn no_password_or_auth_string_in_logs_events_errors_or_debug() {
    let logs = LogLines::default();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer(logs.clone())
        .finish();
    tracing::subscriber::set_global_default(subscriber).expect("the only subscriber of this test binary");

    // Node credentials: config.json with a wrong `auth`, a plugin with a wrong password.
    let dir = tempfile::tempdir().expect("tempdir");
    let config = format!(r#"{{"auths":{{"registry.example.com":{{"auth":"{}"}}}}}}"#, b64(&format!("team:{FILE_PW}")));
    std::fs::write(dir.path().join("config.json"), config).expect("write");
    let files = NodeConfigFiles::new(
        DockerConfigSearch { config_json_dirs: vec![dir.path().to_path_buf()], dockercfg_dirs: vec![] },
        Duration::from_secs(300),
    );
    let bin = dir.path().join("bin");
    std::fs::create_dir_all(&bin).expect("mkdir");
    let script = format!(
        "#!/bin/sh\ncat >/dev/null\ncat <<'EOF'\n{{\"apiVersion\":\"credentialprovider.kubelet.k8s.io/v1\",\"kind\":\"CredentialProviderResponse\",\"cacheKeyType\":\"Image\",\"auth\":{{\"registry.example.com\":{{\"username\":\"team\",\"password\":\"{PLUGIN_PW}\"}}}}}}\nEOF\n"
    );
    std::fs::write(bin.join("leaky"), script).expect("write");
    std::fs::set_permissions(bin.join("leaky"), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    // A token plugin: the token from its stdin back as the password (cacheType Token allows it).
    let token_script = "#!/bin/sh\ntok=$(sed -n 's/.*\"serviceAccountToken\":\"\\([^\"]*\\)\".*/\\1/p')\necho \"stderr may hold $tok\" >&2\nprintf '{\"apiVersion\":\"credentialprovider.kubelet.k8s.io/v1\",\"kind\":\"CredentialProviderResponse\",\"cacheKeyType\":\"Image\",\"auth\":{\"registry.example.com\":{\"username\":\"team\",\"password\":\"%s\"}}}' \"$tok\"\n";
    std::fs::write(bin.join("tokenized"), token_script).expect("write");
    std::fs::set_permissions(bin.join("tokenized"), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let conf = dir.path().join("providers.yaml");
    std::fs::write(
        &conf,
        "apiVersion: kubelet.config.k8s.io/v1\nkind: CredentialProviderConfig\nproviders:\n  - name: leaky\n    matchImages: [\"registry.example.com\"]\n    defaultCacheDuration: 0s\n    apiVersion: credentialprovider.kubelet.k8s.io/v1\n  - name: tokenized\n    matchImages: [\"registry.example.com\"]\n    defaultCacheDuration: 0s\n    apiVersion: credentialprovider.kubelet.k8s.io/v1\n    tokenAttributes:\n      serviceAccountTokenAudience: registry.example.com\n      cacheType: Token\n      requireServiceAccount: true\n",
    )
    .expect("write");
    let metrics = imaged::metrics::Metrics::default();
    let plugins =
        CredentialProviders::register(&conf, &bin, Duration::from_secs(60), imaged::clock::Clock::new(), &metrics)
            .expect("registers");
    let node = Arc::new(NodeCredentials::new(Some(files), plugins));

    let rt = runtime().await;
    rt.runtime.add_remote(RemoteImage::new(PRIVATE, 10).private("team", "the-right-one")).expect("add");
    let pull = PullQueueSettings {
        concurrency: Concurrency::Parallel(None),
        qps: 0.0,
        metrics: metrics.clone(),
        ..PullQueueSettings::default()
    };
    let backoff = BackoffSettings { metrics: metrics.clone(), ..BackoffSettings::default() };
    let manager = start_manager(&rt.gateway, &pull, &backoff, EnsureSettings::default())
        .await
        .expect("manager starts")
        .manager
        .with_node_credentials(node.clone());
    let events = EventLog::default().start();
    manager.events().subscribe(events.clone().recipient());

    // A pod secret whose `auth` carries the wrong password.
    let secret_config =
        format!(r#"{{"auths":{{"registry.example.com":{{"auth":"{}"}}}}}}"#, b64(&format!("team:{SECRET_PW}")));
    let mut req = EnsureImageRequest::new("u1", PRIVATE, PullPolicy::Always);
    req.pod.namespace = "default".into();
    req.pod.name = "leak-test".into();
    req.pull_secrets = vec![
        PullSecret::new("default", "regcred", "kubernetes.io/dockerconfigjson")
            .with_data(".dockerconfigjson", secret_config),
    ];
    let mut sa = imaged::credentials::PodServiceAccount::named("builder");
    sa.uid = "uid-builder".into();
    sa.tokens.insert("registry.example.com".into(), imaged::domain::Secret::new(SA_TOKEN));
    req.pod.service_account = Some(sa);

    let mut texts = Vec::new();
    let err = manager.ensure_image_exists(&req).await.expect_err("every password is wrong");
    assert_eq!(err.kind, ImageErrorKind::ErrImagePull);
    assert!(err.message.contains("401 Unauthorized"), "{}", err.message);
    texts.push(format!("{err} {err:?} {err:#?}"));
    // Once more: now in back-off, with the stored previous error.
    let err = manager.ensure_image_exists(&req).await.expect_err("back-off");
    assert_eq!(err.kind, ImageErrorKind::ImagePullBackOff);
    texts.push(format!("{err} {err:?}"));

    let creds = lookup_credentials(&req.pull_secrets, Some(&node), &req.image).await.expect("lookup");
    assert_eq!(creds.len(), 3, "secret, file and plugin credentials (the token plugin needs a pod)");
    assert!(creds.iter().map(|c| c.password.expose()).eq([SECRET_PW, FILE_PW, PLUGIN_PW]));
    texts.push(format!("{creds:?} {creds:#?}"));
    let pod = imaged::credentials::PluginPod {
        namespace: "default".into(),
        name: "leak-test".into(),
        uid: "u1".into(),
        service_account: req.pod.service_account.clone(),
    };
    let with_token = node.lookup_for("registry.example.com/team/app", &pod).await;
    assert!(
        with_token.iter().any(|c| c.password.expose() == SA_TOKEN && c.service_account.is_some()),
        "the token plugin ran with the pod's token"
    );
    texts.push(format!("{with_token:?} {pod:?}"));
    texts.push(format!("{req:?} {req:#?}"));
    texts.push(format!("{manager:?} {node:?}"));

    let got = events.send(TakeEvents).await.expect("events");
    assert!(got.iter().any(|e| e.message.contains("401 Unauthorized")), "{got:?}");
    texts.extend(got.iter().map(|e| format!("{} {e:?}", e.message)));

    // Let other threads' log lines land.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let log = logs.text();
    assert!(log.contains("registry.example.com"), "logs were captured:\n{log}");
    texts.push(log);
    let scraped = metrics.encode();
    assert!(scraped.contains("imaged_credential_provider_plugin_duration"), "metrics were captured:\n{scraped}");
    texts.push(scraped);

    for text in &texts {
        for bad in forbidden() {
            assert!(!text.contains(&bad), "{bad:?} leaked in:\n{text}");
        }
    }
}
