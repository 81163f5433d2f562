//! The API's `EnsureImage` served in front of the generated server, with
//! a call future a burst can afford.
//!
//! # Why
//!
//! A burst of ensures waits in the daemon for as long as its pulls take,
//! and what each waiting call holds is what the burst costs
//! (`cargo bench --bench load`: 10,000 concurrent calls). Through tonic's
//! generated server a waiting `EnsureImage` holds about 3.1 KB of tonic's
//! own besides imaged's ensure: the generated per-call future (2.1 KB:
//! `Grpc::unary`'s state, sized for its largest step, decoding, with the
//! HTTP request kept twice), the generated service's box around the
//! method (0.5 KB, the decoded request kept beside the ensure) and the
//! router's (0.5 KB) — 31 MB of a 10,000-call burst, measured with
//! heaptrack. Here the request is read and decoded in a boxed step that
//! ends before the ensure starts, and the waiting call holds the ensure
//! and the node's handle only.
//!
//! # What it keeps
//!
//! The gRPC unary contract as tonic serves it: one length-prefixed
//! message, tonic's statuses and texts for a compressed message, one over
//! the size limit, a missing one or a truncated one; the answer as a
//! message and `grpc-status: 0` trailers, or a status in a trailers-only
//! answer. `grpc-timeout` is handled around this by tonic's server, as for
//! every other method. Every other path goes to the generated server.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http_body::Frame;
use http_body_util::BodyExt as _;
use prost::Message as _;
use prost::bytes::{Buf as _, BufMut as _, Bytes, BytesMut};
use tonic::Status;
use tonic::body::Body;
use tonic::codegen::http::{self, HeaderMap, HeaderValue, Request, Response};

use super::{convert, proto, status_of};
use crate::ensure::EnsureImageRequest;
use crate::node::Node;

/// The method's path.
pub const ENSURE_PATH: &str = "/imaged.v1.Imaged/EnsureImage";

/// The length prefix of a gRPC message: a compressed flag and a length.
const PREFIX: usize = 5;

/// Serves [`ENSURE_PATH`] with [`EnsureRoute`] before the generated server.
#[derive(Clone)]
pub struct EnsureRouteLayer {
    node: Arc<Node>,
    max_request_bytes: usize,
}

impl EnsureRouteLayer {
    /// `EnsureImage` on `node`; requests over `max_request_bytes` refused
    /// as the generated server refuses them.
    pub fn new(node: Arc<Node>, max_request_bytes: usize) -> Self {
        Self { node, max_request_bytes }
    }
}

impl std::fmt::Debug for EnsureRouteLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EnsureRouteLayer").field("max_request_bytes", &self.max_request_bytes).finish_non_exhaustive()
    }
}

impl<S> tower::Layer<S> for EnsureRouteLayer {
    type Service = EnsureRoute<S>;

    fn layer(&self, inner: S) -> EnsureRoute<S> {
        EnsureRoute { inner, node: self.node.clone(), max_request_bytes: self.max_request_bytes }
    }
}

/// `EnsureImage` served here, every other call by `inner`.
#[derive(Clone)]
pub struct EnsureRoute<S> {
    inner: S,
    node: Arc<Node>,
    max_request_bytes: usize,
}

impl<S> std::fmt::Debug for EnsureRoute<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EnsureRoute").field("max_request_bytes", &self.max_request_bytes).finish_non_exhaustive()
    }
}

/// A boxed answer.
type Answer = Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>;

impl<S> tower::Service<Request<Body>> for EnsureRoute<S>
where
    S: tower::Service<Request<Body>, Response = Response<Body>, Error = Infallible>,
{
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = futures_util::future::Either<S::Future, Answer>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        if req.uri().path() != ENSURE_PATH {
            return futures_util::future::Either::Left(self.inner.call(req));
        }
        futures_util::future::Either::Right(Box::pin(ensure(self.node.clone(), req, self.max_request_bytes)))
    }
}

/// One `EnsureImage` call.
async fn ensure(node: Arc<Node>, req: Request<Body>, limit: usize) -> Result<Response<Body>, Infallible> {
    // Boxed: reading holds the request's head, body and buffer, all gone
    // before the ensure's long wait starts.
    let request = match Box::pin(read_request(req, limit)).await {
        Ok(r) => r,
        Err(status) => return Ok(status.into_http()),
    };
    Ok(match node.ensure_image_exists(&request).await {
        Ok(result) => answer(&convert::ensure_response(result)),
        Err(e) => status_of(e).into_http(),
    })
}

