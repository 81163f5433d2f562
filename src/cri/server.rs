//! The CRI `ImageService` served to a client (the kubelet through its
//! `imageServiceEndpoint`, crictl through `image-endpoint`): the protocol
//! side of imaged's CRI front. It speaks gRPC and protobuf and nothing else;
//! what a call does is the [`ImageFront`]'s business, in domain types and
//! forwarded bytes, so the front's logic lives above this module.
//!
//! - `ListImages`, `ImageStatus`, `ImageFsInfo`, `RemoveImage` go to
//!   [`ImageFront::forward`] as the client's bytes and come back as the
//!   runtime's bytes: fields imaged's proto does not know survive both ways
//!   (prost would drop them). Images the front pins get `pinned = true` in
//!   `ListImages` and `ImageStatus` answers ([`super::wire::pin_images`]),
//!   OR-ed with the runtime's flag.
//! - `PullImage` is read ([`PullCall`]) and answered by [`ImageFront::pull`].
//! - `StreamImages` (KEP-5825, the 1.36 kubelet with `CRIListStreaming`)
//!   is answered from the runtime's `ListImages` bytes (the two requests,
//!   and the two answers' images, have the same wire form), pinned like a
//!   `ListImages` answer and sent in messages of at most [`STREAM_BATCH`]
//!   images each.
//! - Any other method of the service and any other service answer
//!   `Unimplemented`.
//!
//! Errors keep the runtime's gRPC code and message ([`CriError`] carries
//! both). Messages may be up to [`MAX_MESSAGE_BYTES`] both ways, as the
//! kubelet's own client allows.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use prost::bytes::Bytes;
use tonic::body::Body as TonicBody;
use tonic::codegen::{Body, StdError, http};
use tonic::server::{Grpc, NamedService, UnaryService};

use super::proto as pb;
use super::wire::{BytesCodec, pin_images};
use super::{CriError, CriErrorKind, Rpc};
use crate::domain::{AuthConfig, ImageSpec, SandboxConfig};

/// The largest message accepted or sent: the kubelet's CRI client limit
/// (16 MiB), so a busy node's `ListImages` passes through imaged whenever it
/// passes directly.
pub const MAX_MESSAGE_BYTES: usize = 16 << 20;

/// How much before a caller's deadline imaged answers `DeadlineExceeded`
/// (at most; a tenth of a short deadline): tonic's server would otherwise
/// end the call at the deadline itself, as `Cancelled "Timeout expired"`.
pub const DEADLINE_MARGIN: Duration = Duration::from_millis(5);

/// Images per `StreamImagesResponse` the front sends.
pub const STREAM_BATCH: usize = 512;

/// The path of `StreamImages`.
const STREAM_IMAGES: &str = "/runtime.v1.ImageService/StreamImages";

/// The service name clients call.
pub const SERVICE: &str = "runtime.v1.ImageService";

/// A boxed future the front returns.
pub type FrontFuture<T> = Pin<Box<dyn Future<Output = Result<T, CriError>> + Send>>;

/// One `PullImage` as the client sent it.
#[derive(Clone, PartialEq, Eq)]
pub struct PullCall {
    /// The image (name as sent, annotations, runtime handler).
    pub image: ImageSpec,
    /// The one credential of this call (the kubelet sends one per call and
    /// tries the next in a new call); `None` = anonymous.
    pub auth: Option<AuthConfig>,
    /// The pod the pull is for, when the client said.
    pub sandbox: Option<SandboxConfig>,
    /// The client's own deadline (`grpc-timeout`), if any.
    pub deadline: Option<Duration>,
    /// The request as the client sent it: what the runtime gets, so fields
    /// imaged's proto does not know reach it.
    pub wire: Bytes,
}

