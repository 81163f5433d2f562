#![allow(clippy::pedantic)] // test code: pedantic lints are for what ships
//! One pull without an actor: the decisions on their own, and whole pulls
//! against a scripted runtime with paused time.

use std::cell::RefCell;
use std::collections::VecDeque;

use super::*;
use crate::domain::Image;
use crate::testing::Scrape;

const SECOND: Duration = Duration::from_secs(1);

// === the decisions ===

#[tokio::test(start_paused = true)]
async fn a_fresh_absent_check_spares_the_recheck_unless_a_pull_succeeded_since() {
    let t0 = Instant::now();
    tokio::time::advance(SECOND / 2).await;
    let now = Instant::now();
    // Only a pull that may be skipped re-checks.
    assert!(!needs_recheck(false, None, None, now));
    // No check of its own: it re-checks.
    assert!(needs_recheck(true, None, None, now));
    // Checked 0.5 s ago: spared.
    assert!(!needs_recheck(true, Some(t0), None, now));
    // ... unless a pull of the image succeeded since (or at the same instant).
    assert!(needs_recheck(true, Some(t0), Some(now), now));
    assert!(needs_recheck(true, Some(t0), Some(t0), now));
    // A success before the check changes nothing.
    tokio::time::advance(SECOND / 4).await;
    let later = Instant::now();
    assert!(!needs_recheck(true, Some(now), Some(t0), later));
    // Exactly the window old: still fresh; older: re-checked.
    assert!(!needs_recheck(true, Some(t0), None, t0 + RECHECK_WINDOW));
    assert!(needs_recheck(true, Some(t0), None, t0 + RECHECK_WINDOW + Duration::from_millis(1)));
}

#[test]
fn what_is_left_of_a_deadline_and_when_none_is() {
    assert_eq!(time_left(None, Duration::from_secs(3600)), Ok(None));
    assert_eq!(time_left(Some(5 * SECOND), 3 * SECOND), Ok(Some(2 * SECOND)));
    assert_eq!(time_left(Some(5 * SECOND), 5 * SECOND), Err(PullFailure::DeadlineExceeded(5 * SECOND)));
    assert_eq!(time_left(Some(5 * SECOND), 6 * SECOND), Err(PullFailure::DeadlineExceeded(5 * SECOND)));
}

#[test]
fn only_the_pulls_own_deadline_ends_the_pull() {
    let late = CriError::deadline_exceeded();
    let denied = CriError::new(CriErrorKind::Unauthorized, "denied");
    assert_eq!(deadline_passed(Some(5 * SECOND), &late, 5 * SECOND), Some(PullFailure::DeadlineExceeded(5 * SECOND)));
    // The runtime's own (shorter) deadline: one more error, next credential.
    assert_eq!(deadline_passed(Some(5 * SECOND), &late, 2 * SECOND), None);
    assert_eq!(deadline_passed(None, &late, 5 * SECOND), None);
    // Another error past the deadline: the next attempt finds no time left.
    assert_eq!(deadline_passed(Some(5 * SECOND), &denied, 6 * SECOND), None);
}

#[test]
fn the_stage_cell_keeps_running_stages_only() {
    let cell = StageCell::default();
    assert_eq!(cell.get(), PullStage::Starting);
    cell.set(PullStage::Pulling);
    assert_eq!(cell.get(), PullStage::Pulling);
    // A waiting stage is not a running one: ignored.
    cell.set(PullStage::Queued { position: 1 });
    assert_eq!(cell.get(), PullStage::Pulling);
    cell.set(PullStage::Throttled);
    assert_eq!(cell.get(), PullStage::Throttled);
}

// === whole pulls against a script ===

#[derive(Debug, Clone, PartialEq, Eq)]
enum Call {
    Status(String),
    /// The credential's user name ("" = anonymous) and the deadline sent.
    Pull(String, Option<Duration>),
    /// A client's request bytes, as the runtime got them.
    Wire(Bytes),
    /// The slot freed and the waiters were answered, with the size then
    /// known (`None`: still being looked up).
    SlotFreed(Option<u64>),
}

