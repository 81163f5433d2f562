//! How verdicts read.

use std::time::Duration;

use super::*;

const MIN: Duration = Duration::from_secs(60);

use DeleteReason::{Age, Retention, Space};
use KeepReason::{InUse, NotNeeded, PinnedByRuntime, SandboxImage, UsedSinceRunBegan};

fn del(r: DeleteReason) -> Verdict {
    Verdict::Delete(r)
}

fn keep(r: KeepReason) -> Verdict {
    Verdict::Keep(r)
}

#[test]
fn verdicts_explain_themselves() {
    let cases = [
        (del(Age), "delete: unused for longer than the maximum age"),
        (del(Space), "delete: frees space"),
        (del(Retention), "delete: older than the newest unused images kept per repository"),
        (keep(InUse), "keep: in use"),
        (keep(PinnedByRuntime), "keep: pinned by the runtime"),
        (keep(KeepReason::PinnedByRule("quay.io/*".into())), "keep: pinned by rule \"quay.io/*\""),
        (keep(SandboxImage), "keep: sandbox image"),
        (
            keep(KeepReason::TooYoung { age: Duration::from_secs(61), min_age: 2 * MIN }),
            "keep: too young (first detected 1m1s ago, minimum age 2m0s)",
        ),
        (
            keep(KeepReason::TooYoung { age: Duration::from_nanos(51_465_672_002), min_age: 2 * MIN }),
            "keep: too young (first detected 51s ago, minimum age 2m0s)",
        ),
        (
            keep(KeepReason::TooYoung { age: Duration::from_nanos(465_672_002), min_age: 2 * MIN }),
            "keep: too young (first detected 465ms ago, minimum age 2m0s)",
        ),
        (keep(UsedSinceRunBegan), "keep: used since the run began"),
        (keep(NotNeeded), "keep: not needed (target already met)"),
    ];
    for (verdict, text) in cases {
        assert_eq!(verdict.to_string(), text);
    }
    assert_eq!([Age, Space, Retention].map(DeleteReason::metric_label), ["age", "space", "retention"]);
}
