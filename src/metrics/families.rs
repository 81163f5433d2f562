//! The metric families, grouped as docs/metrics.md lists them: the
//! kubelet's image metrics, then imaged's own by the part that updates them
//! (pull queue, back-off, CRI, GC) and the info gauges. Each group registers
//! its families with their names and help texts; groups register in that
//! order, which is the order of the scrape.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

use super::labels::RemoveRefused;
use crate::cri::Rpc;
use crate::domain::pull_record::MustPullResult;

/// The kubelet's `image_pull_duration_seconds` buckets (seconds).
pub const PULL_DURATION_BUCKETS: [f64; 18] = [
    1.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 180.0, 240.0, 300.0, 360.0, 480.0, 600.0, 900.0, 1200.0, 1800.0, 2700.0,
    3600.0,
];

/// CRI call latency buckets (seconds): sub-millisecond lookups to ten-minute pulls.
pub const CRI_DURATION_BUCKETS: [f64; 18] =
    [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 600.0];

/// The kubelet's `runtime_operations_duration_seconds` buckets:
/// `metrics.ExponentialBuckets(.005, 2.5, 14)` (computed the same way).
fn runtime_operations_buckets() -> impl Iterator<Item = f64> {
    prometheus_client::metrics::histogram::exponential_buckets(0.005, 2.5, 14)
}

/// The credential provider plugin duration buckets (Prometheus' defaults, as the kubelet).
pub const PLUGIN_DURATION_BUCKETS: [f64; 11] = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

