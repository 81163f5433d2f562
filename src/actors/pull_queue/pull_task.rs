//! One pull, from its turn to its result — what the pull queue's per-pull
//! task runs, free of actix: the re-check at its turn, a throttle token,
//! `PullImage` per credential under the deadline, the size lookup (after
//! the waiters are answered), and the phases and stage it reports on the
//! way. The actor builds a [`PullTask`] when a slot frees and spawns
//! [`PullTask::run`]; tests drive it with a scripted [`PullRuntime`] and
//! paused time.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use actix::Recipient;
use prost::bytes::Bytes;
use tokio::time::Instant;
use tracing::debug;

use super::messages::{
    ImageSize, PullFailure, PullOutcome, PullPhase, PullPhaseChanged, PullPod, PullRequest, PullResult, PullStage,
};
use super::queue::PullKey;
use super::size_offers::{OFFER_WAIT, SizeOffers};
use super::throttle::{PullThrottle, ThrottleMode};
use crate::actors::cri_gateway::{CriReader, PullImage};
use crate::cri::{CriError, CriErrorKind};
use crate::domain::{AuthConfig, ImageSpec, ImageStatus};
use crate::metrics::Metrics;

/// How fresh a caller's presence check must be to spare the re-check.
pub(super) const RECHECK_WINDOW: Duration = Duration::from_secs(1);

/// Whether a pull must check, at its turn, that its image is still absent:
/// only a pull that may be skipped (`skip_if_present`), and not when the
/// caller saw the image absent (`absent_at`) within [`RECHECK_WINDOW`] of
/// `now` with no pull of the image succeeding since (`last_success`).
pub(super) fn needs_recheck(
    skip_if_present: bool,
    absent_at: Option<Instant>,
    last_success: Option<Instant>,
    now: Instant,
) -> bool {
    skip_if_present
        && match absent_at {
            None => true,
            Some(t) => now.saturating_duration_since(t) > RECHECK_WINDOW || last_success.is_some_and(|f| f >= t),
        }
}

/// The two CRI calls a pull makes (the gateway's [`CriReader`] in
/// production, a script in tests).
pub(super) trait PullRuntime {
    /// `ImageStatus`, not verbose.
    fn status(&self, image: ImageSpec) -> impl Future<Output = Result<ImageStatus, CriError>>;
    /// `PullImage`; returns the image reference.
    fn pull(&self, m: PullImage) -> impl Future<Output = Result<String, CriError>>;
    /// `PullImage` of a client's request bytes; returns the answer's bytes.
    fn pull_wire(
        &self,
        image: &str,
        body: Bytes,
        deadline: Option<Duration>,
    ) -> impl Future<Output = Result<Bytes, CriError>>;
}

impl PullRuntime for CriReader {
    fn status(&self, image: ImageSpec) -> impl Future<Output = Result<ImageStatus, CriError>> {
        self.image_status(image, false)
    }

    // Through the gateway's direct handle: one task hop less per pull than
    // the mailbox (the next pull of a wave starts that much sooner).
    fn pull(&self, m: PullImage) -> impl Future<Output = Result<String, CriError>> {
        self.pull_image(m)
    }

    fn pull_wire(
        &self,
        image: &str,
        body: Bytes,
        deadline: Option<Duration>,
    ) -> impl Future<Output = Result<Bytes, CriError>> {
        CriReader::pull_wire(self, image, body, deadline)
    }
}

/// A running pull's stage, set by its task and read by `ListPulls` and the
/// slow-pull check.
#[derive(Debug, Default)]
pub(super) struct StageCell(AtomicU8);

impl StageCell {
    const STAGES: [PullStage; 3] = [PullStage::Starting, PullStage::Throttled, PullStage::Pulling];

    pub(super) fn set(&self, stage: PullStage) {
        if let Some(i) = Self::STAGES.iter().position(|s| *s == stage) {
            self.0.store(u8::try_from(i).unwrap_or(0), Ordering::Relaxed);
        }
    }

    pub(super) fn get(&self) -> PullStage {
        Self::STAGES.get(usize::from(self.0.load(Ordering::Relaxed))).copied().unwrap_or(PullStage::Starting)
    }
}