/// Every field but the client's bytes, which hold its credential in
/// clear: their length only.
impl std::fmt::Debug for PullCall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PullCall")
            .field("image", &self.image)
            .field("auth", &self.auth)
            .field("sandbox", &self.sandbox)
            .field("deadline", &self.deadline)
            .field("wire", &WireLen(self.wire.len()))
            .finish()
    }
}

/// How a client's request bytes show in `Debug`: their length, never
/// their content.
pub struct WireLen(pub usize);

impl std::fmt::Debug for WireLen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "<{} bytes>", self.0)
    }
}

/// What serves the calls: imaged's front over its actors (or a test's).
pub trait ImageFront: Send + Sync + 'static {
    /// Forwards one call to the runtime as bytes and returns its answer's
    /// bytes. `deadline` is the client's own, if any.
    fn forward(&self, rpc: Rpc, body: Bytes, deadline: Option<Duration>) -> FrontFuture<Bytes>;

    /// Pulls for the client; the answer is an encoded `PullImageResponse`
    /// (the runtime's own bytes when it pulled, [`pull_answer`] otherwise),
    /// whose `image_ref` is the image's id.
    fn pull(&self, call: PullCall) -> FrontFuture<Bytes>;

    /// Whether the image with this id, tags and digests is to be reported
    /// pinned (the runtime may have pinned it already).
    fn pins(&self, id: &str, repo_tags: &[String], repo_digests: &[String]) -> bool;

    /// False when [`pins`](Self::pins) is false for every image in this
    /// encoded answer (e.g. no name it pins occurs in it): the answer then
    /// passes through without its images being decoded.
    fn may_pin(&self, _answer: &[u8]) -> bool {
        true
    }
}

/// The tower service a tonic server routes `runtime.v1.ImageService` to.
pub struct ImageServiceServer<F: ?Sized> {
    front: Arc<F>,
}

impl<F: ?Sized> Clone for ImageServiceServer<F> {
    fn clone(&self) -> Self {
        Self { front: self.front.clone() }
    }
}

impl<F: ?Sized> std::fmt::Debug for ImageServiceServer<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ImageServiceServer")
    }
}

impl<F: ImageFront + ?Sized> ImageServiceServer<F> {
    /// The service over `front`.
    pub fn new(front: Arc<F>) -> Self {
        Self { front }
    }
}

impl<F: ?Sized> NamedService for ImageServiceServer<F> {
    const NAME: &'static str = SERVICE;
}

/// Which call a path names.
fn call_of(path: &str) -> Option<Rpc> {
    let method = path.strip_prefix("/runtime.v1.ImageService/")?;
    [Rpc::ListImages, Rpc::ImageStatus, Rpc::PullImage, Rpc::RemoveImage, Rpc::ImageFsInfo]
        .into_iter()
        .find(|r| r.name() == method)
}

/// The client's `grpc-timeout` (`<digits><unit>`, units H M S m u n).
fn grpc_timeout(headers: &http::HeaderMap) -> Option<Duration> {
    let v = headers.get("grpc-timeout")?.to_str().ok()?;
    let (digits, unit) = v.split_at(v.len().checked_sub(1)?);
    let n: u64 = digits.parse().ok()?;
    let d = match unit {
        "H" => Duration::from_secs(n.checked_mul(3600)?),
        "M" => Duration::from_secs(n.checked_mul(60)?),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    };
    Some(crate::domain::limits::clamp_duration(d))
}

/// When a call reached the server (a request extension).
#[derive(Debug, Clone, Copy)]
struct Received(tokio::time::Instant);

/// What is left of the caller's deadline, less imaged's margin, counted
/// from when the call came ([`Received`]); `None` without a deadline.
fn remaining<T>(request: &tonic::Request<T>) -> Option<Duration> {
    let by = grpc_timeout(request.metadata().as_ref()).map(answer_by)?;
    let spent = request.extensions().get::<Received>().map_or(Duration::ZERO, |r| r.0.elapsed());
    Some(by.saturating_sub(spent))
}

