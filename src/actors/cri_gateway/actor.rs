//! `CriGatewayActor`: a thin actix shell over [`CriClient`] that adds per-call
//! deadlines and the fault plan, and never serialises calls.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use actix::prelude::*;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::messages::*;
use super::{CriDeadlines, CriSettings};
use crate::cri::{CriClient, CriEndpoint, CriError, CriErrorKind, Rpc};
use crate::domain::{
    Container, ContainerStatus, Download, Image, ImageFsInfo, ImageSpec, ImageStatus, PodSandbox, RuntimeVersion,
};
use crate::fault::{FaultAction, FaultPlan};
use crate::metrics::Metrics;

/// Pause between `Version` attempts while waiting for the runtime at start.
const STARTUP_RETRY: Duration = Duration::from_millis(200);

/// What every call needs: the client, the deadlines and the fault plan.
/// Shared by the actor and the [`CriReader`]s it hands out.
#[derive(Clone)]
pub(super) struct Core {
    /// Shared, not cloned into each call: a call's future holds this
    /// pointer, not the client's 424 bytes (twice), while it waits.
    client: Arc<CriClient>,
    deadlines: CriDeadlines,
    /// Applied before each call.
    faults: Arc<RwLock<FaultPlan>>,
    /// False while the plan is empty: the common case reads no lock.
    has_faults: Arc<AtomicBool>,
    /// Every call's latency (one histogram observe) and errors.
    metrics: Metrics,
    /// Whether listings stream (`StreamImages`) or fall back to `ListImages`.
    pub(super) streaming: super::streaming::Streaming,
    /// Counts the `PullImage` and `RemoveImage` calls ended: an answer
    /// about images read before the count moved may be out of date.
    image_changes: Arc<AtomicU64>,
    /// Told when a call finds the runtime unavailable, and when one
    /// succeeds after that (the daemon's readiness probe then runs at
    /// once: see [`CriReader::runtime_changed`]).
    lost: Arc<RuntimeSignal>,
}

/// See [`Core::lost`].
#[derive(Debug, Default)]
struct RuntimeSignal {
    changed: tokio::sync::Notify,
    /// A call found the runtime unavailable and none has succeeded since.
    down: AtomicBool,
}

impl RuntimeSignal {
    /// One call's end: `Some(unavailable)` for a failure, `None` for a
    /// success. A success costs one relaxed load while nothing failed.
    fn call_ended(&self, unavailable: Option<bool>) {
        match unavailable {
            Some(true) => {
                self.down.store(true, Ordering::Relaxed);
                self.changed.notify_one();
            }
            None if self.down.load(Ordering::Relaxed) && self.down.swap(false, Ordering::Relaxed) => {
                self.changed.notify_one();
            }
            _ => {}
        }
    }
}

/// The CRI gateway actor. See the module docs and `actors.md`.
pub struct CriGatewayActor {
    core: Core,
    mailbox_capacity: usize,
}

/// A direct handle on the gateway for the two hot calls: `ImageStatus`
/// (ensure's presence check) and `PullImage` (the pull queue's pull tasks),
/// run on the caller's task with the gateway's client, deadlines, fault
/// plan and metrics, without a trip through the mailbox and a task spawn.
/// Still the gateway's code: nothing else speaks CRI. Get one with
/// [`GetReader`].
#[derive(Clone)]
pub struct CriReader {
    core: Core,
}

impl std::fmt::Debug for CriReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CriReader").field("endpoint", &self.core.client.endpoint().to_string()).finish()
    }
}

impl CriReader {
    /// How many `PullImage` and `RemoveImage` calls through this gateway
    /// have ended (any caller: the actor's, every reader's): an answer about
    /// images taken while this stayed the same is still what the runtime
    /// would say, but for changes made behind imaged's back.
    pub fn image_changes(&self) -> u64 {
        self.core.image_changes.load(Ordering::Acquire)
    }

    /// Waits (one permit kept) until a call through this gateway, by any
    /// caller, fails because the runtime is unavailable, or succeeds after
    /// such a failure: a watcher of the runtime's health learns of an
    /// outage, and of its end, from the traffic instead of its next probe.
    pub async fn runtime_changed(&self) {
        self.core.lost.changed.notified().await;
    }

