//! The pull queue against the embedded runtime: serial backpressure and
//! order, the parallel token limit, single-flight, priority, the throttle in
//! both modes, the deadline, and the presence re-check. Concurrency is
//! asserted with the runtime's counters, not with wall time.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::pedantic)] // test code: a failed unwrap is a failed test

mod support;

use std::time::Duration;

use actix::{Actor, Addr};
use futures_util::future::join_all;
use imaged::actors::pull_queue::*;
use imaged::cri::Rpc;
use imaged::domain::{AuthConfig, ImageSpec};
use imaged::embedded::RemoteImage;
use support::fixture::{Runtime, runtime};

async fn queue(rt: &Runtime, cfg: PullQueueSettings) -> Addr<PullQueueActor> {
    let reader = rt.gateway.send(imaged::actors::cri_gateway::GetReader).await.expect("reader");
    PullQueueActor::new(cfg, reader).start()
}

fn no_throttle(concurrency: Concurrency) -> PullQueueSettings {
    PullQueueSettings { concurrency, qps: 0.0, ..PullQueueSettings::default() }
}

fn add(rt: &Runtime, name: &str, latency_ms: u64) {
    rt.runtime.add_remote(RemoteImage::new(name, 100).latency(Duration::from_millis(latency_ms))).expect("add");
}

fn req(image: &str) -> PullRequest {
    PullRequest::new(ImageSpec::new(image))
}

/// A serial queue whose throttle holds one token per 100 s, and `n` images
/// `example.com/{name}{i}:1` to pull.
async fn one_token_per_100_s(rt: &Runtime, name: &str, n: usize, mode: ThrottleMode) -> Addr<PullQueueActor> {
    for i in 0..n {
        add(rt, &format!("example.com/{name}{i}:1"), 0);
    }
    let cfg = PullQueueSettings { qps: 0.01, burst: 1, throttle_mode: mode, ..no_throttle(Concurrency::Serial) };
    queue(rt, cfg).await
}

/// Enqueues a pull of `image` and waits for its result.
async fn pull(q: &Addr<PullQueueActor>, image: String) -> PullResult {
    q.send(EnqueuePull(req(&image))).await.expect("admitted").await
}

async fn status(q: &Addr<PullQueueActor>) -> QueueStatus {
    q.send(GetQueueStatus).await.expect("status")
}

#[actix::test]
async fn serial_queue_applies_backpressure_and_keeps_order() {
    let rt = runtime().await;
    add(&rt, "example.com/slow:1", 400);
    for i in 0..11 {
        add(&rt, &format!("example.com/q{i}:1"), 5);
    }
    let q = queue(&rt, no_throttle(Concurrency::Serial)).await;
    let first = q.send(EnqueuePull(req("example.com/slow:1"))).await.expect("admitted");
    // Ten more fill the queue (capacity 10) while the first runs.
    let mut tickets = vec![first];
    for i in 0..10 {
        tickets.push(q.send(EnqueuePull(req(&format!("example.com/q{i}:1")))).await.expect("admitted"));
    }
    assert_eq!(status(&q).await, QueueStatus { queued: 10, running: 1, parked: 0, waiters: 11 });
    // The next sender waits: its admission does not come while the queue is full.
    let mut late = Box::pin(q.send(EnqueuePull(req("example.com/q10:1"))));
    assert!(tokio::time::timeout(Duration::from_millis(100), &mut late).await.is_err(), "admitted into a full queue");
    assert_eq!(status(&q).await.parked, 1);
    // Once the first pull finishes and the next starts, it is admitted.
    let late = late.await.expect("admitted after room freed");
    tickets.push(late);
    for t in tickets {
        t.await.expect("pulled");
    }
    let mut expected = vec!["example.com/slow:1".to_string()];
    expected.extend((0..11).map(|i| format!("example.com/q{i}:1")));
    assert_eq!(rt.runtime.pull_log(), expected, "FIFO order kept");
    assert_eq!(rt.runtime.stats().max_pulls_in_flight, 1, "one at a time");
}

#[actix::test]
async fn parallel_mode_runs_at_most_the_token_limit() {
    let rt = runtime().await;
    for i in 0..12 {
        add(&rt, &format!("example.com/p{i}:1"), 100);
    }
    let q = queue(&rt, no_throttle(Concurrency::Parallel(Some(3)))).await;
    let sends = (0..12).map(|i| q.send(EnqueuePull(req(&format!("example.com/p{i}:1")))));
    let tickets: Vec<PullTicket> = join_all(sends).await.into_iter().map(|t| t.expect("admitted")).collect();
    for r in join_all(tickets).await {
        r.expect("pulled");
    }
    let stats = rt.runtime.stats();
    assert_eq!(stats.pulls_completed, 12);
    assert_eq!(stats.max_pulls_in_flight, 3);
}

#[actix::test]
async fn parallel_mode_without_a_limit_runs_everything_at_once() {
    let rt = runtime().await;
    for i in 0..20 {
        add(&rt, &format!("example.com/u{i}:1"), 150);
    }
    let q = queue(&rt, PullQueueSettings { capacity: None, ..no_throttle(Concurrency::Parallel(None)) }).await;
    let sends = (0..20).map(|i| q.send(EnqueuePull(req(&format!("example.com/u{i}:1")))));
    let tickets: Vec<PullTicket> = join_all(sends).await.into_iter().map(|t| t.expect("admitted")).collect();
    for r in join_all(tickets).await {
        r.expect("pulled");
    }
    assert_eq!(rt.runtime.stats().max_pulls_in_flight, 20);
}

#[actix::test]
async fn one_hundred_requests_for_one_absent_image_make_one_pull() {
    let rt = runtime().await;
    add(&rt, "example.com/shared:1", 200);
    let q = queue(&rt, PullQueueSettings { capacity: None, ..no_throttle(Concurrency::Parallel(None)) }).await;
    let sends = (0..100).map(|_| q.send(EnqueuePull(req("example.com/shared:1"))));
    let tickets: Vec<PullTicket> = join_all(sends).await.into_iter().map(|t| t.expect("admitted")).collect();
    assert_eq!(tickets.iter().filter(|t| t.joined).count(), 99);
    let results = join_all(tickets).await;
    let refs: std::collections::HashSet<String> = results.into_iter().map(|r| r.expect("pulled").image_ref).collect();
    assert_eq!(refs.len(), 1, "every waiter got the same image");
    assert_eq!(rt.runtime.stats().calls(Rpc::PullImage), 1);
}

#[actix::test]
async fn requests_with_different_credentials_are_never_merged() {
    let rt = runtime().await;
    rt.runtime
        .add_remote(
            RemoteImage::new("example.com/private:1", 10).latency(Duration::from_millis(100)).private("u", "right"),
        )
        .expect("add");
    let q = queue(&rt, no_throttle(Concurrency::Parallel(None))).await;
    let with = |pw: &str| PullRequest {
        credentials: vec![AuthConfig::basic("example.com", "u", pw)],
        ..req("example.com/private:1")
    };
    let (a, b, c) = (with("right"), with("wrong"), with("right"));
    let ta = q.send(EnqueuePull(a)).await.expect("admitted");
    let tb = q.send(EnqueuePull(b)).await.expect("admitted");
    let tc = q.send(EnqueuePull(c)).await.expect("admitted");
    assert!(!ta.joined && !tb.joined && tc.joined, "only identical credentials share");
    let (ra, rb, rc) = (ta.await, tb.await, tc.await);
    assert!(ra.is_ok() && rc.is_ok());
    let err = rb.expect_err("the wrong password does not ride on the right one");
    assert!(err.to_string().contains("401 Unauthorized"), "{err}");
    assert_eq!(rt.runtime.stats().calls(Rpc::PullImage), 2);
}

#[actix::test]
async fn higher_priorities_are_pulled_first_in_both_modes() {
    for concurrency in [Concurrency::Serial, Concurrency::Parallel(Some(1))] {
        let rt = runtime().await;
        add(&rt, "example.com/blocker:1", 300);
        for name in ["low", "mid", "high", "high2"] {
            add(&rt, &format!("example.com/{name}:1"), 5);
        }
        let q = queue(&rt, no_throttle(concurrency)).await;
        let blocker = q.send(EnqueuePull(req("example.com/blocker:1"))).await.expect("admitted");
        let mut tickets = vec![blocker];
        for (name, prio) in [("low", 0), ("mid", 5), ("high", 10), ("high2", 10)] {
            let r = PullRequest { priority: prio, ..req(&format!("example.com/{name}:1")) };
            tickets.push(q.send(EnqueuePull(r)).await.expect("admitted"));
        }
        for t in tickets {
            t.await.expect("pulled");
        }
        let order: Vec<String> = rt.runtime.pull_log();
        assert_eq!(
            order,
            [
                "example.com/blocker:1",
                "example.com/high:1",
                "example.com/high2:1",
                "example.com/mid:1",
                "example.com/low:1"
            ],
            "{concurrency:?}"
        );
    }
}

