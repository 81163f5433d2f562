//! `PullQueueActor`: admits pull requests, orders and merges them
//! ([`PullQueue`]), runs them through the CRI gateway under the
//! concurrency limit, the throttle and the deadline, and answers every waiter.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use tokio::sync::oneshot;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::messages::*;
use super::pull_task::{self, Progress, PullTask, RECHECK_WINDOW, Retries, StageCell, StopCall};
use super::queue::{Concurrency, Place, PullKey, PullQueue, Submitted};
use super::records_due::RecordsDue;
use super::size_offers::SizeOffers;
use super::stalls::StallWatch;
use super::throttle::{PullThrottle, RegistryRate, ThrottleMode};
use crate::actors::cri_gateway::CriReader;
use crate::domain::AuthConfig;
use crate::metrics::Metrics;

/// The pull queue's settings (validated from `[pull]` by `config`).
#[derive(Debug, Clone, PartialEq)]
pub struct PullQueueSettings {
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
    /// Registries' own rates (`[[pull.registries]]` `qps`, `burst`), under
    /// the node's.
    pub registry_rates: Vec<RegistryRate>,
    /// Registries' own limits on pulls at once (`[[pull.registries]]`
    /// `max_parallel`), in place of `registry_limit` for them.
    pub registry_limits: HashMap<String, usize>,
    /// What a pull does when the throttle has no token.
    pub throttle_mode: ThrottleMode,
    /// Overall deadline of one pull, from its start (None = none).
    pub pull_deadline: Option<Duration>,
    /// A pull that failed transiently is made again (`pull.transient_retries`,
    /// `transient_retry_delay`; none by default, as the kubelet).
    pub retries: Retries,
    /// Warn (once per pull) when a pull is still running this long after
    /// its start while other pulls wait behind it (None = never).
    pub slow_pull_warning: Option<Duration>,
    /// Warn (once per download) when a download of the runtime's has not
    /// moved for this long while a pull runs (None = never; the runtime
    /// must list its downloads, as containerd does).
    pub stall_warning: Option<Duration>,
    /// End a pull's runtime call when a download has not moved for this
    /// long while it is the one pull in the runtime's hands (None = never,
    /// the default). It fails as the registry being unavailable, so
    /// `transient_retries` and the pod's back-off take it from there.
    pub stall_timeout: Option<Duration>,
    /// The floor, in bytes a second, below which a moving download counts
    /// as stalled too, measured over each of the two times above (0 = none,
    /// the default: only a download that writes no byte stalls).
    pub min_download_rate: u64,
    /// Where the queue reports its depths, joins and throttling (and, as
    /// `node::Node` wires it, the ensure flow its requests and pull durations).
    pub metrics: Metrics,
    /// Sizes the CRI front offers its pulls (shared with the front).
    pub size_offers: SizeOffers,
    /// The records due of pulls answered (shared with the ensure flow).
    pub records_due: RecordsDue,
}

impl Default for PullQueueSettings {
    fn default() -> Self {
        Self {
            concurrency: Concurrency::Serial,
            registry_limit: None,
            capacity: Some(10),
            single_flight: true,
            qps: 5.0,
            burst: 10,
            registry_rates: Vec::new(),
            registry_limits: HashMap::new(),
            throttle_mode: ThrottleMode::Fail,
            pull_deadline: None,
            retries: Retries::default(),
            slow_pull_warning: Some(DEFAULT_SLOW_PULL_WARNING),
            stall_warning: Some(DEFAULT_STALL_WARNING),
            stall_timeout: None,
            min_download_rate: 0,
            metrics: Metrics::default(),
            size_offers: SizeOffers::default(),
            records_due: RecordsDue::default(),
        }
    }
}

/// `pull.slow_pull_warning` by default.
pub const DEFAULT_SLOW_PULL_WARNING: Duration = Duration::from_secs(60);

