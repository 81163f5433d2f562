//! `EnsureImageExists` end to end against the embedded runtime: every pull
//! policy × present/absent × back-off cell, the kubelet's messages and
//! events, error mapping, the fallback policy and back-off control.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::pedantic)] // test code: a failed unwrap is a failed test

mod support;

use std::time::Duration;

use actix::prelude::*;
use imaged::actors::backoff_registry::{BackoffRegistryActor, BackoffSettings};
use imaged::actors::backoff_registry::{ClearBackoff, ClearScope};
use imaged::actors::pull_queue::{Concurrency, PullQueueSettings};
use imaged::cri::{CriError, CriErrorKind, Rpc};
use imaged::domain::pull_policy::PullPolicy;
use imaged::domain::{ErrorClass, ImageErrorKind};
use imaged::embedded::RemoteImage;
use imaged::ensure::*;
use imaged::events::*;
use imaged::fault::{FaultPlan, FaultRule};
use imaged::testing::{EventLog, StartedManager, TakeEvents, start_manager};
use support::fixture::{Runtime, runtime};

const PRESENT: &str = "example.com/present:1";
const ABSENT: &str = "example.com/absent:1";
const MISSING: &str = "example.com/missing:1";

struct Flow {
    rt: Runtime,
    manager: ImageManager,
    backoff: Addr<BackoffRegistryActor>,
    events: Addr<EventLog>,
}

async fn flow_with(ensure: EnsureSettings) -> Flow {
    let rt = runtime().await;
    rt.runtime.preload(RemoteImage::new(PRESENT, 1_000)).expect("preload");
    rt.runtime.add_remote(RemoteImage::new(ABSENT, 2_000).latency(Duration::from_millis(20))).expect("add");
    let pull = PullQueueSettings { concurrency: Concurrency::Parallel(None), qps: 0.0, ..PullQueueSettings::default() };
    let StartedManager { manager, backoff, .. } =
        start_manager(&rt.gateway, &pull, &BackoffSettings::default(), ensure).await.expect("manager starts");
    let events = EventLog::default().start();
    manager.events().subscribe(events.clone().recipient());
    Flow { rt, manager, backoff, events }
}

async fn flow() -> Flow {
    flow_with(EnsureSettings::default()).await
}

fn req(uid: &str, image: &str, policy: PullPolicy) -> EnsureImageRequest {
    let mut r = EnsureImageRequest::new(uid, image, policy);
    r.pod.namespace = "default".into();
    r.pod.name = format!("pod-{uid}");
    r
}

impl Flow {
    async fn ensure(&self, uid: &str, image: &str, policy: PullPolicy) -> Result<EnsureOk, EnsureError> {
        self.manager.ensure_image_exists(&req(uid, image, policy)).await
    }

    async fn events(&self) -> Vec<(EventType, EventReason, String)> {
        // A pull's `Pulled` event follows its answer (it waits for the size).
        self.manager.settled().await;
        self.events
            .send(TakeEvents)
            .await
            .expect("events")
            .into_iter()
            .map(|e| (e.event_type, e.reason, e.message))
            .collect()
    }

    fn pulls(&self) -> u64 {
        self.rt.runtime.stats().calls(Rpc::PullImage)
    }
}

fn success_message(msg: &str, image: &str) -> bool {
    msg.starts_with(&format!("Successfully pulled image \"{image}\" in "))
        && msg.ends_with("Image size: 2000 bytes.")
        && msg.contains(" including waiting). ")
}

#[actix::test]
async fn always_pulls_whether_present_or_not() {
    let f = flow().await;
    let ok = f.ensure("u1", ABSENT, PullPolicy::Always).await.expect("pulled");
    assert_eq!(ok.message, "");
    assert_eq!(ok.image_ref, RemoteImage::new(ABSENT, 0).id);
    let ev = f.events().await;
    assert_eq!(ev[0], (EventType::Normal, EventReason::Pulling, format!("Pulling image \"{ABSENT}\"")));
    assert_eq!((ev[1].0, ev[1].1), (EventType::Normal, EventReason::Pulled));
    assert!(success_message(&ev[1].2, ABSENT), "{}", ev[1].2);
    // Present now, Always pulls again.
    f.ensure("u1", ABSENT, PullPolicy::Always).await.expect("pulled again");
    assert_eq!(f.pulls(), 2);
}

