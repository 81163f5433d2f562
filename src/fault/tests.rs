use super::*;
use crate::cri::CriErrorKind;

fn not_found() -> CriError {
    CriError::new(CriErrorKind::NotFound, "nope")
}

#[test]
fn rules_match_kind_and_image_glob() {
    let plan = FaultPlan::new(1).rule(FaultRule::on(Rpc::PullImage).image("*/nginx:*").fail(not_found()));
    assert_eq!(plan.decide(Rpc::PullImage, Some("docker.io/library/nginx:1.25")), Some(FaultAction::Fail(not_found())));
    assert_eq!(plan.decide(Rpc::PullImage, Some("docker.io/library/busybox:1")), None);
    assert_eq!(plan.decide(Rpc::ImageStatus, Some("docker.io/library/nginx:1.25")), None);
    assert_eq!(plan.decide(Rpc::PullImage, None), None);
}

#[test]
fn occurrence_windows_count_matching_calls_only() {
    let plan = FaultPlan::new(1).rule(FaultRule::on(Rpc::RemoveImage).after(1).times(2).hang());
    let got: Vec<bool> = (0..5).map(|_| plan.decide(Rpc::RemoveImage, Some("x")).is_some()).collect();
    assert_eq!(got, [false, true, true, false, false]);
    let nth = FaultPlan::new(1).rule(FaultRule::any().nth(3).drop_reply());
    let got: Vec<bool> = (0..4).map(|_| nth.decide(Rpc::ListImages, None).is_some()).collect();
    assert_eq!(got, [false, false, true, false]);
    assert_eq!(nth.rules()[0].fired(), 1);
}

#[test]
fn probability_is_reproducible_with_a_seed() {
    let run = |seed| {
        let plan = FaultPlan::new(seed).rule(FaultRule::any().probability(0.3).hang());
        (0..1000).map(|_| plan.decide(Rpc::Version, None).is_some()).collect::<Vec<_>>()
    };
    let a = run(7);
    assert_eq!(a, run(7));
    let fired = a.iter().filter(|x| **x).count();
    assert!((220..380).contains(&fired), "fired {fired} of 1000 at p=0.3");
    assert_ne!(a, run(8));
}

#[test]
fn first_firing_rule_wins_but_later_rules_still_count() {
    let plan = FaultPlan::new(1)
        .rule(FaultRule::on(Rpc::PullImage).times(1).delay(Duration::from_millis(5)))
        .rule(FaultRule::on(Rpc::PullImage).nth(1).hang());
    assert_eq!(plan.decide(Rpc::PullImage, None), Some(FaultAction::Delay(Duration::from_millis(5))));
    // The second rule saw call 1 too, so its window has passed.
    assert_eq!(plan.decide(Rpc::PullImage, None), None);
}

#[test]
fn plans_load_from_toml_and_bad_rules_are_named() {
    let plan = FaultPlan::from_toml(
        r#"
        seed = 3
        [[rule]]
        rpc = "PullImage"
        image = "*/nginx:*"
        times = 1
        action = "fail"
        kind = "registryunavailable"
        message = "registry down"
        [[rule]]
        rpc = "any"
        action = "delay"
        delay = "25ms"
        [[rule]]
        rpc = "imagestatus"
        probability = 0.5
        action = "panic"
        "#,
    )
    .expect("valid plan");
    assert_eq!(plan.rules().len(), 3);
    assert_eq!(
        plan.decide(Rpc::PullImage, Some("docker.io/library/nginx:1")),
        Some(FaultAction::Fail(CriError::new(CriErrorKind::RegistryUnavailable, "registry down")))
    );
    assert_eq!(
        plan.decide(Rpc::PullImage, Some("docker.io/library/nginx:1")),
        Some(FaultAction::Delay(Duration::from_millis(25)))
    );
    assert_eq!(plan.rules()[2].action(), &FaultAction::Panic);
    assert!(FaultPlan::from_toml("").expect("empty plan").is_empty());

    let err = |text: &str| FaultPlan::from_toml(text).expect_err("rejected");
    assert_eq!(err("[[rule]]\nrpc = \"Pull\"\naction = \"hang\""), "rule 1: rpc: unknown CRI call \"Pull\"");
    assert!(
        err("[[rule]]\nrpc = \"any\"\naction = \"explode\"").starts_with("rule 1: action: unknown action \"explode\"")
    );
    assert_eq!(
        err("[[rule]]\nrpc = \"any\"\naction = \"hang\"\n[[rule]]\nrpc = \"any\"\naction = \"delay\""),
        "rule 2: delay: required for action \"delay\""
    );
    assert!(
        err("[[rule]]\nrpc = \"any\"\naction = \"fail\"\nkind = \"Oops\"").contains("rule 1: kind: unknown error kind")
    );
    assert!(
        err("[[rule]]\nrpc = \"any\"\naction = \"hang\"\nprobability = 2.0")
            .contains("rule 1: probability: 2 is not between 0 and 1")
    );
    assert!(
        err("[[rule]]\nrpc = \"any\"\naction = \"hang\"\ncolour = 1").contains("colour"),
        "unknown fields are refused"
    );
}