/// `pull.stall_warning` by default: the dockershim's
/// `--image-pull-progress-deadline` (a pull with no progress for 1m).
pub const DEFAULT_STALL_WARNING: Duration = Duration::from_secs(60);

struct Waiter {
    result: oneshot::Sender<PullResult>,
    /// Set while the request is parked: told when it is admitted (and whether it joined).
    admitted: Option<oneshot::Sender<bool>>,
    /// When the request arrived.
    since: Instant,
    /// The pod it is for, when it named one.
    pod: Option<PullPod>,
    /// It writes a pulled record when answered (`PullRequest::records`).
    records: bool,
}

/// A pull that started: when, its stage, and whether it was warned slow.
struct Started {
    at: Instant,
    /// `at` on the wall clock, to compare with the runtime's download times.
    since: std::time::SystemTime,
    stage: Arc<StageCell>,
    warned: bool,
    /// Ends its runtime call in flight (`pull.stall_timeout`).
    stop: Arc<StopCall>,
    /// The pod its phases name (as its task's).
    pod: Option<PullPod>,
}

/// Self-notification: a pull's CRI call succeeded. The pull ends for the
/// queue: its waiters are answered and its slot goes to the next pull,
/// while its task looks up the size.
#[derive(Message)]
#[rtype(result = "()")]
struct PullSucceeded {
    key: PullKey,
    outcome: PullOutcome,
    /// Answered once the next pull's task is spawned.
    done: oneshot::Sender<()>,
}

/// Self-notification, from the slow-pull timer: warn of pulls running
/// past `pull.slow_pull_warning`.
#[derive(Message)]
#[rtype(result = "()")]
struct CheckSlowPulls;

/// Self-notification, from the stall timer: list the runtime's downloads
/// and warn of those that stopped moving (`pull.stall_warning`).
#[derive(Message)]
#[rtype(result = "()")]
struct CheckStalls;

/// Self-notification: a pull task ended without pulling (it failed, or
/// found its image present).
#[derive(Message)]
#[rtype(result = "()")]
struct PullFinished {
    key: PullKey,
    result: PullResult,
}

/// The pull queue actor. See `actors.md`.
pub struct PullQueueActor {
    cfg: PullQueueSettings,
    /// Requests boxed: a burst parks thousands, and a parked entry is then
    /// a fifth of its size (the deque's spare room too).
    queue: PullQueue<Box<PullRequest>, Waiter>,
    /// Presence re-checks and size lookups, on the pull's own task.
    reader: CriReader,
    throttle: Arc<PullThrottle>,
    subscribers: Vec<Recipient<PullPhaseChanged>>,
    /// When pulls of each image last finished well (recent ones only): a
    /// request whose presence check predates one must re-check.
    finished: HashMap<String, Instant>,
    /// Images as requested → their normalised names (`normalized`).
    normalized: HashMap<String, String>,
    /// The pulls that started and have not finished (in key order: the
    /// slow-pull warnings come in it).
    started: BTreeMap<PullKey, Started>,
    /// A pump when the soonest registry token passed over comes (wait
    /// mode with registries' own rates), and when it fires.
    token_timer: Option<(SpawnHandle, Instant)>,
    /// The stall check (`pull.stall_warning`; None when off).
    stalls: Option<StallWatch>,
    /// The periods of the two checks' timers (what each watches for;
    /// `None`: the timer sleeps), changed by [`UpdatePullWatch`].
    slow_period: tokio::sync::watch::Sender<Option<Duration>>,
    stall_period: tokio::sync::watch::Sender<Option<Duration>>,
    /// The clock the runtime's download times are on.
    downloads_clock: crate::clock::Clock,
}

/// Bounds of a check's period (a quarter of the time it watches for).
const CHECK_MIN: Duration = Duration::from_millis(50);
const CHECK_MAX: Duration = Duration::from_secs(15);