/// Sends `phase` of `image` to every subscriber with `try_send`: a full or
/// closed subscriber loses it, and never holds up the queue.
pub(super) fn publish(
    subscribers: &[Recipient<PullPhaseChanged>],
    image: &str,
    phase: PullPhase,
    pod: Option<&PullPod>,
) {
    for s in subscribers {
        if s.try_send(PullPhaseChanged { image: image.to_string(), phase, pod: pod.cloned() }).is_err() {
            debug!(image, ?phase, "a phase subscriber is full or gone; event dropped");
        }
    }
}

/// How a pull task reports its progress: phases to subscribers, and the
/// stage `ListPulls` shows.
pub(super) struct Progress {
    /// The image as the queue's key names it (normalised).
    pub image: String,
    pub subscribers: Vec<Recipient<PullPhaseChanged>>,
    pub stage: Arc<StageCell>,
    /// The pod of the request that started the pull.
    pub pod: Option<PullPod>,
}

impl Progress {
    /// Publishes `phase`, and moves the stage along with it.
    pub(super) fn phase(&self, phase: PullPhase) {
        match phase {
            PullPhase::Throttled => self.stage.set(PullStage::Throttled),
            PullPhase::Pulling => self.stage.set(PullStage::Pulling),
            _ => {}
        }
        publish(&self.subscribers, &self.image, phase, self.pod.as_ref());
    }
}

/// What is left of the pull's `deadline` once `elapsed` has passed since it
/// started pulling (`None`: no deadline); none left fails the pull.
pub(super) fn time_left(deadline: Option<Duration>, elapsed: Duration) -> Result<Option<Duration>, PullFailure> {
    match deadline {
        Some(d) => match d.checked_sub(elapsed) {
            Some(left) if !left.is_zero() => Ok(Some(left)),
            _ => Err(PullFailure::DeadlineExceeded(d)),
        },
        None => Ok(None),
    }
}

/// Whether a failed `PullImage` ends the whole pull: it was cancelled by the
/// pull's own deadline (a runtime's shorter deadline is one more error, and
/// the next credential is tried).
pub(super) fn deadline_passed(deadline: Option<Duration>, error: &CriError, elapsed: Duration) -> Option<PullFailure> {
    deadline
        .filter(|d| error.kind() == CriErrorKind::DeadlineExceeded && elapsed >= *d)
        .map(PullFailure::DeadlineExceeded)
}

/// One pull to run, with everything it needs (moved onto its own task).
pub(super) struct PullTask<R> {
    pub runtime: R,
    pub request: PullRequest,
    /// Check the image is still absent first (see [`needs_recheck`]).
    pub recheck: bool,
    /// Overall deadline from the start of the pulling (the request's, or the queue's).
    pub deadline: Option<Duration>,
    pub throttle: Arc<PullThrottle>,
    pub progress: Progress,
    pub metrics: Metrics,
    /// For a pull the CRI front made for a client: where the client's own
    /// `ImageStatus` answer may offer the size (see [`SizeOffers`]).
    pub offers: Option<SizeOffers>,
    /// Tries again after a transient failure (`pull.transient_retries`).
    pub retries: Retries,
    /// The queue took the registry's token as it started the pull.
    pub registry_token: bool,
    /// Asks the queue whether anyone still waits on this pull, before a
    /// retry (`None`: someone always does).
    pub wanted: Option<(Recipient<StillWanted>, PullKey)>,
    /// Set by the queue to end the runtime call in flight with an error
    /// (a stalled download, `pull.stall_timeout`).
    pub stop: Arc<StopCall>,
}

/// Ends a pull's runtime call in flight with an error, from outside the
/// pull's task: the call is dropped (its stream reset, so the runtime
/// cancels it) and fails as [`StopCall::stop`] said. A call made after the
/// stop is not stopped: a retry gets its chance.
#[derive(Debug, Default)]
pub struct StopCall {
    /// Why the call in flight is to end, and when that call started.
    state: std::sync::Mutex<(Option<CriError>, Option<Instant>)>,
    told: tokio::sync::Notify,
}

impl StopCall {
    fn state(&self) -> std::sync::MutexGuard<'_, (Option<CriError>, Option<Instant>)> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Ends the call in flight with `why` (no call in flight: nothing).
    pub fn stop(&self, why: CriError) {
        self.state().0 = Some(why);
        self.told.notify_waiters();
    }

