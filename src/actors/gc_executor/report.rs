//! What a GC run gives back: the report ([`GcReport`], one [`ReportEntry`]
//! per image, the [`RemovedImage`]s) or why it failed ([`GcError`]), and
//! the report built from a plan and the detection it was made from.

use std::sync::Arc;
use std::time::SystemTime;

use crate::cri::CriError;
use crate::gc::capacity::FsCapacity;
#[cfg(doc)]
use crate::gc::capacity::MeasuredBy;
use crate::gc::plan::{GcMode, GcPlan, Held, KeepKind, KeepReason, Shortfall, Verdict};

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
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GcReport {
    /// `RunGc` (threshold) or `DeleteUnusedImages`.
    pub mode: GcMode,
    /// Nothing was removed.
    pub dry_run: bool,
    /// When the run began.
    pub started: SystemTime,
    /// The filesystem before.
    pub before: FsCapacity,
    /// How the filesystem was measured ([`MeasuredBy`]'s text: `statvfs
    /// <mountpoint>`, the reported used bytes and `gc.image_fs_capacity`, or
    /// the embedded runtime's simulation).
    pub measured_by: String,
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
    /// Why a run that removed what it could still failed (the kubelet's
    /// text: the free-space target missed, or removals that failed); `None`
    /// when it succeeded. The run's error carries this report.
    pub target_missed: Option<String>,
    /// Kept images that `entries` does not list, counted by reason (in
    /// [`KeepKind`] order); empty when it lists every image. Only a report
    /// made by [`GcReport::bounded`] leaves any out: the one the executor
    /// keeps between runs.
    pub kept_unlisted: Vec<Held>,
}

/// Kept images of each reason that the report the executor keeps between
/// runs lists one by one ([`GcReport::bounded`]).
pub const KEPT_LISTED_PER_REASON: usize = 200;

impl GcReport {
    /// The report of `plan`, before any removal: every entry with who uses
    /// it (`used_by`, the detection's), the plan's numbers; `before` is
    /// the filesystem as measured (not clamped), `started` when the run began.
    pub fn from_plan(
        plan: &GcPlan<'_>,
        used_by: impl Fn(&str) -> Vec<String>,
        dry_run: bool,
        started: SystemTime,
        before: FsCapacity,
    ) -> Self {
        Self::from_plan_listing(plan, used_by, dry_run, started, before, usize::MAX)
    }

    /// [`GcReport::from_plan`] listing at most `per_reason` kept images of
    /// each reason: the report [`GcReport::bounded`] makes of the whole one,
    /// without making the whole one first.
    pub fn from_plan_listing(
        plan: &GcPlan<'_>,
        used_by: impl Fn(&str) -> Vec<String>,
        dry_run: bool,
        started: SystemTime,
        before: FsCapacity,
        per_reason: usize,
    ) -> Self {
        let mut kept = KeptCount::default();
        let mut entries = Vec::with_capacity(listed_at_most(plan.entries.len(), plan.deletions().count(), per_reason));
        entries.extend(plan.entries.iter().filter(|e| kept.lists(&e.verdict, e.record.size, per_reason)).map(|e| {
            ReportEntry {
                id: e.record.key.id.clone(),
                runtime_handler: e.record.key.runtime_handler.clone(),
                repo_tags: e.record.repo_tags.clone(),
                size: e.record.size,
                verdict: e.verdict.clone(),
                used_by: used_by(&e.record.key.id),
            }
        }));
        GcReport {
            mode: plan.mode,
            dry_run,
            started,
            before,
            measured_by: String::new(),
            usage_percent: plan.usage_percent,
            projected_usage_percent: plan.projected_usage_percent,
            amount_to_free: plan.amount_to_free,
            entries,
            shortfall: plan.shortfall.clone(),
            removed: Vec::new(),
            failed: Vec::new(),
            bytes_expected: plan.bytes_to_delete,
            bytes_freed_measured: None,
            target_missed: None,
            kept_unlisted: kept.unlisted(Vec::new()),
        }
    }

    /// Whether [`GcReport::bounded`] would leave out no entry.
    pub fn is_bounded(&self, per_reason: usize) -> bool {
        let mut kept = KeptCount::default();
        self.entries.iter().all(|e| kept.lists(&e.verdict, e.size, per_reason))
    }