impl PullQueueActor {
    /// A queue that pulls and looks images up through the gateway's direct
    /// handle (`reader`, from [`GetReader`](crate::actors::cri_gateway::GetReader)).
    pub fn new(cfg: PullQueueSettings, reader: CriReader) -> Self {
        let cfg_stall = StallWatch::new(cfg.stall_warning, cfg.stall_timeout, cfg.min_download_rate);
        let slow_period = tokio::sync::watch::Sender::new(cfg.slow_pull_warning);
        let stall_period = tokio::sync::watch::Sender::new(cfg_stall.as_ref().map(StallWatch::shortest));
        Self {
            reader,
            queue: PullQueue::new(cfg.concurrency, cfg.capacity, cfg.single_flight)
                .with_registry_limit(cfg.registry_limit)
                .with_registry_limits(cfg.registry_limits.clone())
                .with_per_registry_capacity(!cfg.registry_rates.is_empty()),
            throttle: Arc::new(PullThrottle::with_registries(
                cfg.qps,
                cfg.burst,
                cfg.throttle_mode,
                &cfg.registry_rates,
            )),
            cfg,
            subscribers: Vec::new(),
            finished: HashMap::new(),
            normalized: HashMap::new(),
            started: BTreeMap::new(),
            token_timer: None,
            stalls: cfg_stall,
            slow_period,
            stall_period,
            downloads_clock: crate::clock::Clock::system(),
        }
    }

    /// Reads the runtime's download times on `clock` (the system's by
    /// default, as containerd stamps them; the simulator's runtime stamps
    /// them on paused tokio time).
    #[must_use]
    pub fn with_downloads_clock(mut self, clock: crate::clock::Clock) -> Self {
        self.downloads_clock = clock;
        self
    }

