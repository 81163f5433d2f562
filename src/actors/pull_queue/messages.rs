//! Messages the pull queue receives and the types of its replies.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use actix::{Message, Recipient};
use tokio::sync::oneshot;

use crate::cri::{CriError, CriErrorKind};
use crate::domain::pull_record::ImagePullCredentials;
use crate::domain::{AuthConfig, ImageSpec, SandboxConfig};
use crate::pull_records::PullEnd;

/// One image pull to make (or to join).
#[derive(Clone)]
pub struct PullRequest {
    /// What to pull (image = the defaulted reference, runtime handler, annotations).
    pub image: ImageSpec,
    /// Credentials to try in order until one works; empty = anonymous.
    pub credentials: Vec<AuthConfig>,
    /// The pod sandbox the pull is for.
    pub sandbox: Option<SandboxConfig>,
    /// The pod the pull is for when no sandbox names one (an API ensure
    /// names its pod without a sandbox): what `ListPulls` shows of it.
    /// Never sent to the runtime.
    pub pod: Option<PullPod>,
    /// Higher pulls first; FIFO within a priority.
    pub priority: i32,
    /// When its turn comes, check the image is still absent before pulling
    /// (set for pulls made because the image was absent, not for `Always`
    /// nor for pulls that verify credentials). A request without it never
    /// joins a pull that has it, so it always reaches the registry.
    pub skip_if_present: bool,
    /// When the caller last saw the image absent (its own presence check).
    /// A check younger than one second spares the re-check, unless a pull
    /// of the same image finished since.
    pub absent_at: Option<tokio::time::Instant>,
    /// Overall deadline for this pull (overrides the queue's `pull_deadline`).
    pub deadline: Option<Duration>,
    /// A client's `PullImageRequest` as it sent it (a CRI front's call):
    /// the runtime gets these bytes, so fields imaged's proto does not know
    /// reach it, and the answer comes back as the runtime's bytes
    /// ([`PullOutcome::answer`]). `credentials` must then be the request's
    /// one `auth` (or none): it is what the pull is shared by.
    pub wire: Option<prost::bytes::Bytes>,
    /// Its requester writes a KEP-2535 pulled record when answered (an
    /// ensure's, a prefetch's, a CRI front's with records): the queue marks
    /// the record due ([`RecordsDue`](super::RecordsDue)) as it answers.
    pub records: bool,
}

/// Every field but the client's bytes, which hold its credential in
/// clear: their length only.
impl std::fmt::Debug for PullRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PullRequest")
            .field("image", &self.image)
            .field("credentials", &self.credentials)
            .field("sandbox", &self.sandbox)
            .field("pod", &self.pod)
            .field("priority", &self.priority)
            .field("skip_if_present", &self.skip_if_present)
            .field("absent_at", &self.absent_at)
            .field("deadline", &self.deadline)
            .field("wire", &self.wire.as_ref().map(|w| crate::cri::server::WireLen(w.len())))
            .field("records", &self.records)
            .finish()
    }
}

/// The pod a pull is for, as its sandbox's metadata names it: what
/// operators see of it (never its labels, annotations or credentials).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct PullPod {
    /// Pod namespace.
    pub namespace: String,
    /// Pod name.
    pub name: String,
    /// Pod UID.
    pub uid: String,
}

impl PullPod {
    /// The pod `sandbox` names; `None` without a sandbox or when it names
    /// no pod (empty name and UID).
    pub fn of(sandbox: Option<&SandboxConfig>) -> Option<Self> {
        sandbox.filter(|s| !(s.name.is_empty() && s.uid.is_empty())).map(|s| PullPod {
            namespace: s.namespace.clone(),
            name: s.name.clone(),
            uid: s.uid.clone(),
        })
    }
}

