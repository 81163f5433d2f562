//! Prefetch against the embedded runtime: a background pull that an ensure
//! joins, a present image, bad input, a failed pull that backs nobody off,
//! and the KEP-2535 record a prefetch with a pull secret leaves.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::pedantic)] // test code: a failed unwrap is a failed test

mod support;

use std::time::Duration;

use actix::prelude::*;
use imaged::actors::backoff_registry::BackoffSettings;
use imaged::actors::pull_queue::{Concurrency, ListPulls, PullQueueActor, PullQueueSettings, PullStage};
use imaged::credentials::PullSecret;
use imaged::cri::Rpc;
use imaged::domain::ImageErrorKind;
use imaged::domain::pull_policy::PullPolicy;
use imaged::embedded::RemoteImage;
use imaged::ensure::*;
use imaged::events::*;
use imaged::pull_records::{PullRecords, VerificationPolicy, VerifyPolicy};
use imaged::testing::{EventLog, TakeEvents, start_manager};
use support::fixture::{Runtime, runtime};

const PRESENT: &str = "example.com/present:1";
const SLOW: &str = "example.com/slow:1";
const MISSING: &str = "example.com/missing:1";
const PRIVATE: &str = "registry.example.com/team/app:v1";
const PASSWORD: &str = "s3cret";

async fn manager(rt: &Runtime, policy: VerificationPolicy) -> ImageManager {
    manager_and_queue(rt, policy).await.0
}

/// [`manager`], and the pull queue it pulls through.
async fn manager_and_queue(rt: &Runtime, policy: VerificationPolicy) -> (ImageManager, Addr<PullQueueActor>) {
    rt.runtime.preload(RemoteImage::new(PRESENT, 1_000)).expect("preload");
    rt.runtime.add_remote(RemoteImage::new(SLOW, 2_000).latency(Duration::from_millis(300))).expect("add");
    rt.runtime.add_remote(RemoteImage::new(PRIVATE, 3_000).private("team", PASSWORD)).expect("add");
    let pull = PullQueueSettings { concurrency: Concurrency::Parallel(None), qps: 0.0, ..PullQueueSettings::default() };
    let started = start_manager(&rt.gateway, &pull, &BackoffSettings::default(), EnsureSettings::default())
        .await
        .expect("manager starts");
    (started.manager.with_pull_records(PullRecords::in_memory(VerifyPolicy::new(policy))), started.queue)
}

fn pod_req(uid: &str, image: &str) -> EnsureImageRequest {
    let mut r = EnsureImageRequest::new(uid, image, PullPolicy::IfNotPresent);
    r.pod.namespace = "default".into();
    r.pod.name = format!("pod-{uid}");
    r
}