    /// Starts every pull a slot allows, admitting parked requests as room frees.
    ///
    /// In wait mode with registries' own rates, a pull starts only with its
    /// registry's token (taken here): one whose registry has none keeps its
    /// place while pulls from other registries start, and a pump comes
    /// when the soonest token does. (In fail mode the pull's task takes it
    /// and fails without one, as with the node's.)
    fn pump(&mut self, ctx: &mut Context<Self>) {
        let by_token = self.throttle.mode() == ThrottleMode::Wait && self.throttle.has_registry_rates();
        let mut soonest: Option<Duration> = None;
        // Registries that refused during this pump: not asked again (a
        // token coming mid-scan must not let a later pull of theirs start
        // before an earlier one).
        let mut refused: Vec<String> = Vec::new();
        loop {
            loop {
                let throttle = self.throttle.clone();
                let mut ready = |registry: &str| {
                    if refused.iter().any(|r| r == registry) {
                        return false;
                    }
                    match throttle.acquire(Some(registry)) {
                        Ok(()) => true,
                        Err((wait, _)) => {
                            soonest = Some(soonest.map_or(wait, |s| s.min(wait)));
                            refused.push(registry.to_string());
                            false
                        }
                    }
                };
                let next =
                    if by_token { self.queue.start_next_where(Some(&mut ready)) } else { self.queue.start_next() };
                let Some((key, request)) = next else { break };
                self.spawn_pull(key, *request, by_token, ctx);
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
                pull_task::publish(subscribers, &key.image, phase, w.pod.as_ref());
            });
            // (With a registry limit, a slot may stay free while every
            // queued pull's registry is at its limit: admitting more can
            // still fill it, from another registry.)
            if admitted.is_empty() || self.queue.running() >= self.cfg.concurrency.limit() {
                break;
            }
        }
        if let Some(wait) = soonest {
            let due = Instant::now() + wait;
            // A timer due no later is kept (no churn on every message).
            let keep = self.token_timer.as_ref().is_some_and(|(_, at)| *at <= due);
            if !keep {
                if let Some((timer, _)) = self.token_timer.take() {
                    ctx.cancel_future(timer);
                }
                let timer = ctx.run_later(wait, |act, ctx| {
                    act.token_timer = None;
                    act.pump(ctx);
                });
                self.token_timer = Some((timer, due));
            }
        }
        self.report_depths();
    }

    /// Warns once for each pull running past `after` while other pulls
    /// wait (queued or parked).
    fn warn_slow(&mut self, after: Duration) {
        let waiting = self.queue.queued() + self.queue.parked();
        if waiting == 0 {
            return;
        }
        let now = Instant::now();
        for (key, s) in &mut self.started {
            let running = now.saturating_duration_since(s.at);
            if s.warned || running < after {
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

    /// Warns of the downloads a listing finds newly stalled (see
    /// [`StallWatch`]), naming the pulls running; ends the runtime call of
    /// the one pull in the runtime's hands when one of its downloads is
    /// past `pull.stall_timeout`.
    fn downloads_listed(&mut self, listing: Result<Vec<crate::domain::Download>, crate::cri::CriError>) {
        let Some(watch) = self.stalls.as_mut() else { return };
        watch.checking = false;
        let downloads = match listing {
            Ok(d) => d,
            Err(e) => {
                if watch.failed(&e, Instant::now()) {
                    info!(error = %e, "the runtime does not list its downloads (containerd's content service): \
                        pull.stall_warning and pull.stall_timeout cannot tell a stalled pull, and `imagectl pulls` shows no bytes");
                } else {
                    debug!(error = %e, "listing the runtime's downloads failed");
                }
                return;
            }
        };
        let Some(since) = self.started.values().map(|s| s.since).min() else { return };
        let now = self.downloads_clock.now();
        let review = watch.review(&downloads, now, since);
        let warn_after = watch.warn_after.map(crate::domain::go_text::duration).unwrap_or_default();
        let (cancel_after, min_rate) = (watch.cancel_after, watch.min_rate);
        self.cfg.metrics.set_stalled_downloads(review.stalled);
        let running: Vec<&str> = self.started.keys().map(|k| k.image.as_str()).collect();
        let idle_text = |d: &crate::domain::Download| {
            crate::domain::go_text::duration(Duration::from_millis(crate::domain::limits::millis(d.idle(now))))
        };
        let size_text = |d: &crate::domain::Download| {
            if d.total > 0 { format!("{} of {} bytes", d.offset, d.total) } else { format!("{} bytes", d.offset) }
        };
        for found in &review.newly {
            let d = found.download;
            self.cfg.metrics.download_stalled();
            let (idle, size, what) = (idle_text(d), size_text(d), found.stall.text(min_rate));
            let whose = match running.as_slice() {
                [one] => format!("the pull of {one:?}"),
                many => format!("one of {} pulls running ({})", many.len(), many.join(", ")),
            };
            warn!(
                download = %d.reference,
                idle = %idle,
                offset = d.offset,
                total = d.total,
                "download {:?} of {whose} {what} ({size}): \
                 stalled past {warn_after}; `imagectl pulls` lists the downloads (pull.stall_warning)",
                d.reference
            );
        }
        // Only a download written since the one pull in the runtime's hands
        // started is surely its own.
        let mut pulling = self.started.iter().filter(|(_, s)| s.stage.get() == PullStage::Pulling);
        let (Some((key, pull)), None) = (pulling.next(), pulling.next()) else { return };
        if review.newly.iter().any(|f| f.download.updated >= pull.since) {
            pull_task::publish(&self.subscribers, &key.image, PullPhase::Stalled, pull.pod.as_ref());
        }
        let Some(cancel_after) = cancel_after else { return };
        // Each call (a retry's, the next credential's) gets the whole time.
        if pull.stop.call_running_for().is_none_or(|ran| ran < cancel_after) {
            return;
        }
        let Some(found) = review.past_cancel.iter().find(|f| f.download.updated >= pull.since) else { return };
        let d = found.download;
        let (idle, size, what) = (idle_text(d), size_text(d), found.stall.text(min_rate));
        let limit = crate::domain::go_text::duration(cancel_after);
        warn!(image = %key.image, download = %d.reference, idle = %idle,
            "cancelling the pull of {:?}: its download {:?} {what} ({size}), \
             past pull.stall_timeout ({limit})", key.image, d.reference);
        self.cfg.metrics.stalled_pull_cancelled();
        pull.stop.stop(crate::cri::CriError::new(
            crate::cri::CriErrorKind::RegistryUnavailable,
            format!(
                "{}: download {:?} {what} ({size}); imaged cancelled the pull (pull.stall_timeout {limit})",
                crate::cri::REGISTRY_UNAVAILABLE,
                d.reference
            ),
        ));
    }

    /// Publishes the queue's depths (after every change: each goes through `pump`).
    fn report_depths(&self) {
        self.cfg.metrics.set_pull_queue(self.queue.queued(), self.queue.parked(), self.queue.running());
    }

    /// Spawns the task that runs one pull ([`PullTask`]); it tells the
    /// actor when its slot frees and when it ends.
    fn spawn_pull(&mut self, key: PullKey, request: PullRequest, registry_token: bool, ctx: &mut Context<Self>) {
        let me = ctx.address();
        let now = Instant::now();
        let stage = Arc::new(StageCell::default());
        let stop = Arc::new(StopCall::default());
        let pod = PullPod::of(request.sandbox.as_ref()).or_else(|| request.pod.clone());
        let started = Started {
            at: now,
            since: self.downloads_clock.now(),
            stage: stage.clone(),
            warned: false,
            stop: stop.clone(),
            pod: pod.clone(),
        };
        self.started.insert(key.clone(), started);
        // A client's own pull through the front: it may offer the size.
        let offers = (request.wire.is_some() && self.cfg.size_offers.attached()).then(|| self.cfg.size_offers.clone());
        let task = PullTask {
            runtime: self.reader.clone(),
            recheck: pull_task::needs_recheck(
                request.skip_if_present,
                request.absent_at,
                self.finished.get(&key.image).copied(),
                now,
            ),
            deadline: request.deadline.or(self.cfg.pull_deadline),
            request,
            throttle: self.throttle.clone(),
            progress: Progress { image: key.image.clone(), subscribers: self.subscribers.clone(), stage, pod },
            metrics: self.cfg.metrics.clone(),
            offers,
            retries: self.cfg.retries,
            registry_token,
            wanted: (self.cfg.retries.times > 0).then(|| (me.clone().recipient(), key.clone())),
            stop,
        };
        // A task of its own (not ctx.spawn): actix polls every context future
        // on each wake-up, which would make many parallel pulls quadratic.
        actix::spawn(async move {
            let progress = &task.progress;
            let pulled = {
                let (me, key) = (me.clone(), key.clone());
                // Awaited: the next pull's task is spawned when this returns,
                // so its PullImage goes out before this pull's size lookup.
                // do_send: never held back by a full mailbox.
                move |outcome| async move {
                    progress.phase(PullPhase::Done);
                    let (done, started) = oneshot::channel();
                    me.do_send(PullSucceeded { key, outcome, done });
                    let _ = started.await;
                }
            };
            let result = task.run(pulled).await;
            if !matches!(&result, Ok(o) if o.pulled) {
                task.progress.phase(if result.is_ok() { PullPhase::Done } else { PullPhase::Failed });
                me.do_send(PullFinished { key, result });
            }
        });
    }
}

/// Most remembered normalised names (`PullQueueActor::normalized`).
const NORMALIZED_CACHE: usize = 4096;

impl PullQueueActor {
    /// The normalised reference (so `busybox` and
    /// `docker.io/library/busybox:latest` share a pull), or the text as
    /// given when it does not parse; worked out once per name: pods name
    /// the same images over and over, and the parse was about a quarter of the
    /// queue's work on a request. Bounded; cleared when full. Only names
    /// that parse are kept: the CRI front passes others on as sent, up to
    /// 4 KiB each, which a full cache of them would hold 16 MiB of.
    fn normalized(&mut self, image: &str) -> String {
        if let Some(n) = self.normalized.get(image) {
            return n.clone();
        }
        let Ok(named) = crate::domain::reference::parse_normalized_named(image) else {
            return image.to_string();
        };
        let n = named.docker_ref();
        if self.normalized.len() >= NORMALIZED_CACHE {
            self.normalized.clear();
        }
        self.normalized.insert(image.to_string(), n.clone());
        n
    }
}

/// The mailbox capacity of a queue with no bound (`pull.queue_capacity` 0):
/// only `do_send`/`try_send` see it, as `send` never waits for room.
pub const UNBOUNDED_QUEUE_MAILBOX: usize = 1024;

/// Sends the actor `message()` every quarter of the time the check looks
/// for (`watched`'s, within [`CHECK_MIN`] and [`CHECK_MAX`]; none while it
/// is `None`, and the period follows it when it changes), from a task of
/// its own: a timer in the actor's context would be polled on every
/// wake-up of the actor (it measurably slowed the ensure bench's
/// makespan). It holds a weak address, so it never keeps the actor alive,
/// and ends with the actor (its mailbox closes, or the period's sender,
/// the actor's, is dropped).
fn check_every<M>(
    mut watched: tokio::sync::watch::Receiver<Option<Duration>>,
    ctx: &mut Context<PullQueueActor>,
    message: impl Fn() -> M + 'static,
) where
    M: Message<Result = ()> + Send + 'static,
    PullQueueActor: Handler<M>,
{
    let me = ctx.address().downgrade();
    actix::spawn(async move {
        loop {
            let Some(period) = *watched.borrow_and_update() else {
                if watched.changed().await.is_err() {
                    break;
                }
                continue;
            };
            let tick = (period / 4).clamp(CHECK_MIN, CHECK_MAX);
            let mut every = tokio::time::interval_at(Instant::now() + tick, tick);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    // The simulator replays runs: no random branch order.
                    biased;
                    changed = watched.changed() => match changed {
                        Ok(()) => break,
                        Err(_) => return,
                    },
                    _ = every.tick() => {}
                }
                let Some(queue) = me.upgrade() else { return };
                // A freshly upgraded address is never refused as full; a
                // closed mailbox ends the timer.
                if let Err(actix::dev::SendError::Closed(_)) = queue.try_send(message()) {
                    return;
                }
            }
        }
    });
}