    /// How long the call in flight has run (`None`: none in flight), so
    /// that each call, a retry's too, gets the whole stall time.
    pub fn call_running_for(&self) -> Option<Duration> {
        self.state().1.map(|at| at.elapsed())
    }

    /// Runs `call` unless the queue stops it first.
    pub(super) async fn guard<T>(&self, call: impl Future<Output = Result<T, CriError>>) -> Result<T, CriError> {
        // A stop from before this call was for an earlier one.
        *self.state() = (None, Some(Instant::now()));
        let told = self.told.notified();
        let ended = tokio::select! {
            biased;
            r = call => r,
            () = told => Err(self.state().0.take().unwrap_or_else(|| CriError::new(CriErrorKind::Other, "pull stopped"))),
        };
        self.state().1 = None;
        ended
    }
}

/// Whether anyone still waits on the pull of this key (a retry is made
/// only for someone).
#[derive(Debug, actix::Message)]
#[rtype(result = "bool")]
pub struct StillWanted(pub PullKey);

/// Texts of failures that may pass by themselves, as containerd and Go's
/// network stack word them (lower case): the network, not the image or the
/// credentials. Docker Hub's `429 Too Many Requests` is not among them:
/// retrying sooner only prolongs the rate limit.
const TRANSIENT_TEXTS: [&str; 12] = [
    "connection reset",
    "connection refused",
    "broken pipe",
    "i/o timeout",
    "unexpected eof",
    "tls handshake timeout",
    "no route to host",
    "network is unreachable",
    "temporary failure in name resolution",
    "502 bad gateway",
    "503 service unavailable",
    "504 gateway timeout",
];

/// Texts that say the image, the credentials or a rate limit is at fault,
/// whatever network words come with them.
const REFUSED_TEXTS: [&str; 3] = ["denied", "not found", "unknown"];

/// Whether a runtime's error text is a registry's rate limit: HTTP 429 as
/// registries and containerd word it (a bare "429" also comes in digests
/// and port numbers).
pub(super) fn is_rate_limited(text: &str) -> bool {
    let text = text.to_ascii_lowercase();
    ["429 too many requests", "toomanyrequests", "status: 429", "status 429", "status code 429"]
        .iter()
        .any(|t| text.contains(t))
}

/// Whether a pull's failure may pass by itself, so making the same call
/// again soon may work: the runtime unreachable, the registry unreachable
/// (`RegistryUnavailable`), a call deadline of the runtime's, or a network
/// failure the runtime reports as text ([`TRANSIENT_TEXTS`]). Never an
/// image not found, credentials refused, a bad name or a rate limit.
pub(super) fn is_transient(e: &CriError) -> bool {
    match e.kind() {
        CriErrorKind::RuntimeUnavailable | CriErrorKind::RegistryUnavailable | CriErrorKind::DeadlineExceeded => true,
        CriErrorKind::Other => {
            let text = e.message().to_ascii_lowercase();
            !is_rate_limited(&text)
                && !REFUSED_TEXTS.iter().any(|t| text.contains(t))
                && TRANSIENT_TEXTS.iter().any(|t| text.contains(t))
        }
        _ => false,
    }
}

/// `pull.transient_retries` and `pull.transient_retry_delay`: how many
/// times a pull that failed transiently is made again, and the first wait
/// (doubled each time). `times` 0: never (the kubelet, which leaves it to
/// the pod's back-off).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retries {
    /// Times a pull is made again at most.
    pub times: u32,
    /// The wait before the first retry.
    pub delay: Duration,
}

impl Default for Retries {
    /// None, with the configuration's first wait (1s) should they be set.
    fn default() -> Self {
        Self { times: 0, delay: Duration::from_secs(1) }
    }
}

impl<R: PullRuntime> PullTask<R> {
    /// Runs the pull. `pulled` is awaited with the outcome once the image
    /// is pulled, before the size lookup: the waiters are answered and the
    /// next pull starts (its request goes out first), and this pull's
    /// lookup runs beside them; the outcome's [`ImageSize`] is set when it
    /// ends, and the outcome is returned for those who joined meanwhile.
    pub(super) async fn run(&self, pulled: impl AsyncFnOnce(PullOutcome)) -> PullResult {
        let result = self.pull(pulled).await;
        if let Err(f) = &result
            && !matches!(f, PullFailure::Stopped)
        {
            // Only a name that parses gives its registry: the CRI front
            // passes others on as sent, and text before a '/' may be a
            // user and password.
            let named = crate::domain::reference::parse_normalized_named(&self.progress.image);
            let registry = named.as_ref().map_or("invalid", |n| n.domain());
            self.metrics.pull_failed(registry, f.reason());
        }
        result
    }

