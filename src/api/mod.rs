//! imaged's own gRPC API (`proto/imaged/v1`): the service over a [`Node`],
//! the unix-socket server the daemon runs, and the client `imagectl` uses.

pub mod convert;
pub mod server;
pub mod unary;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures_util::Stream;
use tokio::sync::{broadcast, watch};
use tonic::{Request, Response, Status};

use actix::Actor as _;

use crate::actors::event_hub::{EventHub, HubFeed};
use crate::cri::CriErrorKind;
use crate::node::{Node, NodeError};

/// The generated API types (`imaged.v1`).
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod proto {
    tonic::include_proto!("imaged.v1");
}

pub use proto::imaged_client::ImagedClient;
pub use proto::imaged_server::{Imaged, ImagedServer};

/// The metadata key of an `Unavailable` status that says what is: the
/// daemon answered, so only [`UNAVAILABLE_RUNTIME`] or
/// [`UNAVAILABLE_SHUTTING_DOWN`] follow it. A client tells "imaged is not
/// there" (no such key: the transport's) from "imaged answered that the
/// runtime is not" by it.
pub const UNAVAILABLE_WHAT: &str = "imaged-unavailable";
/// [`UNAVAILABLE_WHAT`]: the CRI runtime did not answer imaged.
pub const UNAVAILABLE_RUNTIME: &str = "runtime";
/// [`UNAVAILABLE_WHAT`]: imaged is stopping (a new call, or a stream that
/// was open).
pub const UNAVAILABLE_SHUTTING_DOWN: &str = "shutting-down";

/// `Unavailable` with `message`, saying what is ([`UNAVAILABLE_WHAT`]).
fn unavailable(what: &'static str, message: String) -> Status {
    let mut md = tonic::metadata::MetadataMap::new();
    md.insert(UNAVAILABLE_WHAT, tonic::metadata::MetadataValue::from_static(what));
    Status::with_metadata(tonic::Code::Unavailable, message, md)
}

/// What ends an open stream when imaged stops: clients reconnect on
/// `Unavailable`, where a stream that just ended looks finished.
fn shutting_down() -> Status {
    unavailable(UNAVAILABLE_SHUTTING_DOWN, NodeError::ShuttingDown.to_string())
}

fn status_of(e: NodeError) -> Status {
    match &e {
        NodeError::ShuttingDown => unavailable(UNAVAILABLE_SHUTTING_DOWN, e.to_string()),
        NodeError::Stopped(_) => Status::internal(e.to_string()),
        NodeError::Cri(c) => match c.kind() {
            CriErrorKind::RuntimeUnavailable => unavailable(UNAVAILABLE_RUNTIME, e.to_string()),
            CriErrorKind::DeadlineExceeded => Status::deadline_exceeded(e.to_string()),
            CriErrorKind::NotFound => Status::not_found(e.to_string()),
            _ => Status::unknown(e.to_string()),
        },
        NodeError::Gc(crate::actors::gc_executor::GcError::Busy) => Status::aborted(e.to_string()),
        NodeError::Gc(_) => Status::failed_precondition(e.to_string()),
    }
}

/// A GC run's answer: its report, also when it removed what it could and
/// still failed (`target_missed` says why); any other failure as a status.
fn gc_answer(
    r: Result<Arc<crate::actors::gc_executor::GcReport>, NodeError>,
) -> Result<Response<proto::GcReport>, Status> {
    match r {
        Ok(report) => Ok(Response::new(convert::gc_report(&report))),
        Err(NodeError::Gc(e)) if e.report().is_some() => {
            Ok(Response::new(e.report().map(|r| convert::gc_report(r)).unwrap_or_default()))
        }
        Err(e) => Err(status_of(e)),
    }
}

