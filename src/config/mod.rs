//! Configuration: loading (file → `IMAGED_*` environment → flags) into a raw
//! form, then validating into typed values.
//!
//! The defaults are `config/default.toml`, compiled into the binary, so the
//! documented file and the running defaults cannot drift apart. Loading is
//! separate from validation so tests feed plain strings and maps.

use std::collections::HashMap;
use std::path::PathBuf;

mod credentials;
mod daemon;
mod effective;
mod gc;
mod prefetch;
mod pull;
mod raw;
mod runtime;
mod schema;
mod state;
mod values;

pub use daemon::{CriServerSettings, DaemonSettings, PRIORITY_NAMESPACE_PULL, PriorityRule};
pub use effective::{Effective, Origin, changed_keys, same_meaning};
pub use gc::GcSettings;
pub use prefetch::PrefetchSettings;
pub use runtime::{LogFormat, LogSettings, RuntimeEndpoint};
pub use state::{MEMORY as STATE_IN_MEMORY, SYSTEM_DIR as DEFAULT_STATE_DIR};
pub use values::duration;

use raw::RawConfig;
use values::blame_kubelet_field;

use crate::actors::backoff_registry::BackoffSettings;
use crate::actors::cri_gateway::CriSettings;
use crate::actors::pull_queue::PullQueueSettings;
use crate::credentials::NodeCredentialSettings;
use crate::ensure::EnsureSettings;
use crate::metrics::Metrics;

/// The documented defaults (`config/default.toml`).
pub const DEFAULT_TOML: &str = include_str!("../../config/default.toml");

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
    /// A key imaged does not have.
    #[error("configuration: unknown key {key} ({origin}); {hint}")]
    UnknownKey {
        /// Dotted key as given (`gc.bogus`).
        key: String,
        /// Where: `FILE, line N`, `--set k=v`, `environment IMAGED_K`.
        origin: String,
        /// The keys that exist there.
        hint: String,
    },
    /// Two flags set one key to different values.
    #[error("configuration: {0}")]
    Conflict(String),
    /// The n-th `--set` override (from 1) is not `key=value`; its text is
    /// not echoed (it may be a secret given without its key).
    #[error("configuration: --set number {0} has no \"=\": give key=value")]
    BadOverride(usize),
    /// The `--kubelet-config` file cannot be used (names the file and field).
    #[error("configuration: {0}")]
    Kubelet(#[from] crate::kubelet_config::KubeletConfigError),
    /// The credential-provider plugins (`credentials.provider_config`,
    /// `credentials.provider_bin_dir`) cannot be registered: the kubelet's
    /// text, which stops the kubelet at start too.
    #[error("configuration: Failed to register CRI auth plugins: {0}")]
    CredentialProviders(String),
}

impl From<config::ConfigError> for ConfigError {
    fn from(e: config::ConfigError) -> Self {
        ConfigError::Load(e.to_string())
    }
}

