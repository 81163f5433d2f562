//! Gateway overhead against one embedded runtime, interleaved in one run.
//! Prints `name: value` lines.
//!
//! - `gateway_overhead_ratio`: 100 concurrent ImageStatus calls through the
//!   CRI gateway actor ÷ the same calls on a bare tonic client, round by
//!   round. Repeated (about 5 s in all); printed as min / median / max of
//!   the repeats' ratios and reported as their median. Target ≤ 1.05.
//! - The mailbox, call by call (one at a time, sides interleaved):
//!   `gateway_sequential_ratio` (through the actor ÷ bare),
//!   `reader_sequential_ratio` (through the gateway's `CriReader`, no
//!   mailbox ÷ bare), and actix's own floor: `actix_echo_round_trip_us`, a
//!   message to an actor that answers at once (the same `send` and reply
//!   channel, no work), and `actix_floor_ratio` = (bare + echo) ÷ bare, what
//!   any actor in the path costs a sequential call at least;
//!   `actix_spawned_echo_round_trip_us`, the same message answered by a
//!   `ResponseFuture` (actix runs it on a task of its own, as the gateway's
//!   replies), and `gateway_sequential_floor_ratio` = (reader call + that
//!   echo) ÷ bare: what the gateway's mailbox can cost at best.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::pedantic)] // test code: a failed unwrap is a failed test

use std::time::Duration;

use actix::prelude::*;
use futures_util::future::join_all;
use imaged::actors::cri_gateway::CriSettings;
use imaged::actors::cri_gateway::{CriGatewayActor, GetImageStatus, GetReader};
use imaged::cri::proto::image_service_client::ImageServiceClient;
use imaged::cri::proto::{ImageSpec as PbSpec, ImageStatusRequest};
use imaged::domain::ImageSpec;
use imaged::embedded::{EmbeddedRuntime, RemoteImage};
use tokio::time::Instant;

const CONCURRENT: usize = 100;
const ROUNDS: usize = 60;
const REPEATS: usize = 9;
const WARMUP: usize = 5;
const SEQUENTIAL_CALLS: usize = 3000;
const SEQUENTIAL_REPEATS: usize = 5;

