//! The CRI front's cost, against one embedded runtime, in one run: calls
//! through imaged's CRI socket ÷ the same calls straight to the runtime,
//! interleaved call by call. Prints `name: value` lines:
//!
//! - `cri_server_status_ratio`: ImageStatus, median through ÷ median direct (goal ≤ 1.15);
//! - `cri_server_list_ratio`: ListImages of 5,000 images, the same (goal ≤ 1.15);
//! - `cri_server_burst_runtime_pulls`: runtime PullImage calls for 100
//!   concurrent identical PullImage calls through the front (goal = 1);
//! - `cri_server_fsinfo_busy_ratio`: ImageFsInfo p99 while 200 pulls are
//!   queued ÷ its p99 idle (goal ≤ 2);
//! - `cri_server_containerd_status_ratio`: the ImageStatus comparison with
//!   real containerd behind imaged (started on loopback as the real tests
//!   start it; a skip line when it is not installed).
//!
//! Each ratio is measured in 7 rounds (about 5 s for the status ones):
//! the figure is the median round's, `_ratio_min_median_max` its spread.
//!
//! The front answers a repeated ImageStatus or ListImages from its read
//! cache until an image changes through imaged (`cri_server.read_cache_ttl`,
//! 1 s by default), as the kubelet's repeated reads meet it; the status and
//! list figures are also given with the cache off (`_uncached_us`,
//! `_uncached_ratio`: every call forwarded).
//!
//! Beside each ratio, the same calls through a bare tonic proxy (a server
//! that forwards the bytes with a tonic client, nothing of imaged's, on a
//! thread of its own as imaged is): `_floor_ratio` is what one more gRPC hop
//! costs before imaged does anything, `_vs_floor` is imaged against it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::pedantic)]

#[path = "../tests/support/mod.rs"]
mod support; // bench code: a failed unwrap is a failed run

use std::sync::Arc;
use std::time::Duration;

use imaged::actors::cri_gateway::{CriGatewayActor, CriSettings};
use imaged::actors::pull_queue::PullQueueActor;
use imaged::api::server::ApiSocket;
use imaged::config::Config;
use imaged::connect::ConnectedRuntime;
use imaged::cri::proto as pb;
use imaged::cri::proto::image_service_client::ImageServiceClient;
use imaged::cri::server::{FrontFuture, ImageFront, ImageServiceServer, PullCall};
use imaged::cri::wire::BytesCodec;
use imaged::cri::{CriEndpoint, CriError, CriErrorKind, Rpc};
use imaged::cri_front::CriFront;
use imaged::embedded::{EmbeddedRuntime, RemoteImage};
use imaged::node::Node;
use prost::bytes::Bytes;
use tokio::time::Instant;
use tonic::transport::Channel;

const STATUS_PAIRS: usize = 2_000;
const LIST_IMAGES: usize = 5_000;
const LIST_PAIRS: usize = 30;
const BURST: usize = 100;
const QUEUED_PULLS: usize = 200;
const FSINFO_CALLS: usize = 200;
const FSINFO_ROUNDS: usize = 5;

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn p99(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[(v.len() * 99 / 100).min(v.len() - 1)]
}

fn ratio(a: Duration, b: Duration) -> f64 {
    a.as_secs_f64() / b.as_secs_f64()
}

fn spec(image: &str) -> Option<pb::ImageSpec> {
    Some(pb::ImageSpec { image: image.into(), ..Default::default() })
}

/// One call's time.
async fn timed<F: std::future::Future>(f: F) -> (Duration, F::Output) {
    let t = Instant::now();
    let out = f.await;
    (t.elapsed(), out)
}

/// Medians of `pairs` rounds of interleaved calls, one per side in
/// `sides` (rotating which goes first, so none always meets a warm server).
async fn medians<F, Fut>(pairs: usize, sides: &[&ImageServiceClient<Channel>], call: F) -> Vec<Duration>
where
    F: Fn(ImageServiceClient<Channel>) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut times = vec![Vec::new(); sides.len()];
    for i in 0..pairs {
        for k in 0..sides.len() {
            let side = (i + k) % sides.len();
            times[side].push(timed(call(sides[side].clone())).await.0);
        }
    }
    times.into_iter().map(median).collect()
}

/// Rounds each ratio is measured in.
const ROUNDS: usize = 7;

