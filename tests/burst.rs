//! Bursts never cut a connection: 10,000 concurrent ensures against the
//! embedded runtime and against containerd, in serial and parallel pull
//! mode, five bursts each, every ensure answered with its image; and each
//! server imaged runs (the embedded runtime, the API socket, the CRI front)
//! serving three times its per-connection stream limit on one connection.
//!
//! Before `cri::transport`, a burst closed the runtime's connection: h2's
//! small-DATA-frame budget (GOAWAY ENHANCE_YOUR_CALM "too_many_data_frames")
//! and every presence check on it failed (`ImageInspectError`, 94% of a
//! burst of present images). See `src/cri/transport.rs`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::pedantic)] // test code: a failed unwrap is a failed test

mod support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use imaged::config::{Config, RuntimeEndpoint};
use imaged::cri::Rpc;
use imaged::cri::transport::{CLIENT_READS_IN_FLIGHT, MAX_STREAMS_PER_CONNECTION};
use imaged::domain::pull_policy::PullPolicy;
use imaged::embedded::RemoteImage;
use imaged::ensure::{EnsureError, EnsureImageRequest, EnsureOk};
use imaged::node::Node;

/// Ensures in flight at once in a burst.
const BURST: usize = 10_000;
/// Bursts per pull mode.
const RUNS: usize = 5;
/// Distinct images a burst asks for; the first `ABSENT` of them are new
/// (absent, pulled during the burst) in every run.
const IMAGES: usize = 50;
const ABSENT: usize = 10;

/// The answers of a burst that are not the image, by message.
fn failures(results: Vec<Result<EnsureOk, EnsureError>>) -> BTreeMap<String, usize> {
    let mut failed = BTreeMap::new();
    for r in results {
        if let Err(e) = r {
            *failed.entry(format!("{}: {}", e.kind, e.message)).or_default() += 1;
        }
    }
    failed
}

/// `BURST` ensures of `images` (request `i` asks for image `i % len`), all at once.
async fn burst(node: &Node, run: &str, images: &[String]) -> (BTreeMap<String, usize>, Duration) {
    let reqs: Vec<EnsureImageRequest> = (0..BURST)
        .map(|i| {
            let mut r = EnsureImageRequest::new(
                format!("{run}-{i}"),
                images[i % images.len()].as_str(),
                PullPolicy::IfNotPresent,
            );
            r.pod.namespace = "burst".into();
            r.pod.name = format!("pod-{run}-{i}");
            r
        })
        .collect();
    let started = Instant::now();
    let results = join_all(reqs.iter().map(|r| node.ensure_image_exists(r))).await;
    let elapsed = started.elapsed();
    (failures(results.into_iter().map(|r| r.expect("node accepting")).collect()), elapsed)
}

async fn embedded_node(dir: &std::path::Path, toml: &str) -> Arc<Node> {
    let mut cfg = Config::from_toml(toml).expect("config");
    cfg.endpoint = RuntimeEndpoint::Embedded { socket: Some(dir.join("runtime.sock")) };
    Arc::new(Node::start(cfg).await.expect("node starts"))
}

/// Serial pulls with the default presence-check window; parallel pulls with
/// every presence check sent at once (the kubelet's way, the most calls in
/// flight). Both lost the runtime's connection before the fix.
const MODES: [(&str, &str); 2] = [
    ("serial", "[pull]\nserialize_image_pulls = true\nregistry_pull_qps = 0.0\n"),
    ("parallel", "[pull]\nserialize_image_pulls = false\nregistry_pull_qps = 0.0\npresence_check_window = 0\n"),
];

