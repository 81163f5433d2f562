//! Configuration: loading (file → `IMAGED_*` environment → flags) into a raw
//! form, then validating into typed values.
//!
//! The defaults are `config/default.toml`, compiled into the binary, so the
//! documented file and the running defaults cannot drift apart. Loading is
//! separate from validation so tests feed plain strings and maps.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use crate::actors::backoff_registry::{BackoffConfig, BackoffSettings};
use crate::actors::cri_gateway::{CriConfig, CriDeadlines};
use crate::actors::pull_queue::{Concurrency, PullQueueConfig, ThrottleMode};
use crate::credentials::{DockerConfigSearch, NodeCredentialSettings};
use crate::cri::{CriEndpoint, Rpc};
use crate::ensure::EnsureConfig;
use crate::metrics::Metrics;

/// The documented defaults (`config/default.toml`).
pub const DEFAULT_TOML: &str = include_str!("../config/default.toml");

/// A configuration that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A source could not be read or parsed (unknown key, wrong type, bad TOML).
    #[error("configuration: {0}")]
    Load(String),
    /// A key has a value that is not allowed.
    #[error("configuration: invalid value {value:?} for {key}: {reason}")]
    Invalid {
        /// Dotted key (`runtime.deadlines.pull_image`).
        key: String,
        /// The rejected value, as given.
        value: String,
        /// What is allowed.
        reason: String,
    },
    /// A `--set` override is not `key=value`.
    #[error("configuration: override {0:?} is not key=value")]
    BadOverride(String),
    /// The `--kubelet-config` file cannot be used (names the file and field).
    #[error("configuration: {0}")]
    Kubelet(#[from] crate::kubelet_config::KubeletConfigError),
}

impl From<config::ConfigError> for ConfigError {
    fn from(e: config::ConfigError) -> Self {
        ConfigError::Load(e.to_string())
    }
}

