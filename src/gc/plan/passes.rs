//! The kubelet's passes over one run's records, each a step of
//! [`plan_gc`](super::plan_gc): protection, the max-age pass, retention,
//! eviction order, the free-space pass, then the entries in run order.
//! Verdicts are kept by the record's position, so the passes never search.

use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
use std::time::{Duration, SystemTime};

use super::verdict::{DeleteReason, Held, KeepKind, KeepReason, PlanEntry, Verdict};
use crate::gc::detect::{InUseIds, Records};
use crate::gc::policy::{GcPolicy, ProtectionRules, repository_of};
use crate::gc::record::{ImageRecord, RecordKey};

/// Time from `then` to `now`; zero if `then` is later.
pub(super) fn since(now: SystemTime, then: SystemTime) -> Duration {
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
fn protection(record: &ImageRecord, in_use: &dyn InUseIds, rules: &ProtectionRules) -> Option<KeepReason> {
    if rules.sandbox_image_id.as_deref() == Some(record.key.id.as_str()) {
        return Some(KeepReason::SandboxImage);
    }
    if record.pinned {
        return Some(KeepReason::PinnedByRuntime);
    }
    if let Some(pattern) = rules.pinned_by(&record.repo_tags, &record.repo_digests) {
        return Some(KeepReason::PinnedByRule(pattern.to_owned()));
    }
    if in_use.contains_id(record.key.id.as_str()) {
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

/// One plan in the making: a verdict slot per record (by position) and the
/// candidates (unprotected records), which the passes decide in turn.
pub(super) struct Passes<'a> {
    slots: &'a [ImageRecord],
    verdicts: Vec<Option<Verdict>>,
    candidates: Vec<Candidate>,
    /// Bytes of every record, protected or not (the shortfall's
    /// unaccounted bytes are what the filesystem uses beyond them).
    pub(super) image_bytes: u64,
}

impl<'a> Passes<'a> {
    /// The protection pass: protected records get their verdict (keep, and
    /// why); every other record is a candidate, in record order.
    pub(super) fn new(records: &'a Records, in_use: &dyn InUseIds, rules: &ProtectionRules) -> Self {
        let slots: &'a [ImageRecord] = records.iter().as_slice();
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
        Self { slots, verdicts, candidates, image_bytes }
    }

    /// The max-age pass: every candidate unused for longer than `max_age`
    /// (never-used ones included, as in the kubelet) is deleted, reason age.
    /// Order does not matter for the verdicts. Returns the bytes deleted.
    pub(super) fn max_age(&mut self, max_age: Duration, now: SystemTime) -> u64 {
        let mut freed: u64 = 0;
        for c in &self.candidates {
            if c.last_used.is_none_or(|used| since(now, used) > max_age)
                && let Some(verdict) = self.verdicts.get_mut(c.slot)
            {
                *verdict = Some(Verdict::Delete(DeleteReason::Age));
                freed = freed.saturating_add(c.size);
            }
        }
        freed
    }

    /// Retention (imaged's rule): see [`retention`]. Returns the bytes deleted.
    pub(super) fn retention(&mut self, keep: usize, policy: &GcPolicy, now: SystemTime) -> u64 {
        retention(self.slots, &self.candidates, &mut self.verdicts, keep, policy, now)
    }

    /// Sorts the candidates into eviction order: least recently used first
    /// (never used before any use), then first detected, then key.
    pub(super) fn sort_into_eviction_order(&mut self) {
        let slots = self.slots;
        self.candidates.sort_unstable_by(|a, b| {
            a.last_used.cmp(&b.last_used).then_with(|| a.first_detected.cmp(&b.first_detected)).then_with(|| {
                let key = |c: &Candidate| slots.get(c.slot).map(|r| &r.key);
                key(a).cmp(&key(b))
            })
        });
    }

    /// The keys the max-age pass deleted, in candidate order.
    pub(super) fn age_deletions(&self) -> Vec<RecordKey> {
        self.candidates
            .iter()
            .filter(|c| self.verdicts.get(c.slot).cloned().flatten() == Some(Verdict::Delete(DeleteReason::Age)))
            .filter_map(|c| self.slots.get(c.slot).map(|r| r.key.clone()))
            .collect()
    }

    /// The free-space pass, in eviction order, over the candidates without
    /// a verdict: when it does not `run`, or once `amount` is freed, they
    /// are not needed; the kubelet's checks hold some back; the rest are
    /// deleted, reason space. Returns the bytes deleted.
    pub(super) fn free_space(&mut self, run: bool, amount: u64, policy: &GcPolicy, now: SystemTime) -> u64 {
        let mut freed: u64 = 0;
        let mut met = !run;
        for c in &self.candidates {
            let Some(verdict) = self.verdicts.get_mut(c.slot) else { continue };
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
            freed = freed.saturating_add(c.size);
            // As the kubelet: checked after a deletion, so an amount of 0
            // still deletes one image.
            met = freed >= amount;
        }
        freed
    }

    /// Every record exactly once: the deletions in run order (age, then
    /// retention, then space; each in eviction order), then the protected
    /// records (record order), then the kept candidates (eviction order);
    /// and the bytes the deletions free.
    pub(super) fn into_entries(mut self) -> (Vec<PlanEntry<'a>>, u64) {
        let slots = self.slots;
        let mut entries: Vec<PlanEntry<'a>> = Vec::with_capacity(slots.len());
        let mut bytes_to_delete: u64 = 0;
        for stage in [DeleteReason::Age, DeleteReason::Retention, DeleteReason::Space] {
            for c in &self.candidates {
                if let (Some(Some(Verdict::Delete(reason))), Some(record)) =
                    (self.verdicts.get(c.slot), slots.get(c.slot))
                    && *reason == stage
                {
                    bytes_to_delete = bytes_to_delete.saturating_add(c.size);
                    entries.push(PlanEntry { record, verdict: Verdict::Delete(stage) });
                }
            }
        }
        let mut is_candidate = vec![false; slots.len()];
        for c in &self.candidates {
            if let Some(flag) = is_candidate.get_mut(c.slot) {
                *flag = true;
            }
        }
        for ((record, verdict), candidate) in slots.iter().zip(self.verdicts.iter_mut()).zip(&is_candidate) {
            if !candidate && let Some(verdict) = verdict.take() {
                entries.push(PlanEntry { record, verdict });
            }
        }
        for c in &self.candidates {
            if let (Some(verdict), Some(record)) = (self.verdicts.get_mut(c.slot), slots.get(c.slot))
                && matches!(verdict, Some(Verdict::Keep(_)))
                && let Some(verdict) = verdict.take()
            {
                entries.push(PlanEntry { record, verdict });
            }
        }
        (entries, bytes_to_delete)
    }
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
pub(super) fn held(entries: &[PlanEntry<'_>]) -> Vec<Held> {
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