/// When imaged gives up on a call whose caller set `deadline`: a little
/// before it (see [`DEADLINE_MARGIN`]), so the caller gets imaged's
/// `DeadlineExceeded`.
fn answer_by(deadline: Duration) -> Duration {
    deadline.saturating_sub((deadline / 10).min(DEADLINE_MARGIN))
}

/// A `PullImageResponse` imaged answers itself (an image found present, or
/// the outage fallback's local image).
pub fn pull_answer(image_ref: String) -> Bytes {
    Bytes::from(prost::Message::encode_to_vec(&pb::PullImageResponse { image_ref }))
}

/// `PullImageRequest` bytes as a [`PullCall`].
fn pull_call(body: Bytes, deadline: Option<Duration>) -> Result<PullCall, CriError> {
    // prost's reason names the field, never its value.
    let req = <pb::PullImageRequest as prost::Message>::decode(&body[..])
        .map_err(|e| CriError::new(CriErrorKind::InvalidArgument, format!("PullImageRequest: {e}")))?;
    let image: ImageSpec = req.image.map(Into::into).unwrap_or_default();
    image_named("PullImageRequest", &image)?;
    Ok(PullCall {
        image,
        auth: req.auth.map(Into::into),
        sandbox: req.sandbox_config.map(Into::into),
        deadline,
        wire: body,
    })
}

/// `image` as a call must name it: not empty, at most
/// [`MAX_IMAGE_LEN`](crate::domain::reference::MAX_IMAGE_LEN) bytes (a
/// client's 16 MiB name would be copied into events, logs and the queue).
pub fn image_named(message: &str, image: &ImageSpec) -> Result<(), CriError> {
    use crate::domain::reference::MAX_IMAGE_LEN;
    if image.image.is_empty() {
        return Err(CriError::new(CriErrorKind::InvalidArgument, format!("{message}.image.image is empty")));
    }
    if image.image.len() > MAX_IMAGE_LEN {
        return Err(CriError::new(
            CriErrorKind::InvalidArgument,
            format!("{message}.image.image is longer than {MAX_IMAGE_LEN} bytes"),
        ));
    }
    Ok(())
}

/// One unary call: the request's bytes in, the answer's bytes out.
struct Call<F: ?Sized> {
    front: Arc<F>,
    rpc: Rpc,
}

impl<F: ImageFront + ?Sized> UnaryService<Bytes> for Call<F> {
    type Response = Bytes;
    type Future = Pin<Box<dyn Future<Output = Result<tonic::Response<Bytes>, tonic::Status>> + Send>>;

    fn call(&mut self, request: tonic::Request<Bytes>) -> Self::Future {
        let (front, rpc) = (self.front.clone(), self.rpc);
        let deadline = remaining(&request);
        let body = request.into_inner();
        Box::pin(async move { answer(&*front, rpc, body, deadline).await.map(tonic::Response::new) })
    }
}

/// What the front answers `rpc` with, as bytes.
async fn answer<F: ImageFront + ?Sized>(
    front: &F,
    rpc: Rpc,
    body: Bytes,
    deadline: Option<Duration>,
) -> Result<Bytes, tonic::Status> {
    let bad_answer = |e: super::wire::WireError| {
        tonic::Status::internal(format!("imaged could not read the runtime's {} answer: {e}", rpc.name()))
    };
    let status = |e: CriError| tonic::Status::from(&e);
    match rpc {
        Rpc::PullImage => {
            let call = pull_call(body, deadline).map_err(status)?;
            front.pull(call).await.map_err(status)
        }
        Rpc::ListImages | Rpc::ImageStatus => {
            let answer = front.forward(rpc, body, deadline).await.map_err(status)?;
            if !front.may_pin(&answer) {
                return Ok(answer);
            }
            pin_images(answer, 1, |i| front.pins(&i.id, &i.repo_tags, &i.repo_digests)).map_err(bad_answer)
        }
        _ => front.forward(rpc, body, deadline).await.map_err(status),
    }
}

