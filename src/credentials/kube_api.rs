//! A minimal client of the Kubernetes API server for credential plugins in
//! service-account token mode (KEP-4412): it reads a service account (its
//! uid and annotations) and mints a token bound to a pod through the
//! TokenRequest API, as the kubelet does with its own credentials.
//!
//! Why not the `kube` crate: imaged needs two calls (a GET and a POST with
//! tiny JSON bodies); `kube` brings `k8s-openapi` (every API type, minutes
//! of compiling on a small builder) and a second HTTP stack. This is
//! HTTP/1.1 over hyper (already built for tonic) and TLS with rustls.
//!
//! The kubeconfig: `current-context`'s cluster (`server`, `certificate-
//! authority(-data)`, `tls-server-name`) and user (`client-certificate(-data)`
//! and `client-key(-data)`, as the kubelet's own kubeconfig has them, or
//! `token` / `tokenFile`). `exec` and `auth-provider` users are refused at
//! start with a clear error. Relative paths are relative to the kubeconfig.
//!
//! Tokens are [`Secret`]s: kept in a cache until 80% of their lifetime
//! (the kubelet's token manager does the same), never logged, never in an
//! error.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use futures_util::future::BoxFuture;
use http_body_util::{BodyExt as _, Full};
use hyper::body::Bytes;
use serde::Deserialize;
use tokio::time::Instant;

use super::plugin::{ServiceAccountInfo, ServiceAccountTokenSource, TokenRequest, TokenSourceError};
use crate::domain::Secret;

/// Longest wait for one API call.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a service account read is reused.
pub const SERVICE_ACCOUNT_TTL: Duration = Duration::from_secs(60);

/// Why the kubeconfig cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("kubeconfig {}: {reason}", .path.display())]
pub struct KubeconfigError {
    /// The file.
    pub path: PathBuf,
    /// What was wrong (never a credential).
    pub reason: String,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "kebab-case")]
struct RawKubeconfig {
    current_context: String,
    clusters: Vec<Named<RawCluster>>,
    contexts: Vec<Named<RawContext>>,
    users: Vec<Named<RawUser>>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Named<T: Default> {
    name: String,
    #[serde(alias = "cluster", alias = "context", alias = "user")]
    value: T,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "kebab-case")]
struct RawCluster {
    server: String,
    certificate_authority: String,
    certificate_authority_data: String,
    tls_server_name: String,
    insecure_skip_tls_verify: bool,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct RawContext {
    cluster: String,
    user: String,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct RawUser {
    token: Option<String>,
    #[serde(rename = "tokenFile")]
    token_file: String,
    #[serde(rename = "client-certificate")]
    client_certificate: String,
    #[serde(rename = "client-certificate-data")]
    client_certificate_data: String,
    #[serde(rename = "client-key")]
    client_key: String,
    #[serde(rename = "client-key-data")]
    client_key_data: String,
    exec: Option<serde_yaml_ng::Value>,
    #[serde(rename = "auth-provider")]
    auth_provider: Option<serde_yaml_ng::Value>,
}

/// How requests authenticate.
#[derive(Clone)]
enum Auth {
    None,
    Bearer(Secret),
    BearerFile(PathBuf),
    /// Client certificates are part of the TLS configuration.
    ClientCertificate,
}

/// The API server's client. See the module docs.
pub struct KubeApi {
    /// `host:port`.
    authority: String,
    /// Host name for TLS (`tls-server-name`, else the server's host).
    server_name: String,
    /// Path prefix of the server URL (without a trailing `/`).
    prefix: String,
    tls: Option<tokio_rustls::TlsConnector>,
    auth: Auth,
    tokens: Mutex<HashMap<TokenRequest, (Secret, Instant)>>,
    accounts: Mutex<HashMap<(String, String), (ServiceAccountInfo, Instant)>>,
}

impl std::fmt::Debug for KubeApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeApi").field("server", &self.authority).finish_non_exhaustive()
    }
}

fn read_file(base: &Path, file: &str) -> Result<Vec<u8>, String> {
    let p = base.join(file);
    crate::files::read(&p, crate::files::CONFIG_FILE_LIMIT).map_err(|e| format!("{}: {e}", p.display()))
}

