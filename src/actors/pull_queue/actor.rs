//! `PullQueueActor`: admits pull requests, orders and merges them
//! ([`PullQueue`]), runs them through the CRI gateway under the
//! concurrency limit, the throttle and the deadline, and answers every waiter.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use actix::prelude::*;
use tokio::sync::oneshot;
use tokio::time::Instant;
use tracing::{debug, warn};

use super::messages::*;
use super::queue::{Concurrency, Place, PullKey, PullQueue, Submitted};
use super::throttle::{PullThrottle, ThrottleMode};
use crate::actors::cri_gateway::{CriReader, PullImage};
use crate::cri::CriErrorKind;
use crate::domain::{AuthConfig, ImageSpec};
use crate::metrics::Metrics;

/// The pull queue's settings (validated; see `config::PullConfig`).
#[derive(Debug, Clone, PartialEq)]
pub struct PullQueueConfig {
    /// Serial, or parallel with an optional limit.
    pub concurrency: Concurrency,
    /// Most pulls from one registry running at once (`None` = no such
    /// limit, as the kubelet). A registry at its limit does not hold up
    /// pulls from other registries.
    pub registry_limit: Option<usize>,
    /// Pulls that may wait to start before senders wait (10 in serial mode,
    /// like the kubelet; `None` = unbounded).
    pub capacity: Option<usize>,
    /// Merge requests for the same image, handler and credentials.
    pub single_flight: bool,
    /// `registry_pull_qps` (0 = no throttle).
    pub qps: f64,
    /// `registry_burst`.
    pub burst: u32,
    /// What a pull does when the throttle has no token.
    pub throttle_mode: ThrottleMode,
    /// Overall deadline of one pull, from its start (None = none).
    pub pull_deadline: Option<Duration>,
    /// Warn (once per pull) when a pull is still running this long after
    /// its start while other pulls wait behind it (None = never).
    pub slow_pull_warning: Option<Duration>,
    /// Where the queue reports its depths, joins and throttling (and the
    /// ensure flow started with [`ImageManager::start`](crate::ensure::ImageManager::start)
    /// its requests and pull durations).
    pub metrics: Metrics,
}

impl Default for PullQueueConfig {
    fn default() -> Self {
        Self {
            concurrency: Concurrency::Serial,
            registry_limit: None,
            capacity: Some(10),
            single_flight: true,
            qps: 5.0,
            burst: 10,
            throttle_mode: ThrottleMode::Fail,
            pull_deadline: None,
            slow_pull_warning: Some(DEFAULT_SLOW_PULL_WARNING),
            metrics: Metrics::default(),
        }
    }
}

/// `pull.slow_pull_warning` by default.
pub const DEFAULT_SLOW_PULL_WARNING: Duration = Duration::from_secs(60);

struct Waiter {
    result: oneshot::Sender<PullResult>,
    /// Set while the request is parked: told when it is admitted (and whether it joined).
    admitted: Option<oneshot::Sender<bool>>,
    /// When the request arrived.
    since: Instant,
}

/// A running pull's stage, set by its task (see [`Progress`]).
#[derive(Debug, Default)]
struct StageCell(AtomicU8);

impl StageCell {
    const STAGES: [PullStage; 4] =
        [PullStage::Starting, PullStage::Throttled, PullStage::Pulling, PullStage::Finishing];

    fn set(&self, stage: PullStage) {
        if let Some(i) = Self::STAGES.iter().position(|s| *s == stage) {
            self.0.store(i as u8, Ordering::Relaxed);
        }
    }

    fn get(&self) -> PullStage {
        Self::STAGES.get(usize::from(self.0.load(Ordering::Relaxed))).copied().unwrap_or(PullStage::Starting)
    }
}

/// A pull that started: when, its stage, and whether it was warned slow.
struct Started {
    at: Instant,
    stage: Arc<StageCell>,
    warned: bool,
}

/// How a pull task reports its progress: phases to subscribers, and the
/// stage [`ListPulls`] shows.
struct Progress<'a> {
    /// The image as the queue's key names it (normalised).
    image: &'a str,
    subscribers: &'a [Recipient<PullPhaseChanged>],
    stage: &'a StageCell,
}

impl Progress<'_> {
    fn phase(&self, phase: PullPhase) {
        match phase {
            PullPhase::Throttled => self.stage.set(PullStage::Throttled),
            PullPhase::Pulling => self.stage.set(PullStage::Pulling),
            _ => {}
        }
        PullQueueActor::publish(self.subscribers, self.image, phase);
    }
}

