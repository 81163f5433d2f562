//! The tonic services of the embedded runtime: CRI `ImageService` and the
//! `RuntimeService` calls imaged uses. Every other RuntimeService method is
//! absent from our proto subset, so tonic answers it `Unimplemented`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tonic::{Request, Response, Status};

use crate::cri::proto as pb;
use crate::cri::proto::image_service_server::ImageService;
use crate::cri::proto::runtime_service_server::RuntimeService;
use crate::cri::{CriErrorKind, Rpc};
use crate::domain::{AuthConfig, ContainerFilter, ImageSpec, PodSandboxFilter, RuntimeVersion};
use crate::fault::{FaultAction, FaultPlan};

use super::state::State;

/// Counters the tests read to assert what reached the runtime.
#[derive(Debug, Default)]
pub struct Counters {
    calls: [AtomicU64; Rpc::ALL.len()],
    /// Calls being served now, per RPC (from arrival to reply, faults included).
    in_flight: [AtomicU64; Rpc::ALL.len()],
    /// Most calls served at once per RPC since the last reset.
    max_in_flight: [AtomicU64; Rpc::ALL.len()],
    pulls_in_flight: AtomicU64,
    max_pulls_in_flight: AtomicU64,
    pulls_completed: AtomicU64,
}

/// A snapshot of [`Counters`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RuntimeStats {
    /// Calls received per RPC (including failed and faulted ones).
    pub calls: Vec<(Rpc, u64)>,
    /// Most calls of each RPC served at once since the last reset.
    pub max_in_flight: Vec<(Rpc, u64)>,
    /// Pulls running now.
    pub pulls_in_flight: u64,
    /// Most pulls that ran at once since the last reset.
    pub max_pulls_in_flight: u64,
    /// Pulls that finished successfully.
    pub pulls_completed: u64,
}

impl RuntimeStats {
    /// Calls received for one RPC.
    pub fn calls(&self, rpc: Rpc) -> u64 {
        self.calls.iter().find(|(r, _)| *r == rpc).map_or(0, |(_, n)| *n)
    }

    /// Most calls of one RPC served at once.
    pub fn max_in_flight(&self, rpc: Rpc) -> u64 {
        self.max_in_flight.iter().find(|(r, _)| *r == rpc).map_or(0, |(_, n)| *n)
    }
}

fn index(rpc: Rpc) -> usize {
    Rpc::ALL.iter().position(|r| *r == rpc).unwrap_or(0)
}

impl Counters {
    /// A snapshot.
    pub fn snapshot(&self) -> RuntimeStats {
        RuntimeStats {
            calls: Rpc::ALL.iter().map(|r| (*r, self.calls[index(*r)].load(Ordering::Relaxed))).collect(),
            max_in_flight: Rpc::ALL
                .iter()
                .map(|r| (*r, self.max_in_flight[index(*r)].load(Ordering::Relaxed)))
                .collect(),
            pulls_in_flight: self.pulls_in_flight.load(Ordering::Relaxed),
            max_pulls_in_flight: self.max_pulls_in_flight.load(Ordering::Relaxed),
            pulls_completed: self.pulls_completed.load(Ordering::Relaxed),
        }
    }

    /// Zeroes every counter but the pulls in flight.
    pub fn reset(&self) {
        for c in &self.calls {
            c.store(0, Ordering::Relaxed);
        }
        for (max, now) in self.max_in_flight.iter().zip(&self.in_flight) {
            max.store(now.load(Ordering::Relaxed), Ordering::Relaxed);
        }
        self.max_pulls_in_flight.store(self.pulls_in_flight.load(Ordering::Relaxed), Ordering::Relaxed);
        self.pulls_completed.store(0, Ordering::Relaxed);
    }
}

/// Most PullImage calls the pull log keeps: a runtime serving for days
/// (the daemon's, `imaged embedded-runtime`) must not keep every one. When
/// full, the older half is dropped.
pub const PULL_LOG_MAX: usize = 1024;

/// Appends to the pull log, dropping its older half when it is full.
fn log_pull(log: &mut Vec<String>, image: &str) {
    if log.len() >= PULL_LOG_MAX {
        log.drain(..PULL_LOG_MAX / 2);
    }
    log.push(image.to_string());
}