/// PEM bytes from `file` (relative to `base`) or base64 `data`.
fn pem(base: &Path, file: &str, data: &str, what: &str) -> Result<Option<Vec<u8>>, String> {
    use base64::Engine as _;
    if !data.is_empty() {
        return base64::engine::general_purpose::STANDARD
            .decode(data.trim())
            .map(Some)
            .map_err(|e| format!("{what}-data is not base64: {e}"));
    }
    if file.is_empty() { Ok(None) } else { read_file(base, file).map(Some) }
}

impl KubeApi {
    /// The client of the kubeconfig at `path` (its current context).
    pub fn from_kubeconfig(path: &Path) -> Result<Self, KubeconfigError> {
        let fail = |reason: String| KubeconfigError { path: path.to_path_buf(), reason };
        let bytes = crate::files::read(path, crate::files::CONFIG_FILE_LIMIT).map_err(|e| fail(e.to_string()))?;
        // Positions only: a parse error could quote a token.
        let raw: RawKubeconfig = serde_yaml_ng::from_slice(&bytes).map_err(|e| {
            fail(e.location().map_or("invalid document".into(), |l| {
                format!("invalid document at line {} column {}", l.line(), l.column())
            }))
        })?;
        let base = path.parent().unwrap_or(Path::new("."));
        Self::from_raw(raw, base).map_err(fail)
    }

    fn from_raw(raw: RawKubeconfig, base: &Path) -> Result<Self, String> {
        let context = match raw.contexts.iter().find(|c| c.name == raw.current_context) {
            Some(c) => &c.value,
            None if raw.current_context.is_empty() && raw.contexts.len() == 1 => &raw.contexts[0].value,
            None => return Err(format!("current-context {:?} is not among its contexts", raw.current_context)),
        };
        let cluster =
            raw.clusters.iter().find(|c| c.name == context.cluster).map(|c| &c.value).ok_or_else(|| {
                format!("cluster {:?} of the current context is not among its clusters", context.cluster)
            })?;
        let user = raw.users.iter().find(|u| u.name == context.user).map(|u| &u.value);
        let uri: hyper::Uri =
            cluster.server.parse().map_err(|e| format!("server {:?} is not a URL: {e}", cluster.server))?;
        let https = match uri.scheme_str() {
            Some("https") => true,
            Some("http") => false,
            _ => return Err(format!("server {:?} must be an http:// or https:// URL", cluster.server)),
        };
        let host = uri.host().ok_or_else(|| format!("server {:?} has no host", cluster.server))?;
        let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
        let authority = if host.contains(':') { format!("[{host}]:{port}") } else { format!("{host}:{port}") };
        let prefix = uri.path().trim_end_matches('/').to_string();
        let server_name = if cluster.tls_server_name.is_empty() {
            host.trim_matches(['[', ']']).to_string()
        } else {
            cluster.tls_server_name.clone()
        };
        let mut auth = Auth::None;
        let mut client_cert = None;
        if let Some(u) = user {
            if u.exec.is_some() || u.auth_provider.is_some() {
                return Err(format!(
                    "user {:?} gets its credentials from an exec or auth-provider plugin, which imaged does not run; use a client certificate or a token",
                    context.user
                ));
            }
            let cert = pem(base, &u.client_certificate, &u.client_certificate_data, "client-certificate")?;
            let key = pem(base, &u.client_key, &u.client_key_data, "client-key")?;
            match (cert, key) {
                (Some(c), Some(k)) => {
                    client_cert = Some((c, k));
                    auth = Auth::ClientCertificate;
                }
                (None, None) => {}
                _ => return Err("a client certificate needs its key, and a key its certificate".into()),
            }
            if let Some(t) = u.token.as_ref().filter(|t| !t.is_empty()) {
                auth = Auth::Bearer(Secret::new(t.trim()));
            } else if !u.token_file.is_empty() {
                auth = Auth::BearerFile(base.join(&u.token_file));
            }
        }
        let tls = if https {
            if cluster.insecure_skip_tls_verify {
                return Err(
                    "insecure-skip-tls-verify is not supported: give the cluster's certificate-authority".into()
                );
            }
            let ca = pem(
                base,
                &cluster.certificate_authority,
                &cluster.certificate_authority_data,
                "certificate-authority",
            )?
            .ok_or("an https server needs certificate-authority or certificate-authority-data")?;
            Some(tls_connector(&ca, client_cert)?)
        } else {
            None
        };
        Ok(Self { authority, server_name, prefix, tls, auth, tokens: Mutex::default(), accounts: Mutex::default() })
    }

