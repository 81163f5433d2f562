//! The CRI front under load, on the embedded runtime: reads that never wait
//! behind queued pulls, imaged's own pull deadline, callers that go away,
//! 16 MiB messages both ways and a burst of parallel pulls, all driven by
//! the generated `runtime.v1` client (as the kubelet uses it) on the front's
//! socket. The setup is `tests/cri_front.rs`'s, copied.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::pedantic)] // test code: a failed unwrap is a failed test

mod support;

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use imaged::actors::pull_queue::{PullStage, QueueStatus};
use imaged::config::{Config, RuntimeEndpoint};
use imaged::cri::proto as pb;
use imaged::cri::proto::image_service_client::ImageServiceClient;
use imaged::cri::{CriEndpoint, Rpc};
use imaged::embedded::{EmbeddedRuntime, RemoteImage};
use imaged::node::Node;
use prost::Message as _;
use tonic::Code;
use tonic::transport::Channel;

/// The kubelet's CRI message limit, which the front allows both ways.
const MIB_16: usize = 16 << 20;
/// tonic's (and gRPC's) default receive limit.
const MIB_4: usize = 4 << 20;

/// A node on the embedded runtime, its CRI front served on a temp socket,
/// and a client of that socket.
struct Front {
    _dir: tempfile::TempDir,
    node: Arc<Node>,
    path: std::path::PathBuf,
    client: ImageServiceClient<Channel>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Front {
    async fn start(toml: &str) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut cfg = Config::from_toml(toml).expect("config");
        cfg.endpoint = RuntimeEndpoint::Embedded { socket: Some(dir.path().join("runtime.sock")) };
        let node = Arc::new(Node::start(cfg).await.expect("node starts"));
        let path = dir.path().join("cri.sock");
        let stop = support::front::serve_front(&node, &path).await;
        let client = ImageServiceClient::new(channel_to(&path));
        Front { _dir: dir, node, path, client, stop: Some(stop) }
    }

    fn runtime(&self) -> &EmbeddedRuntime {
        self.node.runtime().embedded.as_ref().expect("embedded")
    }

    fn runtime_pulls(&self) -> u64 {
        self.runtime().stats().calls(Rpc::PullImage)
    }

    async fn queue(&self) -> QueueStatus {
        self.node.status().await.expect("status").queue
    }

    /// Stops serving and stops the node without waiting for queued pulls;
    /// how many pulls (queued or running) it abandoned.
    async fn stop(&mut self) -> usize {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        tokio::time::timeout(Duration::from_secs(10), self.node.shutdown(Duration::ZERO))
            .await
            .expect("the node stops within 10 s")
            .abandoned_pulls
    }
}

/// A new connection to the front's socket.
fn channel_to(path: &std::path::Path) -> Channel {
    CriEndpoint::Unix(path.to_path_buf()).channel(Duration::from_secs(5)).expect("channel")
}

fn spec(image: &str) -> pb::ImageSpec {
    pb::ImageSpec { image: image.into(), ..Default::default() }
}

fn pull(image: &str) -> pb::PullImageRequest {
    pb::PullImageRequest { image: Some(spec(image)), auth: None, sandbox_config: None }
}

