//! `EnsureImageExists` costs against the embedded runtime, in one run.
//! Prints `name: value` lines. The three headline figures:
//!
//! - `hot_path_ratio`: p50 of `ImageManager::ensure_image_exists` for a
//!   present image (`IfNotPresent`) ÷ p50 of one bare tonic `ImageStatus` on
//!   the same socket. Sequential calls, interleaved call by call (the sides
//!   rotate every call, so machine drift hits all of them alike). The layers in
//!   between are measured as extra sides, to tell where any overhead is;
//!   `hot_bare_status_deadline_ratio` is the bare call with the deadline
//!   sent as `grpc-timeout`, as the kubelet sends it, to show what the
//!   header costs (imaged keeps a read's deadline itself, unsent).
//!   Five rounds; each ratio printed as min / median / max of the rounds'
//!   ratios and reported as their median. Target ≤ 1.10. The daemon's
//!   tracing subscriber and default filter are installed, as operators run it.
//! - `parallel_makespan_ratio`: wall time of 200 concurrent ensures of
//!   distinct absent images (8 pull tokens, 20 ms pulls) ÷ the ideal
//!   25 × 20 ms; median of several runs, each on a fresh runtime, interleaved
//!   with two references: the queue fed directly, and 8 bare tonic workers
//!   (the floor the runtime itself allows). Target ≤ 1.05.
//! - Also, for the ways presence checks can go out — the growing window
//!   (`pull.presence_check_window`, 8 by default), a fixed limit of 8
//!   (`pull.presence_check_concurrency` alone) and all at once (neither: the
//!   kubelet's timing) — their gain and their price: the makespan with each
//!   (`parallel_makespan_presence_limit_ratio`,
//!   `parallel_makespan_all_at_once_ratio`) and a burst of 200 ensures of
//!   present images with the window or the limit ÷ all at once
//!   (`present_burst_window_cost_ratio`, `present_burst_limit_cost_ratio`).
//!   No targets.
//! - `single_flight_cri_pulls`: CRI `PullImage` calls for 100 concurrent
//!   ensures of one absent image. Target 1. The same with single-flight off
//!   gives `kubelet_equivalent_cri_pulls` (what the kubelet does).
//!
//! `ENSURE_BENCH=trace cargo bench --bench ensure` runs only three traced
//! makespan runs: when the first request is queued, the first and eighth
//! pulls start, how long a pull holds its token. `ENSURE_BENCH=makespan`
//! runs only the makespan section (about 40 s), `ENSURE_BENCH=burst` only
//! the present burst, `ENSURE_BENCH=hot` only the hot path; with
//! `HOT_ONLY=<side>` (e.g. `ensure`, `bare_status`) only that side, for
//! `perf stat` to count what one side costs. Beside each time ratio the
//! hot path prints `_cpu_ratio`s: the process's CPU time per call (both
//! threads, imaged's and the runtime's), side ÷ bare, which the waits for a
//! thread to wake do not move; `hot_path_cpu_ratio` is the ensure's.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::pedantic)] // test code: a failed unwrap is a failed test

use std::cell::Cell;
use std::collections::HashMap;
use std::time::{Duration, Instant};

use actix::prelude::*;
use futures_util::future::join_all;
use imaged::actors::backoff_registry::BackoffSettings;
use imaged::actors::cri_gateway::CriSettings;
use imaged::actors::cri_gateway::{CriGatewayActor, GetImageStatus, GetReader};
use imaged::actors::pull_queue::{
    Concurrency, EnqueuePull, PullPhase, PullPhaseChanged, PullQueueSettings, PullRequest, SubscribePhases,
};
use imaged::cri::proto::image_service_client::ImageServiceClient;
use imaged::cri::proto::{ImageSpec as PbSpec, ImageStatusRequest, PullImageRequest};
use imaged::cri::{CriClient, Rpc};
use imaged::domain::ImageSpec;
use imaged::domain::pull_policy::PullPolicy;
use imaged::embedded::{EmbeddedRuntime, RemoteImage};
use imaged::ensure::{EnsureImageRequest, EnsureSettings};
use imaged::testing::{StartedManager, start_manager};