    /// Takes a kept permit of [`runtime_changed`](Self::runtime_changed)
    /// (what a probe that just ran has found out already).
    pub fn forget_runtime_change(&self) {
        use futures_util::FutureExt as _;
        let _ = self.core.lost.changed.notified().now_or_never();
    }

    /// Whether a fault plan is set (every call must then reach it).
    pub fn has_faults(&self) -> bool {
        self.core.has_faults.load(Ordering::Acquire)
    }

    /// `ImageStatus`, exactly as [`GetImageStatus`] through the actor.
    pub fn image_status(
        &self,
        image: ImageSpec,
        verbose: bool,
    ) -> impl Future<Output = Result<ImageStatus, CriError>> + 'static + use<> {
        let name = image.image.clone();
        self.core.call_within(Rpc::ImageStatus, Some(name), None, move |c, d| async move {
            c.image_status(image, verbose, d).await
        })
    }

    /// containerd's downloads in progress, exactly as [`ListDownloads`]
    /// through the actor.
    pub fn list_downloads(&self) -> impl Future<Output = Result<Vec<Download>, CriError>> + 'static + use<> {
        self.core.call_within(Rpc::ListStatuses, None, Some(DOWNLOADS_DEADLINE), move |c, d| async move {
            c.list_downloads(d).await
        })
    }

    /// `PullImage`, exactly as the [`PullImage`] message through the actor.
    pub fn pull_image(&self, m: PullImage) -> impl Future<Output = Result<String, CriError>> + 'static + use<> {
        let image = m.image.image.clone();
        let requested = m.deadline;
        self.core.call_within(Rpc::PullImage, Some(image), requested, move |c, d| async move {
            c.pull_image(m.image, m.auth, m.sandbox, d).await
        })
    }
}

impl CriReader {
    /// `PullImage` of a client's request bytes (a CRI front's call), every
    /// field kept but a bare `auth.server_address`
    /// ([`crate::cri::wire::pull_request_for_runtime`]); the answer as the
    /// runtime encoded it. `image` names the pull for the fault plan.
    pub fn pull_wire(
        &self,
        image: &str,
        body: prost::bytes::Bytes,
        requested: Option<Duration>,
    ) -> impl Future<Output = Result<prost::bytes::Bytes, CriError>> + 'static + use<> {
        let body = crate::cri::wire::pull_request_for_runtime(body)
            .map_err(|e| CriError::new(CriErrorKind::InvalidArgument, format!("PullImageRequest: {e}")));
        let call = body.map(|b| self.forward(Rpc::PullImage, Some(image), b, requested));
        async move { call?.await }
    }

    /// One `ImageService` call forwarded as bytes (see
    /// [`CriClient::forward`]): the request as a client sent it, the answer
    /// as the runtime encoded it, with the gateway's deadlines (the caller's
    /// `requested` one when shorter), fault plan and metrics. `image` names
    /// the call's image for the fault plan and logs.
    pub fn forward(
        &self,
        rpc: Rpc,
        image: Option<&str>,
        body: prost::bytes::Bytes,
        requested: Option<Duration>,
    ) -> impl Future<Output = Result<prost::bytes::Bytes, CriError>> + 'static + use<> {
        self.core.call_within(rpc, image.map(str::to_owned), requested, move |c, d| async move {
            c.forward(rpc, body, d).await
        })
    }
}

impl CriGatewayActor {
    /// A gateway over `client` (not started).
    pub fn new(client: CriClient, cfg: &CriSettings) -> Self {
        Self { core: Core::new(client, cfg), mailbox_capacity: cfg.mailbox_capacity }
    }

    /// The gateway with a fault plan already set.
    #[must_use]
    pub fn with_faults(self, plan: FaultPlan) -> Self {
        self.core.set_faults(plan);
        self
    }

    /// Connects to `endpoint`, checks the runtime answers `Version` (retrying
    /// while it is unavailable, up to `startup_timeout`), and starts the
    /// gateway on the current actix arbiter.
    pub async fn connect(endpoint: &CriEndpoint, cfg: &CriSettings) -> Result<(Addr<Self>, RuntimeVersion), CriError> {
        let client = CriClient::new(endpoint, cfg.connect_timeout)
            .map_err(|e| CriError::new(CriErrorKind::InvalidArgument, e.to_string()))?;
        Self::connect_client(client, cfg).await
    }

