use std::collections::HashSet;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::*;

const MIN: Duration = Duration::from_secs(60);
const HOUR: Duration = Duration::from_secs(3600);

fn t(secs: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_700_000_000 + secs)
}

/// The time of every plan here; records detected at `t(0)` are hours old.
fn now() -> SystemTime {
    t(10_000)
}

fn ago(d: Duration) -> SystemTime {
    now() - d
}

/// An old, unused, unpinned 100-byte image with one tag.
fn rec(id: &str) -> ImageRecord {
    ImageRecord {
        key: RecordKey::id(id),
        first_detected: t(0),
        last_used: None,
        size: 100,
        pinned: false,
        repo_tags: vec![format!("example.com/{id}:v1")],
        repo_digests: vec![format!("example.com/{id}@sha256:{id}")],
    }
}

trait With {
    fn size(self, n: u64) -> Self;
    fn used(self, at: SystemTime) -> Self;
    fn detected(self, at: SystemTime) -> Self;
    fn tags(self, tags: &[&str]) -> Self;
    fn pinned(self) -> Self;
}

impl With for ImageRecord {
    fn size(mut self, n: u64) -> Self {
        self.size = n;
        self
    }
    fn used(mut self, at: SystemTime) -> Self {
        self.last_used = Some(at);
        self
    }
    fn detected(mut self, at: SystemTime) -> Self {
        self.first_detected = at;
        self
    }
    fn tags(mut self, tags: &[&str]) -> Self {
        self.repo_tags = tags.iter().map(std::string::ToString::to_string).collect();
        self
    }
    fn pinned(mut self) -> Self {
        self.pinned = true;
        self
    }
}

fn set(ids: &[&str]) -> HashSet<String> {
    ids.iter().map(std::string::ToString::to_string).collect()
}

fn fs(capacity: u64, available: u64) -> FsCapacity {
    FsCapacity { capacity, available }
}

/// Inputs of one plan with defaults: nothing in use, the kubelet's policy,
/// no rules, the loop began at `t(0)`, threshold mode.
struct Case {
    records: Records,
    in_use: HashSet<String>,
    fs: FsCapacity,
    policy: GcPolicy,
    rules: ProtectionRules,
    began: SystemTime,
    mode: GcMode,
}

impl Case {
    fn new(records: Vec<ImageRecord>, fs: FsCapacity) -> Self {
        Case {
            records: records.into_iter().collect(),
            in_use: HashSet::new(),
            fs,
            policy: GcPolicy::default(),
            rules: ProtectionRules::default(),
            began: t(0),
            mode: GcMode::Threshold,
        }
    }

    fn plan(&self) -> Result<GcPlan<'_>, GcPlanError> {
        plan_gc(GcRunInputs {
            records: &self.records,
            in_use: &self.in_use,
            fs: self.fs,
            policy: &self.policy,
            rules: &self.rules,
            began: self.began,
            now: now(),
            mode: self.mode,
        })
    }

    fn ok(&self) -> GcPlan<'_> {
        match self.plan() {
            Ok(plan) => plan,
            Err(e) => panic!("no plan: {e}"),
        }
    }
}

/// `(id, verdict)` in plan order.
fn verdicts(plan: &GcPlan<'_>) -> Vec<(String, Verdict)> {
    plan.entries.iter().map(|e| (e.record.key.id.clone(), e.verdict.clone())).collect()
}

/// Ids deleted, in order.
fn deleted(plan: &GcPlan<'_>) -> Vec<String> {
    plan.deletions().map(|(r, _)| r.key.id.clone()).collect()
}

fn verdict_of(plan: &GcPlan<'_>, id: &str) -> Verdict {
    match plan.entries.iter().find(|e| e.record.key.id == id) {
        Some(e) => e.verdict.clone(),
        None => panic!("{id} not in the plan"),
    }
}

use DeleteReason::{Age, Retention, Space};
use KeepReason::{InUse, NotNeeded, PinnedByRuntime, SandboxImage, UsedSinceRunBegan};

