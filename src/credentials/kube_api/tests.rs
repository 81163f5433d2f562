//! The API client against a stand-in API server on loopback (axum, plain
//! HTTP): service accounts read, tokens minted through TokenRequest and
//! cached, errors without tokens, kubeconfigs it refuses.

use std::sync::atomic::{AtomicUsize, Ordering};

use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post};

use super::*;

#[derive(Default)]
struct ApiServer {
    minted: AtomicUsize,
    reads: AtomicUsize,
    bodies: Mutex<Vec<serde_json::Value>>,
    auth: Mutex<Vec<String>>,
}

async fn read_sa(
    State(s): State<Arc<ApiServer>>,
    UrlPath((ns, name)): UrlPath<(String, String)>,
) -> (StatusCode, String) {
    s.reads.fetch_add(1, Ordering::SeqCst);
    if name == "missing" {
        let body = serde_json::json!({"kind": "Status", "message": format!("serviceaccounts \"{name}\" not found")});
        return (StatusCode::NOT_FOUND, body.to_string());
    }
    let body = serde_json::json!({
        "kind": "ServiceAccount",
        "metadata": {"name": name, "namespace": ns, "uid": format!("uid-{name}"), "annotations": {"example.com/role": "puller"}},
    });
    (StatusCode::OK, body.to_string())
}

async fn mint(
    State(s): State<Arc<ApiServer>>,
    headers: HeaderMap,
    UrlPath((_ns, name)): UrlPath<(String, String)>,
    body: String,
) -> (StatusCode, String) {
    let auth = headers.get("authorization").and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
    s.auth.lock().unwrap().push(auth);
    let json: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
    s.bodies.lock().unwrap().push(json.clone());
    if name == "forbidden" {
        let body = serde_json::json!({"kind": "Status", "message": "node may not create tokens for this pod"});
        return (StatusCode::FORBIDDEN, body.to_string());
    }
    let n = s.minted.fetch_add(1, Ordering::SeqCst);
    let pod = json["spec"]["boundObjectRef"]["uid"].as_str().unwrap_or_default();
    // "brief" accounts get tokens that expire within two seconds.
    let lifetime = if name == "brief" { Duration::from_secs(2) } else { Duration::from_secs(3600) };
    let exp = humantime::format_rfc3339_seconds(SystemTime::now() + lifetime);
    let body = serde_json::json!({
        "kind": "TokenRequest",
        "status": {"token": format!("minted-{pod}-{n}"), "expirationTimestamp": exp.to_string()},
    });
    (StatusCode::CREATED, body.to_string())
}

async fn stand_in() -> (Arc<ApiServer>, String) {
    let server = Arc::new(ApiServer::default());
    let app = axum::Router::new()
        .route("/api/v1/namespaces/{ns}/serviceaccounts/{name}", get(read_sa))
        .route("/api/v1/namespaces/{ns}/serviceaccounts/{name}/token", post(mint))
        .with_state(server.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (server, format!("http://{addr}"))
}

fn kubeconfig(dir: &Path, server: &str, user: &str) -> PathBuf {
    let text = format!(
        "apiVersion: v1\nkind: Config\ncurrent-context: node\nclusters:\n- name: c\n  cluster:\n    server: {server}\ncontexts:\n- name: node\n  context:\n    cluster: c\n    user: u\nusers:\n- name: u\n  user:\n{user}"
    );
    let path = dir.join("kubeconfig");
    std::fs::write(&path, text).unwrap();
    path
}

fn request(pod_uid: &str, sa: &str) -> TokenRequest {
    TokenRequest {
        namespace: "team".into(),
        service_account: sa.into(),
        service_account_uid: format!("uid-{sa}"),
        pod_name: format!("pod-{pod_uid}"),
        pod_uid: pod_uid.into(),
        audience: "registry.example".into(),
    }
}

#[tokio::test]
async fn service_accounts_are_read_and_tokens_minted_bound_to_the_pod_and_cached() {
    let (server, url) = stand_in().await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("token"), "node-credential\n").unwrap();
    let api = KubeApi::from_kubeconfig(&kubeconfig(dir.path(), &url, "    tokenFile: token\n")).expect("loads");
    let info = api.service_account("team", "builder").await.expect("read");
    assert_eq!(info.uid, "uid-builder");
    assert_eq!(info.annotations.get("example.com/role").map(String::as_str), Some("puller"));
    api.service_account("team", "builder").await.expect("cached");
    assert_eq!(server.reads.load(Ordering::SeqCst), 1, "read once within a minute");

    let t1 = api.token(&request("p1", "builder")).await.expect("minted");
    assert_eq!(t1.expose(), "minted-p1-0");
    assert_eq!(api.token(&request("p1", "builder")).await.expect("cached").expose(), "minted-p1-0");
    assert_eq!(api.token(&request("p2", "builder")).await.expect("another pod").expose(), "minted-p2-1");
    assert_eq!(server.minted.load(Ordering::SeqCst), 2);
    // The kubelet's TokenRequest: the audience, the pod as bound object, the account's uid.
    assert_eq!(
        server.bodies.lock().unwrap()[0],
        serde_json::json!({
            "kind": "TokenRequest",
            "apiVersion": "authentication.k8s.io/v1",
            "metadata": {"uid": "uid-builder"},
            "spec": {"audiences": ["registry.example"], "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": "pod-p1", "uid": "p1"}},
        })
    );
    assert_eq!(server.auth.lock().unwrap()[0], "Bearer node-credential", "tokenFile, trimmed");
}