pub(super) type Labels1 = [(&'static str, &'static str); 1];
pub(super) type Labels2 = [(&'static str, &'static str); 2];
pub(super) type Labels3 = [(&'static str, &'static str); 3];
pub(super) type OwnedLabels1 = [(&'static str, String); 1];
pub(super) type MixedLabels2 = [(&'static str, std::borrow::Cow<'static, str>); 2];
pub(super) type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

/// The kubelet's image metrics (same names, labels and buckets, under `imaged_`).
pub(super) struct KubeletFamilies {
    pub(super) pull_duration: HistogramFamily<Labels1>,
    pub(super) garbage_collected: Family<Labels1, Counter>,
    pub(super) ensure_requests: Family<Labels3, Counter>,
    /// `ensure_requests` counters by (policy, present, required), resolved on first use.
    pub(super) ensure_cells: [std::sync::OnceLock<Counter>; 4 * 3 * 3],
    pub(super) mustpull_checks: Family<Labels1, Counter>,
    /// `mustpull_checks` counters by [`MustPullResult::index`], resolved on first use.
    pub(super) mustpull_cells: [std::sync::OnceLock<Counter>; MustPullResult::ALL.len()],
    /// `imagemanager_ondisk_pullintents`, `_pulledrecords`: read from the
    /// store at each scrape ([`super::Metrics::count_pull_records_in`]).
    pub(super) ondisk_intents: Gauge,
    pub(super) ondisk_records: Gauge,
    pub(super) plugin_duration: HistogramFamily<OwnedLabels1>,
    pub(super) plugin_errors: Family<OwnedLabels1, Counter>,
    pub(super) provider_config_info: Family<OwnedLabels1, Gauge>,
}

impl KubeletFamilies {
    pub(super) fn register(r: &mut Registry) -> Self {
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
        let ondisk_intents = Gauge::default();
        r.register(
            "imagemanager_ondisk_pullintents",
            "Pull intents in the state database (KEP-2535): pulls begun and not ended, and kept intents",
            ondisk_intents.clone(),
        );
        let ondisk_records = Gauge::default();
        r.register(
            "imagemanager_ondisk_pulledrecords",
            "Pulled records in the state database (KEP-2535), one per image",
            ondisk_records.clone(),
        );
        let plugin_duration: HistogramFamily<OwnedLabels1> =
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
        Self {
            pull_duration,
            garbage_collected,
            ensure_requests,
            ensure_cells: std::array::from_fn(|_| std::sync::OnceLock::new()),
            mustpull_checks,
            mustpull_cells: std::array::from_fn(|_| std::sync::OnceLock::new()),
            ondisk_intents,
            ondisk_records,
            plugin_duration,
            plugin_errors,
            provider_config_info,
        }
    }
}

/// The pull queue's: depths and what happened to pulls on their way.
pub(super) struct PullQueueFamilies {
    pub(super) depth: Gauge,
    pub(super) parked: Gauge,
    pub(super) in_flight: Gauge,
    pub(super) single_flight_joins: Counter,
    pub(super) throttle_waits: Counter,
    pub(super) throttle_rejections: Counter,
    pub(super) slow_pulls: Counter,
    pub(super) stalled_downloads: Counter,
    pub(super) stalled_now: Gauge,
    pub(super) stall_cancels: Counter,
    pub(super) transient_retries: Counter,
    pub(super) failures: Family<MixedLabels2, Counter>,
    /// The registries `failures` has a label value of its own for (at most
    /// [`MAX_FAILURE_REGISTRIES`]; the others count as `other`).
    pub(super) failure_registries: std::sync::Mutex<std::collections::HashSet<String>>,
}

/// Registries `pull_failures_total` names; past them, `registry="other"`:
/// image names come from requests, so the label's values stay bounded.
pub const MAX_FAILURE_REGISTRIES: usize = 64;

impl PullQueueFamilies {
    pub(super) fn register(r: &mut Registry) -> Self {
        let depth = Gauge::default();
        r.register("pull_queue_depth", "Pulls waiting in the pull queue for their turn", depth.clone());
        let parked = Gauge::default();
        r.register("pull_queue_parked", "Pull requests waiting for room in a full pull queue", parked.clone());
        let in_flight = Gauge::default();
        r.register("pulls_in_flight", "Pulls running now", in_flight.clone());
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
        let stalled_downloads = Counter::default();
        r.register(
            "pull_stalled_downloads",
            "Downloads of the runtime's that wrote no byte (or less than pull.min_download_rate asks) for \
             pull.stall_warning while a pull ran (warned once per stall)",
            stalled_downloads.clone(),
        );
        let stalled_now = Gauge::default();
        r.register(
            "pull_downloads_stalled",
            "Downloads of the runtime's stalled (idle, or under pull.min_download_rate) for pull.stall_warning \
             or longer at the last check (while pulls run)",
            stalled_now.clone(),
        );
        let stall_cancels = Counter::default();
        r.register(
            "pull_stall_cancels",
            "Pulls whose runtime call imaged ended because a download wrote no byte (or less than \
             pull.min_download_rate asks) for pull.stall_timeout",
            stall_cancels.clone(),
        );
        let transient_retries = Counter::default();
        r.register(
            "pull_transient_retries",
            "Pulls made again after a transient failure (pull.transient_retries), one per retry",
            transient_retries.clone(),
        );
        let failures = Family::default();
        r.register(
            "pull_failures",
            "Pulls that failed, once per pull (not per waiter), by registry and reason \
             (the runtime's error kind, or qps_exceeded, pull_deadline)",
            failures.clone(),
        );
        Self {
            depth,
            parked,
            in_flight,
            single_flight_joins,
            throttle_waits,
            throttle_rejections,
            slow_pulls,
            stalled_downloads,
            stalled_now,
            stall_cancels,
            transient_retries,
            failures,
            failure_registries: std::sync::Mutex::default(),
        }
    }
}

/// The back-off registry's.
pub(super) struct BackoffFamilies {
    pub(super) entries: Gauge,
    pub(super) resets: Family<Labels1, Counter>,
}

impl BackoffFamilies {
    pub(super) fn register(r: &mut Registry) -> Self {
        let entries = Gauge::default();
        r.register("backoff_entries", "Pod and image pairs held in the pull back-off table", entries.clone());
        let resets = Family::<Labels1, Counter>::default();
        r.register(
            "backoff_resets",
            "Back-offs ended before their time, by reason: cleared (ClearBackoff), credentials_changed, registry_recovered",
            resets.clone(),
        );
        Self { entries, resets }
    }
}

/// The CRI gateway's.
pub(super) struct CriFamilies {
    /// Resolved per method at construction (index: `Rpc as usize`).
    pub(super) duration: [Histogram; Rpc::ALL.len()],
    pub(super) errors: Family<Labels2, Counter>,
    /// The kubelet's `runtime_operations_*` by `operation_type`, resolved
    /// per RPC at construction (index: `Rpc as usize`).
    pub(super) operations: [Counter; Rpc::ALL.len()],
    pub(super) operation_errors: [Counter; Rpc::ALL.len()],
    pub(super) operation_duration: [Histogram; Rpc::ALL.len()],
    /// The CRI front's reads answered from what it kept, by method (index:
    /// the method's place in [`Rpc::KEPT_BY_FRONT`]; no series for
    /// a method the front never keeps).
    pub(super) front_cached: [Counter; Rpc::KEPT_BY_FRONT.len()],
    /// The CRI front's refused `RemoveImage`s, by reason (index:
    /// [`RemoveRefused`] as usize).
    pub(super) front_refused: [Counter; RemoveRefused::ALL.len()],
}

impl CriFamilies {
    pub(super) fn register(r: &mut Registry) -> Self {
        let duration_family: HistogramFamily<Labels1> =
            Family::new_with_constructor(|| Histogram::new(CRI_DURATION_BUCKETS));
        r.register_with_unit(
            "cri_request_duration",
            "Duration of CRI calls, by method, successful or not",
            Unit::Seconds,
            duration_family.clone(),
        );
        let duration = Rpc::ALL.map(|rpc| duration_family.get_or_create_owned(&[("method", rpc.name())]));
        let errors = Family::<Labels2, Counter>::default();
        r.register("cri_request_errors", "Failed CRI calls, by method and gRPC code", errors.clone());
        let label = |rpc: Rpc| [("operation_type", rpc.operation_type())];
        let operations_family = Family::<Labels1, Counter>::default();
        r.register(
            "runtime_operations",
            "Cumulative number of runtime operations by operation type (the kubelet's)",
            operations_family.clone(),
        );
        let operations = Rpc::ALL.map(|rpc| operations_family.get_or_create_owned(&label(rpc)));
        let errors_family = Family::<Labels1, Counter>::default();
        r.register(
            "runtime_operations_errors",
            "Cumulative number of runtime operation errors by operation type (the kubelet's)",
            errors_family.clone(),
        );
        let operation_errors = Rpc::ALL.map(|rpc| errors_family.get_or_create_owned(&label(rpc)));
        let ops_duration_family: HistogramFamily<Labels1> =
            Family::new_with_constructor(|| Histogram::new(runtime_operations_buckets()));
        r.register_with_unit(
            "runtime_operations_duration",
            "Duration in seconds of runtime operations, by operation type (the kubelet's)",
            Unit::Seconds,
            ops_duration_family.clone(),
        );
        let operation_duration = Rpc::ALL.map(|rpc| ops_duration_family.get_or_create_owned(&label(rpc)));
        let cached_family = Family::<Labels1, Counter>::default();
        r.register(
            "cri_front_cached_answers",
            "Calls to imaged's CRI socket answered from a kept answer (cri_server.read_cache_ttl), by method",
            cached_family.clone(),
        );
        let front_cached = Rpc::KEPT_BY_FRONT.map(|rpc| cached_family.get_or_create_owned(&[("method", rpc.name())]));
        let refused_family = Family::<Labels1, Counter>::default();
        r.register(
            "cri_front_removes_refused",
            "RemoveImage calls to imaged's CRI socket it refused (cri_server.refuse_remove_pinned, \
             refuse_remove_in_use), by reason",
            refused_family.clone(),
        );
        let front_refused = RemoveRefused::ALL.map(|r| refused_family.get_or_create_owned(&[("reason", r.name())]));
        Self { duration, errors, operations, operation_errors, operation_duration, front_cached, front_refused }
    }
}

/// GC's own (the kubelet's `image_garbage_collected` is in [`KubeletFamilies`]).
pub(super) struct GcFamilies {
    pub(super) runs: Family<Labels1, Counter>,
    pub(super) bytes_freed: Counter,
    pub(super) bytes_reclaimed: Counter,
}

impl GcFamilies {
    pub(super) fn register(r: &mut Registry) -> Self {
        let runs = Family::<Labels1, Counter>::default();
        r.register("image_gc_runs", "Image garbage collection runs (not dry runs), by result", runs.clone());
        let bytes_freed = Counter::default();
        r.register_with_unit(
            "image_gc_freed",
            "Bytes image garbage collection freed: the sizes of the images it removed",
            Unit::Bytes,
            bytes_freed.clone(),
        );
        let bytes_reclaimed = Counter::default();
        r.register_with_unit(
            "image_gc_reclaimed",
            "Bytes image garbage collection gave back on the image filesystem, measured before and after each run",
            Unit::Bytes,
            bytes_reclaimed.clone(),
        );
        Self { runs, bytes_freed, bytes_reclaimed }
    }
}

/// The durable store's.
pub(super) struct StoreFamilies {
    pub(super) recovered: Counter,
    /// `store_write_duration_seconds` of the pull records' and the image
    /// records' tables.
    pub(super) pull_records_writes: Histogram,
    pub(super) image_records_writes: Histogram,
}

/// Durable write buckets (seconds): a synced commit on a quiet SSD takes
/// about 0.2 ms, behind a busy runtime's own syncs a few, on a struggling
/// disk seconds.
pub const STORE_WRITE_BUCKETS: [f64; 14] =
    [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5];

impl StoreFamilies {
    pub(super) fn register(r: &mut Registry) -> Self {
        let recovered = Counter::default();
        r.register(
            "store_recovered",
            "State databases found damaged at start, moved aside (imaged.redb.damaged-<time>) and replaced by an empty one",
            recovered.clone(),
        );
        let writes: HistogramFamily<Labels1> = Family::new_with_constructor(|| Histogram::new(STORE_WRITE_BUCKETS));
        r.register_with_unit(
            "store_write_duration",
            "Durable writes to the state database (state.dir), from the write transaction's start \
             (waiting for another write included) to its synced commit, by table",
            Unit::Seconds,
            writes.clone(),
        );
        let pull_records_writes = writes.get_or_create_owned(&[("table", "pull_records")]);
        let image_records_writes = writes.get_or_create_owned(&[("table", "image_records")]);
        Self { recovered, pull_records_writes, image_records_writes }
    }
}

/// `build_info` (set here, once) and `config_info` (set by the daemon).
pub(super) struct InfoFamilies {
    pub(super) config: Family<Vec<(&'static str, String)>, Gauge>,
    pub(super) restart_pending: Gauge,
    pub(super) prefetch_images: Family<Labels1, Gauge>,
}

impl InfoFamilies {
    pub(super) fn register(r: &mut Registry) -> Self {
        let build_info = Family::<OwnedLabels1, Gauge>::default();
        r.register("build_info", "imaged's version (value 1)", build_info.clone());
        build_info.get_or_create(&[("version", env!("CARGO_PKG_VERSION").to_string())]).set(1);
        let config = Family::<Vec<(&'static str, String)>, Gauge>::default();
        r.register("config_info", "Key settings of the running configuration (value 1)", config.clone());
        let restart_pending = Gauge::default();
        r.register(
            "config_restart_pending",
            "Changed configuration keys a SIGHUP read that take effect only after a restart (0 = none)",
            restart_pending.clone(),
        );
        let prefetch_images = Family::<Labels1, Gauge>::default();
        r.register(
            "prefetch_images",
            "The declared images ([prefetch] images) by state: pending, present, pulling, failed",
            prefetch_images.clone(),
        );
        Self { config, restart_pending, prefetch_images }
    }
}