    /// The same report listing every deletion but at most `per_reason` kept
    /// images of each reason (the first ones, in report order), the others
    /// counted in `kept_unlisted`. The executor keeps this between runs:
    /// a whole report costs about 340 bytes per image (33 MB at 100,000
    /// images, `benches/gc.rs`), held until the next run, and went whole
    /// with every `imagectl status`.
    pub fn bounded(&self, per_reason: usize) -> GcReport {
        let mut kept = KeptCount::default();
        let mut entries = Vec::with_capacity(listed_at_most(self.entries.len(), self.deletions().count(), per_reason));
        entries.extend(self.entries.iter().filter(|e| kept.lists(&e.verdict, e.size, per_reason)).cloned());
        GcReport {
            entries,
            kept_unlisted: kept.unlisted(self.kept_unlisted.clone()),
            measured_by: self.measured_by.clone(),
            shortfall: self.shortfall.clone(),
            removed: self.removed.clone(),
            failed: self.failed.clone(),
            target_missed: self.target_missed.clone(),
            ..*self
        }
    }

    /// The entries to delete, in the order to remove them.
    pub fn deletions(&self) -> impl Iterator<Item = &ReportEntry> {
        self.entries.iter().filter(|e| matches!(e.verdict, Verdict::Delete(_)))
    }
}

/// How many of `entries` entries, `deletions` of them deletions, a report
/// listing `per_reason` kept images of each reason lists at most: its
/// entries' capacity, so a report of every image holds no spare room.
fn listed_at_most(entries: usize, deletions: usize, per_reason: usize) -> usize {
    entries.min(deletions.saturating_add(per_reason.saturating_mul(KeepKind::ALL.len())))
}

/// Kept images seen by reason, and those left unlisted (images, bytes).
#[derive(Default)]
struct KeptCount {
    seen: [usize; KeepKind::ALL.len()],
    unlisted: [(usize, u64); KeepKind::ALL.len()],
}

impl KeptCount {
    /// Whether an entry with `verdict` is listed: every deletion, and the
    /// first `per_reason` kept images of each reason; one left out is
    /// counted.
    fn lists(&mut self, verdict: &Verdict, size: u64, per_reason: usize) -> bool {
        let Verdict::Keep(reason) = verdict else { return true };
        let slot = KeepKind::ALL.iter().position(|k| *k == reason.kind()).unwrap_or(0);
        let (Some(seen), Some(unlisted)) = (self.seen.get_mut(slot), self.unlisted.get_mut(slot)) else { return true };
        *seen += 1;
        if *seen <= per_reason {
            return true;
        }
        unlisted.0 += 1;
        unlisted.1 = unlisted.1.saturating_add(size);
        false
    }

    /// `earlier` (a bounded report's) with these counts added, in
    /// [`KeepKind`] order.
    fn unlisted(&self, mut earlier: Vec<Held>) -> Vec<Held> {
        for (&reason, &(images, bytes)) in KeepKind::ALL.iter().zip(&self.unlisted) {
            if images == 0 {
                continue;
            }
            match earlier.iter_mut().find(|h| h.reason == reason) {
                Some(h) => {
                    h.images += images;
                    h.bytes = h.bytes.saturating_add(bytes);
                }
                None => earlier.push(Held { reason, images, bytes }),
            }
        }
        earlier.sort_by_key(|h| h.reason);
        earlier
    }
}

impl GcError {
    /// The report of a run that removed what it could and still failed
    /// ([`GcError::Deletion`], [`GcError::NotEnoughFreed`]).
    pub fn report(&self) -> Option<&Arc<GcReport>> {
        match self {
            GcError::Deletion { report, .. } | GcError::NotEnoughFreed { report, .. } => Some(report),
            _ => None,
        }
    }
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
    /// Removals failed (the kubelet's texts); `report` says what was
    /// removed and freed all the same.
    #[error("{message}")]
    Deletion {
        /// The kubelet's text.
        message: String,
        /// The run's report, `target_missed` set to `message`.
        report: Arc<GcReport>,
    },
    /// Not enough space could be freed (the kubelet's `FreeDiskSpaceFailed`
    /// text); `report` says what was removed and freed all the same.
    #[error("{message}")]
    NotEnoughFreed {
        /// The kubelet's text.
        message: String,
        /// The run's report, `target_missed` set to `message`.
        report: Arc<GcReport>,
    },
    /// The detector stopped.
    #[error("the image detector stopped")]
    DetectorStopped,
}