impl Actor for PullQueueActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        // Not the queue's bound: actix's send never waits for room in a full
        // mailbox (actors.md, System). The bound is the admission in
        // `PullQueue`: a request that finds the queue full is parked and its
        // sender's send() resolves when it is admitted.
        ctx.set_mailbox_capacity(self.cfg.capacity.unwrap_or(UNBOUNDED_QUEUE_MAILBOX).max(1));
        check_every(self.slow_period.subscribe(), ctx, || CheckSlowPulls);
        check_every(self.stall_period.subscribe(), ctx, || CheckStalls);
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
            self.normalized(&request.image.image),
            request.image.runtime_handler.clone(),
            AuthConfig::list_identity(&request.credentials),
            !request.skip_if_present,
        );
        let (tx, rx) = oneshot::channel();
        let (admitted_tx, admitted_rx) = oneshot::channel();
        let image = key.image.clone();
        let pod = PullPod::of(request.sandbox.as_ref()).or_else(|| request.pod.clone());
        let records = request.records;
        let waiter =
            Waiter { result: tx, admitted: Some(admitted_tx), since: Instant::now(), pod: pod.clone(), records };
        let how = self.queue.submit(key, request.priority, Box::new(request), waiter);
        if how == Submitted::Joined {
            self.cfg.metrics.single_flight_joined();
        }
        let phase = match how {
            Submitted::Joined => PullPhase::WaitingOnSharedPull,
            Submitted::Queued => PullPhase::Queued,
            Submitted::Parked => PullPhase::Parked,
        };
        pull_task::publish(&self.subscribers, &image, phase, pod.as_ref());
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