#[actix::test]
async fn if_not_present_uses_a_present_image_and_pulls_an_absent_one() {
    let f = flow().await;
    let ok = f.ensure("u1", PRESENT, PullPolicy::IfNotPresent).await.expect("present");
    assert_eq!(
        ok.message,
        format!("Container image \"{PRESENT}\" already present on machine and can be accessed by the pod")
    );
    assert_eq!(ok.image_ref, RemoteImage::new(PRESENT, 0).id);
    assert_eq!(f.pulls(), 0);
    assert_eq!(f.events().await, [(EventType::Normal, EventReason::Pulled, ok.message.clone())]);

    let ok = f.ensure("u1", ABSENT, PullPolicy::IfNotPresent).await.expect("pulled");
    assert_eq!(ok.message, "");
    assert_eq!(f.pulls(), 1);
    assert!(f.manager.recorder().get("u1").is_some_and(|t| t.first_started.is_some() && t.last_finished.is_some()));
}

#[actix::test]
async fn never_uses_a_present_image_and_refuses_an_absent_one() {
    let f = flow().await;
    f.ensure("u1", PRESENT, PullPolicy::Never).await.expect("present");
    let err = f.ensure("u1", ABSENT, PullPolicy::Never).await.expect_err("absent");
    assert_eq!(err.kind, ImageErrorKind::ErrImageNeverPull);
    assert_eq!(err.message, format!("Container image \"{ABSENT}\" is not present with pull policy of Never"));
    assert_eq!(err.class, ErrorClass::Permanent);
    assert_eq!(f.pulls(), 0);
    let ev = f.events().await;
    assert_eq!(ev.last().cloned(), Some((EventType::Warning, EventReason::ErrImageNeverPull, err.message.clone())));
}

#[actix::test]
async fn a_failed_pull_backs_off_with_the_previous_error_in_the_message() {
    let f = flow().await;
    let err = f.ensure("u1", MISSING, PullPolicy::IfNotPresent).await.expect_err("missing");
    assert_eq!(err.kind, ImageErrorKind::ErrImagePull);
    assert!(
        err.message.starts_with("rpc error: code = NotFound desc = failed to pull and unpack image"),
        "{}",
        err.message
    );
    assert_eq!(err.class, ErrorClass::Permanent);
    let ev = f.events().await;
    assert_eq!(ev[0].1, EventReason::Pulling);
    assert_eq!(
        ev[1],
        (EventType::Warning, EventReason::Failed, format!("Failed to pull image \"{MISSING}\": {}", err.message))
    );

    // In back-off now: no pull, BackOff event, the previous error appended to the returned message only.
    let again = f.ensure("u1", MISSING, PullPolicy::IfNotPresent).await.expect_err("backing off");
    assert_eq!(again.kind, ImageErrorKind::ImagePullBackOff);
    assert_eq!(again.message, format!("Back-off pulling image \"{MISSING}\": ErrImagePull: {}", err.message));
    assert_eq!(
        f.events().await,
        [(EventType::Normal, EventReason::BackOff, format!("Back-off pulling image \"{MISSING}\""))]
    );
    assert_eq!(f.pulls(), 1);

    // Back-off is per pod: another pod pulls (and fails) at once.
    let other = f.ensure("u2", MISSING, PullPolicy::Always).await.expect_err("fails");
    assert_eq!(other.kind, ImageErrorKind::ErrImagePull);
    assert_eq!(f.pulls(), 2);

    // A present image is not subject to back-off under IfNotPresent.
    f.ensure("u1", PRESENT, PullPolicy::IfNotPresent).await.expect("present, no back-off check");
    // Always is: the same pod and image stays in back-off.
    let always = f.ensure("u1", MISSING, PullPolicy::Always).await.expect_err("back-off");
    assert_eq!(always.kind, ImageErrorKind::ImagePullBackOff);

    // Operator "retry now": clearing the pod's back-off lets the next request pull.
    let cleared = f.backoff.send(ClearBackoff { scope: ClearScope::Pod("u1".into()) }).await.expect("clear");
    assert_eq!(cleared, 1);
    f.rt.runtime.add_remote(RemoteImage::new(MISSING, 10)).expect("now it exists");
    f.ensure("u1", MISSING, PullPolicy::IfNotPresent).await.expect("pulled after clearing");
}