/// The request's one message, decoded and checked.
async fn read_request(req: Request<Body>, limit: usize) -> Result<EnsureImageRequest, Status> {
    if let Some(encoding) = req.headers().get("grpc-encoding")
        && encoding.as_bytes() != b"identity"
    {
        return Err(unsupported_encoding(encoding));
    }
    let message = read_message(req.into_body(), limit).await?;
    let message = proto::EnsureImageRequest::decode(message).map_err(|e| Status::internal(e.to_string()))?;
    convert::ensure_request(message)
}

/// tonic's answer to a message compressed with an encoding it does not
/// take (the API takes none).
fn unsupported_encoding(encoding: &HeaderValue) -> Status {
    let name = String::from_utf8_lossy(encoding.as_bytes());
    let mut status = Status::unimplemented(format!("Content is compressed with `{name}` which isn't supported"));
    status.metadata_mut().insert("grpc-accept-encoding", tonic::metadata::MetadataValue::from_static("identity"));
    status
}

/// The one length-prefixed message of a unary request's body, at most
/// `limit` bytes; the body is read to its end, and nothing past the
/// message is taken.
async fn read_message(mut body: Body, limit: usize) -> Result<Bytes, Status> {
    let mut buf = BytesMut::new();
    let mut whole = None;
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame?.into_data() else { continue };
        buf.extend_from_slice(&data);
        if whole.is_none() && buf.len() >= PREFIX {
            whole = Some(PREFIX + message_len(&buf[..PREFIX], limit)?);
        }
        if whole.is_some_and(|n| buf.len() > n) {
            return Err(Status::internal("a unary request carries more than one message"));
        }
    }
    match whole {
        None if buf.is_empty() => Err(Status::internal("Missing request message.")),
        Some(n) if buf.len() == n => {
            buf.advance(PREFIX);
            Ok(buf.freeze())
        }
        _ => Err(Status::internal("Unexpected EOF decoding stream.")),
    }
}

/// The length a message's prefix gives, with tonic's statuses for a
/// compressed message (no encoding was agreed) and one over `limit`.
fn message_len(prefix: &[u8], limit: usize) -> Result<usize, Status> {
    match prefix {
        [0, a, b, c, d] => {
            let len = u32::from_be_bytes([*a, *b, *c, *d]) as usize;
            if len > limit {
                return Err(Status::out_of_range(format!(
                    "Error, decoded message length too large: found {len} bytes, the limit is: {limit} bytes"
                )));
            }
            Ok(len)
        }
        [1, ..] => Err(Status::internal(
            "protocol error: received message with compressed-flag but no grpc-encoding was specified",
        )),
        [flag, ..] => Err(Status::internal(format!(
            "protocol error: received message with invalid compression flag: {flag} (valid flags are 0 and 1) while receiving request"
        ))),
        [] => Err(Status::internal("Unexpected EOF decoding stream.")),
    }
}