fn median<T: Copy + PartialOrd>(mut v: Vec<T>) -> T {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// Prints `name` as the median of `ratios`, with min / median / max.
fn report(name: &str, mut ratios: Vec<f64>) -> f64 {
    ratios.sort_by(f64::total_cmp);
    let (lo, mid, hi) = (ratios[0], ratios[ratios.len() / 2], ratios[ratios.len() - 1]);
    println!("{name}_min_median_max: {lo:.3} / {mid:.3} / {hi:.3}");
    println!("{name}: {mid:.3}");
    mid
}

/// An actor that answers at once: actix's own round trip.
struct Echo;

impl Actor for Echo {
    type Context = Context<Self>;
}

#[derive(Message)]
#[rtype(result = "u32")]
struct Ping(u32);

impl Handler<Ping> for Echo {
    type Result = u32;
    fn handle(&mut self, Ping(n): Ping, _: &mut Self::Context) -> u32 {
        n
    }
}

/// Answered as the gateway answers: by a `ResponseFuture`, which actix
/// runs on a task of its own so the actor never waits on one call.
#[derive(Message)]
#[rtype(result = "u32")]
struct PingSpawned(u32);

impl Handler<PingSpawned> for Echo {
    type Result = ResponseFuture<u32>;
    fn handle(&mut self, PingSpawned(n): PingSpawned, _: &mut Self::Context) -> Self::Result {
        Box::pin(async move { n })
    }
}

fn status_request() -> ImageStatusRequest {
    ImageStatusRequest { image: Some(PbSpec { image: "busybox:1.36".into(), ..Default::default() }), verbose: false }
}

fn main() {
    let dir = tempfile::tempdir().expect("tempdir");
    let runtime = EmbeddedRuntime::start_in(dir.path()).expect("embedded runtime");
    runtime.preload(RemoteImage::new("busybox:1.36", 1_000)).expect("preload");
    let endpoint = runtime.endpoint();

    actix::System::new().block_on(async move {
        let (gateway, _) = CriGatewayActor::connect(&endpoint, &CriSettings::default()).await.expect("gateway");
        let reader = gateway.send(GetReader).await.expect("reader");
        let channel = endpoint.channel(Duration::from_secs(5)).expect("channel");
        let bare = ImageServiceClient::new(channel);
        let echo = Echo.start();

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
                    async move { c.image_status(status_request()).await }
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
        let started = Instant::now();
        let (mut all_g, mut all_b, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..REPEATS {
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
            all_g.extend_from_slice(&g_times);
            all_b.extend_from_slice(&b_times);
            ratios.push(median(g_times).as_secs_f64() / median(b_times).as_secs_f64());
        }
        let (g, b) = (median(all_g), median(all_b));
        println!("concurrent_calls: {CONCURRENT}");
        println!("rounds: {ROUNDS} x {REPEATS} repeats, {:.1} s", started.elapsed().as_secs_f64());
        println!("gateway_round_p50_us: {}", g.as_micros());
        println!("bare_tonic_round_p50_us: {}", b.as_micros());
        println!("gateway_per_call_us: {:.1}", g.as_secs_f64() * 1e6 / CONCURRENT as f64);
        println!("bare_tonic_per_call_us: {:.1}", b.as_secs_f64() * 1e6 / CONCURRENT as f64);
        report("gateway_overhead_ratio", ratios);

        // One call at a time: what the mailbox costs a lone call, and the
        // floor any actix actor sets.
        #[derive(Clone, Copy)]
        enum Side {
            Gateway,
            Reader,
            Echo,
            EchoSpawned,
            Bare,
        }
        let one = |side: Side| {
            let (g, r, e, mut c) = (gateway.clone(), reader.clone(), echo.clone(), bare.clone());
            async move {
                let t = Instant::now();
                match side {
                    Side::Gateway => {
                        let s = g.send(GetImageStatus { image: ImageSpec::new("busybox:1.36"), verbose: false });
                        assert!(s.await.expect("mailbox").expect("status").image.is_some());
                    }
                    Side::Reader => {
                        let s = r.image_status(ImageSpec::new("busybox:1.36"), false).await;
                        assert!(s.expect("status").image.is_some());
                    }
                    Side::Echo => assert_eq!(e.send(Ping(7)).await.expect("echo"), 7),
                    Side::EchoSpawned => assert_eq!(e.send(PingSpawned(7)).await.expect("echo"), 7),
                    Side::Bare => {
                        let s = c.image_status(status_request()).await;
                        assert!(s.expect("status").into_inner().image.is_some());
                    }
                }
                t.elapsed()
            }
        };
        let sides = [Side::Gateway, Side::Reader, Side::Echo, Side::EchoSpawned, Side::Bare];
        for _ in 0..300 {
            for s in sides {
                one(s).await;
            }
        }
        let (mut gw, mut rd, mut floor, mut echo_us) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let (mut spawned_floor, mut spawned_us) = (Vec::new(), Vec::new());
        for _ in 0..SEQUENTIAL_REPEATS {
            let mut t: [Vec<Duration>; 5] = Default::default();
            for call in 0..SEQUENTIAL_CALLS {
                for k in 0..sides.len() {
                    let i = (call + k) % sides.len();
                    t[i].push(one(sides[i]).await);
                }
            }
            let [g, r, e, es, b] = t.map(median);
            let b = b.as_secs_f64();
            gw.push(g.as_secs_f64() / b);
            rd.push(r.as_secs_f64() / b);
            floor.push((b + e.as_secs_f64()) / b);
            echo_us.push(e.as_secs_f64() * 1e6);
            // The gateway's own floor: the reader's call plus a message
            // answered by a spawned future (mailbox, task, reply).
            spawned_floor.push((r.as_secs_f64() + es.as_secs_f64()) / b);
            spawned_us.push(es.as_secs_f64() * 1e6);
        }
        report("gateway_sequential_ratio", gw);
        report("reader_sequential_ratio", rd);
        println!("actix_echo_round_trip_us: {:.1}", median(echo_us));
        report("actix_floor_ratio", floor);
        println!("actix_spawned_echo_round_trip_us: {:.1}", median(spawned_us));
        report("gateway_sequential_floor_ratio", spawned_floor);
    });
    drop(runtime);
}
