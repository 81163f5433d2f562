//! The GC executor actor: a thin shell over [`GcExecutor`]. It owns the
//! mailbox and the periodic timer, routes each message to the executor,
//! runs [`run_gc`] as a context future (one at a time, cancelled if the
//! actor stops) and emits the node events the executor decides on.

use std::sync::Arc;

use actix::prelude::*;
use tracing::info;

use super::executor::{GcExecutor, GcExecutorSettings, RunSpec};
use super::messages::{DeleteUnusedImages, GetLastGcReport, RunGc, UpdateGcPolicy};
use super::report::{GcError, GcReport};
use super::run::{GcPorts, measure, run_gc};
use crate::actors::cri_gateway::{GetImageFsInfo, GetImageStatus, RemoveImage};
use crate::actors::detector::DetectImages;
use crate::clock::Clock;
use crate::events::EventSink;
use crate::gc::capacity::{FsCapacity, MeasuredBy};
use crate::gc::in_use_hints::InUseHints;
use crate::gc::plan::GcMode;
use crate::metrics::Metrics;
use crate::pull_records::PullRecords;

/// The periodic tick (`gc.gc_period`).
#[derive(Message)]
#[rtype(result = "()")]
struct Tick;

/// The GC executor actor. See `actors.md`.
pub struct GcExecutorActor {
    gc: GcExecutor,
    ports: GcPorts,
    events: EventSink,
    clock: Clock,
    /// Requested runs waiting for the run going on to end.
    waiting: Vec<tokio::sync::oneshot::Sender<()>>,
}

impl GcExecutorActor {
    /// An executor asking `detector` for detections and the gateway's
    /// recipients for the filesystem and removals. The GC loop begins now
    /// on `clock` (the kubelet's `beganGC`).
    pub fn new(
        cfg: GcExecutorSettings,
        detector: Recipient<DetectImages>,
        fs_info: Recipient<GetImageFsInfo>,
        remove: Recipient<RemoveImage>,
        events: EventSink,
        clock: Clock,
    ) -> Self {
        let ports = GcPorts {
            detect: detector,
            fs_info,
            remove,
            pull_records: None,
            metrics: Metrics::default(),
            hints: None,
            status: None,
        };
        Self { gc: GcExecutor::new(cfg, clock.now()), ports, events, clock, waiting: Vec::new() }
    }

    /// The same executor, its GC loop begun at `began` (the kubelet's
    /// `beganGC`) rather than now: the first start's, kept in the state,
    /// so the max-age pass does not wait max age again after a restart.
    #[must_use]
    pub fn with_began(mut self, began: std::time::SystemTime) -> Self {
        self.gc.set_began(began);
        self
    }

    /// The executor reporting removals, bytes freed and runs to `metrics`.
    #[must_use]
    pub fn with_metrics(mut self, metrics: Metrics) -> Self {
        self.gc.set_metrics(metrics.clone());
        self.ports.metrics = metrics;
        self
    }

    /// The same executor, claiming each removal from the ensure path's
    /// `hints`: an image ensured or pulled since its run began is kept, and
    /// an ensure that finds an image being removed waits for the removal.
    #[must_use]
    pub fn with_hints(mut self, hints: InUseHints) -> Self {
        self.ports.hints = Some(hints);
        self
    }

    /// The same executor, reading each image's status (`ImageStatus`, from
    /// the gateway) just before its removal: one the runtime pins now, or
    /// whose status cannot be read, is kept.
    #[must_use]
    pub fn with_status_check(mut self, status: Recipient<GetImageStatus>) -> Self {
        self.ports.status = Some(status);
        self
    }

    /// The same executor, pruning `records` after each run: records last
    /// updated before the run began, of images the runtime no longer has.
    #[must_use]
    pub fn with_pull_records(mut self, records: PullRecords) -> Self {
        self.ports.pull_records = Some(records);
        self
    }

    /// A run; `requested`: someone asked for it and gets its whole report
    /// (the periodic run's is bounded from the start, see
    /// [`RunSpec::whole_report`]).
    fn run(
        &mut self,
        mode: GcMode,
        dry_run: bool,
        requested: bool,
    ) -> ResponseActFuture<Self, Result<Arc<GcReport>, GcError>> {
        self.run_with(mode, dry_run, requested, None)
    }

    /// [`run`](Self::run) for a pressure check: with `policy` instead of
    /// the configured one (before the kubelet's eviction line) and the
    /// check's own measurement of the filesystem.
    fn run_with(
        &mut self,
        mode: GcMode,
        dry_run: bool,
        requested: bool,
        pressure: Option<(crate::gc::policy::GcPolicy, (FsCapacity, MeasuredBy))>,
    ) -> ResponseActFuture<Self, Result<Arc<GcReport>, GcError>> {
        let spec = match (self.gc.begin(mode, dry_run), pressure) {
            (Ok(spec), Some((policy, measured))) => {
                RunSpec { whole_report: requested, policy, measured: Some(measured), ..spec }
            }
            (Ok(spec), None) => RunSpec { whole_report: requested, ..spec },
            (Err(e), _) => return Box::pin(actix::fut::ready(Err(e))),
        };
        let work = run_gc(self.ports.clone(), spec, self.clock.clone());
        Box::pin(work.into_actor(self).map(move |outcome, act, _| {
            let end = act.gc.finish(dry_run, outcome);
            for event in end.events {
                act.events.emit(event.into_image_event());
            }
            // The next requested run may begin.
            for waiter in act.waiting.drain(..) {
                let _ = waiter.send(());
            }
            end.result
        }))
    }

