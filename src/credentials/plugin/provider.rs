//! One exec credential-provider plugin: asked only about images its
//! `matchImages` URL-match, run with a `CredentialProviderRequest` on stdin
//! and a timeout, its `CredentialProviderResponse` validated, cached by
//! image, registry or globally, and concurrent identical requests merged
//! into one run.
//!
//! A plugin's stderr is NOT shown anywhere (a deliberate change from the
//! kubelet, which appends it to the exec error): a plugin is third-party
//! code that handles tokens, and whatever it prints there could be one, and
//! secrets never reach imaged's logs. The exec error says how many bytes it
//! wrote; run the plugin by hand to read them. stdout (which carries the
//! credentials) is never shown either. A failing plugin gives no
//! credentials instead of failing the pull, so its error is only logged.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::BoxFuture;
use serde::Deserialize;
use tokio::io::AsyncWriteExt as _;
use tokio::sync::OnceCell;
use tokio::time::Instant;

use super::config::{PROVIDER_API_VERSIONS, ProviderSpec, TokenAttributes, TokenCacheType};
use super::service_account::{
    PluginPod, ServiceAccountInfo, ServiceAccountTokenSource, TokenContext, TokenRequest, TokenSourceError, cache_key,
    request_body, service_account_cache_key, single_flight_key, token_hash,
};
use crate::clock::Clock;
use crate::credentials::keyring::urls_match;
use crate::credentials::secrets::{DockerConfig, DockerConfigEntry};
use crate::domain::Secret;
use crate::domain::go_text::{parse_duration, quote};
use crate::domain::pull_record::ImagePullServiceAccount;

/// The kubelet's plugin timeout.
pub const DEFAULT_PLUGIN_TIMEOUT: Duration = Duration::from_secs(60);
/// The cache key of `cacheKeyType: Global` responses.
pub const GLOBAL_CACHE_KEY: &str = "<global>";

/// Why a plugin gave no credentials. Never carries the response body.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PluginError {
    /// The plugin could not be run, failed or timed out.
    #[error(
        "error execing credential provider plugin {plugin} for image {image}: {reason} \
         (stderr: {stderr_bytes} bytes, not shown: a plugin's output may hold credentials)"
    )]
    Exec {
        /// The plugin's name.
        plugin: String,
        /// The image asked about.
        image: String,
        /// Go-style reason (`exit status 1`, `context deadline exceeded`, ...).
        reason: String,
        /// How many bytes the plugin wrote to stderr (never their content).
        stderr_bytes: usize,
    },
    /// stdout was not a `CredentialProviderResponse`.
    #[error("error decoding credential provider plugin response from stdout")]
    Decode,
    /// A response of another provider API version.
    #[error(
        "apiVersion from credential plugin response did not match expected apiVersion:{expected}, actual apiVersion:{actual}"
    )]
    ApiVersion {
        /// The configured version.
        expected: String,
        /// The response's.
        actual: String,
    },
}

/// How a response is cached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheKeyType {
    /// For this image only.
    Image,
    /// For every image of the registry (text before the first `/`).
    Registry,
    /// For every image.
    Global,
}

impl CacheKeyType {
    /// The type a response names; `None` for anything but `Image`,
    /// `Registry` and `Global`.
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "Image" => Some(Self::Image),
            "Registry" => Some(Self::Registry),
            "Global" => Some(Self::Global),
            _ => None,
        }
    }

    /// The cache key of a response of this type for `image`.
    pub fn key(self, image: &str) -> &str {
        match self {
            Self::Image => image,
            Self::Registry => registry_of(image),
            Self::Global => GLOBAL_CACHE_KEY,
        }
    }
}

/// A validated `CredentialProviderResponse`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginResponse {
    /// `cacheKeyType` as given (checked by the caller: anything but
    /// `Image`, `Registry`, `Global` discards the response).
    pub cache_key_type: String,
    /// `cacheDuration`: `None` = the provider's default.
    pub cache_duration: Option<Duration>,
    /// Registry pattern → credentials.
    pub auth: DockerConfig,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawResponse {
    #[serde(default)]
    api_version: String,
    #[serde(default)]
    kind: String,
    #[serde(default)]
    cache_key_type: String,
    #[serde(default)]
    cache_duration: Option<String>,
    #[serde(default)]
    auth: Option<std::collections::BTreeMap<String, RawAuth>>,
}

#[derive(Deserialize)]
struct RawAuth {
    #[serde(default)]
    username: String,
    #[serde(default)]
    password: Option<String>,
}

