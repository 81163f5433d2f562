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

use std::collections::HashSet;
use std::fmt;
use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
use std::time::{Duration, SystemTime};

use crate::domain::go_text;
use crate::gc::capacity::FsCapacity;
use crate::gc::detect::Records;
use crate::gc::policy::{GcPolicy, ProtectionRules, repository_of};
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
    const ALL: [KeepKind; 7] = [
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
                go_text::duration(*age),
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

/// The kubelet's usage: `100 − ⌊available × 100 / capacity⌋`, with available
/// clamped to capacity; `None` for capacity 0.
pub fn usage_percent(fs: FsCapacity) -> Option<u8> {
    if fs.capacity == 0 {
        return None;
    }
    let available = u128::from(fs.available.min(fs.capacity));
    let free_percent = available * 100 / u128::from(fs.capacity);
    u8::try_from(100u128.saturating_sub(free_percent)).ok()
}

/// The kubelet's amount to free: `capacity × (100 − low) / 100 − available`
/// in integer arithmetic (truncating), at least 0. Available is clamped to
/// capacity.
pub fn amount_to_free(fs: FsCapacity, low_threshold_percent: i64) -> u64 {
    let capacity = i128::from(fs.capacity);
    let available = i128::from(fs.available.min(fs.capacity));
    let keep_free = i128::from(100i64).saturating_sub(i128::from(low_threshold_percent));
    let target = capacity.saturating_mul(keep_free) / 100;
    let amount = target.saturating_sub(available).max(0);
    u64::try_from(amount).unwrap_or(u64::MAX)
}

/// A size in binary units with one decimal, as the kubelet's event prints
/// capacities: `512 B`, `1.5 KiB`, `26.4 GiB`, `100.0 GiB` (KiB up to EiB;
/// rounded half to even, as Go's `%.1f`).
pub fn format_size(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let value = u128::from(bytes);
    let mut unit = 0;
    let mut divisor: u128 = 1024;
    while unit + 1 < UNITS.len() && value >= divisor * 1024 {
        divisor *= 1024;
        unit += 1;
    }
    let tenths = value * 10;
    let (mut q, r) = (tenths / divisor, tenths % divisor);
    if r * 2 > divisor || (r * 2 == divisor && q % 2 == 1) {
        q += 1;
    }
    format!("{}.{} {}", q / 10, q % 10, UNITS.get(unit).copied().unwrap_or("EiB"))
}

/// The kubelet's `FreeDiskSpaceFailed` event text (and GC error).
pub fn free_disk_space_failed_message(usage_percent: u8, capacity: u64, freed: u64) -> String {
    format!(
        "Insufficient free disk space on the node's image filesystem ({usage_percent}% of {} used). \
         Failed to free sufficient space by deleting unused images (freed {freed} bytes). \
         Investigate disk usage, as it could be used by active images, logs, volumes, or other data.",
        format_size(capacity)
    )
}

/// Time from `then` to `now`; zero if `then` is later.
fn since(now: SystemTime, then: SystemTime) -> Duration {
    now.duration_since(then).unwrap_or(Duration::ZERO)
}

/// A candidate for deletion (an unprotected record), with what ordering
/// and the free-space checks need copied in, so sorting and the passes do
/// not chase the record's pointers.
#[derive(Clone, Copy)]
struct Candidate {
    last_used: Option<SystemTime>,
    first_detected: SystemTime,
    size: u64,
    /// Position of the record in the records' slice.
    slot: usize,
}

/// Why an image is protected from any deletion, if it is. The permanent
/// protections come first, so an in-use sandbox image reads "sandbox
/// image".
fn protection(record: &ImageRecord, in_use: &HashSet<String>, rules: &ProtectionRules) -> Option<KeepReason> {
    if rules.sandbox_image_id.as_deref() == Some(record.key.id.as_str()) {
        return Some(KeepReason::SandboxImage);
    }
    if record.pinned {
        return Some(KeepReason::PinnedByRuntime);
    }
    if let Some(pattern) = rules.pinned_by(&record.repo_tags, &record.repo_digests) {
        return Some(KeepReason::PinnedByRule(pattern.to_owned()));
    }
    if in_use.contains(record.key.id.as_str()) {
        return Some(KeepReason::InUse);
    }
    None
}

/// Why a candidate may not be deleted for space (or retention) now, if so:
/// the kubelet's free-space checks.
fn hold(c: &Candidate, policy: &GcPolicy, now: SystemTime) -> Option<KeepReason> {
    if c.last_used.is_some_and(|used| used >= now) {
        return Some(KeepReason::UsedSinceRunBegan);
    }
    // A first detection later than now is a negative age: younger than any
    // minimum age (as Go's `freeTime.Sub(firstDetected) < MinAge`).
    let age = since(now, c.first_detected);
    if c.first_detected > now || age < policy.min_age {
        return Some(KeepReason::TooYoung { age, min_age: policy.min_age });
    }
    None
}

/// Plans one GC run (see the module docs for the passes).
///
/// - `records`: the image records, just refreshed by [`Records::detect`];
/// - `in_use`: ids of images in use (containers in any state, the sandbox
///   image, pulls in flight, images ensured within the minimum age);
/// - `fs`: the image filesystem, measured before this run (unused and may
///   be zero in [`GcMode::DeleteUnused`]);
/// - `began`: when the GC loop started (the kubelet's `beganGC`: the max-age
///   pass waits until the loop has run for longer than the max age);
/// - `now`: when this run began (the kubelet's `freeTime`; images used at
///   or after it are kept).
///
/// The plan does not look at [`GcPolicy::is_disabled`]; the caller does.
///
/// # Errors
///
/// [`GcPlanError::InvalidCapacity`] in [`GcMode::Threshold`] when the
/// capacity is 0.
#[allow(clippy::too_many_arguments, reason = "the kubelet's inputs of one GC run, each distinct")]
pub fn plan_gc<'a>(
    records: &'a Records,
    in_use: &HashSet<String>,
    fs: FsCapacity,
    policy: &GcPolicy,
    rules: &ProtectionRules,
    began: SystemTime,
    now: SystemTime,
    mode: GcMode,
) -> Result<GcPlan<'a>, GcPlanError> {
    let slots: &'a [ImageRecord] = records.iter().as_slice();
    // Verdicts by slot; protected records get theirs now.
    let mut verdicts: Vec<Option<Verdict>> = vec![None; slots.len()];
    let mut candidates: Vec<Candidate> = Vec::with_capacity(slots.len());
    let mut image_bytes: u64 = 0;
    for ((slot, record), verdict) in slots.iter().enumerate().zip(verdicts.iter_mut()) {
        image_bytes = image_bytes.saturating_add(record.size);
        match protection(record, in_use, rules) {
            Some(reason) => *verdict = Some(Verdict::Keep(reason)),
            None => candidates.push(Candidate {
                last_used: record.last_used,
                first_detected: record.first_detected,
                size: record.size,
                slot,
            }),
        }
    }
    let threshold = mode == GcMode::Threshold;

    // Max-age pass (order does not matter for the verdicts).
    let max_age_pass = threshold && !policy.max_age.is_zero() && since(now, began) > policy.max_age;
    let mut freed_before_space: u64 = 0;
    if max_age_pass {
        for c in &candidates {
            if c.last_used.is_none_or(|used| since(now, used) > policy.max_age)
                && let Some(verdict) = verdicts.get_mut(c.slot)
            {
                *verdict = Some(Verdict::Delete(DeleteReason::Age));
                freed_before_space = freed_before_space.saturating_add(c.size);
            }
        }
    }

    let invalid_capacity = threshold && fs.capacity == 0;
    if threshold
        && !invalid_capacity
        && let Some(keep) = rules.keep_newest_tags_per_repo
    {
        let freed = retention(slots, &candidates, &mut verdicts, keep, policy, now);
        freed_before_space = freed_before_space.saturating_add(freed);
    }

    candidates.sort_unstable_by(|a, b| {
        a.last_used.cmp(&b.last_used).then_with(|| a.first_detected.cmp(&b.first_detected)).then_with(|| {
            let key = |c: &Candidate| slots.get(c.slot).map(|r| &r.key);
            key(a).cmp(&key(b))
        })
    });
    let verdict_of = |verdicts: &[Option<Verdict>], c: &Candidate| verdicts.get(c.slot).cloned().flatten();

    if invalid_capacity {
        let age_deletions = candidates
            .iter()
            .filter(|c| verdict_of(&verdicts, c) == Some(Verdict::Delete(DeleteReason::Age)))
            .filter_map(|c| slots.get(c.slot).map(|r| r.key.clone()))
            .collect();
        return Err(GcPlanError::InvalidCapacity { age_deletions });
    }
    let available_clamped = fs.available > fs.capacity;
    let fs = FsCapacity { capacity: fs.capacity, available: fs.available.min(fs.capacity) };
    let usage = usage_percent(fs);

    // Free-space pass, in eviction order.
    let projected = FsCapacity {
        capacity: fs.capacity,
        available: fs.available.saturating_add(freed_before_space).min(fs.capacity),
    };
    let projected_usage = usage_percent(projected);
    let (space_pass, amount) = match mode {
        GcMode::DeleteUnused => (true, u64::MAX),
        GcMode::Threshold => {
            if projected_usage.is_some_and(|u| i64::from(u) >= policy.high_threshold_percent) {
                (true, amount_to_free(projected, policy.low_threshold_percent))
            } else {
                (false, 0)
            }
        }
    };
    let mut space_freed: u64 = 0;
    let mut met = !space_pass;
    for c in &candidates {
        let Some(verdict) = verdicts.get_mut(c.slot) else { continue };
        if verdict.is_some() {
            continue;
        }
        if met {
            *verdict = Some(Verdict::Keep(KeepReason::NotNeeded));
            continue;
        }
        if let Some(reason) = hold(c, policy, now) {
            *verdict = Some(Verdict::Keep(reason));
            continue;
        }
        *verdict = Some(Verdict::Delete(DeleteReason::Space));
        space_freed = space_freed.saturating_add(c.size);
        // As the kubelet: checked after a deletion, so an amount of 0 still
        // deletes one image.
        met = space_freed >= amount;
    }

    // Assemble: deletions in run order, then what is kept.
    let mut entries: Vec<PlanEntry<'a>> = Vec::with_capacity(slots.len());
    let mut bytes_to_delete: u64 = 0;
    for stage in [DeleteReason::Age, DeleteReason::Retention, DeleteReason::Space] {
        for c in &candidates {
            if let (Some(Some(Verdict::Delete(reason))), Some(record)) = (verdicts.get(c.slot), slots.get(c.slot))
                && *reason == stage
            {
                bytes_to_delete = bytes_to_delete.saturating_add(c.size);
                entries.push(PlanEntry { record, verdict: Verdict::Delete(stage) });
            }
        }
    }
    let mut is_candidate = vec![false; slots.len()];
    for c in &candidates {
        if let Some(flag) = is_candidate.get_mut(c.slot) {
            *flag = true;
        }
    }
    for ((record, verdict), candidate) in slots.iter().zip(verdicts.iter_mut()).zip(&is_candidate) {
        if !candidate && let Some(verdict) = verdict.take() {
            entries.push(PlanEntry { record, verdict });
        }
    }
    for c in &candidates {
        if let (Some(verdict), Some(record)) = (verdicts.get_mut(c.slot), slots.get(c.slot))
            && matches!(verdict, Some(Verdict::Keep(_)))
            && let Some(verdict) = verdict.take()
        {
            entries.push(PlanEntry { record, verdict });
        }
    }

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
        usage_percent: usage,
        projected_usage_percent: projected_usage,
        max_age_pass,
        space_pass,
        amount_to_free: if space_pass { amount } else { 0 },
        bytes_to_delete,
        entries,
        shortfall,
    })
}

