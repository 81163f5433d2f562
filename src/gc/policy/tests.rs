use std::time::Duration;

use super::*;

fn policy(high: i64, low: i64, min_age: Duration, max_age: Duration) -> GcPolicy {
    GcPolicy { high_threshold_percent: high, low_threshold_percent: low, min_age, max_age }
}

const M: Duration = Duration::from_secs(60);

#[test]
fn default_policy_is_the_kubelets_and_valid() {
    let p = GcPolicy::default();
    assert_eq!(p, policy(85, 80, Duration::from_secs(120), Duration::ZERO));
    assert_eq!(p.validate(), Ok(()));
    assert!(!p.is_disabled());
}

#[test]
fn validation_reports_the_kubelets_texts_in_its_order() {
    let high = |v: i64| {
        format!(
            "invalid configuration: imageGCHighThresholdPercent (--image-gc-high-threshold) {v} must be between 0 and 100, inclusive"
        )
    };
    let low = |v: i64| {
        format!(
            "invalid configuration: imageGCLowThresholdPercent (--image-gc-low-threshold) {v} must be between 0 and 100, inclusive"
        )
    };
    let order = |l: i64, h: i64| {
        format!(
            "invalid configuration: imageGCLowThresholdPercent (--image-gc-low-threshold) {l} must be less than imageGCHighThresholdPercent (--image-gc-high-threshold) {h}"
        )
    };
    let ages = |max: &str, min: &str| {
        format!("invalid configuration: imageMaximumGCAge {max} must be greater than imageMinimumGCAge {min}")
    };
    let cases: Vec<(GcPolicy, Vec<String>)> = vec![
        (policy(100, 99, 2 * M, Duration::ZERO), vec![]),
        (policy(1, 0, Duration::ZERO, Duration::ZERO), vec![]),
        (policy(101, 80, 2 * M, Duration::ZERO), vec![high(101)]),
        (policy(-1, 80, 2 * M, Duration::ZERO), vec![high(-1), order(80, -1)]),
        (policy(85, -1, 2 * M, Duration::ZERO), vec![low(-1)]),
        (policy(85, 101, 2 * M, Duration::ZERO), vec![low(101), order(101, 85)]),
        (policy(85, 85, 2 * M, Duration::ZERO), vec![order(85, 85)]),
        (policy(80, 85, 2 * M, Duration::ZERO), vec![order(85, 80)]),
        (policy(85, 80, 2 * M, M), vec![ages("1m0s", "2m0s")]),
        (policy(85, 80, 2 * M, 2 * M), vec![ages("2m0s", "2m0s")]),
        (policy(85, 80, 2 * M, 2 * M + Duration::from_nanos(1)), vec![]),
        (policy(85, 80, Duration::from_nanos(2), Duration::from_nanos(1)), vec![ages("1ns", "2ns")]),
        (policy(85, 80, 90 * M, 60 * M), vec![ages("1h0m0s", "1h30m0s")]),
        (policy(200, 300, 2 * M, M), vec![high(200), low(300), order(300, 200), ages("1m0s", "2m0s")]),
    ];
    for (p, want) in cases {
        let got = p.validate().err().unwrap_or_default();
        assert_eq!(got, want, "{p:?}");
    }
}

#[test]
fn gc_is_disabled_only_at_high_100_without_max_age() {
    for (high, max_age, disabled) in [(100, Duration::ZERO, true), (100, M, false), (99, Duration::ZERO, false)] {
        assert_eq!(policy(high, 80, 2 * M, max_age).is_disabled(), disabled, "{high} {max_age:?}");
    }
}

