//! `CriClient`: typed async CRI calls over one lazily connected channel.
//! Takes and returns domain types; knows nothing of actors or faults. At
//! most [`super::transport::CLIENT_READS_IN_FLIGHT`] calls and as many
//! pulls are in flight at once; more wait for a slot (see
//! [`super::transport`]).

use std::cell::RefCell;
use std::sync::Arc;
use std::time::Duration;

use tonic::metadata::{Ascii, MetadataValue};
use tonic::transport::Channel;

use super::proto as pb;
use super::proto::content::content_client::ContentClient;
use super::proto::image_service_client::ImageServiceClient;
use super::proto::runtime_service_client::RuntimeServiceClient;
use super::transport::CallSlots;
use super::{CriEndpoint, CriError, CriErrorKind, InvalidEndpoint, Rpc};
use crate::domain::{
    AuthConfig, Container, ContainerFilter, ContainerStatus, Download, Image, ImageFsInfo, ImageSpec, ImageStatus,
    PodSandbox, PodSandboxFilter, RuntimeVersion, SandboxConfig,
};

/// Version of the kubelet runtime API imaged sends in `VersionRequest`.
pub const KUBE_RUNTIME_API_VERSION: &str = "0.1.0";

/// The containerd namespace of the CRI plugin's images and pulls (fixed in
/// containerd: `k8s.io`), sent as `containerd-namespace` on content calls.
pub const CONTAINERD_CRI_NAMESPACE: &str = "k8s.io";

/// Largest message imaged accepts from a runtime (ListImages on a busy node
/// can pass tonic's 4 MiB default).
const MAX_DECODING_MESSAGE_SIZE: usize = 64 * 1024 * 1024;

/// A cloneable CRI client. Clones share the connection and its slots;
/// calls on one client run concurrently (HTTP/2 streams), never one after
/// another, up to the slots' bound.
#[derive(Debug, Clone)]
pub struct CriClient {
    endpoint: CriEndpoint,
    images: ImageServiceClient<Channel>,
    runtime: RuntimeServiceClient<Channel>,
    /// containerd's content service, on the same socket (downloads).
    content: ContentClient<Channel>,
    /// The channel itself, for calls forwarded as bytes.
    channel: Channel,
    /// Calls in flight on the channel.
    slots: Arc<CallSlots>,
}

/// The header tonic's `Request::set_timeout` writes.
const GRPC_TIMEOUT: &str = "grpc-timeout";

thread_local! {
    /// The last deadline sent from this thread and its `grpc-timeout`
    /// value: calls repeat the configured deadline, and tonic formats and
    /// parses the value anew on each (a tenth of imaged's own work in a
    /// present-image check).
    static LAST_TIMEOUT: RefCell<Option<(Duration, MetadataValue<Ascii>)>> = const { RefCell::new(None) };
}

fn request<T>(msg: T, deadline: Option<Duration>) -> tonic::Request<T> {
    let mut req = tonic::Request::new(msg);
    if let Some(d) = deadline {
        // Tell the runtime too, so it can stop work nobody waits for. tonic
        // panics on a timeout it cannot encode: clamp whatever the caller checked.
        let d = crate::domain::limits::clamp_duration(d);
        let known = LAST_TIMEOUT.with_borrow(|last| last.as_ref().filter(|(of, _)| *of == d).map(|(_, v)| v.clone()));
        match known {
            Some(value) => {
                req.metadata_mut().insert(GRPC_TIMEOUT, value);
            }
            None => {
                req.set_timeout(d);
                if let Some(value) = req.metadata().get(GRPC_TIMEOUT) {
                    LAST_TIMEOUT.set(Some((d, value.clone())));
                }
            }
        }
    }
    req
}

