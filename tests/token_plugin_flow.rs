//! KEP-4412 through the daemon's API: a credential plugin with
//! `tokenAttributes`, imaged configured with a kubeconfig of a stand-in API
//! server on loopback. An ensure names only the pod's service account; the
//! daemon reads the account, mints a token bound to the pod (TokenRequest),
//! the plugin exchanges it for registry credentials, and the pull record
//! keeps the account: another pod of it uses the image without a pull, a
//! pod of another account does not.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::pedantic)] // test code: a failed unwrap is a failed test

mod support;

use std::os::unix::fs::PermissionsExt as _;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use axum::extract::{Path as UrlPath, State};
use axum::routing::{get, post};
use imaged::api::proto;
use imaged::config::{Config, RuntimeEndpoint};
use imaged::embedded::RemoteImage;
use imaged::node::Node;

const PRIVATE: &str = "registry.example.com/team/app:v1";

#[derive(Default)]
struct ApiServer {
    minted: AtomicUsize,
    bound_to: Mutex<Vec<String>>,
}

async fn read_sa(UrlPath((_ns, name)): UrlPath<(String, String)>) -> String {
    serde_json::json!({"kind": "ServiceAccount", "metadata": {"name": name, "uid": format!("uid-{name}")}}).to_string()
}

async fn mint(State(s): State<Arc<ApiServer>>, UrlPath((_ns, sa)): UrlPath<(String, String)>, body: String) -> String {
    let json: serde_json::Value = serde_json::from_str(&body).unwrap();
    s.bound_to.lock().unwrap().push(json["spec"]["boundObjectRef"]["name"].as_str().unwrap().to_string());
    let n = s.minted.fetch_add(1, Ordering::SeqCst);
    let exp = humantime::format_rfc3339_seconds(SystemTime::now() + Duration::from_secs(3600));
    serde_json::json!({"status": {"token": format!("minted-{sa}-{n}"), "expirationTimestamp": exp.to_string()}})
        .to_string()
}

fn ensure(uid: &str, sa: Option<&str>, policy: &str) -> proto::EnsureImageRequest {
    proto::EnsureImageRequest {
        pod: Some(proto::Pod {
            uid: uid.into(),
            namespace: "team".into(),
            name: format!("pod-{uid}"),
            service_account: sa.map(|name| proto::ServiceAccount { name: name.into(), ..Default::default() }),
            ..Default::default()
        }),
        image: PRIVATE.into(),
        pull_policy: policy.into(),
        ..Default::default()
    }
}

fn outcome(r: proto::EnsureImageResponse) -> Result<String, (String, String)> {
    match r.result.expect("a result") {
        proto::ensure_image_response::Result::Ok(ok) => Ok(ok.message),
        proto::ensure_image_response::Result::Failure(f) => Err((f.kind, f.message)),
    }
}