/// Polls `probe` every 10 ms until `done` holds of its value (at most
/// `within`); the last value either way.
async fn poll_until<T, F, Fut>(within: Duration, mut probe: F, done: impl Fn(&T) -> bool) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = T>,
{
    let give_up = Instant::now() + within;
    loop {
        let v = probe().await;
        if done(&v) || Instant::now() >= give_up {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// How long `call` takes, and its result.
async fn timed<T>(call: impl Future<Output = T>) -> (Duration, T) {
    let t = Instant::now();
    let r = call.await;
    (t.elapsed(), r)
}

#[actix::test]
async fn fs_info_status_and_list_answer_at_once_behind_200_queued_pulls() {
    let mut f = Front::start("").await; // serial pulls, a queue of 10: the defaults
    let image = |i: usize| format!("registry.example.com/load/app-{i}:v1");
    for i in 0..200 {
        f.runtime().add_remote(RemoteImage::new(image(i), 1_000_000).latency(Duration::from_secs(2))).expect("added");
    }
    let present = f.runtime().preload(RemoteImage::new("registry.example.com/load/present:v1", 1_000)).expect("loaded");
    let pulls: Vec<_> = (0..200)
        .map(|i| {
            let (mut c, image) = (f.client.clone(), image(i));
            tokio::spawn(async move { c.pull_image(pull(&image)).await })
        })
        .collect();
    let held = |q: &QueueStatus| q.running + q.queued + q.parked == 200;
    let q = poll_until(Duration::from_secs(10), || f.queue(), held).await;
    assert_eq!((q.running, q.queued, q.parked), (1, 10, 189), "one pulls, ten wait their turn, the rest wait for room");

    let mut c = f.client.clone();
    let (mut fs_info, mut status, mut list) = (Duration::ZERO, Duration::ZERO, Duration::ZERO);
    for i in 0..5 {
        let (t, r) = timed(c.image_fs_info(pb::ImageFsInfoRequest {})).await;
        assert!(!r.expect("ImageFsInfo").into_inner().image_filesystems.is_empty());
        fs_info = fs_info.max(t);
        let req = pb::ImageStatusRequest { image: Some(spec(&image(100 + i))), verbose: false };
        let (t, r) = timed(c.image_status(req)).await;
        assert_eq!(r.expect("ImageStatus").into_inner().image, None, "a queued image is not there yet");
        status = status.max(t);
        let (t, r) = timed(c.list_images(pb::ListImagesRequest::default())).await;
        let ids: Vec<_> = r.expect("ListImages").into_inner().images.into_iter().map(|i| i.id).collect();
        assert_eq!(ids, std::slice::from_ref(&present), "only the preloaded image: no pull has finished");
        list = list.max(t);
    }
    eprintln!("slowest of 5 behind 200 pulls: ImageFsInfo {fs_info:?}, ImageStatus {status:?}, ListImages {list:?}");
    let bound = Duration::from_millis(200);
    assert!(fs_info < bound && status < bound && list < bound, "{fs_info:?} {status:?} {list:?}");

    // Still all queued: the calls above overtook them.
    let q = f.queue().await;
    assert_eq!((q.running, q.queued, q.parked), (1, 10, 189));
    let stats = f.runtime().stats();
    assert_eq!((stats.calls(Rpc::PullImage), stats.pulls_in_flight, stats.pulls_completed), (1, 1, 0));

    // Stopping the node answers every waiting call (the queue stopped).
    assert_eq!(f.stop().await, 11, "the running pull and the ten queued");
    for p in pulls {
        let answered = tokio::time::timeout(Duration::from_secs(5), p).await.expect("answered once the node stops");
        let err = answered.expect("task").expect_err("the node stopped");
        assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    }
}

#[actix::test]
async fn imageds_pull_deadline_ends_a_front_pull_with_deadline_exceeded() {
    let f = Front::start("[pull]\npull_deadline = \"300ms\"").await;
    let slow = "registry.example.com/slow/app:v1";
    f.runtime().add_remote(RemoteImage::new(slow, 1_000).latency(Duration::from_secs(3))).expect("added");
    let mut c = f.client.clone();
    // No grpc-timeout on the call: the kubelet sets none on PullImage.
    let (took, r) = timed(c.pull_image(pull(slow))).await;
    let err = r.expect_err("the pull takes 3 s, the deadline is 300 ms");
    assert_eq!(err.code(), Code::DeadlineExceeded, "{err:?}");
    assert_eq!(err.message(), "image pull cancelled: it did not finish within its deadline of 300ms");
    assert!(took >= Duration::from_millis(300) && took < Duration::from_millis(1500), "{took:?}");
    // The runtime's pull was cancelled, not left running.
    let stats = poll_until(Duration::from_secs(2), || async { f.runtime().stats() }, |s| s.pulls_in_flight == 0).await;
    assert_eq!((stats.calls(Rpc::PullImage), stats.pulls_in_flight, stats.pulls_completed), (1, 0, 0));
    let absent = c.image_status(pb::ImageStatusRequest { image: Some(spec(slow)), verbose: false }).await;
    assert_eq!(absent.expect("status").into_inner().image, None);
    // A pull within the deadline is not touched by it.
    c.pull_image(pull("docker.io/library/busybox:1.36")).await.expect("busybox takes 120 ms");
}

#[actix::test]
async fn a_caller_that_goes_away_neither_cancels_the_shared_pull_nor_leaves_a_waiter() {
    let f = Front::start("").await;
    let slow = "registry.example.com/slow/app:v1";
    f.runtime().add_remote(RemoteImage::new(slow, 1_000).latency(Duration::from_millis(1500))).expect("added");
    // Each caller on its own connection, as two clients would be.
    let mut gone = ImageServiceClient::new(channel_to(&f.path));
    let gone = tokio::spawn(async move { gone.pull_image(pull(slow)).await });
    let mut stays = ImageServiceClient::new(channel_to(&f.path));
    let stays = tokio::spawn(async move { stays.pull_image(pull(slow)).await });
    let pulls = poll_until(
        Duration::from_secs(5),
        || async { f.node.list_pulls().await.expect("pulls") },
        |p| p.len() == 1 && p[0].waiters == 2 && p[0].stage == PullStage::Pulling,
    )
    .await;
    assert!(pulls.len() == 1 && pulls[0].waiters == 2 && pulls[0].stage == PullStage::Pulling, "{pulls:?}");

    // The caller goes away mid-pull: its task, client and connection dropped.
    gone.abort();
    assert!(gone.await.expect_err("aborted").is_cancelled());
    let image_ref = tokio::time::timeout(Duration::from_secs(5), stays)
        .await
        .expect("the other caller is answered")
        .expect("task")
        .expect("the shared pull went on")
        .into_inner()
        .image_ref;
    assert_eq!(image_ref, RemoteImage::new(slow, 1_000).id);
    let stats = f.runtime().stats();
    assert_eq!((stats.calls(Rpc::PullImage), stats.pulls_completed), (1, 1), "one runtime pull, finished");

    // Nothing left behind: no pull, no waiter (once its size lookup, which
    // runs after the caller is answered, ends).
    let q = poll_until(Duration::from_secs(2), || f.queue(), |q| *q == QueueStatus::default()).await;
    assert_eq!(q, QueueStatus::default());
    let left = poll_until(
        Duration::from_secs(2),
        || async { f.node.list_pulls().await.expect("pulls") },
        |p: &Vec<_>| p.is_empty(),
    )
    .await;
    assert_eq!(left, []);

    // The front always pulls: the same image again is a second runtime pull.
    let again = f.client.clone().pull_image(pull(slow)).await.expect("pulled again").into_inner().image_ref;
    assert_eq!(again, image_ref);
    assert_eq!(f.runtime_pulls(), 2);
    assert_eq!(f.queue().await, QueueStatus::default());
}

/// An image status request with `bytes` of annotations (one value).
fn big_status(image: &str, bytes: usize) -> pb::ImageStatusRequest {
    let annotations = HashMap::from([("imaged.test/padding".to_string(), "x".repeat(bytes))]);
    pb::ImageStatusRequest {
        image: Some(pb::ImageSpec { image: image.into(), annotations, ..Default::default() }),
        verbose: false,
    }
}

/// A name ~3 KiB long: a domain of 40 63-character labels (the reference
/// grammar, and so the embedded runtime, sets no length on a domain; only
/// on the path, 255, and the tag, 128), a 251-character path and a
/// 127-character tag. Each image carries it twice (tag and digest): ~7 KiB
/// on the wire, so that few images make a big ListImages answer (the
/// embedded runtime's preload is linear in the images it holds).
fn long_name(i: usize) -> String {
    let labels = vec!["d".repeat(63); 40].join(".");
    format!("r{i:06}.{labels}.example.com/big/{i:06}-{}:{i:06}-{}", "p".repeat(240), "t".repeat(120))
}

#[actix::test]
async fn messages_up_to_16_mib_pass_both_ways_and_larger_ones_are_refused() {
    let f = Front::start("").await;
    let t = Instant::now();
    for i in 0..1200 {
        f.runtime().preload(RemoteImage::new(long_name(i), 1_000)).expect("preloaded");
    }
    eprintln!("1200 images preloaded in {:?}", t.elapsed());
    let kubelet_like = ImageServiceClient::new(channel_to(&f.path))
        .max_decoding_message_size(MIB_16)
        .max_encoding_message_size(usize::MAX);

    // The answer: over tonic's 4 MiB default (a client with that default
    // refuses it itself), within 16 MiB, and the front passes it.
    let err = f.client.clone().list_images(pb::ListImagesRequest::default()).await.expect_err("over 4 MiB");
    assert_eq!(err.code(), Code::OutOfRange, "{err:?}");
    assert!(err.message().contains("the limit is: 4194304 bytes"), "the client's own limit: {err:?}");
    let answer = kubelet_like.clone().list_images(pb::ListImagesRequest::default()).await.expect("list").into_inner();
    let size = answer.encoded_len();
    eprintln!(
        "ListImages answer: {} images, {size} bytes ({:.2} MiB)",
        answer.images.len(),
        size as f64 / f64::from(1 << 20)
    );
    assert_eq!(answer.images.len(), 1200);
    assert!(size > MIB_4 && size < MIB_16, "{size}");

    // A request over 4 MiB is taken (not refused for its size): 6 MiB of
    // annotations on an ImageStatus and on a PullImage.
    let status = kubelet_like.clone().image_status(big_status("docker.io/library/busybox:1.36", 6 << 20)).await;
    assert_eq!(status.expect("a 6 MiB ImageStatus is served").into_inner().image, None);
    let req = big_status("docker.io/library/busybox:1.36", 6 << 20);
    assert!(req.encoded_len() > 6 << 20);
    let pull_req = pb::PullImageRequest { image: req.image, auth: None, sandbox_config: None };
    kubelet_like.clone().pull_image(pull_req).await.expect("a 6 MiB PullImage is served");
    assert_eq!(f.runtime_pulls(), 1);

    // Over 16 MiB: the front refuses the request before reading it. tonic
    // answers a message over its limit OutOfRange (grpc-go would say
    // ResourceExhausted), with the limit in the message.
    let req = big_status("docker.io/library/busybox:1.36", 17 << 20);
    let calls_before = f.runtime().stats().calls(Rpc::ImageStatus);
    let err = kubelet_like.clone().image_status(req).await.expect_err("over 16 MiB");
    assert_eq!(err.code(), Code::OutOfRange, "{err:?}");
    assert!(err.message().starts_with("Error, decoded message length too large: found "), "{err:?}");
    assert!(err.message().ends_with("the limit is: 16777216 bytes"), "the front's limit, 16 MiB: {err:?}");
    assert_eq!(f.runtime().stats().calls(Rpc::ImageStatus), calls_before, "never forwarded");

    // An answer over 16 MiB: the runtime sends it (its limit is 64 MiB),
    // the front refuses to pass it on, even to a client that would take it.
    for i in 1200..3000 {
        f.runtime().preload(RemoteImage::new(long_name(i), 1_000)).expect("preloaded");
    }
    let roomy = |c: Channel| ImageServiceClient::new(c).max_decoding_message_size(64 << 20);
    let direct = roomy(f.runtime().endpoint().channel(Duration::from_secs(5)).expect("channel"));
    let answer = direct.clone().list_images(pb::ListImagesRequest::default()).await.expect("direct").into_inner();
    let size = answer.encoded_len();
    eprintln!(
        "ListImages answer: {} images, {size} bytes ({:.2} MiB)",
        answer.images.len(),
        size as f64 / f64::from(1 << 20)
    );
    assert!(size > MIB_16, "{size}");
    let err = roomy(channel_to(&f.path)).list_images(pb::ListImagesRequest::default()).await.expect_err("over 16 MiB");
    assert_eq!(err.code(), Code::OutOfRange, "{err:?}");
    assert!(err.message().starts_with("Error, encoded message length too large: found "), "{err:?}");
    assert!(err.message().ends_with("the limit is: 16777216 bytes"), "the front's limit, 16 MiB: {err:?}");
}

#[actix::test]
async fn a_burst_of_500_pulls_over_50_images_makes_50_runtime_pulls() {
    // No rate limit here: the default throttle (5 pulls/s, burst 10, fail)
    // would fail 40 of the 50 distinct pulls with "pull QPS exceeded".
    let f = Front::start("[pull]\nserialize_image_pulls = false\nregistry_pull_qps = 0").await;
    let image = |i: usize| format!("registry.example.com/burst/app-{i}:v1");
    for i in 0..50 {
        f.runtime().add_remote(RemoteImage::new(image(i), 1_000).latency(Duration::from_secs(2))).expect("added");
    }
    let t = Instant::now();
    let calls: Vec<_> = (0..500)
        .map(|n| {
            let (mut c, image) = (f.client.clone(), image(n % 50));
            tokio::spawn(async move { (n % 50, c.pull_image(pull(&image)).await) })
        })
        .collect();
    // Every call reaches the queue before the first pull (2 s) ends.
    let pulls = poll_until(
        Duration::from_secs(2),
        || async { f.node.list_pulls().await.expect("pulls") },
        |p| p.iter().map(|p| p.waiters).sum::<usize>() == 500,
    )
    .await;
    let waiters: usize = pulls.iter().map(|p| p.waiters).sum();
    assert_eq!((pulls.len(), waiters), (50, 500), "{pulls:?}");
    eprintln!("500 calls in the queue after {:?}", t.elapsed());
    for c in calls {
        let (i, r) = tokio::time::timeout(Duration::from_secs(10), c).await.expect("answered").expect("task");
        assert_eq!(r.expect("pulled").into_inner().image_ref, RemoteImage::new(image(i), 1_000).id);
    }
    eprintln!("500 calls answered after {:?}", t.elapsed());
    let stats = f.runtime().stats();
    assert_eq!((stats.calls(Rpc::PullImage), stats.pulls_completed, stats.max_pulls_in_flight), (50, 50, 50));
    assert_eq!(f.queue().await, QueueStatus::default());
}