impl std::fmt::Display for PullPod {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

impl PullRequest {
    /// An anonymous pull of `image` at priority 0.
    pub fn new(image: ImageSpec) -> Self {
        Self {
            image,
            credentials: Vec::new(),
            sandbox: None,
            pod: None,
            priority: 0,
            skip_if_present: false,
            absent_at: None,
            deadline: None,
            wire: None,
            records: true,
        }
    }
}

/// A pull that ended well.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PullOutcome {
    /// Image reference (image id) the runtime returned.
    pub image_ref: String,
    /// Image size in bytes, from the `ImageStatus` that follows the pull:
    /// the waiters are answered when `PullImage` returns, and the lookup
    /// runs while they record the pull (see [`ImageSize`]).
    pub size: ImageSize,
    /// Time from the pull's start (after queueing and throttling) to the
    /// runtime's answer. The kubelet's `pullDuration` also holds its size
    /// lookup, which here runs beside the waiters' own work.
    pub pull_duration: Duration,
    /// False when the image turned out to be present when the pull's turn came.
    pub pulled: bool,
    /// Index in [`PullRequest::credentials`] of the credential the pull
    /// succeeded with; `None` when it pulled without credentials (or did
    /// not pull). Every waiter of a shared pull sent the same list.
    pub credential: Option<usize>,
    /// The runtime's `PullImageResponse` as it sent it, for a pull made
    /// from a client's bytes ([`PullRequest::wire`]).
    pub answer: Option<prost::bytes::Bytes>,
    /// This request's pulled record, due until dropped ([`super::RecordsDue`]):
    /// set by the queue for a request that records (not a CRI front's).
    pub record_due: Option<std::sync::Arc<super::RecordDue>>,
}

impl PullOutcome {
    /// How this outcome ends its pull's KEP-2535 records: pulled, a record
    /// of what `proves` (asked only then, of [`PullOutcome::credential`])
    /// says the credential that worked proves; found present, the intent
    /// ends.
    pub fn pull_end(&self, proves: impl FnOnce(Option<usize>) -> ImagePullCredentials) -> PullEnd {
        if self.pulled {
            PullEnd::Pulled { image_ref: self.image_ref.clone(), credentials: proves(self.credential) }
        } else {
            PullEnd::Ended
        }
    }
}

/// A pulled image's size in bytes, known once the `ImageStatus` after the
/// pull returns. Cloned to every waiter of the pull; [`ImageSize::bytes`]
/// waits for it. The lookup is best effort, as the kubelet's: a failed or
/// abandoned one gives 0.
///
/// Not a `tokio::sync::watch`: a watch spreads its receivers over several
/// notifiers picked at random, so waiters woken by one value run in an
/// order that differs from process to process, and the simulator's seeded
/// runs (their waiters' `Pulled` events) would not replay. A `Notify`
/// wakes its waiters in the order they came.
#[derive(Debug, Clone)]
pub struct ImageSize(Arc<SizeCell>);

#[derive(Default)]
struct SizeCell {
    value: std::sync::OnceLock<u64>,
    set: tokio::sync::Notify,
    /// What runs once the size is known ([`ImageSize::when_known`]), in
    /// the order it was handed in.
    then: std::sync::Mutex<Vec<SizeThen>>,
}

/// Work waiting for a size.
type SizeThen = Box<dyn FnOnce(u64) + Send>;

impl std::fmt::Debug for SizeCell {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SizeCell").field("value", &self.value.get()).finish_non_exhaustive()
    }
}

impl SizeCell {
    /// Sets the value (when unset), then runs what waited for it, in the
    /// order it came, and wakes the waiters.
    fn settle(&self, bytes: u64) {
        let _ = self.value.set(bytes);
        // Taken after the value is set: `when_known` looks at the value
        // under the lock, so each piece of work runs exactly once.
        let then = std::mem::take(&mut *self.then.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
        let v = self.value.get().copied().unwrap_or(bytes);
        for f in then {
            f(v);
        }
        self.set.notify_waiters();
    }
}

/// Sets an [`ImageSize`] (dropped unset: the size reads 0).
#[derive(Debug)]
pub(crate) struct SizeSetter(Arc<SizeCell>);

impl ImageSize {
    /// A size known already.
    pub fn known(bytes: u64) -> Self {
        let cell = SizeCell::default();
        let _ = cell.value.set(bytes);
        Self(Arc::new(cell))
    }