#[actix::test]
async fn a_token_plugin_pulls_for_a_service_account_and_its_pods_reuse_the_image() {
    // The stand-in API server.
    let api = Arc::new(ApiServer::default());
    let app = axum::Router::new()
        .route("/api/v1/namespaces/{ns}/serviceaccounts/{name}", get(read_sa))
        .route("/api/v1/namespaces/{ns}/serviceaccounts/{name}/token", post(mint))
        .with_state(api.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });

    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: node\nclusters:\n- name: c\n  cluster:\n    server: http://{addr}\ncontexts:\n- name: node\n  context: {{cluster: c, user: node}}\nusers:\n- name: node\n  user: {{token: node-credential}}\n"
        ),
    )
    .unwrap();
    // The plugin: registry credentials for a minted token, nothing otherwise.
    let bin = dir.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::write(
        bin.join("exchange"),
        "#!/bin/sh\nif grep -q '\"serviceAccountToken\":\"minted-'; then auth='\"registry.example.com\":{\"username\":\"team\",\"password\":\"team-password\"}'; else auth=''; fi\nprintf '{\"apiVersion\":\"credentialprovider.kubelet.k8s.io/v1\",\"kind\":\"CredentialProviderResponse\",\"cacheKeyType\":\"Image\",\"auth\":{%s}}' \"$auth\"\n",
    )
    .unwrap();
    std::fs::set_permissions(bin.join("exchange"), std::fs::Permissions::from_mode(0o755)).unwrap();
    let providers = dir.path().join("providers.yaml");
    std::fs::write(
        &providers,
        "apiVersion: kubelet.config.k8s.io/v1\nkind: CredentialProviderConfig\nproviders:\n  - name: exchange\n    matchImages: [\"registry.example.com\"]\n    defaultCacheDuration: 5m\n    apiVersion: credentialprovider.kubelet.k8s.io/v1\n    tokenAttributes:\n      serviceAccountTokenAudience: registry.example.com\n      cacheType: ServiceAccount\n      requireServiceAccount: true\n",
    )
    .unwrap();
    let toml = format!(
        "[state]\ndir = \"memory\"\n[credentials]\nconfig_json_dirs = []\ndockercfg_dirs = []\nprovider_config = \"{}\"\nprovider_bin_dir = \"{}\"\nkubeconfig = \"{}\"\n",
        providers.display(),
        bin.display(),
        kubeconfig.display()
    );
    let mut cfg = Config::from_toml(&toml).expect("config");
    cfg.endpoint = RuntimeEndpoint::Embedded { socket: Some(dir.path().join("runtime.sock")) };
    let node = Arc::new(Node::start(cfg).await.expect("node starts"));
    let embedded = node.runtime().embedded.as_ref().expect("embedded");
    embedded.add_remote(RemoteImage::new(PRIVATE, 1_000).private("team", "team-password")).expect("add");
    let socket = dir.path().join("api.sock");
    let _api = support::api::serve_api(&node, &socket).await;
    let mut c = imaged::api::client(&socket).expect("client");

    // Pod A of service account "builder": pulled with the exchanged credentials.
    let a = outcome(c.ensure_image(ensure("a", Some("builder"), "IfNotPresent")).await.unwrap().into_inner());
    assert_eq!(a, Ok(String::new()), "pulled");
    assert_eq!(api.bound_to.lock().unwrap().as_slice(), ["pod-a"], "a token bound to pod A");
    let id =
        node.list_images().await.unwrap().into_iter().find(|i| i.repo_tags.iter().any(|t| t == PRIVATE)).unwrap().id;
    let record = node.manager().pull_records().record(&id).expect("a pulled record");
    let mapping = &record.credential_mapping["registry.example.com/team/app"];
    assert_eq!(
        mapping.kubernetes_service_accounts,
        [imaged::domain::pull_record::ImagePullServiceAccount {
            uid: "uid-builder".into(),
            namespace: "team".into(),
            name: "builder".into()
        }]
    );
    assert!(!mapping.node_pods_accessible && mapping.kubernetes_secrets.is_empty());
    assert!(!format!("{record:?}").contains("minted-"), "no token in the record");

    // Pod B of the same account: uses the image, no pull.
    let b = outcome(c.ensure_image(ensure("b", Some("builder"), "Never")).await.unwrap().into_inner());
    assert_eq!(
        b,
        Ok(format!("Container image \"{PRIVATE}\" already present on machine and can be accessed by the pod"))
    );
    // Pod C of another account: the record does not name it.
    let c_ = outcome(c.ensure_image(ensure("c", Some("deployer"), "Never")).await.unwrap().into_inner());
    assert_eq!(
        c_,
        Err((
            "ErrImageNeverPull".into(),
            format!("Container image \"{PRIVATE}\" is not present with pull policy of Never")
        ))
    );
    // A pod without an account: the plugin requires one, so no credentials; the registry refuses.
    let d = outcome(c.ensure_image(ensure("d", None, "Always")).await.unwrap().into_inner());
    assert!(matches!(&d, Err((kind, m)) if kind == "ErrImagePull" && m.contains("401 Unauthorized")), "{d:?}");
    assert_eq!(embedded.stats().calls(imaged::cri::Rpc::PullImage), 2, "pod A's pull and pod D's refused one");
}