#[actix::test]
async fn throttle_fails_fast_like_the_kubelet() {
    let rt = runtime().await;
    for i in 0..3 {
        add(&rt, &format!("example.com/t{i}:1"), 0);
    }
    let cfg = PullQueueSettings {
        qps: 0.01,
        burst: 2,
        throttle_mode: ThrottleMode::Fail,
        ..no_throttle(Concurrency::Serial)
    };
    let q = queue(&rt, cfg).await;
    let mut results = Vec::new();
    for i in 0..3 {
        let t = q.send(EnqueuePull(req(&format!("example.com/t{i}:1")))).await.expect("admitted");
        results.push(t.await);
    }
    assert!(results[0].is_ok() && results[1].is_ok());
    let err = results[2].clone().expect_err("third pull has no token");
    assert_eq!(err, PullFailure::QpsExceeded);
    assert_eq!(err.to_string(), "pull QPS exceeded");
    assert_eq!(rt.runtime.stats().calls(Rpc::PullImage), 2, "the throttled pull never reached the runtime");
}

#[actix::test]
async fn a_new_throttle_applies_to_the_next_pull() {
    let rt = runtime().await;
    let q = one_token_per_100_s(&rt, "r", 4, ThrottleMode::Fail).await;
    let pull = |i: usize| pull(&q, format!("example.com/r{i}:1"));
    assert!(pull(0).await.is_ok());
    assert_eq!(pull(1).await, Err(PullFailure::QpsExceeded), "one token per 100 s");
    // A reload: a burst of two at a high rate.
    q.send(UpdatePullThrottle { qps: 1000.0, burst: 2, mode: ThrottleMode::Fail, registries: Vec::new() })
        .await
        .expect("updated");
    assert!(pull(1).await.is_ok() && pull(2).await.is_ok(), "a full bucket of the new burst");
    // Off.
    q.send(UpdatePullThrottle { qps: 0.0, burst: 0, mode: ThrottleMode::Fail, registries: Vec::new() })
        .await
        .expect("updated");
    assert!(pull(3).await.is_ok());
    assert_eq!(rt.runtime.stats().calls(Rpc::PullImage), 4);
}

#[actix::test]
async fn a_reload_frees_a_pull_waiting_for_the_old_buckets_token() {
    let rt = runtime().await;
    let q = one_token_per_100_s(&rt, "v", 2, ThrottleMode::Wait).await;
    let pull = |i: usize| pull(&q, format!("example.com/v{i}:1"));
    assert!(pull(0).await.is_ok());
    // The next token of the old bucket is 100 s away.
    let mut waiting = Box::pin(pull(1));
    assert!(tokio::time::timeout(Duration::from_millis(200), &mut waiting).await.is_err(), "no token yet");
    q.send(UpdatePullThrottle { qps: 0.0, burst: 0, mode: ThrottleMode::Wait, registries: Vec::new() })
        .await
        .expect("updated");
    let done = tokio::time::timeout(Duration::from_secs(5), waiting).await;
    assert!(matches!(done, Ok(Ok(_))), "the waiting pull takes the new (absent) throttle at once: {done:?}");
    assert_eq!(rt.runtime.stats().calls(Rpc::PullImage), 2);
}

#[actix::test]
async fn a_registry_with_its_own_rate_is_held_to_it_while_others_pull_freely() {
    let rt = runtime().await;
    for i in 0..3 {
        add(&rt, &format!("hub.example/h{i}:1"), 0);
        add(&rt, &format!("fast.example/f{i}:1"), 0);
    }
    let cfg = PullQueueSettings {
        qps: 0.0,
        throttle_mode: ThrottleMode::Fail,
        registry_rates: vec![RegistryRate { registry: "hub.example".into(), qps: 0.01, burst: 1 }],
        ..no_throttle(Concurrency::Parallel(None))
    };
    let q = queue(&rt, cfg).await;
    let pull = |image: String| pull(&q, image);
    assert!(pull("hub.example/h0:1".into()).await.is_ok(), "its burst of one");
    assert_eq!(pull("hub.example/h1:1".into()).await, Err(PullFailure::QpsExceeded), "one per 100 s");
    for i in 0..3 {
        assert!(pull(format!("fast.example/f{i}:1")).await.is_ok(), "another registry is not held to it");
    }
    // A reload lifts it; in wait mode a pull waits for its registry's token.
    let lifted = RegistryRate { registry: "hub.example".into(), qps: 20.0, burst: 1 };
    let reload = UpdatePullThrottle { qps: 0.0, burst: 0, mode: ThrottleMode::Wait, registries: vec![lifted] };
    q.send(reload).await.expect("updated");
    let both = join_all([pull("hub.example/h1:1".into()), pull("hub.example/h2:1".into())]).await;
    assert!(both.iter().all(Result::is_ok), "{both:?}");
    assert_eq!(rt.runtime.stats().calls(Rpc::PullImage), 6);
}

#[actix::test]
async fn waiting_for_a_registrys_token_holds_up_no_other_registry() {
    let rt = runtime().await;
    for i in 0..2 {
        add(&rt, &format!("hub.example/h{i}:1"), 0);
        add(&rt, &format!("fast.example/f{i}:1"), 0);
    }
    // Serial: one slot, which a pull waiting for the hub's token must not hold.
    let cfg = PullQueueSettings {
        qps: 0.0,
        throttle_mode: ThrottleMode::Wait,
        registry_rates: vec![RegistryRate { registry: "hub.example".into(), qps: 0.01, burst: 1 }],
        ..no_throttle(Concurrency::Serial)
    };
    let q = queue(&rt, cfg).await;
    let admit = |image: &str| q.send(EnqueuePull(req(image)));
    admit("hub.example/h0:1").await.expect("admitted").await.expect("its token");
    let mut hub = Box::pin(admit("hub.example/h1:1").await.expect("admitted"));
    let fast = admit("fast.example/f0:1").await.expect("admitted");
    tokio::time::timeout(Duration::from_secs(5), fast).await.expect("not held behind the hub").expect("pulled");
    assert!(tokio::time::timeout(Duration::from_millis(100), &mut hub).await.is_err(), "the hub's next token: 100 s");
    assert_eq!(status(&q).await.queued, 1, "it keeps its place in the queue");
    // A reload that lifts the hub's rate starts it.
    let reload = UpdatePullThrottle { qps: 0.0, burst: 0, mode: ThrottleMode::Wait, registries: Vec::new() };
    q.send(reload).await.expect("updated");
    tokio::time::timeout(Duration::from_secs(5), hub).await.expect("started by the reload").expect("pulled");
    // And without a reload, the pump comes when the token does.
    let cfg = PullQueueSettings {
        throttle_mode: ThrottleMode::Wait,
        registry_rates: vec![RegistryRate { registry: "fast.example".into(), qps: 10.0, burst: 1 }],
        ..no_throttle(Concurrency::Serial)
    };
    let q = queue(&rt, cfg).await;
    let first = q.send(EnqueuePull(req("fast.example/f0:1"))).await.expect("admitted");
    let second = q.send(EnqueuePull(req("fast.example/f1:1"))).await.expect("admitted");
    first.await.expect("pulled");
    tokio::time::timeout(Duration::from_secs(5), second).await.expect("started when its token came").expect("pulled");
}

/// The hub's images and one of fast.example's.
async fn hub_and_fast() -> Runtime {
    let rt = runtime().await;
    for i in 0..4 {
        add(&rt, &format!("hub.example/h{i}:1"), 0);
    }
    add(&rt, "fast.example/f0:1", 0);
    rt
}