/// Decodes and checks a plugin's stdout against the configured version.
/// Errors never quote the body.
pub fn decode_response(stdout: &[u8], expected_api_version: &str) -> Result<PluginResponse, PluginError> {
    let raw: RawResponse = serde_json::from_slice(stdout).map_err(|_| PluginError::Decode)?;
    // The kubelet checks the version before decoding the rest.
    if raw.api_version != expected_api_version {
        return Err(PluginError::ApiVersion { expected: expected_api_version.to_string(), actual: raw.api_version });
    }
    if !PROVIDER_API_VERSIONS.contains(&raw.api_version.as_str()) || raw.kind != "CredentialProviderResponse" {
        return Err(PluginError::Decode);
    }
    let cache_duration = match raw.cache_duration {
        None => None,
        Some(text) => match parse_duration(&text) {
            Ok(ns) => Some(Duration::from_nanos(u64::try_from(ns).unwrap_or(0))),
            Err(_) => return Err(PluginError::Decode),
        },
    };
    let entries = raw
        .auth
        .unwrap_or_default()
        .into_iter()
        .map(|(pattern, a)| {
            let entry = DockerConfigEntry {
                username: a.username,
                password: Secret::new(a.password.unwrap_or_default()),
                email: String::new(),
            };
            (pattern, entry)
        })
        .collect();
    Ok(PluginResponse { cache_key_type: raw.cache_key_type, cache_duration, auth: DockerConfig { entries } })
}

/// The registry of `image`: the text before its first `/`.
pub fn registry_of(image: &str) -> &str {
    image.split('/').next().unwrap_or(image)
}

/// What one run of a plugin gave.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PluginOutput {
    /// Its exit code; `None` when a signal ended it.
    pub code: Option<i32>,
    /// Its standard output (the response; never shown).
    pub stdout: Vec<u8>,
    /// Its standard error (only its length is ever shown).
    pub stderr: Vec<u8>,
}

/// How a plugin's executable is run: a child process ([`ProcessRunner`],
/// the daemon's), or an embedder's stand-in that cannot fork — the
/// simulator, whose node runs in one thread on paused time. Everything
/// around a run is the provider's either way: the `matchImages` check, the
/// request, the timeout (the run's future is dropped when it ends), single
/// flight, the response's checks and the cache.
pub trait PluginRunner: Send + Sync + fmt::Debug {
    /// Runs `executable` with `spec`'s arguments and environment, `stdin`
    /// on its standard input, to its exit. `Err`: it could not be run or
    /// waited on, as Go words it (`fork/exec /path: no such file or
    /// directory`).
    fn run<'a>(
        &'a self,
        executable: &'a Path,
        spec: &'a ProviderSpec,
        stdin: Vec<u8>,
    ) -> BoxFuture<'a, Result<PluginOutput, String>>;
}

/// Runs plugins as child processes, killed when their run is dropped.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcessRunner;

impl PluginRunner for ProcessRunner {
    fn run<'a>(
        &'a self,
        executable: &'a Path,
        spec: &'a ProviderSpec,
        stdin: Vec<u8>,
    ) -> BoxFuture<'a, Result<PluginOutput, String>> {
        Box::pin(async move {
            let mut cmd = tokio::process::Command::new(executable);
            cmd.args(&spec.args)
                .envs(spec.env.iter().map(|e| (&e.name, e.value.expose())))
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .kill_on_drop(true);
            let mut child = spawn(&mut cmd).await.map_err(|e| format!("fork/exec {}: {e}", executable.display()))?;
            if let Some(mut input) = child.stdin.take() {
                // A plugin that exits without reading its stdin is not an error.
                let _ = input.write_all(&stdin).await;
            }
            let output = child.wait_with_output().await.map_err(|e| e.to_string())?;
            Ok(PluginOutput { code: output.status.code(), stdout: output.stdout, stderr: output.stderr })
        })
    }
}