/// The API over a running [`Node`].
#[derive(Clone)]
pub struct ImagedService {
    node: Arc<Node>,
    events: HubFeed<proto::Event>,
    stopping: watch::Receiver<bool>,
    /// Room for `WatchPulls` streams ([`WATCH_PULLS_STREAMS`]).
    watchers: Arc<tokio::sync::Semaphore>,
    /// The daemon's `/healthz` and `/readyz`, for `GetStatus`.
    health: Option<crate::http::Health>,
}

impl std::fmt::Debug for ImagedService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImagedService").finish_non_exhaustive()
    }
}

impl ImagedService {
    /// The node the service answers for.
    pub fn node(&self) -> Arc<Node> {
        self.node.clone()
    }

    /// The service over `node`, its event streams fed by an [`EventHub`]
    /// it starts and subscribes to the node (call inside an actix System);
    /// event streams end when `stopping` turns true.
    pub async fn start(node: Arc<Node>, stopping: watch::Receiver<bool>) -> Result<Self, NodeError> {
        let buffer = node.config().daemon.event_buffer;
        let (hub, events) = EventHub::new(buffer, convert::image_event, convert::phase_event);
        let hub = hub.start();
        node.subscribe_events(hub.clone().recipient());
        node.subscribe_phases(hub.recipient()).await?;
        Ok(Self {
            node,
            events,
            stopping,
            watchers: Arc::new(tokio::sync::Semaphore::new(WATCH_PULLS_STREAMS)),
            health: None,
        })
    }

    /// `GetStatus` also answers what `health` says (the daemon's
    /// `/healthz` and `/readyz`), so `imagectl status` shows an
    /// unreachable runtime or a stopped actor.
    #[must_use]
    pub fn with_health(mut self, health: crate::http::Health) -> Self {
        self.health = Some(health);
        self
    }

    /// Serial or parallel and the limit, as a reload last set them.
    fn pull_mode(&self) -> String {
        self.node.settings_in_force().pull.concurrency.to_string()
    }

    /// The settings in force (what a SIGHUP last applied included).
    fn config_summary(&self) -> Vec<String> {
        let c = self.node.settings_in_force();
        let gc = &c.gc;
        vec![
            format!("pull.mode = {}", self.pull_mode()),
            format!(
                "pull.max_parallel_pulls_per_registry = {}",
                c.pull.registry_limit.map_or_else(|| "off".to_string(), |n| n.to_string())
            ),
            format!(
                "pull.presence_check_concurrency = {}",
                c.ensure.presence_check_concurrency.map_or_else(|| "off".to_string(), |n| n.to_string())
            ),
            format!(
                "pull.presence_check_window = {}",
                c.ensure.presence_check_window.map_or_else(|| "off".to_string(), |n| n.to_string())
            ),
            format!("pull.registries = {}", registries_text(&c.pull)),
            format!("pull.registry_pull_qps = {}", c.pull.qps),
            format!("pull.registry_burst = {}", c.pull.burst),
            format!("pull.throttle_mode = {:?}", c.pull.throttle_mode),
            format!("pull.single_flight = {}", c.pull.single_flight),
            format!(
                "pull.transient_retries = {} (first after {})",
                c.pull.retries.times,
                crate::domain::go_text::duration(c.pull.retries.delay)
            ),
            format!(
                "pull.slow_pull_warning = {}",
                c.pull.slow_pull_warning.map_or_else(|| "off".to_string(), crate::domain::go_text::duration)
            ),
            format!(
                "pull.stall_warning = {}",
                c.pull.stall_warning.map_or_else(|| "off".to_string(), crate::domain::go_text::duration)
            ),
            format!(
                "pull.stall_timeout = {}",
                c.pull.stall_timeout.map_or_else(|| "off".to_string(), crate::domain::go_text::duration)
            ),
            match c.pull.min_download_rate {
                0 => "pull.min_download_rate = off".to_string(),
                rate => format!("pull.min_download_rate = {rate} bytes/s"),
            },
            format!("backoff.initial = {}", crate::domain::go_text::duration(c.backoff.delays.initial)),
            format!("backoff.max = {}", crate::domain::go_text::duration(c.backoff.delays.max)),
            format!("backoff.reset_on_credential_change = {}", c.ensure.reset_backoff_on_credential_change),
            format!("backoff.reset_on_registry_recovery = {}", c.ensure.reset_backoff_on_registry_recovery),
            format!("gc.image_gc_high_threshold_percent = {}", gc.high_threshold_percent),
            format!("gc.image_gc_low_threshold_percent = {}", gc.low_threshold_percent),
            format!("gc.image_minimum_gc_age = {}", crate::domain::go_text::duration(gc.min_age)),
            format!("gc.image_maximum_gc_age = {}", crate::domain::go_text::duration(gc.max_age)),
            format!("gc.pinned_images = {:?}", gc.pinned_images),
            format!(
                "gc.keep_newest_tags_per_repo = {}",
                gc.keep_newest_tags_per_repo.map_or_else(|| "off".to_string(), |n| n.to_string())
            ),
            format!(
                "state.dir = {}",
                c.state_dir.as_ref().map_or_else(|| "(memory only)".to_string(), |d| d.display().to_string())
            ),
        ]
    }
}