fn del(r: DeleteReason) -> Verdict {
    Verdict::Delete(r)
}

fn keep(r: KeepReason) -> Verdict {
    Verdict::Keep(r)
}

#[test]
fn above_the_high_threshold_space_is_freed_down_to_the_low_one() {
    let records = (0..10).map(|i| rec(&format!("i{i}")).size(10).detected(t(i))).collect();
    let case = Case::new(records, fs(1000, 149));
    let plan = case.ok();
    assert_eq!((plan.usage_percent, plan.projected_usage_percent), (Some(86), Some(86)));
    assert!(plan.space_pass && !plan.max_age_pass);
    assert_eq!(plan.amount_to_free, 51);
    assert_eq!(plan.bytes_to_delete, 60, "deleted until freed >= 51");
    assert_eq!(deleted(&plan), ["i0", "i1", "i2", "i3", "i4", "i5"]);
    for id in ["i6", "i7", "i8", "i9"] {
        assert_eq!(verdict_of(&plan, id), keep(NotNeeded));
    }
    assert_eq!(plan.shortfall, None);
    assert_eq!(plan.free_disk_space_failed_message(), None);

    // Exactly the amount: the pass stops there.
    let records = (0..10).map(|i| rec(&format!("i{i}")).size(10).detected(t(i))).collect();
    let case = Case::new(records, fs(1000, 150));
    let plan = case.ok();
    assert_eq!((plan.amount_to_free, plan.bytes_to_delete), (50, 50));
    assert_eq!(deleted(&plan), ["i0", "i1", "i2", "i3", "i4"]);
}

#[test]
fn below_the_high_threshold_nothing_is_deleted() {
    let plan_at = |available| {
        let case = Case::new(vec![rec("a"), rec("b")], fs(1000, available));
        let plan = case.ok();
        (plan.usage_percent, plan.space_pass, plan.amount_to_free, deleted(&plan))
    };
    assert_eq!(plan_at(160), (Some(84), false, 0, Vec::<String>::new()));
    assert_eq!(plan_at(151), (Some(85), true, 49, vec!["a".to_string()]), "usage equal to high starts the pass");
    let case = Case::new(vec![rec("a")], fs(1000, 500));
    assert_eq!(verdicts(&case.ok()), [("a".to_string(), keep(NotNeeded))]);
}

#[test]
fn eviction_order_is_least_recently_used_then_first_detected() {
    let records = vec![
        rec("used-late").used(ago(HOUR)),
        rec("used-early-detected-late").used(ago(2 * HOUR)).detected(t(50)),
        rec("used-early-detected-early").used(ago(2 * HOUR)).detected(t(10)),
        rec("never-used-detected-late").detected(t(20)),
        rec("never-used-b").detected(t(5)),
        rec("never-used-a").detected(t(5)),
    ];
    let mut case = Case::new(records, fs(1000, 0));
    case.mode = GcMode::DeleteUnused;
    assert_eq!(
        deleted(&case.ok()),
        [
            "never-used-a",
            "never-used-b",
            "never-used-detected-late",
            "used-early-detected-early",
            "used-early-detected-late",
            "used-late"
        ]
    );
}

#[test]
fn young_images_are_kept_and_the_pass_goes_on_to_older_ones() {
    let records = vec![
        rec("young").detected(ago(MIN)).size(500),
        rec("just-old-enough").detected(ago(2 * MIN)).size(30),
        rec("old").detected(t(100)).used(ago(HOUR)).size(30),
        rec("from-the-future").detected(now() + MIN),
    ];
    let case = Case::new(records, fs(1000, 150));
    let plan = case.ok();
    assert_eq!(plan.amount_to_free, 50);
    assert_eq!(deleted(&plan), ["just-old-enough", "old"]);
    assert_eq!(verdict_of(&plan, "young"), keep(KeepReason::TooYoung { age: MIN, min_age: 2 * MIN }));
    assert_eq!(
        verdict_of(&plan, "from-the-future"),
        keep(KeepReason::TooYoung { age: Duration::ZERO, min_age: 2 * MIN }),
        "a negative age is younger than any minimum age"
    );

    // No minimum age: only a future first detection still holds.
    let mut case = Case::new(vec![rec("young").detected(ago(MIN)), rec("future").detected(now() + MIN)], fs(1000, 0));
    case.policy.min_age = Duration::ZERO;
    case.mode = GcMode::DeleteUnused;
    let plan = case.ok();
    assert_eq!(deleted(&plan), ["young"]);
    assert_eq!(
        verdict_of(&plan, "future"),
        keep(KeepReason::TooYoung { age: Duration::ZERO, min_age: Duration::ZERO })
    );
}