/// Self-notification: a pull's CRI call succeeded (its slot can go to the
/// next pull while the size lookup runs).
#[derive(Message)]
#[rtype(result = "()")]
struct SlotFreed {
    key: PullKey,
    /// Answered once the next pull's task is spawned.
    done: oneshot::Sender<()>,
}

/// Self-notification, from the slow-pull timer: warn of pulls running past `after`.
#[derive(Message)]
#[rtype(result = "()")]
struct CheckSlowPulls {
    after: Duration,
}

/// Self-notification: a pull task ended.
#[derive(Message)]
#[rtype(result = "()")]
struct PullFinished {
    key: PullKey,
    result: PullResult,
}

/// The pull queue actor. See `actors.md`.
pub struct PullQueueActor {
    cfg: PullQueueConfig,
    queue: PullQueue<PullRequest, Waiter>,
    /// Presence re-checks and size lookups, on the pull's own task.
    reader: CriReader,
    throttle: Arc<PullThrottle>,
    subscribers: Vec<Recipient<PullPhaseChanged>>,
    /// When pulls of each image last finished well (recent ones only): a
    /// request whose presence check predates one must re-check.
    finished: HashMap<String, Instant>,
    /// The pulls that started and have not finished.
    started: HashMap<PullKey, Started>,
}

/// Bounds of the slow-pull check's period (a quarter of the warning time).
const SLOW_CHECK_MIN: Duration = Duration::from_millis(50);
const SLOW_CHECK_MAX: Duration = Duration::from_secs(15);

/// How fresh a caller's presence check must be to spare the re-check.
const RECHECK_WINDOW: Duration = Duration::from_secs(1);

impl PullQueueActor {
    /// A queue that pulls and looks images up through the gateway's direct
    /// handle (`reader`, from [`GetReader`](crate::actors::cri_gateway::GetReader)).
    pub fn new(cfg: PullQueueConfig, reader: CriReader) -> Self {
        Self {
            reader,
            queue: PullQueue::new(cfg.concurrency, cfg.capacity, cfg.single_flight)
                .with_registry_limit(cfg.registry_limit),
            throttle: Arc::new(PullThrottle::new(cfg.qps, cfg.burst, cfg.throttle_mode)),
            cfg,
            subscribers: Vec::new(),
            finished: HashMap::new(),
            started: HashMap::new(),
        }
    }

    fn publish(subscribers: &[Recipient<PullPhaseChanged>], image: &str, phase: PullPhase) {
        for s in subscribers {
            if s.try_send(PullPhaseChanged { image: image.to_string(), phase }).is_err() {
                debug!(image, ?phase, "a phase subscriber is full or gone; event dropped");
            }
        }
    }

    /// Starts every pull a slot allows, admitting parked requests as room frees.
    fn pump(&mut self, ctx: &mut Context<Self>) {
        loop {
            while let Some((key, request)) = self.queue.start_next() {
                self.spawn_pull(key, request, ctx);
            }
            let subscribers = &self.subscribers;
            let metrics = &self.cfg.metrics;
            let admitted = self.queue.admit_parked(|key, how, w| {
                if let Some(tx) = w.admitted.take() {
                    let _ = tx.send(how == Submitted::Joined);
                }
                if how == Submitted::Joined {
                    metrics.single_flight_joined();
                }
                let phase = if how == Submitted::Joined { PullPhase::WaitingOnSharedPull } else { PullPhase::Queued };
                Self::publish(subscribers, &key.image, phase);
            });
            // (With a registry limit, a slot may stay free while every
            // queued pull's registry is at its limit: admitting more can
            // still fill it, from another registry.)
            if admitted.is_empty() || self.queue.running() >= self.cfg.concurrency.limit() {
                break;
            }
        }
        self.report_depths();
    }

    /// Warns once for each pull running past `after` while other pulls
    /// wait (queued or parked); a finishing pull (its slot free) blocks nobody.
    fn warn_slow(&mut self, after: Duration) {
        let waiting = self.queue.queued() + self.queue.parked();
        if waiting == 0 {
            return;
        }
        let now = Instant::now();
        for (key, s) in &mut self.started {
            let running = now.saturating_duration_since(s.at);
            if s.warned || running < after || s.stage.get() == PullStage::Finishing {
                continue;
            }
            s.warned = true;
            self.cfg.metrics.slow_pull_blocking();
            let running = crate::domain::go_text::duration(Duration::from_millis(
                u64::try_from(running.as_millis()).unwrap_or(u64::MAX),
            ));
            warn!(
                image = %key.image,
                stage = s.stage.get().name(),
                %running,
                waiting,
                "pull of {:?} still running after {running} while {waiting} other pull(s) wait; \
                 `imagectl pulls` lists them (pull.slow_pull_warning)",
                key.image
            );
        }
    }