/// Spawns `cmd`, retrying briefly while the executable is busy (`ETXTBSY`:
/// it is being replaced, or was just written and a fork elsewhere still
/// holds it open for writing).
async fn spawn(cmd: &mut tokio::process::Command) -> std::io::Result<tokio::process::Child> {
    const ETXTBSY: i32 = 26;
    let mut tries = 0;
    loop {
        match cmd.spawn() {
            Err(e) if e.raw_os_error() == Some(ETXTBSY) && tries < 5 => {
                tries += 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            other => return other,
        }
    }
}

type Shared = Arc<OnceCell<Result<PluginResponse, PluginError>>>;

/// What one plugin gives for one image: the credentials and, in token
/// mode, the service account they were obtained for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Provided {
    /// Registry pattern → credentials (empty: none).
    pub config: DockerConfig,
    /// The pod's service account, when a token was part of the lookup
    /// (the credentials then prove that account, KEP-2535).
    pub service_account: Option<ImagePullServiceAccount>,
}

/// A registered plugin with its cache.
#[derive(Debug)]
pub struct PluginProvider {
    metrics: crate::metrics::Metrics,
    spec: ProviderSpec,
    executable: PathBuf,
    runner: Arc<dyn PluginRunner>,
    timeout: Duration,
    clock: Clock,
    /// cache key (the kubelet's `generateCacheKey`) → (expiry, credentials).
    cache: Mutex<HashMap<Vec<u8>, (Instant, DockerConfig)>>,
    /// single-flight key → the run every concurrent request for it waits on.
    in_flight: Mutex<HashMap<Vec<u8>, Shared>>,
}

impl PluginProvider {
    /// The plugin `spec` run from `executable`, each run limited to `timeout`.
    pub fn new(spec: ProviderSpec, executable: PathBuf, timeout: Duration) -> Self {
        Self {
            metrics: crate::metrics::Metrics::default(),
            spec,
            executable,
            runner: Arc::new(ProcessRunner),
            timeout,
            clock: Clock::new(),
            cache: Mutex::default(),
            in_flight: Mutex::default(),
        }
    }

    /// The same, reading cache time from `clock`.
    #[must_use]
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// The same, run by `runner` instead of as a child process.
    #[must_use]
    pub fn with_runner(mut self, runner: Arc<dyn PluginRunner>) -> Self {
        self.runner = runner;
        self
    }

    /// The same, reporting each run's duration and failure to `metrics`.
    #[must_use]
    pub fn with_metrics(mut self, metrics: crate::metrics::Metrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// The plugin's name.
    pub fn name(&self) -> &str {
        &self.spec.name
    }

    /// The plugin's configuration.
    pub fn spec(&self) -> &ProviderSpec {
        &self.spec
    }

    /// Whether some `matchImages` pattern URL-matches `image`.
    pub fn matches(&self, image: &str) -> bool {
        self.spec.match_images.iter().any(|m| urls_match(m, image))
    }

    fn cached(&self, image: &str, sa_key: &[u8]) -> Option<DockerConfig> {
        let now = self.clock.instant();
        let mut cache = self.cache.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        for base in [image, registry_of(image), GLOBAL_CACHE_KEY] {
            let Ok(key) = cache_key(base, sa_key) else { return None };
            match cache.get(&key) {
                // Expired only once strictly past the expiry (the kubelet's policy).
                Some((expires, config)) if now <= *expires => return Some(config.clone()),
                Some(_) => {
                    cache.remove(&key);
                }
                None => {}
            }
        }
        None
    }

    fn store(&self, key: Vec<u8>, config: DockerConfig, ttl: Duration) {
        let now = self.clock.instant();
        let mut cache = self.cache.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        // Expired entries go when anything is stored (the kubelet lists every 15 min).
        cache.retain(|_, (expires, _)| now <= *expires);
        cache.insert(key, (now + ttl, config));
    }

    /// The plugin's credentials for `image` (a normalised repository) for a
    /// pod without a service account (no token).
    pub async fn provide(&self, image: &str) -> DockerConfig {
        self.provide_for(image, &PluginPod::default(), None).await.config
    }

    /// The kubelet's `pluginProvider.provide`: the credentials this plugin
    /// gives for `image` (a normalised repository) for `pod`, from the cache
    /// or a run; empty when the image does not match, the plugin failed
    /// (logged) or returned an invalid `cacheKeyType`. In token mode
    /// (`tokenAttributes`) the pod's service account is looked up (from the
    /// request, else `source`), a token minted for the plugin's audience
    /// (the request's, else `source`'s) and sent with the annotations the
    /// plugin asks for; the credentials are cached per service account or,
    /// with `cacheType: Token`, per token.
    pub async fn provide_for(
        &self,
        image: &str,
        pod: &PluginPod,
        source: Option<&dyn ServiceAccountTokenSource>,
    ) -> Provided {
        if !self.matches(image) {
            return Provided::default();
        }
        let token = match &self.spec.token_attributes {
            None => None,
            Some(attrs) => match self.token_context(attrs, pod, source).await {
                Ok(t) => t,
                Err(()) => return Provided::default(),
            },
        };
        let sa_key: &[u8] = token.as_ref().map_or(&[], |t| t.cache_key.as_slice());
        let service_account = token.as_ref().map(|t| t.coordinates.clone());
        if let Some(config) = self.cached(image, sa_key) {
            return Provided { config, service_account };
        }
        let flight_key = match &token {
            None => image.as_bytes().to_vec(),
            Some(t) => match single_flight_key(image, &t.token_hash, &t.annotations) {
                Ok(k) => k,
                Err(e) => {
                    tracing::error!(plugin = %self.spec.name, "Error generating singleflight key: {e}");
                    return Provided::default();
                }
            },
        };
        let response = match self.run_keyed(flight_key, image, token.as_ref()).await {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(plugin = %self.spec.name, "Failed getting credential from external registry credential provider: {e}");
                return Provided::default();
            }
        };
        if let (Some(t), Some(attrs)) = (&token, &self.spec.token_attributes)
            && !t.token.is_empty()
            && attrs.cache_type != TokenCacheType::Token
            && response.auth.entries.iter().any(|(_, e)| e.password == t.token)
        {
            // The token echoed back as the password: only cacheType Token may do that.
            tracing::error!(
                plugin = %self.spec.name,
                "Credential provider plugin returned the service account token as the password for image {}, which is not allowed when service account cache type is not set to 'Token'",
                quote(image)
            );
            return Provided::default();
        }
        let Some(key_type) = CacheKeyType::parse(&response.cache_key_type) else {
            tracing::error!(
                plugin = %self.spec.name,
                "credential provider plugin did not return a valid cacheKeyType: {}",
                quote(&response.cache_key_type)
            );
            return Provided::default();
        };
        let ttl = response.cache_duration.unwrap_or(self.spec.default_cache_duration);
        if !ttl.is_zero() {
            match cache_key(key_type.key(image), sa_key) {
                Ok(key) => self.store(key, response.auth.clone(), ttl),
                Err(e) => {
                    tracing::error!(plugin = %self.spec.name, "Error generating cache key: {e}");
                    return Provided::default();
                }
            }
        }
        Provided { config: response.auth, service_account }
    }

