//! The GC executor without actix: its state (the kubelet's `beganGC`, the
//! running flag, the consecutive failures, the last report, the policy and
//! rules in force) and its decisions (whether a tick runs, what a run works
//! with, the kubelet's error texts and node events when it ends, a policy
//! reload). The actor (`actor.rs`) routes messages and timers to it; the
//! run's I/O is `run.rs`.

#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tracing::{debug, info, warn};

use super::report::{GcError, GcReport, KEPT_LISTED_PER_REASON};
use crate::events::{EventReason, ImageEvent, ObjectRef};
use crate::gc::capacity::{CapacitySource, FsCapacity, MeasuredBy};
use crate::gc::eviction::AvailableThreshold;
use crate::gc::plan::{DeleteReason, GcMode, free_disk_space_failed_message};
use crate::gc::policy::{GcPolicy, ProtectionRules};
use crate::metrics::Metrics;

/// The GC executor's settings.
#[derive(Debug, Clone)]
pub struct GcExecutorSettings {
    /// Thresholds and ages.
    pub policy: GcPolicy,
    /// Protection rules (the sandbox image id is filled in from each detection).
    pub rules: ProtectionRules,
    /// GC period (the kubelet's 5 minutes).
    pub period: Duration,
    /// Where capacity and free space come from.
    pub capacity: CapacitySource,
    /// How often the image filesystem is measured between runs, a run
    /// starting at once when it is at or above the high threshold
    /// (`gc.pressure_check_period`; `None`: only every `period`, the
    /// kubelet).
    pub pressure_check: Option<Duration>,
    /// The kubelet's eviction thresholds for the image filesystem
    /// (`gc.eviction_available`): a pressure check's run starts before the
    /// first of them ([`crate::gc::eviction::pressure_policy`]).
    pub eviction: Vec<AvailableThreshold>,
    /// Mailbox capacity, set in `started()`
    /// (`gc.executor_mailbox_capacity`,
    /// [`DEFAULT_MAILBOX_CAPACITY`](super::DEFAULT_MAILBOX_CAPACITY) by default).
    pub mailbox_capacity: usize,
}

/// What one run works with, copied when it begins: a policy reload during
/// the run applies from the next one.
#[derive(Debug, Clone)]
pub struct RunSpec {
    /// Threshold GC or disk-pressure reclaim.
    pub mode: GcMode,
    /// Plan only.
    pub dry_run: bool,
    /// Thresholds and ages.
    pub policy: GcPolicy,
    /// Protection rules (the run fills in the sandbox image id).
    pub rules: ProtectionRules,
    /// Where capacity and free space come from.
    pub capacity: CapacitySource,
    /// When the GC loop started (the kubelet's `beganGC`).
    pub began: SystemTime,
    /// The report lists every image (a run someone asked for, who gets it);
    /// otherwise (the periodic run) it lists from the start only what the
    /// executor keeps of it ([`GcReport::from_plan_listing`]).
    pub whole_report: bool,
    /// The image filesystem as the pressure check that started this run
    /// measured it a moment ago: the run's first step takes it instead of
    /// asking the runtime again (`None`: the run measures).
    pub measured: Option<(FsCapacity, MeasuredBy)>,
}

/// A node event of image GC (`InvalidDiskCapacity`, `FreeDiskSpaceFailed`,
/// `ImageGCFailed`): attached to the node, naming no image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeEvent {
    /// The kubelet's reason.
    pub reason: EventReason,
    /// The kubelet's message.
    pub message: String,
}

impl NodeEvent {
    /// The event as the `EventSink` delivers it.
    pub fn into_image_event(self) -> ImageEvent {
        ImageEvent {
            event_type: self.reason.event_type(),
            reason: self.reason,
            message: self.message,
            object: ObjectRef::default(),
            image: String::new(),
            class: None,
        }
    }
}

/// How a run ended: the reply to its caller and the node events to emit,
/// in order.
#[derive(Debug)]
pub struct RunEnd {
    /// The reply.
    pub result: Result<Arc<GcReport>, GcError>,
    /// The node events, in the order to emit them.
    pub events: Vec<NodeEvent>,
}

/// The GC executor's state and logic. See the module docs.
#[derive(Debug)]
pub struct GcExecutor {
    cfg: GcExecutorSettings,
    /// When the GC loop started (the kubelet's `beganGC`).
    began: SystemTime,
    running: bool,
    consecutive_failures: u32,
    last: Option<Arc<GcReport>>,
    /// Counts non-dry runs by result.
    metrics: Metrics,
    /// The bytes used when the last pressure check started a run, while
    /// usage has stayed at or above the high threshold since.
    pressure_seen: Option<u64>,
}

impl GcExecutor {
    /// An executor whose GC loop began at `began`.
    pub fn new(cfg: GcExecutorSettings, began: SystemTime) -> Self {
        Self {
            cfg,
            began,
            running: false,
            consecutive_failures: 0,
            last: None,
            metrics: Metrics::default(),
            pressure_seen: None,
        }
    }

