//! The GC executor: every `gc.gc_period` it measures the image filesystem,
//! asks the detector for a fresh detection, computes the kubelet's GC plan
//! (max-age pass, then the free-space pass down to the low threshold) with
//! an explanation for every image, removes the chosen images through the
//! CRI gateway, measures again, and reports. It also runs on demand
//! (`RunGc { dry_run }`) and for disk-pressure reclaim (`DeleteUnusedImages`).
//! After the removals of a run it prunes the KEP-2535 pulled records of
//! images the runtime no longer has (`PullRecords::prune_unknown_records`).

#[cfg(test)]
mod tests;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use actix::prelude::*;
use tracing::{debug, info, warn};

use crate::actors::cri_gateway::{GetImageFsInfo, RemoveImage};
use crate::actors::detector::{DetectImages, Detection, DetectorActor};
use crate::clock::WallClock;
use crate::cri::CriError;
use crate::domain::ImageSpec;
use crate::events::{EventReason, EventSink, ImageEvent, ObjectRef};
use crate::gc::capacity::{CapacitySource, FsCapacity};
pub use crate::gc::plan::GcMode;
use crate::gc::plan::{
    DeleteReason as DeleteReasonText, GcPlanError, GcRunInputs, KeepReason, Shortfall, Verdict,
    free_disk_space_failed_message, plan_gc,
};
use crate::gc::policy::{GcPolicy, ProtectionRules};
use crate::metrics::Metrics;

/// The GC executor's settings.
#[derive(Debug, Clone)]
pub struct GcExecutorConfig {
    /// Thresholds and ages.
    pub policy: GcPolicy,
    /// Protection rules (the sandbox image id is filled in from each detection).
    pub rules: ProtectionRules,
    /// GC period (the kubelet's 5 minutes).
    pub period: Duration,
    /// Where capacity and free space come from.
    pub capacity: CapacitySource,
}

/// One image removed by a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemovedImage {
    /// Image id.
    pub id: String,
    /// Its tags, for the report.
    pub repo_tags: Vec<String>,
    /// Its size.
    pub size: u64,
    /// Why (`age`, `space`, `retention`).
    pub reason: String,
}

/// One image in a report: what the plan decided and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReportEntry {
    /// Image id.
    pub id: String,
    /// Runtime handler the image was pulled for (passed back on removal).
    pub runtime_handler: String,
    /// Its tags.
    pub repo_tags: Vec<String>,
    /// Its size.
    pub size: u64,
    /// Delete (with the reason) or keep (with the reason).
    pub verdict: Verdict,
    /// For images kept because they are in use: who uses them
    /// (`namespace/pod/container`, `sandbox image`, `ensured recently`).
    pub used_by: Vec<String>,
}

impl ReportEntry {
    /// One line of explanation (`keep: in use by prod/web/c1`).
    pub fn explain(&self) -> String {
        match &self.verdict {
            Verdict::Keep(KeepReason::InUse) if !self.used_by.is_empty() => {
                format!("keep: in use by {}", self.used_by.join(", "))
            }
            v => v.to_string(),
        }
    }
}

/// What a GC run did, or (dry run) would do.
#[derive(Debug, Clone)]
pub struct GcReport {
    /// `RunGc` (threshold) or `DeleteUnusedImages`.
    pub mode: GcMode,
    /// Nothing was removed.
    pub dry_run: bool,
    /// When the run began.
    pub started: SystemTime,
    /// The filesystem before.
    pub before: FsCapacity,
    /// Usage before, in percent (the kubelet's integer arithmetic).
    pub usage_percent: Option<u8>,
    /// Usage the plan expects after its deletions.
    pub projected_usage_percent: Option<u8>,
    /// Bytes the free-space pass wanted to free (0 = below the threshold).
    pub amount_to_free: u64,
    /// Every image with its verdict and reason, in eviction order.
    pub entries: Vec<ReportEntry>,
    /// When the target cannot be met: what was eligible and what holds the rest.
    pub shortfall: Option<Shortfall>,
    /// Images removed.
    pub removed: Vec<RemovedImage>,
    /// Images whose removal failed, with the error.
    pub failed: Vec<(String, String)>,
    /// Bytes the removals should free (sum of sizes).
    pub bytes_expected: u64,
    /// Bytes actually freed: free space after minus before (`None` for a dry
    /// run or when the second measurement failed). Shared layers and delayed
    /// content GC in the runtime make this differ from `bytes_expected`.
    pub bytes_freed_measured: Option<i128>,
}