    /// [`connect`](Self::connect) over a client the caller made (the
    /// simulator's, over its in-process transport).
    pub async fn connect_client(
        client: CriClient,
        cfg: &CriSettings,
    ) -> Result<(Addr<Self>, RuntimeVersion), CriError> {
        let endpoint = client.endpoint().clone();
        let endpoint = &endpoint;
        let version = wait_for_version(&client, cfg).await?;
        info!(
            endpoint = %endpoint,
            runtime = %version.runtime_name,
            runtime_version = %version.runtime_version,
            api = %version.runtime_api_version,
            "connected to CRI runtime"
        );
        if version.runtime_api_version != "v1" {
            warn!(api = %version.runtime_api_version, "runtime reports a CRI API other than v1");
        }
        Ok((Self::new(client, cfg).start(), version))
    }

    fn call<T, F, Fut>(&self, rpc: Rpc, image: Option<String>, f: F) -> ResponseFuture<Result<T, CriError>>
    where
        T: 'static,
        F: FnOnce(Arc<CriClient>, Option<Duration>) -> Fut + 'static,
        Fut: Future<Output = Result<T, CriError>> + 'static,
    {
        Box::pin(self.core.call_within(rpc, image, None, f))
    }
}

// === impl Core ===

impl Core {
    pub(super) fn new(client: CriClient, cfg: &CriSettings) -> Self {
        Self {
            client: Arc::new(client),
            deadlines: cfg.deadlines.clone(),
            faults: Arc::new(RwLock::new(FaultPlan::default())),
            has_faults: Arc::new(AtomicBool::new(false)),
            metrics: cfg.metrics.clone(),
            streaming: super::streaming::Streaming::default(),
            image_changes: Arc::new(AtomicU64::new(0)),
            lost: Arc::default(),
        }
    }

    pub(super) fn set_faults(&self, plan: FaultPlan) {
        let empty = plan.is_empty();
        *self.faults.write().unwrap_or_else(std::sync::PoisonError::into_inner) = plan;
        self.has_faults.store(!empty, Ordering::Release);
    }

    /// Runs one call: fault plan first, then the RPC, all within the call's
    /// deadline (the caller's, when shorter than the configured one). The
    /// fault is decided now, when the call is made: in mailbox order for the
    /// actor's calls, in call order for a reader's.
    pub(super) fn call_within<T, F, Fut>(
        &self,
        rpc: Rpc,
        image: Option<String>,
        requested: Option<Duration>,
        f: F,
    ) -> impl Future<Output = Result<T, CriError>> + 'static + use<T, F, Fut>
    where
        T: 'static,
        F: FnOnce(Arc<CriClient>, Option<Duration>) -> Fut + 'static,
        Fut: Future<Output = Result<T, CriError>> + 'static,
    {
        let client = self.client.clone();
        let deadline = match (self.deadlines.get(rpc), requested) {
            (Some(c), Some(r)) => Some(c.min(r)),
            (c, r) => c.or(r),
        };
        let fault = if self.has_faults.load(Ordering::Acquire) {
            self.faults.read().unwrap_or_else(std::sync::PoisonError::into_inner).decide(rpc, image.as_deref())
        } else {
            None
        };
        let metrics = self.metrics.clone();
        let changes = matches!(rpc, Rpc::PullImage | Rpc::RemoveImage).then(|| self.image_changes.clone());
        let lost = self.lost.clone();
        async move {
            let started = Instant::now();
            let result = match fault {
                // No fault: the client enforces the deadline (a read with its
                // own timer, a call that does work by sending grpc-timeout,
                // which tonic's client enforces; both DeadlineExceeded); a
                // second timer here would only cost time.
                None => f(client, deadline).await,
                // Boxed: only calls a fault fires on pay for its timer.
                Some(fault) => {
                    Box::pin(async move {
                        let work = async move {
                            match fault {
                                FaultAction::Fail(e) => Err(e),
                                FaultAction::Delay(d) => {
                                    tokio::time::sleep(d).await;
                                    f(client, deadline).await
                                }
                                FaultAction::Hang => std::future::pending().await,
                                FaultAction::DropReply => {
                                    let _lost = f(client, deadline).await;
                                    std::future::pending().await
                                }
                                // Deliberate: a fault plan's stand-in for a bug.
                                #[allow(clippy::panic)]
                                FaultAction::Panic => panic!("fault plan: injected panic in the CRI gateway ({rpc})"),
                            }
                        };
                        // A fault's delay counts against the call's deadline.
                        match deadline {
                            Some(d) => tokio::time::timeout(d, work)
                                .await
                                .unwrap_or_else(|_| Err(CriError::deadline_exceeded())),
                            None => work.await,
                        }
                    })
                    .await
                }
            };
            metrics.cri_call(rpc, started.elapsed(), result.as_ref().err());
            // Ended either way: a failed pull or remove may have changed
            // something all the same.
            if let Some(changes) = changes {
                changes.fetch_add(1, Ordering::AcqRel);
            }
            lost.call_ended(result.as_ref().err().map(|e| e.kind() == CriErrorKind::RuntimeUnavailable));
            if let Err(e) = &result {
                debug!(rpc = rpc.name(), image = image.as_deref().unwrap_or(""), kind = ?e.kind(),
                    elapsed_ms = crate::domain::limits::millis(started.elapsed()), error = %e, "CRI call failed");
            }
            result
        }
    }
}

