//! The kubelet's `GarbageCollect` and `DeleteUnusedImages` as a pure,
//! explainable plan: every image with its verdict (delete: age, space,
//! retention; keep: in use, pinned, sandbox image, too young, used since the
//! run began, not needed), the usage and the amount to free computed with
//! the kubelet's integer arithmetic, and, when the target cannot be met,
//! what was eligible and what holds the rest. No I/O: the GC executor
//! deletes the planned images in plan order and measures the filesystem
//! again.
//!
//! One [`plan_gc`] call stands for one kubelet GC run:
//!
//! 1. eviction order: every record not protected (in use, pinned by the
//!    runtime, the sandbox image, pinned by a rule), least recently used
//!    first (never used before any use), ties by first detection;
//! 2. max-age pass (when the max age is set and the GC loop began more than
//!    the max age ago): every candidate unused for longer than the max age
//!    (never-used ones included, as in the kubelet) is deleted, reason age;
//! 3. capacity: zero is an error; available is clamped to capacity;
//! 4. retention (imaged's rule, when set): per repository, unused images
//!    beyond the newest N are deleted, reason retention;
//! 5. usage: the bytes of steps 2 and 4 count as freed (the kubelet measures
//!    the filesystem again after its age pass); if usage is at or above the
//!    high threshold, a free-space pass deletes candidates in eviction order
//!    (skipping those used since the run began and those younger than the
//!    minimum age) until the amount to free is reached, reason space.
//!
//! Files: `verdict.rs` (the plan, its verdicts and reasons), `usage.rs`
//! (the kubelet's arithmetic and texts), `passes.rs` (the passes).

mod passes;
mod usage;
mod verdict;

use std::time::SystemTime;

pub use usage::{amount_to_free, format_size, free_disk_space_failed_message, usage_percent};
pub use verdict::{
    DeleteReason, GcMode, GcPlan, GcPlanError, Held, KeepKind, KeepReason, PlanEntry, Shortfall, Verdict,
};

use crate::gc::capacity::FsCapacity;
use crate::gc::detect::{InUseIds, Records};
use crate::gc::policy::{GcPolicy, ProtectionRules};
use passes::{Passes, held, since};

#[cfg(test)]
use crate::gc::record::{ImageRecord, RecordKey};

#[cfg(test)]
mod tests;

/// What one GC run is planned from: the kubelet's inputs of one
/// `GarbageCollect` (or `DeleteUnusedImages`) call.
#[derive(Debug, Clone, Copy)]
pub struct GcRunInputs<'a> {
    /// The image records, just refreshed by [`Records::detect`].
    pub records: &'a Records,
    /// Ids of images in use (containers in any state, the sandbox image,
    /// pulls in flight, images ensured within the minimum age).
    pub in_use: &'a dyn InUseIds,
    /// The image filesystem, measured before this run (unused and may be
    /// zero in [`GcMode::DeleteUnused`]).
    pub fs: FsCapacity,
    /// Thresholds and ages.
    pub policy: &'a GcPolicy,
    /// What is protected besides images in use (sandbox image, pinned
    /// patterns) and the retention rule.
    pub rules: &'a ProtectionRules,
    /// When the GC loop started (the kubelet's `beganGC`: the max-age pass
    /// waits until the loop has run for longer than the max age).
    pub began: SystemTime,
    /// When this run began (the kubelet's `freeTime`; images used at or
    /// after it are kept).
    pub now: SystemTime,
    /// Which entry point the plan stands for.
    pub mode: GcMode,
}

/// Plans one GC run (see the module docs for the passes).
///
/// The plan does not look at [`GcPolicy::is_disabled`]; the caller does.
///
/// # Errors
///
/// [`GcPlanError::InvalidCapacity`] in [`GcMode::Threshold`] when the
/// capacity is 0.
pub fn plan_gc(inputs: GcRunInputs<'_>) -> Result<GcPlan<'_>, GcPlanError> {
    let GcRunInputs { records, in_use, fs, policy, rules, began, now, mode } = inputs;
    let threshold = mode == GcMode::Threshold;
    let mut passes = Passes::new(records, in_use, rules);

    let max_age_pass = threshold && !policy.max_age.is_zero() && since(now, began) > policy.max_age;
    let mut freed_before_space: u64 = 0;
    if max_age_pass {
        freed_before_space = passes.max_age(policy.max_age, now);
    }
    let invalid_capacity = threshold && fs.capacity == 0;
    if threshold
        && !invalid_capacity
        && let Some(keep) = rules.keep_newest_tags_per_repo
    {
        freed_before_space = freed_before_space.saturating_add(passes.retention(keep, policy, now));
    }
    passes.sort_into_eviction_order();
    if invalid_capacity {
        return Err(GcPlanError::InvalidCapacity { age_deletions: passes.age_deletions() });
    }

    let available_clamped = fs.available > fs.capacity;
    let fs = FsCapacity { capacity: fs.capacity, available: fs.available.min(fs.capacity) };
    // The max-age and retention deletions count as freed before the
    // threshold check (the kubelet measures again after its age pass).
    let projected = FsCapacity {
        capacity: fs.capacity,
        available: fs.available.saturating_add(freed_before_space).min(fs.capacity),
    };
    let (space_pass, amount) = space_target(mode, projected, policy);
    let space_freed = passes.free_space(space_pass, amount, policy, now);
    let image_bytes = passes.image_bytes;
    let (entries, bytes_to_delete) = passes.into_entries();

    let shortfall = (threshold && space_pass && space_freed < amount).then(|| Shortfall {
        wanted: amount,
        eligible_bytes: space_freed,
        held: held(&entries),
        unaccounted_bytes: fs.capacity.saturating_sub(fs.available).saturating_sub(image_bytes),
    });
    Ok(GcPlan {
        mode,
        fs,
        available_clamped,
        usage_percent: usage_percent(fs),
        projected_usage_percent: usage_percent(projected),
        max_age_pass,
        space_pass,
        amount_to_free: if space_pass { amount } else { 0 },
        bytes_to_delete,
        entries,
        shortfall,
    })
}

/// Whether the free-space pass runs, and the bytes it must free: always,
/// everything, for [`GcMode::DeleteUnused`]; in [`GcMode::Threshold`] when
/// the projected usage is at or above the high threshold, down to the low.
fn space_target(mode: GcMode, projected: FsCapacity, policy: &GcPolicy) -> (bool, u64) {
    match mode {
        GcMode::DeleteUnused => (true, u64::MAX),
        GcMode::Threshold => {
            if usage_percent(projected).is_some_and(|u| i64::from(u) >= policy.high_threshold_percent) {
                (true, amount_to_free(projected, policy.low_threshold_percent))
            } else {
                (false, 0)
            }
        }
    }
}