/// Why a GC run failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GcError {
    /// A run is already going on.
    #[error("image garbage collection is already running")]
    Busy,
    /// Listing images or containers failed.
    #[error("{0}")]
    Detection(CriError),
    /// Reading the image filesystem failed.
    #[error("{0}")]
    FsInfo(String),
    /// The filesystem reports capacity 0 (the kubelet's text).
    #[error("invalid capacity 0 on image filesystem")]
    InvalidCapacity,
    /// Removals failed (the kubelet's texts).
    #[error("{0}")]
    Deletion(String),
    /// Not enough space could be freed (the kubelet's `FreeDiskSpaceFailed` text).
    #[error("{0}")]
    NotEnoughFreed(String),
    /// The detector stopped.
    #[error("the image detector stopped")]
    DetectorStopped,
}

/// Runs GC now (threshold mode); `dry_run` plans without removing.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "Result<Arc<GcReport>, GcError>")]
pub struct RunGc {
    /// Plan only.
    pub dry_run: bool,
}

/// Disk-pressure reclaim: removes every unused image old enough (min age
/// still applies), whatever the thresholds.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "Result<Arc<GcReport>, GcError>")]
pub struct DeleteUnusedImages {
    /// Plan only.
    pub dry_run: bool,
}

/// The last report (of a non-dry run), if any.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "Option<Arc<GcReport>>")]
pub struct GetLastGcReport;

#[derive(Message)]
#[rtype(result = "()")]
struct Tick;

/// The GC executor actor. See `actors.md`.
pub struct GcExecutorActor {
    cfg: GcExecutorConfig,
    detector: Addr<DetectorActor>,
    fs_info: Recipient<GetImageFsInfo>,
    remove: Recipient<RemoveImage>,
    events: EventSink,
    clock: WallClock,
    /// When the GC loop started (the kubelet's `beganGC`).
    began: SystemTime,
    running: bool,
    consecutive_failures: u32,
    last: Option<Arc<GcReport>>,
    /// Removals by reason, bytes freed, runs.
    metrics: Metrics,
    /// Pulled records to prune after each run (KEP-2535).
    pull_records: Option<crate::pull_records::PullRecords>,
}

impl GcExecutorActor {
    /// An executor working with `detector` and the gateway's recipients.
    pub fn new(
        cfg: GcExecutorConfig,
        detector: Addr<DetectorActor>,
        fs_info: Recipient<GetImageFsInfo>,
        remove: Recipient<RemoveImage>,
        events: EventSink,
        clock: WallClock,
    ) -> Self {
        let began = clock.now();
        Self {
            cfg,
            detector,
            fs_info,
            remove,
            events,
            clock,
            began,
            running: false,
            consecutive_failures: 0,
            last: None,
            metrics: Metrics::default(),
            pull_records: None,
        }
    }