// Hot path.
const HOT_IMAGE: &str = "busybox:1.36";
const HOT_WARMUP: usize = 500;
// One call per side per round: per-call interleaving keeps the ratio stable
// (1.05–1.06 over runs) where blocks of 100 swung from 1.0 to 1.4.
const HOT_BLOCKS: usize = 5000;
const HOT_BLOCK_SIZE: usize = 1;
const HOT_ROUNDS: usize = 5;

// Parallel makespan.
const MAKESPAN_IMAGES: usize = 200;
const MAKESPAN_TOKENS: usize = 8;
const MAKESPAN_LATENCY: Duration = Duration::from_millis(20);
// Single runs swing by ±10 ms on a 2-vCPU VM: 15 runs per driver keep the
// medians within a few ms of each other from one bench run to the next.
const MAKESPAN_RUNS: usize = 15;
const TIMER_SAMPLES: usize = 25;

// Single flight.
const SF_WAITERS: usize = 100;
const SF_LATENCY: Duration = Duration::from_millis(200);

fn pct(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn median_f64(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// A fresh embedded runtime (in its own temp dir), a gateway to it, and a
/// manager with `pull` as the queue's settings.
async fn stack(
    pull: &PullQueueSettings,
) -> (tempfile::TempDir, EmbeddedRuntime, Addr<CriGatewayActor>, StartedManager) {
    stack_with(pull, EnsureSettings::default()).await
}

/// [`stack`] with these ensure settings.
async fn stack_with(
    pull: &PullQueueSettings,
    ensure: EnsureSettings,
) -> (tempfile::TempDir, EmbeddedRuntime, Addr<CriGatewayActor>, StartedManager) {
    let dir = tempfile::tempdir().expect("tempdir");
    let runtime = EmbeddedRuntime::start_in(dir.path()).expect("embedded runtime");
    let (gateway, _) = CriGatewayActor::connect(&runtime.endpoint(), &CriSettings::default()).await.expect("gateway");
    let manager = start_manager(&gateway, pull, &BackoffSettings::default(), ensure).await.expect("manager starts");
    (dir, runtime, gateway, manager)
}

fn bare_client(runtime: &EmbeddedRuntime) -> ImageServiceClient<tonic::transport::Channel> {
    ImageServiceClient::new(runtime.endpoint().channel(Duration::from_secs(5)).expect("channel"))
}

// === Hot path ===

/// One side of the hot-path comparison: the two the ratio compares, and the
/// layers in between (each adds one thing to the one below it).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Side {
    /// `ImageManager::ensure_image_exists` with every presence check sent at
    /// once (no window): what the default window costs a lone check.
    EnsureAllAtOnce,
    /// `ImageManager::ensure_image_exists`: the whole path.
    Ensure,
    /// `GetImageStatus` through the gateway actor (no ensure logic).
    Gateway,
    /// The gateway's `CriReader::image_status` on the caller's task: what
    /// ensure's presence check runs (the gateway's client and channel).
    Reader,
    /// What the gateway runs, on the caller's task: `CriClient::image_status`
    /// with the configured deadline (kept by the client, not sent; no actor).
    Client,
    /// A bare tonic call awaited through one spawned task (`actix::spawn`,
    /// which is how actix runs a `ResponseFuture` reply): the cost of the hop.
    BareSpawned,
    /// A bare tonic call with the configured deadline sent as `grpc-timeout`,
    /// as the kubelet sends one on every CRI call: what the header costs
    /// (a timer on each side; imaged keeps a read's deadline itself).
    BareDeadline,
    /// A bare tonic call on the caller's task.
    Bare,
}

const SIDES: [Side; 8] = [
    Side::Ensure,
    Side::EnsureAllAtOnce,
    Side::Gateway,
    Side::Reader,
    Side::Client,
    Side::BareSpawned,
    Side::BareDeadline,
    Side::Bare,
];
const SIDE_NAMES: [&str; 8] = [
    "ensure",
    "ensure_all_at_once",
    "gateway_status",
    "reader_status",
    "cri_client_status",
    "bare_status_spawned",
    "bare_status_deadline",
    "bare_status",
];

const HOT_ONLY_CALLS: usize = 20_000;

fn bare_status_request() -> ImageStatusRequest {
    ImageStatusRequest { image: Some(PbSpec { image: HOT_IMAGE.into(), ..Default::default() }), verbose: false }
}

async fn hot_path() {
    let pull = PullQueueSettings { qps: 0.0, ..PullQueueSettings::default() };
    let (_dir, runtime, gateway, StartedManager { manager, .. }) = stack(&pull).await;
    runtime.preload(RemoteImage::new(HOT_IMAGE, 1_000)).expect("preload");
    let bare = bare_client(&runtime);
    let cri_cfg = CriSettings::default();
    let client = CriClient::new(&runtime.endpoint(), cri_cfg.connect_timeout).expect("client");
    let status_deadline = cri_cfg.deadlines.get(Rpc::ImageStatus);
    let req = EnsureImageRequest::new("bench-pod", HOT_IMAGE, PullPolicy::IfNotPresent);
    let all_at_once = start_manager(&gateway, &pull, &BackoffSettings::default(), presence_all_at_once())
        .await
        .expect("manager starts")
        .manager;

    let reader = gateway.send(GetReader).await.expect("reader");
    let one = |side: Side| {
        let (manager, all_at_once, gateway, reader, client, mut bare, req) =
            (&manager, &all_at_once, &gateway, &reader, &client, bare.clone(), &req);
        async move {
            let t = Instant::now();
            match side {
                Side::Ensure | Side::EnsureAllAtOnce => {
                    let m = if side == Side::Ensure { manager } else { all_at_once };
                    let ok = m.ensure_image_exists(req).await.expect("ensure");
                    assert!(!ok.image_ref.is_empty());
                }
                Side::Gateway => {
                    let s = gateway
                        .send(GetImageStatus { image: ImageSpec::new(HOT_IMAGE), verbose: false })
                        .await
                        .expect("mailbox")
                        .expect("status");
                    assert!(s.image.is_some());
                }
                Side::Reader => {
                    let s = reader.image_status(ImageSpec::new(HOT_IMAGE), false).await;
                    assert!(s.expect("status").image.is_some());
                }
                Side::Client => {
                    let s = client.image_status(ImageSpec::new(HOT_IMAGE), false, status_deadline).await;
                    assert!(s.expect("status").image.is_some());
                }
                Side::BareSpawned => {
                    let found = actix::spawn(async move {
                        bare.image_status(bare_status_request()).await.expect("status").into_inner().image.is_some()
                    })
                    .await
                    .expect("task");
                    assert!(found);
                }
                Side::BareDeadline => {
                    let mut r = tonic::Request::new(bare_status_request());
                    if let Some(d) = status_deadline {
                        r.set_timeout(d);
                    }
                    let r = bare.image_status(r).await.expect("status");
                    assert!(r.into_inner().image.is_some());
                }
                Side::Bare => {
                    let r = bare.image_status(bare_status_request()).await.expect("status");
                    assert!(r.into_inner().image.is_some());
                }
            }
            t.elapsed()
        }
    };

    for _ in 0..HOT_WARMUP {
        for s in SIDES {
            one(s).await;
        }
    }
    // `HOT_ONLY=<side>` (a name of SIDE_NAMES): only that side,
    // `HOT_ONLY_CALLS` calls (20,000), for `perf stat` or callgrind to count
    // what one side costs the process.
    if let Ok(only) = std::env::var("HOT_ONLY") {
        let i = SIDE_NAMES.iter().position(|n| *n == only).expect("HOT_ONLY names a side");
        let calls = std::env::var("HOT_ONLY_CALLS").ok().and_then(|n| n.parse().ok()).unwrap_or(HOT_ONLY_CALLS);
        let mut t = Vec::with_capacity(calls);
        for _ in 0..calls {
            t.push(one(SIDES[i]).await);
        }
        t.sort();
        println!("hot_only_{only}_calls: {calls}");
        println!("hot_only_{only}_p50_us: {:.1}", us(pct(&t, 0.5)));
        return;
    }
    let mut times: [Vec<Duration>; SIDES.len()] = Default::default();
    // Rounds, each giving its own ratios: min / median / max of them show
    // how far one run's figure can move.
    let mut rounds: Vec<[Duration; SIDES.len()]> = Vec::new();
    // The process's CPU time per side and round (both threads: the caller's
    // and the embedded runtime's): the work each side makes, without the
    // waits for a thread to wake that move the times from run to run.
    let mut cpu_rounds: Vec<[Duration; SIDES.len()]> = Vec::new();
    for round in 0..HOT_ROUNDS {
        let mut this: [Vec<Duration>; SIDES.len()] = Default::default();
        let mut cpu = [Duration::ZERO; SIDES.len()];
        for block in round * HOT_BLOCKS / HOT_ROUNDS..(round + 1) * HOT_BLOCKS / HOT_ROUNDS {
            // Rotate the order of the sides so none always follows the same one.
            for k in 0..SIDES.len() {
                let i = (block + k) % SIDES.len();
                let cpu_before = process_cpu();
                for _ in 0..HOT_BLOCK_SIZE {
                    this[i].push(one(SIDES[i]).await);
                }
                cpu[i] += process_cpu().saturating_sub(cpu_before);
            }
        }
        cpu_rounds.push(cpu);
        let mut p50s = [Duration::ZERO; SIDES.len()];
        for (i, t) in this.iter_mut().enumerate() {
            t.sort();
            p50s[i] = pct(t, 0.5);
            times[i].extend_from_slice(t);
        }
        rounds.push(p50s);
    }
    for t in &mut times {
        t.sort();
    }
    println!("hot_samples_per_side: {}", HOT_BLOCKS * HOT_BLOCK_SIZE);
    for (name, t) in SIDE_NAMES.iter().zip(&times) {
        println!("hot_{name}_p50_us: {:.1}", us(pct(t, 0.5)));
        println!("hot_{name}_p90_us: {:.1}", us(pct(t, 0.9)));
    }
    let bare = SIDES.len() - 1;
    let spread = |i: usize| {
        let mut r: Vec<f64> = rounds.iter().map(|p| p[i].as_secs_f64() / p[bare].as_secs_f64()).collect();
        r.sort_by(f64::total_cmp);
        (r[0], r[r.len() / 2], r[r.len() - 1])
    };
    println!("hot_rounds: {HOT_ROUNDS}");
    for (i, name) in SIDE_NAMES.iter().enumerate().take(bare) {
        let (lo, mid, hi) = spread(i);
        println!("hot_{name}_ratio_min_median_max: {lo:.3} / {mid:.3} / {hi:.3}");
        if i > 0 {
            println!("hot_{name}_ratio: {mid:.3}");
        }
    }
    // CPU per call, each side ÷ the bare call's, per round.
    let cpu_spread = |i: usize| {
        let mut r: Vec<f64> = cpu_rounds.iter().map(|c| c[i].as_secs_f64() / c[bare].as_secs_f64()).collect();
        r.sort_by(f64::total_cmp);
        (r[0], r[r.len() / 2], r[r.len() - 1])
    };
    for (i, name) in SIDE_NAMES.iter().enumerate().take(bare) {
        let (lo, mid, hi) = cpu_spread(i);
        println!("hot_{name}_cpu_ratio_min_median_max: {lo:.3} / {mid:.3} / {hi:.3}");
    }
    println!("hot_path_cpu_ratio: {:.3}", cpu_spread(0).1);
    // The median of the rounds' ratios.
    println!("hot_path_ratio: {:.3}", spread(0).1);
}

/// CPU time this process has used (every thread).
fn process_cpu() -> Duration {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_PROCESS_CPUTIME_ID).expect("process CPU clock");
    Duration::new(t.tv_sec() as u64, t.tv_nsec() as u32)
}