impl Handler<PullSucceeded> for PullQueueActor {
    type Result = ();

    /// A pull's CRI call succeeded: answer its waiters, start the next pull.
    fn handle(&mut self, m: PullSucceeded, ctx: &mut Self::Context) {
        // The image is in the runtime now: requests checked before must
        // re-check.
        let now = Instant::now();
        if self.finished.len() >= 4096 {
            self.finished.retain(|_, t| now.duration_since(*t) <= RECHECK_WINDOW);
        }
        self.finished.insert(m.key.image.clone(), now);
        self.started.remove(&m.key);
        for w in self.queue.finish(&m.key) {
            let mut outcome = m.outcome.clone();
            // Due before it is answered: a check for the image made after
            // this sees it (see `RecordsDue`).
            if w.records {
                outcome.record_due = Some(self.cfg.records_due.owe(&m.key.image));
            }
            let _ = w.result.send(Ok(outcome));
        }
        self.pump(ctx);
        let _ = m.done.send(());
    }
}

impl Handler<pull_task::StillWanted> for PullQueueActor {
    type Result = bool;

    /// Whether a waiter of the pull still listens (a kubelet whose call was
    /// cancelled, an ensure whose caller went away: no longer).
    fn handle(&mut self, m: pull_task::StillWanted, _: &mut Self::Context) -> bool {
        self.queue.waiters_of(&m.0).iter().any(|w| !w.result.is_closed())
    }
}