    /// The executor reporting removals, bytes freed and runs to `metrics`.
    #[must_use]
    pub fn with_metrics(mut self, metrics: Metrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// The same executor, pruning `records` after each run: records last
    /// updated before the run began, of images the runtime no longer has.
    #[must_use]
    pub fn with_pull_records(mut self, records: crate::pull_records::PullRecords) -> Self {
        self.pull_records = Some(records);
        self
    }

    fn node_event(events: &EventSink, reason: EventReason, message: String) {
        events.emit(ImageEvent {
            event_type: reason.event_type(),
            reason,
            message,
            object: ObjectRef::default(),
            image: String::new(),
            class: None,
        });
    }

    fn run(&mut self, mode: GcMode, dry_run: bool) -> ResponseActFuture<Self, Result<Arc<GcReport>, GcError>> {
        if self.running {
            return Box::pin(actix::fut::ready(Err(GcError::Busy)));
        }
        self.running = true;
        let detector = self.detector.clone();
        let fs_info = self.fs_info.clone();
        let remove = self.remove.clone();
        let capacity = self.cfg.capacity.clone();
        let policy = self.cfg.policy.clone();
        let mut rules = self.cfg.rules.clone();
        let events = self.events.clone();
        let pull_records = self.pull_records.clone();
        let (began, clock) = (self.began, self.clock);
        let metrics = self.metrics.clone();
        let work = async move {
            let started = clock.now();
            let measure = || async {
                let info =
                    fs_info.send(GetImageFsInfo).await.map_err(|_| GcError::FsInfo("CRI gateway stopped".into()))?;
                let info = info.map_err(|e| GcError::FsInfo(format!("failed to get image filesystem info: {e}")))?;
                let fs = info
                    .image_filesystems
                    .into_iter()
                    .next()
                    .ok_or_else(|| GcError::FsInfo("the runtime reported no image filesystem".into()))?;
                let capacity = capacity.clone();
                tokio::task::spawn_blocking(move || capacity.measure(&fs))
                    .await
                    .map_err(|e| GcError::FsInfo(e.to_string()))?
                    .map_err(GcError::FsInfo)
            };
            let before = measure().await?;
            let detection: Arc<Detection> =
                detector.send(DetectImages).await.map_err(|_| GcError::DetectorStopped)?.map_err(GcError::Detection)?;
            rules.sandbox_image_id = detection.sandbox_image_id.clone();
            let now = clock.now();
            let in_use = detection.in_use_ids();
            let (entries, deletions, summary) = match plan_gc(GcRunInputs {
                records: &detection.records,
                in_use: &in_use,
                fs: before,
                policy: &policy,
                rules: &rules,
                began,
                now,
                mode,
            }) {
                Ok(plan) => {
                    let entries: Vec<ReportEntry> = plan
                        .entries
                        .iter()
                        .map(|e| ReportEntry {
                            id: e.record.key.id.clone(),
                            runtime_handler: e.record.key.runtime_handler.clone(),
                            repo_tags: e.record.repo_tags.clone(),
                            size: e.record.size,
                            verdict: e.verdict.clone(),
                            used_by: detection.in_use.get(&e.record.key.id).cloned().unwrap_or_default(),
                        })
                        .collect();
                    let deletions: Vec<ReportEntry> =
                        entries.iter().filter(|e| matches!(e.verdict, Verdict::Delete(_))).cloned().collect();
                    let summary = (
                        plan.usage_percent,
                        plan.projected_usage_percent,
                        plan.amount_to_free,
                        plan.bytes_to_delete,
                        plan.shortfall.clone(),
                    );
                    (entries, deletions, summary)
                }
                Err(GcPlanError::InvalidCapacity { age_deletions }) => {
                    // As the kubelet: the max-age pass runs before the capacity check.
                    if !dry_run {
                        for key in age_deletions {
                            let size = detection.records.get(&key).map_or(0, |r| r.size);
                            let spec = ImageSpec::new(key.id).with_runtime_handler(key.runtime_handler);
                            if let Ok(Ok(())) = remove.send(RemoveImage { image: spec }).await {
                                metrics.image_garbage_collected("age", size);
                            }
                        }
                    }
                    Self::node_event(&events, EventReason::InvalidDiskCapacity, GcError::InvalidCapacity.to_string());
                    return Err(GcError::InvalidCapacity);
                }
            };
            let (usage_percent, projected_usage_percent, amount_to_free, bytes_to_delete, shortfall) = summary;
            let mut report = GcReport {
                mode,
                dry_run,
                started,
                before,
                usage_percent,
                projected_usage_percent,
                amount_to_free,
                entries,
                shortfall,
                removed: Vec::new(),
                failed: Vec::new(),
                bytes_expected: bytes_to_delete,
                bytes_freed_measured: None,
            };
            if dry_run {
                return Ok(report);
            }
            for v in &deletions {
                let Verdict::Delete(reason) = &v.verdict else { continue };
                let msg =
                    RemoveImage { image: ImageSpec::new(v.id.clone()).with_runtime_handler(v.runtime_handler.clone()) };
                match remove.send(msg).await {
                    Ok(Ok(())) => {
                        metrics.image_garbage_collected(reason.metric_label(), v.size);
                        info!(image = %v.id, reason = %reason, bytes = v.size, "image removed");
                        report.removed.push(RemovedImage {
                            id: v.id.clone(),
                            repo_tags: v.repo_tags.clone(),
                            size: v.size,
                            reason: reason.to_string(),
                        });
                    }
                    Ok(Err(e)) => report.failed.push((v.id.clone(), e.to_string())),
                    Err(_) => report.failed.push((v.id.clone(), "CRI gateway stopped".into())),
                }
            }
            if let Ok(after) = measure().await {
                report.bytes_freed_measured = Some(i128::from(after.available) - i128::from(before.available));
            }
            // The kubelet's post-GC hook. Unlike the kubelet (which passes
            // only the remaining GC candidates), every image still present
            // keeps its record, in use or not.
            if let Some(records) = pull_records {
                let removed: HashSet<&str> = report.removed.iter().map(|r| r.id.as_str()).collect();
                let present: HashSet<String> = detection
                    .records
                    .iter()
                    .map(|r| r.key.id.clone())
                    .filter(|id| !removed.contains(id.as_str()))
                    .collect();
                // `started` is before detection, read from the clock the
                // records are stamped with (`GcService` shares it): a record
                // written since (a pull during this run) is newer and stays.
                if let Err(e) = records.prune_unknown_records(&present, started).await {
                    warn!(error = %e, "failed to prune pulled records of removed images");
                }
            }
            Ok(report)
        };
        Box::pin(work.into_actor(self).map(move |res: Result<GcReport, GcError>, act, _| {
            act.running = false;
            let res = res.and_then(|r| act.judge(r));
            if !dry_run {
                act.metrics.gc_run(res.is_ok());
            }
            match &res {
                Ok(r) => {
                    act.consecutive_failures = 0;
                    if !r.dry_run {
                        act.last = Some(r.clone());
                    }
                    debug!(removed = r.removed.len(), failed = r.failed.len(), bytes = r.bytes_expected, "image garbage collection done");
                }
                Err(e) => {
                    act.consecutive_failures += 1;
                    if act.consecutive_failures == 1 {
                        warn!(error = %e, "Image garbage collection failed once. Stats initialization may not have completed yet");
                    } else {
                        warn!(error = %e, "Image garbage collection failed multiple times in a row");
                        Self::node_event(&act.events, EventReason::ImageGcFailed, e.to_string());
                    }
                }
            }
            res
        }))
    }

    /// Turns a finished run into the kubelet's errors and events.
    fn judge(&self, r: GcReport) -> Result<Arc<GcReport>, GcError> {
        if r.dry_run {
            return Ok(Arc::new(r));
        }
        let freed: u64 = r.removed.iter().map(|i| i.size).sum();
        // The free-space target already counts the age and retention
        // deletions as done: compare what the space pass freed.
        let space = DeleteReasonText::Space.to_string();
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
            return Err(GcError::Deletion(msg));
        }
        if r.mode == GcMode::Threshold && r.amount_to_free > 0 && freed_space < r.amount_to_free {
            // The usage after the max-age pass, as the kubelet re-reads it.
            let usage = r.projected_usage_percent.or(r.usage_percent).unwrap_or(100);
            let msg = free_disk_space_failed_message(usage, r.before.capacity, freed_space);
            Self::node_event(&self.events, EventReason::FreeDiskSpaceFailed, msg.clone());
            return Err(GcError::NotEnoughFreed(msg));
        }
        Ok(Arc::new(r))
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

impl Actor for GcExecutorActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.set_mailbox_capacity(16);
        // One timer for the actor's life; a tick does nothing while the
        // policy is disabled, so a reload can turn GC on and off without
        // timers piling up.
        ctx.run_interval(self.cfg.period, |_, ctx| ctx.notify(Tick));
        if self.cfg.policy.is_disabled() {
            info!("ImageGCHighThresholdPercent is set 100 and ImageMaximumGCAge is 0, Disable image GC");
        } else {
            ctx.notify(Tick);
        }
    }
}

