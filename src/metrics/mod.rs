//! Metrics: one cloneable [`Metrics`] handle over a `prometheus-client`
//! registry holding every family imaged exports, all under the `imaged_`
//! prefix: the kubelet's image metrics (same labels, buckets and label
//! values, `kubelet_` replaced by `imaged_`) and imaged's own (pull queue,
//! CRI calls, back-off, GC).
//!
//! Actors get the handle through their settings (`metrics` fields with a
//! default) or `with_metrics` builders; [`Metrics::default`] is a private
//! registry nobody scrapes, so code that never exports pays a few
//! allocations once and an atomic add per event.
//!
//! The hot paths (a CRI call, an ensure of a present image) cost at most an
//! atomic add and one histogram observe: per-method handles are resolved
//! when the registry is built, not looked up per call.

#[cfg(test)]
mod tests;

use std::fmt;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

use crate::cri::{CriError, Rpc};
use crate::domain::pull_policy::PullPolicy;
use crate::domain::pull_record::MustPullResult;

/// The content type of [`Metrics::encode`]'s text (OpenMetrics 1.0, which
/// Prometheus scrapes natively).
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The kubelet's `image_pull_duration_seconds` buckets (seconds).
pub const PULL_DURATION_BUCKETS: [f64; 18] = [
    1.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 180.0, 240.0, 300.0, 360.0, 480.0, 600.0, 900.0, 1200.0, 1800.0, 2700.0,
    3600.0,
];

/// CRI call latency buckets (seconds): sub-millisecond lookups to ten-minute pulls.
pub const CRI_DURATION_BUCKETS: [f64; 18] =
    [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 600.0];

/// The credential provider plugin duration buckets (Prometheus' defaults, as the kubelet).
pub const PLUGIN_DURATION_BUCKETS: [f64; 11] = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

type Labels1 = [(&'static str, &'static str); 1];
type Labels2 = [(&'static str, &'static str); 2];
type Labels3 = [(&'static str, &'static str); 3];
type OwnedLabels1 = [(&'static str, String); 1];
type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

/// The kubelet's `image_size_in_bytes` label for an image of `size` bytes:
/// `N/A` for 0 (size unknown), else the range it falls in (MB and GB are
/// 2^20 and 2^30 bytes; a size exactly on a boundary belongs to the lower range).
pub fn image_size_bucket(size: u64) -> &'static str {
    const MB: u64 = 1 << 20;
    const GB: u64 = 1 << 30;
    const RANGES: [(u64, &str); 12] = [
        (100 * GB, "GT100GB"),
        (60 * GB, "60GB-100GB"),
        (40 * GB, "40GB-60GB"),
        (30 * GB, "30GB-40GB"),
        (20 * GB, "20GB-30GB"),
        (10 * GB, "10GB-20GB"),
        (5 * GB, "5GB-10GB"),
        (GB, "1GB-5GB"),
        (500 * MB, "500MB-1GB"),
        (100 * MB, "100MB-500MB"),
        (10 * MB, "10MB-100MB"),
        (0, "0-10MB"),
    ];
    if size == 0 {
        return "N/A";
    }
    RANGES.iter().find(|(lower, _)| size > *lower).map_or("0-10MB", |(_, label)| label)
}

/// A tri-state label value (`true`, `false`, `unknown`) as the kubelet's
/// `present_locally` and `pull_required` use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Tristate {
    /// Not determined (the request ended before it was known).
    #[default]
    Unknown,
    /// Yes.
    True,
    /// No.
    False,
}

impl Tristate {
    fn index(self) -> usize {
        self as usize
    }

    fn label(self) -> &'static str {
        match self {
            Tristate::Unknown => "unknown",
            Tristate::True => "true",
            Tristate::False => "false",
        }
    }
}

impl From<bool> for Tristate {
    fn from(b: bool) -> Self {
        if b { Tristate::True } else { Tristate::False }
    }
}

/// Counts one `EnsureImageExists` request when dropped (the kubelet's
/// deferred increment), with whatever was learnt by then.
#[derive(Debug)]
pub struct EnsureTally<'a> {
    metrics: &'a Metrics,
    policy: usize,
    /// Whether the image was found locally.
    pub present_locally: Tristate,
    /// Whether a pull was required.
    pub pull_required: Tristate,
}

impl Drop for EnsureTally<'_> {
    fn drop(&mut self) {
        let inner = &self.metrics.inner;
        let (present, required) = (self.present_locally, self.pull_required);
        let cell = self.policy * 9 + present.index() * 3 + required.index();
        // Resolved once per label combination: later requests cost an atomic add.
        let counter = inner.ensure_cells[cell].get_or_init(|| {
            inner.ensure_requests.get_or_create_owned(&[
                ("pull_policy", POLICY_LABELS[self.policy]),
                ("present_locally", present.label()),
                ("pull_required", required.label()),
            ])
        });
        counter.inc();
    }
}