    /// Token mode: the service account, annotations and token of `pod` for
    /// this plugin. `Ok(None)`: run without a token (no service account,
    /// and the plugin allows that); `Err`: give no credentials (logged).
    async fn token_context(
        &self,
        attrs: &TokenAttributes,
        pod: &PluginPod,
        source: Option<&dyn ServiceAccountTokenSource>,
    ) -> Result<Option<TokenContext>, ()> {
        let (ns, pod_name) = (&pod.namespace, &pod.name);
        let Some(sa) = pod.service_account.as_ref().filter(|sa| !sa.name.is_empty()) else {
            if attrs.require_service_account {
                tracing::debug!(plugin = %self.spec.name, "Service account name is empty for pod {ns}/{pod_name}");
                return Err(());
            }
            return Ok(None);
        };
        let info = if sa.uid.is_empty() {
            let Some(source) = source else {
                tracing::error!(
                    plugin = %self.spec.name,
                    "Failed to get service account {ns}/{}: the request gives no uid and imaged has no service-account source (credentials.kubeconfig, or a token source from the embedder)",
                    sa.name
                );
                return Err(());
            };
            match source.service_account(ns, &sa.name).await {
                Ok(info) => info,
                Err(e) => {
                    tracing::error!(plugin = %self.spec.name, "Failed to get service account {ns}/{}: {e}", sa.name);
                    return Err(());
                }
            }
        } else {
            ServiceAccountInfo { uid: sa.uid.clone(), annotations: sa.annotations.clone() }
        };
        let mut annotations = BTreeMap::new();
        for k in &attrs.required_annotation_keys {
            let Some(v) = info.annotations.get(k) else {
                // The kubelet logs this at V(5): an opt-in mechanism, often expected.
                tracing::debug!(
                    plugin = %self.spec.name,
                    "Failed to get service account data {ns}/{}: required annotation {k} not found",
                    sa.name
                );
                return Err(());
            };
            annotations.insert(k.clone(), v.clone());
        }
        for k in &attrs.optional_annotation_keys {
            if let Some(v) = info.annotations.get(k) {
                annotations.insert(k.clone(), v.clone());
            }
        }
        let token = match sa.tokens.get(&attrs.audience) {
            Some(t) => t.clone(),
            None => {
                let request = TokenRequest {
                    namespace: ns.clone(),
                    service_account: sa.name.clone(),
                    service_account_uid: info.uid.clone(),
                    pod_name: pod_name.clone(),
                    pod_uid: pod.uid.clone(),
                    audience: attrs.audience.clone(),
                };
                let minted = match source {
                    Some(source) => source.token(&request).await,
                    None => Err(TokenSourceError(
                        "no token for the plugin's audience with the request, and imaged has no token source".into(),
                    )),
                };
                match minted {
                    Ok(t) => t,
                    Err(e) => {
                        tracing::error!(plugin = %self.spec.name, "Error getting service account token {ns}/{}: {e}", sa.name);
                        return Err(());
                    }
                }
            }
        };
        let coordinates = ImagePullServiceAccount { uid: info.uid, namespace: ns.clone(), name: sa.name.clone() };
        let token_hash = token_hash(&token);
        match service_account_cache_key(&coordinates, &annotations, attrs.cache_type, &token_hash) {
            Ok(cache_key) => Ok(Some(TokenContext { coordinates, token, annotations, cache_key, token_hash })),
            Err(e) => {
                tracing::error!(plugin = %self.spec.name, "Error generating service account cache key: {e}");
                Err(())
            }
        }
    }