/// State shared by the services and the embedder's handle.
#[derive(Debug, Default)]
pub struct Shared {
    /// The runtime's state.
    pub state: Mutex<State>,
    /// RPC-level fault plan.
    pub faults: Mutex<FaultPlan>,
    /// Call counters.
    pub counters: Counters,
    /// Images of the PullImage calls received, in arrival order (the last
    /// [`PULL_LOG_MAX`] at most).
    pub pull_log: Mutex<Vec<String>>,
    /// `StreamImages` answers `Unimplemented` (a runtime without KEP-5825).
    pub stream_images_off: std::sync::atomic::AtomicBool,
    /// `StreamImages` calls received (served or refused).
    pub stream_calls: AtomicU64,
    /// Simulated pull times are tokio sleeps, not the precise clock thread
    /// (the in-process runtime on the simulator's paused time).
    pub tokio_time: std::sync::atomic::AtomicBool,
    /// Told what the runtime does (the simulator's invariants).
    pub observer: Mutex<Option<super::Observer>>,
    /// Numbers the pulls told to the observer.
    pub observed_calls: AtomicU64,
    /// Where the state is kept across restarts (`None` = memory only).
    pub(super) state_dir: Option<super::persist::StateDir>,
    /// Pulls waiting out their simulated time, by a number of their own:
    /// what the content service lists as downloads (as containerd's
    /// ingests; one per pull, its image's whole size).
    pub(super) downloads: Mutex<std::collections::BTreeMap<u64, Ingest>>,
    /// Numbers the entries of `downloads`.
    pub(super) download_seq: AtomicU64,
    /// The clock the downloads' times are on.
    pub(super) clock: DownloadsClock,
}

/// The clock a runtime stamps its downloads with: the system's (as
/// containerd's), or, in process on the simulator's paused time, tokio's.
#[derive(Debug, Clone)]
pub(super) struct DownloadsClock(pub(super) crate::clock::Clock);

impl Default for DownloadsClock {
    fn default() -> Self {
        Self(crate::clock::Clock::system())
    }
}

/// A pull in its simulated time, as a download.
#[derive(Debug)]
pub(super) struct Ingest {
    digest: String,
    size: u64,
    started: std::time::SystemTime,
    since: tokio::time::Instant,
    takes: std::time::Duration,
    stalls_after: Option<std::time::Duration>,
    /// Bytes a second it still writes once stalled (0: none).
    drips: u64,
}

impl Ingest {
    /// The download as of `now` on the runtime's clock: written in
    /// proportion to the time passed (short of the whole until the pull
    /// ends), last written now; once stalled, only its drip.
    fn at(&self, now: std::time::SystemTime) -> crate::domain::Download {
        let elapsed = self.since.elapsed();
        let share = |d: std::time::Duration| {
            (d.as_secs_f64() / self.takes.as_secs_f64().max(f64::MIN_POSITIVE)).clamp(0.0, 1.0)
        };
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, clippy::cast_precision_loss)]
        let bytes = |share: f64| ((self.size as f64) * share) as u64;
        let (mut offset, mut updated) = (bytes(share(elapsed)), now);
        if let Some(stop) = self.stalls_after
            && elapsed > stop
        {
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, clippy::cast_precision_loss)]
            let dripped = ((self.drips as f64) * elapsed.saturating_sub(stop).as_secs_f64()) as u64;
            offset = bytes(share(stop)).saturating_add(dripped);
            if self.drips == 0 {
                updated = self.started + stop;
            }
        }
        crate::domain::Download {
            reference: format!("layer-{}", self.digest),
            digest: self.digest.clone(),
            offset: offset.min(self.size.saturating_sub(1)),
            total: self.size,
            started: self.started,
            updated,
        }
    }
}

/// Removes a pull's download when the pull ends, however it ends.
struct Downloading<'a>(&'a Shared, u64);

impl Drop for Downloading<'_> {
    fn drop(&mut self) {
        self.0.downloads.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(&self.1);
    }
}

/// Images per `StreamImagesResponse` the embedded runtime sends.
pub const STREAM_BATCH: usize = 512;

