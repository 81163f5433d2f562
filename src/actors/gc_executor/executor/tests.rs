//! The executor's state and decisions, without actix or a runtime.

use std::collections::HashSet;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::*;
use crate::actors::gc_executor::DEFAULT_MAILBOX_CAPACITY;
use crate::actors::gc_executor::report::{RemovedImage, ReportEntry};
use crate::gc::capacity::FsCapacity;
use crate::gc::detect::Records;
use crate::gc::in_use::InUse;
use crate::gc::plan::{GcRunInputs, Held, KeepKind, KeepReason, Verdict, plan_gc};
use crate::gc::record::{ImageRecord, RecordKey};

const GB: u64 = 1 << 30;

fn t0() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_700_000_000)
}

fn cfg(policy: GcPolicy) -> GcExecutorSettings {
    GcExecutorSettings {
        policy,
        rules: ProtectionRules::default(),
        period: Duration::from_secs(300),
        capacity: CapacitySource::fixed(100 * GB),
        pressure_check: None,
        eviction: Vec::new(),
        mailbox_capacity: DEFAULT_MAILBOX_CAPACITY,
    }
}

fn executor() -> GcExecutor {
    GcExecutor::new(cfg(GcPolicy::default()), t0())
}

fn disabled() -> GcPolicy {
    GcPolicy { high_threshold_percent: 100, max_age: Duration::ZERO, ..GcPolicy::default() }
}

/// A non-dry report wanting `amount_to_free` bytes in `mode`.
fn report(mode: GcMode, amount_to_free: u64) -> GcReport {
    GcReport {
        mode,
        dry_run: false,
        started: t0(),
        before: FsCapacity { capacity: 100 * GB, available: 5 * GB },
        measured_by: String::new(),
        usage_percent: Some(95),
        projected_usage_percent: Some(95),
        amount_to_free,
        entries: Vec::new(),
        shortfall: None,
        removed: Vec::new(),
        failed: Vec::new(),
        bytes_expected: 0,
        bytes_freed_measured: None,
        target_missed: None,
        kept_unlisted: Vec::new(),
    }
}

fn removed(id: &str, size: u64, reason: DeleteReason) -> RemovedImage {
    RemovedImage { id: id.into(), repo_tags: Vec::new(), size, reason: reason.to_string() }
}

fn reasons(events: &[NodeEvent]) -> Vec<EventReason> {
    events.iter().map(|e| e.reason).collect()
}

#[test]
fn one_run_at_a_time_and_a_run_copies_the_policy_in_force() {
    let mut gc = executor();
    let spec = gc.begin(GcMode::Threshold, true).expect("idle");
    assert_eq!((spec.mode, spec.dry_run, spec.began), (GcMode::Threshold, true, t0()));
    assert_eq!(spec.policy, GcPolicy::default());
    assert!(gc.is_running());
    assert_eq!(gc.begin(GcMode::DeleteUnused, false).unwrap_err(), GcError::Busy);
    assert!(!gc.tick_runs(), "a tick during a run is skipped");
    let end = gc.finish(true, Ok(report(GcMode::Threshold, 0)));
    assert!(end.result.is_ok() && end.events.is_empty());
    assert!(!gc.is_running());
    assert!(gc.tick_runs());
}

#[test]
fn a_disabled_policy_neither_starts_nor_ticks_and_enabling_it_asks_for_a_run() {
    let mut gc = GcExecutor::new(cfg(disabled()), t0());
    assert!(!gc.runs_at_start());
    assert!(!gc.tick_runs());
    assert!(gc.update_policy(GcPolicy::default(), ProtectionRules::default()), "enabled: run at once");
    assert!(gc.runs_at_start() && gc.tick_runs());
    assert!(!gc.update_policy(GcPolicy::default(), ProtectionRules::default()), "already enabled");
    assert!(!gc.update_policy(disabled(), ProtectionRules::default()));
    assert!(!gc.tick_runs());
}