    fn bearer(&self) -> Result<Option<Secret>, String> {
        match &self.auth {
            Auth::Bearer(t) => Ok(Some(t.clone())),
            // Re-read on every call: the file is rotated (projected tokens).
            Auth::BearerFile(p) => crate::files::read_to_string(p, crate::files::CONFIG_FILE_LIMIT)
                .map(|t| Some(Secret::new(t.trim())))
                .map_err(|e| format!("tokenFile {}: {e}", p.display())),
            Auth::None | Auth::ClientCertificate => Ok(None),
        }
    }

    /// One call: `method` on `path` with an optional JSON body; the answer's
    /// JSON on 2xx, else an error naming the status and the API's message.
    async fn call(&self, method: hyper::Method, path: &str, body: Option<String>) -> Result<serde_json::Value, String> {
        let run = async {
            let tcp = tokio::net::TcpStream::connect(&self.authority)
                .await
                .map_err(|e| format!("cannot connect to {}: {e}", self.authority))?;
            let mut req = hyper::Request::builder()
                .method(method)
                .uri(format!("{}{path}", self.prefix))
                .header(hyper::header::HOST, &self.authority)
                .header(hyper::header::ACCEPT, "application/json")
                .header(hyper::header::USER_AGENT, concat!("imaged/", env!("CARGO_PKG_VERSION")));
            if body.is_some() {
                req = req.header(hyper::header::CONTENT_TYPE, "application/json");
            }
            if let Some(token) = self.bearer()? {
                req = req.header(hyper::header::AUTHORIZATION, format!("Bearer {}", token.expose()));
            }
            let req = req
                .body(Full::new(Bytes::from(body.unwrap_or_default())))
                .map_err(|e| format!("cannot build the request: {e}"))?;
            let resp = match &self.tls {
                Some(tls) => {
                    let name = rustls_pki_types::ServerName::try_from(self.server_name.clone())
                        .map_err(|e| format!("server name {:?}: {e}", self.server_name))?;
                    let stream =
                        tls.connect(name, tcp).await.map_err(|e| format!("TLS with {}: {e}", self.authority))?;
                    send(stream, req).await?
                }
                None => send(tcp, req).await?,
            };
            let status = resp.status();
            let bytes = resp.into_body().collect().await.map_err(|e| format!("reading the answer: {e}"))?.to_bytes();
            let json: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null);
            if !status.is_success() {
                let message = json.get("message").and_then(|m| m.as_str()).unwrap_or("");
                return Err(format!("the API server answered {status}: {message}"));
            }
            Ok(json)
        };
        tokio::time::timeout(CALL_TIMEOUT, run)
            .await
            .unwrap_or_else(|_| Err(format!("no answer from {} within {CALL_TIMEOUT:?}", self.authority)))
    }
}

/// One HTTP/1.1 exchange on `io`.
async fn send<S>(io: S, req: hyper::Request<Full<Bytes>>) -> Result<hyper::Response<hyper::body::Incoming>, String>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(io))
        .await
        .map_err(|e| format!("HTTP handshake: {e}"))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    sender.send_request(req).await.map_err(|e| format!("HTTP request: {e}"))
}

/// rustls with the cluster's CA and, for client-certificate users, their pair.
fn tls_connector(ca: &[u8], client: Option<(Vec<u8>, Vec<u8>)>) -> Result<tokio_rustls::TlsConnector, String> {
    use rustls_pki_types::pem::PemObject as _;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let mut roots = tokio_rustls::rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca) {
        let cert = cert.map_err(|e| format!("certificate-authority: {e}"))?;
        roots.add(cert).map_err(|e| format!("certificate-authority: {e}"))?;
    }
    if roots.is_empty() {
        return Err("certificate-authority holds no certificate".into());
    }
    let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
    let builder = tokio_rustls::rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .with_root_certificates(roots);
    let config = match client {
        Some((cert, key)) => {
            let chain = CertificateDer::pem_slice_iter(&cert)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| format!("client-certificate: {e}"))?;
            // The key's parse error names no key material.
            let key =
                PrivateKeyDer::from_pem_slice(&key).map_err(|_| "client-key is not a PEM private key".to_string())?;
            builder.with_client_auth_cert(chain, key).map_err(|e| format!("client certificate: {e}"))?
        }
        None => builder.with_no_client_auth(),
    };
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
}