/// With the hub at one pull per 100 s and a queue of two: the hub's first
/// pull takes its token, its next two fill its share, and a pull from
/// another registry is still admitted and pulled beside them.
async fn the_hubs_share_leaves_room_for_another_registry(q: &Addr<PullQueueActor>, why: &str) {
    pull(q, "hub.example/h0:1".into()).await.expect("its token");
    let _hub: Vec<PullTicket> = vec![
        q.send(EnqueuePull(req("hub.example/h1:1"))).await.expect("admitted"),
        q.send(EnqueuePull(req("hub.example/h2:1"))).await.expect("admitted"),
    ];
    assert_eq!(status(q).await.queued, 2, "the hub's two fill its share");
    let fast = tokio::time::timeout(Duration::from_secs(5), pull(q, "fast.example/f0:1".into())).await;
    assert!(matches!(fast, Ok(Ok(_))), "{why}: {fast:?}");
}

#[actix::test]
async fn pulls_waiting_for_a_registrys_token_leave_queue_room_for_the_others() {
    let rt = hub_and_fast().await;
    // A queue of two, the hub at one pull per 100 s.
    let cfg = PullQueueSettings {
        capacity: Some(2),
        throttle_mode: ThrottleMode::Wait,
        registry_rates: vec![RegistryRate { registry: "hub.example".into(), qps: 0.01, burst: 1 }],
        ..no_throttle(Concurrency::Serial)
    };
    let q = queue(&rt, cfg).await;
    the_hubs_share_leaves_room_for_another_registry(&q, "admitted and pulled beside them").await;
}

#[actix::test]
async fn a_registry_rate_given_by_a_reload_gives_the_others_queue_room_too() {
    let rt = hub_and_fast().await;
    // Started with no rule: one queue of two for all registries.
    let cfg =
        PullQueueSettings { capacity: Some(2), throttle_mode: ThrottleMode::Wait, ..no_throttle(Concurrency::Serial) };
    let q = queue(&rt, cfg).await;
    let hub = RegistryRate { registry: "hub.example".into(), qps: 0.01, burst: 1 };
    let reload = UpdatePullThrottle { qps: 0.0, burst: 0, mode: ThrottleMode::Wait, registries: vec![hub] };
    q.send(reload).await.expect("updated");
    the_hubs_share_leaves_room_for_another_registry(&q, "admitted and pulled beside them, as with the rule at start")
        .await;
}

#[actix::test]
async fn in_fail_mode_a_registry_without_a_token_spends_none_of_the_nodes() {
    let rt = runtime().await;
    for i in 0..2 {
        add(&rt, &format!("hub.example/h{i}:1"), 0);
    }
    add(&rt, "fast.example/f0:1", 0);
    let cfg = PullQueueSettings {
        qps: 0.01,
        burst: 2,
        throttle_mode: ThrottleMode::Fail,
        registry_rates: vec![RegistryRate { registry: "hub.example".into(), qps: 0.01, burst: 1 }],
        ..no_throttle(Concurrency::Parallel(None))
    };
    let q = queue(&rt, cfg).await;
    let pull = |image: &str| pull(&q, image.to_string());
    assert!(pull("hub.example/h0:1").await.is_ok(), "one of the hub's, one of the node's two");
    assert_eq!(pull("hub.example/h1:1").await, Err(PullFailure::QpsExceeded), "the hub's are spent");
    assert!(pull("fast.example/f0:1").await.is_ok(), "the node's second token is still there");
}

#[actix::test]
async fn a_registry_with_its_own_limit_runs_that_many_at_once() {
    let rt = runtime().await;
    for i in 0..4 {
        add(&rt, &format!("hub.example/h{i}:1"), 100);
    }
    let cfg = PullQueueSettings {
        registry_limits: std::collections::HashMap::from([("hub.example".to_string(), 1)]),
        ..no_throttle(Concurrency::Parallel(None))
    };
    let q = queue(&rt, cfg).await;
    let sends = (0..4).map(|i| q.send(EnqueuePull(req(&format!("hub.example/h{i}:1")))));
    let tickets: Vec<PullTicket> = join_all(sends).await.into_iter().map(|t| t.expect("admitted")).collect();
    for r in join_all(tickets).await {
        r.expect("pulled");
    }
    assert_eq!(rt.runtime.stats().max_pulls_in_flight, 1, "one at a time from it");
}

#[actix::test]
async fn a_reload_of_a_registrys_limit_starts_its_waiting_pulls() {
    let rt = runtime().await;
    for i in 0..3 {
        add(&rt, &format!("hub.example/h{i}:1"), 300);
    }
    let cfg = PullQueueSettings {
        registry_limits: std::collections::HashMap::from([("hub.example".to_string(), 1)]),
        ..no_throttle(Concurrency::Parallel(None))
    };
    let q = queue(&rt, cfg).await;
    let sends = (0..3).map(|i| q.send(EnqueuePull(req(&format!("hub.example/h{i}:1")))));
    let tickets: Vec<PullTicket> = join_all(sends).await.into_iter().map(|t| t.expect("admitted")).collect();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(status(&q).await.running, 1, "one at a time from it");
    let raised = std::collections::HashMap::from([("hub.example".to_string(), 3)]);
    q.send(UpdateRegistryLimits { per_registry: None, registries: raised }).await.expect("updated");
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(status(&q).await.running, 3, "the raised limit starts the two waiting at once");
    for r in join_all(tickets).await {
        r.expect("pulled");
    }
    assert_eq!(rt.runtime.stats().max_pulls_in_flight, 3);
}