#[test]
fn a_policy_update_keeps_the_sandbox_image_id() {
    let mut c = cfg(GcPolicy::default());
    c.rules.sandbox_image_id = Some("sha256:pause".into());
    let mut gc = GcExecutor::new(c, t0());
    let rules = ProtectionRules { keep_newest_tags_per_repo: Some(3), ..ProtectionRules::default() };
    gc.update_policy(GcPolicy { min_age: Duration::ZERO, ..GcPolicy::default() }, rules);
    assert_eq!(gc.config().rules.sandbox_image_id.as_deref(), Some("sha256:pause"));
    assert_eq!(gc.config().rules.keep_newest_tags_per_repo, Some(3));
    assert_eq!(gc.config().policy.min_age, Duration::ZERO);
}

#[test]
fn the_second_failure_in_a_row_is_an_image_gc_failed_event_and_a_success_resets_the_count() {
    let mut gc = executor();
    let fail = |gc: &mut GcExecutor| {
        gc.begin(GcMode::Threshold, false).expect("idle");
        gc.finish(false, Err(GcError::FsInfo("boom".into())))
    };
    assert!(fail(&mut gc).events.is_empty(), "once: a warning only");
    let second = fail(&mut gc);
    assert_eq!(second.events, [NodeEvent { reason: EventReason::ImageGcFailed, message: "boom".into() }]);
    assert_eq!(gc.consecutive_failures(), 2);
    gc.begin(GcMode::Threshold, false).expect("idle");
    let ok = gc.finish(false, Ok(report(GcMode::Threshold, 0)));
    assert!(ok.result.is_ok());
    assert_eq!(gc.consecutive_failures(), 0);
    assert!(fail(&mut gc).events.is_empty(), "counting starts again");
}

#[test]
fn invalid_capacity_is_an_invalid_disk_capacity_event() {
    let mut gc = executor();
    gc.begin(GcMode::Threshold, false).expect("idle");
    let end = gc.finish(false, Err(GcError::InvalidCapacity));
    assert_eq!(
        end.events,
        [NodeEvent {
            reason: EventReason::InvalidDiskCapacity,
            message: "invalid capacity 0 on image filesystem".into()
        }]
    );
}

#[test]
fn not_enough_freed_is_a_free_disk_space_failed_event_then_image_gc_failed() {
    let mut gc = executor();
    for round in 1..=2 {
        gc.begin(GcMode::Threshold, false).expect("idle");
        let mut r = report(GcMode::Threshold, 15 * GB);
        r.removed.push(removed("sha256:b", 10 * GB, DeleteReason::Space));
        let end = gc.finish(false, Ok(r.clone()));
        let msg = "Insufficient free disk space on the node's image filesystem (95% of 100.0 GiB used). Failed to free sufficient space by deleting unused images (freed 10737418240 bytes). Investigate disk usage, as it could be used by active images, logs, volumes, or other data.";
        let err = end.result.unwrap_err();
        assert_eq!(err.to_string(), msg);
        // The error and the last report say what was removed, and why the
        // run still failed.
        let missed = GcReport { target_missed: Some(msg.into()), ..r };
        assert_eq!(err.report().map(|r| &**r), Some(&missed));
        assert_eq!(gc.last_report().as_deref(), Some(&missed));
        let want: &[EventReason] = if round == 1 {
            &[EventReason::FreeDiskSpaceFailed]
        } else {
            &[EventReason::FreeDiskSpaceFailed, EventReason::ImageGcFailed]
        };
        assert_eq!(reasons(&end.events), want, "round {round}");
    }
}

#[test]
fn only_the_space_pass_counts_against_the_amount_to_free() {
    let gc = executor();
    let mut r = report(GcMode::Threshold, 10 * GB);
    r.removed.push(removed("sha256:old", 20 * GB, DeleteReason::Age));
    assert!(matches!(gc.judge(r.clone()), Err(GcError::NotEnoughFreed { .. })), "age deletions were already counted");
    r.removed.push(removed("sha256:b", 10 * GB, DeleteReason::Space));
    assert!(gc.judge(r).is_ok());
}