fn secret(uid: &str) -> PullSecret {
    let json = format!(r#"{{"auths":{{"registry.example.com":{{"username":"team","password":"{PASSWORD}"}}}}}}"#);
    PullSecret::new("default", "regcred", "kubernetes.io/dockerconfigjson")
        .with_data(".dockerconfigjson", json.into_bytes())
        .with_uid(uid)
}

fn pulls(rt: &Runtime) -> u64 {
    rt.runtime.stats().calls(Rpc::PullImage)
}

#[actix::test]
async fn a_prefetch_pulls_in_the_background_and_an_ensure_meanwhile_joins_it() {
    let rt = runtime().await;
    let (m, queue) = manager_and_queue(&rt, VerificationPolicy::NeverVerifyPreloadedImages).await;
    let events = EventLog::default().start();
    m.events().subscribe(events.clone().recipient());

    let Prefetch::Pulling { joined, done } = m.prefetch(&PrefetchRequest::new(SLOW)).await.expect("admitted") else {
        panic!("the image is absent: a pull must be queued");
    };
    assert!(!joined);
    // It returned at admission: the pull is still running, and the queue shows it.
    let listed = queue.send(ListPulls).await.expect("list");
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert!(matches!(listed[0].stage, PullStage::Starting | PullStage::Pulling), "{listed:?}");

    let ok = m.ensure_image_exists(&pod_req("p1", SLOW)).await.expect("the pod gets the image");
    let image_ref = done.await.expect("the prefetch pulled");
    assert_eq!(ok.image_ref, image_ref);
    assert_eq!(pulls(&rt), 1, "the pod's ensure joined the prefetch's pull");
    // The pod's events are the kubelet's; the prefetch adds none of its own.
    // (`Pulled` follows the answer: it waits for the size.)
    m.settled().await;
    let seen: Vec<(EventReason, String)> =
        events.send(TakeEvents).await.expect("events").into_iter().map(|e| (e.reason, e.object.pod_uid)).collect();
    assert_eq!(seen, [(EventReason::Pulling, "p1".to_string()), (EventReason::Pulled, "p1".to_string())]);
    assert_eq!(queue.send(ListPulls).await.expect("list"), vec![]);
}

#[actix::test]
async fn a_prefetch_of_a_present_image_pulls_nothing_and_bad_input_is_refused_with_its_reason() {
    let rt = runtime().await;
    let m = manager(&rt, VerificationPolicy::NeverVerifyPreloadedImages).await;
    let Prefetch::Present { image_ref } = m.prefetch(&PrefetchRequest::new(PRESENT)).await.expect("answered") else {
        panic!("present: nothing to pull");
    };
    assert!(image_ref.starts_with("sha256:"), "{image_ref}");
    assert_eq!(pulls(&rt), 0);

    let err = m.prefetch(&PrefetchRequest::new("Example.com/UPPER:1")).await.expect_err("invalid name");
    assert_eq!(err.kind, ImageErrorKind::InvalidImageName);
    assert!(err.message.starts_with("Failed to apply default image tag \"Example.com/UPPER:1\": "), "{err:?}");

    let bad = PullSecret::new("default", "broken", "kubernetes.io/dockerconfigjson")
        .with_data(".dockerconfigjson", b"{not json".to_vec());
    let req = PrefetchRequest { pull_secrets: vec![bad], ..PrefetchRequest::new(PRIVATE) };
    let err = m.prefetch(&req).await.expect_err("undecodable secret");
    assert!(err.message.contains("broken"), "the secret is named: {err:?}");
    assert_eq!(pulls(&rt), 0, "nothing queued for refused requests");
}

#[actix::test]
async fn a_failed_prefetch_says_why_and_backs_no_pod_off() {
    let rt = runtime().await;
    let m = manager(&rt, VerificationPolicy::NeverVerifyPreloadedImages).await;
    let Prefetch::Pulling { done, .. } = m.prefetch(&PrefetchRequest::new(MISSING)).await.expect("admitted") else {
        panic!("absent: queued");
    };
    let err = done.await.expect_err("not in the registry");
    assert!(err.starts_with("Failed to pull image \"example.com/missing:1\": ") && err.contains("not found"), "{err}");
    // A pod asking next pulls at once: no back-off was recorded for anyone.
    let e = m.ensure_image_exists(&pod_req("p1", MISSING)).await.expect_err("still missing");
    assert_eq!(e.kind, ImageErrorKind::ErrImagePull, "{e:?}");
    assert_eq!(pulls(&rt), 2);
}

#[actix::test]
async fn a_prefetch_with_a_pull_secret_serves_pods_with_that_secret_only() {
    let rt = runtime().await;
    let m = manager(&rt, VerificationPolicy::AlwaysVerify).await;
    let req = PrefetchRequest { pull_secrets: vec![secret("uid-1")], priority: -10, ..PrefetchRequest::new(PRIVATE) };
    let Prefetch::Pulling { done, .. } = m.prefetch(&req).await.expect("admitted") else { panic!("absent: queued") };
    let image_ref = done.await.expect("pulled with the secret");
    let record = m.pull_records().record(&image_ref).expect("a pulled record");
    let secrets = &record.credential_mapping["registry.example.com/team/app"].kubernetes_secrets;
    assert_eq!((secrets[0].name.as_str(), secrets[0].uid.as_str()), ("regcred", "uid-1"));
    assert!(!format!("{record:?}").contains(PASSWORD), "the record holds a hash, never the password");

    // A pod with the same secret uses the image without pulling.
    let mut with = pod_req("p1", PRIVATE);
    with.pull_secrets = vec![secret("uid-1")];
    m.ensure_image_exists(&with).await.expect("served");
    assert_eq!(pulls(&rt), 1);
    // A pod without it must pull, and the registry refuses it.
    let e = m.ensure_image_exists(&pod_req("p2", PRIVATE)).await.expect_err("refused");
    assert!(e.message.contains("401 Unauthorized"), "{e:?}");
    assert_eq!(pulls(&rt), 2);
}

/// Waits (at most 10 s) until `done` holds.
async fn eventually(what: &str, done: impl Fn() -> bool) {
    for _ in 0..200 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{what}: not within 10 s");
}

#[actix::test]
async fn declared_images_are_pulled_at_start_and_again_at_a_refresh_after_they_went() {
    use imaged::node::prefetch_ticker::PrefetchTickerActor;
    const DECLARED: &str = "example.com/declared:1";
    let rt = runtime().await;
    let m = manager(&rt, VerificationPolicy::NeverVerifyPreloadedImages).await;
    rt.runtime.add_remote(RemoteImage::new(DECLARED, 500)).expect("add");
    let named = |image: &str| rt.runtime.images().iter().any(|i| i.repo_tags.iter().any(|t| t == image));
    let refresh = Duration::from_millis(300);
    let ticker =
        PrefetchTickerActor::new(m.clone(), vec![DECLARED.into(), PRESENT.into()], Some(refresh), Default::default());
    let declared = ticker.declared();
    let ticker = ticker.start();

    // At start: the absent one is pulled, the present one is not.
    eventually("the declared image pulled", || named(DECLARED)).await;
    assert_eq!(pulls(&rt), 1);
    eventually("both present", || states(&declared) == ["present", "present"]).await;
    // Refreshes of present images pull nothing.
    tokio::time::sleep(refresh * 3).await;
    assert_eq!(pulls(&rt), 1, "present images are checked, not pulled");

    // Removed behind imaged's back: the next refresh brings it back.
    let removed =
        rt.gateway.send(imaged::actors::cri_gateway::RemoveImage { image: imaged::domain::ImageSpec::new(DECLARED) });
    removed.await.expect("mailbox").expect("removed");
    assert!(!named(DECLARED));
    eventually("the declared image pulled again", || named(DECLARED)).await;
    assert_eq!(pulls(&rt), 2);

    // Stopped, it pulls no more.
    ticker.send(imaged::actors::Stop).await.expect("stop");
    let removed =
        rt.gateway.send(imaged::actors::cri_gateway::RemoveImage { image: imaged::domain::ImageSpec::new(DECLARED) });
    removed.await.expect("mailbox").expect("removed");
    tokio::time::sleep(refresh * 3).await;
    assert_eq!((pulls(&rt), named(DECLARED)), (2, false));
}

#[actix::test]
async fn a_declared_image_that_fails_is_tried_again_at_the_next_refresh() {
    use imaged::node::prefetch_ticker::{DeclaredState, PrefetchTickerActor};
    let rt = runtime().await;
    let m = manager(&rt, VerificationPolicy::NeverVerifyPreloadedImages).await;
    let refresh = Duration::from_millis(200);
    let metrics = imaged::metrics::Metrics::default();
    let ticker = PrefetchTickerActor::new(m.clone(), vec![MISSING.into(), SLOW.into()], Some(refresh), metrics.clone());
    let declared = ticker.declared();
    assert_eq!(states(&declared), ["pending", "pending"], "before the first round");
    let _ticker = ticker.start();
    // The slow one's pull runs while the missing one has failed.
    eventually("one failed, one pulling", || states(&declared) == ["failed", "pulling"]).await;
    let failed = declared.snapshot().remove(0);
    match &failed.state {
        DeclaredState::Failed(why) => assert!(why.starts_with(&format!("Failed to pull image \"{MISSING}\"")), "{why}"),
        other => panic!("{other:?}"),
    }
    let gauge = |state: &str| {
        let scrape = imaged::testing::Scrape::parse(&metrics.encode_prometheus()).expect("parses");
        scrape.value("imaged_prefetch_images", &[("state", state)])
    };
    assert_eq!((gauge("failed"), gauge("pulling"), gauge("present")), (Some(1.0), Some(1.0), Some(0.0)));
    // Not in any registry: each refresh tries it once (no back-off: no
    // pod). The slow one's single pull and the missing one's first three:
    // the second has ended, failed again.
    eventually("three attempts", || pulls(&rt) >= 4).await;
    assert_eq!(declared.snapshot()[0].since, failed.since, "still failed: its time is the first failure's");
    // It now appears upstream: the next refresh pulls it.
    rt.runtime.add_remote(RemoteImage::new(MISSING, 700)).expect("add");
    eventually("pulled once it exists", || {
        rt.runtime.images().iter().any(|i| i.repo_tags.iter().any(|t| t == MISSING))
    })
    .await;
    eventually("both present", || states(&declared) == ["present", "present"]).await;
    assert_eq!((gauge("failed"), gauge("present")), (Some(0.0), Some(2.0)));
    let present = declared.snapshot().remove(0);
    assert!(matches!(&present.state, DeclaredState::Present(r) if r.starts_with("sha256:")), "{present:?}");
}

/// The declared images' state names, in the list's order.
fn states(declared: &imaged::node::prefetch_ticker::DeclaredImages) -> Vec<&'static str> {
    declared.snapshot().iter().map(|d| d.state.name()).collect()
}