/// A namespace or name as a path segment: DNS-label characters only.
fn segment(what: &str, s: &str) -> Result<(), TokenSourceError> {
    let ok = !s.is_empty() && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.');
    if ok { Ok(()) } else { Err(TokenSourceError(format!("{what} {s:?} is not a valid name"))) }
}

/// The TokenRequest the kubelet sends: one audience, bound to the pod, the
/// service account's uid so the API server refuses a recreated account.
pub fn token_request_body(r: &TokenRequest) -> String {
    serde_json::json!({
        "kind": "TokenRequest",
        "apiVersion": "authentication.k8s.io/v1",
        "metadata": { "uid": r.service_account_uid },
        "spec": {
            "audiences": [r.audience],
            "boundObjectRef": { "kind": "Pod", "apiVersion": "v1", "name": r.pod_name, "uid": r.pod_uid },
        },
    })
    .to_string()
}

impl ServiceAccountTokenSource for KubeApi {
    fn service_account<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<ServiceAccountInfo, TokenSourceError>> {
        Box::pin(async move {
            segment("namespace", namespace)?;
            segment("service account", name)?;
            let key = (namespace.to_string(), name.to_string());
            if let Some((info, at)) = self.accounts.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get(&key)
                && at.elapsed() < SERVICE_ACCOUNT_TTL
            {
                return Ok(info.clone());
            }
            let path = format!("/api/v1/namespaces/{namespace}/serviceaccounts/{name}");
            let json = self.call(hyper::Method::GET, &path, None).await.map_err(TokenSourceError)?;
            let meta = &json["metadata"];
            let uid = meta["uid"].as_str().unwrap_or_default().to_string();
            if uid.is_empty() {
                return Err(TokenSourceError("the API server's ServiceAccount has no metadata.uid".into()));
            }
            let annotations: BTreeMap<String, String> = meta["annotations"]
                .as_object()
                .map(|m| m.iter().filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_string()))).collect())
                .unwrap_or_default();
            let info = ServiceAccountInfo { uid, annotations };
            let mut accounts = self.accounts.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            // Stale entries go as new ones come: the cache holds what was
            // read within the TTL, not every account ever asked for.
            accounts.retain(|_, (_, at)| at.elapsed() < SERVICE_ACCOUNT_TTL);
            accounts.insert(key, (info.clone(), Instant::now()));
            Ok(info)
        })
    }

    fn token<'a>(&'a self, request: &'a TokenRequest) -> BoxFuture<'a, Result<Secret, TokenSourceError>> {
        Box::pin(async move {
            segment("namespace", &request.namespace)?;
            segment("service account", &request.service_account)?;
            if let Some((token, refresh_at)) =
                self.tokens.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get(request)
                && Instant::now() < *refresh_at
            {
                return Ok(token.clone());
            }
            let path =
                format!("/api/v1/namespaces/{}/serviceaccounts/{}/token", request.namespace, request.service_account);
            let json = self
                .call(hyper::Method::POST, &path, Some(token_request_body(request)))
                .await
                .map_err(|e| TokenSourceError(format!("TokenRequest: {e}")))?;
            let token = json["status"]["token"].as_str().unwrap_or_default();
            if token.is_empty() {
                return Err(TokenSourceError("TokenRequest: the answer holds no status.token".into()));
            }
            let token = Secret::new(token);
            // Reused until 80% of its lifetime, as the kubelet's token manager.
            let lifetime = json["status"]["expirationTimestamp"]
                .as_str()
                .and_then(|t| humantime::parse_rfc3339(t).ok())
                .and_then(|exp| exp.duration_since(SystemTime::now()).ok());
            if let Some(lifetime) = lifetime {
                let now = Instant::now();
                let mut tokens = self.tokens.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                // Keyed by pod: tokens past their refresh time (pods gone,
                // or renewed under this key now) go as new ones come, so
                // the cache holds the node's live pods' tokens, not every
                // pod's since the start.
                tokens.retain(|_, (_, refresh_at)| now < *refresh_at);
                tokens.insert(request.clone(), (token.clone(), now + lifetime.mul_f64(0.8)));
            }
            Ok(token)
        })
    }
}

#[cfg(test)]
mod tests;