    /// A size to be looked up, and what sets it.
    pub(crate) fn pending() -> (Self, SizeSetter) {
        let cell = Arc::new(SizeCell::default());
        (Self(cell.clone()), SizeSetter(cell))
    }

    /// The size, once known (at once when it is).
    pub async fn bytes(&self) -> u64 {
        loop {
            let set = self.0.set.notified();
            tokio::pin!(set);
            // Registered before the value is read: a set between the two
            // still wakes this wait.
            set.as_mut().enable();
            if let Some(v) = self.0.value.get() {
                return *v;
            }
            set.await;
        }
    }

    /// The size if it is known by now.
    pub fn now(&self) -> Option<u64> {
        self.0.value.get().copied()
    }

    /// Runs `f` with the size: now when it is known, otherwise where it
    /// becomes known (by the pull task, as it sets it; 0 when the lookup
    /// fails or is abandoned), after the work handed in before. Nothing
    /// waits: an ensure answers its caller with the image reference, and
    /// its `Pulled` event, which names the size, follows the lookup.
    pub fn when_known(&self, f: impl FnOnce(u64) + Send + 'static) {
        let mut then = self.0.then.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        match self.0.value.get() {
            Some(v) => {
                drop(then);
                f(*v);
            }
            None => then.push(Box::new(f)),
        }
    }
}

/// Two sizes are equal when both are known and equal, or both unknown.
impl PartialEq for ImageSize {
    fn eq(&self, other: &Self) -> bool {
        self.now() == other.now()
    }
}

impl Eq for ImageSize {}

impl SizeSetter {
    /// Sets the size; every waiter's [`ImageSize::bytes`] returns it.
    pub(crate) fn set(self, bytes: u64) {
        self.0.settle(bytes);
        // `self` drops here: the size is set, its drop changes nothing.
    }
}

/// Set or dropped unset (the lookup failed or was abandoned: 0), what
/// waited runs and the waiters are woken, in the order they came.
impl Drop for SizeSetter {
    fn drop(&mut self) {
        self.0.settle(0);
    }
}

/// Why a pull did not produce an image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PullFailure {
    /// The runtime failed the pull (the last credential's error when one
    /// was tried, or the aggregate of several).
    Cri(Vec<CriError>),
    /// The throttle had no token and the mode is `fail`.
    QpsExceeded,
    /// The pull's overall deadline passed; the CRI call was cancelled.
    DeadlineExceeded(Duration),
    /// The pull queue stopped before the pull ended.
    Stopped,
}

impl PullFailure {
    /// True when the registry could not be reached (for the fallback policy).
    pub fn registry_unreachable(&self) -> bool {
        match self {
            PullFailure::Cri(errors) => {
                !errors.is_empty()
                    && errors.iter().all(|e| {
                        e.kind() == CriErrorKind::RegistryUnavailable
                            || (e.kind() == CriErrorKind::Other && is_connection_failure(e.message()))
                    })
            }
            _ => false,
        }
    }