#[actix::test]
async fn policy_cells_with_back_off_running() {
    // policy × present/absent while the pod/image key is in back-off.
    let f = flow().await;
    let run_failure = |uid: &'static str, image: &'static str| {
        let f = &f;
        async move {
            // Make the key fail once so it is in back-off.
            f.rt.runtime.set_fault_plan(
                FaultPlan::new(1)
                    .rule(FaultRule::on(Rpc::PullImage).times(1).fail(CriError::new(CriErrorKind::Other, "boom"))),
            );
            let e = f.ensure(uid, image, PullPolicy::Always).await.expect_err("injected failure");
            assert_eq!(e.message, "boom");
            f.rt.runtime.set_fault_plan(FaultPlan::default());
        }
    };
    run_failure("p", PRESENT).await;
    run_failure("a", ABSENT).await;
    let cells = [
        (PullPolicy::Always, "p", PRESENT, Err(ImageErrorKind::ImagePullBackOff)),
        (PullPolicy::Always, "a", ABSENT, Err(ImageErrorKind::ImagePullBackOff)),
        (PullPolicy::IfNotPresent, "p", PRESENT, Ok(())),
        (PullPolicy::IfNotPresent, "a", ABSENT, Err(ImageErrorKind::ImagePullBackOff)),
        (PullPolicy::Never, "p", PRESENT, Ok(())),
        (PullPolicy::Never, "a", ABSENT, Err(ImageErrorKind::ErrImageNeverPull)),
    ];
    for (policy, uid, image, want) in cells {
        let got = f.ensure(uid, image, policy).await.map(|_| ()).map_err(|e| e.kind);
        assert_eq!(got, want, "{policy:?} {image}");
    }
    let backed_off = f.ensure("a", ABSENT, PullPolicy::IfNotPresent).await.expect_err("backoff");
    assert_eq!(backed_off.message, format!("Back-off pulling image \"{ABSENT}\": ErrImagePull: boom"));
}

#[actix::test]
async fn invalid_names_and_inspect_errors_use_the_kubelet_texts() {
    let f = flow().await;
    let err = f.ensure("u1", "Not/Valid", PullPolicy::IfNotPresent).await.expect_err("invalid");
    assert_eq!(err.kind, ImageErrorKind::InvalidImageName);
    assert!(err.message.starts_with("Failed to apply default image tag \"Not/Valid\": "), "{}", err.message);
    let ev = f.events().await;
    assert_eq!((ev[0].0, ev[0].1), (EventType::Warning, EventReason::InspectFailed));

    let plan = FaultPlan::new(1)
        .rule(FaultRule::on(Rpc::ImageStatus).times(1).fail(CriError::new(CriErrorKind::RuntimeUnavailable, "down")));
    f.rt.runtime.set_fault_plan(plan);
    let err = f.ensure("u1", PRESENT, PullPolicy::IfNotPresent).await.expect_err("inspect");
    assert_eq!(err.kind, ImageErrorKind::ImageInspectError);
    assert_eq!(err.message, "Failed to inspect image \"\": rpc error: code = Unavailable desc = down");
    assert_eq!(err.class, ErrorClass::Transient);
}

#[actix::test]
async fn registry_and_signature_errors_map_like_eval_cri_pull_err() {
    let f = flow().await;
    let plan = FaultPlan::new(1)
        .rule(
            FaultRule::on(Rpc::PullImage)
                .nth(1)
                .fail(CriError::new(CriErrorKind::RegistryUnavailable, "dial tcp 10.0.0.1:443: i/o timeout")),
        )
        .rule(FaultRule::on(Rpc::PullImage).nth(2).fail(CriError::new(CriErrorKind::SignatureValidationFailed, "")));
    f.rt.runtime.set_fault_plan(plan);
    let e = f.ensure("u1", ABSENT, PullPolicy::Always).await.expect_err("registry");
    assert_eq!(e.kind, ImageErrorKind::RegistryUnavailable);
    assert_eq!(
        e.message,
        format!(
            "image pull failed for {ABSENT} because the registry is unavailable: dial tcp 10.0.0.1:443: i/o timeout"
        )
    );
    assert_eq!(e.class, ErrorClass::Transient);
    let e = f.ensure("u2", ABSENT, PullPolicy::Always).await.expect_err("signature");
    assert_eq!(e.kind, ImageErrorKind::SignatureValidationFailed);
    assert_eq!(e.message, format!("image pull failed for {ABSENT} because the signature validation failed"));
    assert_eq!(e.class, ErrorClass::Permanent);
}