/// The registries with limits of their own, by name: each one's rate and
/// its limit on pulls at once, when it has them.
fn registries(
    pull: &crate::actors::pull_queue::PullQueueSettings,
) -> Vec<(&str, Option<&crate::actors::pull_queue::RegistryRate>, Option<usize>)> {
    let mut names: Vec<&str> = pull.registry_rates.iter().map(|r| r.registry.as_str()).collect();
    names.extend(pull.registry_limits.keys().map(String::as_str));
    names.sort_unstable();
    names.dedup();
    names
        .into_iter()
        .map(|name| {
            let rate = pull.registry_rates.iter().find(|r| r.registry == name);
            (name, rate, pull.registry_limits.get(name).copied())
        })
        .collect()
}

/// [`registries`] as the status text says it (`none`, or
/// `docker.io (qps 0.05, burst 20), quay.io (max_parallel 2)`).
fn registries_text(pull: &crate::actors::pull_queue::PullQueueSettings) -> String {
    let all = registries(pull);
    if all.is_empty() {
        return "none".to_string();
    }
    let one = |(name, rate, limit): (&str, Option<&crate::actors::pull_queue::RegistryRate>, Option<usize>)| {
        let mut parts = Vec::new();
        if let Some(r) = rate {
            parts.push(format!("qps {}, burst {}", r.qps, r.burst));
        }
        if let Some(n) = limit {
            parts.push(format!("max_parallel {n}"));
        }
        format!("{name} ({})", parts.join(", "))
    };
    all.into_iter().map(one).collect::<Vec<_>>().join(", ")
}