    /// A short word for why the pull failed, for
    /// `imaged_pull_failures_total{reason}`: the runtime's error kind (of
    /// the last attempt) in snake case — a registry's rate limit
    /// (`429 Too Many Requests`, `toomanyrequests`) as `rate_limited`, a
    /// refusal worded `denied` or `insufficient_scope` as `unauthorized`, a
    /// network failure the runtime reports as text as `network` — or
    /// `qps_exceeded` (the
    /// throttle), `pull_deadline` (imaged's own deadline), `stopped`.
    pub fn reason(&self) -> &'static str {
        let e = match self {
            PullFailure::Cri(errors) => match errors.last() {
                Some(e) => e,
                None => return "other",
            },
            PullFailure::QpsExceeded => return "qps_exceeded",
            PullFailure::DeadlineExceeded(_) => return "pull_deadline",
            PullFailure::Stopped => return "stopped",
        };
        match e.kind() {
            CriErrorKind::NotFound => "not_found",
            CriErrorKind::RuntimeUnavailable => "runtime_unavailable",
            CriErrorKind::DeadlineExceeded => "deadline_exceeded",
            CriErrorKind::Unauthorized => "unauthorized",
            CriErrorKind::ResourceExhausted => "resource_exhausted",
            CriErrorKind::RegistryUnavailable => "registry_unavailable",
            CriErrorKind::SignatureValidationFailed => "signature_validation_failed",
            CriErrorKind::InvalidArgument => "invalid_argument",
            CriErrorKind::InvalidResponse => "invalid_response",
            CriErrorKind::Other => {
                let text = e.message().to_ascii_lowercase();
                if super::pull_task::is_rate_limited(&text) {
                    "rate_limited"
                } else if text.contains("denied") || text.contains("insufficient_scope") {
                    // Registries that word a refusal of their own (GHCR,
                    // ECR, Docker Hub) rather than answer 401 or 403.
                    "unauthorized"
                } else if super::pull_task::is_transient(e) {
                    "network"
                } else {
                    "other"
                }
            }
        }
    }

    /// True when the runtime may have pulled the image all the same (or
    /// may still): the reply was lost or cut short (a deadline, a dropped
    /// connection), or the queue stopped while the pull ran. False when the
    /// runtime answered with its own error, or nothing was asked of it.
    pub fn outcome_unknown(&self) -> bool {
        match self {
            PullFailure::Cri(errors) => errors
                .iter()
                .any(|e| matches!(e.kind(), CriErrorKind::DeadlineExceeded | CriErrorKind::RuntimeUnavailable)),
            PullFailure::DeadlineExceeded(_) | PullFailure::Stopped => true,
            PullFailure::QpsExceeded => false,
        }
    }

    /// How this failure ends its pull's KEP-2535 intent: kept while the
    /// runtime's outcome is unknown, ended otherwise.
    pub fn pull_end(&self) -> PullEnd {
        if self.outcome_unknown() { PullEnd::Unknown } else { PullEnd::Ended }
    }

    /// The CRI errors behind this failure.
    pub fn cri_errors(&self) -> &[CriError] {
        match self {
            PullFailure::Cri(e) => e,
            _ => &[],
        }
    }
}

/// Texts containerd uses when it cannot reach a registry at all.
fn is_connection_failure(message: &str) -> bool {
    [
        "connection refused",
        "no such host",
        "i/o timeout",
        "network is unreachable",
        "no route to host",
        "failed to do request",
    ]
    .iter()
    .any(|p| message.contains(p))
}

impl fmt::Display for PullFailure {
    /// The kubelet's text: a single error as is; several, de-duplicated, as `[e1, e2]`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PullFailure::Cri(errors) => {
                let mut texts: Vec<String> = Vec::new();
                for e in errors {
                    let t = e.to_string();
                    if !texts.contains(&t) {
                        texts.push(t);
                    }
                }
                match texts.as_slice() {
                    [] => f.write_str("image pull failed"),
                    [one] => f.write_str(one),
                    many => write!(f, "[{}]", many.join(", ")),
                }
            }
            PullFailure::QpsExceeded => f.write_str(super::throttle::QPS_EXCEEDED),
            PullFailure::DeadlineExceeded(d) => {
                write!(
                    f,
                    "image pull cancelled: it did not finish within its deadline of {}",
                    crate::domain::go_text::duration(*d)
                )
            }
            PullFailure::Stopped => f.write_str("image pull abandoned: the pull queue stopped"),
        }
    }
}

impl std::error::Error for PullFailure {}

/// What a pull ends with.
pub type PullResult = Result<PullOutcome, PullFailure>;

