//! What a plan says: the verdict on each image (delete with a reason, keep
//! with a reason), the plan itself ([`GcPlan`]), the shortfall when the
//! free-space target cannot be met, and why no plan could be made.

use std::fmt;
use std::time::Duration;

use super::usage::free_disk_space_failed_message;
use crate::domain::go_text;
use crate::gc::capacity::FsCapacity;
use crate::gc::record::{ImageRecord, RecordKey};

#[cfg(test)]
mod tests;

/// Which kubelet entry point a plan stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GcMode {
    /// `GarbageCollect`: max-age pass, then free space down to the low
    /// threshold when usage reached the high one.
    Threshold,
    /// `DeleteUnusedImages` (disk-pressure reclaim): delete every unused
    /// image past the minimum age, whatever the usage; no max-age pass, no
    /// retention, capacity not needed.
    DeleteUnused,
}

/// Why an image is deleted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeleteReason {
    /// Unused for longer than the maximum age.
    Age,
    /// To bring usage down to the low threshold (or disk-pressure reclaim).
    Space,
    /// Not among the newest N unused images of any of its repositories.
    Retention,
}

impl DeleteReason {
    /// The `reason` label of `kubelet_image_garbage_collected_total`
    /// (`retention` is imaged's own).
    pub fn metric_label(self) -> &'static str {
        match self {
            DeleteReason::Age => "age",
            DeleteReason::Space => "space",
            DeleteReason::Retention => "retention",
        }
    }
}

impl fmt::Display for DeleteReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DeleteReason::Age => "unused for longer than the maximum age",
            DeleteReason::Space => "frees space",
            DeleteReason::Retention => "older than the newest unused images kept per repository",
        })
    }
}

/// Why an image is kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeepReason {
    /// A container (or a pull in flight, or a recent ensure) uses it.
    InUse,
    /// The runtime pins it (`Image.pinned`).
    PinnedByRuntime,
    /// A `gc.pinned_images` pattern matches one of its tags or digests.
    PinnedByRule(String),
    /// It is the sandbox image (by resolved id).
    SandboxImage,
    /// First detected less than the minimum age ago.
    TooYoung {
        /// Time since first detection.
        age: Duration,
        /// The policy's minimum age.
        min_age: Duration,
    },
    /// Used at or after the time this run began.
    UsedSinceRunBegan,
    /// Deletable, but the target was met before its turn (or usage is below
    /// the high threshold).
    NotNeeded,
}

/// [`KeepReason`] without its details, for totals.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum KeepKind {
    /// [`KeepReason::InUse`].
    InUse,
    /// [`KeepReason::PinnedByRuntime`].
    PinnedByRuntime,
    /// [`KeepReason::PinnedByRule`].
    PinnedByRule,
    /// [`KeepReason::SandboxImage`].
    SandboxImage,
    /// [`KeepReason::TooYoung`].
    TooYoung,
    /// [`KeepReason::UsedSinceRunBegan`].
    UsedSinceRunBegan,
    /// [`KeepReason::NotNeeded`].
    NotNeeded,
}

impl KeepKind {
    /// Every kind, in order.
    pub const ALL: [KeepKind; 7] = [
        KeepKind::InUse,
        KeepKind::PinnedByRuntime,
        KeepKind::PinnedByRule,
        KeepKind::SandboxImage,
        KeepKind::TooYoung,
        KeepKind::UsedSinceRunBegan,
        KeepKind::NotNeeded,
    ];
}

impl KeepReason {
    /// The reason without its details.
    pub fn kind(&self) -> KeepKind {
        match self {
            KeepReason::InUse => KeepKind::InUse,
            KeepReason::PinnedByRuntime => KeepKind::PinnedByRuntime,
            KeepReason::PinnedByRule(_) => KeepKind::PinnedByRule,
            KeepReason::SandboxImage => KeepKind::SandboxImage,
            KeepReason::TooYoung { .. } => KeepKind::TooYoung,
            KeepReason::UsedSinceRunBegan => KeepKind::UsedSinceRunBegan,
            KeepReason::NotNeeded => KeepKind::NotNeeded,
        }
    }
}

impl fmt::Display for KeepReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeepReason::InUse => f.write_str("in use"),
            KeepReason::PinnedByRuntime => f.write_str("pinned by the runtime"),
            KeepReason::PinnedByRule(pattern) => write!(f, "pinned by rule {}", go_text::quote(pattern)),
            KeepReason::SandboxImage => f.write_str("sandbox image"),
            KeepReason::TooYoung { age, min_age } => write!(
                f,
                "too young (first detected {} ago, minimum age {})",
                // Whole seconds (below one, milliseconds): "51s", not "51.465672002s".
                go_text::duration(if *age >= Duration::from_secs(1) {
                    Duration::from_secs(age.as_secs())
                } else {
                    Duration::from_millis(u64::from(age.subsec_millis()))
                }),
                go_text::duration(*min_age)
            ),
            KeepReason::UsedSinceRunBegan => f.write_str("used since the run began"),
            KeepReason::NotNeeded => f.write_str("not needed (target already met)"),
        }
    }
}

