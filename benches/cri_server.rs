//! The CRI front's cost, against one embedded runtime, in one run: calls
//! through imaged's CRI socket ÷ the same calls straight to the runtime,
//! interleaved call by call. Prints `name: value` lines:
//!
//! - `cri_server_status_ratio`: ImageStatus, median through ÷ median direct (goal ≤ 1.15);
//! - `cri_server_list_ratio`: ListImages of 5,000 images, the same (goal ≤ 1.15);
//! - `cri_server_burst_runtime_pulls`: runtime PullImage calls for 100
//!   concurrent identical PullImage calls through the front (goal = 1);
//! - `cri_server_fsinfo_busy_ratio`: ImageFsInfo p99 while 200 pulls are
//!   queued ÷ its p99 idle (goal ≤ 2).
#![allow(clippy::unwrap_used, clippy::expect_used)] // bench code: a failed unwrap is a failed run

use std::sync::Arc;
use std::time::Duration;

use imaged::actors::cri_gateway::{CriGatewayActor, CriSettings};
use imaged::api::server::ApiSocket;
use imaged::config::Config;
use imaged::connect::ConnectedRuntime;
use imaged::cri::proto as pb;
use imaged::cri::proto::image_service_client::ImageServiceClient;
use imaged::cri::{CriEndpoint, Rpc};
use imaged::cri_front::CriFront;
use imaged::embedded::{EmbeddedRuntime, RemoteImage};
use imaged::node::Node;
use tokio::time::Instant;
use tonic::transport::Channel;

const STATUS_PAIRS: usize = 2_000;
const LIST_IMAGES: usize = 5_000;
const LIST_PAIRS: usize = 30;
const BURST: usize = 100;
const QUEUED_PULLS: usize = 200;
const FSINFO_CALLS: usize = 200;

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

/// Medians of `pairs` interleaved calls through `front` and `direct`.
async fn interleaved<F, Fut>(
    pairs: usize,
    front: &ImageServiceClient<Channel>,
    direct: &ImageServiceClient<Channel>,
    call: F,
) -> f64
where
    F: Fn(ImageServiceClient<Channel>) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let (mut f, mut d) = (Vec::new(), Vec::new());
    for i in 0..pairs {
        // Alternate which goes first so neither always meets a warm server.
        if i % 2 == 0 {
            f.push(timed(call(front.clone())).await.0);
            d.push(timed(call(direct.clone())).await.0);
        } else {
            d.push(timed(call(direct.clone())).await.0);
            f.push(timed(call(front.clone())).await.0);
        }
    }
    ratio(median(f), median(d))
}

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

    actix::System::new().block_on(async move {
        let (gateway, version) = CriGatewayActor::connect(&endpoint, &CriSettings::default()).await.expect("gateway");
        let connected = ConnectedRuntime { gateway, version, endpoint: endpoint.clone(), embedded: None };
        let cfg = Config::from_toml("[gc]\ngc_period = \"1h\"\ndetect_period = \"1h\"").expect("config");
        let node = Arc::new(Node::start_on(cfg, connected).await.expect("node"));
        let socket = ApiSocket::bind_at("CRI socket", &front_path, None).await.expect("bind");
        let front = CriFront::over(&node, &node.config().cri_server).await.expect("front");
        actix::spawn(imaged::cri_front::serve(socket, front, std::future::pending()));
        let front = ImageServiceClient::new(CriEndpoint::Unix(front_path).channel(Duration::from_secs(5)).unwrap())
            .max_decoding_message_size(16 << 20);
        let direct = ImageServiceClient::new(endpoint.channel(Duration::from_secs(5)).unwrap())
            .max_decoding_message_size(16 << 20);

        let status = |mut c: ImageServiceClient<Channel>| async move {
            let r = c
                .image_status(pb::ImageStatusRequest { image: spec("docker.io/library/busybox:1.36"), verbose: false });
            assert!(r.await.expect("status").into_inner().image.is_some());
        };
        interleaved(200, &front, &direct, status).await; // warm-up
        println!("cri_server_status_pairs: {STATUS_PAIRS}");
        println!("cri_server_status_ratio: {:.3}", interleaved(STATUS_PAIRS, &front, &direct, status).await);

        let list = |mut c: ImageServiceClient<Channel>| async move {
            let r = c.list_images(pb::ListImagesRequest { filter: None });
            assert!(r.await.expect("list").into_inner().images.len() > LIST_IMAGES);
        };
        interleaved(4, &front, &direct, list).await; // warm-up
        println!("cri_server_list_images: {LIST_IMAGES}");
        println!("cri_server_list_ratio: {:.3}", interleaved(LIST_PAIRS, &front, &direct, list).await);

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
        let idle = fsinfo(&front).await;
        let pulls: Vec<_> = (0..QUEUED_PULLS)
            .map(|i| {
                let mut c = front.clone();
                tokio::spawn(async move {
                    let image = format!("registry.example.com/queued/img{i}:1");
                    c.pull_image(pb::PullImageRequest { image: spec(&image), auth: None, sandbox_config: None }).await
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(50)).await;
        let busy = fsinfo(&front).await;
        let queued = node.queue().send(imaged::actors::pull_queue::GetQueueStatus).await.expect("status");
        for p in pulls {
            p.await.expect("task").expect("pulled");
        }
        println!("cri_server_fsinfo_idle_p99_us: {:.1}", idle.as_secs_f64() * 1e6);
        println!("cri_server_fsinfo_busy_p99_us: {:.1}", busy.as_secs_f64() * 1e6);
        println!("cri_server_fsinfo_busy_waiting_pulls: {}", queued.queued + queued.parked + queued.running);
        println!("cri_server_fsinfo_busy_ratio: {:.3}", ratio(busy, idle));
    });
}
