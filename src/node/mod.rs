//! The library entry point: [`Node::start`] starts every actor from a
//! [`Config`] on the caller's actix System and returns a handle with what an
//! agent needs — ensure, event and phase subscriptions, the image list, GC,
//! back-off control, status — and a graceful [`Node::shutdown`].
//!
//! ```no_run
//! # async fn agent() -> Result<(), imaged::error::AppError> {
//! use imaged::config::Config;
//! use imaged::domain::pull_policy::PullPolicy;
//! use imaged::ensure::EnsureImageRequest;
//!
//! let node = imaged::node::Node::start(Config::defaults()?).await?;
//! let ok = node.ensure_image_exists(&EnsureImageRequest::new("pod-uid", "busybox:1.36", PullPolicy::IfNotPresent)).await;
//! println!("{ok:?}");
//! node.shutdown(std::time::Duration::from_secs(30)).await;
//! # Ok(()) }
//! ```
//!
//! The daemon (`imaged run`) is this handle behind a gRPC API; embedders get
//! the same behaviour without the socket.

pub mod prefetch_ticker;
mod reload;
mod wiring;

pub use reload::{LIVE_KEYS, Reloaded};
pub(crate) use wiring::open_store;
pub use wiring::{GcParts, GcService, recover_intents_from_runtime};

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use actix::prelude::*;

use crate::actors::Stop;
use crate::actors::backoff_registry::{
    BackoffRegistryActor, BackoffView, ClearBackoff, ClearScope, ListBackoffs, UpdateBackoffDelays,
};
use crate::actors::cache_refresher::ImageListReader;
use crate::actors::cri_gateway::{CriGatewayActor, ListDownloads, ListImages};
use crate::actors::detector::{DetectImages, SetRecentWindow};
use crate::actors::gc_executor::{DeleteUnusedImages, GcError, GcReport, GetLastGcReport, RunGc, UpdateGcPolicy};
use crate::actors::pull_queue::{
    GetQueueStatus, ListPulls, ListSlowDownloads, PullInfo, PullPhaseChanged, PullQueueActor, QueueStatus,
    SubscribePhases,
};
use crate::clock::Clock;
use crate::config::{Config, GcSettings};
use crate::connect::ConnectedRuntime;
use crate::cri::{CriEndpoint, CriError};
use crate::domain::{Image, RuntimeVersion};
use crate::ensure::{EnsureError, EnsureImageRequest, EnsureOk, ImageManager, Prefetch, PrefetchRequest};
use crate::error::AppError;
use crate::events::ImageEvent;
use crate::store::Store;

/// How often [`Node::shutdown`] looks whether in-flight pulls are done.
const DRAIN_POLL: Duration = Duration::from_millis(20);

/// Least time the final detection at shutdown gets, even past the grace.
const FINAL_DETECTION: Duration = Duration::from_secs(2);