#[tokio::test]
async fn tokens_past_their_refresh_time_leave_the_cache_as_new_ones_come() {
    let (server, url) = stand_in().await;
    let dir = tempfile::tempdir().unwrap();
    let api = KubeApi::from_kubeconfig(&kubeconfig(dir.path(), &url, "    token: node-credential\n")).expect("loads");
    for pod in ["gone-1", "gone-2", "gone-3"] {
        api.token(&request(pod, "brief")).await.expect("minted");
    }
    assert_eq!(api.tokens.lock().unwrap().len(), 3);
    // Their refresh time (80% of at most two seconds) passes.
    tokio::time::sleep(Duration::from_millis(1700)).await;
    api.token(&request("live", "builder")).await.expect("minted");
    let cached: Vec<String> = api.tokens.lock().unwrap().keys().map(|r| r.pod_uid.clone()).collect();
    assert_eq!(cached, ["live"], "only the live pod's token is kept");
    assert_eq!(server.minted.load(Ordering::SeqCst), 4);
}

#[tokio::test]
async fn api_errors_name_the_status_and_message_never_a_token() {
    let (_server, url) = stand_in().await;
    let dir = tempfile::tempdir().unwrap();
    let api = KubeApi::from_kubeconfig(&kubeconfig(dir.path(), &url, "    token: hunter2-node\n")).expect("loads");
    let e = api.token(&request("p1", "forbidden")).await.expect_err("refused").to_string();
    assert_eq!(e, "TokenRequest: the API server answered 403 Forbidden: node may not create tokens for this pod");
    let e = api.service_account("team", "missing").await.expect_err("absent").to_string();
    assert!(e.contains("404 Not Found") && e.contains("\"missing\" not found"), "{e}");
    let e = api.service_account("team", "../etc").await.expect_err("not a name").to_string();
    assert!(e.contains("not a valid name"), "{e}");
    assert!(!format!("{e} {api:?}").contains("hunter2"));
    // Nothing listens: an error in bounded time.
    let down = KubeApi::from_kubeconfig(&kubeconfig(dir.path(), "http://127.0.0.1:9", "    token: t\n")).unwrap();
    assert!(down.token(&request("p1", "builder")).await.expect_err("down").to_string().contains("cannot connect"));
}

#[test]
fn kubeconfigs_it_cannot_use_are_refused_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        ("http://127.0.0.1:1", "    exec:\n      command: aws\n", "exec or auth-provider plugin"),
        ("https://127.0.0.1:1", "    token: t\n", "needs certificate-authority"),
        ("ftp://x", "    token: t\n", "must be an http:// or https:// URL"),
        ("http://127.0.0.1:1", "    client-key-data: eA==\n", "needs its key, and a key its certificate"),
    ];
    for (server, user, want) in cases {
        let e = KubeApi::from_kubeconfig(&kubeconfig(dir.path(), server, user)).expect_err(want).to_string();
        assert!(e.starts_with("kubeconfig ") && e.contains(want), "{e}");
    }
    let e = KubeApi::from_kubeconfig(&dir.path().join("absent")).expect_err("absent").to_string();
    assert!(e.contains("absent"), "{e}");
}

/// `openssl` run in `dir`; false when it is missing or fails.
fn openssl(dir: &Path, args: &[&str]) -> bool {
    std::process::Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// A CA, a server certificate for 127.0.0.1 and a client certificate.
fn certificates(dir: &Path) -> bool {
    std::fs::write(dir.join("san.cnf"), "subjectAltName=IP:127.0.0.1\n").unwrap();
    // Extensions make the certificates X.509 v3, which webpki requires.
    std::fs::write(dir.join("client.cnf"), "extendedKeyUsage=clientAuth\n").unwrap();
    let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"];
    openssl(
        dir,
        &[&["req", "-x509"][..], &ec, &["-keyout", "ca.key", "-out", "ca.crt", "-days", "1", "-subj", "/CN=test-ca"]]
            .concat(),
    ) && openssl(
        dir,
        &[&["req"][..], &ec, &["-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1"]].concat(),
    ) && openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.crt",
            "-days",
            "1",
            "-extfile",
            "san.cnf",
        ],
    ) && openssl(
        dir,
        &[
            &["req"][..],
            &ec,
            &["-keyout", "client.key", "-out", "client.csr", "-subj", "/CN=system:node:test/O=system:nodes"],
        ]
        .concat(),
    ) && openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "client.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "client.crt",
            "-days",
            "1",
            "-extfile",
            "client.cnf",
        ],
    )
}