    /// The GC loop began at `began` instead (a start kept across restarts).
    pub fn set_began(&mut self, began: SystemTime) {
        self.began = began;
    }

    /// Counts runs in `metrics` (`imaged_image_gc_runs_total{result}`).
    pub fn set_metrics(&mut self, metrics: Metrics) {
        self.metrics = metrics;
    }

    /// The settings in force (policy and rules as last updated).
    pub fn config(&self) -> &GcExecutorSettings {
        &self.cfg
    }

    /// A run is going on.
    pub fn is_running(&self) -> bool {
        self.running
    }

    /// Failed runs since the last success.
    pub fn consecutive_failures(&self) -> u32 {
        self.consecutive_failures
    }

    /// The report of the last non-dry run that succeeded, or that removed
    /// what it could and failed ([`GcError::report`]), as kept between runs:
    /// every deletion, at most [`KEPT_LISTED_PER_REASON`] kept images of
    /// each reason ([`GcReport::bounded`]).
    pub fn last_report(&self) -> Option<Arc<GcReport>> {
        self.last.clone()
    }

    /// Whether the GC loop runs at once when it starts: not when the policy
    /// disables GC (logged, with the kubelet's text).
    pub fn runs_at_start(&self) -> bool {
        if self.cfg.policy.is_disabled() {
            info!("ImageGCHighThresholdPercent is set 100 and ImageMaximumGCAge is 0, Disable image GC");
            return false;
        }
        true
    }

    /// Whether a periodic tick starts a run: not while GC is disabled, nor
    /// while a run is going on (the tick is skipped).
    pub fn tick_runs(&self) -> bool {
        if self.cfg.policy.is_disabled() {
            return false;
        }
        if self.running {
            debug!("image GC still running; tick skipped");
            return false;
        }
        true
    }

    /// Whether a pressure check that measured `fs` starts a run now, and
    /// with which thresholds: the policy's, or lower ones when the
    /// kubelet's eviction line comes first
    /// ([`crate::gc::eviction::pressure_policy`]). It runs when usage is at
    /// or above that high threshold, GC is enabled and not running, and the
    /// check was not already answered — a run the last check started left
    /// usage above the threshold (every image in use, say) and nothing was
    /// added since, so another run would free nothing and repeat its
    /// events. Usage below the threshold clears that memory.
    pub fn pressure_runs(&mut self, fs: FsCapacity) -> Option<GcPolicy> {
        if self.cfg.policy.is_disabled() || self.running {
            return None;
        }
        let usage = crate::gc::plan::usage_percent(fs)?;
        let policy = crate::gc::eviction::pressure_policy(&self.cfg.policy, &self.cfg.eviction, fs.capacity)
            .unwrap_or_else(|| self.cfg.policy.clone());
        let used = fs.capacity.saturating_sub(fs.available);
        if i64::from(usage) < policy.high_threshold_percent {
            self.pressure_seen = None;
            return None;
        }
        if self.pressure_seen.is_some_and(|seen| used <= seen) {
            return None;
        }
        self.pressure_seen = Some(used);
        Some(policy)
    }

    /// Begins a run: what it works with, or [`GcError::Busy`] when one is
    /// going on. Every successful `begin` must be followed by
    /// [`GcExecutor::finish`].
    ///
    /// # Errors
    ///
    /// [`GcError::Busy`] while a run is going on.
    pub fn begin(&mut self, mode: GcMode, dry_run: bool) -> Result<RunSpec, GcError> {
        if self.running {
            return Err(GcError::Busy);
        }
        self.running = true;
        Ok(RunSpec {
            mode,
            dry_run,
            policy: self.cfg.policy.clone(),
            rules: self.cfg.rules.clone(),
            capacity: self.cfg.capacity.clone(),
            began: self.began,
            whole_report: true,
            measured: None,
        })
    }

