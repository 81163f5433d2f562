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

mod exposition;
mod families;
mod labels;
#[cfg(test)]
mod tests;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::text::encode;
use prometheus_client::registry::Registry;

use crate::cri::{CriError, Rpc};
use crate::domain::pull_policy::PullPolicy;
use crate::domain::pull_record::MustPullResult;
use families::{
    BackoffFamilies, CriFamilies, GcFamilies, InfoFamilies, KubeletFamilies, PullQueueFamilies, StoreFamilies,
};
pub use families::{
    CRI_DURATION_BUCKETS, MAX_FAILURE_REGISTRIES, PLUGIN_DURATION_BUCKETS, PULL_DURATION_BUCKETS, STORE_WRITE_BUCKETS,
};
pub use labels::{BackoffResetReason, RemoveRefused, Tristate, image_size_bucket};
use labels::{POLICY_LABELS, policy_index};

/// The content type of [`Metrics::encode`]'s text (OpenMetrics 1.0, which
/// Prometheus scrapes natively).
pub const CONTENT_TYPE: &str = exposition::OPENMETRICS_CONTENT_TYPE;
pub use exposition::{Format, OPENMETRICS_CONTENT_TYPE, PROMETHEUS_CONTENT_TYPE, openmetrics_to_prometheus};

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
        let kubelet = &self.metrics.inner.kubelet;
        let (present, required) = (self.present_locally, self.pull_required);
        let cell = self.policy * 9 + present.index() * 3 + required.index();
        // Resolved once per label combination: later requests cost an atomic add.
        let counter = kubelet.ensure_cells[cell].get_or_init(|| {
            kubelet.ensure_requests.get_or_create_owned(&[
                ("pull_policy", POLICY_LABELS[self.policy]),
                ("present_locally", present.label()),
                ("pull_required", required.label()),
            ])
        });
        counter.inc();
    }
}

/// The registry and every family, by group ([`families`]).
struct Inner {
    registry: Registry,
    kubelet: KubeletFamilies,
    queue: PullQueueFamilies,
    backoff: BackoffFamilies,
    cri: CriFamilies,
    gc: GcFamilies,
    store: StoreFamilies,
    info: InfoFamilies,
    /// The state database whose KEP-2535 tables each scrape counts: the
    /// last one given, not kept open by this (a node restarted in the
    /// process reopens its file).
    pull_records_store: std::sync::Mutex<Option<std::sync::Weak<dyn PullRecordCounts>>>,
}

