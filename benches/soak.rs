//! Soak: `imaged run` on its in-process embedded runtime (with durable
//! state and the runtime's state directory) under a steady mixed workload
//! for 30 minutes, sampling the daemon's resident memory, open file
//! descriptors and threads every 10 s. Not run in CI (CI compiles it).
//!
//! ```sh
//! cargo bench --bench soak                                      # 30 min
//! IMAGED_SOAK_SECS=120 IMAGED_SOAK_SAMPLE_SECS=2 cargo bench --bench soak
//! ```
//!
//! The workload, from 6 clients (seeded, `IMAGED_SOAK_SEED`), with new pod
//! UIDs all the time as a node's pods come and go: ensures of present
//! images, of images GC removed (pulls), Always pulls, a private image with
//! and without its secret, an image no registry has (failures, then
//! back-offs for the same pod), back-off clears, prefetches, GC runs
//! (threshold, delete-unused, dry runs) beside the daemon's own every 5 s
//! (max age 10 s), API reads (ListImages, GetStatus, ListPulls), `/metrics`
//! scrapes, and event subscriptions (WatchEvents, follow) that open, read a
//! while and close. Every 20 s another image goes unused for 20 s, so GC
//! removes it and the next pods that want it find it absent.
//!
//! Prints one `soak_sample` line per sample, then `name: value` lines:
//! `soak_rss_mb_start/end/max`, `soak_anon_mb_start/end/max` (the
//! anonymous part of RSS: heap and stacks, without the binary's pages that
//! become resident as code paths run), `soak_fds_start/end/max`,
//! `soak_threads_start/end/max`, the workload's counts, and `soak_result`.
//! Exits 1 (with the reason) when the daemon dies, an API call fails
//! unexpectedly, or a metric keeps growing: after a warm-up (the first
//! tenth of the samples), the minimum of the last third is above the
//! maximum of the first third by more than a margin (RSS: 10% or 4 MiB,
//! whichever is more; anonymous: 10% or 1 MiB; fds: 8; threads: 4). A
//! leak raises the floor of the late samples above everything early; noise
//! and a one-off step up that then stays flat within the margin do not.
//!
//! To see where the memory is, attach heaptrack to the daemon (its pid is
//! printed first): `heaptrack -p PID`, then `heaptrack_print` on its file
//! (`--print-leaks 1` lists what is still allocated at the end, by call
//! site; `--print-massif` the heap over time).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::pedantic)] // bench code: a failed unwrap is a failed run

#[path = "../tests/support/mod.rs"]
mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use imaged::api::proto;
use rand::rngs::StdRng;
use rand::{RngExt as _, SeedableRng};
use support::daemon::Daemon;

const CLIENTS: usize = 6;
const WATCHERS: usize = 2;

const PUBLIC: [&str; 5] = ["busybox:1.36", "busybox:latest", "nginx:1.27", "redis:7", "registry.k8s.io/pause:3.10"];
const PRIVATE: &str = "registry.example.com/team/app:v1";
const MISSING: &str = "docker.io/library/not-in-any-registry:1";

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// What the workload did, for the summary.
#[derive(Default)]
struct Counts {
    ensure_ok: AtomicU64,
    ensure_failed: AtomicU64,
    gc_runs: AtomicU64,
    reads: AtomicU64,
    scrapes: AtomicU64,
    prefetches: AtomicU64,
    clears: AtomicU64,
    watch_streams: AtomicU64,
    watch_events: AtomicU64,
    /// gRPC errors other than a GC refused because one runs.
    rpc_errors: AtomicU64,
}

fn add(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// One sample of the daemon process.
#[derive(Debug, Clone, Copy)]
struct Sample {
    at: Duration,
    rss_kb: u64,
    anon_kb: u64,
    fds: u64,
    threads: u64,
}

fn sample(pid: u32, at: Duration) -> Option<Sample> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<u64>().ok())
    };
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as u64;
    Some(Sample { at, rss_kb: field("VmRSS:")?, anon_kb: field("RssAnon:")?, fds, threads: field("Threads:")? })
}