/// A runtime that answers from scripts, in order: `ImageStatus` (absent
/// when the script is empty) and `PullImage` (how long it takes, then its
/// answer; `sha256:pulled` when empty). A pull that outlasts the deadline
/// it was sent fails with `DeadlineExceeded` then, as the gateway's does.
#[derive(Default)]
struct Script {
    statuses: RefCell<VecDeque<Result<ImageStatus, CriError>>>,
    pulls: RefCell<VecDeque<(Duration, Result<String, CriError>)>>,
    log: RefCell<Vec<Call>>,
    /// The outcome the waiters were answered with.
    answered: RefCell<Option<PullOutcome>>,
}

impl Script {
    fn status(self, s: Result<ImageStatus, CriError>) -> Self {
        self.statuses.borrow_mut().push_back(s);
        self
    }

    fn pull(self, took: Duration, r: Result<String, CriError>) -> Self {
        self.pulls.borrow_mut().push_back((took, r));
        self
    }

    fn calls(&self) -> Vec<Call> {
        self.log.borrow().clone()
    }
}

impl PullRuntime for &Script {
    async fn status(&self, image: ImageSpec) -> Result<ImageStatus, CriError> {
        self.log.borrow_mut().push(Call::Status(image.image));
        let next = self.statuses.borrow_mut().pop_front();
        next.unwrap_or_else(|| Ok(ImageStatus::default()))
    }

    /// A client's request bytes: read as the typed pull would be, and the
    /// answer encoded with an extra field (number 99) the runtime added.
    async fn pull_wire(&self, _image: &str, body: Bytes, deadline: Option<Duration>) -> Result<Bytes, CriError> {
        use prost::Message as _;
        self.log.borrow_mut().push(Call::Wire(body.clone()));
        let req = crate::cri::proto::PullImageRequest::decode(body)
            .map_err(|_| CriError::new(CriErrorKind::InvalidArgument, "bad request"))?;
        let m = PullImage {
            image: req.image.map(Into::into).unwrap_or_default(),
            auth: req.auth.map(Into::into),
            sandbox: None,
            deadline,
        };
        let image_ref = self.pull(m).await?;
        let mut answer = crate::cri::proto::PullImageResponse { image_ref }.encode_to_vec();
        answer.extend_from_slice(&[0x9a, 0x06, 2, b'r', b't']);
        Ok(answer.into())
    }

    async fn pull(&self, m: PullImage) -> Result<String, CriError> {
        let user = m.auth.map(|a| a.username).unwrap_or_default();
        self.log.borrow_mut().push(Call::Pull(user, m.deadline));
        let next = self.pulls.borrow_mut().pop_front();
        let (took, answer) = next.unwrap_or((Duration::ZERO, Ok("sha256:pulled".into())));
        match m.deadline {
            Some(d) if d < took => {
                tokio::time::sleep(d).await;
                Err(CriError::deadline_exceeded())
            }
            _ => {
                tokio::time::sleep(took).await;
                answer
            }
        }
    }
}

fn present(id: &str, size: u64) -> Result<ImageStatus, CriError> {
    Ok(ImageStatus { image: Some(Image { id: id.into(), size, ..Image::default() }), ..ImageStatus::default() })
}

fn denied(who: &str) -> CriError {
    CriError::new(CriErrorKind::Unauthorized, format!("{who} denied"))
}

fn task(script: &Script, request: PullRequest) -> PullTask<&Script> {
    PullTask {
        runtime: script,
        recheck: false,
        deadline: request.deadline,
        request,
        throttle: Arc::new(PullThrottle::new(0.0, 0, ThrottleMode::Fail)),
        progress: Progress {
            image: "example.com/a:1".into(),
            subscribers: Vec::new(),
            stage: Arc::default(),
            pod: None,
        },
        metrics: Metrics::default(),
        offers: None,
        retries: Retries::default(),
        registry_token: false,
        wanted: None,
        stop: Arc::default(),
    }
}