/// `pull_policy` label values, indexed as [`policy_index`].
const POLICY_LABELS: [&str; 4] = ["always", "ifnotpresent", "never", "alwayswithlocalfallback"];

fn policy_index(policy: PullPolicy) -> usize {
    match policy {
        PullPolicy::Always => 0,
        PullPolicy::IfNotPresent => 1,
        PullPolicy::Never => 2,
        PullPolicy::AlwaysWithLocalFallback => 3,
    }
}

/// Why back-offs ended before their time (`imaged_backoff_resets_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackoffResetReason {
    /// An operator's `ClearBackoff`.
    Cleared,
    /// The pod's credentials changed since its last failed pull.
    CredentialsChanged,
    /// A pull from the registry its transient failure waited for succeeded.
    RegistryRecovered,
}

impl BackoffResetReason {
    /// The `reason` label value.
    pub fn label(self) -> &'static str {
        match self {
            Self::Cleared => "cleared",
            Self::CredentialsChanged => "credentials_changed",
            Self::RegistryRecovered => "registry_recovered",
        }
    }
}

struct Inner {
    registry: Registry,
    // The kubelet's families.
    pull_duration: HistogramFamily<Labels1>,
    garbage_collected: Family<Labels1, Counter>,
    ensure_requests: Family<Labels3, Counter>,
    /// `ensure_requests` counters by (policy, present, required), resolved on first use.
    ensure_cells: [OnceLock<Counter>; 4 * 3 * 3],
    mustpull_checks: Family<Labels1, Counter>,
    /// `mustpull_checks` counters by [`MustPullResult::index`], resolved on first use.
    mustpull_cells: [OnceLock<Counter>; MustPullResult::ALL.len()],
    plugin_duration: Family<OwnedLabels1, Histogram, fn() -> Histogram>,
    plugin_errors: Family<OwnedLabels1, Counter>,
    provider_config_info: Family<OwnedLabels1, Gauge>,
    // The pull queue.
    queue_depth: Gauge,
    queue_parked: Gauge,
    pulls_in_flight: Gauge,
    single_flight_joins: Counter,
    throttle_waits: Counter,
    throttle_rejections: Counter,
    slow_pulls: Counter,
    // Back-off.
    backoff_entries: Gauge,
    backoff_resets: Family<Labels1, Counter>,
    // CRI, resolved per method at construction (index: `Rpc as usize`).
    cri_duration: [Histogram; Rpc::ALL.len()],
    cri_errors: Family<Labels2, Counter>,
    // GC.
    gc_runs: Family<Labels1, Counter>,
    gc_bytes_freed: Counter,
    // Info.
    config_info: Family<Vec<(&'static str, String)>, Gauge>,
}

/// The metrics handle: cheap to clone (an `Arc`), shared by every actor of
/// one imaged instance. See the module docs for the families.
///
/// Equality: every handle compares equal, so settings structs that carry
/// one stay comparable by their real settings.
#[derive(Clone)]
pub struct Metrics {
    inner: Arc<Inner>,
}

impl fmt::Debug for Metrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Metrics { .. }")
    }
}