/// Proof of admission to the queue; await it for the pull's result.
pub struct PullTicket {
    /// True when the request joined a pull already queued or running.
    pub joined: bool,
    pub(super) rx: oneshot::Receiver<PullResult>,
}

impl fmt::Debug for PullTicket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PullTicket").field("joined", &self.joined).finish_non_exhaustive()
    }
}

impl Future for PullTicket {
    type Output = PullResult;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<PullResult> {
        Pin::new(&mut self.rx).poll(cx).map(|r| r.unwrap_or(Err(PullFailure::Stopped)))
    }
}

/// Queues a pull (or joins one). The reply comes when the request is
/// admitted: at once, unless the queue is full — then the sender waits, in
/// arrival order, until a queued pull starts (the kubelet's blocking channel).
#[derive(Debug, Message)]
#[rtype(result = "PullTicket")]
pub struct EnqueuePull(pub PullRequest);

/// What the queue holds now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueStatus {
    /// Pulls waiting to start.
    pub queued: usize,
    /// Pulls running.
    pub running: usize,
    /// Requests waiting for room in a full queue.
    pub parked: usize,
    /// Requests waiting on queued or running pulls.
    pub waiters: usize,
}

/// Replaces the registry pull throttle (a reload of `pull.registry_pull_qps`,
/// `registry_burst`, `throttle_mode` and the `[[pull.registries]]` rates):
/// full buckets of the new bursts at the new rates where a rate or burst
/// changed (unchanged buckets are kept), for every pull that takes a token
/// from now on (those waiting for one too).
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct UpdatePullThrottle {
    /// Pulls per second (0 = no throttle).
    pub qps: f64,
    /// Bucket size.
    pub burst: u32,
    /// What a pull does when no token is free.
    pub mode: super::ThrottleMode,
    /// Registries' own rates.
    pub registries: Vec<super::throttle::RegistryRate>,
}

/// Replaces the limits on pulls at once per registry (a reload of
/// `pull.max_parallel_pulls_per_registry` and the `[[pull.registries]]`
/// `max_parallel`): pulls running keep running; a registry's pulls start
/// while fewer than its new limit run (a raised limit starts waiting ones
/// at once). With any limit, `queue_capacity` bounds each registry's
/// waiting pulls from then on.
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct UpdateRegistryLimits {
    /// Every registry's limit (`None`: only the overall one).
    pub per_registry: Option<usize>,
    /// Registries' own limits, in place of `per_registry` for them.
    pub registries: std::collections::HashMap<String, usize>,
}

/// Replaces how many pulls run at once (a reload of
/// `pull.serialize_image_pulls` and `max_parallel_image_pulls`): pulls
/// running keep running; pulls start while fewer than the new limit run
/// (a raised limit starts waiting ones at once, a lowered one starts none
/// until enough have ended). `queue_capacity` is unchanged.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "()")]
pub struct UpdateConcurrency(pub super::Concurrency);

/// Replaces the pull deadline and the transient retries (a reload of
/// `pull.pull_deadline`, `transient_retries` and `transient_retry_delay`)
/// for the pulls that start from now on; pulls running keep theirs.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "()")]
pub struct UpdatePullLimits {
    /// A pull's overall deadline when its request sets none (`None`: none).
    pub deadline: Option<Duration>,
    /// Retries of a pull that failed transiently.
    pub retries: super::Retries,
}

/// Replaces the slow-pull and stall checks' settings (a reload of
/// `pull.slow_pull_warning`, `stall_warning`, `stall_timeout` and
/// `min_download_rate`): each check's timer follows its new time at once,
/// a check turned off stops, one turned on starts; the pulls running are
/// judged by the new settings from the next check on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Message)]
#[rtype(result = "()")]
pub struct UpdatePullWatch {
    /// See `PullQueueSettings::slow_pull_warning`.
    pub slow_pull_warning: Option<Duration>,
    /// See `PullQueueSettings::stall_warning`.
    pub stall_warning: Option<Duration>,
    /// See `PullQueueSettings::stall_timeout`.
    pub stall_timeout: Option<Duration>,
    /// See `PullQueueSettings::min_download_rate`.
    pub min_download_rate: u64,
}