#[test]
fn failed_removals_give_the_kubelets_three_texts_with_go_aggregated_errors() {
    let max_age = GcPolicy { max_age: Duration::from_secs(3_600), ..GcPolicy::default() };
    let gc = GcExecutor::new(cfg(max_age), t0());
    let failing = |mode, amount| {
        let mut r = report(mode, amount);
        r.removed.push(removed("sha256:a", 7, DeleteReason::Space));
        r.failed =
            vec![("sha256:b".into(), "e1".into()), ("sha256:c".into(), "e2".into()), ("sha256:d".into(), "e1".into())];
        r
    };
    let text = |r| match gc.judge(r) {
        Err(GcError::Deletion { message, report }) => {
            assert_eq!(report.removed.len(), 1, "what was removed is kept");
            assert_eq!(report.target_missed.as_ref(), Some(&message));
            message
        }
        other => panic!("not a deletion error: {other:?}"),
    };
    assert_eq!(
        text(failing(GcMode::DeleteUnused, u64::MAX)),
        "wanted to free 9223372036854775807 bytes, but freed 7 bytes space with errors in image deletion: [e1, e2]"
    );
    assert_eq!(
        text(failing(GcMode::Threshold, 100)),
        "wanted to free 100 bytes, but freed 7 bytes space with errors in image deletion: [e1, e2]"
    );
    let mut one = failing(GcMode::Threshold, 0);
    one.failed.truncate(1);
    assert_eq!(text(one), "wanted to free images older than 1h0m0s, encountered errors in image deletion: e1");
}

#[test]
fn only_a_non_dry_success_becomes_the_last_report() {
    let mut gc = executor();
    gc.begin(GcMode::Threshold, true).expect("idle");
    let mut dry = report(GcMode::Threshold, 15 * GB);
    dry.dry_run = true;
    assert!(gc.finish(true, Ok(dry)).result.is_ok(), "a dry run is never judged");
    assert!(gc.last_report().is_none());
    gc.begin(GcMode::Threshold, false).expect("idle");
    let done = gc.finish(false, Ok(report(GcMode::Threshold, 0))).result.expect("ok");
    assert!(Arc::ptr_eq(&gc.last_report().expect("kept"), &done));
}

/// An entry of `id` with `verdict`, `size` bytes.
fn entry(id: &str, size: u64, verdict: Verdict) -> ReportEntry {
    ReportEntry {
        id: id.into(),
        runtime_handler: String::new(),
        repo_tags: vec![format!("example.com/{id}:1")],
        size,
        verdict,
        used_by: Vec::new(),
    }
}

#[test]
fn a_bounded_report_lists_every_deletion_and_the_first_kept_images_of_each_reason() {
    let (space, in_use) = (Verdict::Delete(DeleteReason::Space), Verdict::Keep(KeepReason::InUse));
    let young = Verdict::Keep(KeepReason::TooYoung { age: Duration::from_secs(1), min_age: Duration::from_secs(60) });
    let mut r = report(GcMode::Threshold, 0);
    r.entries = vec![
        entry("d1", 1, space.clone()),
        entry("d2", 2, space.clone()),
        entry("d3", 4, space.clone()),
        entry("u1", 10, in_use.clone()),
        entry("y1", 100, young.clone()),
        entry("u2", 20, in_use.clone()),
        entry("u3", 40, in_use.clone()),
        entry("y2", 200, young.clone()),
        entry("u4", 80, in_use.clone()),
    ];
    assert!(r.is_bounded(4) && !r.is_bounded(3), "four in use");
    let b = r.bounded(2);
    let ids: Vec<&str> = b.entries.iter().map(|e| e.id.as_str()).collect();
    assert_eq!(ids, ["d1", "d2", "d3", "u1", "y1", "u2", "y2"], "every deletion; two of each reason, in order");
    assert_eq!(b.kept_unlisted, [Held { reason: KeepKind::InUse, images: 2, bytes: 120 }]);
    assert!(b.is_bounded(2));
    assert_eq!(b.bounded(1).kept_unlisted.len(), 2, "bounding again adds to the counts");
    assert_eq!(
        b.bounded(1).kept_unlisted,
        [
            Held { reason: KeepKind::InUse, images: 3, bytes: 140 },
            Held { reason: KeepKind::TooYoung, images: 1, bytes: 200 }
        ]
    );
    assert_eq!((b.amount_to_free, b.started, b.usage_percent), (r.amount_to_free, r.started, r.usage_percent));
    assert_eq!(r.bounded(9), r, "a report within the bound is kept whole");
}