/// An HTTPS stand-in that demands a client certificate signed by the CA and
/// answers every request with a minted token; returns the URL and how many
/// requests it served.
async fn tls_stand_in(dir: &Path) -> (String, Arc<AtomicUsize>) {
    use rustls_pki_types::pem::PemObject as _;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    use tokio_rustls::rustls;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    roots.add(CertificateDer::from_pem_file(dir.join("ca.crt")).unwrap()).unwrap();
    let verifier =
        rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone()).build().unwrap();
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_client_cert_verifier(verifier)
        .with_single_cert(
            vec![CertificateDer::from_pem_file(dir.join("server.crt")).unwrap()],
            PrivateKeyDer::from_pem_file(dir.join("server.key")).unwrap(),
        )
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("https://{}", listener.local_addr().unwrap());
    let served = Arc::new(AtomicUsize::new(0));
    let count = served.clone();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let Ok(mut tls) = acceptor.accept(tcp).await else { continue };
            let mut buf = vec![0u8; 16 * 1024];
            let mut got = 0;
            // Read the head and its body (Content-Length).
            while let Ok(n) = tls.read(&mut buf[got..]).await {
                got += n;
                let text = String::from_utf8_lossy(&buf[..got]).to_string();
                let complete = text.find("\r\n\r\n").is_some_and(|head_end| {
                    let len = text
                        .lines()
                        .find_map(|l| {
                            l.to_ascii_lowercase()
                                .strip_prefix("content-length:")
                                .map(|v| v.trim().parse::<usize>().unwrap_or(0))
                        })
                        .unwrap_or(0);
                    got >= head_end + 4 + len
                });
                if complete || n == 0 {
                    break;
                }
            }
            count.fetch_add(1, Ordering::SeqCst);
            let body = r#"{"status":{"token":"minted-over-tls"}}"#;
            let resp = format!(
                "HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = tls.write_all(resp.as_bytes()).await;
            let _ = tls.shutdown().await;
        }
    });
    (url, served)
}

#[tokio::test]
async fn tokens_are_minted_over_tls_with_the_kubeconfigs_client_certificate() {
    let dir = tempfile::tempdir().unwrap();
    if !certificates(dir.path()) {
        // openssl is part of the machine set-up (.ci); without it there is nothing to test with.
        assert!(std::env::var("CI").is_err(), "openssl is needed to make the test certificates");
        return;
    }
    let (url, served) = tls_stand_in(dir.path()).await;
    let user = "    client-certificate: client.crt\n    client-key: client.key\n";
    let config = kubeconfig(dir.path(), &url, user).display().to_string();
    let text = std::fs::read_to_string(&config)
        .unwrap()
        .replace(&format!("    server: {url}\n"), &format!("    server: {url}\n    certificate-authority: ca.crt\n"));
    std::fs::write(&config, text).unwrap();
    let api = KubeApi::from_kubeconfig(Path::new(&config)).expect("loads");
    let token = api.token(&request("p1", "builder")).await.expect("minted over TLS");
    assert_eq!(token.expose(), "minted-over-tls");
    assert_eq!(served.load(Ordering::SeqCst), 1);
    // Without the client certificate the server refuses the handshake.
    let anonymous = kubeconfig(dir.path(), &url, "    token: t\n").display().to_string();
    let text = std::fs::read_to_string(&anonymous)
        .unwrap()
        .replace(&format!("    server: {url}\n"), &format!("    server: {url}\n    certificate-authority: ca.crt\n"));
    std::fs::write(&anonymous, text).unwrap();
    let e = KubeApi::from_kubeconfig(Path::new(&anonymous)).unwrap().token(&request("p2", "builder")).await;
    assert!(e.is_err(), "{e:?}");
    // A CA that did not sign the server: refused.
    assert!(openssl(
        dir.path(),
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            "other.key",
            "-out",
            "ca.crt",
            "-days",
            "1",
            "-subj",
            "/CN=other"
        ]
    ));
    let e = KubeApi::from_kubeconfig(Path::new(&config)).unwrap().token(&request("p3", "builder")).await;
    assert!(e.expect_err("untrusted server").to_string().contains("TLS with"), "names the TLS failure");
}