async fn wait_for_version(client: &CriClient, cfg: &CriSettings) -> Result<RuntimeVersion, CriError> {
    let give_up = Instant::now() + cfg.startup_timeout;
    let mut said = false;
    loop {
        let deadline = cfg.deadlines.get(Rpc::Version).unwrap_or(cfg.connect_timeout);
        let started = Instant::now();
        let attempt = tokio::time::timeout(deadline, client.version(Some(deadline)))
            .await
            .unwrap_or_else(|_| Err(CriError::deadline_exceeded()));
        cfg.metrics.cri_call(Rpc::Version, started.elapsed(), attempt.as_ref().err());
        match attempt {
            Ok(v) => return Ok(v),
            Err(e) if e.is_retryable() && Instant::now() + STARTUP_RETRY < give_up => {
                // Once, so a start that waits says what for (then quiet).
                if !said {
                    said = true;
                    info!(endpoint = %client.endpoint(), error = %e,
                        "waiting for the CRI runtime to answer (runtime.startup_timeout {})",
                        crate::domain::go_text::duration(cfg.startup_timeout));
                }
                debug!(error = %e, "runtime not ready yet; retrying Version");
                tokio::time::sleep(STARTUP_RETRY).await;
            }
            Err(e) => return Err(e),
        }
    }
}

impl Actor for CriGatewayActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.set_mailbox_capacity(self.mailbox_capacity);
        debug!(endpoint = %self.core.client.endpoint(), mailbox = self.mailbox_capacity, "CRI gateway started");
    }

    fn stopped(&mut self, _ctx: &mut Self::Context) {
        debug!("CRI gateway stopped");
    }
}

// === impl Handler ===

impl Handler<GetVersion> for CriGatewayActor {
    type Result = ResponseFuture<Result<RuntimeVersion, CriError>>;
    /// Asks the runtime for its version.
    fn handle(&mut self, _: GetVersion, _: &mut Self::Context) -> Self::Result {
        self.call(Rpc::Version, None, move |c, d| async move { c.version(d).await })
    }
}

impl Handler<ListImages> for CriGatewayActor {
    type Result = ResponseFuture<Result<Vec<Image>, CriError>>;
    /// Lists images: by `StreamImages` while the runtime offers it, else
    /// (it answered `Unimplemented`) by `ListImages`.
    fn handle(&mut self, m: ListImages, _: &mut Self::Context) -> Self::Result {
        let image = m.filter.as_ref().map(|s| s.image.clone());
        let streaming = self.core.streaming.clone();
        self.call(Rpc::ListImages, image, move |c, d| async move {
            if streaming.should_try() {
                match c.stream_images(m.filter.clone(), d).await {
                    Ok(images) => {
                        streaming.offered();
                        return Ok(images);
                    }
                    Err(e) if e.code() == crate::cri::StatusCode::Unimplemented => streaming.not_offered(),
                    Err(e) => return Err(e),
                }
            }
            c.list_images(m.filter, d).await
        })
    }
}