/// Retention: per repository (of the candidates' tags), the newest `keep`
/// candidates without a verdict yet (by first detection, ties by key) are
/// retained; a candidate retained by none of its repositories is deleted
/// (reason retention) unless used since the run began or too young.
/// Untagged images have no repository and are left to the other passes.
/// Returns the bytes deleted.
///
/// Walks the candidates in record order (where their strings lie in
/// memory) and groups repositories by sorting (hash, name) pairs rather
/// than building a map of vectors.
fn retention(
    slots: &[ImageRecord],
    candidates: &[Candidate],
    verdicts: &mut [Option<Verdict>],
    keep: usize,
    policy: &GcPolicy,
    now: SystemTime,
) -> u64 {
    let hasher = BuildHasherDefault::<DefaultHasher>::default();
    // (hash of the repository, repository, first detected, slot)
    let mut members: Vec<(u64, &str, SystemTime, usize)> = Vec::with_capacity(candidates.len());
    let mut repos: Vec<&str> = Vec::new();
    for c in candidates {
        let (Some(None), Some(record)) = (verdicts.get(c.slot), slots.get(c.slot)) else { continue };
        repos.clear();
        for tag in &record.repo_tags {
            let repo = repository_of(tag);
            if !repos.contains(&repo) {
                repos.push(repo);
                members.push((hasher.hash_one(repo), repo, c.first_detected, c.slot));
            }
        }
    }
    let key = |slot: usize| slots.get(slot).map(|r| &r.key);
    members.sort_unstable_by(|a, b| {
        (a.0, a.1).cmp(&(b.0, b.1)).then_with(|| b.2.cmp(&a.2)).then_with(|| key(a.3).cmp(&key(b.3)))
    });
    let mut subject = vec![false; slots.len()];
    let mut retained = vec![false; slots.len()];
    let mut rank = 0usize;
    let mut group: Option<(u64, &str)> = None;
    for &(hash, repo, _, slot) in &members {
        if group != Some((hash, repo)) {
            group = Some((hash, repo));
            rank = 0;
        }
        if let Some(s) = subject.get_mut(slot) {
            *s = true;
        }
        if rank < keep
            && let Some(r) = retained.get_mut(slot)
        {
            *r = true;
        }
        rank = rank.saturating_add(1);
    }
    let mut freed: u64 = 0;
    for c in candidates {
        let excess = subject.get(c.slot).copied().unwrap_or(false) && !retained.get(c.slot).copied().unwrap_or(true);
        let Some(verdict) = verdicts.get_mut(c.slot) else { continue };
        if !excess || verdict.is_some() {
            continue;
        }
        *verdict = Some(match hold(c, policy, now) {
            Some(reason) => Verdict::Keep(reason),
            None => {
                freed = freed.saturating_add(c.size);
                Verdict::Delete(DeleteReason::Retention)
            }
        });
    }
    freed
}

/// Totals of the kept entries by reason, in [`KeepKind`] order.
fn held(entries: &[PlanEntry<'_>]) -> Vec<Held> {
    let mut totals = [(0usize, 0u64); KeepKind::ALL.len()];
    for entry in entries {
        if let Verdict::Keep(reason) = &entry.verdict {
            let kind = reason.kind();
            if let Some(slot) = KeepKind::ALL.iter().position(|k| *k == kind).and_then(|i| totals.get_mut(i)) {
                slot.0 = slot.0.saturating_add(1);
                slot.1 = slot.1.saturating_add(entry.record.size);
            }
        }
    }
    KeepKind::ALL
        .iter()
        .zip(totals)
        .filter(|(_, (images, _))| *images > 0)
        .map(|(&reason, (images, bytes))| Held { reason, images, bytes })
        .collect()
}