/// The verdict on one image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Delete it.
    Delete(DeleteReason),
    /// Keep it.
    Keep(KeepReason),
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Verdict::Delete(reason) => write!(f, "delete: {reason}"),
            Verdict::Keep(reason) => write!(f, "keep: {reason}"),
        }
    }
}

/// One image of a plan: its record (id, handler, tags, size…) and verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanEntry<'a> {
    /// The image's record.
    pub record: &'a ImageRecord,
    /// What the plan does with it.
    pub verdict: Verdict,
}

impl PlanEntry<'_> {
    /// The image's key.
    pub fn key(&self) -> &RecordKey {
        &self.record.key
    }

    /// The image's size in bytes.
    pub fn size(&self) -> u64 {
        self.record.size
    }

    /// Why it is deleted, if it is.
    pub fn delete_reason(&self) -> Option<DeleteReason> {
        match self.verdict {
            Verdict::Delete(reason) => Some(reason),
            Verdict::Keep(_) => None,
        }
    }
}

/// Images and bytes kept for one reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Held {
    /// The reason.
    pub reason: KeepKind,
    /// How many images.
    pub images: usize,
    /// Their bytes.
    pub bytes: u64,
}

/// Why a free-space pass cannot reach its target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shortfall {
    /// Bytes the free-space pass had to free ([`GcPlan::amount_to_free`]).
    pub wanted: u64,
    /// Bytes it found eligible (all of them are deleted).
    pub eligible_bytes: u64,
    /// What every kept image is kept for, by reason (reasons with no image
    /// left out), in [`KeepKind`] order.
    pub held: Vec<Held>,
    /// Used bytes of the filesystem that no image record accounts for
    /// (logs, volumes, other data; or layers the runtime's sizes miss).
    pub unaccounted_bytes: u64,
}

/// A GC run, decided: every image with its verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GcPlan<'a> {
    /// What the plan stands for.
    pub mode: GcMode,
    /// The filesystem as used by the plan (available clamped to capacity).
    pub fs: FsCapacity,
    /// The reported available bytes exceeded the capacity and were clamped
    /// (the kubelet logs this).
    pub available_clamped: bool,
    /// Usage as measured, `100 − ⌊available × 100 / capacity⌋`; `None` only
    /// for [`GcMode::DeleteUnused`] with capacity 0.
    pub usage_percent: Option<u8>,
    /// Usage once the max-age and retention deletions are done (their
    /// sizes counted as freed), which the threshold is checked against (the
    /// kubelet measures the filesystem after its max-age pass).
    pub projected_usage_percent: Option<u8>,
    /// The max-age pass ran.
    pub max_age_pass: bool,
    /// The free-space pass ran (usage at or above the high threshold, or
    /// [`GcMode::DeleteUnused`]).
    pub space_pass: bool,
    /// Bytes the free-space pass had to free:
    /// `capacity × (100 − low) / 100 − available` (integer arithmetic, on
    /// the projected available); 0 when the pass did not run; `u64::MAX`
    /// for [`GcMode::DeleteUnused`].
    pub amount_to_free: u64,
    /// Total size of the images the plan deletes.
    pub bytes_to_delete: u64,
    /// Every record exactly once: first the deletions in the order to run
    /// them (age, then retention, then space; each in eviction order), then
    /// the kept images (protected ones, then candidates in eviction order).
    pub entries: Vec<PlanEntry<'a>>,
    /// Set when the free-space pass cannot free [`GcPlan::amount_to_free`].
    pub shortfall: Option<Shortfall>,
}

impl<'a> GcPlan<'a> {
    /// The deletions, in the order to run them.
    pub fn deletions(&self) -> impl Iterator<Item = (&'a ImageRecord, DeleteReason)> + '_ {
        self.entries.iter().filter_map(|e| e.delete_reason().map(|reason| (e.record, reason)))
    }

    /// The kept images and why.
    pub fn kept(&self) -> impl Iterator<Item = (&'a ImageRecord, &KeepReason)> + '_ {
        self.entries.iter().filter_map(|e| match &e.verdict {
            Verdict::Keep(reason) => Some((e.record, reason)),
            Verdict::Delete(_) => None,
        })
    }

    /// The kubelet's `FreeDiskSpaceFailed` text for this plan's shortfall,
    /// with the bytes the plan expects to free. After running the plan, call
    /// [`free_disk_space_failed_message`] with the bytes actually freed.
    pub fn free_disk_space_failed_message(&self) -> Option<String> {
        let shortfall = self.shortfall.as_ref()?;
        let usage = self.projected_usage_percent?;
        Some(free_disk_space_failed_message(usage, self.fs.capacity, shortfall.eligible_bytes))
    }
}

/// Why no plan could be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GcPlanError {
    /// The image filesystem reports capacity 0 (the kubelet's
    /// `InvalidDiskCapacity`). As in the kubelet, the max-age pass comes
    /// before the capacity check: `age_deletions` are the images it deletes
    /// anyway, in order.
    #[error("invalid capacity 0 on image filesystem")]
    InvalidCapacity {
        /// Images the max-age pass deletes (reason age), in order.
        age_deletions: Vec<RecordKey>,
    },
}