impl Shared {
    /// Locks the state (a poisoned lock is still usable: state is plain data).
    pub fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Tells the observer, if any (with the state's lock held by some
    /// callers: an observer must not call the runtime).
    pub fn observe(&self, what: &super::Observed) {
        let observer = self.observer.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
        if let Some(o) = observer {
            o.tell(what);
        }
    }

    /// A pull the observer hears begin now and end when the guard is
    /// finished or dropped.
    fn observe_pull(&self, spec: &ImageSpec, auth: Option<&AuthConfig>) -> ObservedPull<'_> {
        let call = self.observed_calls.fetch_add(1, Ordering::Relaxed);
        self.observe(&super::Observed::PullStarted {
            call,
            image: spec.image.clone(),
            runtime_handler: spec.runtime_handler.clone(),
            auth: auth.map(AuthConfig::identity),
        });
        ObservedPull { shared: self, call, ended: false }
    }

    /// Lists a pull as a download until the guard drops.
    fn downloading(&self, remote: &super::RemoteImage) -> Downloading<'_> {
        let n = self.download_seq.fetch_add(1, Ordering::Relaxed);
        let ingest = Ingest {
            digest: remote.digest.clone(),
            size: remote.size,
            started: self.clock.0.now(),
            since: tokio::time::Instant::now(),
            takes: remote.pull_latency,
            stalls_after: remote.stalls_after,
            drips: remote.drips,
        };
        self.downloads.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(n, ingest);
        Downloading(self, n)
    }

    /// Waits a simulated pull time.
    async fn pull_time(&self, d: std::time::Duration) {
        if self.tokio_time.load(Ordering::Relaxed) {
            tokio::time::sleep(d).await;
        } else {
            super::clock::wait(d).await;
        }
    }

    /// Makes the state durable when a state directory keeps it (blocks on
    /// disk I/O; nothing to do without one).
    pub(super) fn save(&self) -> Result<(), super::persist::SaveError> {
        match &self.state_dir {
            Some(dir) => dir.save(&self.state),
            None => Ok(()),
        }
    }

    fn plan(&self) -> FaultPlan {
        self.faults.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// Counts the call and applies the fault plan. `Ok((true, _))` = lose
    /// the reply. The guard counts the call as being served until dropped.
    async fn gate(&self, rpc: Rpc, image: Option<&str>) -> Result<(bool, Serving<'_>), Status> {
        let i = index(rpc);
        self.counters.calls[i].fetch_add(1, Ordering::Relaxed);
        let now = self.counters.in_flight[i].fetch_add(1, Ordering::Relaxed) + 1;
        self.counters.max_in_flight[i].fetch_max(now, Ordering::Relaxed);
        let serving = Serving(&self.counters.in_flight[i]);
        let plan = self.plan();
        if plan.is_empty() {
            return Ok((false, serving));
        }
        match plan.decide(rpc, image) {
            None => Ok((false, serving)),
            Some(FaultAction::Fail(e)) => Err(Status::from(&e)),
            Some(FaultAction::Delay(d)) => {
                tokio::time::sleep(d).await;
                Ok((false, serving))
            }
            Some(FaultAction::Hang) => std::future::pending().await,
            Some(FaultAction::DropReply) => Ok((true, serving)),
            Some(FaultAction::Panic) => Err(Status::internal("fault injected: the runtime crashed serving this call")),
        }
    }
}

/// [`Shared::save`] on the blocking pool, before a change is answered.
async fn persist(shared: &Arc<Shared>) -> Result<(), Status> {
    if shared.state_dir.is_none() {
        return Ok(());
    }
    let s = shared.clone();
    match tokio::task::spawn_blocking(move || s.save()).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(Status::internal(e.to_string())),
        Err(e) => Err(Status::internal(format!("embedded runtime: saving its state failed: {e}"))),
    }
}

/// Answers `r`, or never answers when the fault plan dropped the reply.
async fn reply<T>(drop_reply: bool, r: Result<T, Status>) -> Result<Response<T>, Status> {
    if drop_reply {
        return std::future::pending().await;
    }
    r.map(Response::new)
}

/// The CRI services over [`Shared`].
#[derive(Debug, Clone)]
pub struct CriService {
    shared: Arc<Shared>,
}

impl CriService {
    /// Services over `shared`.
    pub fn new(shared: Arc<Shared>) -> Self {
        Self { shared }
    }
}

fn spec_of(s: Option<pb::ImageSpec>) -> Result<ImageSpec, Status> {
    match s {
        Some(s) if !s.image.is_empty() => Ok(s.into()),
        _ => Err(Status::invalid_argument("image spec must not be nil or empty")),
    }
}