    /// [`PullTask::run`] but for counting a failure.
    async fn pull(&self, pulled: impl AsyncFnOnce(PullOutcome)) -> PullResult {
        if self.recheck
            && let Some(present) = self.still_present().await
        {
            self.progress.phase(PullPhase::AlreadyPresent);
            return Ok(present);
        }
        self.take_token().await?;
        self.progress.phase(PullPhase::Pulling);
        let started = Instant::now();
        let (image_ref, credential, answer) = self.pull_retrying(started).await?;
        let (size, setter) = ImageSize::pending();
        let outcome = PullOutcome {
            image_ref,
            size,
            pull_duration: started.elapsed(),
            pulled: true,
            credential,
            answer,
            record_due: None,
        };
        // Waited for from before the client is answered: its next call may
        // be the ImageStatus that gives the size.
        let offer = self.offers.as_ref().map(|o| o.expect(&outcome.image_ref));
        pulled(outcome.clone()).await;
        // The waiters just answered run first: the lookup is no waiter's.
        tokio::task::yield_now().await;
        let offered = match offer {
            Some(wait) => wait.offered(OFFER_WAIT).await,
            None => None,
        };
        let bytes = match offered {
            Some(bytes) => bytes,
            None => self.size_of(&outcome.image_ref).await,
        };
        setter.set(bytes);
        Ok(outcome)
    }

    /// The pull, made again after a transient failure (every attempt's
    /// error [`is_transient`]) up to `retries.times` times, waiting
    /// `retries.delay` doubled each time, while the pull's deadline leaves
    /// room for the wait. A retry takes no throttle token: its wait spaces
    /// it.
    async fn pull_retrying(&self, started: Instant) -> Result<(String, Option<usize>, Option<Bytes>), PullFailure> {
        let mut delay = self.retries.delay;
        let mut attempt = 0;
        loop {
            let result = match &self.request.wire {
                Some(body) => self.pull_wire(body.clone(), started).await,
                None => self.pull_with_credentials(started).await.map(|(image_ref, c)| (image_ref, c, None)),
            };
            let errors = match result {
                Err(PullFailure::Cri(errors))
                    if attempt < self.retries.times && !errors.is_empty() && errors.iter().all(is_transient) =>
                {
                    errors
                }
                other => return other,
            };
            if self.deadline.is_some_and(|d| started.elapsed() + delay >= d) || !self.still_wanted().await {
                return Err(PullFailure::Cri(errors));
            }
            attempt += 1;
            self.metrics.pull_retried();
            let error = errors.last().map(ToString::to_string).unwrap_or_default();
            tracing::info!(
                image = self.progress.image,
                attempt,
                of = self.retries.times,
                delay_ms = crate::domain::limits::millis(delay),
                error,
                "pull failed transiently; trying again"
            );
            tokio::time::sleep(delay).await;
            delay = delay.saturating_mul(2);
            if !self.still_wanted().await {
                debug!(image = self.progress.image, "nobody waits on the pull any more; no retry");
                return Err(PullFailure::Cri(errors));
            }
        }
    }

    /// Whether anyone still waits on the pull (the queue says; a queue
    /// that cannot answer is stopping: nobody).
    async fn still_wanted(&self) -> bool {
        match &self.wanted {
            None => true,
            Some((queue, key)) => queue.send(StillWanted(key.clone())).await.unwrap_or(false),
        }
    }

    /// The re-check: the image found present (no pull to make), or `None`
    /// (absent, or the check failed: the pull itself will tell).
    async fn still_present(&self) -> Option<PullOutcome> {
        match self.runtime.status(self.request.image.clone()).await {
            Ok(s) => s.image.map(|img| PullOutcome {
                image_ref: img.id,
                size: ImageSize::known(img.size),
                pull_duration: Duration::ZERO,
                pulled: false,
                credential: None,
                answer: None,
                record_due: None,
            }),
            Err(e) => {
                debug!(image = self.progress.image, error = %e, "re-check before pulling failed; pulling");
                None
            }
        }
    }