    /// Ends a run: judges its outcome ([`GcExecutor::judge`]), counts it
    /// (non-dry runs), keeps the report of a non-dry run that got as far as
    /// removing (a success, or a missed target), and counts
    /// failures; the node events are the kubelet's: `InvalidDiskCapacity`,
    /// `FreeDiskSpaceFailed`, and `ImageGCFailed` from the second failure in
    /// a row.
    pub fn finish(&mut self, dry_run: bool, outcome: Result<GcReport, GcError>) -> RunEnd {
        self.running = false;
        let result = outcome.and_then(|r| self.judge(r));
        let mut events = Vec::new();
        match &result {
            Err(e @ GcError::InvalidCapacity) => {
                events.push(NodeEvent { reason: EventReason::InvalidDiskCapacity, message: e.to_string() });
            }
            Err(GcError::NotEnoughFreed { message, .. }) => {
                events.push(NodeEvent { reason: EventReason::FreeDiskSpaceFailed, message: message.clone() });
            }
            _ => {}
        }
        if !dry_run {
            self.metrics.gc_run(result.is_ok());
        }
        match &result {
            Ok(r) => {
                self.consecutive_failures = 0;
                if !r.dry_run {
                    self.last = Some(kept_between_runs(r));
                }
                debug!(
                    removed = r.removed.len(),
                    failed = r.failed.len(),
                    bytes = r.bytes_expected,
                    "image garbage collection done"
                );
            }
            Err(e) => {
                // A run that removed images and still failed is the last
                // report too: what it removed and freed, and why it failed.
                if let Some(r) = e.report() {
                    self.last = Some(kept_between_runs(r));
                }
                self.consecutive_failures += 1;
                if self.consecutive_failures == 1 {
                    warn!(error = %e, "Image garbage collection failed once. Stats initialization may not have completed yet");
                } else {
                    warn!(error = %e, "Image garbage collection failed multiple times in a row");
                    events.push(NodeEvent { reason: EventReason::ImageGcFailed, message: e.to_string() });
                }
            }
        }
        RunEnd { result, events }
    }

    /// Turns a finished run into the kubelet's errors: removals that failed
    /// ([`GcError::Deletion`], with the kubelet's three texts), or a
    /// free-space pass that freed less than it had to
    /// ([`GcError::NotEnoughFreed`], the `FreeDiskSpaceFailed` text). A dry
    /// run is always a success.
    ///
    /// # Errors
    ///
    /// As above.
    pub fn judge(&self, mut r: GcReport) -> Result<Arc<GcReport>, GcError> {
        if r.dry_run {
            return Ok(Arc::new(r));
        }
        let freed: u64 = r.removed.iter().map(|i| i.size).sum();
        // The free-space target already counts the age and retention
        // deletions as done: compare what the space pass freed.
        let space = DeleteReason::Space.to_string();
        let freed_space: u64 = r.removed.iter().filter(|i| i.reason == space).map(|i| i.size).sum();
        if !r.failed.is_empty() {
            let errors: Vec<String> = r.failed.iter().map(|(_, e)| e.clone()).collect();
            let agg = aggregate(&errors);
            let msg = if r.mode == GcMode::DeleteUnused {
                // The kubelet frees "math.MaxInt64" bytes here, and says so.
                format!(
                    "wanted to free {} bytes, but freed {freed} bytes space with errors in image deletion: {agg}",
                    i64::MAX
                )
            } else if r.amount_to_free > 0 {
                format!(
                    "wanted to free {} bytes, but freed {freed_space} bytes space with errors in image deletion: {agg}",
                    r.amount_to_free
                )
            } else {
                format!(
                    "wanted to free images older than {}, encountered errors in image deletion: {agg}",
                    crate::domain::go_text::duration(self.cfg.policy.max_age)
                )
            };
            r.target_missed = Some(msg.clone());
            return Err(GcError::Deletion { message: msg, report: Arc::new(r) });
        }
        if r.mode == GcMode::Threshold && r.amount_to_free > 0 && freed_space < r.amount_to_free {
            // The usage after the max-age pass, as the kubelet re-reads it.
            let usage = r.projected_usage_percent.or(r.usage_percent).unwrap_or(100);
            let msg = free_disk_space_failed_message(usage, r.before.capacity, freed_space);
            r.target_missed = Some(msg.clone());
            return Err(GcError::NotEnoughFreed { message: msg, report: Arc::new(r) });
        }
        Ok(Arc::new(r))
    }

    /// Replaces the policy and rules (a configuration reload), keeping the
    /// sandbox image id of the last detection. Returns whether GC was
    /// disabled and now is not: the caller runs it at once.
    pub fn update_policy(&mut self, policy: GcPolicy, rules: ProtectionRules) -> bool {
        let was_disabled = self.cfg.policy.is_disabled();
        self.cfg.policy = policy;
        let sandbox = self.cfg.rules.sandbox_image_id.take();
        self.cfg.rules = ProtectionRules { sandbox_image_id: sandbox, ..rules };
        info!(policy = %self.cfg.policy, "image GC policy updated");
        was_disabled && !self.cfg.policy.is_disabled()
    }
}

/// The Go aggregate error text: one message as is, several as `[a, b]`.
fn aggregate(errors: &[String]) -> String {
    let mut uniq: Vec<&String> = Vec::new();
    for e in errors {
        if !uniq.contains(&e) {
            uniq.push(e);
        }
    }
    match uniq.as_slice() {
        [one] => (*one).clone(),
        many => format!("[{}]", many.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")),
    }
}

/// What the executor keeps of a run's report until the next run: the same
/// report when it is small, else [`GcReport::bounded`] (the run's caller
/// got the whole one).
fn kept_between_runs(r: &Arc<GcReport>) -> Arc<GcReport> {
    if r.is_bounded(KEPT_LISTED_PER_REASON) { r.clone() } else { Arc::new(r.bounded(KEPT_LISTED_PER_REASON)) }
}