/// Counts a call as being served until it is answered (or dropped).
struct Serving<'a>(&'a AtomicU64);

impl Drop for Serving<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Tells the observer a pull ended: with its image id once finished, or
/// without (failed, cancelled) when dropped first.
struct ObservedPull<'a> {
    shared: &'a Shared,
    call: u64,
    ended: bool,
}

impl ObservedPull<'_> {
    fn finished(mut self, image_id: &str) {
        self.ended = true;
        self.shared.observe(&super::Observed::PullEnded { call: self.call, image_id: Some(image_id.to_string()) });
    }
}

impl Drop for ObservedPull<'_> {
    fn drop(&mut self) {
        if !self.ended {
            self.shared.observe(&super::Observed::PullEnded { call: self.call, image_id: None });
        }
    }
}

/// Decrements the in-flight pull count when a pull ends, however it ends
/// (a cancelled RPC drops its future mid-sleep).
struct InFlight<'a>(&'a Counters);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.pulls_in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The embedded runtime's `StreamImages` answer: batches of images.
type ImageBatches =
    std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Result<pb::StreamImagesResponse, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl ImageService for CriService {
    type StreamImagesStream = ImageBatches;

    /// The list in batches of [`STREAM_BATCH`], each encoded as it is sent;
    /// `Unimplemented` when switched off. Faults apply as to `ListImages`.
    async fn stream_images(
        &self,
        req: Request<pb::StreamImagesRequest>,
    ) -> Result<Response<Self::StreamImagesStream>, Status> {
        self.shared.stream_calls.fetch_add(1, Ordering::Relaxed);
        if self.shared.stream_images_off.load(Ordering::Relaxed) {
            return Err(Status::unimplemented("unknown method StreamImages for service runtime.v1.ImageService"));
        }
        let filter: Option<ImageSpec> = req.into_inner().filter.and_then(|f| f.image).map(Into::into);
        let (lost, _serving) = self.shared.gate(Rpc::ListImages, filter.as_ref().map(|f| f.image.as_str())).await?;
        let mut images = self.shared.state().list_images(filter.as_ref());
        let mut batches = Vec::with_capacity(images.len().div_ceil(STREAM_BATCH));
        while !images.is_empty() {
            let rest = images.split_off(images.len().min(STREAM_BATCH));
            batches.push(std::mem::replace(&mut images, rest));
        }
        let stream = tokio_stream::iter(
            batches
                .into_iter()
                .map(|batch| Ok(pb::StreamImagesResponse { images: batch.into_iter().map(Into::into).collect() })),
        );
        reply(lost, Ok(Box::pin(stream) as ImageBatches)).await
    }

    async fn list_images(
        &self,
        req: Request<pb::ListImagesRequest>,
    ) -> Result<Response<pb::ListImagesResponse>, Status> {
        let filter: Option<ImageSpec> = req.into_inner().filter.and_then(|f| f.image).map(Into::into);
        let (lost, _serving) = self.shared.gate(Rpc::ListImages, filter.as_ref().map(|f| f.image.as_str())).await?;
        let images = self.shared.state().list_images(filter.as_ref());
        reply(lost, Ok(pb::ListImagesResponse { images: images.into_iter().map(Into::into).collect() })).await
    }

    async fn image_status(
        &self,
        req: Request<pb::ImageStatusRequest>,
    ) -> Result<Response<pb::ImageStatusResponse>, Status> {
        let r = req.into_inner();
        let spec = spec_of(r.image)?;
        let (lost, _serving) = self.shared.gate(Rpc::ImageStatus, Some(&spec.image)).await?;
        // The state's lock ends with this statement, before any await.
        let status = self.shared.state().image_status(&spec);
        let image = match status {
            Ok(image) => image,
            Err(e) => return reply(lost, Err(Status::from(&e))).await,
        };
        let mut info = std::collections::HashMap::new();
        if r.verbose
            && let Some(i) = &image
        {
            info.insert("info".to_string(), format!("{{\"id\":{:?},\"size\":{}}}", i.id, i.size));
        }
        reply(lost, Ok(pb::ImageStatusResponse { image: image.map(Into::into), info })).await
    }

    async fn pull_image(&self, req: Request<pb::PullImageRequest>) -> Result<Response<pb::PullImageResponse>, Status> {
        let r = req.into_inner();
        let spec = spec_of(r.image)?;
        log_pull(&mut self.shared.pull_log.lock().unwrap_or_else(std::sync::PoisonError::into_inner), &spec.image);
        let auth: Option<AuthConfig> = r.auth.map(Into::into);
        let observed = self.shared.observe_pull(&spec, auth.as_ref());
        let (lost, _serving) = self.shared.gate(Rpc::PullImage, Some(&spec.image)).await?;
        let planned = self.shared.state().plan_pull(&spec, auth.as_ref()).map_err(|e| Status::from(&e))?;
        let c = &self.shared.counters;
        let now = c.pulls_in_flight.fetch_add(1, Ordering::Relaxed) + 1;
        c.max_pulls_in_flight.fetch_max(now, Ordering::Relaxed);
        let guard = InFlight(c);
        if !planned.remote.pull_latency.is_zero() {
            let _listed = self.shared.downloading(&planned.remote);
            self.shared.observe(&super::Observed::Downloading {
                call: observed.call,
                stalls_after: planned.remote.stalls_after,
                drips: planned.remote.drips,
                size: planned.remote.size,
                takes: planned.remote.pull_latency,
            });
            self.shared.pull_time(planned.remote.pull_latency).await;
        }
        // Room is checked again at the end: other pulls may have filled the disk.
        let id = {
            let mut st = self.shared.state();
            let p = st.plan_pull(&spec, auth.as_ref()).map_err(|e| Status::from(&e))?;
            st.finish_pull(&p, &spec)
        };
        observed.finished(&id);
        // Answered only once the image is on disk (with a state directory).
        persist(&self.shared).await?;
        drop(guard);
        c.pulls_completed.fetch_add(1, Ordering::Relaxed);
        reply(lost, Ok(pb::PullImageResponse { image_ref: id })).await
    }

    async fn remove_image(
        &self,
        req: Request<pb::RemoveImageRequest>,
    ) -> Result<Response<pb::RemoveImageResponse>, Status> {
        let spec = spec_of(req.into_inner().image)?;
        let (lost, _serving) = self.shared.gate(Rpc::RemoveImage, Some(&spec.image)).await?;
        let r = {
            let mut st = self.shared.state();
            if let Ok(Some(image)) = st.lookup(&spec.image) {
                let used_by = st
                    .containers
                    .iter()
                    .filter(|c| c.image_ref == image.id || c.image_id == image.id)
                    .map(|c| c.id.clone())
                    .collect();
                self.shared.observe(&super::Observed::Removing {
                    id: image.id.clone(),
                    names: image.repo_tags.iter().chain(&image.repo_digests).cloned().collect(),
                    pinned: image.pinned,
                    used_by,
                });
            }
            st.remove_image(&spec).map_err(|e| Status::from(&e))
        };
        if r.is_ok() {
            persist(&self.shared).await?;
        }
        reply(lost, r.map(|()| pb::RemoveImageResponse {})).await
    }

    async fn image_fs_info(
        &self,
        _req: Request<pb::ImageFsInfoRequest>,
    ) -> Result<Response<pb::ImageFsInfoResponse>, Status> {
        let (lost, _serving) = self.shared.gate(Rpc::ImageFsInfo, None).await?;
        let info = self.shared.state().image_fs_info();
        reply(lost, Ok(info.into())).await
    }
}