#[actix::test]
async fn local_fallback_uses_the_present_image_only_when_the_registry_is_unreachable() {
    let f = flow().await;
    let unreachable = CriError::new(CriErrorKind::RegistryUnavailable, "dial tcp: connection refused");
    f.rt.runtime.set_fault_plan(FaultPlan::new(1).rule(FaultRule::on(Rpc::PullImage).fail(unreachable)));
    let ok = f.ensure("u1", PRESENT, PullPolicy::AlwaysWithLocalFallback).await.expect("falls back");
    assert_eq!(ok.image_ref, RemoteImage::new(PRESENT, 0).id);
    assert!(ok.message.contains("the registry is unreachable"), "{}", ok.message);
    let ev = f.events().await;
    assert_eq!(ev.last().map(|e| e.1), Some(EventReason::Pulled));
    // Absent image: nothing to fall back to.
    let e = f.ensure("u1", ABSENT, PullPolicy::AlwaysWithLocalFallback).await.expect_err("no local copy");
    assert_eq!(e.kind, ImageErrorKind::RegistryUnavailable);
    // Not an outage (image missing upstream): no fallback.
    f.rt.runtime.set_fault_plan(
        FaultPlan::new(1).rule(FaultRule::on(Rpc::PullImage).fail(CriError::new(CriErrorKind::NotFound, "gone"))),
    );
    let e = f.ensure("u2", PRESENT, PullPolicy::AlwaysWithLocalFallback).await.expect_err("not found is not an outage");
    assert_eq!(e.kind, ImageErrorKind::ErrImagePull);
    // Registry reachable: it pulls like Always.
    f.rt.runtime.set_fault_plan(FaultPlan::default());
    let before = f.pulls();
    f.ensure("u3", PRESENT, PullPolicy::AlwaysWithLocalFallback).await.expect("pulls");
    assert_eq!(f.pulls(), before + 1);
}

#[actix::test]
async fn annotated_error_class_is_opt_in() {
    let f = flow_with(EnsureSettings { annotate_error_class: true, ..EnsureSettings::default() }).await;
    let e = f.ensure("u1", MISSING, PullPolicy::Always).await.expect_err("missing");
    assert!(e.message.ends_with(" (permanent)"), "{}", e.message);
    let b = f.ensure("u1", MISSING, PullPolicy::Always).await.expect_err("backoff");
    assert_eq!(b.class, ErrorClass::Permanent);
    assert!(b.message.ends_with("(permanent)"), "{}", b.message);
}

#[actix::test]
async fn concurrent_ensures_of_one_image_share_one_pull() {
    let f = flow().await;
    f.rt.runtime
        .add_remote(RemoteImage::new("example.com/popular:1", 10).latency(Duration::from_millis(200)))
        .expect("add");
    let reqs: Vec<EnsureImageRequest> =
        (0..50).map(|i| req(&format!("pod-{i}"), "example.com/popular:1", PullPolicy::IfNotPresent)).collect();
    let results = futures_util::future::join_all(reqs.iter().map(|r| f.manager.ensure_image_exists(r))).await;
    assert!(results.iter().all(Result::is_ok));
    assert_eq!(f.pulls(), 1);
}