/// Asks for the queue's [`QueueStatus`].
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "QueueStatus")]
pub struct GetQueueStatus;

/// Where a pull is, as [`ListPulls`] reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PullStage {
    /// Waiting for room in a full queue (1 = admitted first).
    Parked {
        /// Its place among the parked requests.
        position: usize,
    },
    /// Waiting for its turn (1 = starts next).
    Queued {
        /// Its place in the queue.
        position: usize,
    },
    /// Its turn came: checking that the image is still absent.
    Starting,
    /// Waiting for a throttle token (`throttle_mode = "wait"`).
    Throttled,
    /// The CRI pull is running.
    Pulling,
}

impl PullStage {
    /// Its name in the API and `imagectl pulls`.
    pub fn name(&self) -> &'static str {
        match self {
            PullStage::Parked { .. } => "parked",
            PullStage::Queued { .. } => "queued",
            PullStage::Starting => "starting",
            PullStage::Throttled => "throttled",
            PullStage::Pulling => "pulling",
        }
    }

    /// Its place in line, for a parked or queued pull.
    pub fn position(&self) -> Option<usize> {
        match self {
            PullStage::Parked { position } | PullStage::Queued { position } => Some(*position),
            _ => None,
        }
    }
}

/// One pull the queue holds (or one parked request), for operators: what
/// waits, what runs, for how long, and how many requests share it. Never
/// says which credentials a pull uses, only whether it uses any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PullInfo {
    /// The image (normalised reference).
    pub image: String,
    /// The runtime handler it is pulled for.
    pub runtime_handler: String,
    /// Where it is.
    pub stage: PullStage,
    /// Its priority (the first request's).
    pub priority: i32,
    /// Requests waiting on it: the first and every one that joined.
    pub waiters: usize,
    /// Since the first request for it arrived.
    pub waiting: Duration,
    /// Since its turn came (`None` while parked or queued).
    pub running: Option<Duration>,
    /// It tries credentials.
    pub with_credentials: bool,
    /// It must reach the registry (`Always`, credential verification):
    /// not skipped when the image turns out present.
    pub must_pull: bool,
    /// The pods its requests are for (those that named one), in arrival
    /// order, each once.
    pub pods: Vec<PullPod>,
}

/// Lists every pull the queue holds: running first (in start
/// order), then queued (in the order they will start), then parked.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "Vec<PullInfo>")]
pub struct ListPulls;

/// The downloads the stall check last found writing under
/// `pull.min_download_rate` (by ingest key, sorted; none without a floor or
/// while no pull runs): what a listing of the downloads, which keeps no
/// readings over time, cannot tell itself.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "Vec<String>")]
pub struct ListSlowDownloads;

/// The phase a request is in, for progress watchers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PullPhase {
    /// Waiting in the queue for its turn.
    Queued,
    /// Waiting for room in a full queue.
    Parked,
    /// Joined a pull of the same image already queued or running.
    WaitingOnSharedPull,
    /// Waiting for a throttle token.
    Throttled,
    /// The CRI pull is running.
    Pulling,
    /// A download of the running pull has stalled (`pull.stall_warning`);
    /// the pull goes on. Once per stall, and only when the download is
    /// surely this pull's (it is the one pull in the runtime's hands).
    Stalled,
    /// Found present when its turn came; no pull made.
    AlreadyPresent,
    /// Pulled.
    Done,
    /// Failed.
    Failed,
}

/// A pull changed phase.
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct PullPhaseChanged {
    /// Image being pulled.
    pub image: String,
    /// The new phase.
    pub phase: PullPhase,
    /// The pod of the request the phase is about, when it named one: the
    /// arriving request's for `Queued`, `Parked` and `WaitingOnSharedPull`;
    /// the request that started the pull's for the pull's own phases
    /// (`Throttled` … `Failed`).
    pub pod: Option<PullPod>,
}