#[test]
fn images_used_since_the_run_began_are_kept() {
    let records =
        vec![rec("used-now").used(now()), rec("used-later").used(now() + MIN), rec("used-before").used(ago(MIN))];
    let mut case = Case::new(records, fs(1000, 0));
    case.mode = GcMode::DeleteUnused;
    let plan = case.ok();
    assert_eq!(deleted(&plan), ["used-before"]);
    assert_eq!(verdict_of(&plan, "used-now"), keep(UsedSinceRunBegan));
    assert_eq!(verdict_of(&plan, "used-later"), keep(UsedSinceRunBegan));
}

#[test]
fn max_age_deletes_long_unused_and_never_used_images_whatever_the_usage() {
    let records = vec![
        rec("unused-2h").used(ago(2 * HOUR)).size(10),
        rec("unused-1h").used(ago(HOUR)).size(10),
        rec("unused-30m").used(ago(30 * MIN)).size(10),
        // Never used: the kubelet's zero lastUsed is older than any max age,
        // even for an image younger than the minimum age.
        rec("never-used-young").detected(ago(MIN)).size(10),
    ];
    let mut case = Case::new(records, fs(1000, 900));
    case.policy.max_age = HOUR;
    let plan = case.ok();
    assert!(plan.max_age_pass && !plan.space_pass);
    assert_eq!(deleted(&plan), ["never-used-young", "unused-2h"]);
    assert!(plan.deletions().all(|(_, reason)| reason == Age));
    assert_eq!(verdict_of(&plan, "unused-1h"), keep(NotNeeded), "exactly the max age is not older than it");
    assert_eq!(verdict_of(&plan, "unused-30m"), keep(NotNeeded));
    assert_eq!(plan.bytes_to_delete, 20);
}

#[test]
fn max_age_waits_until_the_loop_has_run_for_longer_than_the_max_age() {
    let run = |began: SystemTime, max_age: Duration| {
        let mut case = Case::new(vec![rec("old").used(ago(10 * HOUR))], fs(1000, 900));
        case.began = began;
        case.policy.max_age = max_age;
        let plan = case.ok();
        (plan.max_age_pass, deleted(&plan).len())
    };
    assert_eq!(run(ago(HOUR), HOUR), (false, 0), "began exactly max age ago");
    assert_eq!(run(ago(HOUR + Duration::from_secs(1)), HOUR), (true, 1));
    assert_eq!(run(now() + MIN, HOUR), (false, 0), "a loop start in the future");
    assert_eq!(run(t(0), Duration::ZERO), (false, 0), "max age off");
}

#[test]
fn age_deletions_count_as_freed_before_the_threshold_check() {
    // 86 % used; the age pass frees 20 bytes: 84 %, below the threshold.
    let records = vec![rec("old").used(ago(2 * HOUR)).size(20), rec("recent").used(ago(MIN)).size(500)];
    let mut case = Case::new(records.clone(), fs(1000, 140));
    case.policy.max_age = HOUR;
    let plan = case.ok();
    assert_eq!((plan.usage_percent, plan.projected_usage_percent), (Some(86), Some(84)));
    assert!(!plan.space_pass);
    assert_eq!(deleted(&plan), ["old"]);

    // 95 % used; after the age pass 93 %: free 200 − 70 = 130 more.
    let mut case = Case::new(records, fs(1000, 50));
    case.policy.max_age = HOUR;
    let plan = case.ok();
    assert_eq!((plan.usage_percent, plan.projected_usage_percent), (Some(95), Some(93)));
    assert_eq!(plan.amount_to_free, 130);
    assert_eq!(verdicts(&plan), [("old".to_string(), del(Age)), ("recent".to_string(), del(Space))]);
}