#[actix::test]
async fn pull_secrets_supply_the_credentials_and_a_bad_one_fails_by_name() {
    use imaged::credentials::PullSecret;
    let f = flow().await;
    f.rt.runtime
        .add_remote(RemoteImage::new("registry.example.com/team/app:v1", 10).private("team", "s3cret"))
        .expect("add");
    let secret = |pw: &str| {
        let json = format!(r#"{{"auths":{{"registry.example.com":{{"username":"team","password":"{pw}"}}}}}}"#);
        PullSecret::new("default", "regcred", "kubernetes.io/dockerconfigjson")
            .with_data(".dockerconfigjson", json.into_bytes())
    };
    let mut r = req("u1", "registry.example.com/team/app:v1", PullPolicy::Always);
    r.pull_secrets = vec![secret("wrong-one")];
    let e = f.manager.ensure_image_exists(&r).await.expect_err("wrong password");
    assert_eq!(e.kind, ImageErrorKind::ErrImagePull);
    assert!(e.message.contains("401 Unauthorized") && !e.message.contains("wrong-one"), "{}", e.message);

    let mut r = req("u2", "registry.example.com/team/app:v1", PullPolicy::Always);
    r.pull_secrets = vec![secret("s3cret")];
    f.manager.ensure_image_exists(&r).await.expect("the secret's credentials work");

    let mut r = req("u3", "registry.example.com/team/app:v1", PullPolicy::Always);
    r.pull_secrets = vec![
        PullSecret::new("default", "broken", "kubernetes.io/dockerconfigjson")
            .with_data(".dockerconfigjson", b"{not json s3cret".to_vec()),
    ];
    let e = f.manager.ensure_image_exists(&r).await.expect_err("undecodable secret");
    assert!(e.message.contains("default/broken") && !e.message.contains("s3cret"), "{}", e.message);

    // The lookup comes before the back-off check (the kubelet's order): a pod
    // in back-off with a broken secret is told about the secret, and its
    // stored previous error is not consumed by an attempt that never happened.
    let mut r = req("u4", MISSING, PullPolicy::IfNotPresent);
    f.manager.ensure_image_exists(&r).await.expect_err("missing image: back-off starts");
    r.pull_secrets = vec![
        PullSecret::new("default", "broken", "kubernetes.io/dockerconfigjson")
            .with_data(".dockerconfigjson", b"{not json".to_vec()),
    ];
    let e = f.manager.ensure_image_exists(&r).await.expect_err("broken secret");
    assert_eq!(e.kind, ImageErrorKind::ErrImagePull, "{e}");
    assert!(e.message.contains("default/broken"), "{}", e.message);
    r.pull_secrets.clear();
    let e = f.manager.ensure_image_exists(&r).await.expect_err("still in back-off");
    assert_eq!(e.kind, ImageErrorKind::ImagePullBackOff);
    assert!(e.message.contains(": ErrImagePull: "), "previous error kept: {}", e.message);
}

/// A private image, a pod that first asks without credentials (unauthorized,
/// back-off), then with them: the pull waits out the back-off as in the
/// kubelet, or, with `reset_backoff_on_credential_change`, goes ahead at once.
async fn retry_with_new_credentials(reset: bool) -> (Result<EnsureOk, EnsureError>, u64) {
    let f = flow_with(EnsureSettings { reset_backoff_on_credential_change: reset, ..EnsureSettings::default() }).await;
    let image = "example.com/private:1";
    f.rt.runtime.add_remote(RemoteImage::new(image, 10).private("robot", "s3cret")).expect("add");
    let e = f.ensure("u1", image, PullPolicy::IfNotPresent).await.expect_err("no credentials");
    assert_eq!(e.kind, ImageErrorKind::ErrImagePull);
    let again = f.ensure("u1", image, PullPolicy::IfNotPresent).await.expect_err("same credentials");
    assert_eq!(again.kind, ImageErrorKind::ImagePullBackOff, "unchanged credentials wait in both modes");
    let mut with_secret = req("u1", image, PullPolicy::IfNotPresent);
    with_secret.credentials = vec![imaged::domain::AuthConfig::basic("example.com", "robot", "s3cret")];
    let before = f.pulls();
    let r = f.manager.ensure_image_exists(&with_secret).await;
    (r, f.pulls() - before)
}

#[actix::test]
async fn new_credentials_wait_out_the_back_off_by_default_as_in_the_kubelet() {
    let (r, pulls) = retry_with_new_credentials(false).await;
    let e = r.expect_err("still in back-off");
    assert_eq!(e.kind, ImageErrorKind::ImagePullBackOff);
    assert_eq!(pulls, 0);
}

#[actix::test]
async fn new_credentials_reset_the_back_off_when_asked_to() {
    let (r, pulls) = retry_with_new_credentials(true).await;
    let ok = r.expect("pulled with the new credentials at once");
    assert!(!ok.image_ref.is_empty());
    assert_eq!(pulls, 1);
}

/// A registry outage puts pod u1 in back-off; once it is over, pod u2 pulls
/// from the same registry, and u1 retries: it waits out its back-off as in
/// the kubelet, or, with `reset_backoff_on_registry_recovery`, pulls at once.
async fn retry_after_registry_outage(reset: bool) -> (Result<EnsureOk, EnsureError>, u64) {
    let f = flow_with(EnsureSettings { reset_backoff_on_registry_recovery: reset, ..EnsureSettings::default() }).await;
    for image in ["flaky.example.com/a:1", "flaky.example.com/b:1"] {
        f.rt.runtime.add_remote(RemoteImage::new(image, 10)).expect("add");
    }
    f.rt.runtime.set_fault_plan(
        FaultPlan::new(1).rule(
            FaultRule::on(Rpc::PullImage)
                .image("flaky.example.com/*")
                .fail(CriError::new(CriErrorKind::RegistryUnavailable, "registry unavailable")),
        ),
    );
    let e = f.ensure("u1", "flaky.example.com/a:1", PullPolicy::IfNotPresent).await.expect_err("outage");
    assert_eq!(e.class, ErrorClass::Transient);
    f.rt.runtime.set_fault_plan(FaultPlan::default());
    f.ensure("u2", "flaky.example.com/b:1", PullPolicy::IfNotPresent).await.expect("the registry is back");
    // The recovery is told with the pull's `Pulled` event, which follows the
    // answer (it waits for the size).
    f.manager.settled().await;
    let before = f.pulls();
    let r = f.ensure("u1", "flaky.example.com/a:1", PullPolicy::IfNotPresent).await;
    (r, f.pulls() - before)
}

#[actix::test]
async fn after_a_registry_outage_back_offs_run_their_course_by_default_as_in_the_kubelet() {
    let (r, pulls) = retry_after_registry_outage(false).await;
    assert_eq!(r.expect_err("still in back-off").kind, ImageErrorKind::ImagePullBackOff);
    assert_eq!(pulls, 0);
}

#[actix::test]
async fn a_pull_that_succeeds_from_a_registry_ends_its_transient_back_offs_when_asked_to() {
    let (r, pulls) = retry_after_registry_outage(true).await;
    r.expect("pulled at once");
    assert_eq!(pulls, 1);
}

#[actix::test]
async fn a_permanent_failure_is_not_retried_when_its_registry_pulls_again() {
    let f = flow_with(EnsureSettings { reset_backoff_on_registry_recovery: true, ..EnsureSettings::default() }).await;
    let e = f.ensure("u1", MISSING, PullPolicy::IfNotPresent).await.expect_err("not found");
    assert_eq!(e.class, ErrorClass::Permanent);
    f.ensure("u2", ABSENT, PullPolicy::IfNotPresent).await.expect("same registry, pulls");
    let again = f.ensure("u1", MISSING, PullPolicy::IfNotPresent).await.expect_err("still in back-off");
    assert_eq!(again.kind, ImageErrorKind::ImagePullBackOff);
}

/// `n` concurrent ensures of the present image with these presence-check
/// settings, each check delayed 20 ms at the runtime: the most checks the
/// runtime served at once.
async fn presence_checks_at_once(window: Option<usize>, limit: Option<usize>, n: usize) -> u64 {
    let cfg = EnsureSettings {
        presence_check_window: window,
        presence_check_concurrency: limit,
        ..EnsureSettings::default()
    };
    let f = flow_with(cfg).await;
    f.rt.runtime
        .set_fault_plan(FaultPlan::new(1).rule(FaultRule::on(Rpc::ImageStatus).delay(Duration::from_millis(20))));
    f.rt.runtime.reset_stats();
    let reqs: Vec<EnsureImageRequest> =
        (0..n).map(|i| req(&format!("pod-{i}"), PRESENT, PullPolicy::IfNotPresent)).collect();
    let results = futures_util::future::join_all(reqs.iter().map(|r| f.manager.ensure_image_exists(r))).await;
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    let stats = f.rt.runtime.stats();
    assert_eq!(stats.calls(Rpc::ImageStatus), n as u64, "one check per request");
    stats.max_in_flight(Rpc::ImageStatus)
}

#[actix::test]
async fn a_burst_of_presence_checks_reaches_the_runtime_a_few_at_a_time() {
    assert_eq!(presence_checks_at_once(None, Some(3), 20).await, 3, "a fixed limit");
    assert_eq!(presence_checks_at_once(Some(4), Some(3), 20).await, 3, "a limit below the window's start");
    assert_eq!(presence_checks_at_once(None, None, 20).await, 20, "neither: all at once, as the kubelet");
}

#[actix::test]
async fn a_window_of_presence_checks_grows_as_they_are_answered() {
    // 4 first; each answer frees its turn and adds one, so the second wave
    // is 8 and more overlap as answers trickle in; never all 40 at once.
    let most = presence_checks_at_once(Some(4), None, 40).await;
    assert!((8..40).contains(&most), "{most} checks at once");
    // Capped: it grows to the cap and no further.
    assert_eq!(presence_checks_at_once(Some(2), Some(6), 40).await, 6);
    // The default window is the same, from 8.
    let most = presence_checks_at_once(Some(imaged::ensure::DEFAULT_PRESENCE_CHECK_WINDOW), None, 60).await;
    assert!((16..60).contains(&most), "{most} checks at once");
}

#[actix::test]
async fn a_presence_check_that_hangs_holds_its_turn_only_briefly() {
    let f = flow_with(EnsureSettings { presence_check_concurrency: Some(1), ..EnsureSettings::default() }).await;
    f.rt.runtime
        .set_fault_plan(FaultPlan::new(1).rule(FaultRule::on(Rpc::ImageStatus).image("example.com/hung:*").hang()));
    let hung = req("u1", "example.com/hung:1", PullPolicy::IfNotPresent);
    let other = req("u2", PRESENT, PullPolicy::IfNotPresent);
    // The hung check takes the only turn first; the other still gets through.
    let (hung, other) = futures_util::future::join(
        tokio::time::timeout(Duration::from_millis(500), f.manager.ensure_image_exists(&hung)),
        tokio::time::timeout(Duration::from_secs(5), f.manager.ensure_image_exists(&other)),
    )
    .await;
    assert!(hung.is_err(), "the hung check is still waiting for the runtime");
    other.expect("not held up for long").expect("present");
}

/// The Go duration text's value in milliseconds (`981ms`, `1.5s`, `1m2.5s`).
fn go_ms(text: &str) -> f64 {
    let (mut total, mut num) = (0.0, String::new());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c.is_ascii_digit() || c == '.' {
            num.push(c);
            continue;
        }
        let v: f64 = num.parse().expect("number");
        num.clear();
        total += match (c, chars.peek()) {
            ('m', Some('s')) => {
                chars.next();
                v
            }
            ('m', _) => v * 60_000.0,
            ('s', _) => v * 1000.0,
            _ => panic!("unit in {text}"),
        };
    }
    total
}