    /// A requested run (`RunGc`, `DeleteUnusedImages`): one going on (the
    /// periodic run, or another request) is waited for, then this one runs
    /// (`imagectl gc` right after start used to fail "already running"
    /// because of the start's own run). The caller's deadline bounds the
    /// wait; the mailbox is not held meanwhile.
    fn run_requested(
        &mut self,
        mode: GcMode,
        dry_run: bool,
    ) -> ResponseActFuture<Self, Result<Arc<GcReport>, GcError>> {
        if !self.gc.is_running() {
            return self.run(mode, dry_run, true);
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.waiting.push(tx);
        Box::pin(async move { rx.await.is_ok() }.into_actor(self).then(move |ended, act, _| {
            if ended { act.run_requested(mode, dry_run) } else { Box::pin(actix::fut::ready(Err(GcError::Busy))) }
        }))
    }
}

impl Actor for GcExecutorActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.set_mailbox_capacity(self.gc.config().mailbox_capacity);
        // One timer for the actor's life; a tick does nothing while the
        // policy is disabled, so a reload can turn GC on and off without
        // timers piling up.
        ctx.run_interval(self.gc.config().period, |_, ctx| ctx.notify(Tick));
        if self.gc.runs_at_start() {
            ctx.notify(Tick);
        }
        if let Some(every) = self.gc.config().pressure_check {
            ctx.run_interval(every, Self::check_pressure);
        }
    }
}

impl GcExecutorActor {
    /// Measures the image filesystem (one `ImageFsInfo`) and starts a run
    /// at once when [`GcExecutor::pressure_runs`] says so: a node filling
    /// up between two periodic runs (5 minutes apart, the kubelet's) is
    /// cleaned within a check period, not after the kubelet's eviction
    /// manager (every 10 s, at the same 15 % by default) has evicted pods.
    fn check_pressure(&mut self, ctx: &mut Context<Self>) {
        if self.gc.is_running() {
            return;
        }
        let (fs_info, capacity) = (self.ports.fs_info.clone(), self.gc.config().capacity.clone());
        let probe = async move { measure(&fs_info, &capacity).await };
        ctx.spawn(probe.into_actor(self).map(|measured, act, ctx| match measured {
            Ok((fs, measured_by)) => {
                let Some(policy) = act.gc.pressure_runs(fs) else { return };
                let configured = act.gc.config().policy.high_threshold_percent;
                if policy.high_threshold_percent < configured {
                    info!(
                        usage_percent = crate::gc::plan::usage_percent(fs),
                        high_threshold_percent = policy.high_threshold_percent,
                        low_threshold_percent = policy.low_threshold_percent,
                        eviction_usage_percent =
                            crate::gc::eviction::eviction_usage_percent(&act.gc.config().eviction, fs.capacity),
                        "image filesystem near the kubelet's eviction line: GC runs now, with thresholds below it"
                    );
                } else {
                    info!(
                        usage_percent = crate::gc::plan::usage_percent(fs),
                        high_threshold_percent = configured,
                        "image filesystem at or above the high threshold: GC runs now, not at its period"
                    );
                }
                let run =
                    act.run_with(GcMode::Threshold, false, false, Some((policy, (fs, measured_by)))).map(|_, _, _| ());
                ctx.spawn(run);
            }
            // The periodic run reports a measuring failure; a check only notes it.
            Err(e) => tracing::debug!(error = %e, "GC pressure check: the image filesystem was not measured"),
        }));
    }
}

impl Handler<Tick> for GcExecutorActor {
    type Result = ();
    /// Runs GC unless a run is going on (or GC was disabled by a reload).
    fn handle(&mut self, _: Tick, ctx: &mut Self::Context) {
        if self.gc.tick_runs() {
            let fut = self.run(GcMode::Threshold, false, false).map(|_, _, _| ());
            ctx.spawn(fut);
        }
    }
}

impl Handler<RunGc> for GcExecutorActor {
    type Result = ResponseActFuture<Self, Result<Arc<GcReport>, GcError>>;
    /// Runs GC now.
    fn handle(&mut self, m: RunGc, _: &mut Self::Context) -> Self::Result {
        self.run_requested(GcMode::Threshold, m.dry_run)
    }
}

impl Handler<DeleteUnusedImages> for GcExecutorActor {
    type Result = ResponseActFuture<Self, Result<Arc<GcReport>, GcError>>;
    /// Removes every unused image old enough.
    fn handle(&mut self, m: DeleteUnusedImages, _: &mut Self::Context) -> Self::Result {
        info!("Attempting to delete unused images");
        self.run_requested(GcMode::DeleteUnused, m.dry_run)
    }
}

impl Handler<UpdateGcPolicy> for GcExecutorActor {
    type Result = ();
    /// Replaces the policy and rules; enabling a disabled GC runs it at once.
    fn handle(&mut self, m: UpdateGcPolicy, ctx: &mut Self::Context) {
        if self.gc.update_policy(m.policy, m.rules) {
            ctx.notify(Tick);
        }
    }
}

impl Handler<GetLastGcReport> for GcExecutorActor {
    type Result = MessageResult<GetLastGcReport>;
    /// The last report.
    fn handle(&mut self, _: GetLastGcReport, _: &mut Self::Context) -> Self::Result {
        MessageResult(self.gc.last_report())
    }
}