/// Why a [`Node`] call failed (besides an ensure's own [`EnsureError`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NodeError {
    /// The node is shutting down and takes no new requests.
    #[error("imaged is shutting down")]
    ShuttingDown,
    /// An actor stopped (a bug or a shutdown race).
    #[error("{0} has stopped")]
    Stopped(&'static str),
    /// A CRI call failed.
    #[error(transparent)]
    Cri(#[from] CriError),
    /// A GC run failed or could not start.
    #[error(transparent)]
    Gc(#[from] GcError),
}

/// What [`Node::status`] reports.
#[derive(Debug, Clone)]
pub struct NodeStatus {
    /// The runtime's `Version` answer at start.
    pub runtime: RuntimeVersion,
    /// The endpoint.
    pub endpoint: CriEndpoint,
    /// The pull queue now.
    pub queue: QueueStatus,
    /// Keys in back-off or remembered by the backoff registry.
    pub backoffs: Vec<BackoffView>,
    /// The last GC run (threshold or delete-unused), if any.
    pub last_gc: Option<Arc<GcReport>>,
    /// Whether the node still takes requests.
    pub accepting: bool,
}

/// What [`Node::shutdown`] saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShutdownReport {
    /// Pulls still queued or running when the grace period ended (0 = all
    /// finished).
    pub abandoned_pulls: usize,
}

/// A running imaged: every actor, started from one configuration. Cheap
/// handles to the parts are available for agents that want the actors
/// themselves (`manager()`, `queue()`, `backoff()`, `gc()`, `gateway()`).
pub struct Node {
    cfg: Config,
    runtime: ConnectedRuntime,
    manager: ImageManager,
    queue: Addr<PullQueueActor>,
    backoff: Addr<BackoffRegistryActor>,
    gc: GcService,
    store: Option<Arc<Store>>,
    accepting: Arc<AtomicBool>,
    /// The GC settings in force: those at start, with the live-changeable
    /// part replaced by each [`update_gc_policy`](Self::update_gc_policy).
    live_gc: tokio::sync::watch::Sender<GcSettings>,
    /// The configuration in force but for GC (in `live_gc`): the start one
    /// with the throttle, back-off delays and prefetch list of the last
    /// reload.
    in_force: std::sync::Mutex<Config>,
    /// The declared prefetch list's ticker (`[prefetch] images`), if any.
    prefetch: Option<Addr<prefetch_ticker::PrefetchTickerActor>>,
    /// What the ticker's rounds made of each declared image (empty without one).
    declared: prefetch_ticker::DeclaredImages,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node").field("runtime", &self.runtime).finish_non_exhaustive()
    }
}

impl Node {
    /// Connects to the configured runtime (starting the embedded one when
    /// the endpoint is `embedded`) and starts every actor on the current
    /// actix System.
    pub async fn start(cfg: Config) -> Result<Self, AppError> {
        // Node credentials first: a bad plugin setup fails at once, not
        // after waiting for the runtime.
        let node_credentials = crate::connect::node_credentials(&cfg)?;
        let runtime = crate::connect::runtime(&cfg).await?;
        wiring::start(cfg, runtime, node_credentials, Clock::new(), None).await
    }

    /// Starts every actor over an already connected runtime (an embedder's
    /// own gateway, or a test's).
    pub async fn start_on(cfg: Config, runtime: ConnectedRuntime) -> Result<Self, AppError> {
        Self::start_on_clock(cfg, runtime, Clock::new()).await
    }

    /// [`Node::start_on`] with the clock durable records are stamped with
    /// and GC reads ages from (the pull records' clock, shared with the GC
    /// actors). The simulator gives each restarted node a clock whose
    /// wall-clock time goes on from the last one's.
    pub async fn start_on_clock(cfg: Config, runtime: ConnectedRuntime, clock: Clock) -> Result<Self, AppError> {
        let node_credentials = crate::connect::node_credentials(&cfg)?;
        wiring::start(cfg, runtime, node_credentials, clock, None).await
    }

    /// [`Node::start_on_clock`] over `store`, already opened on
    /// `cfg.state_dir` (by [`open_store`]): the simulator holds it from
    /// the start, to fence it if the process is killed while it starts.
    pub(crate) async fn start_on_store(
        cfg: Config,
        runtime: ConnectedRuntime,
        clock: Clock,
        store: Arc<crate::store::Store>,
    ) -> Result<Self, AppError> {
        let node_credentials = crate::connect::node_credentials(&cfg)?;
        wiring::start(cfg, runtime, node_credentials, clock, Some(store)).await
    }

    /// The configuration the node started with (see
    /// [`settings_in_force`](Self::settings_in_force) for what reloads
    /// changed since).
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// The configuration in force: the start one with what each live
    /// update (a SIGHUP reload) replaced — the GC policy, the registry pull
    /// throttle, the limits on pulls at once (overall and per registry),
    /// the pull deadline and retries, the slow-pull and stall checks, the
    /// back-off delays and the prefetch list.
    pub fn settings_in_force(&self) -> Config {
        let mut cfg = self.in_force().clone();
        cfg.gc = self.gc_settings();
        cfg
    }

    /// How long a download may stay idle before a listing shows it
    /// stalled, as in force: `pull.stall_warning` (`None` when off).
    pub fn stall_in_force(&self) -> Option<Duration> {
        self.in_force().pull.stall_warning
    }