/// The validated configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Where the runtime is.
    pub endpoint: RuntimeEndpoint,
    /// CRI gateway settings.
    pub cri: CriSettings,
    /// Pull queue settings.
    pub pull: PullQueueSettings,
    /// Ensure-flow settings.
    pub ensure: EnsureSettings,
    /// Backoff registry settings.
    pub backoff: BackoffSettings,
    /// Image GC settings.
    pub gc: GcSettings,
    /// KEP-2535: when a present image needs the pod's credentials verified
    /// (`credential_verification.policy` and `.allowlist`).
    pub verification: crate::pull_records::VerifyPolicy,
    /// Directory of durable state (`None` = memory only); `state.dir`
    /// unset resolves to a durable default unless the runtime is the
    /// in-process embedded one (see `config/default.toml`).
    pub state_dir: Option<PathBuf>,
    /// Where the embedded runtime keeps its images across restarts
    /// (`runtime.embedded_state_dir`; `None` = memory only). Used only
    /// with [`RuntimeEndpoint::Embedded`].
    pub embedded_state_dir: Option<PathBuf>,
    /// A fault plan file (TOML, see `fault::FaultPlan::from_toml`) applied
    /// at the CRI gateway; `None` = no faults.
    pub fault_plan: Option<PathBuf>,
    /// The daemon's settings (`imaged run`).
    pub daemon: DaemonSettings,
    /// The CRI front (`imaged run` serving the kubelet's image calls).
    pub cri_server: CriServerSettings,
    /// Logging.
    pub log: LogSettings,
    /// Node credentials: docker config files and credential-provider plugins.
    pub credentials: NodeCredentialSettings,
    /// The declared prefetch list (`[prefetch]`); with `keep`, its images
    /// are also in `gc.pinned_images`.
    pub prefetch: PrefetchSettings,
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

    /// This configuration with plugins in service-account token mode
    /// (KEP-4412) getting service accounts and pod-bound tokens from the
    /// embedder's `source` (instead of `credentials.kubeconfig`).
    #[must_use]
    pub fn with_token_source(
        mut self,
        source: std::sync::Arc<dyn crate::credentials::ServiceAccountTokenSource>,
    ) -> Self {
        self.credentials.token_source = Some(crate::credentials::node::TokenSourceHandle(source));
        self
    }

    /// This configuration with credential-provider plugins run by
    /// `runner` instead of as child processes: an embedder's stand-in for
    /// the executables (the simulator's, whose node cannot fork on its one
    /// paused thread). `credentials.provider_config` and `provider_bin_dir`
    /// are read and checked as always.
    #[must_use]
    pub fn with_plugin_runner(mut self, runner: std::sync::Arc<dyn crate::credentials::PluginRunner>) -> Self {
        self.credentials.plugin_runner = Some(crate::credentials::node::PluginRunnerHandle(runner));
        self
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

    /// What validation alone cannot tell: the socket groups
    /// (`daemon.socket_group`, and `cri_server.socket_group` when the CRI
    /// socket is served) exist on this host. `check-config` and `run`
    /// check it before anything starts.
    pub fn check_on_host(&self) -> Result<(), ConfigError> {
        daemon::group_exists("daemon.socket_group", self.daemon.socket_group.as_deref())?;
        if self.cri_server.socket.is_some() {
            daemon::group_exists("cri_server.socket_group", self.cri_server.socket_group.as_deref())?;
        }
        Ok(())
    }

    /// The built-in defaults.
    pub fn defaults() -> Result<Self, ConfigError> {
        Self::load(&Sources::default())
    }

    /// Loads and validates from `sources`.
    pub fn load(sources: &Sources) -> Result<Self, ConfigError> {
        Self::load_full(sources).map(|l| l.config)
    }

    /// Loads and validates from `sources`, keeping what `check-config`
    /// prints (every key's effective value and origin) and what the
    /// sources held that imaged ignores (unknown KubeletConfiguration
    /// fields, to log once logging is set up: [`Loaded::warn`]).
    pub fn load_full(sources: &Sources) -> Result<Loaded, ConfigError> {
        let mut b =
            config::Config::builder().add_source(config::File::from_str(DEFAULT_TOML, config::FileFormat::Toml));
        let mut file_text = None;
        if let Some(path) = &sources.file {
            // Read here first: a TOML error (an integer past 64 bits, a
            // broken line) then names its key and line, which the config
            // crate's message does not.
            // A device, FIFO or runaway file is refused before anything
            // reads it; a missing one is the config crate's to report.
            match crate::files::read_to_string(path, crate::files::CONFIG_FILE_LIMIT) {
                Ok(text) => {
                    values::check_toml(&text, &path.display().to_string(), true)?;
                    file_text = Some(text);
                }
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(ConfigError::Load(format!("{}: {e}", path.display()))),
            }
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
        if sources.env.is_some() {
            // Only IMAGED_<SECTION>__<KEY> variables are configuration; other
            // IMAGED_* variables (used by tests and tools) are left alone,
            // but one that names a section with one underscore is a
            // configuration variable mistyped, not silently nothing.
            if let Some(e) = single_underscore_var(sources) {
                return Err(e);
            }
            // Each value is text, read as its key's type.
            b = b.add_source(schema::EnvSource::new(&env_settings(sources))?);
        }
        for (i, o) in sources.overrides.iter().enumerate() {
            let (k, v) = o.split_once('=').ok_or(ConfigError::BadOverride(i + 1))?;
            let (k, v) = (k.trim(), v.trim());
            // Where it was given, without the value: a mistyped key, or one
            // inside a table value, may carry what should not reach a
            // terminal or a log (a password given under the wrong name).
            // A known key's bad value is named by its own error.
            b = b.set_override(k, schema::typed(k, v, &format!("--set {k}=…"))?)?;
        }
        let raw: RawConfig = b.build()?.try_deserialize()?;
        let effective = Effective::new(&raw, sources, file_text.as_deref(), kubelet.as_ref())?;
        let config = Self::from_raw(raw)
            .map_err(|e| match &kubelet {
                Some(k) => blame_kubelet_field(e, k, sources),
                None => e,
            })
            .map_err(|e| values::locate_invalid(e, &effective, file_text.as_deref()))?;
        Ok(Loaded { config, kubelet, effective })
    }

    /// Loads from a TOML string layered over the defaults (for tests).
    pub fn from_toml(toml: &str) -> Result<Self, ConfigError> {
        values::check_toml(toml, "TOML", false)?;
        let raw: RawConfig = config::Config::builder()
            .add_source(config::File::from_str(DEFAULT_TOML, config::FileFormat::Toml))
            .add_source(config::File::from_str(toml, config::FileFormat::Toml))
            .build()?
            .try_deserialize()?;
        Self::from_raw(raw)
    }

    fn from_raw(raw: RawConfig) -> Result<Self, ConfigError> {
        let endpoint = runtime::endpoint_from_raw(&raw.runtime)?;
        let fault_plan = raw.runtime.fault_plan.clone();
        let embedded_state_dir = runtime::embedded_state_dir_from_raw(&raw.runtime.embedded_state_dir)?;
        let cri = runtime::cri_from_raw(raw.runtime)?;
        let log = runtime::log_from_raw(raw.log)?;
        let (pull, mut ensure) = pull::pull_from_raw(raw.pull)?;
        ensure.reset_backoff_on_credential_change = raw.backoff.reset_on_credential_change;
        ensure.reset_backoff_on_registry_recovery = raw.backoff.reset_on_registry_recovery;
        let backoff = pull::backoff_from_raw(raw.backoff)?;
        let mut gc = gc::gc_from_raw(raw.gc)?;
        let prefetch = prefetch::prefetch_from_raw(raw.prefetch)?;
        if prefetch.keep {
            for image in &prefetch.images {
                if !gc.pinned_images.contains(image) {
                    gc.pinned_images.push(image.clone());
                }
            }
        }
        let verification = credentials::verification_from_raw(raw.credential_verification)?;
        let credentials = credentials::credentials_from_raw(raw.credentials)?;
        let state_dir =
            state::state_dir_from_raw(&raw.state.dir, &endpoint, state::running_as_root(), &|k| std::env::var(k).ok())?;
        let daemon = daemon::daemon_from_raw(raw.daemon)?;
        let cri_server = daemon::cri_server_from_raw(raw.cri_server)?;
        if let (Some(front), RuntimeEndpoint::Cri(crate::cri::CriEndpoint::Unix(runtime))) =
            (&cri_server.socket, &endpoint)
            && front == runtime
        {
            return Err(values::invalid(
                "cri_server.socket",
                &front.display().to_string(),
                "is the runtime endpoint imaged forwards to (runtime.endpoint): imaged would call itself; \
                 point runtime.endpoint at the runtime (containerd) and the kubelet's imageServiceEndpoint here",
            ));
        }
        if cri_server.socket.as_ref().is_some_and(|front| *front == daemon.socket) {
            return Err(values::invalid(
                "cri_server.socket",
                &daemon.socket.display().to_string(),
                "is also daemon.socket: the CRI socket (the kubelet's imageServiceEndpoint) and imaged's API \
                 (imagectl's) need two paths",
            ));
        }
        let fault_plan = runtime::fault_plan_from_raw(&fault_plan)?;
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
            embedded_state_dir,
            fault_plan,
            daemon,
            cri_server,
            log,
            credentials,
            prefetch,
        }
        .with_metrics(&Metrics::default()))
    }
}