impl PartialEq for Metrics {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for Metrics {}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A fresh registry with every family registered (and `build_info` set).
    pub fn new() -> Self {
        let mut r = Registry::with_prefix("imaged");
        let pull_duration: HistogramFamily<Labels1> =
            Family::new_with_constructor(|| Histogram::new(PULL_DURATION_BUCKETS));
        r.register_with_unit(
            "image_pull_duration",
            "Duration of successful image pulls, including waiting in the queue, by image size (the kubelet's image_pull_duration_seconds)",
            Unit::Seconds,
            pull_duration.clone(),
        );
        let garbage_collected = Family::<Labels1, Counter>::default();
        r.register(
            "image_garbage_collected",
            "Images removed by image garbage collection, by reason (age, space, or imaged's retention)",
            garbage_collected.clone(),
        );
        let ensure_requests = Family::<Labels3, Counter>::default();
        r.register(
            "image_manager_ensure_image_requests",
            "EnsureImageExists requests by pull policy, whether the image was present and whether a pull was required",
            ensure_requests.clone(),
        );
        let mustpull_checks = Family::<Labels1, Counter>::default();
        r.register(
            "imagemanager_image_mustpull_checks",
            "Checks whether a present image must be pulled again to verify the pod's credentials, by result",
            mustpull_checks.clone(),
        );
        let plugin_duration: Family<OwnedLabels1, Histogram, fn() -> Histogram> =
            Family::new_with_constructor(|| Histogram::new(PLUGIN_DURATION_BUCKETS));
        r.register(
            "credential_provider_plugin_duration",
            "Duration of credential provider plugin executions in seconds, by plugin",
            plugin_duration.clone(),
        );
        let plugin_errors = Family::<OwnedLabels1, Counter>::default();
        r.register(
            "credential_provider_plugin_errors",
            "Failed credential provider plugin executions, by plugin",
            plugin_errors.clone(),
        );
        let provider_config_info = Family::<OwnedLabels1, Gauge>::default();
        r.register(
            "credential_provider_config_info",
            "The hash of the credential provider configuration in use (value 1)",
            provider_config_info.clone(),
        );
        let queue_depth = Gauge::default();
        r.register("pull_queue_depth", "Pulls waiting in the pull queue for their turn", queue_depth.clone());
        let queue_parked = Gauge::default();
        r.register("pull_queue_parked", "Pull requests waiting for room in a full pull queue", queue_parked.clone());
        let pulls_in_flight = Gauge::default();
        r.register("pulls_in_flight", "Pulls running now", pulls_in_flight.clone());
        let single_flight_joins = Counter::default();
        r.register(
            "pull_single_flight_joins",
            "Pull requests that joined a pull of the same image already queued or running",
            single_flight_joins.clone(),
        );
        let throttle_waits = Counter::default();
        r.register(
            "pull_throttle_waits",
            "Pulls that waited for a registry throttle token (throttle_mode wait)",
            throttle_waits.clone(),
        );
        let throttle_rejections = Counter::default();
        r.register(
            "pull_throttle_rejections",
            "Pulls failed with \"pull QPS exceeded\" (throttle_mode fail)",
            throttle_rejections.clone(),
        );
        let slow_pulls = Counter::default();
        r.register(
            "pull_slow_blocking",
            "Pulls still running after pull.slow_pull_warning while other pulls waited (warned once per pull)",
            slow_pulls.clone(),
        );
        let backoff_entries = Gauge::default();
        r.register("backoff_entries", "Pod and image pairs held in the pull back-off table", backoff_entries.clone());
        let backoff_resets = Family::<Labels1, Counter>::default();
        r.register(
            "backoff_resets",
            "Back-offs ended before their time, by reason: cleared (ClearBackoff), credentials_changed, registry_recovered",
            backoff_resets.clone(),
        );
        let cri_duration_family: HistogramFamily<Labels1> =
            Family::new_with_constructor(|| Histogram::new(CRI_DURATION_BUCKETS));
        r.register_with_unit(
            "cri_request_duration",
            "Duration of CRI calls, by method, successful or not",
            Unit::Seconds,
            cri_duration_family.clone(),
        );
        let cri_duration = Rpc::ALL.map(|rpc| cri_duration_family.get_or_create_owned(&[("method", rpc.name())]));
        let cri_errors = Family::<Labels2, Counter>::default();
        r.register("cri_request_errors", "Failed CRI calls, by method and gRPC code", cri_errors.clone());
        let gc_runs = Family::<Labels1, Counter>::default();
        r.register("image_gc_runs", "Image garbage collection runs (not dry runs), by result", gc_runs.clone());
        let gc_bytes_freed = Counter::default();
        r.register_with_unit(
            "image_gc_freed",
            "Bytes image garbage collection freed: the sizes of the images it removed",
            Unit::Bytes,
            gc_bytes_freed.clone(),
        );
        let build_info = Family::<OwnedLabels1, Gauge>::default();
        r.register("build_info", "imaged's version (value 1)", build_info.clone());
        build_info.get_or_create(&[("version", env!("CARGO_PKG_VERSION").to_string())]).set(1);
        let config_info = Family::<Vec<(&'static str, String)>, Gauge>::default();
        r.register("config_info", "Key settings of the running configuration (value 1)", config_info.clone());
        Self {
            inner: Arc::new(Inner {
                registry: r,
                pull_duration,
                garbage_collected,
                ensure_requests,
                ensure_cells: std::array::from_fn(|_| OnceLock::new()),
                mustpull_checks,
                mustpull_cells: std::array::from_fn(|_| OnceLock::new()),
                plugin_duration,
                plugin_errors,
                provider_config_info,
                queue_depth,
                queue_parked,
                pulls_in_flight,
                single_flight_joins,
                throttle_waits,
                throttle_rejections,
                slow_pulls,
                backoff_entries,
                backoff_resets,
                cri_duration,
                cri_errors,
                gc_runs,
                gc_bytes_freed,
                config_info,
            }),
        }
    }

    /// Every family in the Prometheus/OpenMetrics text format ([`CONTENT_TYPE`]).
    pub fn encode(&self) -> String {
        let mut out = String::with_capacity(8 * 1024);
        // Writing to a String cannot fail; the encoder reports only the writer's errors.
        if encode(&mut out, &self.inner.registry).is_err() {
            out.clear();
        }
        out
    }

    /// True when both handles share one registry.
    pub fn same_registry(&self, other: &Metrics) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    // === the kubelet's ===

    /// A successful pull took `total` (including waiting) for an image of `size` bytes.
    pub fn image_pulled(&self, size: u64, total: Duration) {
        self.inner
            .pull_duration
            .get_or_create(&[("image_size_in_bytes", image_size_bucket(size))])
            .observe(total.as_secs_f64());
    }

    /// GC removed an image of `size` bytes for `reason` (`age`, `space`, `retention`).
    pub fn image_garbage_collected(&self, reason: &'static str, size: u64) {
        self.inner.garbage_collected.get_or_create(&[("reason", reason)]).inc();
        self.inner.gc_bytes_freed.inc_by(size);
    }

    /// Starts counting one `EnsureImageExists` request; counted when the tally drops.
    pub fn ensure_request(&self, policy: PullPolicy) -> EnsureTally<'_> {
        EnsureTally {
            metrics: self,
            policy: policy_index(policy),
            present_locally: Tristate::Unknown,
            pull_required: Tristate::Unknown,
        }
    }