    fn in_force(&self) -> std::sync::MutexGuard<'_, Config> {
        self.in_force.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The GC settings in force now.
    pub fn gc_settings(&self) -> GcSettings {
        self.live_gc.borrow().clone()
    }

    /// Applies `gc`'s policy live: thresholds, min and max age, pinned
    /// images and the retention rule take effect from the executor's next
    /// run, and the min age is also the detector's "ensured recently" window
    /// from its next detection (`SetRecentWindow`). Periods, the sandbox image and the node-status size keep their
    /// start values (they need a restart). Returns whether anything changed.
    pub fn update_gc_policy(&self, gc: &GcSettings) -> bool {
        self.live_gc.send_if_modified(|live| {
            let next = live.with_policy_of(gc);
            if next == *live {
                return false;
            }
            self.gc.executor.do_send(UpdateGcPolicy { policy: next.policy(), rules: next.rules() });
            if next.min_age != live.min_age {
                // The detector's "ensured recently" window is the min age too.
                self.gc.detector.do_send(SetRecentWindow(next.min_age));
            }
            *live = next;
            true
        })
    }

    /// The GC settings in force, told again at each change
    /// [`update_gc_policy`](Self::update_gc_policy) applies (the CRI front's
    /// pins follow `pinned_images` so).
    pub fn watch_gc_settings(&self) -> tokio::sync::watch::Receiver<GcSettings> {
        self.live_gc.subscribe()
    }

    /// The `imaged_config_info` labels of the settings in force
    /// ([`settings_in_force`](Self::settings_in_force)).
    pub fn info_labels(&self) -> Vec<(&'static str, String)> {
        self.settings_in_force().info_labels()
    }

    /// The runtime: gateway, version, endpoint, embedded runtime.
    pub fn runtime(&self) -> &ConnectedRuntime {
        &self.runtime
    }

    /// The CRI gateway.
    pub fn gateway(&self) -> &Addr<CriGatewayActor> {
        &self.runtime.gateway
    }

    /// The ensure flow's handle.
    pub fn manager(&self) -> &ImageManager {
        &self.manager
    }

    /// The pull queue the ensure flow pulls through.
    pub fn queue(&self) -> &Addr<PullQueueActor> {
        &self.queue
    }

    /// The declared prefetch images (`[prefetch] images`) in the list's
    /// order, with what the ticker's last round made of each (empty
    /// without a list).
    pub fn declared_images(&self) -> Vec<prefetch_ticker::DeclaredImage> {
        self.declared.snapshot()
    }

    /// Replaces the declared prefetch list and its refresh live (a reload
    /// of `[prefetch] images`, `refresh`; see
    /// [`UpdatePrefetchList`](prefetch_ticker::UpdatePrefetchList)). False
    /// when the node started with no list, so it has no ticker: that takes
    /// a restart.
    pub fn update_prefetch_list(&self, images: Vec<String>, refresh: Option<Duration>) -> bool {
        match &self.prefetch {
            Some(ticker) => {
                let mut in_force = self.in_force();
                in_force.prefetch.images.clone_from(&images);
                in_force.prefetch.refresh = refresh;
                self.declared.replace(&images);
                ticker.do_send(prefetch_ticker::UpdatePrefetchList { images, refresh });
                true
            }
            None => false,
        }
    }

    /// Replaces the registry pull throttle live (a reload of
    /// `pull.registry_pull_qps`, `registry_burst`, `throttle_mode` and the
    /// `[[pull.registries]]` rates): see
    /// [`UpdatePullThrottle`](crate::actors::pull_queue::UpdatePullThrottle).
    pub fn update_pull_throttle(
        &self,
        qps: f64,
        burst: u32,
        mode: crate::actors::pull_queue::ThrottleMode,
        registries: Vec<crate::actors::pull_queue::RegistryRate>,
    ) {
        let mut in_force = self.in_force();
        (in_force.pull.qps, in_force.pull.burst, in_force.pull.throttle_mode) = (qps, burst, mode);
        in_force.pull.registry_rates.clone_from(&registries);
        self.queue.do_send(crate::actors::pull_queue::UpdatePullThrottle { qps, burst, mode, registries });
    }