// === raw (as read) ===

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    runtime: RawRuntime,
    pull: RawPull,
    backoff: RawBackoff,
    gc: RawGc,
    credential_verification: RawCredentialVerification,
    state: RawState,
    daemon: RawDaemon,
    log: RawLog,
    credentials: RawCredentials,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCredentials {
    root_dir: String,
    #[serde(default)]
    config_json_dirs: Option<Vec<String>>,
    #[serde(default)]
    dockercfg_dirs: Option<Vec<String>>,
    cache_period: String,
    provider_config: String,
    provider_bin_dir: String,
    provider_timeout: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCredentialVerification {
    policy: String,
    allowlist: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawGc {
    image_gc_high_threshold_percent: i64,
    image_gc_low_threshold_percent: i64,
    image_minimum_gc_age: String,
    image_maximum_gc_age: String,
    detect_period: String,
    gc_period: String,
    cache_refresh_period: String,
    node_status_max_images: i64,
    sandbox_image: String,
    pinned_images: Vec<String>,
    keep_newest_tags_per_repo: i64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDaemon {
    socket: String,
    socket_group: String,
    shutdown_grace: String,
    max_request_bytes: i64,
    metrics_address: String,
    metrics_allow_non_loopback: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawState {
    dir: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPull {
    #[serde(default)]
    serialize_image_pulls: Option<bool>,
    #[serde(default)]
    max_parallel_image_pulls: Option<i64>,
    max_parallel_pulls_per_registry: i64,
    presence_check_concurrency: i64,
    presence_check_window: i64,
    queue_capacity: i64,
    registry_pull_qps: f64,
    registry_burst: i64,
    throttle_mode: String,
    single_flight: bool,
    pull_deadline: String,
    slow_pull_warning: String,
    annotate_error_class: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBackoff {
    initial: String,
    max: String,
    gc_interval: String,
    mailbox_capacity: i64,
    reset_on_credential_change: bool,
    reset_on_registry_recovery: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRuntime {
    endpoint: String,
    fault_plan: String,
    embedded_socket: String,
    connect_timeout: String,
    startup_timeout: String,
    mailbox_capacity: i64,
    deadlines: RawDeadlines,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDeadlines {
    version: String,
    list_images: String,
    image_status: String,
    pull_image: String,
    remove_image: String,
    image_fs_info: String,
    list_containers: String,
    list_pod_sandbox: String,
    container_status: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLog {
    format: String,
    filter: String,
}

// === validated ===

/// Where the CRI runtime is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RuntimeEndpoint {
    /// Start the embedded runtime in-process, on this socket (or a fresh one).
    Embedded {
        /// Socket path; `None` = a fresh path in the temp dir.
        socket: Option<PathBuf>,
    },
    /// A runtime listening at this endpoint.
    Cri(CriEndpoint),
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Logging settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogConfig {
    /// Output format.
    pub format: LogFormat,
    /// tracing filter directives (`RUST_LOG` wins when set).
    pub filter: String,
}

/// Image garbage collection settings (validated with the kubelet's rules).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GcSettings {
    /// `image_gc_high_threshold_percent` (0-100).
    pub high_threshold_percent: i64,
    /// `image_gc_low_threshold_percent` (0-100, below high).
    pub low_threshold_percent: i64,
    /// `image_minimum_gc_age`.
    pub min_age: Duration,
    /// `image_maximum_gc_age` (zero = off).
    pub max_age: Duration,
    /// Detector period.
    pub detect_period: Duration,
    /// GC period.
    pub gc_period: Duration,
    /// Node-status image list refresh period.
    pub cache_refresh_period: Duration,
    /// Images in node status (`None` = all).
    pub node_status_max_images: Option<usize>,
    /// The sandbox image (protected by its resolved id); empty = none.
    pub sandbox_image: String,
    /// Patterns of images GC never removes.
    pub pinned_images: Vec<String>,
    /// Keep at most this many unused tags per repository (`None` = off).
    pub keep_newest_tags_per_repo: Option<usize>,
    /// Where the GC executor reports removals, bytes freed and runs.
    pub metrics: Metrics,
}

impl GcSettings {
    /// These settings with `other`'s live-changeable part (thresholds, min
    /// and max age, pinned images, retention rule): what a SIGHUP applies.
    pub fn with_policy_of(&self, other: &GcSettings) -> GcSettings {
        GcSettings {
            high_threshold_percent: other.high_threshold_percent,
            low_threshold_percent: other.low_threshold_percent,
            min_age: other.min_age,
            max_age: other.max_age,
            pinned_images: other.pinned_images.clone(),
            keep_newest_tags_per_repo: other.keep_newest_tags_per_repo,
            ..self.clone()
        }
    }

    /// GC is off entirely (the kubelet: high threshold 100 and no max age).
    pub fn disabled(&self) -> bool {
        self.policy().is_disabled()
    }

    /// The thresholds and ages as a GC policy.
    pub fn policy(&self) -> crate::gc::policy::GcPolicy {
        crate::gc::policy::GcPolicy {
            high_threshold_percent: self.high_threshold_percent,
            low_threshold_percent: self.low_threshold_percent,
            min_age: self.min_age,
            max_age: self.max_age,
        }
    }

    /// The protection rules (the sandbox image id is resolved at each detection).
    pub fn rules(&self) -> crate::gc::policy::ProtectionRules {
        crate::gc::policy::ProtectionRules {
            pinned_images: self.pinned_images.clone(),
            sandbox_image_id: None,
            keep_newest_tags_per_repo: self.keep_newest_tags_per_repo,
        }
    }
}

/// The validated configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Where the runtime is.
    pub endpoint: RuntimeEndpoint,
    /// CRI gateway settings.
    pub cri: CriConfig,
    /// Pull queue settings.
    pub pull: PullQueueConfig,
    /// Ensure-flow settings.
    pub ensure: EnsureConfig,
    /// Backoff registry settings.
    pub backoff: BackoffSettings,
    /// Image GC settings.
    pub gc: GcSettings,
    /// KEP-2535: when a present image needs the pod's credentials verified
    /// (`credential_verification.policy` and `.allowlist`).
    pub verification: crate::pull_records::VerifyPolicy,
    /// Directory of durable state (`None` = memory only).
    pub state_dir: Option<PathBuf>,
    /// A fault plan file (TOML, see `fault::FaultPlan::from_toml`) applied
    /// at the CRI gateway; `None` = no faults.
    pub fault_plan: Option<PathBuf>,
    /// The daemon's settings (`imaged run`).
    pub daemon: DaemonSettings,
    /// Logging.
    pub log: LogConfig,
    /// Node credentials: docker config files and credential-provider plugins.
    pub credentials: NodeCredentialSettings,
}

/// The daemon's settings (`[daemon]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DaemonSettings {
    /// The API's unix socket.
    pub socket: PathBuf,
    /// Group given access to the socket (mode 0660); `None` = owner only (0600).
    pub socket_group: Option<String>,
    /// How long in-flight pulls may go on after SIGTERM/SIGINT.
    pub shutdown_grace: Duration,
    /// Largest API request accepted, in bytes.
    pub max_request_bytes: usize,
    /// Where `/metrics`, `/healthz` and `/readyz` are served (`None` = not
    /// served). A loopback address unless `metrics_allow_non_loopback`.
    pub metrics_address: Option<std::net::SocketAddr>,
}

/// Where configuration comes from, besides the built-in defaults.
#[derive(Debug, Default, Clone)]
pub struct Sources {
    /// A TOML file (`--config`).
    pub file: Option<PathBuf>,
    /// A KubeletConfiguration YAML whose image fields are layered after
    /// `file` and before the environment (`--kubelet-config`).
    pub kubelet_config: Option<PathBuf>,
    /// Environment variables to read `IMAGED_*` keys from (`None` = none).
    pub env: Option<HashMap<String, String>>,
    /// `key=value` overrides (`--set`), applied last.
    pub overrides: Vec<String>,
}

impl Sources {
    /// The file, this process's environment and the overrides.
    pub fn from_process(file: Option<PathBuf>, overrides: Vec<String>) -> Self {
        Self { file, kubelet_config: None, env: Some(std::env::vars().collect()), overrides }
    }

    /// The same sources with a KubeletConfiguration file layered after the file.
    #[must_use]
    pub fn with_kubelet_config(mut self, path: Option<PathBuf>) -> Self {
        self.kubelet_config = path;
        self
    }
}

impl Config {
    /// The key settings published as `imaged_config_info`'s labels.
    pub fn info_labels(&self) -> Vec<(&'static str, String)> {
        let endpoint = match &self.endpoint {
            RuntimeEndpoint::Embedded { .. } => "embedded".to_string(),
            RuntimeEndpoint::Cri(e) => e.to_string(),
        };
        vec![
            ("runtime_endpoint", endpoint),
            ("pull_concurrency", self.pull.concurrency.to_string()),
            ("single_flight", self.pull.single_flight.to_string()),
            ("registry_pull_qps", self.pull.qps.to_string()),
            ("registry_burst", self.pull.burst.to_string()),
            ("image_gc_high_threshold_percent", self.gc.high_threshold_percent.to_string()),
            ("image_gc_low_threshold_percent", self.gc.low_threshold_percent.to_string()),
        ]
    }

    /// This configuration with every component reporting to `metrics` (the
    /// gateway, the pull queue and ensure flow, the backoff registry, GC).
    #[must_use]
    pub fn with_metrics(mut self, metrics: &Metrics) -> Self {
        self.cri.metrics = metrics.clone();
        self.pull.metrics = metrics.clone();
        self.backoff.metrics = metrics.clone();
        self.gc.metrics = metrics.clone();
        self.credentials.metrics = metrics.clone();
        self
    }

    /// The built-in defaults.
    pub fn defaults() -> Result<Self, ConfigError> {
        Self::load(&Sources::default())
    }

    /// Loads and validates from `sources`.
    pub fn load(sources: &Sources) -> Result<Self, ConfigError> {
        let mut b =
            config::Config::builder().add_source(config::File::from_str(DEFAULT_TOML, config::FileFormat::Toml));
        if let Some(path) = &sources.file {
            b = b.add_source(config::File::from(path.as_path()).format(config::FileFormat::Toml).required(true));
        }
        let kubelet = match &sources.kubelet_config {
            Some(path) => {
                let fields = crate::kubelet_config::KubeletImageFields::read(path)?;
                b = b.add_source(crate::kubelet_config::KubeletSource(fields.clone()));
                Some(fields)
            }
            None => None,
        };
        if let Some(env) = &sources.env {
            // Only IMAGED_<SECTION>__<KEY> variables are configuration; other
            // IMAGED_* variables (used by tests and tools) are left alone.
            let vars: HashMap<String, String> = env
                .iter()
                .filter(|(k, _)| k.starts_with("IMAGED_") && k.contains("__"))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            b = b.add_source(
                config::Environment::with_prefix("IMAGED").prefix_separator("_").separator("__").source(Some(vars)),
            );
        }
        for o in &sources.overrides {
            let (k, v) = o.split_once('=').ok_or_else(|| ConfigError::BadOverride(o.clone()))?;
            b = b.set_override(k.trim(), v.trim())?;
        }
        let raw: RawConfig = b.build()?.try_deserialize()?;
        Self::from_raw(raw).map_err(|e| match &kubelet {
            Some(k) => blame_kubelet_field(e, k, sources),
            None => e,
        })
    }

    /// Loads from a TOML string layered over the defaults (for tests).
    pub fn from_toml(toml: &str) -> Result<Self, ConfigError> {
        let raw: RawConfig = config::Config::builder()
            .add_source(config::File::from_str(DEFAULT_TOML, config::FileFormat::Toml))
            .add_source(config::File::from_str(toml, config::FileFormat::Toml))
            .build()?
            .try_deserialize()?;
        Self::from_raw(raw)
    }

    fn from_raw(raw: RawConfig) -> Result<Self, ConfigError> {
        let r = raw.runtime;
        let r_fault_plan = r.fault_plan.clone();
        let endpoint = if r.endpoint == "embedded" {
            RuntimeEndpoint::Embedded {
                socket: if r.embedded_socket.is_empty() { None } else { Some(PathBuf::from(&r.embedded_socket)) },
            }
        } else {
            RuntimeEndpoint::Cri(r.endpoint.parse().map_err(|e: crate::cri::InvalidEndpoint| {
                invalid("runtime.endpoint", &r.endpoint, format!("{}; or \"embedded\"", e.reason))
            })?)
        };
        let mailbox_capacity =
            usize::try_from(r.mailbox_capacity).ok().filter(|c| (1..=1_000_000).contains(c)).ok_or_else(|| {
                invalid("runtime.mailbox_capacity", &r.mailbox_capacity.to_string(), "must be from 1 to 1000000")
            })?;
        let d = r.deadlines;
        let deadline = |key: &str, v: &str| -> Result<Option<Duration>, ConfigError> {
            let dur = duration(&format!("runtime.deadlines.{key}"), v)?;
            Ok(if dur.is_zero() { None } else { Some(dur) })
        };
        let deadlines = CriDeadlines::uniform(None)
            .with(Rpc::Version, deadline("version", &d.version)?)
            .with(Rpc::ListImages, deadline("list_images", &d.list_images)?)
            .with(Rpc::ImageStatus, deadline("image_status", &d.image_status)?)
            .with(Rpc::PullImage, deadline("pull_image", &d.pull_image)?)
            .with(Rpc::RemoveImage, deadline("remove_image", &d.remove_image)?)
            .with(Rpc::ImageFsInfo, deadline("image_fs_info", &d.image_fs_info)?)
            .with(Rpc::ListContainers, deadline("list_containers", &d.list_containers)?)
            .with(Rpc::ListPodSandbox, deadline("list_pod_sandbox", &d.list_pod_sandbox)?)
            .with(Rpc::ContainerStatus, deadline("container_status", &d.container_status)?);
        let connect_timeout = duration("runtime.connect_timeout", &r.connect_timeout)?;
        if connect_timeout.is_zero() {
            return Err(invalid("runtime.connect_timeout", &r.connect_timeout, "must be more than 0s"));
        }
        let cri = CriConfig {
            connect_timeout,
            startup_timeout: duration("runtime.startup_timeout", &r.startup_timeout)?,
            mailbox_capacity,
            deadlines,
            metrics: Metrics::default(),
        };
        let format = match raw.log.format.as_str() {
            "text" => LogFormat::Text,
            "json" => LogFormat::Json,
            other => return Err(invalid("log.format", other, "must be \"text\" or \"json\"")),
        };
        if let Err(e) = tracing_subscriber::EnvFilter::try_new(&raw.log.filter) {
            return Err(invalid("log.filter", &raw.log.filter, e.to_string()));
        }
        let (pull, mut ensure) = pull_from_raw(raw.pull)?;
        ensure.reset_backoff_on_credential_change = raw.backoff.reset_on_credential_change;
        ensure.reset_backoff_on_registry_recovery = raw.backoff.reset_on_registry_recovery;
        let backoff = backoff_from_raw(raw.backoff)?;
        let gc = gc_from_raw(raw.gc)?;
        let verification = verification_from_raw(raw.credential_verification)?;
        let credentials = credentials_from_raw(raw.credentials)?;
        let state_dir = if raw.state.dir.is_empty() { None } else { Some(PathBuf::from(raw.state.dir)) };
        let daemon = daemon_from_raw(raw.daemon)?;
        let fault_plan = if r_fault_plan.is_empty() {
            None
        } else {
            let path = PathBuf::from(&r_fault_plan);
            load_fault_plan(&path).map_err(|reason| invalid("runtime.fault_plan", &r_fault_plan, reason))?;
            Some(path)
        };
        // One registry for every component (see `with_metrics` to use the daemon's).
        Ok(Config {
            endpoint,
            cri,
            pull,
            ensure,
            backoff,
            gc,
            verification,
            state_dir,
            fault_plan,
            daemon,
            log: LogConfig { format, filter: raw.log.filter },
            credentials,
        }
        .with_metrics(&Metrics::default()))
    }
}

/// Reads and parses a fault plan file.
pub fn load_fault_plan(path: &std::path::Path) -> Result<crate::fault::FaultPlan, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("reading it: {e}"))?;
    crate::fault::FaultPlan::from_toml(&text)
}

fn daemon_from_raw(d: RawDaemon) -> Result<DaemonSettings, ConfigError> {
    let metrics_address = metrics_address(&d)?;
    if d.socket.is_empty() {
        return Err(invalid("daemon.socket", &d.socket, "must be a path"));
    }
    let group = d.socket_group.trim();
    if group.contains(char::is_whitespace) || group.contains(':') {
        return Err(invalid("daemon.socket_group", &d.socket_group, "must be a group name or number"));
    }
    let max_request_bytes =
        usize::try_from(d.max_request_bytes).ok().filter(|n| (1024..=256 << 20).contains(n)).ok_or_else(|| {
            invalid("daemon.max_request_bytes", &d.max_request_bytes.to_string(), "must be from 1024 to 268435456")
        })?;
    Ok(DaemonSettings {
        socket: PathBuf::from(d.socket),
        socket_group: if group.is_empty() { None } else { Some(group.to_string()) },
        shutdown_grace: duration("daemon.shutdown_grace", &d.shutdown_grace)?,
        max_request_bytes,
        metrics_address,
    })
}

/// A count where 0 means `zero` (off, no limit…): `None` for 0, the count
/// otherwise; a negative value is rejected naming `key`.
fn zero_is_off(key: &str, v: i64, zero: &str) -> Result<Option<usize>, ConfigError> {
    match usize::try_from(v) {
        Ok(0) => Ok(None),
        Ok(n) => Ok(Some(n)),
        Err(_) => Err(invalid(key, &v.to_string(), format!("must be 0 ({zero}) or more"))),
    }
}

/// The kubelet's validation and defaulting of the image pull fields.
fn pull_from_raw(p: RawPull) -> Result<(PullQueueConfig, EnsureConfig), ConfigError> {
    if p.registry_pull_qps < 0.0 || !p.registry_pull_qps.is_finite() {
        let v = p.registry_pull_qps.to_string();
        return Err(invalid(
            "pull.registry_pull_qps",
            &v,
            format!("invalid configuration: registryPullQPS (--registry-qps) {v} must not be a negative number"),
        ));
    }
    if p.registry_burst < 0 {
        let v = p.registry_burst.to_string();
        return Err(invalid(
            "pull.registry_burst",
            &v,
            format!("invalid configuration: registryBurst (--registry-burst) {v} must not be a negative number"),
        ));
    }
    if let Some(n) = p.max_parallel_image_pulls
        && n < 1
    {
        return Err(invalid(
            "pull.max_parallel_image_pulls",
            &n.to_string(),
            format!("invalid configuration: maxParallelImagePulls {n} must be a positive number"),
        ));
    }
    // Defaulting: serial unless at least two parallel pulls are asked for.
    let serialize = p.serialize_image_pulls.unwrap_or(p.max_parallel_image_pulls.is_none_or(|n| n < 2));
    if serialize && p.max_parallel_image_pulls.is_some_and(|n| n > 1) {
        let n = p.max_parallel_image_pulls.unwrap_or_default().to_string();
        return Err(invalid(
            "pull.max_parallel_image_pulls",
            &n,
            "invalid configuration: maxParallelImagePulls cannot be larger than 1 unless SerializeImagePulls (--serialize-image-pulls) is set to false",
        ));
    }
    let registry_limit = zero_is_off(
        "pull.max_parallel_pulls_per_registry",
        p.max_parallel_pulls_per_registry,
        "no per-registry limit",
    )?;
    if let Some(n) = registry_limit
        && serialize
        && n > 1
    {
        return Err(invalid(
            "pull.max_parallel_pulls_per_registry",
            &n.to_string(),
            "cannot be larger than 1 while pulls are serial (pull.serialize_image_pulls)",
        ));
    }
    let presence_check_concurrency =
        zero_is_off("pull.presence_check_concurrency", p.presence_check_concurrency, "no limit")?;
    let presence_check_window = zero_is_off("pull.presence_check_window", p.presence_check_window, "no window")?;
    let concurrency = if serialize {
        Concurrency::Serial
    } else {
        Concurrency::Parallel(p.max_parallel_image_pulls.and_then(|n| usize::try_from(n).ok()))
    };
    let capacity = zero_is_off("pull.queue_capacity", p.queue_capacity, "unbounded")?;
    let throttle_mode = match p.throttle_mode.as_str() {
        "fail" => ThrottleMode::Fail,
        "wait" => ThrottleMode::Wait,
        other => return Err(invalid("pull.throttle_mode", other, "must be \"fail\" or \"wait\"")),
    };
    let burst = u32::try_from(p.registry_burst)
        .map_err(|_| invalid("pull.registry_burst", &p.registry_burst.to_string(), "must be at most 4294967295"))?;
    let deadline = duration("pull.pull_deadline", &p.pull_deadline)?;
    let slow = duration("pull.slow_pull_warning", &p.slow_pull_warning)?;
    Ok((
        PullQueueConfig {
            concurrency,
            registry_limit,
            capacity,
            single_flight: p.single_flight,
            qps: p.registry_pull_qps,
            // The kubelet's v1beta1 defaulting turns a zero burst into 10.
            burst: if burst == 0 { 10 } else { burst },
            throttle_mode,
            pull_deadline: if deadline.is_zero() { None } else { Some(deadline) },
            slow_pull_warning: if slow.is_zero() { None } else { Some(slow) },
            metrics: Metrics::default(),
        },
        EnsureConfig {
            annotate_error_class: p.annotate_error_class,
            presence_check_concurrency,
            presence_check_window,
            ..EnsureConfig::default()
        },
    ))
}

/// The kubelet's image GC validation (its texts), plus imaged's own keys.
fn gc_from_raw(g: RawGc) -> Result<GcSettings, ConfigError> {
    let (high, low) = (g.image_gc_high_threshold_percent, g.image_gc_low_threshold_percent);
    let min_age = duration("gc.image_minimum_gc_age", &g.image_minimum_gc_age)?;
    let max_age = duration("gc.image_maximum_gc_age", &g.image_maximum_gc_age)?;
    // The kubelet's texts live in `GcPolicy::validate`; name the key here.
    let policy =
        crate::gc::policy::GcPolicy { high_threshold_percent: high, low_threshold_percent: low, min_age, max_age };
    if let Err(errors) = policy.validate() {
        let first = errors.into_iter().next().unwrap_or_default();
        let (key, value) = if first.contains("imageMaximumGCAge") {
            ("gc.image_maximum_gc_age", g.image_maximum_gc_age.clone())
        } else if first.starts_with("invalid configuration: imageGCLowThresholdPercent") {
            ("gc.image_gc_low_threshold_percent", low.to_string())
        } else {
            ("gc.image_gc_high_threshold_percent", high.to_string())
        };
        return Err(invalid(key, &value, first));
    }
    let period = |key: &str, v: &str| -> Result<Duration, ConfigError> {
        let d = duration(key, v)?;
        if d.is_zero() {
            return Err(invalid(key, v, "must be more than 0s"));
        }
        Ok(d)
    };
    let node_status_max_images = match g.node_status_max_images {
        -1 => None,
        n if n < -1 => {
            return Err(invalid(
                "gc.node_status_max_images",
                &n.to_string(),
                format!(
                    "invalid configuration: nodeStatusMaxImages (--node-status-max-images) {n} must be -1 or greater"
                ),
            ));
        }
        n => Some(usize::try_from(n).unwrap_or(usize::MAX)),
    };
    for p in &g.pinned_images {
        if p.trim().is_empty() || p.contains(char::is_whitespace) {
            return Err(invalid(
                "gc.pinned_images",
                p,
                "a pattern is a reference, \"repo:*\" or \"prefix/*\", without spaces",
            ));
        }
    }
    let keep = zero_is_off("gc.keep_newest_tags_per_repo", g.keep_newest_tags_per_repo, "off")?;
    Ok(GcSettings {
        high_threshold_percent: high,
        low_threshold_percent: low,
        min_age,
        max_age,
        detect_period: period("gc.detect_period", &g.detect_period)?,
        gc_period: period("gc.gc_period", &g.gc_period)?,
        cache_refresh_period: period("gc.cache_refresh_period", &g.cache_refresh_period)?,
        node_status_max_images,
        sandbox_image: g.sandbox_image,
        pinned_images: g.pinned_images,
        keep_newest_tags_per_repo: keep,
        metrics: Metrics::default(),
    })
}

/// The `[credentials]` section: search directories (the kubelet's order
/// from `root_dir` unless given), cache period, plugins.
fn credentials_from_raw(c: RawCredentials) -> Result<NodeCredentialSettings, ConfigError> {
    let dirs = |key: &str, list: &[String]| -> Result<Vec<PathBuf>, ConfigError> {
        list.iter()
            .map(|d| {
                if d.trim().is_empty() {
                    Err(invalid(key, d, "a directory path must not be empty"))
                } else {
                    Ok(PathBuf::from(d))
                }
            })
            .collect()
    };
    let needs_root = c.config_json_dirs.is_none() || c.dockercfg_dirs.is_none();
    if needs_root && c.root_dir.trim().is_empty() {
        return Err(invalid(
            "credentials.root_dir",
            &c.root_dir,
            "must be a directory path (searched first for config.json and .dockercfg)",
        ));
    }
    let default = DockerConfigSearch::kubelet_default(std::path::Path::new(&c.root_dir));
    let search = DockerConfigSearch {
        config_json_dirs: match &c.config_json_dirs {
            Some(list) => dirs("credentials.config_json_dirs", list)?,
            None => default.config_json_dirs,
        },
        dockercfg_dirs: match &c.dockercfg_dirs {
            Some(list) => dirs("credentials.dockercfg_dirs", list)?,
            None => default.dockercfg_dirs,
        },
    };
    let cache_period = duration("credentials.cache_period", &c.cache_period)?;
    let provider_timeout = duration("credentials.provider_timeout", &c.provider_timeout)?;
    if provider_timeout.is_zero() {
        return Err(invalid("credentials.provider_timeout", &c.provider_timeout, "must be more than 0s"));
    }
    let path = |s: &str| (!s.trim().is_empty()).then(|| PathBuf::from(s));
    let (provider_config, provider_bin_dir) = (path(&c.provider_config), path(&c.provider_bin_dir));
    match (&provider_config, &provider_bin_dir) {
        (None, Some(_)) => {
            return Err(invalid(
                "credentials.provider_config",
                &c.provider_config,
                "credential provider config path is empty (required when credentials.provider_bin_dir is set)",
            ));
        }
        (Some(_), None) => {
            return Err(invalid(
                "credentials.provider_bin_dir",
                &c.provider_bin_dir,
                "the plugin binary directory is required when credentials.provider_config is set",
            ));
        }
        _ => {}
    }
    Ok(NodeCredentialSettings {
        search,
        cache_period,
        provider_config,
        provider_bin_dir,
        provider_timeout,
        metrics: crate::metrics::Metrics::default(),
    })
}

fn metrics_address(d: &RawDaemon) -> Result<Option<std::net::SocketAddr>, ConfigError> {
    let key = "daemon.metrics_address";
    let text = d.metrics_address.trim();
    if text.is_empty() {
        return Ok(None);
    }
    let addr: std::net::SocketAddr = text.parse().map_err(|_| {
        invalid(key, text, "not an IP address and port; write e.g. \"127.0.0.1:9464\" or \"[::1]:9464\" (\"\" = off)")
    })?;
    if !addr.ip().is_loopback() && !d.metrics_allow_non_loopback {
        return Err(invalid(
            key,
            text,
            "not a loopback address: /metrics, /healthz and /readyz would be reachable from the network; \
             use 127.0.0.1 or ::1, or set daemon.metrics_allow_non_loopback = true",
        ));
    }
    Ok(Some(addr))
}

/// The kubelet's `imagePullCredentialsVerificationPolicy` and
/// `preloadedImagesVerificationAllowlist`, with its texts.
fn verification_from_raw(v: RawCredentialVerification) -> Result<crate::pull_records::VerifyPolicy, ConfigError> {
    use crate::pull_records::{Allowlist, VerificationPolicy, VerifyPolicy};
    let policy: VerificationPolicy = v.policy.parse().map_err(|e: crate::pull_records::UnknownPolicy| {
        invalid("credential_verification.policy", &v.policy, e.to_string())
    })?;
    for p in &v.allowlist {
        Allowlist::new(std::slice::from_ref(p))
            .map_err(|e| invalid("credential_verification.allowlist", p, e.to_string()))?;
    }
    let allowlist = Allowlist::new(&v.allowlist)
        .map_err(|e| invalid("credential_verification.allowlist", &v.allowlist.join(","), e.to_string()))?;
    Ok(VerifyPolicy { policy, allowlist })
}

fn backoff_from_raw(b: RawBackoff) -> Result<BackoffSettings, ConfigError> {
    let initial = duration("backoff.initial", &b.initial)?;
    let max = duration("backoff.max", &b.max)?;
    let backoff = BackoffConfig::try_new(initial, max)
        .map_err(|e| invalid("backoff.initial/backoff.max", &format!("{}/{}", b.initial, b.max), e.to_string()))?;
    let gc = duration("backoff.gc_interval", &b.gc_interval)?;
    let mailbox_capacity =
        usize::try_from(b.mailbox_capacity).ok().filter(|c| (1..=1_000_000).contains(c)).ok_or_else(|| {
            invalid("backoff.mailbox_capacity", &b.mailbox_capacity.to_string(), "must be from 1 to 1000000")
        })?;
    Ok(BackoffSettings {
        backoff,
        gc_interval: if gc.is_zero() { None } else { Some(gc) },
        mailbox_capacity,
        metrics: Metrics::default(),
    })
}

/// A value the KubeletConfiguration set (and nothing later overrode) that
/// imaged's validation refused: name the file and the kubelet's field.
fn blame_kubelet_field(
    e: ConfigError,
    k: &crate::kubelet_config::KubeletImageFields,
    sources: &Sources,
) -> ConfigError {
    let ConfigError::Invalid { key, value, reason } = &e else { return e };
    let Some((_, _, field)) = k.overrides().into_iter().find(|(k, _, _)| key == k) else { return e };
    let env_name = format!("IMAGED_{}", key.replace('.', "__").to_uppercase());
    let overridden = sources.env.as_ref().is_some_and(|env| env.contains_key(&env_name))
        || sources.overrides.iter().any(|o| o.split_once('=').is_some_and(|(k, _)| k.trim() == key));
    if overridden {
        return e;
    }
    crate::kubelet_config::KubeletConfigError::Field {
        file: k.file.clone(),
        field: field.to_string(),
        reason: format!("{value}: {reason} (imaged key {key})"),
    }
    .into()
}

fn invalid(key: &str, value: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid { key: key.to_string(), value: value.to_string(), reason: reason.into() }
}

/// Parses a duration (`500ms`, `2m`, `1h30m`), naming the key on failure.
pub fn duration(key: &str, v: &str) -> Result<Duration, ConfigError> {
    let d = humantime::parse_duration(v.trim())
        .map_err(|e| invalid(key, v, format!("not a duration ({e}); write e.g. \"500ms\", \"10s\", \"2m\"")))?;
    crate::domain::limits::check_duration(d, || v.trim().to_string()).map_err(|e| invalid(key, v, e.reason()))
}

#[cfg(test)]
mod tests;
