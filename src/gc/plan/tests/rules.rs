//! Plans under protection rules (in use, pinned, sandbox image) and the
//! retention rule.

use super::*;

#[test]
fn protected_images_are_kept_with_the_reason() {
    let records = vec![
        rec("in-use"),
        rec("runtime-pinned").pinned(),
        rec("rule-pinned").tags(&["quay.io/team/app:1"]),
        rec("sandbox").pinned(),
        rec("plain"),
    ];
    let mut case = Case::new(records, fs(1000, 0));
    case.in_use = set(&["in-use", "sandbox"]);
    case.rules = ProtectionRules {
        pinned_images: vec!["ghcr.io/*".into(), "quay.io/team/*".into()],
        sandbox_image_id: Some("sandbox".into()),
        keep_newest_tags_per_repo: None,
    };
    case.mode = GcMode::DeleteUnused;
    let plan = case.ok();
    assert_eq!(deleted(&plan), ["plain"]);
    assert_eq!(verdict_of(&plan, "in-use"), keep(InUse));
    assert_eq!(verdict_of(&plan, "runtime-pinned"), keep(PinnedByRuntime));
    assert_eq!(verdict_of(&plan, "rule-pinned"), keep(KeepReason::PinnedByRule("quay.io/team/*".into())));
    assert_eq!(verdict_of(&plan, "sandbox"), keep(SandboxImage), "the sandbox reason wins over in use and pinned");

    // A rule matches digests too.
    let mut case = Case::new(vec![rec("by-digest")], fs(1000, 0));
    case.rules.pinned_images = vec!["example.com/by-digest:*".into()];
    case.mode = GcMode::DeleteUnused;
    assert_eq!(verdict_of(&case.ok(), "by-digest"), keep(KeepReason::PinnedByRule("example.com/by-digest:*".into())));
}

#[test]
fn retention_keeps_the_newest_unused_images_of_each_repository() {
    let records = vec![
        rec("app-1").tags(&["r/app:1"]).detected(t(11)),
        rec("app-2").tags(&["r/app:2", "r/app:stable"]).detected(t(12)),
        rec("app-3").tags(&["r/app:3"]).detected(t(13)),
        rec("app-4").tags(&["r/app:4"]).detected(t(14)),
        rec("app-5-in-use").tags(&["r/app:5"]).detected(t(15)),
        // Beyond the newest of r/app, but the newest of r/other: kept.
        rec("shared").tags(&["r/app:0", "r/other:1"]).detected(t(5)),
        rec("other-old").tags(&["r/other:0"]).detected(t(1)).used(ago(HOUR)),
        rec("young-1").tags(&["r/young:1"]).detected(ago(MIN)),
        rec("young-2").tags(&["r/young:2"]).detected(ago(MIN / 2)),
        rec("untagged").tags(&[]),
    ];
    let mut case = Case::new(records, fs(1000, 900));
    case.in_use = set(&["app-5-in-use"]);
    case.rules.keep_newest_tags_per_repo = Some(1);
    let plan = case.ok();
    assert!(!plan.space_pass);
    assert_eq!(deleted(&plan), ["app-1", "app-2", "app-3", "other-old"], "in eviction order");
    assert!(plan.deletions().all(|(_, reason)| reason == Retention));
    assert_eq!(verdict_of(&plan, "app-4"), keep(NotNeeded), "the newest unused of r/app");
    assert_eq!(verdict_of(&plan, "app-5-in-use"), keep(InUse), "in-use images do not count");
    assert_eq!(verdict_of(&plan, "shared"), keep(NotNeeded), "the newest unused of r/other");
    assert_eq!(verdict_of(&plan, "young-1"), keep(KeepReason::TooYoung { age: MIN, min_age: 2 * MIN }));
    assert_eq!(verdict_of(&plan, "young-2"), keep(NotNeeded));
    assert_eq!(verdict_of(&plan, "untagged"), keep(NotNeeded), "no repository");

    // Retention deletions count as freed before the threshold check.
    let mut case = Case::new(
        vec![rec("a").tags(&["r/x:1"]).detected(t(1)), rec("b").tags(&["r/x:2"]).detected(t(2))],
        fs(1000, 100),
    );
    case.rules.keep_newest_tags_per_repo = Some(1);
    let plan = case.ok();
    assert_eq!((plan.usage_percent, plan.projected_usage_percent), (Some(90), Some(80)));
    assert_eq!(verdicts(&plan), [("a".to_string(), del(Retention)), ("b".to_string(), keep(NotNeeded))]);

    // Off without the rule; two kept per repository with N = 2.
    let records =
        || (1..=4).map(|i| rec(&format!("x{i}")).tags(&[&format!("r/x:{i}")]).detected(t(i))).collect::<Vec<_>>();
    let case = Case::new(records(), fs(1000, 900));
    assert!(deleted(&case.ok()).is_empty());
    let mut case = Case::new(records(), fs(1000, 900));
    case.rules.keep_newest_tags_per_repo = Some(2);
    assert_eq!(deleted(&case.ok()), ["x1", "x2"]);
}