    /// Replaces the limits on pulls at once per registry live (a reload of
    /// `pull.max_parallel_pulls_per_registry` and the `[[pull.registries]]`
    /// `max_parallel`): see
    /// [`UpdateRegistryLimits`](crate::actors::pull_queue::UpdateRegistryLimits).
    pub fn update_registry_limits(&self, per_registry: Option<usize>, registries: HashMap<String, usize>) {
        let mut in_force = self.in_force();
        in_force.pull.registry_limit = per_registry;
        in_force.pull.registry_limits.clone_from(&registries);
        self.queue.do_send(crate::actors::pull_queue::UpdateRegistryLimits { per_registry, registries });
    }

    /// Replaces how many pulls run at once live (a reload of
    /// `pull.serialize_image_pulls` and `max_parallel_image_pulls`): see
    /// [`UpdateConcurrency`](crate::actors::pull_queue::UpdateConcurrency).
    pub fn update_concurrency(&self, concurrency: crate::actors::pull_queue::Concurrency) {
        self.in_force().pull.concurrency = concurrency;
        self.queue.do_send(crate::actors::pull_queue::UpdateConcurrency(concurrency));
    }

    /// Replaces the pull deadline and transient retries live (a reload of
    /// `pull.pull_deadline`, `transient_retries`, `transient_retry_delay`):
    /// see [`UpdatePullLimits`](crate::actors::pull_queue::UpdatePullLimits).
    pub fn update_pull_limits(&self, deadline: Option<Duration>, retries: crate::actors::pull_queue::Retries) {
        let mut in_force = self.in_force();
        (in_force.pull.pull_deadline, in_force.pull.retries) = (deadline, retries);
        self.queue.do_send(crate::actors::pull_queue::UpdatePullLimits { deadline, retries });
    }

    /// Replaces the slow-pull and stall checks' settings live (a reload of
    /// `pull.slow_pull_warning`, `stall_warning`, `stall_timeout` and
    /// `min_download_rate`): see
    /// [`UpdatePullWatch`](crate::actors::pull_queue::UpdatePullWatch).
    pub fn update_pull_watch(&self, m: crate::actors::pull_queue::UpdatePullWatch) {
        let mut in_force = self.in_force();
        in_force.pull.slow_pull_warning = m.slow_pull_warning;
        (in_force.pull.stall_warning, in_force.pull.stall_timeout, in_force.pull.min_download_rate) =
            (m.stall_warning, m.stall_timeout, m.min_download_rate);
        self.queue.do_send(m);
    }

    /// Replaces the back-off delays live (a reload of `[backoff] initial`
    /// and `max`): see [`UpdateBackoffDelays`].
    pub fn update_backoff_delays(&self, delays: crate::actors::backoff_registry::BackoffDelays) {
        self.in_force().backoff.delays = delays;
        self.backoff.do_send(UpdateBackoffDelays(delays));
    }

    /// The backoff registry the ensure flow consults (send it `ClearBackoff` to retry now).
    pub fn backoff(&self) -> &Addr<BackoffRegistryActor> {
        &self.backoff
    }

    /// The GC actors.
    pub fn gc(&self) -> &GcService {
        &self.gc
    }

    /// The durable state, when `state.dir` is set.
    pub fn store(&self) -> Option<&Arc<Store>> {
        self.store.as_ref()
    }

    /// Whether the node still takes requests (false once shutdown began).
    pub fn accepting(&self) -> bool {
        self.accepting.load(Ordering::Acquire)
    }

    /// The kubelet's `EnsureImageExists`; refused with `ShuttingDown` once
    /// [`Node::shutdown`] began.
    pub async fn ensure_image_exists(
        &self,
        req: &EnsureImageRequest,
    ) -> Result<Result<EnsureOk, EnsureError>, NodeError> {
        if !self.accepting() {
            return Err(NodeError::ShuttingDown);
        }
        Ok(self.manager.ensure_image_exists(req).await)
    }