impl Handler<PullFinished> for PullQueueActor {
    type Result = ();

    /// A pull ended without pulling: answer everyone who waited on it and
    /// start the next.
    fn handle(&mut self, m: PullFinished, ctx: &mut Self::Context) {
        self.started.remove(&m.key);
        for w in self.queue.finish(&m.key) {
            let _ = w.result.send(m.result.clone());
        }
        self.pump(ctx);
    }
}

impl Handler<UpdatePullThrottle> for PullQueueActor {
    type Result = ();

    /// Replaces the throttle for the queue and its pull tasks.
    fn handle(&mut self, m: UpdatePullThrottle, ctx: &mut Self::Context) {
        self.throttle.set(m.qps, m.burst, m.mode, &m.registries);
        (self.cfg.qps, self.cfg.burst, self.cfg.throttle_mode) = (m.qps, m.burst, m.mode);
        let registries = m.registries.iter().filter(|r| r.qps > 0.0).count();
        self.cfg.registry_rates = m.registries;
        // Any rule bounds each registry's waiting pulls, as at start.
        self.queue.set_per_registry_capacity(!self.cfg.registry_rates.is_empty());
        tracing::info!(qps = m.qps, burst = m.burst, mode = ?m.mode, registries, "registry pull throttle replaced");
        // Pulls passed over for an old bucket's token may start now.
        self.pump(ctx);
    }
}

impl Handler<UpdateRegistryLimits> for PullQueueActor {
    type Result = ();

    /// Replaces the per-registry limits; see the message.
    fn handle(&mut self, m: UpdateRegistryLimits, ctx: &mut Self::Context) {
        self.queue.set_registry_limits(m.per_registry, m.registries.clone());
        tracing::info!(per_registry = ?m.per_registry, registries = ?m.registries, "registry pull limits replaced");
        (self.cfg.registry_limit, self.cfg.registry_limits) = (m.per_registry, m.registries);
        // A raised limit lets waiting pulls start.
        self.pump(ctx);
    }
}

impl Handler<UpdateConcurrency> for PullQueueActor {
    type Result = ();

    /// Replaces how many pulls run at once; see the message.
    fn handle(&mut self, m: UpdateConcurrency, ctx: &mut Self::Context) {
        self.queue.set_concurrency(m.0);
        self.cfg.concurrency = m.0;
        tracing::info!(concurrency = %m.0, "pulls at once replaced");
        // A raised limit lets waiting pulls start.
        self.pump(ctx);
    }
}