// === Parallel makespan ===

fn makespan_names() -> Vec<String> {
    (0..MAKESPAN_IMAGES).map(|i| format!("example.com/makespan/img{i}:1")).collect()
}

fn makespan_ideal() -> Duration {
    MAKESPAN_LATENCY * MAKESPAN_IMAGES.div_ceil(MAKESPAN_TOKENS) as u32
}

/// How the 200 pulls are driven.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Driver {
    /// 200 concurrent `ensure_image_exists` (the figure).
    Ensure,
    /// The same with a fixed presence-check limit of `PRESENCE_LIMIT`
    /// (`presence_check_concurrency`, no window).
    EnsureLimited,
    /// The same with every presence check sent at once, as the kubelet
    /// (no window, no limit).
    EnsureAllAtOnce,
    /// 200 `EnqueuePull` straight to the manager's queue (skip-if-present set,
    /// as ensure sets it): the queue without ensure's presence check and back-off.
    Queue,
    /// 8 workers each making bare tonic `PullImage` calls one after another:
    /// the floor this runtime allows (its timers, one RPC per pull).
    BareWorkers,
}

/// One makespan run on a fresh runtime; with `log`, the queue's phase
/// changes are recorded (that perturbs the run a little: not counted).
async fn makespan_once(driver: Driver, log: Option<&Addr<PhaseLog>>) -> Duration {
    let pull = PullQueueSettings {
        concurrency: Concurrency::Parallel(Some(MAKESPAN_TOKENS)),
        qps: 0.0,
        capacity: None,
        ..PullQueueSettings::default()
    };
    let ensure = match driver {
        Driver::EnsureLimited => presence_limited(),
        Driver::EnsureAllAtOnce => presence_all_at_once(),
        _ => EnsureSettings::default(),
    };
    let (_dir, runtime, _gateway, StartedManager { manager, queue, .. }) = stack_with(&pull, ensure).await;
    let names = makespan_names();
    for n in &names {
        runtime.add_remote(RemoteImage::new(n.clone(), 1_000).latency(MAKESPAN_LATENCY)).expect("add");
    }
    if let Some(log) = log {
        queue.send(SubscribePhases(log.clone().recipient())).await.expect("subscribe");
    }
    let bare = bare_client(&runtime);
    // Connect the bare channel before the clock starts (the gateway's is connected).
    let _ = bare.clone().image_status(ImageStatusRequest::default()).await;
    let t = Instant::now();
    if let Some(log) = log {
        log.send(Mark(t)).await.expect("mark");
    }
    match driver {
        Driver::Ensure | Driver::EnsureLimited | Driver::EnsureAllAtOnce => {
            let reqs: Vec<EnsureImageRequest> = names
                .iter()
                .enumerate()
                .map(|(i, n)| EnsureImageRequest::new(format!("pod-{i}"), n.clone(), PullPolicy::IfNotPresent))
                .collect();
            for r in join_all(reqs.iter().map(|r| manager.ensure_image_exists(r))).await {
                r.expect("pulled");
            }
        }
        Driver::Queue => {
            let q = &queue;
            let sends = names.iter().map(|n| {
                q.send(EnqueuePull(PullRequest {
                    skip_if_present: true,
                    ..PullRequest::new(ImageSpec::new(n.clone()))
                }))
            });
            let tickets: Vec<_> = join_all(sends).await.into_iter().map(|t| t.expect("admitted")).collect();
            for r in join_all(tickets).await {
                r.expect("pulled");
            }
        }
        Driver::BareWorkers => {
            let next = Cell::new(0usize);
            let workers = (0..MAKESPAN_TOKENS).map(|_| {
                let (mut c, next, names) = (bare.clone(), &next, &names);
                async move {
                    while next.get() < names.len() {
                        let i = next.get();
                        next.set(i + 1);
                        let image = Some(PbSpec { image: names[i].clone(), ..Default::default() });
                        c.pull_image(PullImageRequest { image, ..Default::default() }).await.expect("pulled");
                    }
                }
            });
            join_all(workers).await;
        }
    }
    let elapsed = t.elapsed();
    let stats = runtime.stats();
    assert_eq!(stats.calls(Rpc::PullImage), MAKESPAN_IMAGES as u64, "one pull per image");
    assert_eq!(stats.max_pulls_in_flight, MAKESPAN_TOKENS as u64, "token limit reached and kept");
    elapsed
}