#[test]
fn the_last_report_kept_between_runs_is_bounded_and_the_caller_gets_the_whole_one() {
    let mut gc = executor();
    let mut big = report(GcMode::Threshold, 0);
    let n = KEPT_LISTED_PER_REASON + 5;
    big.entries = (0..n).map(|i| entry(&format!("u{i}"), 1, Verdict::Keep(KeepReason::InUse))).collect();
    gc.begin(GcMode::Threshold, false).expect("idle");
    let done = gc.finish(false, Ok(big)).result.expect("ok");
    assert_eq!(done.entries.len(), n, "the run's caller gets every image");
    let last = gc.last_report().expect("kept");
    assert_eq!(last.entries.len(), KEPT_LISTED_PER_REASON);
    assert_eq!(last.kept_unlisted, [Held { reason: KeepKind::InUse, images: 5, bytes: 5 }]);
}

#[test]
fn a_report_lists_the_plan_with_who_uses_each_image() {
    let rec = |id: &str, size: u64| ImageRecord {
        key: RecordKey::id(id),
        first_detected: t0(),
        last_used: None,
        size,
        pinned: false,
        repo_tags: vec![format!("example.com/{id}:1")],
        repo_digests: Vec::new(),
    };
    let records: Records = [rec("a", 10 * GB), rec("b", 10 * GB)].into_iter().collect();
    let in_use_ids: HashSet<String> = ["a".to_string()].into();
    let in_use: InUse = [("a".to_string(), vec!["prod/web/c1".to_string()])].into();
    let fs = FsCapacity { capacity: 100 * GB, available: 5 * GB };
    let policy = GcPolicy::default();
    let rules = ProtectionRules::default();
    let now = t0() + Duration::from_secs(3_600);
    let inputs = GcRunInputs {
        records: &records,
        in_use: &in_use_ids,
        fs,
        policy: &policy,
        rules: &rules,
        began: t0(),
        now,
        mode: GcMode::Threshold,
    };
    let plan = plan_gc(inputs).expect("plan");
    let r = GcReport::from_plan(&plan, |id| in_use.get(id).cloned().unwrap_or_default(), false, now, fs);
    assert_eq!((r.usage_percent, r.amount_to_free, r.bytes_expected), (Some(95), 15 * GB, 10 * GB));
    let ids: Vec<(&str, String)> = r.entries.iter().map(|e| (e.id.as_str(), e.explain())).collect();
    assert_eq!(ids, [("b", "delete: frees space".to_string()), ("a", "keep: in use by prod/web/c1".to_string())]);
    let deletions: Vec<&ReportEntry> = r.deletions().collect();
    assert_eq!(deletions.len(), 1);
    assert_eq!(deletions[0].verdict, Verdict::Delete(DeleteReason::Space));
    assert!(r.entries.iter().any(|e| e.verdict == Verdict::Keep(KeepReason::InUse)));
    assert!(r.shortfall.is_some(), "15 GiB wanted, 10 GiB eligible");
    // Listing one kept image: what bounding the whole report gives.
    let listing =
        GcReport::from_plan_listing(&plan, |id| in_use.get(id).cloned().unwrap_or_default(), false, now, fs, 0);
    assert_eq!(listing, r.bounded(0));
    assert_eq!(listing.kept_unlisted, [Held { reason: KeepKind::InUse, images: 1, bytes: 10 * GB }]);
    assert_eq!(listing.entries.len(), 1, "the deletion");
}

#[test]
fn go_aggregates_one_error_bare_and_several_bracketed_without_repeats() {
    assert_eq!(aggregate(&["a".into()]), "a");
    assert_eq!(aggregate(&["a".into(), "a".into()]), "a");
    assert_eq!(aggregate(&["a".into(), "b".into(), "a".into()]), "[a, b]");
}
