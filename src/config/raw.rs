//! The configuration as read: every section and key of `config/default.toml`,
//! unknown keys refused, before validation. `expecting` keeps the structs'
//! Rust names out of serde's messages.

use serde::{Deserialize, Serialize};

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, expecting = "a table of sections")]
pub(super) struct RawConfig {
    pub(super) runtime: RawRuntime,
    pub(super) pull: RawPull,
    pub(super) backoff: RawBackoff,
    pub(super) gc: RawGc,
    pub(super) credential_verification: RawCredentialVerification,
    pub(super) state: RawState,
    pub(super) daemon: RawDaemon,
    pub(super) cri_server: RawCriServer,
    pub(super) log: RawLog,
    pub(super) credentials: RawCredentials,
    pub(super) prefetch: RawPrefetch,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, expecting = "a table of settings")]
pub(super) struct RawPrefetch {
    pub(super) images: Vec<String>,
    pub(super) refresh: String,
    pub(super) keep: bool,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, expecting = "a table of settings")]
pub(super) struct RawCredentials {
    pub(super) root_dir: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) config_json_dirs: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) dockercfg_dirs: Option<Vec<String>>,
    pub(super) cache_period: String,
    pub(super) provider_config: String,
    pub(super) provider_bin_dir: String,
    pub(super) provider_timeout: String,
    pub(super) kubeconfig: String,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, expecting = "a table of settings")]
pub(super) struct RawCredentialVerification {
    pub(super) policy: String,
    pub(super) allowlist: Vec<String>,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, expecting = "a table of settings")]
pub(super) struct RawGc {
    pub(super) image_gc_high_threshold_percent: i64,
    pub(super) image_gc_low_threshold_percent: i64,
    pub(super) image_minimum_gc_age: String,
    pub(super) image_maximum_gc_age: String,
    pub(super) max_age_survives_restarts: bool,
    pub(super) detect_period: String,
    pub(super) gc_period: String,
    pub(super) pressure_check_period: String,
    pub(super) eviction_available: Vec<String>,
    pub(super) cache_refresh_period: String,
    pub(super) node_status_max_images: i64,
    pub(super) sandbox_image: String,
    pub(super) pinned_images: Vec<String>,
    pub(super) keep_newest_tags_per_repo: i64,
    pub(super) image_fs_capacity: i64,
    pub(super) detector_mailbox_capacity: i64,
    pub(super) executor_mailbox_capacity: i64,
    pub(super) refresher_mailbox_capacity: i64,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, expecting = "a table of settings")]
pub(super) struct RawDaemon {
    pub(super) socket: String,
    pub(super) socket_group: String,
    pub(super) shutdown_grace: String,
    pub(super) max_request_bytes: i64,
    pub(super) metrics_address: String,
    pub(super) metrics_allow_non_loopback: bool,
    pub(super) event_buffer: i64,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, expecting = "a table of settings")]
pub(super) struct RawState {
    pub(super) dir: String,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, expecting = "a table of settings")]
pub(super) struct RawPull {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) serialize_image_pulls: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) max_parallel_image_pulls: Option<i64>,
    pub(super) max_parallel_pulls_per_registry: i64,
    pub(super) presence_check_concurrency: i64,
    pub(super) presence_check_window: i64,
    pub(super) queue_capacity: i64,
    pub(super) registry_pull_qps: f64,
    pub(super) registry_burst: i64,
    pub(super) throttle_mode: String,
    pub(super) single_flight: bool,
    pub(super) pull_deadline: String,
    pub(super) slow_pull_warning: String,
    pub(super) stall_warning: String,
    pub(super) stall_timeout: String,
    pub(super) min_download_rate: String,
    pub(super) annotate_error_class: bool,
    pub(super) transient_retries: i64,
    pub(super) transient_retry_delay: String,
    pub(super) registries: Vec<RawRegistryRule>,
}

/// One `[[pull.registries]]` rule.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, expecting = "a [[pull.registries]] rule (a table of settings)")]
pub(super) struct RawRegistryRule {
    pub(super) registry: String,
    #[serde(default)]
    pub(super) qps: f64,
    #[serde(default)]
    pub(super) burst: i64,
    #[serde(default)]
    pub(super) max_parallel: i64,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, expecting = "a table of settings")]
pub(super) struct RawBackoff {
    pub(super) initial: String,
    pub(super) max: String,
    pub(super) gc_interval: String,
    pub(super) mailbox_capacity: i64,
    pub(super) reset_on_credential_change: bool,
    pub(super) reset_on_registry_recovery: bool,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, expecting = "a table of settings")]
pub(super) struct RawRuntime {
    pub(super) endpoint: String,
    pub(super) fault_plan: String,
    pub(super) embedded_socket: String,
    pub(super) embedded_state_dir: String,
    pub(super) connect_timeout: String,
    pub(super) startup_timeout: String,
    pub(super) mailbox_capacity: i64,
    pub(super) deadlines: RawDeadlines,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, expecting = "a table of settings")]
pub(super) struct RawDeadlines {
    pub(super) version: String,
    pub(super) list_images: String,
    pub(super) image_status: String,
    pub(super) pull_image: String,
    pub(super) remove_image: String,
    pub(super) image_fs_info: String,
    pub(super) list_containers: String,
    pub(super) list_pod_sandbox: String,
    pub(super) container_status: String,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, expecting = "a table of settings")]
pub(super) struct RawLog {
    pub(super) format: String,
    pub(super) filter: String,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, expecting = "a table of settings")]
pub(super) struct RawCriServer {
    pub(super) socket: String,
    pub(super) socket_group: String,
    pub(super) priority_namespaces: Vec<String>,
    pub(super) priority: Vec<RawPriorityRule>,
    pub(super) pin_sandbox_image: bool,
    pub(super) refuse_remove_pinned: bool,
    pub(super) refuse_remove_in_use: bool,
    pub(super) local_fallback_images: Vec<String>,
    pub(super) local_fallback_namespaces: Vec<String>,
    pub(super) read_cache_ttl: String,
}

/// One `[[cri_server.priority]]` rule.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, expecting = "a [[cri_server.priority]] rule (a table of settings)")]
pub(super) struct RawPriorityRule {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) namespace: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) label: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) annotation: Option<String>,
    pub(super) priority: i64,
}