    /// Publishes the queue's depths (after every change: each goes through `pump`).
    fn report_depths(&self) {
        self.cfg.metrics.set_pull_queue(self.queue.queued(), self.queue.parked(), self.queue.running());
    }

    fn spawn_pull(&mut self, key: PullKey, request: PullRequest, ctx: &mut Context<Self>) {
        let me = ctx.address();
        let reader = self.reader.clone();
        let throttle = self.throttle.clone();
        let deadline = request.deadline.or(self.cfg.pull_deadline);
        let recheck = request.skip_if_present
            && match request.absent_at {
                None => true,
                Some(t) => t.elapsed() > RECHECK_WINDOW || self.finished.get(&key.image).is_some_and(|f| *f >= t),
            };
        let subscribers = self.subscribers.clone();
        let metrics = self.cfg.metrics.clone();
        let stage = Arc::new(StageCell::default());
        self.started.insert(key.clone(), Started { at: Instant::now(), stage: stage.clone(), warned: false });
        // A task of its own (not ctx.spawn): actix polls every context future
        // on each wake-up, which would make many parallel pulls quadratic.
        actix::spawn(async move {
            let freed = {
                let (me, key) = (me.clone(), key.clone());
                // Awaited: the next pull's task is spawned when this returns,
                // so its PullImage goes out before this pull's size lookup.
                // do_send: never held back by a full mailbox.
                move || async move {
                    let (done, started) = oneshot::channel();
                    me.do_send(SlotFreed { key, done });
                    let _ = started.await;
                }
            };
            let progress = Progress { image: &key.image, subscribers: &subscribers, stage: &stage };
            let result = run_pull(&reader, &throttle, request, recheck, deadline, &progress, &metrics, freed).await;
            let phase = if result.is_ok() { PullPhase::Done } else { PullPhase::Failed };
            Self::publish(&subscribers, &key.image, phase);
            me.do_send(PullFinished { key, result });
        });
    }
}

/// The normalised reference (so `busybox` and `docker.io/library/busybox:latest`
/// share a pull), or the text as given when it does not parse.
fn normalized_or_raw(image: &str) -> String {
    crate::domain::reference::parse_normalized_named(image).map_or_else(|_| image.to_string(), |n| n.docker_ref())
}