/// Records pull-queue phase changes with their arrival times.
#[derive(Default)]
struct PhaseLog {
    start: Option<Instant>,
    events: Vec<(Duration, String, PullPhase)>,
}

impl Actor for PhaseLog {
    type Context = Context<Self>;
    fn started(&mut self, ctx: &mut Self::Context) {
        // Phases are delivered with try_send: room for all of them.
        ctx.set_mailbox_capacity(100_000);
    }
}

impl Handler<PullPhaseChanged> for PhaseLog {
    type Result = ();
    fn handle(&mut self, m: PullPhaseChanged, _: &mut Self::Context) {
        let at = self.start.map_or(Duration::ZERO, |s| s.elapsed());
        self.events.push((at, m.image, m.phase));
    }
}

#[derive(Message)]
#[rtype(result = "()")]
struct Mark(Instant);

impl Handler<Mark> for PhaseLog {
    type Result = ();
    fn handle(&mut self, m: Mark, _: &mut Self::Context) {
        self.start = Some(m.0);
        self.events.clear();
    }
}

#[derive(Message)]
#[rtype(result = "Vec<(Duration, String, PullPhase)>")]
struct Take;

impl Handler<Take> for PhaseLog {
    type Result = MessageResult<Take>;
    fn handle(&mut self, _: Take, _: &mut Self::Context) -> Self::Result {
        MessageResult(std::mem::take(&mut self.events))
    }
}