    /// Starts pulling an image no pod asked for yet (see
    /// [`ImageManager::prefetch`]); refused with `ShuttingDown` once
    /// [`Node::shutdown`] began.
    pub async fn prefetch(&self, req: &PrefetchRequest) -> Result<Result<Prefetch, EnsureError>, NodeError> {
        self.refuse_when_stopping()?;
        Ok(self.manager.prefetch(req).await)
    }

    /// Subscribes to the kubelet's image events (`Pulling`, `Pulled`, …).
    pub fn subscribe_events(&self, to: Recipient<ImageEvent>) {
        self.manager.events().subscribe(to);
    }

    /// Subscribes to pull phases (queued, throttled, pulling, done, …).
    pub async fn subscribe_phases(&self, to: Recipient<PullPhaseChanged>) -> Result<(), NodeError> {
        self.queue.send(SubscribePhases(to)).await.map_err(|_| NodeError::Stopped("pull queue"))
    }

    /// The pulls the queue holds now: running, queued, parked (see [`ListPulls`]).
    pub async fn list_pulls(&self) -> Result<Vec<PullInfo>, NodeError> {
        self.queue.send(ListPulls).await.map_err(|_| NodeError::Stopped("pull queue"))
    }

    /// The downloads the stall check last found under
    /// `pull.min_download_rate` ([`ListSlowDownloads`]).
    pub async fn slow_downloads(&self) -> Result<Vec<String>, NodeError> {
        self.queue.send(ListSlowDownloads).await.map_err(|_| NodeError::Stopped("pull queue"))
    }

    /// The runtime's downloads in progress (containerd's ingests, see
    /// [`ListDownloads`]); a runtime other than containerd answers
    /// `Unimplemented`.
    pub async fn list_downloads(&self) -> Result<Vec<crate::domain::Download>, NodeError> {
        Ok(self.runtime.gateway.send(ListDownloads).await.map_err(|_| NodeError::Stopped("CRI gateway"))??)
    }

    /// The node-status image list, as the cache refresher last saw it.
    pub fn image_list(&self) -> ImageListReader {
        self.gc.images.clone()
    }

    /// The runtime's images now (a fresh `ListImages`), largest first.
    pub async fn list_images(&self) -> Result<Vec<Image>, NodeError> {
        let images =
            self.runtime.gateway.send(ListImages::default()).await.map_err(|_| NodeError::Stopped("CRI gateway"))??;
        Ok(crate::actors::cache_refresher::ImageList::new(images).images().to_vec())
    }

    /// The threshold GC the periodic loop runs; `dry_run` plans only.
    pub async fn garbage_collect(&self, dry_run: bool) -> Result<Arc<GcReport>, NodeError> {
        self.refuse_when_stopping()?;
        Ok(self.gc.executor.send(RunGc { dry_run }).await.map_err(|_| NodeError::Stopped("GC executor"))??)
    }

    /// Removes every unused image old enough (the kubelet's eviction path).
    pub async fn delete_unused_images(&self, dry_run: bool) -> Result<Arc<GcReport>, NodeError> {
        self.refuse_when_stopping()?;
        Ok(self
            .gc
            .executor
            .send(DeleteUnusedImages { dry_run })
            .await
            .map_err(|_| NodeError::Stopped("GC executor"))??)
    }

    /// Clears back-off in `scope`; returns how many keys were cleared.
    pub async fn clear_backoff(&self, scope: ClearScope) -> Result<usize, NodeError> {
        self.backoff.send(ClearBackoff { scope }).await.map_err(|_| NodeError::Stopped("backoff registry"))
    }

    /// Queue depths, back-offs, the last GC and the runtime.
    pub async fn status(&self) -> Result<NodeStatus, NodeError> {
        let queue = self.queue.send(GetQueueStatus).await.map_err(|_| NodeError::Stopped("pull queue"))?;
        let backoffs = self.backoff.send(ListBackoffs).await.map_err(|_| NodeError::Stopped("backoff registry"))?;
        let last_gc = self.gc.executor.send(GetLastGcReport).await.map_err(|_| NodeError::Stopped("GC executor"))?;
        Ok(NodeStatus {
            runtime: self.runtime.version.clone(),
            endpoint: self.runtime.endpoint.clone(),
            queue,
            backoffs,
            last_gc,
            accepting: self.accepting(),
        })
    }