// One pull's whole context, passed once from `spawn_pull`.
#[allow(clippy::too_many_arguments)]
async fn run_pull(
    reader: &CriReader,
    throttle: &PullThrottle,
    request: PullRequest,
    recheck: bool,
    deadline: Option<Duration>,
    progress: &Progress<'_>,
    metrics: &Metrics,
    slot_freed: impl AsyncFnOnce(),
) -> PullResult {
    let image = progress.image;
    if recheck {
        match reader.image_status(request.image.clone(), false).await {
            Ok(s) => {
                if let Some(img) = s.image {
                    progress.phase(PullPhase::AlreadyPresent);
                    return Ok(PullOutcome {
                        image_ref: img.id,
                        size: img.size,
                        pull_duration: Duration::ZERO,
                        pulled: false,
                        credential: None,
                    });
                }
            }
            // An inspect error here is not fatal: the pull itself will tell.
            Err(e) => debug!(image, error = %e, "re-check before pulling failed; pulling"),
        }
    }
    let mut waited = false;
    loop {
        match throttle.try_acquire() {
            Ok(()) => break,
            Err(wait) => match throttle.mode() {
                ThrottleMode::Fail => {
                    metrics.throttle_rejected();
                    return Err(PullFailure::QpsExceeded);
                }
                ThrottleMode::Wait => {
                    if !waited {
                        waited = true;
                        metrics.throttle_waited();
                    }
                    progress.phase(PullPhase::Throttled);
                    tokio::time::sleep(wait).await;
                }
            },
        }
    }
    progress.phase(PullPhase::Pulling);
    let started = Instant::now();
    let attempts: Vec<Option<AuthConfig>> = if request.credentials.is_empty() {
        vec![None]
    } else {
        request.credentials.iter().cloned().map(Some).collect()
    };
    let mut errors = Vec::new();
    let mut image_ref = None;
    let mut used = None;
    for (index, auth) in attempts.into_iter().enumerate() {
        let with_credential = auth.is_some();
        let left = match deadline {
            Some(d) => match d.checked_sub(started.elapsed()) {
                Some(left) if !left.is_zero() => Some(left),
                _ => return Err(PullFailure::DeadlineExceeded(d)),
            },
            None => None,
        };
        let msg = PullImage { image: request.image.clone(), auth, sandbox: request.sandbox.clone(), deadline: left };
        // Through the gateway's direct handle: one task hop less per pull
        // than the mailbox (the next pull of a wave starts that much sooner).
        match reader.pull_image(msg).await {
            Ok(r) => {
                image_ref = Some(r);
                used = with_credential.then_some(index);
                break;
            }
            Err(e) => {
                if let Some(d) = deadline
                    && e.kind() == CriErrorKind::DeadlineExceeded
                    && started.elapsed() >= d
                {
                    return Err(PullFailure::DeadlineExceeded(d));
                }
                errors.push(e);
            }
        }
    }
    let Some(image_ref) = image_ref else { return Err(PullFailure::Cri(errors)) };
    // The registry work is done: the next pull starts (its request goes out
    // first) and this pull's size lookup runs beside it.
    slot_freed().await;
    // Best effort, as the kubelet: a failed lookup reports size 0.
    let spec = ImageSpec { image: image_ref.clone(), ..request.image.clone() };
    let size = match reader.image_status(spec, false).await {
        Ok(s) => s.image.map_or(0, |i| i.size),
        Err(_) => 0,
    };
    Ok(PullOutcome { image_ref, size, pull_duration: started.elapsed(), pulled: true, credential: used })
}

impl Actor for PullQueueActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        // Not the queue's bound: actix's send never waits for room in a full
        // mailbox (actors.md, System). The bound is the admission in
        // `PullQueue`: a request that finds the queue full is parked and its
        // sender's send() resolves when it is admitted.
        ctx.set_mailbox_capacity(self.cfg.capacity.unwrap_or(1024).max(1));
        if let Some(after) = self.cfg.slow_pull_warning {
            // One timer for every pull, on a task of its own: a timer in the
            // actor's context would be polled on every wake-up of the actor
            // (it measurably slowed the ensure bench's makespan). It holds a
            // weak address, so it never keeps the actor alive.
            let tick = (after / 4).clamp(SLOW_CHECK_MIN, SLOW_CHECK_MAX);
            let me = ctx.address().downgrade();
            actix::spawn(async move {
                let mut every = tokio::time::interval_at(Instant::now() + tick, tick);
                every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    every.tick().await;
                    let Some(queue) = me.upgrade() else { break };
                    // A freshly upgraded address is never refused as full;
                    // a closed mailbox ends the timer.
                    if let Err(actix::dev::SendError::Closed(_)) = queue.try_send(CheckSlowPulls { after }) {
                        break;
                    }
                }
            });
        }
    }

    fn stopped(&mut self, _ctx: &mut Self::Context) {
        // Its pulls are abandoned: nothing is queued or running any more.
        self.cfg.metrics.set_pull_queue(0, 0, 0);
        let status = (self.queue.queued(), self.queue.running(), self.queue.parked());
        if status != (0, 0, 0) {
            warn!(
                queued = status.0,
                running = status.1,
                parked = status.2,
                "pull queue stopped with pulls pending; their waiters get PullFailure::Stopped"
            );
        }
    }
}

// === impl Handler ===

impl Handler<EnqueuePull> for PullQueueActor {
    type Result = ResponseFuture<PullTicket>;