#[tonic::async_trait]
impl pb::content::content_server::Content for CriService {
    /// The pulls in their simulated time, as containerd lists its ingests.
    async fn list_statuses(
        &self,
        _req: Request<pb::content::ListStatusesRequest>,
    ) -> Result<Response<pb::content::ListStatusesResponse>, Status> {
        let (lost, _serving) = self.shared.gate(Rpc::ListStatuses, None).await?;
        let statuses = {
            let downloads = self.shared.downloads.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            let now = self.shared.clock.0.now();
            downloads.values().map(|i| i.at(now).into()).collect()
        };
        reply(lost, Ok(pb::content::ListStatusesResponse { statuses })).await
    }
}

#[tonic::async_trait]
impl RuntimeService for CriService {
    async fn version(&self, _req: Request<pb::VersionRequest>) -> Result<Response<pb::VersionResponse>, Status> {
        let (lost, _serving) = self.shared.gate(Rpc::Version, None).await?;
        let v = RuntimeVersion {
            version: crate::cri::KUBE_RUNTIME_API_VERSION.to_string(),
            runtime_name: super::RUNTIME_NAME.to_string(),
            runtime_version: env!("CARGO_PKG_VERSION").to_string(),
            runtime_api_version: "v1".to_string(),
        };
        reply(lost, Ok(v.into())).await
    }