/// Subscribes a recipient to phase changes (delivered with `try_send`; a
/// full subscriber mailbox loses the event, never blocks the queue).
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct SubscribePhases(pub Recipient<PullPhaseChanged>);

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "current_thread")]
    async fn a_size_wakes_its_waiters_in_the_order_they_came() {
        // A watch woke them in an order drawn at random per process; the
        // simulator's replays need the order they began to wait.
        let (size, setter) = ImageSize::pending();
        let order = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
        let local = tokio::task::LocalSet::new();
        local
            .run_until(async {
                let tasks: Vec<_> = (0..16)
                    .map(|i| {
                        let (size, order) = (size.clone(), order.clone());
                        tokio::task::spawn_local(async move {
                            let bytes = size.bytes().await;
                            order.borrow_mut().push((i, bytes));
                        })
                    })
                    .collect();
                tokio::task::yield_now().await;
                assert_eq!(size.now(), None);
                setter.set(42);
                for t in tasks {
                    t.await.unwrap();
                }
            })
            .await;
        assert_eq!(*order.borrow(), (0..16).map(|i| (i, 42)).collect::<Vec<_>>());
        assert_eq!(size.now(), Some(42));
        assert_eq!(size.bytes().await, 42, "a late waiter reads it at once");
    }

    #[tokio::test]
    async fn a_size_dropped_unset_reads_zero() {
        let (size, setter) = ImageSize::pending();
        let waiting = tokio::spawn({
            let size = size.clone();
            async move { size.bytes().await }
        });
        tokio::task::yield_now().await;
        drop(setter);
        assert_eq!(waiting.await.unwrap(), 0);
        assert_eq!(ImageSize::known(7).bytes().await, 7);
    }

    #[test]
    fn work_waiting_for_a_size_runs_once_in_the_order_it_came_when_set_or_dropped() {
        let ran = Arc::new(std::sync::Mutex::new(Vec::new()));
        let note = |tag: &'static str| {
            let ran = ran.clone();
            move |bytes: u64| ran.lock().unwrap().push((tag, bytes))
        };
        let (size, setter) = ImageSize::pending();
        size.when_known(note("first"));
        size.clone().when_known(note("second"));
        assert!(ran.lock().unwrap().is_empty(), "nothing runs before the size is known");
        setter.set(42);
        size.when_known(note("late"));
        assert_eq!(*ran.lock().unwrap(), [("first", 42), ("second", 42), ("late", 42)]);

        // A lookup abandoned: the work runs with 0, once.
        ran.lock().unwrap().clear();
        let (size, setter) = ImageSize::pending();
        size.when_known(note("abandoned"));
        drop(setter);
        assert_eq!(*ran.lock().unwrap(), [("abandoned", 0)]);
        ImageSize::known(7).when_known(note("known"));
        assert_eq!(*ran.lock().unwrap(), [("abandoned", 0), ("known", 7)]);
    }

    #[test]
    fn a_pull_outcome_is_unknown_only_when_the_runtime_may_have_pulled() {
        let err = |kind| PullFailure::Cri(vec![CriError::new(kind, "x")]);
        assert!(PullFailure::DeadlineExceeded(Duration::from_secs(1)).outcome_unknown());
        assert!(PullFailure::Stopped.outcome_unknown());
        assert!(err(CriErrorKind::DeadlineExceeded).outcome_unknown());
        assert!(err(CriErrorKind::RuntimeUnavailable).outcome_unknown());
        assert!(!PullFailure::QpsExceeded.outcome_unknown());
        assert!(!err(CriErrorKind::RegistryUnavailable).outcome_unknown());
        assert!(!err(CriErrorKind::Other).outcome_unknown());
        assert!(!PullFailure::Cri(Vec::new()).outcome_unknown());
    }
}