#[actix::test]
async fn a_pod_that_joins_a_running_pull_tells_its_own_wait() {
    let f = flow().await;
    let image = "example.com/slow:1";
    f.rt.runtime.add_remote(RemoteImage::new(image, 10).latency(Duration::from_millis(300))).expect("add");
    let first = req("early", image, PullPolicy::IfNotPresent);
    let late = req("late", image, PullPolicy::IfNotPresent);
    let (a, b) = futures_util::join!(f.manager.ensure_image_exists(&first), async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        f.manager.ensure_image_exists(&late).await
    });
    assert!(a.is_ok() && b.is_ok(), "{a:?} {b:?}");
    assert_eq!(f.pulls(), 1, "the late pod joined the pull");
    let pulled: Vec<String> =
        f.events().await.into_iter().filter(|(_, r, _)| *r == EventReason::Pulled).map(|(_, _, m)| m).collect();
    assert_eq!(pulled.len(), 2, "{pulled:?}");
    for msg in &pulled {
        let inner = msg.split(" in ").nth(1).expect("figures");
        let (x, rest) = inner.split_once(" (").expect("(");
        let y = rest.split_once(" including waiting").expect("including").0;
        assert!(go_ms(x) <= go_ms(y), "the pull figure exceeds the time including waiting: {msg}");
    }
    // The late pod waited about 100 ms of the 300 ms pull, and says so.
    let late_msg = pulled.iter().map(|m| go_ms(m.split(" in ").nth(1).expect("x").split(" (").next().expect("x")));
    assert!(late_msg.clone().any(|x| x < 250.0) && late_msg.clone().any(|x| x >= 280.0), "{pulled:?}");
}