    async fn list_pod_sandbox(
        &self,
        req: Request<pb::ListPodSandboxRequest>,
    ) -> Result<Response<pb::ListPodSandboxResponse>, Status> {
        let filter: PodSandboxFilter = req.into_inner().filter.map(Into::into).unwrap_or_default();
        let (lost, _serving) = self.shared.gate(Rpc::ListPodSandbox, None).await?;
        let items = self.shared.state().list_pod_sandbox(&filter);
        reply(lost, Ok(pb::ListPodSandboxResponse { items: items.into_iter().map(Into::into).collect() })).await
    }

    async fn list_containers(
        &self,
        req: Request<pb::ListContainersRequest>,
    ) -> Result<Response<pb::ListContainersResponse>, Status> {
        let filter: ContainerFilter = req.into_inner().filter.map(Into::into).unwrap_or_default();
        let (lost, _serving) = self.shared.gate(Rpc::ListContainers, None).await?;
        let containers = self.shared.state().list_containers(&filter);
        reply(lost, Ok(pb::ListContainersResponse { containers: containers.into_iter().map(Into::into).collect() }))
            .await
    }

    async fn container_status(
        &self,
        req: Request<pb::ContainerStatusRequest>,
    ) -> Result<Response<pb::ContainerStatusResponse>, Status> {
        let id = req.into_inner().container_id;
        if id.is_empty() {
            return Err(Status::from(&crate::cri::CriError::new(
                CriErrorKind::InvalidArgument,
                "container id must not be empty",
            )));
        }
        let (lost, _serving) = self.shared.gate(Rpc::ContainerStatus, None).await?;
        let r = self.shared.state().container_status(&id).map_err(|e| Status::from(&e));
        reply(
            lost,
            r.map(|s| pb::ContainerStatusResponse {
                status: Some(s.into()),
                info: std::collections::HashMap::default(),
            }),
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pull_log_keeps_the_latest_pulls_within_its_bound() {
        let mut log = Vec::new();
        for i in 0..=PULL_LOG_MAX * 3 {
            log_pull(&mut log, &format!("img:{i}"));
        }
        assert!(log.len() <= PULL_LOG_MAX && log.len() > PULL_LOG_MAX / 2, "{}", log.len());
        assert_eq!(log.last().map(String::as_str), Some(format!("img:{}", PULL_LOG_MAX * 3).as_str()));
        let first: usize = log[0].trim_start_matches("img:").parse().unwrap();
        let in_order = log.iter().enumerate().all(|(n, l)| *l == format!("img:{}", first + n));
        assert!(in_order, "arrival order, no gaps");
    }

    #[tokio::test(start_paused = true)]
    async fn a_stalled_download_stops_at_its_stall_and_a_dripping_one_writes_on_slowly() {
        let clock = crate::clock::Clock::starting_at(std::time::UNIX_EPOCH);
        let ingest = |drips: u64| Ingest {
            digest: "sha256:ab".into(),
            size: 10_000_000,
            started: clock.now(),
            since: tokio::time::Instant::now(),
            takes: std::time::Duration::from_secs(10),
            stalls_after: Some(std::time::Duration::from_secs(1)),
            drips,
        };
        let (stalled, dripping) = (ingest(0), ingest(1_000));
        tokio::time::advance(std::time::Duration::from_millis(500)).await;
        let d = stalled.at(clock.now());
        assert_eq!((d.offset, d.updated), (500_000, clock.now()), "moving: written now");
        tokio::time::advance(std::time::Duration::from_secs(30)).await;
        let d = stalled.at(clock.now());
        assert_eq!(d.offset, 1_000_000, "a tenth of the pull's time: a tenth of its bytes");
        assert_eq!(d.updated, std::time::UNIX_EPOCH + std::time::Duration::from_secs(1), "last written at the stall");
        let d = dripping.at(clock.now());
        assert_eq!((d.offset, d.updated), (1_029_500, clock.now()), "29.5 s of drip after the stall at 1 s");
    }
}