#[actix::test]
async fn ten_thousand_ensures_against_the_embedded_runtime_all_get_their_image() {
    for (mode, toml) in MODES {
        let dir = tempfile::tempdir().expect("tempdir");
        let node = embedded_node(dir.path(), toml).await;
        let rt = node.runtime().embedded.as_ref().expect("embedded");
        for i in ABSENT..IMAGES {
            rt.preload(RemoteImage::new(format!("example.com/burst/present-{i}:1"), 1_000)).expect("preload");
        }
        for run in 0..RUNS {
            // Fresh absent images every run: each burst pulls too.
            let images: Vec<String> = (0..IMAGES)
                .map(|i| match i < ABSENT {
                    true => format!("example.com/burst/{mode}-{run}-absent-{i}:1"),
                    false => format!("example.com/burst/present-{i}:1"),
                })
                .collect();
            for image in &images[..ABSENT] {
                rt.add_remote(RemoteImage::new(image, 1_000).latency(Duration::from_millis(5))).expect("add");
            }
            rt.reset_stats();
            let (failed, took) = burst(&node, &format!("{mode}{run}"), &images).await;
            assert!(
                failed.is_empty(),
                "{mode} run {run}: {} of {BURST} failed: {failed:#?}",
                failed.values().sum::<usize>()
            );
            let stats = rt.stats();
            assert!(stats.calls(Rpc::ImageStatus) >= BURST as u64, "{mode} run {run}: every ensure checked presence");
            assert!(stats.pulls_completed >= ABSENT as u64, "{mode} run {run}: every absent image pulled");
            assert!(
                stats.max_in_flight(Rpc::ImageStatus) <= CLIENT_READS_IN_FLIGHT as u64,
                "{mode} run {run}: {} checks at once, over the client's bound",
                stats.max_in_flight(Rpc::ImageStatus)
            );
            eprintln!("{mode} run {run}: {BURST} ensures in {took:?}");
        }
        node.shutdown(Duration::ZERO).await;
    }
}

/// The same bursts against containerd, on images in a loopback registry:
/// `ABSENT` images pushed under fresh tags before each burst (containerd
/// pulls them during it), the others pulled by each mode's first burst.
#[test]
fn ten_thousand_ensures_against_containerd_all_get_their_image() {
    support::containerd_env::with_environment("ten_thousand_ensures_against_containerd", |env| {
        actix::System::new().block_on(containerd_bursts(env));
    });
}

async fn containerd_bursts(env: support::containerd_env::ContainerdEnv) {
    let registry = support::oci::Registry::open(&env.registry_open);
    let mut present = Vec::new();
    for i in ABSENT..IMAGES {
        let pushed = registry
            .push_image(&format!("imaged/burst-{i}"), "v1", &[("etc/burst.txt", format!("image {i}\n").as_bytes())])
            .await
            .expect("push");
        present.push(pushed.reference);
    }
    for (mode, toml) in MODES {
        let state = tempfile::tempdir().expect("state dir");
        let mut cfg = Config::from_toml(&format!("{toml}[state]\ndir = {:?}\n", state.path())).expect("config");
        cfg.endpoint = RuntimeEndpoint::Cri(imaged::cri::CriEndpoint::Unix(env.socket.clone()));
        let node = Node::start(cfg).await.expect("node on containerd");
        for run in 0..RUNS {
            let mut images = Vec::new();
            for i in 0..ABSENT {
                // Same content, a new tag: absent to imaged, a quick pull for containerd.
                let tag = format!("{mode}-{run}");
                let pushed = registry
                    .push_image(
                        &format!("imaged/burst-{i}"),
                        &tag,
                        &[("etc/burst.txt", format!("image {i}\n").as_bytes())],
                    )
                    .await
                    .expect("push");
                images.push(pushed.reference);
            }
            images.extend(present.iter().cloned());
            let (failed, took) = burst(&node, &format!("ctrd-{mode}{run}"), &images).await;
            assert!(
                failed.is_empty(),
                "containerd, {mode} run {run}: {} of {BURST} failed: {failed:#?}",
                failed.values().sum::<usize>()
            );
            eprintln!("containerd, {mode} run {run}: {BURST} ensures in {took:?}");
        }
        node.shutdown(Duration::ZERO).await;
    }
}

/// Three times the stream limit of a connection: every call answered, and
/// never more than the limit served at once.
const OVER_LIMIT: usize = 3 * MAX_STREAMS_PER_CONNECTION as usize;

/// Runs `burst` on a runtime of its own, two threads: calls arrive as fast
/// as a busy client sends them while the server under test keeps this
/// test's thread.
async fn from_other_threads<F, Fut>(burst: F) -> BTreeMap<String, usize>
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = BTreeMap<String, usize>>,
{
    tokio::task::spawn_blocking(move || {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
        rt.block_on(burst())
    })
    .await
    .expect("client threads")
}