/// [`ROUNDS`] rounds of [`medians`]: prints the through ÷ direct ratio's
/// spread over the rounds (`{name}_ratio_min_median_max`) and returns the
/// medians of the round whose ratio is the median one (so one noisy stretch
/// of the machine moves one round, not the figure).
async fn rounds<F, Fut>(name: &str, pairs: usize, sides: &[&ImageServiceClient<Channel>], call: F) -> Vec<Duration>
where
    F: Fn(ImageServiceClient<Channel>) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut all = Vec::new();
    for _ in 0..ROUNDS {
        let m = medians(pairs, sides, &call).await;
        all.push((ratio(m[0], m[2]), m));
    }
    all.sort_by(|a, b| a.0.total_cmp(&b.0));
    let (lo, hi) = (all[0].0, all[all.len() - 1].0);
    let (mid, m) = all.swap_remove(all.len() / 2);
    println!("cri_server_{name}_ratio_min_median_max: {lo:.3} / {mid:.3} / {hi:.3}");
    m
}

/// A CRI front with nothing of imaged in it: a tonic server that forwards
/// each call's bytes with a tonic client. What one more gRPC hop (and its
/// thread wake-ups) costs before imaged does anything.
struct ProxyFloor {
    runtime: Channel,
}

impl ImageFront for ProxyFloor {
    fn forward(&self, rpc: Rpc, body: Bytes, _: Option<Duration>) -> FrontFuture<Bytes> {
        let mut grpc = tonic::client::Grpc::new(self.runtime.clone());
        Box::pin(async move {
            grpc.ready().await.map_err(|e| CriError::new(CriErrorKind::RuntimeUnavailable, e.to_string()))?;
            let path = format!("/runtime.v1.ImageService/{}", rpc.name()).parse().expect("path");
            let answer = grpc.unary(tonic::Request::new(body), path, BytesCodec).await;
            answer.map(tonic::Response::into_inner).map_err(|s| CriError::from_status(s.code().into(), s.message()))
        })
    }

    fn pull(&self, _: PullCall) -> FrontFuture<Bytes> {
        Box::pin(async { Err(CriError::new(CriErrorKind::Other, "the floor does not pull")) })
    }

    fn pins(&self, _: &str, _: &[String], _: &[String]) -> bool {
        false
    }

    fn may_pin(&self, _: &[u8]) -> bool {
        false
    }
}

/// Serves a [`ProxyFloor`] to `endpoint` on `path`, on a thread of its own;
/// bound when this returns (a client may connect at once).
fn start_floor(endpoint: CriEndpoint, path: std::path::PathBuf) {
    let listener = std::os::unix::net::UnixListener::bind(&path).expect("bind the floor");
    listener.set_nonblocking(true).expect("nonblocking");
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("floor runtime");
        rt.block_on(async move {
            let floor = ProxyFloor { runtime: endpoint.channel(Duration::from_secs(5)).expect("channel") };
            let incoming = tokio_stream::wrappers::UnixListenerStream::new(
                tokio::net::UnixListener::from_std(listener).expect("the floor's listener"),
            );
            tonic::transport::Server::builder()
                .add_service(ImageServiceServer::new(Arc::new(floor)))
                .serve_with_incoming(incoming)
                .await
                .expect("floor serves");
        });
    });
}

/// Prints one call's medians and returns through ÷ direct.
fn report(name: &str, m: &[Duration]) -> f64 {
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    println!("cri_server_{name}_through_us: {:.1}", us(m[0]));
    println!("cri_server_{name}_floor_us: {:.1}", us(m[1]));
    println!("cri_server_{name}_direct_us: {:.1}", us(m[2]));
    println!("cri_server_{name}_floor_ratio: {:.3}", ratio(m[1], m[2]));
    println!("cri_server_{name}_vs_floor: {:.3}", ratio(m[0], m[1]));
    if let Some(&uncached) = m.get(3) {
        println!("cri_server_{name}_uncached_us: {:.1}", us(uncached));
        println!("cri_server_{name}_uncached_ratio: {:.3}", ratio(uncached, m[2]));
    }
    ratio(m[0], m[2])
}

/// imaged (node, front) on an actix System of its own thread, as the
/// daemon is a process of its own; the clients (the kubelet's part) run on
/// the caller's thread. Returns the pull queue once the front serves.
/// `extra`: configuration added to the bench's (TOML).
fn start_imaged(
    endpoint: CriEndpoint,
    front_path: std::path::PathBuf,
    extra: &'static str,
) -> actix::Addr<PullQueueActor> {
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        actix::System::new().block_on(async move {
            let (gateway, version) =
                CriGatewayActor::connect(&endpoint, &CriSettings::default()).await.expect("gateway");
            let connected = ConnectedRuntime { gateway, version, endpoint, embedded: None };
            // No registry throttle: the bench queues 200 pulls at once.
            let toml =
                format!("[gc]\ngc_period = \"1h\"\ndetect_period = \"1h\"\n[pull]\nregistry_pull_qps = 0.0\n{extra}");
            let cfg = Config::from_toml(&toml).expect("config");
            let node = Arc::new(Node::start_on(cfg, connected).await.expect("node"));
            let socket = ApiSocket::bind_at("CRI socket", &front_path, None).await.expect("bind");
            let front = CriFront::over(&node, &node.config().cri_server).await.expect("front");
            ready_tx.send(node.queue().clone()).expect("ready");
            imaged::cri_front::serve(socket, front, std::future::pending()).await.expect("serve");
        });
    });
    ready_rx.recv().expect("imaged started")
}