/// The settings in force as the API's typed [`proto::Settings`]: what
/// `config_summary` says, named and valued as in the configuration file.
fn settings(c: &crate::config::Config) -> proto::Settings {
    let gc = &c.gc;
    use crate::actors::pull_queue::{Concurrency, ThrottleMode};
    use crate::domain::go_text::duration;
    let n = |v: usize| u32::try_from(v).unwrap_or(u32::MAX);
    let percent = |p: i64| i32::try_from(p).unwrap_or(i32::MAX);
    let (serialize, max_parallel) = match c.pull.concurrency {
        // Serial: one at a time, whatever maxParallelImagePulls says (unset).
        Concurrency::Serial => (true, None),
        Concurrency::Parallel(limit) => (false, limit.map(n)),
    };
    proto::Settings {
        pull: Some(proto::PullSettings {
            serialize_image_pulls: serialize,
            max_parallel_image_pulls: max_parallel,
            max_parallel_pulls_per_registry: c.pull.registry_limit.map_or(0, n),
            presence_check_window: c.ensure.presence_check_window.map_or(0, n),
            presence_check_concurrency: c.ensure.presence_check_concurrency.map_or(0, n),
            registry_pull_qps: c.pull.qps,
            registry_burst: c.pull.burst,
            throttle_mode: match c.pull.throttle_mode {
                ThrottleMode::Fail => "fail",
                ThrottleMode::Wait => "wait",
            }
            .to_string(),
            single_flight: c.pull.single_flight,
            slow_pull_warning: duration(c.pull.slow_pull_warning.unwrap_or_default()),
            stall_warning: duration(c.pull.stall_warning.unwrap_or_default()),
            stall_timeout: duration(c.pull.stall_timeout.unwrap_or_default()),
            min_download_rate: c.pull.min_download_rate,
            registries: registries(&c.pull)
                .into_iter()
                .map(|(registry, rate, limit)| proto::RegistrySettings {
                    registry: registry.to_string(),
                    qps: rate.map_or(0.0, |r| r.qps),
                    burst: rate.map_or(0, |r| r.burst),
                    max_parallel: limit.map_or(0, n),
                })
                .collect(),
            transient_retries: c.pull.retries.times,
            transient_retry_delay: duration(c.pull.retries.delay),
        }),
        backoff: Some(proto::BackoffSettings {
            initial: duration(c.backoff.delays.initial),
            max: duration(c.backoff.delays.max),
            reset_on_credential_change: c.ensure.reset_backoff_on_credential_change,
            reset_on_registry_recovery: c.ensure.reset_backoff_on_registry_recovery,
        }),
        gc: Some(proto::GcSettings {
            image_gc_high_threshold_percent: percent(gc.high_threshold_percent),
            image_gc_low_threshold_percent: percent(gc.low_threshold_percent),
            image_minimum_gc_age: duration(gc.min_age),
            image_maximum_gc_age: duration(gc.max_age),
            pinned_images: gc.pinned_images.clone(),
            keep_newest_tags_per_repo: gc.keep_newest_tags_per_repo.map_or(0, n),
        }),
        state: Some(proto::StateSettings {
            dir: c.state_dir.as_ref().map(|d| d.display().to_string()).unwrap_or_default(),
        }),
    }
}

type EventStream = Pin<Box<dyn Stream<Item = Result<proto::Event, Status>> + Send>>;

/// `WatchPulls`' answers.
type PullsStream = Pin<Box<dyn Stream<Item = Result<proto::ListPullsResponse, Status>> + Send>>;

/// `WatchPulls`' interval when the request sets none, and its bounds: each
/// answer costs a message to the queue and a listing of the runtime's
/// downloads, so a client cannot ask for more than ten a second.
pub const WATCH_PULLS_DEFAULT: Duration = Duration::from_secs(1);
/// See [`WATCH_PULLS_DEFAULT`].
pub const WATCH_PULLS_MIN: Duration = Duration::from_millis(100);
/// See [`WATCH_PULLS_DEFAULT`].
pub const WATCH_PULLS_MAX: Duration = Duration::from_secs(3600);

/// `WatchPulls` streams open at once, at most: one more is refused
/// (`ResourceExhausted`), so clients that never hang up cannot make the
/// runtime list its downloads without end.
pub const WATCH_PULLS_STREAMS: usize = 32;

/// A `WatchPulls` interval, checked.
fn watch_interval(ms: u32) -> Result<Duration, Status> {
    if ms == 0 {
        return Ok(WATCH_PULLS_DEFAULT);
    }
    let d = Duration::from_millis(u64::from(ms));
    if d < WATCH_PULLS_MIN || d > WATCH_PULLS_MAX {
        return Err(Status::invalid_argument(format!(
            "interval_ms {ms} is out of range: from {} to {} (0 = {})",
            WATCH_PULLS_MIN.as_millis(),
            WATCH_PULLS_MAX.as_millis(),
            WATCH_PULLS_DEFAULT.as_millis()
        )));
    }
    Ok(d)
}