#[actix::test]
async fn an_ensure_that_finds_an_image_gc_is_removing_waits_and_pulls_it_again() {
    let f = flow().await;
    let id =
        f.rt.runtime.images().into_iter().find(|i| i.repo_tags.iter().any(|t| t == PRESENT)).expect("preloaded").id;
    // A GC run claims the removal (as `GcExecutorActor` does before each
    // `RemoveImage`), then removes the image while the pod's ensure runs.
    let since = std::time::SystemTime::now() - Duration::from_secs(60);
    let claim = f.manager.hints().claim_removal(&id, &[], since).expect("nothing ensured it: claimed");
    let request = req("p1", PRESENT, PullPolicy::IfNotPresent);
    let mut ensure = std::pin::pin!(f.manager.ensure_image_exists(&request));
    let early = tokio::time::timeout(Duration::from_millis(300), &mut ensure).await;
    assert!(early.is_err(), "answered while the image was being removed: {early:?}");
    let removed =
        f.rt.gateway.send(imaged::actors::cri_gateway::RemoveImage { image: imaged::domain::ImageSpec::new(id) });
    removed.await.expect("gateway").expect("removed");
    drop(claim);
    let ok = ensure.await.expect("pulled again");
    assert!(ok.message.is_empty(), "a pull, not the removed image: {ok:?}");
    assert_eq!(f.pulls(), 1);
    // And a removal is refused once an ensure marked the image.
    assert!(f.manager.hints().claim_removal(&ok.image_ref, &[], since).is_none());
}