impl Handler<UpdatePullLimits> for PullQueueActor {
    type Result = ();

    /// Replaces the deadline and retries of pulls that start from now on.
    fn handle(&mut self, m: UpdatePullLimits, _: &mut Self::Context) {
        (self.cfg.pull_deadline, self.cfg.retries) = (m.deadline, m.retries);
        tracing::info!(
            deadline_ms = m.deadline.map(crate::domain::limits::millis),
            transient_retries = m.retries.times,
            transient_retry_delay_ms = crate::domain::limits::millis(m.retries.delay),
            "pull deadline and retries replaced"
        );
    }
}

impl Handler<UpdatePullWatch> for PullQueueActor {
    type Result = ();

    /// Replaces the slow-pull and stall checks' times and floor, and
    /// re-times their timers. A stall check that stays on keeps what it
    /// warned of and its readings.
    fn handle(&mut self, m: UpdatePullWatch, _: &mut Self::Context) {
        self.cfg.slow_pull_warning = m.slow_pull_warning;
        (self.cfg.stall_warning, self.cfg.stall_timeout, self.cfg.min_download_rate) =
            (m.stall_warning, m.stall_timeout, m.min_download_rate);
        match (self.stalls.as_mut(), StallWatch::new(m.stall_warning, m.stall_timeout, m.min_download_rate)) {
            (Some(watch), Some(_)) => watch.retime(m.stall_warning, m.stall_timeout, m.min_download_rate),
            (_, fresh) => {
                if fresh.is_none() {
                    self.cfg.metrics.set_stalled_downloads(0);
                }
                self.stalls = fresh;
            }
        }
        // A timer re-times only when its own period changed.
        let retime = |period: &tokio::sync::watch::Sender<Option<Duration>>, new: Option<Duration>| {
            period.send_if_modified(|p| std::mem::replace(p, new) != new);
        };
        retime(&self.slow_period, m.slow_pull_warning);
        retime(&self.stall_period, self.stalls.as_ref().map(StallWatch::shortest));
        tracing::info!(
            slow_pull_warning_ms = m.slow_pull_warning.map(crate::domain::limits::millis),
            stall_warning_ms = m.stall_warning.map(crate::domain::limits::millis),
            stall_timeout_ms = m.stall_timeout.map(crate::domain::limits::millis),
            min_download_rate = m.min_download_rate,
            "slow-pull and stall checks replaced"
        );
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
    fn handle(&mut self, _: CheckSlowPulls, _: &mut Self::Context) {
        if let Some(after) = self.cfg.slow_pull_warning {
            self.warn_slow(after);
        }
    }
}

impl Handler<CheckStalls> for PullQueueActor {
    type Result = ();

    /// Lists the runtime's downloads while pulls run (one listing at a
    /// time), for [`PullQueueActor::downloads_listed`].
    fn handle(&mut self, _: CheckStalls, ctx: &mut Self::Context) {
        let Some(watch) = self.stalls.as_mut() else { return };
        if self.started.is_empty() {
            watch.idle();
            self.cfg.metrics.set_stalled_downloads(0);
            return;
        }
        if !watch.due(Instant::now()) {
            return;
        }
        watch.checking = true;
        let listing = self.reader.list_downloads();
        ctx.spawn(actix::fut::wrap_future(listing).map(|r, act: &mut Self, _| act.downloads_listed(r)));
    }
}

impl Handler<ListSlowDownloads> for PullQueueActor {
    type Result = MessageResult<ListSlowDownloads>;

    fn handle(&mut self, _: ListSlowDownloads, _: &mut Self::Context) -> Self::Result {
        MessageResult(self.stalls.as_ref().map(StallWatch::slow).unwrap_or_default())
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
                    pods: v.waiters.iter().filter_map(|w| w.pod.clone()).fold(Vec::new(), |mut pods, p| {
                        if !pods.contains(&p) {
                            pods.push(p);
                        }
                        pods
                    }),
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
