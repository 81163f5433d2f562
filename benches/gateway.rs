//! Gateway overhead: N concurrent ImageStatus calls through the CRI gateway
//! actor ÷ the same calls on a bare tonic client, against one embedded
//! runtime, interleaved round by round in one run. Prints `name: value`
//! lines; the last is `gateway_overhead_ratio`. Target: ≤ 1.10.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::pedantic)] // test code: a failed unwrap is a failed test

use std::time::Duration;

use futures_util::future::join_all;
use imaged::actors::cri_gateway::CriSettings;
use imaged::actors::cri_gateway::{CriGatewayActor, GetImageStatus};
use imaged::cri::proto::image_service_client::ImageServiceClient;
use imaged::cri::proto::{ImageSpec as PbSpec, ImageStatusRequest};
use imaged::domain::ImageSpec;
use imaged::embedded::{EmbeddedRuntime, RemoteImage};
use tokio::time::Instant;

const CONCURRENT: usize = 100;
const ROUNDS: usize = 60;
const WARMUP: usize = 5;

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    let dir = tempfile::tempdir().expect("tempdir");
    let runtime = EmbeddedRuntime::start_in(dir.path()).expect("embedded runtime");
    runtime.preload(RemoteImage::new("busybox:1.36", 1_000)).expect("preload");
    let endpoint = runtime.endpoint();

    actix::System::new().block_on(async move {
        let (gateway, _) = CriGatewayActor::connect(&endpoint, &CriSettings::default()).await.expect("gateway");
        let channel = endpoint.channel(Duration::from_secs(5)).expect("channel");
        let bare = ImageServiceClient::new(channel);

        let via_gateway = || {
            let g = gateway.clone();
            async move {
                let t = Instant::now();
                let calls = (0..CONCURRENT)
                    .map(|_| g.send(GetImageStatus { image: ImageSpec::new("busybox:1.36"), verbose: false }));
                for r in join_all(calls).await {
                    assert!(r.expect("mailbox").expect("status").image.is_some());
                }
                t.elapsed()
            }
        };
        let via_bare = || {
            let c = bare.clone();
            async move {
                let t = Instant::now();
                let calls = (0..CONCURRENT).map(|_| {
                    let mut c = c.clone();
                    async move {
                        let req = ImageStatusRequest {
                            image: Some(PbSpec { image: "busybox:1.36".into(), ..Default::default() }),
                            verbose: false,
                        };
                        c.image_status(req).await
                    }
                });
                for r in join_all(calls).await {
                    assert!(r.expect("status").into_inner().image.is_some());
                }
                t.elapsed()
            }
        };

        for _ in 0..WARMUP {
            via_gateway().await;
            via_bare().await;
        }
        let (mut g_times, mut b_times) = (Vec::new(), Vec::new());
        for round in 0..ROUNDS {
            // Alternate which goes first so neither always meets a warm or cold server.
            if round % 2 == 0 {
                g_times.push(via_gateway().await);
                b_times.push(via_bare().await);
            } else {
                b_times.push(via_bare().await);
                g_times.push(via_gateway().await);
            }
        }
        let (g, b) = (median(g_times), median(b_times));
        println!("concurrent_calls: {CONCURRENT}");
        println!("rounds: {ROUNDS}");
        println!("gateway_round_p50_us: {}", g.as_micros());
        println!("bare_tonic_round_p50_us: {}", b.as_micros());
        println!("gateway_per_call_us: {:.1}", g.as_secs_f64() * 1e6 / CONCURRENT as f64);
        println!("bare_tonic_per_call_us: {:.1}", b.as_secs_f64() * 1e6 / CONCURRENT as f64);
        println!("gateway_overhead_ratio: {:.3}", g.as_secs_f64() / b.as_secs_f64());
    });
    drop(runtime);
}