    fn refuse_when_stopping(&self) -> Result<(), NodeError> {
        if self.accepting() { Ok(()) } else { Err(NodeError::ShuttingDown) }
    }

    /// The flag [`accepting`](Self::accepting) reads, for a server in
    /// front of the node that must refuse new work with it (the CRI front).
    pub(crate) fn accepting_flag(&self) -> Arc<AtomicBool> {
        self.accepting.clone()
    }

    /// Marks the node as not accepting (new ensures and GC runs are refused
    /// with [`NodeError::ShuttingDown`]) without waiting. `shutdown` does
    /// this first; a daemon calls it as soon as a signal arrives.
    pub fn stop_accepting(&self) {
        self.accepting.store(false, Ordering::Release);
    }

    /// Graceful stop: stop taking requests, let queued and running pulls
    /// finish for up to `grace`, run a last image detection (so the durable
    /// records include what those pulls brought), put the pull records
    /// written unsynced on disk (`crate::pull_records`, "Unsynced"), then
    /// stop every actor. The store closes when the last handle drops. The
    /// embedded runtime, if any, stops with the node.
    pub async fn shutdown(&self, grace: Duration) -> ShutdownReport {
        self.shutdown_unless(grace, std::future::pending()).await
    }

    /// [`shutdown`](Self::shutdown), waiting for pulls no longer once
    /// `hurry` resolves (a daemon's second SIGTERM or Ctrl-C): the grace
    /// ends there, and the rest (the last detection, the actors' stop)
    /// goes on as at its end.
    pub async fn shutdown_unless(&self, grace: Duration, hurry: impl Future<Output = ()>) -> ShutdownReport {
        self.stop_accepting();
        if let Some(ticker) = &self.prefetch {
            ticker.do_send(Stop);
        }
        let deadline = tokio::time::Instant::now() + grace;
        tokio::pin!(hurry);
        let mut hurried = false;
        let abandoned_pulls = loop {
            let left = match self.queue.send(GetQueueStatus).await {
                Ok(s) => s.queued + s.running,
                Err(_) => 0,
            };
            if left == 0 || hurried || tokio::time::Instant::now() >= deadline {
                break left;
            }
            tokio::select! {
                // Biased: no random branch order in a module the simulator
                // runs (actors.md, "Determinism").
                biased;
                () = &mut hurry, if !hurried => hurried = true,
                () = tokio::time::sleep(DRAIN_POLL) => {}
            }
        };
        // The last detection's wait is cut short too.
        let deadline = if hurried { tokio::time::Instant::now() } else { deadline };
        if abandoned_pulls > 0 && hurried {
            tracing::warn!(abandoned_pulls, ?grace, "shutdown cut short with pulls still in flight");
        } else if abandoned_pulls > 0 {
            tracing::warn!(abandoned_pulls, ?grace, "shutdown grace period ended with pulls still in flight");
        }
        // A last detection records what the drained pulls brought (first
        // seen, last used) in the durable state before the actors stop.
        let left = deadline.saturating_duration_since(tokio::time::Instant::now()).max(FINAL_DETECTION);
        match tokio::time::timeout(left, self.gc.detector.send(DetectImages)).await {
            Ok(Ok(Ok(_))) => {}
            Ok(Ok(Err(e))) => {
                tracing::warn!(error = %e, "final image detection failed; records are as of the last one");
            }
            Ok(Err(_)) | Err(_) => {
                tracing::warn!("final image detection did not finish; records are as of the last one");
            }
        }
        if let Err(e) = self.manager.pull_records().sync().await {
            tracing::warn!(error = %e, "could not sync the pull records at shutdown; the next start re-verifies those pulls");
        }
        self.gc.detector.do_send(Stop);
        self.gc.executor.do_send(Stop);
        self.gc.refresher.do_send(Stop);
        self.queue.do_send(Stop);
        self.backoff.do_send(Stop);
        ShutdownReport { abandoned_pulls }
    }
}