/// `ListPulls`' answer now: the queue's pulls and the runtime's downloads.
async fn pulls_now(node: &Node) -> Result<proto::ListPullsResponse, Status> {
    let (pulls, downloads, slow) = tokio::join!(node.list_pulls(), node.list_downloads(), node.slow_downloads());
    let (pulls, slow) = (pulls.map_err(status_of)?, slow.map_err(status_of)?);
    let now = node.runtime().downloads_clock().now();
    let stall = convert::Stall { after: node.stall_in_force(), slow: &slow };
    Ok(convert::pulls(&pulls, downloads.map_err(|e| e.to_string()), &stall, now))
}

/// Images per `StreamImages` message of the API.
pub const IMAGE_BATCH: usize = 512;

/// The API's `StreamImages` answer.
pub type ImageBatches =
    std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Result<proto::ListImagesResponse, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl Imaged for ImagedService {
    // The daemon's socket serves `EnsureImage` in front of this
    // (`unary::EnsureRoute`, smaller per waiting call); this serves the
    // method wherever the generated server is used alone.
    // Written out (what `async fn` expands to here) so that the request is
    // converted before the future is made: the future then holds the
    // request once, not also the message as it arrived (an async fn keeps
    // its argument's room for its whole life: 360 bytes per waiting call,
    // and a burst has 10,000 waiting).
    fn ensure_image<'life0, 'async_trait>(
        &'life0 self,
        request: Request<proto::EnsureImageRequest>,
    ) -> Pin<Box<dyn Future<Output = Result<Response<proto::EnsureImageResponse>, Status>> + Send + 'async_trait>>
    where
        'life0: 'async_trait,
        Self: 'async_trait,
    {
        let req = match convert::ensure_request(request.into_inner()) {
            Ok(req) => req,
            Err(status) => return Box::pin(std::future::ready(Err(status))),
        };
        Box::pin(async move {
            let result = self.node.ensure_image_exists(&req).await.map_err(status_of)?;
            Ok(Response::new(convert::ensure_response(result)))
        })
    }

    async fn list_images(
        &self,
        _: Request<proto::ListImagesRequest>,
    ) -> Result<Response<proto::ListImagesResponse>, Status> {
        let images = self.node.list_images().await.map_err(status_of)?;
        let keeps = convert::Keeps::of(&self.node.gc_settings());
        Ok(Response::new(proto::ListImagesResponse {
            images: images.iter().map(|i| convert::image(i, &keeps)).collect(),
        }))
    }

    type StreamImagesStream = ImageBatches;

    /// The list of `ListImages` in batches of [`IMAGE_BATCH`], each
    /// converted as it is sent: no one message holds every image.
    async fn stream_images(
        &self,
        _: Request<proto::ListImagesRequest>,
    ) -> Result<Response<Self::StreamImagesStream>, Status> {
        let mut images = self.node.list_images().await.map_err(status_of)?;
        let keeps = convert::Keeps::of(&self.node.gc_settings());
        let mut batches = Vec::with_capacity(images.len().div_ceil(IMAGE_BATCH));
        while !images.is_empty() {
            let rest = images.split_off(images.len().min(IMAGE_BATCH));
            batches.push(std::mem::replace(&mut images, rest));
        }
        let stream = tokio_stream::iter(batches.into_iter().map(move |batch| {
            Ok(proto::ListImagesResponse { images: batch.iter().map(|i| convert::image(i, &keeps)).collect() })
        }));
        Ok(Response::new(Box::pin(stream)))
    }

    async fn garbage_collect(
        &self,
        request: Request<proto::GarbageCollectRequest>,
    ) -> Result<Response<proto::GcReport>, Status> {
        gc_answer(self.node.garbage_collect(request.into_inner().dry_run).await)
    }

    async fn delete_unused_images(
        &self,
        request: Request<proto::DeleteUnusedImagesRequest>,
    ) -> Result<Response<proto::GcReport>, Status> {
        gc_answer(self.node.delete_unused_images(request.into_inner().dry_run).await)
    }

    async fn clear_backoff(
        &self,
        request: Request<proto::ClearBackoffRequest>,
    ) -> Result<Response<proto::ClearBackoffResponse>, Status> {
        let scope = convert::clear_scope(request.into_inner());
        let cleared = self.node.clear_backoff(scope).await.map_err(status_of)?;
        Ok(Response::new(proto::ClearBackoffResponse { cleared: u32::try_from(cleared).unwrap_or(u32::MAX) }))
    }

    type WatchEventsStream = EventStream;

    async fn watch_events(
        &self,
        request: Request<proto::WatchEventsRequest>,
    ) -> Result<Response<Self::WatchEventsStream>, Status> {
        use futures_util::StreamExt as _;
        let r = request.into_inner();
        // Subscribe before copying the backlog: an event in between is sent
        // twice rather than lost.
        let rx = self.events.sender.subscribe();
        let backlog: Vec<Result<proto::Event, Status>> = if r.recent {
            self.events
                .recent
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .iter()
                .cloned()
                .map(Ok)
                .collect()
        } else {
            Vec::new()
        };
        let backlog = futures_util::stream::iter(backlog);
        if !r.follow {
            return Ok(Response::new(Box::pin(backlog)));
        }
        let stopping = self.stopping.clone();
        // Ends with `Unavailable` when imaged stops (then nothing more).
        let live = futures_util::stream::unfold(Some((rx, stopping)), |state| async move {
            let (mut rx, mut stopping) = state?;
            loop {
                if *stopping.borrow() {
                    return Some((Err(shutting_down()), None));
                }
                tokio::select! {
                    r = rx.recv() => match r {
                        Ok(e) => return Some((Ok(e), Some((rx, stopping)))),
                        Err(broadcast::error::RecvError::Lagged(n)) => {
                            return Some((Ok(convert::lagged(n)), Some((rx, stopping))));
                        }
                        Err(broadcast::error::RecvError::Closed) => return Some((Err(shutting_down()), None)),
                    },
                    changed = stopping.changed() => if changed.is_err() { return Some((Err(shutting_down()), None)) },
                }
            }
        });
        Ok(Response::new(Box::pin(backlog.chain(live))))
    }

    async fn list_pulls(
        &self,
        _: Request<proto::ListPullsRequest>,
    ) -> Result<Response<proto::ListPullsResponse>, Status> {
        Ok(Response::new(pulls_now(&self.node).await?))
    }

    type WatchPullsStream = PullsStream;

    async fn watch_pulls(
        &self,
        request: Request<proto::WatchPullsRequest>,
    ) -> Result<Response<Self::WatchPullsStream>, Status> {
        let every = watch_interval(request.into_inner().interval_ms)?;
        let Ok(permit) = self.watchers.clone().try_acquire_owned() else {
            return Err(Status::resource_exhausted(format!(
                "{WATCH_PULLS_STREAMS} WatchPulls streams are open already; close one, or use ListPulls"
            )));
        };
        let mut ticks = tokio::time::interval(every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let state = (self.node.clone(), ticks, self.stopping.clone(), permit);
        // Ends with `Unavailable` when imaged stops (then nothing more).
        let answers = futures_util::stream::unfold(Some(state), |state| async move {
            let (node, mut ticks, mut stopping, permit) = state?;
            // The first tick is at once.
            loop {
                if *stopping.borrow() {
                    return Some((Err(shutting_down()), None));
                }
                tokio::select! {
                    _ = ticks.tick() => break,
                    changed = stopping.changed() => if changed.is_err() { return Some((Err(shutting_down()), None)) },
                }
            }
            let answer = pulls_now(&node).await;
            Some((answer, Some((node, ticks, stopping, permit))))
        });
        Ok(Response::new(Box::pin(answers)))
    }

    async fn prefetch_image(
        &self,
        request: Request<proto::PrefetchImageRequest>,
    ) -> Result<Response<proto::PrefetchImageResponse>, Status> {
        use crate::ensure::Prefetch;
        let (req, wait) = convert::prefetch_request(request.into_inner())?;
        let answer = match self.node.prefetch(&req).await.map_err(status_of)? {
            Err(e) => convert::prefetch_response("failed", String::new(), format!("{}: {}", e.kind, e.message)),
            Ok(Prefetch::Present { image_ref }) => convert::prefetch_response("present", image_ref, String::new()),
            Ok(Prefetch::Pulling { joined, done }) if !wait => {
                // The pull goes on without anyone awaiting its end.
                drop(done);
                convert::prefetch_response(if joined { "joined" } else { "queued" }, String::new(), String::new())
            }
            Ok(Prefetch::Pulling { done, .. }) => match done.await {
                Ok(image_ref) => convert::prefetch_response("pulled", image_ref, String::new()),
                Err(e) => convert::prefetch_response("failed", String::new(), e),
            },
        };
        Ok(Response::new(answer))
    }

    async fn get_status(&self, _: Request<proto::GetStatusRequest>) -> Result<Response<proto::StatusResponse>, Status> {
        let s = self.node.status().await.map_err(status_of)?;
        let n = |v: usize| u32::try_from(v).unwrap_or(u32::MAX);
        Ok(Response::new(proto::StatusResponse {
            version: env!("CARGO_PKG_VERSION").to_string(),
            runtime_name: s.runtime.runtime_name,
            runtime_version: s.runtime.runtime_version,
            runtime_api_version: s.runtime.runtime_api_version,
            endpoint: s.endpoint.to_string(),
            pull_mode: self.pull_mode(),
            queued: n(s.queue.queued),
            running: n(s.queue.running),
            parked: n(s.queue.parked),
            waiters: n(s.queue.waiters),
            backoffs: s.backoffs.iter().map(convert::backoff).collect(),
            last_gc: s.last_gc.as_deref().map(convert::gc_report),
            accepting: s.accepting,
            config: self.config_summary(),
            settings: Some(settings(&self.node.settings_in_force())),
            health: self.health.as_ref().map(convert::daemon_health),
            prefetch: self.node.declared_images().iter().map(convert::declared_image).collect(),
        }))
    }
}

/// How long [`client`] waits for the daemon to speak once connected.
pub const CLIENT_CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// A client of the daemon at `socket` (connects lazily: the first call
/// fails with `Unavailable` if no daemon is there). A connection counts
/// once the other end speaks: an HTTP/2 server (the daemon's, as every
/// gRPC server) sends its settings as soon as it accepts, so a listener
/// that accepts and stays silent (a hung process, not imaged) fails the
/// first call after [`CLIENT_CONNECT_TIMEOUT`] instead of hanging it.
pub fn client(socket: &std::path::Path) -> Result<ImagedClient<tonic::transport::Channel>, crate::error::AppError> {
    let path = socket.to_path_buf();
    // The URI is required by tonic but unused: the connector dials the socket.
    // Keep-alive as the CRI client's: a daemon that hangs (not dies) under
    // `imagectl events -f` is noticed.
    let channel = tonic::transport::Endpoint::from_static("http://imaged.sock")
        .connect_timeout(CLIENT_CONNECT_TIMEOUT)
        .initial_connection_window_size(crate::cri::transport::CONNECTION_WINDOW)
        .http2_keep_alive_interval(std::time::Duration::from_secs(30))
        .keep_alive_while_idle(false)
        .connect_with_connector_lazy(tower::service_fn(move |_| {
            let path = path.clone();
            async move {
                let stream = tokio::net::UnixStream::connect(&path).await?;
                // Readable: the server's first bytes are there (not read).
                stream.readable().await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
            }
        }));
    Ok(ImagedClient::new(channel).max_decoding_message_size(64 << 20))
}