/// Whether a series keeps growing: after the warm-up, the last third's
/// minimum above the first third's maximum by more than `margin`.
fn keeps_growing(series: &[u64], margin: impl Fn(u64) -> u64) -> Option<String> {
    let warm = (series.len() / 10).max(1);
    let s = &series[warm.min(series.len())..];
    if s.len() < 6 {
        return None;
    }
    let third = s.len() / 3;
    let first_max = *s[..third].iter().max()?;
    let last_min = *s[s.len() - third..].iter().min()?;
    let m = margin(first_max);
    (last_min > first_max + m).then(|| {
        format!("the last third's minimum {last_min} is above the first third's maximum {first_max} by more than {m}")
    })
}

/// The growth rule on series whose answer is known, so a rule that can
/// never fail (or always does) stops the run before it starts.
fn check_the_growth_rule() {
    let margin = |_| 8;
    let leak: Vec<u64> = (0..60).map(|i| 100 + i).collect();
    assert!(keeps_growing(&leak, margin).is_some(), "a steady climb is growth");
    let noise: Vec<u64> = (0..60).map(|i| 100 + (i * 7 % 13)).collect();
    assert!(keeps_growing(&noise, margin).is_none(), "noise is not growth");
    let warm: Vec<u64> = (0..60).map(|i| if i < 5 { 10 + i * 20 } else { 100 + i % 3 }).collect();
    assert!(keeps_growing(&warm, margin).is_none(), "a warm-up is not growth");
    let step: Vec<u64> = (0..60).map(|i| if i < 30 { 100 } else { 106 }).collect();
    assert!(keeps_growing(&step, margin).is_none(), "a step within the margin is not growth");
}

fn secret() -> Vec<u8> {
    let config =
        serde_json::json!({"auths": {"registry.example.com": {"username": "team", "password": "team-password"}}});
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "regcred", "namespace": "soak", "uid": "uid-regcred"},
        "type": "kubernetes.io/dockerconfigjson",
        "stringData": {".dockerconfigjson": config.to_string()},
    })
    .to_string()
    .into_bytes()
}

fn ensure(uid: &str, image: &str, policy: &str, secret: Option<&[u8]>) -> proto::EnsureImageRequest {
    proto::EnsureImageRequest {
        pod: Some(proto::Pod { uid: uid.into(), namespace: "soak".into(), name: uid.into(), ..Default::default() }),
        container: "c".into(),
        image: image.into(),
        pull_policy: policy.into(),
        pull_secrets: secret.map(|s| vec![s.to_vec()]).unwrap_or_default(),
        ..Default::default()
    }
}

type Client = imaged::api::ImagedClient<tonic::transport::Channel>;

/// How long each image in turn goes unused (so GC removes it).
const COLD_FOR: Duration = Duration::from_secs(20);

/// The image no pod asks for now (an index into PUBLIC, or PUBLIC.len() for
/// the private image), in turn, for COLD_FOR each.
fn cold(start: Instant) -> usize {
    (start.elapsed().as_secs() / COLD_FOR.as_secs()) as usize % (PUBLIC.len() + 1)
}

/// A public image some pods want now.
fn warm_public(rng: &mut StdRng, start: Instant) -> &'static str {
    let skip = cold(start);
    let choices: Vec<&str> = PUBLIC.iter().enumerate().filter(|(i, _)| *i != skip).map(|(_, p)| *p).collect();
    choices[rng.random_range(0..choices.len())]
}