    /// Runs the plugin for `image` (no cache, no token), once for all
    /// concurrent callers: they all get the one run's result.
    pub async fn run(&self, image: &str) -> Result<PluginResponse, PluginError> {
        self.run_keyed(image.as_bytes().to_vec(), image, None).await
    }

    /// One run per `key` for all concurrent callers.
    async fn run_keyed(
        &self,
        key: Vec<u8>,
        image: &str,
        token: Option<&TokenContext>,
    ) -> Result<PluginResponse, PluginError> {
        let cell: Shared = {
            let mut in_flight = self.in_flight.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            in_flight.entry(key.clone()).or_default().clone()
        };
        // A cancelled first caller hands the run to the next waiter.
        let result = cell.get_or_init(|| self.exec(image, token)).await.clone();
        let mut in_flight = self.in_flight.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if in_flight.get(&key).is_some_and(|c| Arc::ptr_eq(c, &cell)) {
            in_flight.remove(&key);
        }
        result
    }

    fn exec_error(&self, image: &str, reason: String, stderr: &[u8]) -> PluginError {
        PluginError::Exec {
            plugin: self.spec.name.clone(),
            image: image.to_string(),
            reason,
            stderr_bytes: stderr.len(),
        }
    }

    /// One run of the plugin: its stdout decoded. The run (spawn to exit)
    /// is metered; a failed run counts as an error, a bad response does not
    /// (as in the kubelet).
    async fn exec(&self, image: &str, token: Option<&TokenContext>) -> Result<PluginResponse, PluginError> {
        tracing::debug!(plugin = %self.spec.name, "Getting image {image} credentials from external exec plugin {}", self.spec.name);
        let started = std::time::Instant::now();
        let body = match token {
            Some(t) => request_body(&self.spec.api_version, image, &t.token, &t.annotations),
            None => request_body(&self.spec.api_version, image, &Secret::default(), &BTreeMap::new()),
        };
        let stdout = self.run_process(image, body).await;
        self.metrics.credential_plugin_ran(&self.spec.name, started.elapsed(), stdout.is_err());
        decode_response(&stdout?, &self.spec.api_version)
    }

    /// Runs the executable with `body` (the request) on stdin, within the
    /// timeout; its stdout on success.
    async fn run_process(&self, image: &str, body: Vec<u8>) -> Result<Vec<u8>, PluginError> {
        let run = self.runner.run(&self.executable, &self.spec, body);
        let output = match tokio::time::timeout(self.timeout, run).await {
            Ok(Ok(output)) => output,
            Ok(Err(reason)) => return Err(self.exec_error(image, reason, b"")),
            // Dropping the run kills the plugin (kill_on_drop).
            Err(_) => return Err(self.exec_error(image, "context deadline exceeded".to_string(), b"")),
        };
        match output.code {
            Some(0) => Ok(output.stdout),
            Some(code) => Err(self.exec_error(image, format!("exit status {code}"), &output.stderr)),
            None => Err(self.exec_error(image, "signal: killed".to_string(), &output.stderr)),
        }
    }
}