    /// The registry's throttle token (when it has a rate of its own and
    /// the queue did not take it), then the node's: each at once, or after
    /// waiting for it (`Wait`, counted once per pull), or `QpsExceeded`
    /// (`Fail`; a registry without a token fails the pull before the
    /// node's is spent).
    async fn take_token(&self) -> Result<(), PullFailure> {
        let registry = super::registry_of(&self.progress.image);
        let mut waited = false;
        for of_registry in [true, false] {
            if of_registry && self.registry_token {
                continue;
            }
            loop {
                // A reload replaces the buckets: a waiter asks the new ones
                // then, not after the old one's wait.
                let replaced = self.throttle.replaced();
                let Err((wait, mode)) = self.throttle.acquire(of_registry.then_some(registry)) else { break };
                match mode {
                    ThrottleMode::Fail => {
                        self.metrics.throttle_rejected();
                        return Err(PullFailure::QpsExceeded);
                    }
                    ThrottleMode::Wait => {
                        if !waited {
                            waited = true;
                            self.metrics.throttle_waited();
                        }
                        self.progress.phase(PullPhase::Throttled);
                        tokio::select! {
                            biased;
                            () = replaced => {}
                            () = tokio::time::sleep(wait) => {}
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// `PullImage` with each credential in order (anonymous when there are
    /// none), each with what is left of the deadline, until one works: the
    /// image reference and the index of the credential used (`None` =
    /// anonymous). Every attempt failing gives all their errors.
    async fn pull_with_credentials(&self, started: Instant) -> Result<(String, Option<usize>), PullFailure> {
        let attempts: Vec<Option<AuthConfig>> = if self.request.credentials.is_empty() {
            vec![None]
        } else {
            self.request.credentials.iter().cloned().map(Some).collect()
        };
        let mut errors = Vec::new();
        for (index, auth) in attempts.into_iter().enumerate() {
            let with_credential = auth.is_some();
            let left = time_left(self.deadline, started.elapsed())?;
            let msg = PullImage {
                image: self.request.image.clone(),
                auth,
                sandbox: self.request.sandbox.clone(),
                deadline: left,
            };
            match self.stop.guard(self.runtime.pull(msg)).await {
                Ok(image_ref) => return Ok((image_ref, with_credential.then_some(index))),
                Err(e) => {
                    if let Some(failure) = deadline_passed(self.deadline, &e, started.elapsed()) {
                        return Err(failure);
                    }
                    errors.push(e);
                }
            }
        }
        Err(PullFailure::Cri(errors))
    }

    /// `PullImage` of the client's own request bytes (its one credential in
    /// them): the image reference, the credential's index (`Some(0)` when
    /// the request carries one) and the runtime's answer as it sent it.
    async fn pull_wire(
        &self,
        body: Bytes,
        started: Instant,
    ) -> Result<(String, Option<usize>, Option<Bytes>), PullFailure> {
        let left = time_left(self.deadline, started.elapsed())?;
        let answer = match self.stop.guard(self.runtime.pull_wire(&self.request.image.image, body, left)).await {
            Ok(a) => a,
            Err(e) => {
                return Err(
                    deadline_passed(self.deadline, &e, started.elapsed()).unwrap_or_else(|| PullFailure::Cri(vec![e]))
                );
            }
        };
        let image_ref = crate::cri::wire::peek::<crate::cri::proto::PullImageResponse>(&answer)
            .map(|r| r.image_ref)
            .unwrap_or_default();
        if image_ref.is_empty() {
            let e = CriError::new(CriErrorKind::InvalidResponse, "PullImage returned no image reference");
            return Err(PullFailure::Cri(vec![e]));
        }
        let credential = (!self.request.credentials.is_empty()).then_some(0);
        Ok((image_ref, credential, Some(answer)))
    }

    /// The pulled image's size; best effort, as the kubelet: a failed
    /// lookup reports 0.
    async fn size_of(&self, image_ref: &str) -> u64 {
        let spec = ImageSpec { image: image_ref.to_string(), ..self.request.image.clone() };
        match self.runtime.status(spec).await {
            Ok(s) => s.image.map_or(0, |i| i.size),
            Err(_) => 0,
        }
    }
}

#[cfg(test)]
mod tests;