#[actix::test]
async fn a_reload_from_serial_to_parallel_and_back_keeps_the_running_pulls() {
    let rt = runtime().await;
    for i in 0..6 {
        add(&rt, &format!("example.com/c{i}:1"), 300);
    }
    let q = queue(&rt, no_throttle(Concurrency::Serial)).await;
    let enqueue = |range: std::ops::Range<usize>| {
        let sends: Vec<_> = range.map(|i| q.send(EnqueuePull(req(&format!("example.com/c{i}:1"))))).collect();
        join_all(sends)
    };
    let first: Vec<PullTicket> = enqueue(0..3).await.into_iter().map(|t| t.expect("admitted")).collect();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!((status(&q).await.running, status(&q).await.queued), (1, 2), "serial");
    q.send(UpdateConcurrency(Concurrency::Parallel(Some(3)))).await.expect("updated");
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(status(&q).await.running, 3, "the two waiting start at once");
    // Back to serial while three run: they finish; the next starts alone
    // once they have.
    q.send(UpdateConcurrency(Concurrency::Serial)).await.expect("updated");
    let second: Vec<PullTicket> = enqueue(3..6).await.into_iter().map(|t| t.expect("admitted")).collect();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!((status(&q).await.running, status(&q).await.queued), (3, 3), "none starts over the new limit");
    for r in join_all(first).await {
        r.expect("pulled");
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!((status(&q).await.running, status(&q).await.queued), (1, 2), "serial again");
    for r in join_all(second).await {
        r.expect("pulled");
    }
    assert_eq!(rt.runtime.stats().max_pulls_in_flight, 3);
}

#[actix::test]
async fn a_reloaded_deadline_holds_the_pulls_that_start_after_it() {
    let rt = runtime().await;
    add(&rt, "example.com/d0:1", 300);
    add(&rt, "example.com/d1:1", 300);
    let q = queue(&rt, no_throttle(Concurrency::Parallel(None))).await;
    let short = UpdatePullLimits { deadline: Some(Duration::from_millis(100)), retries: Retries::default() };
    q.send(short).await.expect("updated");
    let late = pull(&q, "example.com/d0:1".into()).await;
    assert_eq!(late, Err(PullFailure::DeadlineExceeded(Duration::from_millis(100))));
    q.send(UpdatePullLimits { deadline: None, retries: Retries::default() }).await.expect("updated");
    assert!(pull(&q, "example.com/d1:1".into()).await.is_ok(), "no deadline again");
}

#[actix::test]
async fn a_transient_failure_is_retried_only_while_someone_waits() {
    use imaged::cri::{CriError, StatusCode};
    use imaged::fault::{FaultPlan, FaultRule};
    let rt = runtime().await;
    add(&rt, "example.com/t0:1", 0);
    add(&rt, "example.com/t1:1", 0);
    let reset = CriError::from_status(StatusCode::Unknown, "read tcp: connection reset by peer");
    rt.runtime.set_fault_plan(FaultPlan::new(1).rule(FaultRule::on(Rpc::PullImage).fail(reset)));
    let cfg = PullQueueSettings {
        retries: Retries { times: 3, delay: Duration::from_millis(50) },
        ..no_throttle(Concurrency::Parallel(None))
    };
    let q = queue(&rt, cfg).await;
    // Someone waits: every retry is made, then the failure.
    let failed = pull(&q, "example.com/t0:1".into()).await;
    assert!(matches!(failed, Err(PullFailure::Cri(_))), "{failed:?}");
    assert_eq!(rt.runtime.stats().calls(Rpc::PullImage), 4, "one call and three retries");
    // Its caller gone, a pull is not made again.
    let ticket = q.send(EnqueuePull(req("example.com/t1:1"))).await.expect("admitted");
    drop(ticket);
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(rt.runtime.stats().calls(Rpc::PullImage), 5, "its first call only");
    assert_eq!(status(&q).await.running, 0, "and it ended");
}

#[actix::test]
async fn throttle_in_wait_mode_queues_instead_of_failing() {
    let rt = runtime().await;
    for i in 0..3 {
        add(&rt, &format!("example.com/w{i}:1"), 0);
    }
    let cfg = PullQueueSettings {
        qps: 20.0,
        burst: 1,
        throttle_mode: ThrottleMode::Wait,
        ..no_throttle(Concurrency::Serial)
    };
    let q = queue(&rt, cfg).await;
    let phases = support_phases::Recorder::start();
    q.send(SubscribePhases(phases.clone().recipient())).await.expect("subscribe");
    let sends = (0..3).map(|i| q.send(EnqueuePull(req(&format!("example.com/w{i}:1")))));
    let tickets: Vec<PullTicket> = join_all(sends).await.into_iter().map(|t| t.expect("admitted")).collect();
    for r in join_all(tickets).await {
        r.expect("waited for a token, then pulled");
    }
    assert_eq!(rt.runtime.stats().calls(Rpc::PullImage), 3);
    let seen = phases.send(support_phases::Take).await.expect("phases");
    assert!(seen.iter().filter(|p| p.phase == PullPhase::Throttled).count() >= 2, "{seen:?}");
}

#[actix::test]
async fn a_pull_past_its_deadline_is_cancelled_and_says_so() {
    let rt = runtime().await;
    add(&rt, "example.com/hung:1", 30_000);
    let q = queue(
        &rt,
        PullQueueSettings { pull_deadline: Some(Duration::from_millis(300)), ..no_throttle(Concurrency::Serial) },
    )
    .await;
    let t = q.send(EnqueuePull(req("example.com/hung:1"))).await.expect("admitted");
    let err = t.await.expect_err("deadline");
    assert_eq!(err, PullFailure::DeadlineExceeded(Duration::from_millis(300)));
    assert_eq!(err.to_string(), "image pull cancelled: it did not finish within its deadline of 300ms");
    // The RPC was cancelled on the runtime, not left running (bounded wait).
    for _ in 0..50 {
        if rt.runtime.stats().pulls_in_flight == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let stats = rt.runtime.stats();
    assert_eq!((stats.pulls_in_flight, stats.pulls_completed), (0, 0));
    // The queue moves on.
    add(&rt, "example.com/next:1", 0);
    q.send(EnqueuePull(req("example.com/next:1"))).await.expect("admitted").await.expect("next pulls");
}

#[actix::test]
async fn a_queued_pull_rechecks_presence_when_its_turn_comes() {
    let rt = runtime().await;
    add(&rt, "example.com/blocker:1", 300);
    let q = queue(&rt, no_throttle(Concurrency::Serial)).await;
    let blocker = q.send(EnqueuePull(req("example.com/blocker:1"))).await.expect("admitted");
    let late = PullRequest { skip_if_present: true, ..req("example.com/arrived:1") };
    let ticket = q.send(EnqueuePull(late)).await.expect("admitted");
    // Someone else puts the image there while the request waits.
    rt.runtime.preload(RemoteImage::new("example.com/arrived:1", 100)).expect("preload");
    blocker.await.expect("blocker pulled");
    let outcome = ticket.await.expect("present");
    assert!(!outcome.pulled);
    assert_eq!(rt.runtime.pull_log(), ["example.com/blocker:1"]);
}

#[actix::test]
async fn a_fresh_presence_check_spares_the_recheck_unless_the_same_image_was_pulled_since() {
    let rt = runtime().await;
    add(&rt, "example.com/blocker:1", 200);
    rt.runtime.add_remote(RemoteImage::new("example.com/shared:1", 10).private("u", "p")).expect("add");
    let q = queue(&rt, no_throttle(Concurrency::Serial)).await;
    let creds = |pw: &str| vec![AuthConfig::basic("example.com", "u", pw)];
    let blocker = q.send(EnqueuePull(req("example.com/blocker:1"))).await.expect("admitted");
    // Two requests for one image with different credentials: never merged.
    let now = tokio::time::Instant::now();
    let first = PullRequest {
        skip_if_present: true,
        absent_at: Some(now),
        credentials: creds("p"),
        ..req("example.com/shared:1")
    };
    let second = PullRequest {
        skip_if_present: true,
        absent_at: Some(now),
        credentials: creds("p2"),
        ..req("example.com/shared:1")
    };
    let t1 = q.send(EnqueuePull(first)).await.expect("admitted");
    let t2 = q.send(EnqueuePull(second)).await.expect("admitted");
    blocker.await.expect("blocker");
    assert!(t1.await.expect("first pulls (its check is fresh)").pulled);
    // The second's check predates the first's pull: it re-checks, finds the image, and does not pull.
    let second = t2.await.expect("present");
    assert!(!second.pulled);
    assert_eq!(rt.runtime.pull_log(), ["example.com/blocker:1", "example.com/shared:1"]);
}

/// A phase recorder actor.
mod support_phases {
    use actix::prelude::*;
    use imaged::actors::pull_queue::PullPhaseChanged;

    #[derive(Default)]
    pub struct Recorder(Vec<PullPhaseChanged>);

    impl Recorder {
        pub fn start() -> Addr<Self> {
            Actor::start(Self::default())
        }
    }

    impl Actor for Recorder {
        type Context = Context<Self>;
        fn started(&mut self, ctx: &mut Self::Context) {
            ctx.set_mailbox_capacity(10_000);
        }
    }

    impl Handler<PullPhaseChanged> for Recorder {
        type Result = ();
        fn handle(&mut self, m: PullPhaseChanged, _: &mut Self::Context) {
            self.0.push(m);
        }
    }

    #[derive(Message)]
    #[rtype(result = "Vec<PullPhaseChanged>")]
    pub struct Take;

    impl Handler<Take> for Recorder {
        type Result = MessageResult<Take>;
        fn handle(&mut self, _: Take, _: &mut Self::Context) -> Self::Result {
            MessageResult(std::mem::take(&mut self.0))
        }
    }
}

#[actix::test]
async fn a_per_registry_limit_keeps_a_slow_registry_from_taking_every_slot() {
    let rt = runtime().await;
    for i in 0..4 {
        add(&rt, &format!("slow.example.com/s{i}:1"), 200);
    }
    add(&rt, "fast.example.com/f:1", 5);
    let slow: Vec<String> = (0..4).map(|i| format!("slow.example.com/s{i}:1")).collect();
    let run = |limit: Option<usize>| {
        let (rt, slow) = (&rt, &slow);
        async move {
            rt.runtime.reset_stats();
            let cfg = PullQueueSettings { registry_limit: limit, ..no_throttle(Concurrency::Parallel(Some(2))) };
            let q = queue(rt, cfg).await;
            // The slow registry's four requests come first, then the fast one.
            let mut tickets = Vec::new();
            for image in slow.iter().map(String::as_str).chain(["fast.example.com/f:1"]) {
                tickets.push(q.send(EnqueuePull(req(image))).await.expect("admitted"));
            }
            for r in join_all(tickets).await {
                r.expect("pulled");
            }
            (rt.runtime.pull_log(), rt.runtime.stats().max_pulls_in_flight)
        }
    };
    // Without the limit (the kubelet), the slow registry holds both slots and
    // the fast image waits for two rounds of its pulls.
    let (log, max) = run(None).await;
    let mut expected = slow.clone();
    expected.push("fast.example.com/f:1".into());
    assert_eq!(log, expected);
    assert_eq!(max, 2);
    // With one pull per registry, the fast image takes the second slot at
    // once, and the slow registry's pulls keep their order, one at a time.
    let (log, max) = run(Some(1)).await;
    let mut expected = vec![slow[0].clone(), "fast.example.com/f:1".to_string()];
    expected.extend(slow[1..].iter().cloned());
    assert_eq!(log, expected);
    assert_eq!(max, 2, "one slot per registry, both used at once");
}

/// Lists the queue's pulls until `done` holds for the list (bounded: 5 s).
async fn pulls_once(q: &Addr<PullQueueActor>, done: impl Fn(&[PullInfo]) -> bool) -> Vec<PullInfo> {
    for _ in 0..500 {
        let pulls = q.send(ListPulls).await.expect("list");
        if done(&pulls) {
            return pulls;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the pull list never reached the expected state: {:?}", q.send(ListPulls).await);
}

#[actix::test]
async fn list_pulls_shows_what_runs_what_waits_in_order_and_who_shares_it() {
    let rt = runtime().await;
    add(&rt, "example.com/slow:1", 600);
    add(&rt, "example.com/next:1", 5);
    add(&rt, "example.com/urgent:1", 5);
    let q = queue(&rt, no_throttle(Concurrency::Serial)).await;
    assert_eq!(q.send(ListPulls).await.expect("list"), vec![], "nothing held");
    let mut tickets = vec![q.send(EnqueuePull(req("example.com/slow:1"))).await.expect("admitted")];
    let shared = PullRequest { skip_if_present: false, ..req("example.com/slow:1") };
    tickets.push(q.send(EnqueuePull(shared)).await.expect("admitted"));
    let next = PullRequest { skip_if_present: true, ..req("example.com/next:1") };
    tickets.push(q.send(EnqueuePull(next)).await.expect("admitted"));
    let urgent = PullRequest { priority: 5, ..req("example.com/urgent:1") };
    tickets.push(q.send(EnqueuePull(urgent)).await.expect("admitted"));

    let pulls = pulls_once(&q, |p| p.first().is_some_and(|p| p.stage == PullStage::Pulling)).await;
    let seen: Vec<(&str, PullStage, i32, usize, bool)> =
        pulls.iter().map(|p| (p.image.as_str(), p.stage, p.priority, p.waiters, p.must_pull)).collect();
    assert_eq!(
        seen,
        [
            ("example.com/slow:1", PullStage::Pulling, 0, 2, true),
            ("example.com/urgent:1", PullStage::Queued { position: 1 }, 5, 1, true),
            ("example.com/next:1", PullStage::Queued { position: 2 }, 0, 1, false),
        ]
    );
    assert!(pulls[0].running.is_some() && pulls[1].running.is_none(), "{pulls:?}");
    assert!(pulls.iter().all(|p| !p.with_credentials && p.runtime_handler.is_empty()), "{pulls:?}");
    // Times move on while the slow pull runs.
    let later = pulls_once(&q, |p| p.first().and_then(|p| p.running) > pulls[0].running).await;
    assert!(later[0].waiting >= later[0].running.unwrap_or_default(), "{later:?}");

    for t in tickets {
        t.await.expect("pulled");
    }
    pulls_once(&q, <[imaged::actors::pull_queue::PullInfo]>::is_empty).await;
    assert_eq!(rt.runtime.pull_log(), ["example.com/slow:1", "example.com/urgent:1", "example.com/next:1"]);
}

#[actix::test]
async fn list_pulls_shows_a_pull_waiting_for_a_throttle_token_and_whether_it_has_credentials() {
    let rt = runtime().await;
    add(&rt, "example.com/first:1", 0);
    rt.runtime.add_remote(RemoteImage::new("example.com/private:1", 10).private("u", "pw")).expect("add");
    // One token, then one every 100 s: the second pull waits for it.
    let cfg = PullQueueSettings {
        qps: 0.01,
        burst: 1,
        throttle_mode: ThrottleMode::Wait,
        ..no_throttle(Concurrency::Serial)
    };
    let q = queue(&rt, cfg).await;
    q.send(EnqueuePull(req("example.com/first:1"))).await.expect("admitted").await.expect("took the token");
    let private =
        PullRequest { credentials: vec![AuthConfig::basic("example.com", "u", "pw")], ..req("example.com/private:1") };
    let _waiting = q.send(EnqueuePull(private)).await.expect("admitted");
    let pulls = pulls_once(&q, |p| p.first().is_some_and(|p| p.stage == PullStage::Throttled)).await;
    assert_eq!(pulls.len(), 1, "{pulls:?}");
    assert!(pulls[0].with_credentials, "{pulls:?}");
    let shown = format!("{pulls:?}");
    assert!(!shown.contains("pw") && !shown.contains("\"u\""), "credentials leaked: {shown}");
    assert_eq!(rt.runtime.stats().calls(Rpc::PullImage), 1, "still waiting for its token");
}

fn slow_pulls(m: &imaged::metrics::Metrics) -> f64 {
    let s = imaged::testing::Scrape::parse(&m.encode()).expect("the scrape parses");
    s.value("imaged_pull_slow_blocking_total", &[]).expect("the counter is exported")
}

#[actix::test]
async fn a_pull_running_past_the_warning_while_others_wait_is_warned_once() {
    let rt = runtime().await;
    add(&rt, "example.com/big:1", 600);
    add(&rt, "example.com/alone:1", 400);
    add(&rt, "example.com/small:1", 5);
    let metrics = imaged::metrics::Metrics::new();
    let cfg = PullQueueSettings {
        slow_pull_warning: Some(Duration::from_millis(100)),
        metrics: metrics.clone(),
        ..no_throttle(Concurrency::Serial)
    };
    let q = queue(&rt, cfg).await;
    // Alone in the queue, a slow pull blocks nobody: no warning.
    q.send(EnqueuePull(req("example.com/alone:1"))).await.expect("admitted").await.expect("pulled");
    assert_eq!(slow_pulls(&metrics), 0.0);
    // A slow pull with another waiting behind it: one warning, however long it runs.
    let big = q.send(EnqueuePull(req("example.com/big:1"))).await.expect("admitted");
    let small = q.send(EnqueuePull(req("example.com/small:1"))).await.expect("admitted");
    big.await.expect("pulled");
    small.await.expect("pulled");
    assert_eq!(slow_pulls(&metrics), 1.0);
}

#[actix::test]
async fn no_slow_pull_warning_when_it_is_off() {
    let rt = runtime().await;
    add(&rt, "example.com/big:1", 400);
    add(&rt, "example.com/small:1", 5);
    let metrics = imaged::metrics::Metrics::new();
    let cfg =
        PullQueueSettings { slow_pull_warning: None, metrics: metrics.clone(), ..no_throttle(Concurrency::Serial) };
    let q = queue(&rt, cfg).await;
    let big = q.send(EnqueuePull(req("example.com/big:1"))).await.expect("admitted");
    let small = q.send(EnqueuePull(req("example.com/small:1"))).await.expect("admitted");
    big.await.expect("pulled");
    small.await.expect("pulled");
    assert_eq!(slow_pulls(&metrics), 0.0);
}

// === The bound of a full serial queue ===
//
// The serial queue's bound (one running, `queue_capacity` = 10 waiting) is
// kept by the queue's admission, not by the actor's mailbox: actix's
// `Addr::send` never waits for room in a full mailbox (the first test pins
// that), so a mailbox left to fill would hold every sender's message and
// bound nothing. These tests show the bound the admission keeps: the next
// sender's `send` stays pending, status queries are answered meanwhile,
// joiners need no room, and priorities order what is queued.

/// A serial queue with a `blocker` pull running (`latency_ms`) and ten
/// pulls `q0`..`q9` (5 ms each) queued behind it: full. Returns their tickets.
async fn full_serial_queue(rt: &Runtime, latency_ms: u64) -> (Addr<PullQueueActor>, Vec<PullTicket>) {
    add(rt, "example.com/blocker:1", latency_ms);
    for i in 0..10 {
        add(rt, &format!("example.com/q{i}:1"), 5);
    }
    let q = queue(rt, no_throttle(Concurrency::Serial)).await;
    let mut tickets = vec![q.send(EnqueuePull(req("example.com/blocker:1"))).await.expect("admitted")];
    for i in 0..10 {
        tickets.push(q.send(EnqueuePull(req(&format!("example.com/q{i}:1")))).await.expect("admitted"));
    }
    assert_eq!(status(&q).await, QueueStatus { queued: 10, running: 1, parked: 0, waiters: 11 });
    (q, tickets)
}

/// What `ListPulls` shows, in order: image and stage.
async fn stages(q: &Addr<PullQueueActor>) -> Vec<(String, PullStage)> {
    q.send(ListPulls).await.expect("list").into_iter().map(|p| (p.image, p.stage)).collect()
}

/// Stops taking messages until `release` fires (`ctx.wait`), then records
/// the order in which it handles them.
mod stalled {
    use actix::prelude::*;
    use tokio::sync::oneshot;

    pub struct Stalled {
        pub release: Option<oneshot::Receiver<()>>,
        pub handled: usize,
    }

    impl Actor for Stalled {
        type Context = Context<Self>;
        fn started(&mut self, ctx: &mut Self::Context) {
            ctx.set_mailbox_capacity(10);
            if let Some(release) = self.release.take() {
                ctx.wait(actix::fut::wrap_future(async move {
                    let _ = release.await;
                }));
            }
        }
    }

    /// Replies with how many messages were handled before it.
    #[derive(Message)]
    #[rtype(result = "usize")]
    pub struct Nth;

    impl Handler<Nth> for Stalled {
        type Result = usize;
        fn handle(&mut self, _: Nth, _: &mut Self::Context) -> usize {
            self.handled += 1;
            self.handled - 1
        }
    }
}

/// The measured reason the bound is not the mailbox: with a mailbox of 10
/// and an actor that takes nothing (`ctx.wait`), 100 `send`s through one
/// address all land in the mailbox at their first poll — none waits for
/// room (on a full mailbox, `Addr::send` retries through a fresh clone of
/// the sender, which is never parked; actix/actix#329). Only `try_send`
/// sees the capacity. If actix ever makes `send` wait, this test fails:
/// then the mailbox could be the bound and `actors.md` should change.
#[actix::test]
async fn actix_send_never_waits_for_room_in_a_full_mailbox() {
    use futures_util::poll;
    let (release, stalled) = tokio::sync::oneshot::channel();
    let addr = stalled::Stalled { release: Some(stalled), handled: 0 }.start();
    tokio::task::yield_now().await; // started(): the actor stops taking messages
    let mut sends: Vec<_> = (0..100).map(|_| Box::pin(addr.send(stalled::Nth))).collect();
    for s in &mut sends {
        assert!(poll!(s).is_pending(), "the actor takes nothing yet");
    }
    // The address that filled the mailbox is refused by try_send...
    assert!(matches!(addr.try_send(stalled::Nth), Err(actix::dev::SendError::Full(_))));
    // ...but a message sent after the hundred is handled after all of them:
    // every one was already in the mailbox (100 > 10), none was held back.
    let mut marker = Box::pin(addr.clone().send(stalled::Nth));
    assert!(poll!(&mut marker).is_pending());
    release.send(()).expect("the actor waits");
    let order: Vec<usize> = join_all(sends).await.into_iter().map(|r| r.expect("handled")).collect();
    assert_eq!(order, (0..100).collect::<Vec<_>>(), "handled in send order");
    assert_eq!(marker.await.expect("handled"), 100, "the mailbox held 100 messages with a capacity of 10");
}

#[actix::test]
async fn a_full_serial_queue_holds_the_next_sender_and_still_answers_status_queries() {
    use futures_util::poll;
    let rt = runtime().await;
    add(&rt, "example.com/late:1", 5);
    let (q, tickets) = full_serial_queue(&rt, 1000).await;
    // The next sender: its send stays pending...
    let mut late = Box::pin(q.send(EnqueuePull(req("example.com/late:1"))));
    assert!(poll!(&mut late).is_pending(), "admitted into a full queue");
    // ...while the queue answers status queries and listings.
    assert_eq!(status(&q).await, QueueStatus { queued: 10, running: 1, parked: 1, waiters: 11 });
    let listed = pulls_once(&q, |p| p.first().is_some_and(|p| p.stage == PullStage::Pulling)).await;
    let mut expected = vec![("example.com/blocker:1".to_string(), PullStage::Pulling)];
    expected.extend((0..10).map(|i| (format!("example.com/q{i}:1"), PullStage::Queued { position: i + 1 })));
    expected.push(("example.com/late:1".into(), PullStage::Parked { position: 1 }));
    assert_eq!(listed.into_iter().map(|p| (p.image, p.stage)).collect::<Vec<_>>(), expected);
    assert!(poll!(&mut late).is_pending(), "still held while the blocker runs");
    assert_eq!(rt.runtime.stats().pulls_completed, 0, "the blocker still runs");
    // The running pull ends: q0 starts and the held sender is taken.
    let mut tickets = tickets.into_iter();
    tickets.next().expect("the blocker's ticket").await.expect("pulled");
    let late = tokio::time::timeout(Duration::from_secs(5), late).await.expect("taken").expect("admitted");
    assert!(!late.joined);
    for t in tickets.chain([late]) {
        t.await.expect("pulled");
    }
    let mut log = vec!["example.com/blocker:1".to_string()];
    log.extend((0..10).map(|i| format!("example.com/q{i}:1")));
    log.push("example.com/late:1".into());
    assert_eq!(rt.runtime.pull_log(), log);
    // Nothing held, once the last size lookup (after its caller was answered) ends.
    assert_eq!(pulls_once(&q, <[PullInfo]>::is_empty).await, vec![], "nothing held");
}

#[actix::test]
async fn joiners_need_no_room_in_a_full_serial_queue() {
    use futures_util::poll;
    let rt = runtime().await;
    add(&rt, "example.com/late:1", 5);
    let (q, tickets) = full_serial_queue(&rt, 1000).await;
    let mut late = Box::pin(q.send(EnqueuePull(req("example.com/late:1"))));
    assert!(poll!(&mut late).is_pending(), "admitted into a full queue");
    // A request for the running pull and one for a queued pull join at
    // once: they take no slot, so the full queue does not hold them.
    let running = q.send(EnqueuePull(req("example.com/blocker:1"))).await.expect("joined");
    let queued = q.send(EnqueuePull(req("example.com/q9:1"))).await.expect("joined");
    assert!(running.joined && queued.joined);
    // A second request for the parked image parks behind it (a parked
    // request is not a pull yet), then joins it when admitted.
    let mut again = Box::pin(q.send(EnqueuePull(req("example.com/late:1"))));
    assert!(poll!(&mut again).is_pending(), "parked behind the first");
    assert_eq!(status(&q).await, QueueStatus { queued: 10, running: 1, parked: 2, waiters: 13 });
    let (late, again) = tokio::time::timeout(Duration::from_secs(5), async { (late.await, again.await) })
        .await
        .expect("both taken once the blocker ends");
    let (late, again) = (late.expect("admitted"), again.expect("admitted"));
    assert!(!late.joined && again.joined);
    for t in tickets.into_iter().chain([running, queued, late, again]) {
        t.await.expect("pulled");
    }
    assert_eq!(rt.runtime.stats().calls(Rpc::PullImage), 12, "one CRI pull per image");
}

#[actix::test]
async fn a_full_serial_queue_admits_in_arrival_order_and_starts_by_priority() {
    use futures_util::poll;
    let rt = runtime().await;
    add(&rt, "example.com/low:1", 5);
    add(&rt, "example.com/high:1", 5);
    let (q, tickets) = full_serial_queue(&rt, 600).await;
    // Two senders wait: a low priority one, then a high priority one.
    let mut low = Box::pin(q.send(EnqueuePull(PullRequest { priority: 0, ..req("example.com/low:1") })));
    let mut high = Box::pin(q.send(EnqueuePull(PullRequest { priority: 9, ..req("example.com/high:1") })));
    assert!(poll!(&mut low).is_pending() && poll!(&mut high).is_pending());
    let parked: Vec<_> = stages(&q).await.into_iter().filter(|(_, s)| s.name() == "parked").collect();
    assert_eq!(
        parked,
        [
            ("example.com/low:1".to_string(), PullStage::Parked { position: 1 }),
            ("example.com/high:1".to_string(), PullStage::Parked { position: 2 }),
        ],
        "parked in arrival order, whatever their priority"
    );
    let (low, high) = tokio::time::timeout(Duration::from_secs(5), async { (low.await, high.await) })
        .await
        .expect("both taken as pulls start");
    for t in tickets.into_iter().chain([low.expect("admitted"), high.expect("admitted")]) {
        t.await.expect("pulled");
    }
    // The blocker ends: q0 starts and low, first to arrive, takes the room.
    // q1 starts next and high takes that room; once queued, high outranks
    // every pull waiting, low included.
    let mut log: Vec<String> = ["example.com/blocker:1", "example.com/q0:1", "example.com/q1:1", "example.com/high:1"]
        .map(String::from)
        .into();
    log.extend((2..10).map(|i| format!("example.com/q{i}:1")));
    log.push("example.com/low:1".into());
    assert_eq!(rt.runtime.pull_log(), log);
}

fn stalls_warned(m: &imaged::metrics::Metrics) -> (f64, f64) {
    let s = imaged::testing::Scrape::parse(&m.encode()).expect("the scrape parses");
    let warned = s.value("imaged_pull_stalled_downloads_total", &[]).expect("the counter is exported");
    let now = s.value("imaged_pull_downloads_stalled", &[]).expect("the gauge is exported");
    (warned, now)
}

#[actix::test]
async fn a_download_that_stops_moving_is_warned_of_once_and_a_moving_one_never() {
    let rt = runtime().await;
    let ms = Duration::from_millis;
    rt.runtime.add_remote(RemoteImage::new("example.com/moving:1", 1_000).latency(ms(600))).expect("add");
    // Its download writes nothing after 100 ms of its 900: idle 200 ms
    // from 300 ms on, with checks every 50 ms.
    let stuck = RemoteImage::new("example.com/stuck:1", 1_000).latency(ms(900)).stalling(ms(100));
    rt.runtime.add_remote(stuck).expect("add");
    let metrics = imaged::metrics::Metrics::new();
    let cfg = PullQueueSettings {
        stall_warning: Some(ms(200)),
        metrics: metrics.clone(),
        ..no_throttle(Concurrency::Serial)
    };
    let q = queue(&rt, cfg).await;
    let phases = support_phases::Recorder::start();
    q.send(SubscribePhases(phases.clone().recipient())).await.expect("subscribe");
    q.send(EnqueuePull(req("example.com/moving:1"))).await.expect("admitted").await.expect("pulled");
    assert_eq!(stalls_warned(&metrics), (0.0, 0.0), "a moving download is no stall");
    let listings = rt.runtime.stats().calls(Rpc::ListStatuses);
    assert!(listings >= 5, "listed while the pull ran: {listings}");

    let pod = PullPod { namespace: "shop".into(), name: "web-0".into(), uid: "uid-web-0".into() };
    let stuck = PullRequest { pod: Some(pod.clone()), ..req("example.com/stuck:1") };
    q.send(EnqueuePull(stuck)).await.expect("admitted").await.expect("a stall only warns");
    assert_eq!(stalls_warned(&metrics), (1.0, 1.0), "warned once, for its one stall");
    // Its pod hears of it once, between pulling and done (the moving pull
    // not at all).
    let seen: Vec<(String, PullPhase, Option<PullPod>)> = phases
        .send(support_phases::Take)
        .await
        .expect("phases")
        .into_iter()
        .filter(|p| matches!(p.phase, PullPhase::Pulling | PullPhase::Stalled | PullPhase::Done))
        .map(|p| (p.image, p.phase, p.pod))
        .collect();
    let (moving, stuck) = ("example.com/moving:1".to_string(), "example.com/stuck:1".to_string());
    assert_eq!(
        seen,
        [
            (moving.clone(), PullPhase::Pulling, None),
            (moving, PullPhase::Done, None),
            (stuck.clone(), PullPhase::Pulling, Some(pod.clone())),
            (stuck.clone(), PullPhase::Stalled, Some(pod.clone())),
            (stuck, PullPhase::Done, Some(pod)),
        ]
    );
    // With no pull running, nothing is stalled (the next check says so)
    // and the runtime is not asked.
    tokio::time::sleep(ms(120)).await;
    assert_eq!(stalls_warned(&metrics), (1.0, 0.0));
    let idle = rt.runtime.stats().calls(Rpc::ListStatuses);
    tokio::time::sleep(ms(200)).await;
    assert_eq!(rt.runtime.stats().calls(Rpc::ListStatuses), idle, "no listing while no pull runs");
}

#[actix::test]
async fn a_runtime_that_does_not_list_downloads_is_asked_once_and_pulls_go_on() {
    use imaged::cri::{CriError, StatusCode};
    use imaged::fault::{FaultPlan, FaultRule};
    let rt = runtime().await;
    add(&rt, "example.com/slow:1", 500);
    let unimplemented =
        CriError::from_status(StatusCode::Unimplemented, "unknown service containerd.services.content.v1.Content");
    rt.runtime.set_fault_plan(FaultPlan::new(1).rule(FaultRule::on(Rpc::ListStatuses).fail(unimplemented)));
    let cfg = PullQueueSettings { stall_warning: Some(Duration::from_millis(200)), ..no_throttle(Concurrency::Serial) };
    let q = queue(&rt, cfg).await;
    q.send(EnqueuePull(req("example.com/slow:1"))).await.expect("admitted").await.expect("pulled");
    assert_eq!(rt.runtime.stats().calls(Rpc::ListStatuses), 1, "asked once in ten checks, then left alone");
}

#[actix::test]
async fn a_pull_whose_download_stops_moving_past_the_timeout_is_cancelled_as_the_registry_unavailable() {
    use imaged::cri::CriErrorKind;
    let rt = runtime().await;
    let ms = Duration::from_millis;
    // A long pull whose download writes nothing after 100 ms.
    let stuck = RemoteImage::new("example.com/stuck:1", 1_000).latency(Duration::from_secs(30)).stalling(ms(100));
    rt.runtime.add_remote(stuck).expect("add");
    rt.runtime.add_remote(RemoteImage::new("example.com/moving:1", 1_000).latency(ms(700))).expect("add");
    let metrics = imaged::metrics::Metrics::new();
    let cfg = PullQueueSettings {
        stall_warning: None,
        stall_timeout: Some(ms(200)),
        metrics: metrics.clone(),
        ..no_throttle(Concurrency::Serial)
    };
    let q = queue(&rt, cfg).await;
    // A download that keeps moving is never cut short, however long the
    // pull runs past the timeout.
    q.send(EnqueuePull(req("example.com/moving:1"))).await.expect("admitted").await.expect("pulled");

    let started = std::time::Instant::now();
    let failure =
        q.send(EnqueuePull(req("example.com/stuck:1"))).await.expect("admitted").await.expect_err("cancelled");
    assert!(started.elapsed() < Duration::from_secs(10), "ended long before its 30 s: {:?}", started.elapsed());
    let PullFailure::Cri(errors) = &failure else { panic!("a runtime failure: {failure:?}") };
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0].kind(), CriErrorKind::RegistryUnavailable, "{}", errors[0]);
    let text = errors[0].to_string();
    assert!(text.starts_with("RegistryUnavailable: download \"layer-sha256:"), "{text}");
    assert!(text.contains("imaged cancelled the pull (pull.stall_timeout 200ms)"), "{text}");
    let s = imaged::testing::Scrape::parse(&metrics.encode()).expect("the scrape parses");
    assert_eq!(s.value("imaged_pull_stall_cancels_total", &[]), Some(1.0));
    // The runtime's call was ended, not left running.
    let give_up = std::time::Instant::now() + Duration::from_secs(5);
    while rt.runtime.stats().pulls_in_flight > 0 {
        assert!(std::time::Instant::now() < give_up, "the runtime still pulls");
        tokio::time::sleep(ms(10)).await;
    }
    assert_eq!(rt.runtime.stats().pulls_completed, 1, "only the moving pull completed");
}

#[actix::test]
async fn a_download_that_drips_under_the_floor_is_warned_of_and_cancelled_though_it_never_stops() {
    use imaged::cri::CriErrorKind;
    let rt = runtime().await;
    let ms = Duration::from_millis;
    // 100 kB in 500 ms (200 kB/s), and 1 kB over 30 s (33 bytes/s): both
    // write all the time, so neither is ever idle.
    rt.runtime.add_remote(RemoteImage::new("example.com/fast:1", 100_000).latency(ms(500))).expect("add");
    rt.runtime.add_remote(RemoteImage::new("example.com/drip:1", 1_000).latency(Duration::from_secs(30))).expect("add");
    let metrics = imaged::metrics::Metrics::new();
    let cfg = PullQueueSettings {
        stall_warning: Some(ms(200)),
        stall_timeout: Some(ms(300)),
        min_download_rate: 10_000,
        metrics: metrics.clone(),
        ..no_throttle(Concurrency::Serial)
    };
    let q = queue(&rt, cfg).await;
    q.send(EnqueuePull(req("example.com/fast:1"))).await.expect("admitted").await.expect("pulled");
    assert_eq!(stalls_warned(&metrics), (0.0, 0.0), "over the floor: no stall");

    let started = std::time::Instant::now();
    let failure = q.send(EnqueuePull(req("example.com/drip:1"))).await.expect("admitted").await.expect_err("cancelled");
    assert!(started.elapsed() < Duration::from_secs(10), "ended long before its 30 s: {:?}", started.elapsed());
    let PullFailure::Cri(errors) = &failure else { panic!("a runtime failure: {failure:?}") };
    assert_eq!(errors[0].kind(), CriErrorKind::RegistryUnavailable, "{}", errors[0]);
    let text = errors[0].to_string();
    assert!(text.starts_with("RegistryUnavailable: download \"layer-sha256:"), "{text}");
    assert!(text.contains(" bytes in ") && text.contains("under pull.min_download_rate (10000 bytes/s)"), "{text}");
    assert!(text.contains("imaged cancelled the pull (pull.stall_timeout 300ms)"), "{text}");
    // Warned of on the way (the warning's time is the shorter).
    assert_eq!(stalls_warned(&metrics).0, 1.0);
    let s = imaged::testing::Scrape::parse(&metrics.encode()).expect("the scrape parses");
    assert_eq!(s.value("imaged_pull_stall_cancels_total", &[]), Some(1.0));
    assert_eq!(rt.runtime.stats().pulls_completed, 1, "only the fast pull completed");
}

#[actix::test]
async fn a_reloaded_stall_check_starts_stops_and_follows_its_new_times() {
    use imaged::cri::CriErrorKind;
    let rt = runtime().await;
    let ms = Duration::from_millis;
    let stuck = RemoteImage::new("example.com/stuck:1", 1_000).latency(Duration::from_secs(30)).stalling(ms(50));
    rt.runtime.add_remote(stuck).expect("add");
    rt.runtime.add_remote(RemoteImage::new("example.com/long:1", 1_000).latency(ms(800))).expect("add");
    let metrics = imaged::metrics::Metrics::new();
    let off =
        UpdatePullWatch { slow_pull_warning: None, stall_warning: None, stall_timeout: None, min_download_rate: 0 };
    let cfg = PullQueueSettings {
        slow_pull_warning: None,
        stall_warning: None,
        stall_timeout: None,
        metrics: metrics.clone(),
        ..no_throttle(Concurrency::Serial)
    };
    let q = queue(&rt, cfg).await;
    // Off: the stuck pull runs on, nothing is listed.
    let pulling = q.send(EnqueuePull(req("example.com/stuck:1"))).await.expect("admitted");
    tokio::time::sleep(ms(400)).await;
    assert_eq!(rt.runtime.stats().calls(Rpc::ListStatuses), 0, "no check while off");
    // On, live: the running pull is judged by the new times.
    let on = UpdatePullWatch { stall_warning: Some(ms(100)), stall_timeout: Some(ms(200)), ..off };
    q.send(on).await.expect("updated");
    let started = std::time::Instant::now();
    let failure = tokio::time::timeout(Duration::from_secs(10), pulling)
        .await
        .expect("cancelled long before its 30 s")
        .expect_err("cancelled");
    let PullFailure::Cri(errors) = &failure else { panic!("a runtime failure: {failure:?}") };
    assert_eq!(errors[0].kind(), CriErrorKind::RegistryUnavailable, "{}", errors[0]);
    assert!(errors[0].to_string().contains("pull.stall_timeout 200ms"), "{}", errors[0]);
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
    assert_eq!(stalls_warned(&metrics).0, 1.0, "warned at the new warning time");
    // Off again: a pull runs and the runtime is not asked (after a quiet
    // moment: a listing sent before the stop may still be on its way).
    q.send(off).await.expect("updated");
    tokio::time::sleep(ms(200)).await;
    let listed = rt.runtime.stats().calls(Rpc::ListStatuses);
    q.send(EnqueuePull(req("example.com/long:1"))).await.expect("admitted").await.expect("pulled");
    assert_eq!(rt.runtime.stats().calls(Rpc::ListStatuses), listed, "the check's timer sleeps");
}

/// The in-process runtime on paused time (the simulator's) stamps its
/// downloads on tokio's clock: a check reading that clock
/// (`with_downloads_clock`) sees a stall as paused time passes and cancels
/// on time; reading the system's clock, which paused time does not move,
/// it sees every download written just now and never cancels.
#[actix::test]
async fn on_paused_time_the_check_reads_the_runtimes_clock_and_cancels_a_stall_on_time() {
    use imaged::actors::cri_gateway::{CriGatewayActor, CriSettings, GetReader};
    use imaged::embedded::InProcessRuntime;
    tokio::time::pause();
    let ms = Duration::from_millis;
    let rt = InProcessRuntime::start();
    let stuck = RemoteImage::new("example.com/stuck:1", 1_000_000).latency(Duration::from_secs(600)).stalling(ms(100));
    rt.handle().add_remote(stuck).expect("add");
    let (gateway, _) = CriGatewayActor::connect_client(rt.client(Duration::from_secs(5)), &CriSettings::default())
        .await
        .expect("connected");
    let cfg = PullQueueSettings {
        stall_warning: Some(Duration::from_secs(10)),
        stall_timeout: Some(Duration::from_secs(20)),
        ..no_throttle(Concurrency::Serial)
    };
    let reader = gateway.send(GetReader).await.expect("reader");
    let q =
        PullQueueActor::new(cfg.clone(), reader.clone()).with_downloads_clock(rt.handle().downloads_clock()).start();
    let began = tokio::time::Instant::now();
    let failure =
        q.send(EnqueuePull(req("example.com/stuck:1"))).await.expect("admitted").await.expect_err("cancelled");
    let took = began.elapsed();
    assert!(took >= Duration::from_secs(20) && took < Duration::from_secs(30), "cancelled after {took:?}");
    let PullFailure::Cri(errors) = &failure else { panic!("a runtime failure: {failure:?}") };
    let text = errors[0].to_string();
    assert!(text.contains("wrote no byte for ") && text.contains("pull.stall_timeout 20s"), "{text}");

    // The same stall on the system's clock: never seen, the pull runs its 10 minutes.
    let q = PullQueueActor::new(cfg, reader).start();
    let began = tokio::time::Instant::now();
    q.send(EnqueuePull(req("example.com/stuck:1"))).await.expect("admitted").await.expect("pulled in the end");
    assert!(began.elapsed() >= Duration::from_secs(600), "{:?}", began.elapsed());
    rt.stop();
}

/// The listing of pulls keeps no readings over time, so the stall check
/// names the downloads it last found under `pull.min_download_rate`
/// (`ListSlowDownloads`, `imagectl pulls`' STALLED `slow`), and forgets
/// them once no pull runs.
#[actix::test]
async fn the_check_names_a_download_under_the_floor_while_it_runs_and_forgets_it_after() {
    let rt = runtime().await;
    let ms = Duration::from_millis;
    // 1 kB over 3 s: always written, under 10 kB/s.
    let drip = RemoteImage::new("example.com/drip:1", 1_000).latency(Duration::from_secs(3));
    let digest = drip.digest.clone();
    rt.runtime.add_remote(drip).expect("add");
    let cfg = PullQueueSettings {
        stall_warning: Some(ms(300)),
        stall_timeout: None,
        min_download_rate: 10_000,
        ..no_throttle(Concurrency::Serial)
    };
    let q = queue(&rt, cfg).await;
    assert!(q.send(ListSlowDownloads).await.expect("listed").is_empty(), "no pull, none");
    let pulling = q.send(EnqueuePull(req("example.com/drip:1"))).await.expect("admitted");
    let give_up = std::time::Instant::now() + Duration::from_secs(10);
    let slow = loop {
        let slow = q.send(ListSlowDownloads).await.expect("listed");
        if !slow.is_empty() || std::time::Instant::now() > give_up {
            break slow;
        }
        tokio::time::sleep(ms(20)).await;
    };
    assert_eq!(slow, [format!("layer-{digest}")]);
    pulling.await.expect("pulled: a drip is only warned of without a timeout");
    let give_up = std::time::Instant::now() + Duration::from_secs(10);
    while !q.send(ListSlowDownloads).await.expect("listed").is_empty() {
        assert!(std::time::Instant::now() < give_up, "still named after the pull");
        tokio::time::sleep(ms(20)).await;
    }
}