/// One traced ensure run: when the first pull starts, how long a pull holds
/// its token (Pulling → Done), and how long a freed token stays idle.
async fn makespan_trace() {
    let log = PhaseLog::default().start();
    let total = makespan_once(Driver::Ensure, Some(&log)).await;
    let events = log.send(Take).await.expect("take");
    let (mut starts, mut dones, mut queued) = (Vec::new(), Vec::new(), Vec::new());
    let mut started_at: HashMap<&str, Duration> = HashMap::new();
    let mut spans = Vec::new();
    for (at, image, phase) in &events {
        match phase {
            PullPhase::Pulling => {
                starts.push(*at);
                started_at.insert(image, *at);
            }
            PullPhase::Queued | PullPhase::Parked => queued.push(*at),
            PullPhase::Done => {
                dones.push(*at);
                if let Some(s) = started_at.get(image.as_str()) {
                    spans.push(at.saturating_sub(*s));
                }
            }
            _ => {}
        }
    }
    if starts.len() != MAKESPAN_IMAGES || dones.len() != MAKESPAN_IMAGES {
        println!("makespan_trace_incomplete: {} starts, {} dones", starts.len(), dones.len());
        return;
    }
    starts.sort();
    dones.sort();
    spans.sort();
    // The k-th finish frees the token the (k+8)-th start takes.
    let mut idle: Vec<Duration> =
        starts.iter().skip(MAKESPAN_TOKENS).zip(&dones).map(|(s, d)| s.saturating_sub(*d)).collect();
    idle.sort();
    println!("makespan_trace_total_ms: {:.1}", ms(total));
    queued.sort();
    if let (Some(first), Some(last)) = (queued.first(), queued.last()) {
        println!("makespan_trace_first_queued_ms: {:.2}", ms(*first));
        println!("makespan_trace_last_queued_ms: {:.2}", ms(*last));
    }
    println!("makespan_trace_first_pull_start_ms: {:.2}", ms(starts[0]));
    println!("makespan_trace_eighth_pull_start_ms: {:.2}", ms(starts[MAKESPAN_TOKENS - 1]));
    println!("makespan_trace_pull_span_p50_ms: {:.2}", ms(pct(&spans, 0.5)));
    println!("makespan_trace_token_idle_p50_us: {:.0}", us(pct(&idle, 0.5)));
    println!("makespan_trace_token_idle_p90_us: {:.0}", us(pct(&idle, 0.9)));
}