#[test]
fn delete_unused_deletes_every_eligible_image_whatever_the_usage() {
    let records = vec![
        rec("old").size(10),
        rec("older").used(ago(HOUR)).size(10),
        rec("young").detected(ago(MIN)).size(10),
        rec("in-use").size(10),
    ];
    let mut case = Case::new(records, fs(0, 0));
    case.in_use = set(&["in-use"]);
    case.mode = GcMode::DeleteUnused;
    case.policy.max_age = 10 * HOUR;
    case.rules.keep_newest_tags_per_repo = Some(0);
    let plan = case.ok();
    assert_eq!(deleted(&plan), ["old", "older"]);
    assert!(plan.deletions().all(|(_, reason)| reason == Space));
    assert_eq!(verdict_of(&plan, "young"), keep(KeepReason::TooYoung { age: MIN, min_age: 2 * MIN }));
    assert!(plan.space_pass && !plan.max_age_pass);
    assert_eq!((plan.usage_percent, plan.amount_to_free, plan.shortfall), (None, u64::MAX, None));
}

#[test]
fn capacity_zero_is_an_error_after_the_age_pass() {
    let mut case = Case::new(vec![rec("old").used(ago(2 * HOUR)), rec("recent").used(ago(MIN))], fs(0, 0));
    let err = case.plan().err();
    assert_eq!(err, Some(GcPlanError::InvalidCapacity { age_deletions: vec![] }));
    assert_eq!(err.map(|e| e.to_string()).as_deref(), Some("invalid capacity 0 on image filesystem"));
    case.policy.max_age = HOUR;
    assert_eq!(case.plan().err(), Some(GcPlanError::InvalidCapacity { age_deletions: vec![RecordKey::id("old")] }));
}

#[test]
fn available_above_capacity_is_clamped() {
    let case = Case::new(vec![rec("a")], fs(1000, 5000));
    let plan = case.ok();
    assert!(plan.available_clamped);
    assert_eq!(plan.fs, fs(1000, 1000));
    assert_eq!(plan.usage_percent, Some(0));
    assert!(deleted(&plan).is_empty());
    assert!(!Case::new(vec![], fs(1000, 1000)).ok().available_clamped);
}

#[test]
fn a_shortfall_says_what_was_eligible_and_what_holds_the_rest() {
    let records = vec![
        rec("in-use-1").size(200),
        rec("in-use-2").size(100),
        rec("pinned").pinned().size(200),
        rec("rule").tags(&["quay.io/x:1"]).size(5),
        rec("young").detected(ago(MIN)).size(50),
        rec("used-now").used(now()).size(1),
        rec("eligible-1").size(20),
        rec("eligible-2").size(10),
    ];
    let mut case = Case::new(records, fs(1000, 100));
    case.in_use = set(&["in-use-1", "in-use-2"]);
    case.rules.pinned_images = vec!["quay.io/*".into()];
    let plan = case.ok();
    assert_eq!(plan.amount_to_free, 100);
    assert_eq!(plan.bytes_to_delete, 30);
    let held = |reason, images, bytes| Held { reason, images, bytes };
    assert_eq!(
        plan.shortfall,
        Some(Shortfall {
            wanted: 100,
            eligible_bytes: 30,
            held: vec![
                held(KeepKind::InUse, 2, 300),
                held(KeepKind::PinnedByRuntime, 1, 200),
                held(KeepKind::PinnedByRule, 1, 5),
                held(KeepKind::TooYoung, 1, 50),
                held(KeepKind::UsedSinceRunBegan, 1, 1),
            ],
            // 900 used − 586 in images.
            unaccounted_bytes: 314,
        })
    );
    assert_eq!(
        plan.free_disk_space_failed_message().as_deref(),
        Some(
            "Insufficient free disk space on the node's image filesystem (90% of 1000 B used). \
             Failed to free sufficient space by deleting unused images (freed 30 bytes). \
             Investigate disk usage, as it could be used by active images, logs, volumes, or other data."
        )
    );
}