/// `n` calls of `call` at once; the failures by message.
async fn all_at_once<F, Fut, T>(n: usize, call: F) -> BTreeMap<String, usize>
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = Result<T, String>> + Send + 'static,
    T: Send + 'static,
{
    let tasks: Vec<_> = (0..n).map(|i| tokio::spawn(call(i))).collect();
    let mut failed = BTreeMap::new();
    for t in tasks {
        if let Err(e) = t.await.expect("task") {
            *failed.entry(e).or_default() += 1;
        }
    }
    failed
}

fn status_request(image: &str) -> imaged::cri::proto::ImageStatusRequest {
    imaged::cri::proto::ImageStatusRequest {
        image: Some(imaged::cri::proto::ImageSpec { image: image.into(), ..Default::default() }),
        verbose: false,
    }
}

/// A plain generated `runtime.v1` client on a new connection: no bound of
/// its own on calls in flight.
fn runtime_v1_client(
    path: &std::path::Path,
) -> imaged::cri::proto::image_service_client::ImageServiceClient<tonic::transport::Channel> {
    let channel = imaged::cri::CriEndpoint::Unix(path.to_path_buf()).channel(Duration::from_secs(5)).expect("channel");
    imaged::cri::proto::image_service_client::ImageServiceClient::new(channel)
}

/// `OVER_LIMIT` plain `ImageStatus` calls of `image` at once on one new
/// connection to `path`.
async fn status_burst(path: std::path::PathBuf, image: &'static str) -> BTreeMap<String, usize> {
    from_other_threads(move || async move {
        let client = runtime_v1_client(&path);
        all_at_once(OVER_LIMIT, |_| {
            let mut c = client.clone();
            async move {
                c.image_status(status_request(image)).await.map_err(|s| format!("{:?}: {}", s.code(), s.message()))
            }
        })
        .await
    })
    .await
}

/// Answers held for `ms`, so that every call the server lets in stays open.
fn held_answers(ms: u64) -> imaged::fault::FaultPlan {
    imaged::fault::FaultPlan::new(1)
        .rule(imaged::fault::FaultRule::on(Rpc::ImageStatus).delay(Duration::from_millis(ms)))
}

const HELD: &str = "example.com/burst/held:1";

#[actix::test]
async fn the_embedded_runtime_serves_three_times_its_stream_limit_on_one_connection() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = imaged::embedded::EmbeddedRuntime::start_in(dir.path()).expect("runtime");
    rt.preload(RemoteImage::new(HELD, 1_000)).expect("preload");
    rt.set_fault_plan(held_answers(300));
    let failed = status_burst(rt.socket().to_path_buf(), HELD).await;
    assert!(failed.is_empty(), "{failed:#?}");
    let stats = rt.stats();
    assert_eq!(stats.calls(Rpc::ImageStatus), OVER_LIMIT as u64);
    let most = stats.max_in_flight(Rpc::ImageStatus);
    eprintln!("embedded: {most} calls at once");
    assert!(most <= u64::from(MAX_STREAMS_PER_CONNECTION), "{most} calls served at once on one connection");
}

#[actix::test]
async fn a_cri_client_keeps_at_most_its_bound_of_calls_in_flight() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = imaged::embedded::EmbeddedRuntime::start_in(dir.path()).expect("runtime");
    rt.preload(RemoteImage::new(HELD, 1_000)).expect("preload");
    rt.set_fault_plan(held_answers(500));
    let endpoint = rt.endpoint();
    let n = 3 * CLIENT_READS_IN_FLIGHT;
    let failed = from_other_threads(move || async move {
        let client = imaged::cri::CriClient::new(&endpoint, Duration::from_secs(5)).expect("client");
        all_at_once(n, |_| {
            let c = client.clone();
            async move {
                // Waiting for a slot counts against the deadline: 3 rounds of 500 ms fit in 30 s.
                c.image_status(imaged::domain::ImageSpec::new(HELD), false, Some(Duration::from_secs(30)))
                    .await
                    .map_err(|e| e.to_string())
            }
        })
        .await
    })
    .await;
    assert!(failed.is_empty(), "{failed:#?}");
    let stats = rt.stats();
    assert_eq!(stats.calls(Rpc::ImageStatus), n as u64);
    let most = stats.max_in_flight(Rpc::ImageStatus);
    eprintln!("client: {most} calls at once");
    assert!(most <= CLIENT_READS_IN_FLIGHT as u64, "{most} calls at once");
}