/// p50 of a 20 ms tokio sleep and of one bare 20 ms PullImage, sequential:
/// what the runtime's timer and one RPC add to each pull.
async fn timer_reference() {
    let mut sleeps = Vec::new();
    for _ in 0..TIMER_SAMPLES {
        let t = Instant::now();
        tokio::time::sleep(MAKESPAN_LATENCY).await;
        sleeps.push(t.elapsed());
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let runtime = EmbeddedRuntime::start_in(dir.path()).expect("embedded runtime");
    let mut bare = bare_client(&runtime);
    let _ = bare.image_status(ImageStatusRequest::default()).await;
    let mut pulls = Vec::new();
    for i in 0..TIMER_SAMPLES {
        let name = format!("example.com/timer/img{i}:1");
        runtime.add_remote(RemoteImage::new(name.clone(), 1_000).latency(MAKESPAN_LATENCY)).expect("add");
        let image = Some(PbSpec { image: name, ..Default::default() });
        let t = Instant::now();
        bare.pull_image(PullImageRequest { image, ..Default::default() }).await.expect("pulled");
        pulls.push(t.elapsed());
    }
    sleeps.sort();
    pulls.sort();
    println!("tokio_sleep_20ms_p50_ms: {:.2}", ms(pct(&sleeps, 0.5)));
    println!("bare_pull_20ms_p50_ms: {:.2}", ms(pct(&pulls, 0.5)));
}

async fn parallel_makespan() {
    let ideal = makespan_ideal();
    println!("makespan_images: {MAKESPAN_IMAGES}");
    println!("makespan_tokens: {MAKESPAN_TOKENS}");
    println!("makespan_ideal_ms: {}", ideal.as_millis());
    timer_reference().await;
    let drivers = [Driver::Ensure, Driver::Queue, Driver::BareWorkers, Driver::EnsureLimited, Driver::EnsureAllAtOnce];
    let names = ["ensure", "queue_direct", "bare_workers_floor", "ensure_presence_limit", "ensure_all_at_once"];
    let mut runs: [Vec<f64>; 5] = Default::default();
    // Warm-up (allocator, first connections), not counted.
    makespan_once(Driver::Ensure, None).await;
    for run in 0..MAKESPAN_RUNS {
        for k in 0..drivers.len() {
            let i = (run + k) % drivers.len();
            runs[i].push(ms(makespan_once(drivers[i], None).await));
        }
    }
    let ensure_runs: Vec<String> = runs[0].iter().map(|m| format!("{m:.1}")).collect();
    println!("makespan_ensure_runs_ms: {}", ensure_runs.join(","));
    let medians: Vec<f64> = runs.iter().map(|r| median_f64(r.clone())).collect();
    for (name, m) in names.iter().zip(&medians) {
        println!("makespan_{name}_p50_ms: {m:.1}");
    }
    makespan_trace().await;
    let ideal_ms = ms(ideal);
    println!("parallel_makespan_floor_ratio: {:.3}", medians[2] / ideal_ms);
    println!("parallel_makespan_vs_floor: {:.3}", medians[0] / medians[2]);
    println!("parallel_makespan_ratio: {:.3}", medians[0] / ideal_ms);
    println!("parallel_makespan_presence_limit: {PRESENCE_LIMIT}");
    println!("parallel_makespan_presence_limit_vs_floor: {:.3}", medians[3] / medians[2]);
    println!("parallel_makespan_presence_limit_ratio: {:.3}", medians[3] / ideal_ms);
    println!("parallel_makespan_all_at_once_vs_floor: {:.3}", medians[4] / medians[2]);
    println!("parallel_makespan_all_at_once_ratio: {:.3}", medians[4] / ideal_ms);
}

// === Present burst ===

const BURST_REQUESTS: usize = 200;
const BURST_IMAGES: usize = 50;
const BURST_RUNS: usize = 30;
/// The presence-check limit whose gain (makespan) and price (present burst)
/// the bench shows next to the default (no limit).
const PRESENCE_LIMIT: usize = 8;

/// A fixed limit of `PRESENCE_LIMIT` presence checks in flight, no window.
fn presence_limited() -> EnsureSettings {
    EnsureSettings {
        presence_check_window: None,
        presence_check_concurrency: Some(PRESENCE_LIMIT),
        ..EnsureSettings::default()
    }
}

/// Every presence check sent at once, as the kubelet: no window, no limit.
fn presence_all_at_once() -> EnsureSettings {
    EnsureSettings { presence_check_window: None, presence_check_concurrency: None, ..EnsureSettings::default() }
}

/// Wall time of `BURST_REQUESTS` concurrent ensures of present images
/// (`BURST_IMAGES` of them), with the default presence-check window, a
/// fixed limit of `PRESENCE_LIMIT` and every check at once (the kubelet),
/// interleaved run by run: what holding checks back costs a burst that needs
/// no pull. Median of the runs, per side.
async fn present_burst() {
    let pull = PullQueueSettings { qps: 0.0, ..PullQueueSettings::default() };
    let mut sides = Vec::new();
    for cfg in [EnsureSettings::default(), presence_limited(), presence_all_at_once()] {
        let (dir, runtime, gateway, _) = stack(&pull).await;
        for i in 0..BURST_IMAGES {
            runtime.preload(RemoteImage::new(format!("example.com/burst/p{i}:1"), 1_000)).expect("preload");
        }
        let manager =
            start_manager(&gateway, &pull, &BackoffSettings::default(), cfg).await.expect("manager starts").manager;
        sides.push((dir, runtime, manager));
    }
    let reqs: Vec<EnsureImageRequest> = (0..BURST_REQUESTS)
        .map(|i| {
            let image = format!("example.com/burst/p{}:1", i % BURST_IMAGES);
            EnsureImageRequest::new(format!("pod-{i}"), image, PullPolicy::IfNotPresent)
        })
        .collect();
    let mut totals: Vec<Vec<f64>> = vec![Vec::new(); sides.len()];
    for run in 0..=BURST_RUNS {
        for (i, (_, _, manager)) in sides.iter().enumerate() {
            let t = Instant::now();
            for r in join_all(reqs.iter().map(|r| manager.ensure_image_exists(r))).await {
                r.expect("present");
            }
            // Run 0 warms up.
            if run > 0 {
                totals[i].push(ms(t.elapsed()));
            }
        }
    }
    let medians: Vec<f64> = totals.into_iter().map(median_f64).collect();
    println!("present_burst_requests: {BURST_REQUESTS}");
    println!("present_burst_window: {}", EnsureSettings::default().presence_check_window.unwrap_or(0));
    println!("present_burst_limit: {PRESENCE_LIMIT}");
    println!("present_burst_p50_ms: {:.2}", medians[0]);
    println!("present_burst_limit_p50_ms: {:.2}", medians[1]);
    println!("present_burst_all_at_once_p50_ms: {:.2}", medians[2]);
    println!("present_burst_window_cost_ratio: {:.3}", medians[0] / medians[2]);
    println!("present_burst_limit_cost_ratio: {:.3}", medians[1] / medians[2]);
}

// === Single flight ===

/// CRI PullImage calls for `SF_WAITERS` concurrent ensures of one absent image.
async fn shared_pulls(single_flight: bool) -> u64 {
    let pull = PullQueueSettings {
        concurrency: Concurrency::Parallel(None),
        qps: 0.0,
        capacity: None,
        single_flight,
        ..PullQueueSettings::default()
    };
    let (_dir, runtime, _gateway, StartedManager { manager, .. }) = stack(&pull).await;
    let image = "example.com/shared:1";
    runtime.add_remote(RemoteImage::new(image, 1_000).latency(SF_LATENCY)).expect("add");
    let reqs: Vec<EnsureImageRequest> =
        (0..SF_WAITERS).map(|i| EnsureImageRequest::new(format!("pod-{i}"), image, PullPolicy::IfNotPresent)).collect();
    let results = join_all(reqs.iter().map(|r| manager.ensure_image_exists(r))).await;
    let refs: std::collections::HashSet<String> = results.into_iter().map(|r| r.expect("ensured").image_ref).collect();
    assert_eq!(refs.len(), 1, "every waiter got the same image");
    runtime.stats().calls(Rpc::PullImage)
}

fn main() {
    // What operators run: the daemon's tracing subscriber and default filter
    // (a log line on the hot path would be measured, as it costs them).
    let _ = imaged::telemetry::init(&imaged::config::Config::defaults().expect("defaults").log);
    actix::System::new().block_on(async {
        // `ENSURE_BENCH=trace`: only traced makespan runs (to study where the time goes).
        if std::env::var("ENSURE_BENCH").as_deref() == Ok("trace") {
            makespan_once(Driver::Ensure, None).await;
            for _ in 0..3 {
                makespan_trace().await;
            }
            return;
        }
        if std::env::var("ENSURE_BENCH").as_deref() == Ok("makespan") {
            parallel_makespan().await;
            return;
        }
        if std::env::var("ENSURE_BENCH").as_deref() == Ok("hot") {
            hot_path().await;
            return;
        }
        if std::env::var("ENSURE_BENCH").as_deref() == Ok("burst") {
            present_burst().await;
            return;
        }
        hot_path().await;
        parallel_makespan().await;
        present_burst().await;
        println!("single_flight_waiters: {SF_WAITERS}");
        println!("single_flight_cri_pulls: {}", shared_pulls(true).await);
        println!("kubelet_equivalent_cri_pulls: {}", shared_pulls(false).await);
    });
}