impl Handler<Tick> for GcExecutorActor {
    type Result = ();
    /// Runs GC unless a run is going on (or GC was disabled by a reload).
    fn handle(&mut self, _: Tick, ctx: &mut Self::Context) {
        if self.cfg.policy.is_disabled() {
            return;
        }
        if self.running {
            debug!("image GC still running; tick skipped");
            return;
        }
        let fut = self.run(GcMode::Threshold, false).map(|_, _, _| ());
        ctx.spawn(fut);
    }
}

impl Handler<RunGc> for GcExecutorActor {
    type Result = ResponseActFuture<Self, Result<Arc<GcReport>, GcError>>;
    /// Runs GC now.
    fn handle(&mut self, m: RunGc, _: &mut Self::Context) -> Self::Result {
        self.run(GcMode::Threshold, m.dry_run)
    }
}

impl Handler<DeleteUnusedImages> for GcExecutorActor {
    type Result = ResponseActFuture<Self, Result<Arc<GcReport>, GcError>>;
    /// Removes every unused image old enough.
    fn handle(&mut self, m: DeleteUnusedImages, _: &mut Self::Context) -> Self::Result {
        info!("Attempting to delete unused images");
        self.run(GcMode::DeleteUnused, m.dry_run)
    }
}

/// Replaces the policy and protection rules (a configuration reload). Takes
/// effect from the next run; a run going on finishes with the old ones.
/// Enabling a disabled GC runs it at once; the periodic timer runs all along.
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct UpdateGcPolicy {
    /// Thresholds and ages.
    pub policy: GcPolicy,
    /// Pinned patterns and retention (the sandbox image id is kept).
    pub rules: ProtectionRules,
}

impl Handler<UpdateGcPolicy> for GcExecutorActor {
    type Result = ();
    fn handle(&mut self, m: UpdateGcPolicy, ctx: &mut Self::Context) {
        let was_disabled = self.cfg.policy.is_disabled();
        self.cfg.policy = m.policy;
        let sandbox = self.cfg.rules.sandbox_image_id.take();
        self.cfg.rules = ProtectionRules { sandbox_image_id: sandbox, ..m.rules };
        if was_disabled && !self.cfg.policy.is_disabled() {
            ctx.notify(Tick);
        }
        info!(policy = ?self.cfg.policy, "image GC policy updated");
    }
}

impl Handler<GetLastGcReport> for GcExecutorActor {
    type Result = MessageResult<GetLastGcReport>;
    /// The last report.
    fn handle(&mut self, _: GetLastGcReport, _: &mut Self::Context) -> Self::Result {
        MessageResult(self.last.clone())
    }
}