impl Handler<GetImageStatus> for CriGatewayActor {
    type Result = ResponseFuture<Result<ImageStatus, CriError>>;
    /// Looks up one image.
    fn handle(&mut self, m: GetImageStatus, _: &mut Self::Context) -> Self::Result {
        let (image, verbose) = (m.image.image.clone(), m.verbose);
        self.call(Rpc::ImageStatus, Some(image), move |c, d| async move { c.image_status(m.image, verbose, d).await })
    }
}

impl Handler<PullImage> for CriGatewayActor {
    type Result = ResponseFuture<Result<String, CriError>>;
    /// Pulls an image (the same code as [`CriReader::pull_image`]).
    fn handle(&mut self, m: PullImage, _: &mut Self::Context) -> Self::Result {
        Box::pin(CriReader { core: self.core.clone() }.pull_image(m))
    }
}

impl Handler<RemoveImage> for CriGatewayActor {
    type Result = ResponseFuture<Result<(), CriError>>;
    /// Removes an image.
    fn handle(&mut self, m: RemoveImage, _: &mut Self::Context) -> Self::Result {
        let image = m.image.image.clone();
        self.call(Rpc::RemoveImage, Some(image), move |c, d| async move { c.remove_image(m.image, d).await })
    }
}

impl Handler<GetImageFsInfo> for CriGatewayActor {
    type Result = ResponseFuture<Result<ImageFsInfo, CriError>>;
    /// Reads image filesystem usage.
    fn handle(&mut self, _: GetImageFsInfo, _: &mut Self::Context) -> Self::Result {
        self.call(Rpc::ImageFsInfo, None, move |c, d| async move { c.image_fs_info(d).await })
    }
}

impl Handler<ListContainers> for CriGatewayActor {
    type Result = ResponseFuture<Result<Vec<Container>, CriError>>;
    /// Lists containers.
    fn handle(&mut self, m: ListContainers, _: &mut Self::Context) -> Self::Result {
        self.call(Rpc::ListContainers, None, move |c, d| async move { c.list_containers(m.filter, d).await })
    }
}

impl Handler<ListPodSandboxes> for CriGatewayActor {
    type Result = ResponseFuture<Result<Vec<PodSandbox>, CriError>>;
    /// Lists pod sandboxes.
    fn handle(&mut self, m: ListPodSandboxes, _: &mut Self::Context) -> Self::Result {
        self.call(Rpc::ListPodSandbox, None, move |c, d| async move { c.list_pod_sandbox(m.filter, d).await })
    }
}

impl Handler<GetContainerStatus> for CriGatewayActor {
    type Result = ResponseFuture<Result<ContainerStatus, CriError>>;
    /// Reads one container's status.
    fn handle(&mut self, m: GetContainerStatus, _: &mut Self::Context) -> Self::Result {
        let verbose = m.verbose;
        self.call(Rpc::ContainerStatus, None, move |c, d| async move { c.container_status(m.id, verbose, d).await })
    }
}

impl Handler<ListDownloads> for CriGatewayActor {
    type Result = ResponseFuture<Result<Vec<Download>, CriError>>;
    /// Lists containerd's downloads in progress.
    fn handle(&mut self, _: ListDownloads, _: &mut Self::Context) -> Self::Result {
        Box::pin(CriReader { core: self.core.clone() }.list_downloads())
    }
}

impl Handler<SetFaultPlan> for CriGatewayActor {
    type Result = ();
    /// Replaces the fault plan; calls already decided keep their fault.
    fn handle(&mut self, m: SetFaultPlan, _: &mut Self::Context) {
        self.core.set_faults(m.0);
    }
}

impl Handler<GetReader> for CriGatewayActor {
    type Result = MessageResult<GetReader>;
    /// Hands out a read handle sharing this gateway's client, deadlines and faults.
    fn handle(&mut self, _: GetReader, _: &mut Self::Context) -> Self::Result {
        MessageResult(CriReader { core: self.core.clone() })
    }
}