/// One client: ops picked at random until `until`.
async fn client_loop(
    mut c: Client,
    seed: u64,
    start: Instant,
    until: Instant,
    counts: Arc<Counts>,
    metrics_url: String,
) {
    let mut rng = StdRng::seed_from_u64(seed);
    let secret = secret();
    let http = reqwest::Client::builder().timeout(Duration::from_secs(10)).no_proxy().build().unwrap();
    let mut pod = 0u64;
    // Pods retrying the missing image (a pod's retries meet its back-off).
    let mut failing: Vec<String> = Vec::new();
    while Instant::now() < until {
        pod += 1;
        let uid = format!("c{seed}-p{pod}");
        let mut roll = rng.random_range(0..100);
        if (40..=54).contains(&roll) && cold(start) == PUBLIC.len() {
            // The private image's turn to go unused: an API read instead.
            roll = 65;
        }
        let result: Result<(), tonic::Status> = async {
            match roll {
                0..=29 => {
                    let image = warm_public(&mut rng, start);
                    let r = c.ensure_image(ensure(&uid, image, "IfNotPresent", None)).await?;
                    count_ensure(&counts, r.into_inner());
                }
                30..=39 => {
                    let image = warm_public(&mut rng, start);
                    let r = c.ensure_image(ensure(&uid, image, "Always", None)).await?;
                    count_ensure(&counts, r.into_inner());
                }
                40..=49 => {
                    let r = c.ensure_image(ensure(&uid, PRIVATE, "IfNotPresent", Some(&secret))).await?;
                    count_ensure(&counts, r.into_inner());
                }
                50..=54 => {
                    let r = c.ensure_image(ensure(&uid, PRIVATE, "IfNotPresent", None)).await?;
                    count_ensure(&counts, r.into_inner());
                }
                55..=62 => {
                    let retry = !failing.is_empty() && rng.random_bool(0.6);
                    let who = if retry { failing[rng.random_range(0..failing.len())].clone() } else { uid.clone() };
                    let r = c.ensure_image(ensure(&who, MISSING, "IfNotPresent", None)).await?;
                    count_ensure(&counts, r.into_inner());
                    if !retry {
                        failing.push(who);
                        if failing.len() > 20 {
                            failing.remove(0);
                        }
                    }
                }
                63..=64 => {
                    let pod_uid = failing.first().cloned().unwrap_or_default();
                    c.clear_backoff(proto::ClearBackoffRequest { pod_uid, image: String::new() }).await?;
                    add(&counts.clears);
                }
                65..=69 => {
                    c.list_images(proto::ListImagesRequest {}).await?;
                    add(&counts.reads);
                }
                70..=74 => {
                    c.get_status(proto::GetStatusRequest {}).await?;
                    add(&counts.reads);
                }
                75..=77 => {
                    c.list_pulls(proto::ListPullsRequest {}).await?;
                    add(&counts.reads);
                }
                78..=80 => {
                    if let Ok(r) = http.get(&metrics_url).send().await {
                        let _ = r.bytes().await;
                        add(&counts.scrapes);
                    }
                }
                81..=85 => {
                    let image = warm_public(&mut rng, start);
                    let req = proto::PrefetchImageRequest { image: image.into(), priority: -5, ..Default::default() };
                    c.prefetch_image(req).await?;
                    add(&counts.prefetches);
                }
                86..=91 => {
                    let dry_run = rng.random_bool(0.5);
                    c.garbage_collect(proto::GarbageCollectRequest { dry_run }).await?;
                    add(&counts.gc_runs);
                }
                _ => {
                    let dry_run = rng.random_bool(0.3);
                    c.delete_unused_images(proto::DeleteUnusedImagesRequest { dry_run }).await?;
                    add(&counts.gc_runs);
                }
            }
            Ok(())
        }
        .await;
        match result {
            Ok(()) => {}
            // Another GC (the daemon's own, or another client's) runs.
            Err(e) if e.code() == tonic::Code::Aborted => {}
            Err(e) => {
                if counts.rpc_errors.fetch_add(1, Ordering::Relaxed) < 5 {
                    eprintln!("soak: rpc error: {e}");
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(rng.random_range(5..60))).await;
    }
}

fn count_ensure(counts: &Counts, r: proto::EnsureImageResponse) {
    match r.result {
        Some(proto::ensure_image_response::Result::Ok(_)) => add(&counts.ensure_ok),
        _ => add(&counts.ensure_failed),
    }
}

/// Opens event subscriptions, reads each for a while, drops it.
async fn watch_loop(mut c: Client, seed: u64, until: Instant, counts: Arc<Counts>) {
    let mut rng = StdRng::seed_from_u64(seed);
    while Instant::now() < until {
        let recent = rng.random_bool(0.5);
        match c.watch_events(proto::WatchEventsRequest { recent, follow: true }).await {
            Ok(stream) => {
                add(&counts.watch_streams);
                let mut stream = stream.into_inner();
                let read_for = Duration::from_millis(rng.random_range(50..3_000));
                let _ = tokio::time::timeout(read_for, async {
                    while let Ok(Some(_)) = stream.message().await {
                        add(&counts.watch_events);
                    }
                })
                .await;
            }
            Err(e) => {
                if counts.rpc_errors.fetch_add(1, Ordering::Relaxed) < 5 {
                    eprintln!("soak: watch error: {e}");
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(rng.random_range(10..500))).await;
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn main() {
    check_the_growth_rule();
    let secs = env_u64("IMAGED_SOAK_SECS", 1_800);
    let every = Duration::from_secs(env_u64("IMAGED_SOAK_SAMPLE_SECS", 10).max(1));
    let seed = env_u64("IMAGED_SOAK_SEED", 1);
    let dir = tempfile::Builder::new().prefix("imsoak").tempdir_in("/tmp").unwrap();
    let config = dir.path().join("imaged.toml");
    let port = free_port();
    std::fs::write(
        &config,
        format!(
            "[runtime]\nembedded_state_dir = {rt:?}\n[state]\ndir = {state:?}\n[log]\nfilter = \"warn\"\n\
             [daemon]\nmetrics_address = \"127.0.0.1:{port}\"\n\
             [backoff]\ninitial = \"100ms\"\nmax = \"2s\"\ngc_interval = \"10s\"\n\
             [gc]\nimage_gc_high_threshold_percent = 100\nimage_minimum_gc_age = \"2s\"\n\
             image_maximum_gc_age = \"10s\"\ngc_period = \"5s\"\ndetect_period = \"2s\"\n",
            rt = dir.path().join("runtime").display().to_string(),
            state = dir.path().join("state").display().to_string(),
        ),
    )
    .unwrap();
    let config_arg = config.display().to_string();
    let port_arg = format!("daemon.metrics_address=127.0.0.1:{port}");
    let mut daemon = Daemon::start(&["--config", &config_arg, "--set", &port_arg]);
    let pid = daemon.child.id();
    println!("soak: imaged pid {pid}, {secs} s, a sample every {every:?}, seed {seed}");

    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let counts = Arc::new(Counts::default());
    let start = Instant::now();
    let until = start + Duration::from_secs(secs);
    let socket = daemon.socket.clone();
    let metrics_url = format!("http://127.0.0.1:{port}/metrics");
    let workers = rt.block_on(async {
        let c = imaged::api::client(&socket).unwrap();
        let mut set = tokio::task::JoinSet::new();
        for i in 0..CLIENTS {
            set.spawn(client_loop(
                c.clone(),
                seed * 1_000 + i as u64,
                start,
                until,
                counts.clone(),
                metrics_url.clone(),
            ));
        }
        for i in 0..WATCHERS {
            set.spawn(watch_loop(c.clone(), seed * 1_000 + 500 + i as u64, until, counts.clone()));
        }
        set
    });

    let mut samples: Vec<Sample> = Vec::new();
    let mut died = None;
    loop {
        if let Ok(Some(status)) = daemon.child.try_wait() {
            died = Some(format!("the daemon exited with {status} at {:?}: {}", start.elapsed(), daemon.log()));
            break;
        }
        match sample(pid, start.elapsed()) {
            Some(s) => {
                println!(
                    "soak_sample t={:>5}s rss_mb={:.1} anon_mb={:.1} fds={} threads={} ensures={}",
                    s.at.as_secs(),
                    s.rss_kb as f64 / 1024.0,
                    s.anon_kb as f64 / 1024.0,
                    s.fds,
                    s.threads,
                    counts.ensure_ok.load(Ordering::Relaxed) + counts.ensure_failed.load(Ordering::Relaxed)
                );
                samples.push(s);
            }
            None => {
                died = Some("the daemon's /proc entry is gone".into());
                break;
            }
        }
        if Instant::now() >= until {
            break;
        }
        std::thread::sleep(every.min(until.saturating_duration_since(Instant::now())).max(Duration::from_millis(1)));
    }
    let runtime_ops = rt.block_on(async {
        let mut workers = workers;
        let _ =
            tokio::time::timeout(Duration::from_secs(30), async { while workers.join_next().await.is_some() {} }).await;
        // What reached the runtime, from the daemon's own metrics.
        let http = reqwest::Client::builder().timeout(Duration::from_secs(10)).no_proxy().build().unwrap();
        match http.get(format!("http://127.0.0.1:{port}/metrics")).send().await {
            Ok(r) => r.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        }
    });
    let runtime_op = |op: &str| {
        let prefix = format!("imaged_runtime_operations_total{{operation_type=\"{op}\"}} ");
        runtime_ops.lines().find_map(|l| l.strip_prefix(&prefix)).unwrap_or("unknown").to_string()
    };

    let rss: Vec<u64> = samples.iter().map(|s| s.rss_kb).collect();
    let anon: Vec<u64> = samples.iter().map(|s| s.anon_kb).collect();
    let fds: Vec<u64> = samples.iter().map(|s| s.fds).collect();
    let threads: Vec<u64> = samples.iter().map(|s| s.threads).collect();
    let stat = |v: &[u64]| {
        (v.first().copied().unwrap_or(0), v.last().copied().unwrap_or(0), v.iter().copied().max().unwrap_or(0))
    };
    let mb = |kb: u64| kb as f64 / 1024.0;
    let (a, b, c) = stat(&rss);
    println!("soak_rss_mb_start: {:.1}\nsoak_rss_mb_end: {:.1}\nsoak_rss_mb_max: {:.1}", mb(a), mb(b), mb(c));
    let (a, b, c) = stat(&anon);
    println!("soak_anon_mb_start: {:.1}\nsoak_anon_mb_end: {:.1}\nsoak_anon_mb_max: {:.1}", mb(a), mb(b), mb(c));
    let (a, b, c) = stat(&fds);
    println!("soak_fds_start: {a}\nsoak_fds_end: {b}\nsoak_fds_max: {c}");
    let (a, b, c) = stat(&threads);
    println!("soak_threads_start: {a}\nsoak_threads_end: {b}\nsoak_threads_max: {c}");
    println!("soak_samples: {}", samples.len());
    println!("soak_runtime_pulls: {}", runtime_op("pull_image"));
    println!("soak_runtime_removes: {}", runtime_op("remove_image"));
    for (name, c) in [
        ("soak_ensures_ok", &counts.ensure_ok),
        ("soak_ensures_failed", &counts.ensure_failed),
        ("soak_gc_runs", &counts.gc_runs),
        ("soak_api_reads", &counts.reads),
        ("soak_metrics_scrapes", &counts.scrapes),
        ("soak_prefetches", &counts.prefetches),
        ("soak_backoff_clears", &counts.clears),
        ("soak_watch_streams", &counts.watch_streams),
        ("soak_watch_events", &counts.watch_events),
        ("soak_rpc_errors", &counts.rpc_errors),
    ] {
        println!("{name}: {}", c.load(Ordering::Relaxed));
    }

    let mut failures = Vec::new();
    if let Some(d) = died {
        failures.push(d);
    }
    let growth = [
        ("rss_kb", keeps_growing(&rss, |max| (max / 10).max(4 * 1024))),
        ("anon_kb", keeps_growing(&anon, |max| (max / 10).max(1024))),
        ("fds", keeps_growing(&fds, |_| 8)),
        ("threads", keeps_growing(&threads, |_| 4)),
    ];
    for (name, verdict) in growth {
        if let Some(why) = verdict {
            failures.push(format!("{name} keeps growing: {why}"));
        }
    }
    if counts.rpc_errors.load(Ordering::Relaxed) > 0 {
        failures.push(format!("{} API calls failed unexpectedly", counts.rpc_errors.load(Ordering::Relaxed)));
    }
    if failures.is_empty() {
        println!("soak_result: ok");
    } else {
        for f in &failures {
            println!("soak_result: FAIL {f}");
        }
        drop(daemon);
        std::process::exit(1);
    }
}