/// The image a reloaded list starts with, and the one a reload adds.
const FIRST: &str = "example.com/first:1";
const ADDED: &str = "example.com/added:1";

/// [`manager`], with [`FIRST`] and [`ADDED`] in the registry.
async fn manager_for_a_reloaded_list(rt: &Runtime) -> ImageManager {
    let m = manager(rt, VerificationPolicy::NeverVerifyPreloadedImages).await;
    rt.runtime.add_remote(RemoteImage::new(FIRST, 100)).expect("add");
    rt.runtime.add_remote(RemoteImage::new(ADDED, 100)).expect("add");
    m
}

#[actix::test]
async fn a_reloaded_list_is_prefetched_at_once_and_refreshed_at_its_new_period() {
    use imaged::node::prefetch_ticker::{PrefetchTickerActor, UpdatePrefetchList};
    let rt = runtime().await;
    let m = manager_for_a_reloaded_list(&rt).await;
    let named = |image: &str| rt.runtime.images().iter().any(|i| i.repo_tags.iter().any(|t| t == image));
    // Started with one image and no refresh.
    let ticker = PrefetchTickerActor::new(m.clone(), vec![FIRST.into()], None, Default::default()).start();
    eventually("the first image pulled", || named(FIRST)).await;
    // A reload adds one and sets a refresh: the new image comes at once.
    let refresh = Duration::from_millis(300);
    let update = UpdatePrefetchList { images: vec![FIRST.into(), ADDED.into()], refresh: Some(refresh) };
    ticker.send(update).await.expect("updated");
    eventually("the added image pulled without waiting for a refresh", || named(ADDED)).await;
    assert_eq!(pulls(&rt), 2);
    // And the new period refreshes: removed, it comes back.
    let removed =
        rt.gateway.send(imaged::actors::cri_gateway::RemoveImage { image: imaged::domain::ImageSpec::new(FIRST) });
    removed.await.expect("mailbox").expect("removed");
    eventually("brought back by the new refresh", || named(FIRST)).await;
    assert_eq!(pulls(&rt), 3);
    // A list without it: no longer kept pulled.
    let update = UpdatePrefetchList { images: vec![ADDED.into()], refresh: Some(refresh) };
    ticker.send(update).await.expect("updated");
    let removed =
        rt.gateway.send(imaged::actors::cri_gateway::RemoveImage { image: imaged::domain::ImageSpec::new(FIRST) });
    removed.await.expect("mailbox").expect("removed");
    tokio::time::sleep(refresh * 3).await;
    assert!(!named(FIRST), "dropped from the list: not pulled again");
    assert_eq!(pulls(&rt), 3);
}

#[actix::test]
async fn a_list_reloaded_while_a_round_is_being_admitted_is_prefetched_after_it() {
    use imaged::fault::{FaultPlan, FaultRule};
    use imaged::node::prefetch_ticker::{PrefetchTickerActor, UpdatePrefetchList};
    let rt = runtime().await;
    let m = manager_for_a_reloaded_list(&rt).await;
    // The first round's presence check is slow: the round is still being
    // admitted when the reload comes.
    let slow = FaultRule::on(Rpc::ImageStatus).image(FIRST).times(1).delay(Duration::from_millis(400));
    rt.runtime.set_fault_plan(FaultPlan::new(1).rule(slow));
    let named = |image: &str| rt.runtime.images().iter().any(|i| i.repo_tags.iter().any(|t| t == image));
    // No refresh: without the follow-up round the added image would wait forever.
    let ticker = PrefetchTickerActor::new(m.clone(), vec![FIRST.into()], None, Default::default()).start();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!named(FIRST), "the first round is still checking");
    let update = UpdatePrefetchList { images: vec![FIRST.into(), ADDED.into()], refresh: None };
    ticker.send(update).await.expect("updated");
    eventually("the added image pulled after the busy round", || named(ADDED)).await;
    assert!(named(FIRST));
}