fn request() -> PullRequest {
    PullRequest::new(ImageSpec::new("example.com/a:1"))
}

fn with_users(users: &[&str]) -> PullRequest {
    let mut r = request();
    r.credentials = users.iter().map(|u| AuthConfig::basic("example.com", *u, "pw")).collect();
    r
}

/// Runs `t`, logging when its slot frees and keeping what the waiters
/// were answered with.
async fn run(t: &PullTask<&Script>, script: &Script) -> PullResult {
    t.run(async |outcome: PullOutcome| {
        script.log.borrow_mut().push(Call::SlotFreed(outcome.size.now()));
        *script.answered.borrow_mut() = Some(outcome);
    })
    .await
}

fn scrape(m: &Metrics) -> Scrape {
    Scrape::parse(&m.encode()).expect("the scrape parses")
}

#[tokio::test(start_paused = true)]
async fn an_image_present_at_its_turn_is_not_pulled_and_takes_no_token() {
    let script = Script::default().status(present("sha256:there", 42));
    let mut t = task(&script, request());
    t.recheck = true;
    t.throttle = Arc::new(PullThrottle::new(1.0, 1, ThrottleMode::Fail));
    let outcome = run(&t, &script).await.expect("present");
    assert_eq!(
        outcome,
        PullOutcome {
            image_ref: "sha256:there".into(),
            size: ImageSize::known(42),
            pull_duration: Duration::ZERO,
            pulled: false,
            credential: None,
            answer: None,
            record_due: None
        }
    );
    assert_eq!(script.calls(), vec![Call::Status("example.com/a:1".into())]);
    assert!(t.throttle.try_acquire().is_ok(), "the token is still there");
}