/// A read's call, its deadline kept here rather than sent as
/// `grpc-timeout`. A read (`ImageStatus` on every ensure, `ListImages`, …)
/// starts no work on the runtime that could outlive it: when the deadline
/// passes, dropping the call resets its stream and the runtime's handler is
/// cancelled as it would be at its own deadline. The header would add, per
/// call, a timer on each side of the socket (tonic's client enforces it with
/// one, and a tonic server — the embedded runtime — arms another): 4–5 % of
/// a bare `ImageStatus` on the embedded runtime (`benches/ensure.rs`).
/// Calls that do work (`PullImage`, `RemoveImage`) and calls forwarded for
/// the kubelet still send it, so the runtime stops a pull nobody waits for
/// even when imaged's connection to it is wedged.
async fn read<T>(
    deadline: Option<Duration>,
    call: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> Result<T, CriError> {
    let answer = match deadline {
        Some(d) => {
            let d = crate::domain::limits::clamp_duration(d);
            tokio::time::timeout(d, call).await.map_err(|_| CriError::deadline_exceeded())?
        }
        None => call.await,
    };
    Ok(answer?.into_inner())
}

impl CriClient {
    /// A client for `endpoint`; connects on first call, reconnects after failures.
    pub fn new(endpoint: &CriEndpoint, connect_timeout: Duration) -> Result<Self, InvalidEndpoint> {
        let channel = endpoint.channel(connect_timeout)?;
        Ok(Self {
            endpoint: endpoint.clone(),
            images: ImageServiceClient::new(channel.clone()).max_decoding_message_size(MAX_DECODING_MESSAGE_SIZE),
            runtime: RuntimeServiceClient::new(channel.clone()).max_decoding_message_size(MAX_DECODING_MESSAGE_SIZE),
            content: ContentClient::new(channel.clone()).max_decoding_message_size(MAX_DECODING_MESSAGE_SIZE),
            channel,
            slots: Arc::default(),
        })
    }

    /// A client over a channel the caller built (the simulator's in-process
    /// transport to its embedded runtime); `endpoint` names it in logs.
    pub fn over_channel(endpoint: CriEndpoint, channel: Channel) -> Self {
        Self {
            endpoint,
            images: ImageServiceClient::new(channel.clone()).max_decoding_message_size(MAX_DECODING_MESSAGE_SIZE),
            runtime: RuntimeServiceClient::new(channel.clone()).max_decoding_message_size(MAX_DECODING_MESSAGE_SIZE),
            content: ContentClient::new(channel.clone()).max_decoding_message_size(MAX_DECODING_MESSAGE_SIZE),
            channel,
            slots: Arc::default(),
        }
    }

    /// One `ImageService` call as bytes: `request` is sent as it is and the
    /// answer comes back as the runtime encoded it, unknown fields and all
    /// (for a front that forwards calls; see [`super::wire`]).
    pub async fn forward(
        &self,
        rpc: Rpc,
        body: prost::bytes::Bytes,
        deadline: Option<Duration>,
    ) -> Result<prost::bytes::Bytes, CriError> {
        let path =
            tonic::codegen::http::uri::PathAndQuery::try_from(format!("/runtime.v1.{}/{}", rpc.service(), rpc.name()))
                .map_err(|e| CriError::new(CriErrorKind::InvalidArgument, e.to_string()))?;
        let (_slot, deadline) = self.slots.take(rpc, deadline).await?;
        let mut grpc =
            tonic::client::Grpc::new(self.channel.clone()).max_decoding_message_size(MAX_DECODING_MESSAGE_SIZE);
        grpc.ready().await.map_err(|e| CriError::from(tonic::Status::unavailable(e.to_string())))?;
        // Boxed once a slot is taken, as in `image_status`.
        let resp = Box::pin(grpc.unary(request(body, deadline), path, super::wire::BytesCodec)).await?;
        Ok(resp.into_inner())
    }

    /// The endpoint this client talks to.
    pub fn endpoint(&self) -> &CriEndpoint {
        &self.endpoint
    }

    /// `Version`.
    pub async fn version(&self, deadline: Option<Duration>) -> Result<RuntimeVersion, CriError> {
        let (_slot, deadline) = self.slots.take(Rpc::Version, deadline).await?;
        let req = pb::VersionRequest { version: KUBE_RUNTIME_API_VERSION.to_string() };
        let mut runtime = self.runtime.clone();
        Ok(read(deadline, runtime.version(tonic::Request::new(req))).await?.into())
    }

    /// `ListImages`, optionally filtered by an image spec.
    pub async fn list_images(
        &self,
        filter: Option<ImageSpec>,
        deadline: Option<Duration>,
    ) -> Result<Vec<Image>, CriError> {
        let (_slot, deadline) = self.slots.take(Rpc::ListImages, deadline).await?;
        let req = pb::ListImagesRequest { filter: filter.map(|s| pb::ImageFilter { image: Some(s.into()) }) };
        let mut images = self.images.clone();
        let resp = read(deadline, images.list_images(tonic::Request::new(req))).await?;
        Ok(resp.images.into_iter().map(Image::from).collect())
    }

    /// `StreamImages` (KEP-5825), optionally filtered: every batch the
    /// runtime sends, each converted as it arrives and dropped, so at most
    /// one batch is held beside the list being built. A runtime without it
    /// answers `Unimplemented` (see the gateway's fallback).
    ///
    /// The deadline goes to the runtime (`grpc-timeout`) and bounds the
    /// whole stream here too: tonic's own bound ends with the headers, so a
    /// runtime that stalled between two batches would hold the listing,
    /// and the GC run or refresh waiting on it, for as long as it stalls.
    pub async fn stream_images(
        &self,
        filter: Option<ImageSpec>,
        deadline: Option<Duration>,
    ) -> Result<Vec<Image>, CriError> {
        let req = pb::StreamImagesRequest { filter: filter.map(|s| pb::ImageFilter { image: Some(s.into()) }) };
        let mut client = self.images.clone();
        let whole = async move {
            let mut stream = client.stream_images(request(req, deadline)).await?.into_inner();
            let mut images = Vec::new();
            while let Some(batch) = stream.message().await? {
                images.extend(batch.images.into_iter().map(Image::from));
            }
            Ok::<_, tonic::Status>(images)
        };
        let images = match deadline {
            Some(d) => {
                let d = crate::domain::limits::clamp_duration(d);
                tokio::time::timeout(d, whole).await.map_err(|_| CriError::deadline_exceeded())?
            }
            None => whole.await,
        };
        Ok(images?)
    }

    /// `ImageStatus`; an absent image is `image: None`, not an error.
    pub async fn image_status(
        &self,
        image: ImageSpec,
        verbose: bool,
        deadline: Option<Duration>,
    ) -> Result<ImageStatus, CriError> {
        let (_slot, deadline) = self.slots.take(Rpc::ImageStatus, deadline).await?;
        let req = pb::ImageStatusRequest { image: Some(image.into()), verbose };
        // Boxed once a slot is taken: tonic's call future is ~2.4 KB, and a
        // burst's calls waiting for a slot (or up the stack, for a pull)
        // should not each hold one.
        let mut images = self.images.clone();
        let resp = read(deadline, Box::pin(images.image_status(tonic::Request::new(req)))).await?;
        Ok(ImageStatus { image: resp.image.map(Image::from), info: resp.info.into_iter().collect() })
    }

    /// `PullImage`; returns the image reference the runtime gives (its image id).
    pub async fn pull_image(
        &self,
        image: ImageSpec,
        auth: Option<AuthConfig>,
        sandbox: Option<SandboxConfig>,
        deadline: Option<Duration>,
    ) -> Result<String, CriError> {
        let (_slot, deadline) = self.slots.take(Rpc::PullImage, deadline).await?;
        let req = pb::PullImageRequest {
            image: Some(image.into()),
            auth: auth.map(Into::into),
            sandbox_config: sandbox.map(Into::into),
        };
        // Boxed once a slot is taken, as in `image_status`.
        let mut images = self.images.clone();
        let resp = Box::pin(images.pull_image(request(req, deadline))).await?.into_inner();
        if resp.image_ref.is_empty() {
            return Err(CriError::new(CriErrorKind::InvalidResponse, "PullImage returned an empty image reference"));
        }
        Ok(resp.image_ref)
    }

    /// `RemoveImage`; removing an absent image succeeds.
    pub async fn remove_image(&self, image: ImageSpec, deadline: Option<Duration>) -> Result<(), CriError> {
        let (_slot, deadline) = self.slots.take(Rpc::RemoveImage, deadline).await?;
        let req = pb::RemoveImageRequest { image: Some(image.into()) };
        self.images.clone().remove_image(request(req, deadline)).await?;
        Ok(())
    }

    /// `ImageFsInfo`.
    pub async fn image_fs_info(&self, deadline: Option<Duration>) -> Result<ImageFsInfo, CriError> {
        let (_slot, deadline) = self.slots.take(Rpc::ImageFsInfo, deadline).await?;
        let mut images = self.images.clone();
        Ok(read(deadline, images.image_fs_info(tonic::Request::new(pb::ImageFsInfoRequest {}))).await?.into())
    }

    /// `ListContainers` (all states unless the filter says otherwise).
    pub async fn list_containers(
        &self,
        filter: ContainerFilter,
        deadline: Option<Duration>,
    ) -> Result<Vec<Container>, CriError> {
        let (_slot, deadline) = self.slots.take(Rpc::ListContainers, deadline).await?;
        let req = pb::ListContainersRequest { filter: Some(filter.into()) };
        let mut runtime = self.runtime.clone();
        let resp = read(deadline, runtime.list_containers(tonic::Request::new(req))).await?;
        Ok(resp.containers.into_iter().map(Container::from).collect())
    }

    /// `ListPodSandbox`.
    pub async fn list_pod_sandbox(
        &self,
        filter: PodSandboxFilter,
        deadline: Option<Duration>,
    ) -> Result<Vec<PodSandbox>, CriError> {
        let (_slot, deadline) = self.slots.take(Rpc::ListPodSandbox, deadline).await?;
        let req = pb::ListPodSandboxRequest { filter: Some(filter.into()) };
        let mut runtime = self.runtime.clone();
        let resp = read(deadline, runtime.list_pod_sandbox(tonic::Request::new(req))).await?;
        Ok(resp.items.into_iter().map(PodSandbox::from).collect())
    }

    /// containerd's `Content/ListStatuses` in the CRI plugin's namespace:
    /// the blobs being written now (see [`Download`]). A runtime that is
    /// not containerd answers `Unimplemented`.
    pub async fn list_downloads(&self, deadline: Option<Duration>) -> Result<Vec<Download>, CriError> {
        let (_slot, deadline) = self.slots.take(Rpc::ListStatuses, deadline).await?;
        let mut req = tonic::Request::new(super::proto::content::ListStatusesRequest { filters: Vec::new() });
        req.metadata_mut().insert("containerd-namespace", MetadataValue::from_static(CONTAINERD_CRI_NAMESPACE));
        let mut content = self.content.clone();
        let resp = read(deadline, content.list_statuses(req)).await?;
        Ok(resp.statuses.into_iter().map(Download::from).collect())
    }

    /// `ContainerStatus`.
    pub async fn container_status(
        &self,
        id: String,
        verbose: bool,
        deadline: Option<Duration>,
    ) -> Result<ContainerStatus, CriError> {
        let (_slot, deadline) = self.slots.take(Rpc::ContainerStatus, deadline).await?;
        let req = pb::ContainerStatusRequest { container_id: id.clone(), verbose };
        let mut runtime = self.runtime.clone();
        let resp = read(deadline, runtime.container_status(tonic::Request::new(req))).await?;
        resp.status.map(ContainerStatus::from).ok_or_else(|| {
            CriError::new(CriErrorKind::InvalidResponse, format!("ContainerStatus for {id:?} returned no status"))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A runtime that never answers `Rpc::*`'s it is told to hold.
    fn holding(dir: &std::path::Path, rpcs: &[Rpc]) -> crate::embedded::EmbeddedRuntime {
        #![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test
        let rt = crate::embedded::EmbeddedRuntime::start_in(dir).unwrap();
        let mut plan = crate::fault::FaultPlan::new(1);
        for rpc in rpcs {
            plan = plan.rule(crate::fault::FaultRule::on(*rpc).hang());
        }
        rt.set_fault_plan(plan);
        rt
    }

    #[tokio::test]
    async fn a_read_that_gets_no_answer_ends_at_its_deadline_as_deadline_exceeded() {
        #![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test
        let dir = tempfile::tempdir().unwrap();
        let reads = [Rpc::ImageStatus, Rpc::ListImages, Rpc::ImageFsInfo, Rpc::Version];
        let rt = holding(dir.path(), &reads);
        let client = CriClient::new(&rt.endpoint(), Duration::from_secs(5)).unwrap();
        let d = Some(Duration::from_millis(150));
        let outer = Duration::from_secs(5);
        let t = std::time::Instant::now();
        let status = tokio::time::timeout(outer, client.image_status(ImageSpec::new("a:1"), false, d)).await;
        let list = tokio::time::timeout(outer, client.list_images(None, d)).await;
        let fs = tokio::time::timeout(outer, client.image_fs_info(d)).await;
        let version = tokio::time::timeout(outer, client.version(d)).await;
        let kinds = [status.map(|r| r.err().map(|e| e.kind())), list.map(|r| r.err().map(|e| e.kind()))];
        let kinds2 = [fs.map(|r| r.err().map(|e| e.kind())), version.map(|r| r.err().map(|e| e.kind()))];
        for k in kinds.into_iter().chain(kinds2) {
            assert_eq!(k, Ok(Some(CriErrorKind::DeadlineExceeded)), "each read ends at its own deadline");
        }
        let spent = t.elapsed();
        assert!(spent >= Duration::from_millis(600) && spent < Duration::from_secs(4), "{spent:?}");
        // Nothing held it: the runtime still answers a read with no rule.
        rt.set_fault_plan(crate::fault::FaultPlan::new(1));
        let found = client.image_status(ImageSpec::new("a:1"), false, Some(Duration::MAX)).await.unwrap();
        assert!(found.image.is_none(), "an unbounded deadline is clamped, not a panic");
    }

    #[test]
    fn a_deadline_tonic_cannot_encode_is_clamped_not_a_panic() {
        // tonic's set_timeout panics past 99,999,999 hours ("duration is
        // unrealistically large"); an embedding agent may pass anything.
        let req = request((), Some(Duration::MAX));
        let timeout = req.metadata().get("grpc-timeout").and_then(|v| v.to_str().ok()).map(str::to_string);
        assert_eq!(timeout.as_deref(), Some("2562047H"), "Go's largest duration, in hours");
        let req = request((), Some(Duration::from_millis(1500)));
        assert_eq!(req.metadata().get("grpc-timeout").and_then(|v| v.to_str().ok()), Some("1500000u"));
    }

    #[test]
    fn a_repeated_deadline_reuses_its_header_and_a_new_one_replaces_it() {
        let timeout = |d: Option<Duration>| {
            let req = request((), d);
            req.metadata().get("grpc-timeout").and_then(|v| v.to_str().ok()).map(str::to_string)
        };
        let two_minutes = Some(Duration::from_secs(120));
        assert_eq!(timeout(two_minutes).as_deref(), Some("120000m"));
        assert_eq!(timeout(two_minutes).as_deref(), Some("120000m"), "the kept value");
        assert_eq!(timeout(Some(Duration::from_millis(7))).as_deref(), Some("7000000n"), "another deadline");
        assert_eq!(timeout(two_minutes).as_deref(), Some("120000m"), "and back");
        assert_eq!(timeout(None), None, "no deadline, no header");
        let req = request((), Some(Duration::from_millis(7)));
        assert_eq!(req.metadata().get_all("grpc-timeout").iter().count(), 1, "one header, never two");
    }

    /// An image service whose `StreamImages` sends one batch, then nothing
    /// more and never ends; every other call is `Unimplemented`.
    struct StallsMidStream;

    type Batches = std::pin::Pin<
        Box<dyn tokio_stream::Stream<Item = Result<pb::StreamImagesResponse, tonic::Status>> + Send + 'static>,
    >;

    #[tonic::async_trait]
    impl pb::image_service_server::ImageService for StallsMidStream {
        type StreamImagesStream = Batches;

        async fn stream_images(
            &self,
            _: tonic::Request<pb::StreamImagesRequest>,
        ) -> Result<tonic::Response<Batches>, tonic::Status> {
            let first =
                pb::StreamImagesResponse { images: vec![pb::Image { id: "sha256:a".into(), ..pb::Image::default() }] };
            let stream = tokio_stream::StreamExt::chain(tokio_stream::iter([Ok(first)]), tokio_stream::pending());
            Ok(tonic::Response::new(Box::pin(stream)))
        }
        async fn list_images(
            &self,
            _: tonic::Request<pb::ListImagesRequest>,
        ) -> Result<tonic::Response<pb::ListImagesResponse>, tonic::Status> {
            Err(tonic::Status::unimplemented("ListImages"))
        }
        async fn image_status(
            &self,
            _: tonic::Request<pb::ImageStatusRequest>,
        ) -> Result<tonic::Response<pb::ImageStatusResponse>, tonic::Status> {
            Err(tonic::Status::unimplemented("ImageStatus"))
        }
        async fn pull_image(
            &self,
            _: tonic::Request<pb::PullImageRequest>,
        ) -> Result<tonic::Response<pb::PullImageResponse>, tonic::Status> {
            Err(tonic::Status::unimplemented("PullImage"))
        }
        async fn remove_image(
            &self,
            _: tonic::Request<pb::RemoveImageRequest>,
        ) -> Result<tonic::Response<pb::RemoveImageResponse>, tonic::Status> {
            Err(tonic::Status::unimplemented("RemoveImage"))
        }
        async fn image_fs_info(
            &self,
            _: tonic::Request<pb::ImageFsInfoRequest>,
        ) -> Result<tonic::Response<pb::ImageFsInfoResponse>, tonic::Status> {
            Err(tonic::Status::unimplemented("ImageFsInfo"))
        }
    }

    #[tokio::test]
    async fn a_stream_that_stalls_between_batches_ends_at_its_deadline() {
        #![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("stalls.sock");
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        let server = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(pb::image_service_server::ImageServiceServer::new(StallsMidStream))
                .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener)),
        );
        let client = CriClient::new(&CriEndpoint::Unix(path), Duration::from_secs(5)).unwrap();
        let t = std::time::Instant::now();
        let listed =
            tokio::time::timeout(Duration::from_secs(5), client.stream_images(None, Some(Duration::from_millis(200))))
                .await
                .expect("bounded by its own deadline, not the outer one");
        assert_eq!(listed.map_err(|e| e.kind()), Err(CriErrorKind::DeadlineExceeded));
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
        server.abort();
    }
}