    /// A must-pull check ended with `result` (an atomic add once the
    /// result's series exists).
    pub fn mustpull_check(&self, result: MustPullResult) {
        let inner = &self.inner;
        inner.mustpull_cells[result.index()]
            .get_or_init(|| inner.mustpull_checks.get_or_create_owned(&[("result", result.as_str())]))
            .inc();
    }

    /// A credential provider plugin ran for `took`, failing when `failed`.
    pub fn credential_plugin_ran(&self, plugin: &str, took: Duration, failed: bool) {
        let labels = [("plugin_name", plugin.to_string())];
        self.inner.plugin_duration.get_or_create(&labels).observe(took.as_secs_f64());
        if failed {
            self.inner.plugin_errors.get_or_create(&labels).inc();
        }
    }

    /// The credential provider configuration's hash (`sha256:<hex>`); replaces any earlier one.
    pub fn set_credential_provider_config(&self, hash: &str) {
        self.inner.provider_config_info.clear();
        self.inner.provider_config_info.get_or_create(&[("hash", hash.to_string())]).set(1);
    }

    // === pull queue ===

    /// The pull queue's depths now.
    pub fn set_pull_queue(&self, queued: usize, parked: usize, running: usize) {
        let g = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        self.inner.queue_depth.set(g(queued));
        self.inner.queue_parked.set(g(parked));
        self.inner.pulls_in_flight.set(g(running));
    }

    /// A request joined a pull already queued or running.
    pub fn single_flight_joined(&self) {
        self.inner.single_flight_joins.inc();
    }

    /// A pull waited for a throttle token.
    pub fn throttle_waited(&self) {
        self.inner.throttle_waits.inc();
    }

    /// A pull ran past `pull.slow_pull_warning` while others waited.
    pub fn slow_pull_blocking(&self) {
        self.inner.slow_pulls.inc();
    }

    /// A pull was failed by the throttle.
    pub fn throttle_rejected(&self) {
        self.inner.throttle_rejections.inc();
    }

    // === back-off ===

    /// Entries in the back-off table now.
    pub fn set_backoff_entries(&self, n: usize) {
        self.inner.backoff_entries.set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// `n` back-offs ended before their time for `reason`.
    pub fn backoff_reset(&self, reason: BackoffResetReason, n: usize) {
        if n > 0 {
            self.inner.backoff_resets.get_or_create(&[("reason", reason.label())]).inc_by(n as u64);
        }
    }

    // === CRI ===

    /// A CRI call ended after `took`; counted as an error when `error` is set.
    /// Costs one histogram observe, plus a labelled counter for errors.
    pub fn cri_call(&self, rpc: Rpc, took: Duration, error: Option<&CriError>) {
        self.inner.cri_duration[rpc as usize].observe(took.as_secs_f64());
        if let Some(e) = error {
            self.inner.cri_errors.get_or_create(&[("method", rpc.name()), ("code", e.code().go_name())]).inc();
        }
    }

    // === GC ===

    /// A GC run (not a dry run) ended, well or not.
    pub fn gc_run(&self, ok: bool) {
        self.inner.gc_runs.get_or_create(&[("result", if ok { "success" } else { "failure" })]).inc();
    }

    // === info ===

    /// Publishes the key settings (from [`Config::info_labels`](crate::config::Config::info_labels))
    /// as `imaged_config_info` labels, replacing the last ones.
    pub fn set_config_info(&self, labels: &[(&'static str, String)]) {
        let labels = labels.to_vec();
        self.inner.config_info.clear();
        self.inner.config_info.get_or_create(&labels).set(1);
    }
}