#[tokio::test(start_paused = true)]
async fn a_failed_recheck_pulls_anyway() {
    let failed = CriError::new(CriErrorKind::RuntimeUnavailable, "down");
    let script = Script::default().status(Err(failed)).status(present("sha256:pulled", 7));
    let mut t = task(&script, request());
    t.recheck = true;
    let outcome = run(&t, &script).await.expect("pulled");
    assert!(outcome.pulled);
    assert_eq!(outcome.size.bytes().await, 7);
    assert_eq!(
        script.calls(),
        vec![
            Call::Status("example.com/a:1".into()),
            Call::Pull(String::new(), None),
            Call::SlotFreed(None),
            Call::Status("sha256:pulled".into()),
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn credentials_are_tried_in_order_until_one_works() {
    let script = Script::default().pull(SECOND, Err(denied("ann"))).pull(SECOND, Err(denied("bob")));
    let t = task(&script, with_users(&["ann", "bob", "cy", "dee"]));
    let outcome = run(&t, &script).await.expect("cy's works");
    assert_eq!(outcome.credential, Some(2), "the index of the credential that worked");
    let pulls: Vec<Call> = script.calls().into_iter().filter(|c| matches!(c, Call::Pull(..))).collect();
    assert_eq!(
        pulls,
        vec![Call::Pull("ann".into(), None), Call::Pull("bob".into(), None), Call::Pull("cy".into(), None)]
    );
}

#[tokio::test(start_paused = true)]
async fn an_anonymous_pull_makes_one_attempt_and_reports_no_credential() {
    let script = Script::default().pull(SECOND, Err(denied("anonymous")));
    let t = task(&script, request());
    assert_eq!(run(&t, &script).await, Err(PullFailure::Cri(vec![denied("anonymous")])));
    let script = Script::default();
    let t = task(&script, request());
    assert_eq!(run(&t, &script).await.expect("pulled").credential, None);
}

#[tokio::test(start_paused = true)]
async fn every_credential_failing_gives_every_error_and_the_text_merges_repeats() {
    let script =
        Script::default().pull(SECOND, Err(denied("x"))).pull(SECOND, Err(denied("y"))).pull(SECOND, Err(denied("x")));
    let t = task(&script, with_users(&["a", "b", "c"]));
    let failure = run(&t, &script).await.expect_err("all denied");
    assert_eq!(failure, PullFailure::Cri(vec![denied("x"), denied("y"), denied("x")]));
    assert_eq!(failure.to_string(), format!("[{}, {}]", denied("x"), denied("y")));
    assert!(!script.calls().iter().any(|c| matches!(c, Call::SlotFreed(_))), "a failed pull frees no slot early");
}

#[tokio::test(start_paused = true)]
async fn each_credential_gets_what_is_left_of_the_deadline_and_the_deadline_ends_the_pull() {
    let script = Script::default().pull(3 * SECOND, Err(denied("ann"))).pull(10 * SECOND, Ok("sha256:late".into()));
    let mut r = with_users(&["ann", "bob", "cy"]);
    r.deadline = Some(5 * SECOND);
    let t = task(&script, r);
    let start = Instant::now();
    assert_eq!(run(&t, &script).await, Err(PullFailure::DeadlineExceeded(5 * SECOND)));
    assert_eq!(start.elapsed(), 5 * SECOND, "cancelled at the deadline, not when the pull would end");
    assert_eq!(
        script.calls(),
        vec![Call::Pull("ann".into(), Some(5 * SECOND)), Call::Pull("bob".into(), Some(2 * SECOND))],
        "cy is never tried"
    );
}

#[tokio::test(start_paused = true)]
async fn a_runtime_deadline_shorter_than_the_pulls_is_one_more_error() {
    let script = Script::default().pull(SECOND, Err(CriError::deadline_exceeded()));
    let mut r = with_users(&["ann", "bob"]);
    r.deadline = Some(5 * SECOND);
    let t = task(&script, r);
    let outcome = run(&t, &script).await.expect("bob's works");
    assert_eq!(outcome.credential, Some(1));
    assert!(script.calls().contains(&Call::Pull("bob".into(), Some(4 * SECOND))));
}

#[tokio::test(start_paused = true)]
async fn no_time_left_before_the_next_credential_ends_the_pull_without_trying_it() {
    // ann's failure comes exactly at the deadline (not as a deadline error).
    let script = Script::default().pull(5 * SECOND, Err(denied("ann")));
    let mut r = with_users(&["ann", "bob"]);
    r.deadline = Some(5 * SECOND);
    let t = task(&script, r);
    assert_eq!(run(&t, &script).await, Err(PullFailure::DeadlineExceeded(5 * SECOND)));
    assert_eq!(script.calls(), vec![Call::Pull("ann".into(), Some(5 * SECOND))]);
}

#[tokio::test(start_paused = true)]
async fn a_front_pull_takes_the_size_its_client_offers_and_looks_it_up_only_when_none_comes() {
    use crate::actors::pull_queue::{OFFER_WAIT, SizeOffers};
    let board = SizeOffers::default();
    // Offered while the pull waits (as the front forwards the client's ImageStatus).
    let script = Script::default().pull(SECOND, Ok("sha256:new".into()));
    let mut t = task(&script, request());
    t.offers = Some(board.clone());
    let offering = async {
        while !board.wanted() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        tokio::time::sleep(OFFER_WAIT / 2).await;
        board.offer("sha256:new", 1234);
    };
    let (outcome, ()) = tokio::join!(run(&t, &script), offering);
    assert_eq!(outcome.expect("pulled").size.bytes().await, 1234);
    assert_eq!(script.calls(), vec![Call::Pull(String::new(), None), Call::SlotFreed(None)], "no lookup of its own");
    assert!(!board.wanted(), "the wait is over");

    // None offered: its own lookup once the wait ends.
    let script = Script::default().pull(SECOND, Ok("sha256:new".into())).status(present("sha256:new", 7));
    let mut t = task(&script, request());
    t.offers = Some(board.clone());
    let started = tokio::time::Instant::now();
    let outcome = run(&t, &script).await.expect("pulled");
    assert_eq!(outcome.size.bytes().await, 7);
    assert_eq!(started.elapsed(), SECOND + OFFER_WAIT, "the lookup came after the whole wait");
    assert_eq!(script.calls().last(), Some(&Call::Status("sha256:new".into())));
}

#[tokio::test(start_paused = true)]
async fn the_waiters_are_answered_before_the_size_lookup_and_a_failed_lookup_gives_size_zero() {
    let script = Script::default().pull(2 * SECOND, Ok("sha256:new".into()));
    script.statuses.borrow_mut().push_back(Err(CriError::new(CriErrorKind::RuntimeUnavailable, "down")));
    let t = task(&script, request());
    let outcome = run(&t, &script).await.expect("pulled");
    assert_eq!((outcome.image_ref.as_str(), outcome.size.bytes().await, outcome.pulled), ("sha256:new", 0, true));
    assert_eq!(outcome.pull_duration, 2 * SECOND);
    assert_eq!(
        script.calls(),
        vec![Call::Pull(String::new(), None), Call::SlotFreed(None), Call::Status("sha256:new".into())]
    );
    let answered = script.answered.borrow_mut().take().expect("the waiters were answered");
    assert_eq!(answered.size.now(), Some(0), "their size is set when the lookup ends, failed or not");
    assert_eq!((answered.image_ref, answered.pull_duration), (outcome.image_ref, outcome.pull_duration));
    assert_eq!(t.progress.stage.get(), PullStage::Pulling, "the pull's last stage; the queue forgets it once pulled");
}

#[tokio::test(start_paused = true)]
async fn an_empty_bucket_fails_the_pull_in_fail_mode() {
    let script = Script::default();
    let mut t = task(&script, request());
    t.throttle = Arc::new(PullThrottle::new(1.0, 1, ThrottleMode::Fail));
    assert!(t.throttle.try_acquire().is_ok());
    assert_eq!(run(&t, &script).await, Err(PullFailure::QpsExceeded));
    assert_eq!(script.calls(), vec![], "no CRI call");
    assert_eq!(scrape(&t.metrics).value("imaged_pull_throttle_rejections_total", &[]), Some(1.0));
}

#[tokio::test(start_paused = true)]
async fn in_wait_mode_the_pull_waits_for_a_token_counted_once() {
    let script = Script::default();
    let mut t = task(&script, request());
    t.throttle = Arc::new(PullThrottle::new(1.0, 1, ThrottleMode::Wait));
    assert!(t.throttle.try_acquire().is_ok());
    let start = Instant::now();
    let watch = async {
        tokio::time::sleep(SECOND / 2).await;
        t.progress.stage.get()
    };
    let (result, midway) = tokio::join!(run(&t, &script), watch);
    assert!(result.expect("pulled").pulled);
    assert_eq!(midway, PullStage::Throttled);
    assert_eq!(start.elapsed(), SECOND, "one token per second");
    assert_eq!(t.progress.stage.get(), PullStage::Pulling);
    let s = scrape(&t.metrics);
    assert_eq!(s.value("imaged_pull_throttle_waits_total", &[]), Some(1.0));
    assert_eq!(s.value("imaged_pull_throttle_rejections_total", &[]), Some(0.0));
}

#[tokio::test(start_paused = true)]
async fn a_clients_request_reaches_the_runtime_as_its_bytes_and_the_answer_comes_back_as_sent() {
    use prost::Message as _;
    let script = Script::default();
    let auth = crate::cri::proto::AuthConfig { username: "al".into(), password: "pw".into(), ..Default::default() };
    let mut body = crate::cri::proto::PullImageRequest {
        image: Some(crate::cri::proto::ImageSpec { image: "example.com/a:1".into(), ..Default::default() }),
        auth: Some(auth),
        sandbox_config: None,
    }
    .encode_to_vec();
    body.extend_from_slice(&[0x9a, 0x06, 3, b'n', b'e', b'w']); // a field imaged's proto does not know
    let body = Bytes::from(body);
    let request = PullRequest {
        credentials: vec![AuthConfig { username: "al".into(), ..AuthConfig::default() }],
        wire: Some(body.clone()),
        ..request()
    };
    let outcome = run(&task(&script, request), &script).await.expect("pulled");
    assert_eq!(script.calls()[0], Call::Wire(body), "the runtime gets the client's bytes, unknown field and all");
    assert_eq!(outcome.image_ref, "sha256:pulled");
    assert_eq!(outcome.credential, Some(0), "pulled with the request's one credential");
    let answer = outcome.answer.expect("the runtime's answer");
    assert!(answer.ends_with(&[0x9a, 0x06, 2, b'r', b't']), "the runtime's own field comes back: {answer:?}");
}

#[tokio::test(start_paused = true)]
async fn a_clients_request_that_fails_fails_with_the_runtimes_error() {
    let script = Script::default().pull(Duration::ZERO, Err(denied("al")));
    let request = PullRequest { wire: Some(Bytes::from(vec![0x0a, 0x03, 0x0a, 0x01, b'a'])), ..request() };
    let failure = run(&task(&script, request), &script).await.expect_err("denied");
    assert!(
        matches!(&failure, PullFailure::Cri(e) if e.len() == 1 && e[0].kind() == CriErrorKind::Unauthorized),
        "{failure:?}"
    );
}

fn reset() -> CriError {
    CriError::from_status(
        crate::cri::StatusCode::Unknown,
        "failed to pull and unpack image: read: connection reset by peer",
    )
}

#[tokio::test(start_paused = true)]
async fn a_transient_failure_is_tried_again_after_a_doubling_wait_and_counted() {
    let script = Script::default().pull(SECOND, Err(reset())).pull(SECOND, Err(reset()));
    let mut t = task(&script, request());
    t.retries = Retries { times: 3, delay: 2 * SECOND };
    let start = Instant::now();
    let outcome = run(&t, &script).await.expect("the third attempt works");
    assert!(outcome.pulled);
    assert_eq!(start.elapsed(), SECOND + 2 * SECOND + SECOND + 4 * SECOND, "waits of 2 s, then 4 s");
    assert_eq!(script.calls().iter().filter(|c| matches!(c, Call::Pull(..))).count(), 3);
    assert_eq!(scrape(&t.metrics).value("imaged_pull_transient_retries_total", &[]), Some(2.0));
}

#[tokio::test(start_paused = true)]
async fn retries_stop_at_their_number_a_permanent_failure_and_the_deadline() {
    // Out of retries: the last failure.
    let script = Script::default().pull(SECOND, Err(reset())).pull(SECOND, Err(reset()));
    let mut t = task(&script, request());
    t.retries = Retries { times: 1, delay: SECOND };
    assert_eq!(run(&t, &script).await, Err(PullFailure::Cri(vec![reset()])));
    assert_eq!(script.calls().iter().filter(|c| matches!(c, Call::Pull(..))).count(), 2);
    // Refused credentials are not retried.
    let script = Script::default().pull(SECOND, Err(denied("anonymous")));
    let mut t = task(&script, request());
    t.retries = Retries { times: 3, delay: SECOND };
    assert_eq!(run(&t, &script).await, Err(PullFailure::Cri(vec![denied("anonymous")])));
    assert_eq!(script.calls().len(), 1);
    // No retry whose wait would reach the pull's deadline.
    let script = Script::default().pull(3 * SECOND, Err(reset()));
    let mut r = request();
    r.deadline = Some(4 * SECOND);
    let mut t = task(&script, r);
    t.retries = Retries { times: 3, delay: SECOND };
    let start = Instant::now();
    assert_eq!(run(&t, &script).await, Err(PullFailure::Cri(vec![reset()])));
    assert_eq!(start.elapsed(), 3 * SECOND, "failed at once, not after waiting out the deadline");
    // Off (the default): one attempt.
    let script = Script::default().pull(SECOND, Err(reset()));
    let t = task(&script, request());
    assert_eq!(run(&t, &script).await, Err(PullFailure::Cri(vec![reset()])));
    assert_eq!(scrape(&t.metrics).value("imaged_pull_transient_retries_total", &[]), Some(0.0));
}

#[tokio::test(start_paused = true)]
async fn a_clients_request_is_sent_again_as_its_bytes_after_a_transient_failure() {
    use prost::Message as _;
    let script = Script::default().pull(SECOND, Err(reset()));
    let mut r = request();
    let body = crate::cri::proto::PullImageRequest {
        image: Some(crate::cri::proto::ImageSpec { image: "example.com/a:1".into(), ..Default::default() }),
        ..Default::default()
    }
    .encode_to_vec();
    r.wire = Some(body.clone().into());
    let mut t = task(&script, r);
    t.retries = Retries { times: 1, delay: SECOND };
    assert!(run(&t, &script).await.expect("the retry works").answer.is_some());
    let wires: Vec<Call> = script.calls().into_iter().filter(|c| matches!(c, Call::Wire(_))).collect();
    assert_eq!(wires, vec![Call::Wire(body.clone().into()), Call::Wire(body.into())], "the same bytes twice");
}

#[test]
fn only_network_and_unreachable_failures_are_transient() {
    use crate::cri::StatusCode::{NotFound, Unavailable, Unknown};
    for (code, text) in [
        (
            Unknown,
            "failed to pull and unpack image \"x\": failed to copy: read tcp 10.0.0.2:443: connection reset by peer",
        ),
        (Unknown, "failed to resolve reference \"x\": dial tcp 1.2.3.4:443: i/o timeout"),
        (Unknown, "failed to do request: Head \"https://r/v2/\": net/http: TLS handshake timeout"),
        (Unknown, "unexpected status: 503 Service Unavailable"),
        (Unavailable, "connection error: desc = \"transport: Error while dialing\""),
        (Unknown, "RegistryUnavailable: dial tcp: lookup r: no such host"),
    ] {
        assert!(is_transient(&CriError::from_status(code, text)), "{text}");
    }
    for (code, text) in [
        (NotFound, "failed to resolve reference \"x\": x: not found"),
        (Unknown, "pull access denied, repository does not exist or may require authorization"),
        (Unknown, "unexpected status from HEAD request: 429 Too Many Requests: toomanyrequests"),
        (Unknown, "failed to authorize: failed to fetch anonymous token: unexpected status: 401 Unauthorized"),
        (Unknown, "failed to unpack image: failed to extract layer: no space left on device"),
        (Unknown, "manifest unknown; connection reset by peer"),
    ] {
        assert!(!is_transient(&CriError::from_status(code, text)), "{text}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_refused_credential_beside_a_transient_failure_is_not_sent_again() {
    let script = Script::default().pull(SECOND, Err(denied("ann"))).pull(SECOND, Err(reset()));
    let mut t = task(&script, with_users(&["ann", "bob"]));
    t.retries = Retries { times: 3, delay: SECOND };
    assert_eq!(run(&t, &script).await, Err(PullFailure::Cri(vec![denied("ann"), reset()])));
    assert_eq!(script.calls().iter().filter(|c| matches!(c, Call::Pull(..))).count(), 2, "no retry");
}

#[test]
fn a_failed_pulls_reason_names_what_an_operator_acts_on() {
    use crate::cri::StatusCode::{NotFound, Unavailable, Unknown};
    let cri = |code, text: &str| PullFailure::Cri(vec![CriError::from_status(code, text)]);
    for (failure, want) in [
        (cri(NotFound, "failed to resolve reference \"x\": x: not found"), "not_found"),
        (
            cri(Unknown, "failed to authorize: failed to fetch anonymous token: unexpected status: 401 Unauthorized"),
            "unauthorized",
        ),
        (cri(Unknown, "unexpected status from HEAD request: 429 Too Many Requests: toomanyrequests"), "rate_limited"),
        (cri(Unknown, "failed to copy: read tcp 10.0.0.2:443: connection reset by peer"), "network"),
        (cri(Unknown, "RegistryUnavailable: dial tcp: lookup r: no such host"), "registry_unavailable"),
        (cri(Unavailable, "connection error"), "runtime_unavailable"),
        (cri(Unknown, "failed to extract layer: no space left on device"), "other"),
        (PullFailure::QpsExceeded, "qps_exceeded"),
        (PullFailure::DeadlineExceeded(SECOND), "pull_deadline"),
        (PullFailure::Cri(Vec::new()), "other"),
        // Several credentials tried: the last one's error.
        (PullFailure::Cri(vec![denied("ann"), CriError::from_status(NotFound, "x: not found")]), "not_found"),
    ] {
        assert_eq!(failure.reason(), want, "{failure:?}");
    }
}

#[test]
fn a_429_inside_a_digest_or_a_port_is_no_rate_limit() {
    use crate::cri::StatusCode::Unknown;
    let reset = "failed to copy: httpReadSeeker: failed open: failed to do request: Get \
                 \"https://r/v2/a/blobs/sha256:0d4290a429c3\": read tcp 10.0.0.2:42917->1.2.3.4:443: connection reset by peer";
    let e = CriError::from_status(Unknown, reset);
    assert!(is_transient(&e), "a reset, whatever digits it carries");
    assert_eq!(PullFailure::Cri(vec![e]).reason(), "network");
    let limited = CriError::from_status(Unknown, "unexpected status from GET request: 429 Too Many Requests");
    assert!(!is_transient(&limited));
    assert_eq!(PullFailure::Cri(vec![limited]).reason(), "rate_limited");
    let denied = CriError::from_status(Unknown, "denied: requested access to the resource is denied");
    assert_eq!(PullFailure::Cri(vec![denied]).reason(), "unauthorized");
}

#[tokio::test(start_paused = true)]
async fn a_failed_pull_of_a_name_that_does_not_parse_is_counted_under_invalid() {
    let script = Script::default().pull(SECOND, Err(CriError::new(CriErrorKind::InvalidArgument, "bad name")));
    let mut t = task(&script, request());
    t.progress.image = "user:s3cret@registry.example.com/app:1".into();
    run(&t, &script).await.expect_err("failed");
    let text = t.metrics.encode();
    assert!(!text.contains("s3cret"), "{text}");
    let s = scrape(&t.metrics);
    let failures = [("registry", "invalid"), ("reason", "invalid_argument")];
    assert_eq!(s.value("imaged_pull_failures_total", &failures), Some(1.0));
    // A name that parses gives its registry.
    let script = Script::default().pull(SECOND, Err(CriError::new(CriErrorKind::NotFound, "x: not found")));
    let t = task(&script, request());
    run(&t, &script).await.expect_err("failed");
    let s = scrape(&t.metrics);
    assert_eq!(
        s.value("imaged_pull_failures_total", &[("registry", "example.com"), ("reason", "not_found")]),
        Some(1.0)
    );
}

#[tokio::test]
async fn a_stop_ends_the_call_in_flight_and_an_earlier_stop_no_later_call() {
    let stop = Arc::new(StopCall::default());
    let stopper = stop.clone();
    let call = stop.guard(async {
        tokio::time::sleep(Duration::from_secs(60)).await;
        Ok::<_, CriError>(1)
    });
    let stopping = async move {
        tokio::task::yield_now().await;
        assert!(stopper.call_running_for().is_some(), "the call is in flight");
        stopper.stop(CriError::new(CriErrorKind::RegistryUnavailable, "stalled"));
    };
    assert_eq!(stop.call_running_for(), None, "no call yet");
    let (ended, ()) = tokio::join!(call, stopping);
    assert_eq!(ended.map_err(|e| e.kind()), Err(CriErrorKind::RegistryUnavailable));
    assert_eq!(stop.call_running_for(), None, "the call ended");
    stop.stop(CriError::new(CriErrorKind::Other, "for a call long gone"));
    assert_eq!(stop.guard(async { Ok::<_, CriError>(2) }).await, Ok(2), "a later call gets its chance");
}