/// A successful answer: `message`, then `grpc-status: 0`.
fn answer(message: &proto::EnsureImageResponse) -> Response<Body> {
    let len = message.encoded_len();
    let mut buf = BytesMut::with_capacity(PREFIX + len);
    buf.put_u8(0);
    // The API's answers are far under 4 GiB.
    buf.put_u32(u32::try_from(len).unwrap_or(u32::MAX));
    message.encode_raw(&mut buf);
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", HeaderValue::from_static("0"));
    let mut response = Response::new(Body::new(Unary { message: Some(buf.freeze()), trailers: Some(trailers) }));
    response.headers_mut().insert(http::header::CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    response
}

/// A unary answer's body: one message, then the trailers.
struct Unary {
    message: Option<Bytes>,
    trailers: Option<HeaderMap>,
}

impl http_body::Body for Unary {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = self.get_mut();
        if let Some(message) = this.message.take() {
            return Poll::Ready(Some(Ok(Frame::data(message))));
        }
        Poll::Ready(this.trailers.take().map(|t| Ok(Frame::trailers(t))))
    }

    fn is_end_stream(&self) -> bool {
        self.message.is_none() && self.trailers.is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn framed(flag: u8, message: &[u8]) -> Vec<u8> {
        let mut v = vec![flag];
        v.extend_from_slice(&u32::try_from(message.len()).expect("small").to_be_bytes());
        v.extend_from_slice(message);
        v
    }

    /// A body sent in `chunks`, as a client's DATA frames may split it.
    fn body(chunks: Vec<Vec<u8>>) -> Body {
        let frames = chunks.into_iter().map(|c| Ok::<_, Status>(Frame::data(Bytes::from(c))));
        Body::new(http_body_util::StreamBody::new(futures_util::stream::iter(frames)))
    }

    fn request(chunks: Vec<Vec<u8>>) -> Request<Body> {
        Request::builder().uri(ENSURE_PATH).body(body(chunks)).expect("request")
    }

    fn ensure_message() -> Vec<u8> {
        proto::EnsureImageRequest {
            image: "nginx:1.27".into(),
            pull_policy: "IfNotPresent".into(),
            pod: Some(proto::Pod { uid: "u1".into(), ..Default::default() }),
            ..Default::default()
        }
        .encode_to_vec()
    }

    #[tokio::test]
    async fn a_message_split_across_frames_is_read_whole_and_converted() {
        let bytes = framed(0, &ensure_message());
        let (a, b) = bytes.split_at(3);
        let req = read_request(request(vec![a.to_vec(), b.to_vec()]), 1024).await.expect("a valid request");
        assert_eq!(req.image, "nginx:1.27");
        assert_eq!(req.pod.uid, "u1");
    }

    #[tokio::test]
    async fn bad_bodies_get_tonics_statuses() {
        let message = ensure_message();
        let over = read_request(request(vec![framed(0, &message)]), 8).await.expect_err("over the limit");
        assert_eq!(over.code(), tonic::Code::OutOfRange);
        assert_eq!(
            over.message(),
            format!("Error, decoded message length too large: found {} bytes, the limit is: 8 bytes", message.len())
        );
        let missing = read_request(request(vec![]), 1024).await.expect_err("no message");
        assert_eq!((missing.code(), missing.message()), (tonic::Code::Internal, "Missing request message."));
        let mut cut = framed(0, &message);
        cut.pop();
        let truncated = read_request(request(vec![cut]), 1024).await.expect_err("truncated");
        assert_eq!((truncated.code(), truncated.message()), (tonic::Code::Internal, "Unexpected EOF decoding stream."));
        let short_prefix = read_request(request(vec![vec![0, 0]]), 1024).await.expect_err("a bare prefix");
        assert_eq!(short_prefix.message(), "Unexpected EOF decoding stream.");
        let compressed = read_request(request(vec![framed(1, &message)]), 1024).await.expect_err("compressed");
        assert_eq!(compressed.code(), tonic::Code::Internal);
        assert!(compressed.message().contains("compressed-flag but no grpc-encoding"), "{compressed:?}");
        let two = [framed(0, &message), framed(0, &message)].concat();
        let extra = read_request(request(vec![two]), 1024).await.expect_err("two messages");
        assert_eq!(extra.code(), tonic::Code::Internal);
        let junk = read_request(request(vec![framed(0, &[0xff, 0xff, 0xff])]), 1024).await.expect_err("not protobuf");
        assert_eq!(junk.code(), tonic::Code::Internal);
        let mut gzip = request(vec![framed(1, &message)]);
        gzip.headers_mut().insert("grpc-encoding", HeaderValue::from_static("gzip"));
        let gzip = read_request(gzip, 1024).await.expect_err("gzip");
        assert_eq!(gzip.code(), tonic::Code::Unimplemented);
        assert_eq!(gzip.message(), "Content is compressed with `gzip` which isn't supported");
    }

    #[tokio::test]
    async fn a_request_the_api_refuses_names_its_reason() {
        let bad = proto::EnsureImageRequest { image: String::new(), ..Default::default() }.encode_to_vec();
        let e = read_request(request(vec![framed(0, &bad)]), 1024).await.expect_err("no image");
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    }

    #[tokio::test]
    async fn an_answer_is_one_message_then_status_zero() {
        let message = proto::EnsureImageResponse {
            result: Some(proto::ensure_image_response::Result::Ok(proto::EnsureOk {
                image_ref: "sha256:abc".into(),
                message: String::new(),
            })),
        };
        let response = answer(&message);
        assert_eq!(response.headers()[http::header::CONTENT_TYPE], "application/grpc");
        let collected = response.into_body().collect().await.expect("body");
        let trailers = collected.trailers().cloned().expect("trailers");
        assert_eq!(trailers["grpc-status"], "0");
        let bytes = collected.to_bytes();
        assert_eq!(bytes[0], 0);
        let decoded = proto::EnsureImageResponse::decode(&bytes[PREFIX..]).expect("one message");
        assert_eq!(decoded, message);
    }
}