#[test]
fn patterns_match_exact_references_repositories_and_prefixes() {
    let cases = [
        // (pattern, reference, matches)
        ("registry.k8s.io/pause:3.10", "registry.k8s.io/pause:3.10", true),
        ("registry.k8s.io/pause:3.10", "registry.k8s.io/pause:3.9", false),
        ("docker.io/library/nginx@sha256:ab", "docker.io/library/nginx@sha256:ab", true),
        ("docker.io/library/nginx:*", "docker.io/library/nginx:1.25", true),
        ("docker.io/library/nginx:*", "docker.io/library/nginx@sha256:ab", true),
        ("docker.io/library/nginx:*", "docker.io/library/nginx-extra:1", false),
        ("docker.io/library/nginx:*", "docker.io/library/nginx/sub:1", false),
        ("docker.io/library/nginx:*", "docker.io/library/nginx", false),
        ("docker.io/library/nginx:*", "docker.io/library/nginx:", false),
        ("localhost:*", "localhost:5000/app:v1", false),
        ("localhost:5000/app:*", "localhost:5000/app:v1", true),
        ("registry.k8s.io/*", "registry.k8s.io/pause:3.10", true),
        ("registry.k8s.io/*", "registry.k8s.io/coredns/coredns:v1.11", true),
        ("registry.k8s.io/*", "registry.k8s.io.evil/pause:3.10", false),
        ("registry.k8s.io/*", "registry.k8s.io/", false),
        ("quay.io/team/*", "quay.io/team/app@sha256:cd", true),
        ("quay.io/team/*", "quay.io/teammate/app:1", false),
        ("*", "anything:1", false),
    ];
    for (pattern, reference, want) in cases {
        assert_eq!(pattern_matches(pattern, reference), want, "{pattern} vs {reference}");
    }
}

#[test]
fn the_matcher_names_the_first_matching_rule_and_the_sandbox_by_id() {
    let rules = ProtectionRules {
        pinned_images: vec!["docker.io/library/redis:7".into(), "quay.io/*".into(), "quay.io/app:*".into()],
        sandbox_image_id: Some("sha256:pause".into()),
        keep_newest_tags_per_repo: None,
    };
    let s = |v: &[&str]| v.iter().map(std::string::ToString::to_string).collect::<Vec<_>>();
    assert_eq!(
        rules.protection("sha256:pause", &s(&["registry.k8s.io/pause:3.10"]), &[]),
        Some(Protection::SandboxImage)
    );
    assert_eq!(rules.protection("sha256:x", &s(&["quay.io/app:1"]), &[]), Some(Protection::PinnedByRule("quay.io/*")));
    assert_eq!(
        rules.protection("sha256:x", &[], &s(&["docker.io/library/redis@sha256:1"])),
        None,
        "an exact tag pattern does not match the digest"
    );
    assert_eq!(
        rules.protection("sha256:x", &s(&["docker.io/library/redis:6", "docker.io/library/redis:7"]), &[]),
        Some(Protection::PinnedByRule("docker.io/library/redis:7"))
    );
    assert_eq!(rules.pinned_by(&[], &s(&["quay.io/app@sha256:1"])), Some("quay.io/*"));
    assert_eq!(rules.protection("sha256:x", &s(&["ghcr.io/a:1"]), &[]), None);
    assert_eq!(ProtectionRules::default().protection("sha256:pause", &[], &[]), None);
}

#[test]
fn repository_of_strips_tag_and_digest_but_not_a_port() {
    for (reference, repo) in [
        ("docker.io/library/nginx:1.25", "docker.io/library/nginx"),
        ("localhost:5000/app:v1", "localhost:5000/app"),
        ("localhost:5000/app", "localhost:5000/app"),
        ("localhost:5000/app@sha256:ab", "localhost:5000/app"),
        ("app:v1@sha256:ab", "app"),
        ("app", "app"),
    ] {
        assert_eq!(repository_of(reference), repo, "{reference}");
    }
}

#[test]
fn a_policy_reads_in_the_logs_as_operators_configure_it() {
    assert_eq!(GcPolicy::default().to_string(), "high 85%, low 80%, min age 2m0s, max age off");
    let p = policy(90, 70, Duration::from_secs(30), Duration::from_secs(7 * 24 * 3600));
    assert_eq!(p.to_string(), "high 90%, low 70%, min age 30s, max age 168h0m0s");
}