/// A configuration as loaded, with what `check-config` shows.
#[derive(Debug, Clone)]
pub struct Loaded {
    /// The validated configuration.
    pub config: Config,
    /// The `--kubelet-config` fields read, if one was given.
    pub kubelet: Option<crate::kubelet_config::KubeletImageFields>,
    /// Every key's effective value and where it came from.
    pub effective: Effective,
}

impl Loaded {
    /// Logs what the sources held that imaged ignores: fields of the
    /// KubeletConfiguration the kubelet does not know (the kubelet's own
    /// message, `Using lenient decoding as strict decoding failed`).
    pub fn warn(&self) {
        if let Some(k) = &self.kubelet {
            k.warn_unknown_fields();
        }
    }
}

/// The first `IMAGED_<SECTION>_<KEY>` variable of `sources`: a section of
/// `config/default.toml` and a key joined by one underscore where the
/// configuration's variables take two (`IMAGED_GC_GC_PERIOD` for
/// `IMAGED_GC__GC_PERIOD`), which the config crate would silently skip.
/// The error names the variable, never its value, and the name it meant.
fn single_underscore_var(sources: &Sources) -> Option<ConfigError> {
    let defaults: toml::Table = toml::from_str(DEFAULT_TOML).ok()?;
    let mut sections: Vec<&String> = defaults.iter().filter(|(_, v)| v.is_table()).map(|(k, _)| k).collect();
    // `cri_server_…` is cri_server's, not a `cri` section's.
    sections.sort_by_key(|s| std::cmp::Reverse(s.len()));
    let mut vars: Vec<&String> = sources.env.iter().flatten().map(|(k, _)| k).collect();
    vars.sort();
    vars.into_iter().find_map(|var| {
        let rest = var.strip_prefix("IMAGED_")?;
        if rest.contains("__") {
            return None;
        }
        let lower = rest.to_lowercase();
        let section = sections.iter().find(|s| lower.starts_with(&format!("{s}_")) && lower.len() > s.len() + 1)?;
        let (head, key) = rest.split_at(section.len());
        Some(ConfigError::Load(format!(
            "environment {var} is not a configuration variable: a section and its key are joined by two \
             underscores (IMAGED_{head}__{}, the key {section}.{})",
            &key[1..],
            key[1..].to_lowercase()
        )))
    })
}