#[actix::test]
async fn the_cri_front_serves_three_times_its_stream_limit_on_one_connection() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Every call forwarded: the front's read cache would answer repeats.
    let node = embedded_node(dir.path(), "[cri_server]\nread_cache_ttl = \"0s\"\n").await;
    let rt = node.runtime().embedded.as_ref().expect("embedded");
    rt.preload(RemoteImage::new(HELD, 1_000)).expect("preload");
    rt.set_fault_plan(held_answers(300));
    let path = dir.path().join("cri.sock");
    let _stop = support::front::serve_front(&node, &path).await;
    let failed = status_burst(path, HELD).await;
    assert!(failed.is_empty(), "{failed:#?}");
    let stats = rt.stats();
    assert!(stats.calls(Rpc::ImageStatus) >= OVER_LIMIT as u64, "each call forwarded");
    // The front forwards through the gateway's CRI client and its bound.
    let most = stats.max_in_flight(Rpc::ImageStatus);
    eprintln!("front: {most} forwarded calls at once");
    assert!(most <= CLIENT_READS_IN_FLIGHT as u64, "{most} forwarded calls at once");
}

#[actix::test]
async fn the_api_socket_serves_three_times_its_stream_limit_on_one_connection() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Every presence check at once: only the connection bounds the ensures
    // waiting on the pull.
    let node = embedded_node(dir.path(), "[pull]\nregistry_pull_qps = 0.0\npresence_check_window = 0\n").await;
    let rt = node.runtime().embedded.as_ref().expect("embedded");
    // Every call waits on one pull of 3 s: its stream stays open.
    const SLOW: &str = "example.com/burst/slow:1";
    rt.add_remote(RemoteImage::new(SLOW, 1_000).latency(Duration::from_secs(3))).expect("add");
    let (stopping_tx, stopping) = tokio::sync::watch::channel(false);
    let service = imaged::api::ImagedService::start(node.clone(), stopping).await.expect("service");
    let path = dir.path().join("api.sock");
    let socket = imaged::api::server::ApiSocket::bind_at("API socket", &path, None).await.expect("bind");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    actix::spawn(async move {
        let _ = socket
            .serve(service, 4 << 20, async move {
                let _ = stopped.await;
            })
            .await;
    });
    // The most ensures waiting on the pull at once, sampled while the burst runs.
    let sampler = {
        let node = node.clone();
        actix::spawn(async move {
            let mut most = 0;
            loop {
                let waiters = node.status().await.map(|s| s.queue.waiters).unwrap_or(0);
                if most > 0 && waiters == 0 {
                    return most;
                }
                most = most.max(waiters);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    let failed = from_other_threads(move || async move {
        let client = imaged::api::client(&path).expect("client");
        all_at_once(OVER_LIMIT, |i| {
            let mut c = client.clone();
            let req = imaged::api::proto::EnsureImageRequest {
                pod: Some(imaged::api::proto::Pod {
                    uid: format!("uid-{i}"),
                    namespace: "burst".into(),
                    name: format!("pod-{i}"),
                    ..Default::default()
                }),
                image: SLOW.into(),
                pull_policy: "IfNotPresent".into(),
                ..Default::default()
            };
            async move {
                let r = c.ensure_image(req).await.map_err(|s| format!("{:?}: {}", s.code(), s.message()))?;
                match r.into_inner().result {
                    Some(imaged::api::proto::ensure_image_response::Result::Ok(_)) => Ok(()),
                    other => Err(format!("{other:?}")),
                }
            }
        })
        .await
    })
    .await;
    assert!(failed.is_empty(), "{failed:#?}");
    let most = sampler.await.expect("sampler");
    eprintln!("api: {most} ensures at once");
    assert!(most > 0, "the calls waited on the pull");
    assert!(most <= MAX_STREAMS_PER_CONNECTION as usize, "{most} ensures in flight on one connection");
    let _ = stop.send(());
    let _ = stopping_tx.send(true);
}