fn client(endpoint: &CriEndpoint) -> ImageServiceClient<Channel> {
    ImageServiceClient::new(endpoint.channel(Duration::from_secs(5)).unwrap()).max_decoding_message_size(16 << 20)
}

/// The status comparison again with containerd as the runtime (started as
/// the real-containerd tests start it, on loopback), when it is installed:
/// what an operator's node sees. One small image pushed to the loopback
/// registry and pulled first.
fn containerd_status() {
    let Some((env, _started)) = support::containerd_env::environment("cri_server bench") else {
        println!("cri_server_containerd: skipped (containerd, docker-registry and htpasswd not installed)");
        return;
    };
    let dir = tempfile::Builder::new().prefix("imcb").tempdir_in("/tmp").expect("tempdir");
    let endpoint = CriEndpoint::Unix(env.socket.clone());
    let clients = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("client runtime");
    let image = clients.block_on(async {
        let registry = support::oci::Registry::open(&env.registry_open);
        let pushed = registry.push_image("bench/status", "v1", &[("hello.txt", b"hello")]).await.expect("push");
        let req = pb::PullImageRequest { image: spec(&pushed.reference), auth: None, sandbox_config: None };
        client(&endpoint).pull_image(req).await.expect("containerd pulls");
        pushed.reference
    });
    let front_path = dir.path().join("front.sock");
    start_imaged(endpoint.clone(), front_path.clone(), "");
    let floor_path = dir.path().join("floor.sock");
    start_floor(endpoint.clone(), floor_path.clone());
    clients.block_on(async move {
        let (front, floor, direct) =
            (client(&CriEndpoint::Unix(front_path)), client(&CriEndpoint::Unix(floor_path)), client(&endpoint));
        let sides = [&front, &floor, &direct];
        let status = |mut c: ImageServiceClient<Channel>| {
            let image = image.clone();
            async move {
                let r = c.image_status(pb::ImageStatusRequest { image: spec(&image), verbose: false });
                assert!(r.await.expect("status").into_inner().image.is_some());
            }
        };
        medians(200, &sides, status).await; // warm-up
        let m = rounds("containerd_status", STATUS_PAIRS, &sides, status).await;
        println!("cri_server_containerd_status_ratio: {:.3}", report("containerd_status", &m));
    });
}

/// The front's read cache off (`cri_server.read_cache_ttl = "0s"`).
const UNCACHED: &str = "[cri_server]\nread_cache_ttl = \"0s\"\n";