/// The `IMAGED_<SECTION>__<KEY>` variables of `sources` (other `IMAGED_*`
/// variables are not configuration).
fn env_vars(sources: &Sources) -> impl Iterator<Item = (&str, &str)> {
    sources
        .env
        .iter()
        .flatten()
        .filter(|(k, _)| k.starts_with("IMAGED_") && k.contains("__"))
        .map(|(k, v)| (k.as_str(), v.as_str()))
}

/// Each configuration variable of `sources`, the dotted key it sets and
/// its value.
pub(super) fn env_settings(sources: &Sources) -> Vec<(String, String, String)> {
    let values: HashMap<&str, &str> = env_vars(sources).collect();
    env_keys(sources)
        .into_iter()
        .map(|(var, key)| {
            let value = values.get(var.as_str()).map(|v| (*v).to_string()).unwrap_or_default();
            (var, key, value)
        })
        .collect()
}

/// Each configuration variable of `sources` with the dotted key it sets
/// (`IMAGED_GC__GC_PERIOD` → `gc.gc_period`), as the config crate reads it.
fn env_keys(sources: &Sources) -> Vec<(String, String)> {
    env_vars(sources)
        .filter_map(|(var, _)| {
            let rest = var.strip_prefix("IMAGED_")?;
            Some((var.to_string(), rest.split("__").collect::<Vec<_>>().join(".").to_lowercase()))
        })
        .collect()
}

/// Reads and parses a fault plan file.
pub fn load_fault_plan(path: &std::path::Path) -> Result<crate::fault::FaultPlan, String> {
    let text = crate::files::read_to_string(path, crate::files::CONFIG_FILE_LIMIT).map_err(|e| e.to_string())?;
    crate::fault::FaultPlan::from_toml(&text)
}

#[cfg(test)]
mod tests;