/// What the `imagemanager_ondisk_*` gauges read at each scrape: the state
/// database ([`crate::store::Store`]), given by
/// [`Metrics::count_pull_records_in`].
pub trait PullRecordCounts: Send + Sync {
    /// How many pull intents and pulled records are on disk now (`None`:
    /// they cannot be read).
    fn pull_record_counts(&self) -> Option<(u64, u64)>;
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
        // Registration order is the scrape's order: keep docs/metrics.md's.
        let kubelet = KubeletFamilies::register(&mut r);
        let queue = PullQueueFamilies::register(&mut r);
        let backoff = BackoffFamilies::register(&mut r);
        let cri = CriFamilies::register(&mut r);
        let gc = GcFamilies::register(&mut r);
        let store = StoreFamilies::register(&mut r);
        let info = InfoFamilies::register(&mut r);
        let pull_records_store = std::sync::Mutex::new(None);
        Self {
            inner: Arc::new(Inner { registry: r, kubelet, queue, backoff, cri, gc, store, info, pull_records_store }),
        }
    }

    /// Every family in the Prometheus/OpenMetrics text format ([`CONTENT_TYPE`]).
    pub fn encode(&self) -> String {
        self.refresh_pull_record_counts();
        let mut out = String::with_capacity(8 * 1024);
        // Writing to a String cannot fail; the encoder reports only the writer's errors.
        if encode(&mut out, &self.inner.registry).is_err() {
            out.clear();
        }
        out
    }

    /// Every family in the classic Prometheus text format 0.0.4
    /// ([`PROMETHEUS_CONTENT_TYPE`]), for scrapers that do not ask for
    /// OpenMetrics.
    pub fn encode_prometheus(&self) -> String {
        openmetrics_to_prometheus(&self.encode())
    }

    /// Every family in `format`.
    pub fn encode_as(&self, format: Format) -> String {
        match format {
            Format::OpenMetrics => self.encode(),
            Format::Prometheus => self.encode_prometheus(),
        }
    }

    /// Counts `store`'s pull intents and pulled records at each scrape
    /// (`imaged_imagemanager_ondisk_pullintents`, `_pulledrecords`, the
    /// kubelet's file counts) while it is open; the last store given
    /// counts. Without one (records in memory) both read 0, as nothing is
    /// on disk; once it is closed they keep its last counts.
    pub fn count_pull_records_in<S: PullRecordCounts + 'static>(&self, store: &Arc<S>) {
        let weak: std::sync::Weak<S> = Arc::downgrade(store);
        *self.pull_records_store() = Some(weak as std::sync::Weak<dyn PullRecordCounts>);
    }

    fn pull_records_store(&self) -> std::sync::MutexGuard<'_, Option<std::sync::Weak<dyn PullRecordCounts>>> {
        self.inner.pull_records_store.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// One read transaction, off the pull path: a scrape every few seconds
    /// costs the store less than a gauge kept at every write would. A store
    /// that cannot be read (fenced at a stop) leaves the last counts.
    fn refresh_pull_record_counts(&self) {
        let Some(store) = self.pull_records_store().as_ref().and_then(std::sync::Weak::upgrade) else { return };
        if let Some((intents, records)) = store.pull_record_counts() {
            let k = &self.inner.kubelet;
            k.ondisk_intents.set(i64::try_from(intents).unwrap_or(i64::MAX));
            k.ondisk_records.set(i64::try_from(records).unwrap_or(i64::MAX));
        }
    }

    /// True when both handles share one registry.
    pub fn same_registry(&self, other: &Metrics) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    // === the kubelet's ===

    /// A successful pull took `total` (including waiting) for an image of `size` bytes.
    pub fn image_pulled(&self, size: u64, total: Duration) {
        self.inner
            .kubelet
            .pull_duration
            .get_or_create(&[("image_size_in_bytes", image_size_bucket(size))])
            .observe(total.as_secs_f64());
    }

    /// GC removed an image of `size` bytes for `reason` (`age`, `space`, `retention`).
    pub fn image_garbage_collected(&self, reason: &'static str, size: u64) {
        self.inner.kubelet.garbage_collected.get_or_create(&[("reason", reason)]).inc();
        self.inner.gc.bytes_freed.inc_by(size);
    }

    /// A run's removals gave back `measured` bytes on the image filesystem
    /// (available after − before). A run during which something else
    /// filled the disk more than it freed adds nothing.
    pub fn gc_reclaimed(&self, measured: i128) {
        self.inner.gc.bytes_reclaimed.inc_by(u64::try_from(measured.max(0)).unwrap_or(u64::MAX));
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
        let kubelet = &self.inner.kubelet;
        kubelet.mustpull_cells[result.index()]
            .get_or_init(|| kubelet.mustpull_checks.get_or_create_owned(&[("result", result.as_str())]))
            .inc();
    }

    /// A credential provider plugin ran for `took`, failing when `failed`.
    pub fn credential_plugin_ran(&self, plugin: &str, took: Duration, failed: bool) {
        let labels = [("plugin_name", plugin.to_string())];
        self.inner.kubelet.plugin_duration.get_or_create(&labels).observe(took.as_secs_f64());
        if failed {
            self.inner.kubelet.plugin_errors.get_or_create(&labels).inc();
        }
    }

    /// The credential provider configuration's hash (`sha256:<hex>`); replaces any earlier one.
    pub fn set_credential_provider_config(&self, hash: &str) {
        self.inner.kubelet.provider_config_info.clear();
        self.inner.kubelet.provider_config_info.get_or_create(&[("hash", hash.to_string())]).set(1);
    }

    // === pull queue ===

    /// The pull queue's depths now.
    pub fn set_pull_queue(&self, queued: usize, parked: usize, running: usize) {
        let g = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        self.inner.queue.depth.set(g(queued));
        self.inner.queue.parked.set(g(parked));
        self.inner.queue.in_flight.set(g(running));
    }

    /// A call to the CRI front answered from a kept answer.
    pub fn front_answer_cached(&self, rpc: Rpc) {
        if let Some(i) = Rpc::KEPT_BY_FRONT.iter().position(|r| *r == rpc) {
            self.inner.cri.front_cached[i].inc();
        }
    }

    /// The CRI front refused a `RemoveImage`.
    pub fn front_remove_refused(&self, why: RemoveRefused) {
        self.inner.cri.front_refused[why as usize].inc();
    }

    /// A request joined a pull already queued or running.
    pub fn single_flight_joined(&self) {
        self.inner.queue.single_flight_joins.inc();
    }

    /// A pull waited for a throttle token.
    pub fn throttle_waited(&self) {
        self.inner.queue.throttle_waits.inc();
    }

    /// A pull ran past `pull.slow_pull_warning` while others waited.
    pub fn slow_pull_blocking(&self) {
        self.inner.queue.slow_pulls.inc();
    }

    /// A download of the runtime's was found stalled for
    /// `pull.stall_warning` (once per stall).
    pub fn download_stalled(&self) {
        self.inner.queue.stalled_downloads.inc();
    }

    /// A pull's runtime call was ended for a stalled download
    /// (`pull.stall_timeout`).
    pub fn stalled_pull_cancelled(&self) {
        self.inner.queue.stall_cancels.inc();
    }

    /// The downloads stalled for `pull.stall_warning` or longer now.
    pub fn set_stalled_downloads(&self, n: usize) {
        self.inner.queue.stalled_now.set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// A pull is tried again after a transient failure.
    pub fn pull_retried(&self) {
        self.inner.queue.transient_retries.inc();
    }

    /// A pull failed (counted once per pull): `registry` its image's
    /// registry host, `reason` a short word for why (see
    /// `PullFailure::reason`). Past [`MAX_FAILURE_REGISTRIES`] registries,
    /// new ones count as `other`.
    pub fn pull_failed(&self, registry: &str, reason: &'static str) {
        let q = &self.inner.queue;
        let named = {
            let mut seen = q.failure_registries.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            seen.contains(registry)
                || (seen.len() < families::MAX_FAILURE_REGISTRIES && seen.insert(registry.to_string()))
        };
        let registry: std::borrow::Cow<'static, str> = if named { registry.to_string().into() } else { "other".into() };
        q.failures.get_or_create(&[("registry", registry), ("reason", reason.into())]).inc();
    }

    /// A pull was failed by the throttle.
    pub fn throttle_rejected(&self) {
        self.inner.queue.throttle_rejections.inc();
    }

    // === back-off ===

    /// The declared prefetch images by state now (`imaged_prefetch_images{state}`).
    pub fn set_prefetch_images(&self, by_state: &[(&'static str, usize)]) {
        for (state, n) in by_state {
            self.inner
                .info
                .prefetch_images
                .get_or_create(&[("state", state)])
                .set(i64::try_from(*n).unwrap_or(i64::MAX));
        }
    }

    /// Entries in the back-off table now.
    pub fn set_backoff_entries(&self, n: usize) {
        self.inner.backoff.entries.set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// `n` back-offs ended before their time for `reason`.
    pub fn backoff_reset(&self, reason: BackoffResetReason, n: usize) {
        if n > 0 {
            self.inner.backoff.resets.get_or_create(&[("reason", reason.label())]).inc_by(n as u64);
        }
    }

    // === CRI ===

    /// A CRI call ended after `took`; counted as an error when `error` is set.
    /// Costs one histogram observe, plus a labelled counter for errors.
    /// The same call feeds the kubelet's `runtime_operations_*{operation_type}`.
    pub fn cri_call(&self, rpc: Rpc, took: Duration, error: Option<&CriError>) {
        let cri = &self.inner.cri;
        let i = rpc as usize;
        cri.duration[i].observe(took.as_secs_f64());
        cri.operations[i].inc();
        cri.operation_duration[i].observe(took.as_secs_f64());
        if let Some(e) = error {
            cri.operation_errors[i].inc();
            self.inner.cri.errors.get_or_create(&[("method", rpc.name()), ("code", e.code().go_name())]).inc();
        }
    }

    // === GC ===

    /// A GC run (not a dry run) ended, well or not.
    pub fn gc_run(&self, ok: bool) {
        self.inner.gc.runs.get_or_create(&[("result", if ok { "success" } else { "failure" })]).inc();
    }

    // === store ===

    /// A durable write to the state database's pull records (`pull`) or
    /// image records took `took`.
    pub fn store_written(&self, pull_records: bool, took: Duration) {
        let s = &self.inner.store;
        let h = if pull_records { &s.pull_records_writes } else { &s.image_records_writes };
        h.observe(took.as_secs_f64());
    }

    /// The state database was found damaged at start and replaced.
    pub fn store_recovered(&self) {
        self.inner.store.recovered.inc();
    }

    // === info ===

    /// Publishes the key settings (from [`Config::info_labels`](crate::config::Config::info_labels))
    /// as `imaged_config_info` labels, replacing the last ones.
    pub fn set_config_info(&self, labels: &[(&'static str, String)]) {
        let labels = labels.to_vec();
        self.inner.info.config.clear();
        self.inner.info.config.get_or_create(&labels).set(1);
    }

    /// How many changed configuration keys wait for a restart
    /// (`imaged_config_restart_pending`), as the last SIGHUP found.
    pub fn set_restart_pending(&self, keys: usize) {
        self.inner.info.restart_pending.set(i64::try_from(keys).unwrap_or(i64::MAX));
    }
}