    /// Queues or joins a pull; replies once admitted.
    fn handle(&mut self, EnqueuePull(request): EnqueuePull, ctx: &mut Self::Context) -> Self::Result {
        // A pull that must reach the registry (Always, credential
        // verification) never joins one that may be skipped when the image
        // turns out present: its key differs.
        let key = PullKey::new(
            normalized_or_raw(&request.image.image),
            request.image.runtime_handler.clone(),
            AuthConfig::list_identity(&request.credentials),
            !request.skip_if_present,
        );
        let (tx, rx) = oneshot::channel();
        let (admitted_tx, admitted_rx) = oneshot::channel();
        let image = key.image.clone();
        let waiter = Waiter { result: tx, admitted: Some(admitted_tx), since: Instant::now() };
        let how = self.queue.submit(key, request.priority, request, waiter);
        if how == Submitted::Joined {
            self.cfg.metrics.single_flight_joined();
        }
        let phase = match how {
            Submitted::Joined => PullPhase::WaitingOnSharedPull,
            Submitted::Queued => PullPhase::Queued,
            Submitted::Parked => PullPhase::Parked,
        };
        Self::publish(&self.subscribers, &image, phase);
        self.pump(ctx);
        // The reply is the admission; the ticket it carries is awaited later
        // for the result, on purpose.
        #[allow(clippy::async_yields_async)]
        Box::pin(async move {
            let joined = match how {
                Submitted::Joined => true,
                Submitted::Queued => false,
                // Waits here, in arrival order, until a slot frees.
                Submitted::Parked => admitted_rx.await.unwrap_or(false),
            };
            PullTicket { joined, rx }
        })
    }
}

impl Handler<SlotFreed> for PullQueueActor {
    type Result = ();

    /// A pull's CRI call ended: start the next pull.
    fn handle(&mut self, m: SlotFreed, ctx: &mut Self::Context) {
        // The image is in the runtime now (the slot is freed only after a
        // successful PullImage): requests checked before must re-check.
        let now = Instant::now();
        if self.finished.len() >= 4096 {
            self.finished.retain(|_, t| now.duration_since(*t) <= RECHECK_WINDOW);
        }
        self.finished.insert(m.key.image.clone(), now);
        if let Some(s) = self.started.get(&m.key) {
            s.stage.set(PullStage::Finishing);
        }
        self.queue.release_slot(&m.key);
        self.pump(ctx);
        let _ = m.done.send(());
    }
}

impl Handler<PullFinished> for PullQueueActor {
    type Result = ();

    /// A pull ended: answer everyone who waited on it and start the next.
    fn handle(&mut self, m: PullFinished, ctx: &mut Self::Context) {
        self.started.remove(&m.key);
        for w in self.queue.finish(&m.key) {
            let _ = w.result.send(m.result.clone());
        }
        self.pump(ctx);
    }
}

impl Handler<GetQueueStatus> for PullQueueActor {
    type Result = MessageResult<GetQueueStatus>;

    /// Reports the queue's depths.
    fn handle(&mut self, _: GetQueueStatus, _: &mut Self::Context) -> Self::Result {
        MessageResult(QueueStatus {
            queued: self.queue.queued(),
            running: self.queue.running(),
            parked: self.queue.parked(),
            waiters: self.queue.waiters(),
        })
    }
}

impl Handler<CheckSlowPulls> for PullQueueActor {
    type Result = ();

    /// Warns of pulls running past the warning time while others wait.
    fn handle(&mut self, m: CheckSlowPulls, _: &mut Self::Context) {
        self.warn_slow(m.after);
    }
}

impl Handler<ListPulls> for PullQueueActor {
    type Result = MessageResult<ListPulls>;

    /// Lists the pulls held (see [`ListPulls`]).
    fn handle(&mut self, _: ListPulls, _: &mut Self::Context) -> Self::Result {
        let now = Instant::now();
        let pulls = self
            .queue
            .snapshot()
            .into_iter()
            .map(|v| {
                let started = self.started.get(v.key);
                let stage = match v.place {
                    Place::Parked(position) => PullStage::Parked { position },
                    Place::Queued(position) => PullStage::Queued { position },
                    Place::Finishing => PullStage::Finishing,
                    Place::Running => started.map_or(PullStage::Starting, |s| s.stage.get()),
                };
                let first = v.waiters.iter().map(|w| w.since).min().unwrap_or(now);
                PullInfo {
                    image: v.key.image.clone(),
                    runtime_handler: v.key.runtime_handler.clone(),
                    stage,
                    priority: v.priority,
                    waiters: v.waiters.len(),
                    waiting: now.saturating_duration_since(first),
                    running: started.map(|s| now.saturating_duration_since(s.at)),
                    with_credentials: v.key.with_credentials(),
                    must_pull: v.key.must_pull(),
                }
            })
            .collect();
        MessageResult(pulls)
    }
}

impl Handler<SubscribePhases> for PullQueueActor {
    type Result = ();

    /// Adds a phase subscriber.
    fn handle(&mut self, m: SubscribePhases, _: &mut Self::Context) {
        self.subscribers.push(m.0);
    }
}