/// An embedder's token source (it holds the pod and can mint bound tokens).
#[derive(Debug, Default)]
struct AgentTokens(AtomicUsize);

impl imaged::credentials::ServiceAccountTokenSource for AgentTokens {
    fn service_account<'a>(
        &'a self,
        _namespace: &'a str,
        name: &'a str,
    ) -> futures_util::future::BoxFuture<
        'a,
        Result<imaged::credentials::ServiceAccountInfo, imaged::credentials::TokenSourceError>,
    > {
        let info = imaged::credentials::ServiceAccountInfo { uid: format!("agent-uid-{name}"), ..Default::default() };
        Box::pin(async move { Ok(info) })
    }

    fn token<'a>(
        &'a self,
        request: &'a imaged::credentials::TokenRequest,
    ) -> futures_util::future::BoxFuture<'a, Result<imaged::domain::Secret, imaged::credentials::TokenSourceError>>
    {
        self.0.fetch_add(1, Ordering::SeqCst);
        Box::pin(async move { Ok(imaged::domain::Secret::new(format!("minted-by-agent-{}", request.pod_uid))) })
    }
}

#[actix::test]
async fn an_embedder_gives_node_start_its_own_token_source() {
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::write(
        bin.join("exchange"),
        "#!/bin/sh\nif grep -q '\"serviceAccountToken\":\"minted-'; then auth='\"registry.example.com\":{\"username\":\"team\",\"password\":\"team-password\"}'; else auth=''; fi\nprintf '{\"apiVersion\":\"credentialprovider.kubelet.k8s.io/v1\",\"kind\":\"CredentialProviderResponse\",\"cacheKeyType\":\"Image\",\"auth\":{%s}}' \"$auth\"\n",
    )
    .unwrap();
    std::fs::set_permissions(bin.join("exchange"), std::fs::Permissions::from_mode(0o755)).unwrap();
    let providers = dir.path().join("providers.yaml");
    std::fs::write(
        &providers,
        "apiVersion: kubelet.config.k8s.io/v1\nkind: CredentialProviderConfig\nproviders:\n  - name: exchange\n    matchImages: [\"registry.example.com\"]\n    defaultCacheDuration: 5m\n    apiVersion: credentialprovider.kubelet.k8s.io/v1\n    tokenAttributes:\n      serviceAccountTokenAudience: registry.example.com\n      cacheType: Token\n      requireServiceAccount: true\n",
    )
    .unwrap();
    let toml = format!(
        "[state]\ndir = \"memory\"\n[credentials]\nconfig_json_dirs = []\ndockercfg_dirs = []\nprovider_config = \"{}\"\nprovider_bin_dir = \"{}\"\n",
        providers.display(),
        bin.display()
    );
    let tokens = Arc::new(AgentTokens::default());
    let mut cfg = Config::from_toml(&toml).expect("config").with_token_source(tokens.clone());
    cfg.endpoint = RuntimeEndpoint::Embedded { socket: Some(dir.path().join("runtime.sock")) };
    let node = Node::start(cfg).await.expect("node starts");
    let embedded = node.runtime().embedded.as_ref().expect("embedded");
    embedded.add_remote(RemoteImage::new(PRIVATE, 1_000).private("team", "team-password")).expect("add");
    let mut req =
        imaged::ensure::EnsureImageRequest::new("a", PRIVATE, imaged::domain::pull_policy::PullPolicy::IfNotPresent);
    req.pod.namespace = "team".into();
    req.pod.service_account = Some(imaged::credentials::PodServiceAccount::named("builder"));
    node.ensure_image_exists(&req).await.expect("no node error").expect("pulled with the agent's token");
    assert_eq!(tokens.0.load(Ordering::SeqCst), 1);
}