/// `StreamImages`: the `ListImages` answer's images in batches.
struct StreamCall<F: ?Sized> {
    front: Arc<F>,
}

/// The front's `StreamImages` answer.
type Batches = Pin<Box<dyn tokio_stream::Stream<Item = Result<Bytes, tonic::Status>> + Send>>;

impl<F: ImageFront + ?Sized> tonic::server::ServerStreamingService<Bytes> for StreamCall<F> {
    type Response = Bytes;
    type ResponseStream = Batches;
    type Future = Pin<Box<dyn Future<Output = Result<tonic::Response<Batches>, tonic::Status>> + Send>>;

    fn call(&mut self, request: tonic::Request<Bytes>) -> Self::Future {
        let front = self.front.clone();
        let deadline = remaining(&request);
        // StreamImagesRequest and ListImagesRequest: the filter is field 1 of both.
        let body = request.into_inner();
        Box::pin(async move {
            let answer = answer(&*front, Rpc::ListImages, body, deadline).await?;
            let batches = super::wire::split_repeated(&answer, 1, STREAM_BATCH).map_err(|e| {
                tonic::Status::internal(format!("imaged could not read the runtime's ListImages answer: {e}"))
            })?;
            let stream: Batches = Box::pin(tokio_stream::iter(batches.into_iter().map(Ok)));
            Ok(tonic::Response::new(stream))
        })
    }
}