#[test]
fn an_amount_of_zero_still_deletes_one_image_as_the_kubelet_does() {
    // 1001 × 20 / 100 = 200 = available, but usage is 81 %.
    let mut case = Case::new(vec![rec("a").size(10), rec("b").size(10)], fs(1001, 200));
    case.policy.high_threshold_percent = 81;
    let plan = case.ok();
    assert_eq!((plan.usage_percent, plan.amount_to_free), (Some(81), 0));
    assert_eq!(verdicts(&plan), [("a".to_string(), del(Space)), ("b".to_string(), keep(NotNeeded))]);
}

/// A deterministic generator (splitmix64).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        (z ^ (z >> 31)) % n
    }
}

#[test]
fn every_record_appears_once_and_deletions_come_first_in_run_order() {
    let mut rng = Rng(42);
    let records: Vec<ImageRecord> = (0..2000)
        .map(|i| {
            let mut r = rec(&format!("sha256:{i:064x}"))
                .size(rng.below(1000))
                .detected(t(rng.below(10_000)))
                .tags(&[&format!("r/repo{}:{i}", rng.below(50))]);
            match rng.below(4) {
                0 => {}
                _ => r.last_used = Some(t(rng.below(10_100))),
            }
            r.pinned = rng.below(50) == 0;
            r
        })
        .collect();
    let in_use: HashSet<String> = records.iter().filter(|_| rng.below(5) == 0).map(|r| r.key.id.clone()).collect();
    for (mode, keep_newest, available) in [
        (GcMode::Threshold, None, 100_000),
        (GcMode::Threshold, Some(3), 100_000),
        (GcMode::Threshold, Some(3), 900_000),
        (GcMode::DeleteUnused, None, 0),
    ] {
        let mut case = Case::new(records.clone(), fs(1_000_000, available));
        case.in_use = in_use.clone();
        case.policy.max_age = HOUR;
        case.rules.keep_newest_tags_per_repo = keep_newest;
        case.rules.pinned_images = vec!["r/repo7:*".into()];
        let plan = case.ok();
        assert_eq!(plan.entries.len(), records.len());
        let unique: HashSet<&RecordKey> = plan.entries.iter().map(super::verdict::PlanEntry::key).collect();
        assert_eq!(unique.len(), records.len());
        // Deletions first, by stage, each in eviction order.
        let stage = |e: &PlanEntry<'_>| match e.verdict {
            Verdict::Delete(Age) => 0,
            Verdict::Delete(Retention) => 1,
            Verdict::Delete(Space) => 2,
            Verdict::Keep(_) => 3,
        };
        for pair in plan.entries.windows(2) {
            let (a, b) = (&pair[0], &pair[1]);
            assert!(stage(a) <= stage(b), "{mode:?}: {:?} before {:?}", a.verdict, b.verdict);
            if stage(a) == stage(b) && stage(a) < 3 {
                let order = |r: &ImageRecord| (r.last_used, r.first_detected, r.key.clone());
                assert!(order(a.record) < order(b.record), "{mode:?}: eviction order");
            }
        }
        let total: u64 = plan.deletions().map(|(r, _)| r.size).sum();
        assert_eq!(plan.bytes_to_delete, total);
        // Nothing protected is deleted.
        for (r, _) in plan.deletions() {
            assert!(!r.pinned && !in_use.contains(&r.key.id) && !r.repo_tags[0].starts_with("r/repo7:"));
        }
        if let Some(s) = &plan.shortfall {
            assert!(s.eligible_bytes < s.wanted);
        }
    }
}

// Protection and retention rules.
mod rules;
