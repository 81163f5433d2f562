//! The gateway's `Core` without actix and without a runtime: the call
//! closures stand in for the RPC, so these test what the gateway adds
//! around every call (deadlines, the fault plan, metrics).

use std::cell::Cell;
use std::rc::Rc;
use std::time::Duration;

use super::actor::Core;
use super::{CriDeadlines, CriSettings};
use crate::cri::{CriClient, CriEndpoint, CriError, CriErrorKind, Rpc};
use crate::fault::{FaultPlan, FaultRule};
use crate::metrics::Metrics;
use crate::testing::Scrape;

/// A core over a client that is never dialled (its channel is lazy).
fn core(deadlines: CriDeadlines) -> (Core, Metrics) {
    let client = CriClient::new(&CriEndpoint::Unix("/nonexistent/cri.sock".into()), Duration::from_secs(1))
        .expect("a unix endpoint");
    let metrics = Metrics::default();
    let cfg = CriSettings { deadlines, metrics: metrics.clone(), ..CriSettings::default() };
    (Core::new(client, &cfg), metrics)
}

/// The call's stand-in: returns the deadline it was given, and counts calls.
fn echo_deadline(
    calls: &Rc<Cell<u32>>,
) -> impl FnOnce(std::sync::Arc<CriClient>, Option<Duration>) -> std::future::Ready<Result<Option<Duration>, CriError>> + use<>
{
    let calls = calls.clone();
    move |_, d| {
        calls.set(calls.get() + 1);
        std::future::ready(Ok(d))
    }
}

fn errors(m: &Metrics, rpc: &str, code: &str) -> Option<f64> {
    let s = Scrape::parse(&m.encode()).expect("parses");
    s.value("imaged_cri_request_errors_total", &[("method", rpc), ("code", code)])
}

#[tokio::test]
async fn the_shorter_of_the_configured_and_the_callers_deadline_reaches_the_call() {
    let s = |n| Some(Duration::from_secs(n));
    let (c, _) = core(CriDeadlines::uniform(None).with(Rpc::ImageStatus, s(10)));
    let calls = Rc::new(Cell::new(0));
    let cases = [(Rpc::ImageStatus, None, s(10)), (Rpc::ImageStatus, s(3), s(3)), (Rpc::ImageStatus, s(30), s(10))];
    for (rpc, requested, want) in cases {
        let got = c.call_within(rpc, None, requested, echo_deadline(&calls)).await.expect("no fault");
        assert_eq!(got, want, "{rpc:?} configured 10s, requested {requested:?}");
    }
    let got = c.call_within(Rpc::PullImage, None, None, echo_deadline(&calls)).await.expect("no fault");
    assert_eq!(got, None, "no deadline configured or asked: none (the pull queue's own applies)");
    assert_eq!(calls.get(), 4);
}

#[tokio::test]
async fn a_failing_rule_answers_without_calling_the_runtime_and_is_counted() {
    let (c, metrics) = core(CriDeadlines::uniform(None));
    let err = CriError::new(CriErrorKind::NotFound, "injected");
    c.set_faults(FaultPlan::new(1).rule(FaultRule::on(Rpc::PullImage).image("bad:*").fail(err)));
    let calls = Rc::new(Cell::new(0));
    let e = c.call_within(Rpc::PullImage, Some("bad:1".into()), None, echo_deadline(&calls)).await.expect_err("fault");
    assert_eq!(e.kind(), CriErrorKind::NotFound);
    assert_eq!(calls.get(), 0, "the runtime is not called");
    assert_eq!(errors(&metrics, "PullImage", "NotFound"), Some(1.0), "the injected error is counted as the runtime's");
    c.call_within(Rpc::PullImage, Some("good:1".into()), None, echo_deadline(&calls))
        .await
        .expect("another image passes");
    assert_eq!(calls.get(), 1);

    c.set_faults(FaultPlan::default());
    c.call_within(Rpc::PullImage, Some("bad:1".into()), None, echo_deadline(&calls)).await.expect("plan cleared");
    assert_eq!(calls.get(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_faults_delay_and_a_hang_count_against_the_deadline() {
    let (c, _) = core(CriDeadlines::uniform(Some(Duration::from_secs(2))));
    let calls = Rc::new(Cell::new(0));
    c.set_faults(FaultPlan::new(1).rule(FaultRule::on(Rpc::ImageStatus).delay(Duration::from_secs(1))));
    let started = tokio::time::Instant::now();
    c.call_within(Rpc::ImageStatus, None, None, echo_deadline(&calls)).await.expect("1 s delay within 2 s");
    assert_eq!(started.elapsed(), Duration::from_secs(1));

    c.set_faults(FaultPlan::new(1).rule(FaultRule::on(Rpc::ImageStatus).delay(Duration::from_secs(5))));
    let e = c.call_within(Rpc::ImageStatus, None, None, echo_deadline(&calls)).await.expect_err("5 s delay");
    assert_eq!(e.kind(), CriErrorKind::DeadlineExceeded);

    c.set_faults(FaultPlan::new(1).rule(FaultRule::on(Rpc::ImageStatus).hang()));
    let started = tokio::time::Instant::now();
    let e = c.call_within(Rpc::ImageStatus, None, None, echo_deadline(&calls)).await.expect_err("hang");
    assert_eq!((e.kind(), started.elapsed()), (CriErrorKind::DeadlineExceeded, Duration::from_secs(2)));
    assert_eq!(calls.get(), 1, "only the short delay reached the runtime");
}

#[tokio::test(start_paused = true)]
async fn a_dropped_reply_reaches_the_runtime_but_the_caller_sees_its_deadline() {
    let (c, _) = core(CriDeadlines::uniform(Some(Duration::from_secs(1))));
    c.set_faults(FaultPlan::new(1).rule(FaultRule::on(Rpc::RemoveImage).drop_reply()));
    let calls = Rc::new(Cell::new(0));
    let e = c.call_within(Rpc::RemoveImage, None, None, echo_deadline(&calls)).await.expect_err("reply dropped");
    assert_eq!(e.kind(), CriErrorKind::DeadlineExceeded);
    assert_eq!(calls.get(), 1, "the runtime did the work");
}