impl<F, B> tonic::codegen::Service<http::Request<B>> for ImageServiceServer<F>
where
    F: ImageFront + ?Sized,
    B: Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<TonicBody>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut req: http::Request<B>) -> Self::Future {
        // When the call came: tonic's own timeout counts from here, so
        // imaged's must too (reading the body comes later, and under load
        // takes long enough for tonic's `Cancelled` to answer first).
        req.extensions_mut().insert(Received(tokio::time::Instant::now()));
        if req.uri().path() == STREAM_IMAGES {
            let front = self.front.clone();
            return Box::pin(async move {
                let mut grpc = Grpc::new(BytesCodec)
                    .apply_max_message_size_config(Some(MAX_MESSAGE_BYTES), Some(MAX_MESSAGE_BYTES));
                Ok(grpc.server_streaming(StreamCall { front }, req).await)
            });
        }
        let Some(rpc) = call_of(req.uri().path()) else {
            let status = tonic::Status::unimplemented(format!("imaged does not serve {}", req.uri().path()));
            return Box::pin(async move { Ok(status.into_http()) });
        };
        let front = self.front.clone();
        Box::pin(async move {
            let mut grpc =
                Grpc::new(BytesCodec).apply_max_message_size_config(Some(MAX_MESSAGE_BYTES), Some(MAX_MESSAGE_BYTES));
            Ok(grpc.unary(Call { front, rpc }, req).await)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pull_call_and_its_queued_request_never_print_the_clients_bytes() {
        let wire = prost::Message::encode_to_vec(&pb::PullImageRequest {
            image: Some(pb::ImageSpec { image: "registry.example/app:1".into(), ..Default::default() }),
            auth: Some(pb::AuthConfig {
                username: "team".into(),
                password: "hunter2-wire".into(),
                ..Default::default()
            }),
            sandbox_config: None,
        });
        let call = pull_call(Bytes::from(wire.clone()), None).unwrap();
        let shown = format!("{call:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains(&format!("wire: <{} bytes>", wire.len())), "{shown}");
        assert!(shown.contains("registry.example/app:1"), "the rest still shows: {shown}");
        let request = crate::actors::pull_queue::PullRequest {
            wire: Some(call.wire.clone()),
            ..crate::actors::pull_queue::PullRequest::new(call.image.clone())
        };
        let shown = format!("{request:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains(&format!("wire: Some(<{} bytes>)", wire.len())), "{shown}");
    }

    #[test]
    fn the_deadline_left_counts_from_when_the_call_came() {
        let mut req = tonic::Request::new(Bytes::new());
        assert_eq!(remaining(&req), None, "no deadline");
        req.metadata_mut().insert("grpc-timeout", "100m".parse().unwrap());
        let came = tokio::time::Instant::now().checked_sub(Duration::from_millis(30)).unwrap();
        req.extensions_mut().insert(Received(came));
        let left = remaining(&req).unwrap();
        // 100 ms less the 5 ms margin, less the 30 ms already spent.
        assert!(left <= Duration::from_millis(65) && left > Duration::from_millis(55), "{left:?}");
    }

    #[test]
    fn paths_name_the_five_calls_and_nothing_else() {
        assert_eq!(call_of("/runtime.v1.ImageService/PullImage"), Some(Rpc::PullImage));
        assert_eq!(call_of("/runtime.v1.ImageService/ImageFsInfo"), Some(Rpc::ImageFsInfo));
        // StreamImages is served apart (a stream), never as a unary call.
        assert_eq!(call_of(STREAM_IMAGES), None);
        assert_eq!(call_of("/runtime.v1.RuntimeService/Version"), None);
        assert_eq!(call_of("/runtime.v1.ImageService/"), None);
    }

    #[test]
    fn grpc_timeouts_are_read_in_every_unit_and_garbage_is_none() {
        let t = |v: &str| {
            let mut h = http::HeaderMap::new();
            h.insert("grpc-timeout", v.parse().unwrap());
            grpc_timeout(&h)
        };
        assert_eq!(t("2H"), Some(Duration::from_secs(7200)));
        assert_eq!(t("3M"), Some(Duration::from_secs(180)));
        assert_eq!(t("4S"), Some(Duration::from_secs(4)));
        assert_eq!(t("5m"), Some(Duration::from_millis(5)));
        assert_eq!(t("6u"), Some(Duration::from_micros(6)));
        assert_eq!(t("7n"), Some(Duration::from_nanos(7)));
        assert_eq!(t("99999999H"), Some(crate::domain::limits::MAX_DURATION));
        for bad in ["", "S", "5x", "-1S", "1.5S"] {
            assert_eq!(t(bad), None, "{bad:?}");
        }
        assert_eq!(grpc_timeout(&http::HeaderMap::new()), None);
    }

    #[test]
    fn imaged_answers_a_little_before_the_callers_deadline() {
        let ms = Duration::from_millis;
        assert_eq!(answer_by(ms(50)), ms(45), "a tenth of a short deadline");
        assert_eq!(answer_by(Duration::from_secs(2)), Duration::from_secs(2).checked_sub(DEADLINE_MARGIN).unwrap());
        assert_eq!(answer_by(Duration::ZERO), Duration::ZERO);
    }

    #[test]
    fn a_pull_call_is_read_with_its_one_credential_and_an_empty_image_is_refused() {
        let req = pb::PullImageRequest {
            image: Some(pb::ImageSpec { image: "nginx:1".into(), ..Default::default() }),
            auth: Some(pb::AuthConfig { username: "u".into(), password: "p".into(), ..Default::default() }),
            sandbox_config: None,
        };
        let call = pull_call(prost::Message::encode_to_vec(&req).into(), Some(Duration::from_secs(1))).unwrap();
        assert_eq!(call.image.image, "nginx:1");
        assert_eq!(call.auth.as_ref().map(|a| a.username.as_str()), Some("u"));
        assert_eq!(call.deadline, Some(Duration::from_secs(1)));
        let empty =
            pull_call(prost::Message::encode_to_vec(&pb::PullImageRequest::default()).into(), None).unwrap_err();
        assert_eq!(empty.kind(), CriErrorKind::InvalidArgument);
        assert!(pull_call(Bytes::from_static(&[0x0a, 0x05, 1]), None).is_err());
    }
}