#[actix::test]
async fn a_pull_that_ends_while_gc_removes_its_image_pulls_it_again() {
    let f = flow().await;
    let id =
        f.rt.runtime.images().into_iter().find(|i| i.repo_tags.iter().any(|t| t == PRESENT)).expect("preloaded").id;
    let since = std::time::SystemTime::now() - Duration::from_secs(60);
    let claim = f.manager.hints().claim_removal(&id, &[], since).expect("claimed");
    // `Always` pulls; the pull ends while the removal is in flight.
    let request = req("p1", PRESENT, PullPolicy::Always);
    let mut ensure = std::pin::pin!(f.manager.ensure_image_exists(&request));
    let early = tokio::time::timeout(Duration::from_millis(300), &mut ensure).await;
    assert!(early.is_err(), "answered while the image was being removed: {early:?}");
    assert_eq!(f.pulls(), 1);
    let removed =
        f.rt.gateway.send(imaged::actors::cri_gateway::RemoveImage { image: imaged::domain::ImageSpec::new(id) });
    removed.await.expect("gateway").expect("removed");
    drop(claim);
    let ok = ensure.await.expect("pulled again");
    assert_eq!(f.pulls(), 2, "the image the first pull found was removed: pulled again");
    assert!(f.rt.runtime.images().iter().any(|i| i.id == ok.image_ref), "the answer names an image that is there");
}

#[actix::test]
async fn a_pull_is_answered_before_the_size_lookup_and_its_pulled_event_follows_with_the_size() {
    let f = flow().await;
    // The size lookup after a pull asks by the image's id; the check by
    // name before the pull is not held back.
    let lookup = Duration::from_secs(1);
    f.rt.runtime
        .set_fault_plan(FaultPlan::new(1).rule(FaultRule::on(Rpc::ImageStatus).image("sha256:*").delay(lookup)));
    let asked = tokio::time::Instant::now();
    let ok = f.ensure("u1", ABSENT, PullPolicy::IfNotPresent).await.expect("pulled");
    assert_eq!(ok.image_ref, RemoteImage::new(ABSENT, 0).id);
    assert!(asked.elapsed() < lookup, "the answer waited for the size lookup: {:?}", asked.elapsed());
    let told: Vec<_> = f.events.send(TakeEvents).await.expect("events").into_iter().map(|e| e.reason).collect();
    assert_eq!(told, [EventReason::Pulling], "Pulled waits for the size");
    // `settled` waits for it: worded with the size, its times ending at the answer.
    let ev = f.events().await;
    assert!(asked.elapsed() >= lookup, "the event waited for the lookup");
    assert_eq!(ev.len(), 1, "{ev:?}");
    assert_eq!((ev[0].0, ev[0].1), (EventType::Normal, EventReason::Pulled));
    assert!(success_message(&ev[0].2, ABSENT), "{}", ev[0].2);
    let waited = ev[0].2.split(" (").nth(1).and_then(|r| r.split(" including").next()).expect("times");
    assert!(go_ms(waited) < 1000.0, "the lookup is not part of the pod's wait: {}", ev[0].2);
    // The record was written behind the answer; the image is this pod's.
    let records = f.manager.pull_records();
    assert!(records.record(&ok.image_ref).is_some(), "written once settled");
}