fn main() {
    let dir = tempfile::tempdir().expect("tempdir");
    let runtime = EmbeddedRuntime::start_in(dir.path()).expect("embedded runtime");
    runtime.preload(RemoteImage::new("docker.io/library/busybox:1.36", 4_000_000)).expect("preload");
    for i in 0..LIST_IMAGES {
        runtime.preload(RemoteImage::new(format!("registry.example.com/bench/img{i}:1"), 1_000_000)).expect("preload");
    }
    runtime
        .add_remote(RemoteImage::new("docker.io/library/burst:1", 1_000_000).latency(Duration::from_millis(200)))
        .expect("remote");
    for i in 0..QUEUED_PULLS {
        runtime
            .add_remote(
                RemoteImage::new(format!("registry.example.com/queued/img{i}:1"), 1_000)
                    .latency(Duration::from_millis(20)),
            )
            .expect("remote");
    }
    let endpoint = runtime.endpoint();
    let front_path = dir.path().join("front.sock");

    let queue = start_imaged(endpoint.clone(), front_path.clone(), "");
    // The same front with its read cache off: every call forwarded.
    let uncached_path = dir.path().join("uncached.sock");
    start_imaged(endpoint.clone(), uncached_path.clone(), UNCACHED);
    let floor_path = dir.path().join("floor.sock");
    start_floor(endpoint.clone(), floor_path.clone());
    let clients = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("client runtime");

    clients.block_on(async move {
        let front = ImageServiceClient::new(CriEndpoint::Unix(front_path).channel(Duration::from_secs(5)).unwrap())
            .max_decoding_message_size(16 << 20);
        let direct = ImageServiceClient::new(endpoint.channel(Duration::from_secs(5)).unwrap())
            .max_decoding_message_size(16 << 20);
        let floor = ImageServiceClient::new(CriEndpoint::Unix(floor_path).channel(Duration::from_secs(5)).unwrap())
            .max_decoding_message_size(16 << 20);
        let uncached =
            ImageServiceClient::new(CriEndpoint::Unix(uncached_path).channel(Duration::from_secs(5)).unwrap())
                .max_decoding_message_size(16 << 20);
        let sides = [&front, &floor, &direct, &uncached];

        let status = |mut c: ImageServiceClient<Channel>| async move {
            let r = c
                .image_status(pb::ImageStatusRequest { image: spec("docker.io/library/busybox:1.36"), verbose: false });
            assert!(r.await.expect("status").into_inner().image.is_some());
        };
        medians(200, &sides, status).await; // warm-up
        println!("cri_server_status_pairs: {STATUS_PAIRS}");
        let m = rounds("status", STATUS_PAIRS, &sides, status).await;
        println!("cri_server_status_ratio: {:.3}", report("status", &m));

        let list = |mut c: ImageServiceClient<Channel>| async move {
            let r = c.list_images(pb::ListImagesRequest { filter: None });
            assert!(r.await.expect("list").into_inner().images.len() > LIST_IMAGES);
        };
        medians(4, &sides, list).await; // warm-up
        println!("cri_server_list_images: {LIST_IMAGES}");
        let m = rounds("list", LIST_PAIRS, &sides, list).await;
        println!("cri_server_list_ratio: {:.3}", report("list", &m));

        let before = runtime.stats().calls(Rpc::PullImage);
        let burst: Vec<_> = (0..BURST)
            .map(|_| {
                let mut c = front.clone();
                tokio::spawn(async move {
                    c.pull_image(pb::PullImageRequest {
                        image: spec("docker.io/library/burst:1"),
                        auth: None,
                        sandbox_config: None,
                    })
                    .await
                    .expect("pulled")
                })
            })
            .collect();
        for b in burst {
            b.await.expect("task");
        }
        println!("cri_server_burst_calls: {BURST}");
        println!("cri_server_burst_runtime_pulls: {}", runtime.stats().calls(Rpc::PullImage) - before);

        let fsinfo = |c: &ImageServiceClient<Channel>| {
            let c = c.clone();
            async move {
                let mut times = Vec::new();
                for _ in 0..FSINFO_CALLS {
                    let mut c = c.clone();
                    times.push(
                        timed(async move { c.image_fs_info(pb::ImageFsInfoRequest {}).await.expect("fs info") })
                            .await
                            .0,
                    );
                }
                p99(times)
            }
        };
        // Rounds of: p99 idle, then p99 while QUEUED_PULLS pulls wait (the
        // same images each round: a PullImage through the front always
        // reaches the registry).
        let mut fsinfo_rounds = Vec::new();
        for _ in 0..FSINFO_ROUNDS {
            let idle = fsinfo(&front).await;
            let pulls: Vec<_> = (0..QUEUED_PULLS)
                .map(|i| {
                    let mut c = front.clone();
                    tokio::spawn(async move {
                        let image = format!("registry.example.com/queued/img{i}:1");
                        c.pull_image(pb::PullImageRequest { image: spec(&image), auth: None, sandbox_config: None })
                            .await
                    })
                })
                .collect();
            tokio::time::sleep(Duration::from_millis(50)).await;
            let busy = fsinfo(&front).await;
            let queued = queue.send(imaged::actors::pull_queue::GetQueueStatus).await.expect("status");
            for p in pulls {
                p.await.expect("task").expect("pulled");
            }
            fsinfo_rounds.push((ratio(busy, idle), idle, busy, queued.queued + queued.parked + queued.running));
        }
        fsinfo_rounds.sort_by(|a, b| a.0.total_cmp(&b.0));
        let (lo, hi) = (fsinfo_rounds[0].0, fsinfo_rounds[fsinfo_rounds.len() - 1].0);
        let (mid, idle, busy, waiting) = fsinfo_rounds[fsinfo_rounds.len() / 2];
        println!("cri_server_fsinfo_idle_p99_us: {:.1}", idle.as_secs_f64() * 1e6);
        println!("cri_server_fsinfo_busy_p99_us: {:.1}", busy.as_secs_f64() * 1e6);
        println!("cri_server_fsinfo_busy_waiting_pulls: {waiting}");
        println!("cri_server_fsinfo_busy_ratio_min_median_max: {lo:.3} / {mid:.3} / {hi:.3}");
        println!("cri_server_fsinfo_busy_ratio: {mid:.3}");
    });
    containerd_status();
}
