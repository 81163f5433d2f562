//! A burst against the daemon: `imaged run` (this build's binary) on its
//! in-process embedded runtime, and N concurrent `EnsureImage` calls over
//! its API socket, every one in flight at once. Prints:
//!
//! - `load_answered`: calls that got an API answer (a result, ok or failed);
//! - `load_ok`: answers that are the image (`EnsureOk`);
//! - `load_spurious`: answers that are not what the images call for — an
//!   API error or any failure (every image is pullable, so none may fail);
//! - `load_p99_ms`, `load_p50_ms`, `load_wall_ms`: latency of the calls and
//!   the burst's wall time;
//! - `load_runtime_pulls`, `load_runtime_status_calls`: `PullImage` and
//!   `ImageStatus` calls the runtime served;
//! - `load_idle_rss_mb`: the daemon's RSS before the burst;
//! - `load_peak_rss_mb`: the daemon's peak RSS (VmHWM in /proc/<pid>/status).
//!
//! Environment: `LOAD_N` (calls, 10000), `LOAD_CHANNELS` (client connections,
//! 8; calls are spread over them round-robin, all sent at once), `LOAD_MODE`
//! (`serial` or `parallel` pulls, serial), `LOAD_RUNS` (bursts, each against
//! a fresh daemon and runtime, 1), `LOAD_PULL_MS` (how long a pull takes, 20),
//! `LOAD_TARGET` (`api`, or `cri`: the same burst as kubelets send it to
//! the CRI front, `ImageStatus` then `PullImage` when absent; a CRI error is
//! then spurious), `LOAD_WRAP` (a command to run the daemon under, e.g. `heaptrack -o FILE`;
//! the RSS figures are then the wrapper's).
//!
//! The runtime: an embedded runtime served by this process (as `imaged
//! embedded-runtime` serves one) with 50 images, all absent at the start;
//! the daemon's RSS is the daemon's alone, as against containerd. Call `i`
//! asks for image `i % 50` (pull policy IfNotPresent, no registry limit:
//! `pull.registry_pull_qps = 0`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::pedantic)] // bench code: a failed unwrap is a failed bench

use std::collections::BTreeMap;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use imaged::api::ImagedClient;
use imaged::api::proto;
use imaged::embedded::{EmbeddedRuntime, RemoteImage};
use tonic::transport::Channel;

#[path = "common/mem.rs"]
mod mem;

/// Distinct images the calls ask for.
const IMAGES: usize = 50;

fn image(i: usize) -> String {
    format!("registry.example.com/load/app-{}:v1", i % IMAGES)
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// `kB` value of `field` in /proc/<pid>/status, in MB (10^6 bytes).
fn proc_status_mb(pid: u32, field: &str) -> f64 {
    let kb = mem::status_kib(Some(pid), field).expect("the field in /proc/<pid>/status");
    kb as f64 * 1024.0 / 1e6
}

struct Daemon {
    child: Child,
    _dir: tempfile::TempDir,
    socket: PathBuf,
    /// The CRI front's socket (served in every run; used with `LOAD_TARGET=cri`).
    front: PathBuf,
    _runtime: EmbeddedRuntime,
}

impl Daemon {
    fn start(mode: &str, pull: Duration) -> Daemon {
        // Short path: unix socket paths are limited to ~100 bytes.
        let dir = tempfile::Builder::new().prefix("imload").tempdir_in("/tmp").expect("tempdir");
        let socket = dir.path().join("api.sock");
        let front = dir.path().join("front.sock");
        let runtime = EmbeddedRuntime::start(dir.path().join("cri.sock")).expect("embedded runtime");
        for i in 0..IMAGES {
            runtime.add_remote(RemoteImage::new(image(i), 2_000_000).latency(pull)).expect("catalogue");
        }
        let serial = if mode == "parallel" { "false" } else { "true" };
        let log = std::fs::File::create(dir.path().join("imaged.log")).expect("log file");
        // `LOAD_WRAP="heaptrack -o /tmp/imaged"`: the daemon under a profiler
        // (the RSS figures are then the wrapper's).
        let wrap: Vec<String> =
            std::env::var("LOAD_WRAP").unwrap_or_default().split_whitespace().map(String::from).collect();
        let mut command = match wrap.split_first() {
            Some((program, args)) => {
                let mut c = Command::new(program);
                c.args(args).arg(env!("CARGO_BIN_EXE_imaged"));
                c
            }
            None => Command::new(env!("CARGO_BIN_EXE_imaged")),
        };
        let child = command
            .env("RUST_LOG", std::env::var("LOAD_RUST_LOG").unwrap_or_else(|_| "warn".into()))
            .args(["--set", &format!("daemon.socket={}", socket.display())])
            .args(["--set", &format!("runtime.endpoint=unix://{}", dir.path().join("cri.sock").display())])
            .args(["--set", "daemon.metrics_address="])
            .args(["--set", &format!("cri_server.socket={}", front.display())])
            // Its own durable state (the default is the machine's one).
            .args(["--set", &format!("state.dir={}", dir.path().join("state").display())])
            .args(["--set", &format!("pull.serialize_image_pulls={serial}")])
            .args(["--set", "pull.registry_pull_qps=0"])
            .arg("run")
            // A group of its own: stopping it reaches a wrapper's child too.
            .process_group(0)
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .expect("spawn imaged run");
        let mut d = Daemon { child, _dir: dir, socket, front, _runtime: runtime };
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::os::unix::net::UnixStream::connect(&d.socket).is_err()
            || std::os::unix::net::UnixStream::connect(&d.front).is_err()
        {
            assert!(d.child.try_wait().expect("wait").is_none(), "imaged exited: {}", d.log());
            assert!(Instant::now() < deadline, "imaged did not serve within 30 s: {}", d.log());
            std::thread::sleep(Duration::from_millis(20));
        }
        d
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self._dir.path().join("imaged.log")).unwrap_or_default()
    }

    fn stop(mut self) {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.child.id()).expect("pid"));
        let _ = nix::sys::signal::killpg(pid, nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.child.try_wait().expect("wait").is_none() {
            if Instant::now() > deadline {
                let _ = nix::sys::signal::killpg(pid, nix::sys::signal::Signal::SIGKILL);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn request(i: usize) -> proto::EnsureImageRequest {
    proto::EnsureImageRequest {
        pod: Some(proto::Pod {
            uid: format!("uid-{i}"),
            namespace: "load".into(),
            name: format!("pod-{i}"),
            ..Default::default()
        }),
        container: "main".into(),
        image: image(i),
        pull_policy: "IfNotPresent".into(),
        ..Default::default()
    }
}

fn client(socket: &Path) -> ImagedClient<Channel> {
    imaged::api::client(socket).expect("client")
}

struct Burst {
    answered: usize,
    ok: usize,
    /// Message → count of the answers that are not the image.
    spurious: BTreeMap<String, usize>,
    latencies: Vec<Duration>,
    wall: Duration,
}

async fn burst(socket: &Path, n: usize, channels: usize) -> Burst {
    let clients: Vec<ImagedClient<Channel>> = (0..channels.max(1)).map(|_| client(socket)).collect();
    // Connect every channel first, so the burst measures calls, not connects.
    for c in &clients {
        c.clone().get_status(proto::GetStatusRequest {}).await.expect("status");
    }
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..n {
        let mut c = clients[i % clients.len()].clone();
        let req = request(i);
        tasks.spawn(async move {
            let t = Instant::now();
            let r = c.ensure_image(req).await;
            (t.elapsed(), r)
        });
    }
    collect(tasks, n, started, |r, b| match r {
        Ok(resp) => {
            b.answered += 1;
            match resp.into_inner().result {
                Some(proto::ensure_image_response::Result::Ok(_)) => {
                    b.ok += 1;
                    None
                }
                Some(proto::ensure_image_response::Result::Failure(f)) => Some(format!("{}: {}", f.kind, f.message)),
                None => Some("an answer with no result".into()),
            }
        }
        Err(status) => Some(format!("API error {:?}: {}", status.code(), status.message())),
    })
    .await
}

/// Waits for every call of a burst begun at `started`; `classify` counts
/// one answer into the burst and says why it is spurious, if it is.
async fn collect<T: 'static>(
    mut tasks: tokio::task::JoinSet<(Duration, T)>,
    n: usize,
    started: Instant,
    classify: impl Fn(T, &mut Burst) -> Option<String>,
) -> Burst {
    let mut b =
        Burst { answered: 0, ok: 0, spurious: BTreeMap::new(), latencies: Vec::with_capacity(n), wall: Duration::ZERO };
    while let Some(joined) = tasks.join_next().await {
        let (took, r) = joined.expect("task");
        b.latencies.push(took);
        if let Some(m) = classify(r, &mut b) {
            let m: String = m.chars().take(160).collect();
            *b.spurious.entry(m).or_default() += 1;
        }
    }
    b.wall = started.elapsed();
    b.latencies.sort();
    b
}

/// `LOAD_TARGET=cri`: the burst as kubelets send it to the CRI front
/// (`imageServiceEndpoint` pointed at imaged): each call an `ImageStatus`,
/// then a `PullImage` when the image is absent. ok = the image's id.
async fn burst_cri(front: &Path, n: usize, channels: usize) -> Burst {
    use imaged::cri::CriEndpoint;
    use imaged::cri::proto::image_service_client::ImageServiceClient;
    use imaged::cri::proto::{ImageSpec, ImageStatusRequest, PullImageRequest};
    let endpoint = CriEndpoint::Unix(front.to_path_buf());
    let clients: Vec<ImageServiceClient<Channel>> = (0..channels.max(1))
        .map(|_| ImageServiceClient::new(endpoint.channel(Duration::from_secs(10)).expect("channel")))
        .collect();
    let spec = |i: usize| Some(ImageSpec { image: image(i), ..Default::default() });
    for c in &clients {
        c.clone().image_status(ImageStatusRequest { image: spec(0), verbose: false }).await.expect("connect");
    }
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..n {
        let mut c = clients[i % clients.len()].clone();
        tasks.spawn(async move {
            let t = Instant::now();
            let r: Result<String, tonic::Status> = async {
                let status = c.image_status(ImageStatusRequest { image: spec(i), verbose: false }).await?;
                match status.into_inner().image {
                    Some(found) => Ok(found.id),
                    None => Ok(c
                        .pull_image(PullImageRequest { image: spec(i), auth: None, sandbox_config: None })
                        .await?
                        .into_inner()
                        .image_ref),
                }
            }
            .await;
            (t.elapsed(), r)
        });
    }
    collect(tasks, n, started, |r, b| {
        b.answered += 1;
        match r {
            Ok(id) if !id.is_empty() => {
                b.ok += 1;
                None
            }
            Ok(_) => Some("an empty image id".to_string()),
            Err(status) => Some(format!("CRI error {:?}: {}", status.code(), status.message())),
        }
    })
    .await
}

fn pct(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i].as_secs_f64() * 1e3
}

fn main() {
    let n: usize = env_or("LOAD_N", 10_000);
    let channels: usize = env_or("LOAD_CHANNELS", 8);
    let runs: usize = env_or("LOAD_RUNS", 1);
    let mode = std::env::var("LOAD_MODE").unwrap_or_else(|_| "serial".into());
    let pull = Duration::from_millis(env_or("LOAD_PULL_MS", 20));
    let target = std::env::var("LOAD_TARGET").unwrap_or_else(|_| "api".into());
    assert!(target == "api" || target == "cri", "LOAD_TARGET is api or cri, not {target:?}");
    // The client gets its own threads, so the daemon is what is measured.
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    println!("load_requests: {n}");
    println!("load_channels: {channels}");
    println!("load_mode: {mode}");
    println!("load_target: {target}");
    for run in 0..runs {
        let daemon = Daemon::start(&mode, pull);
        let pid = daemon.child.id();
        let idle = proc_status_mb(pid, "VmRSS:");
        let b = if target == "cri" {
            rt.block_on(burst_cri(&daemon.front, n, channels))
        } else {
            rt.block_on(burst(&daemon.socket, n, channels))
        };
        let peak = proc_status_mb(pid, "VmHWM:");
        let suffix = if runs > 1 { format!("_run{run}") } else { String::new() };
        println!("load_answered{suffix}: {}", b.answered);
        println!("load_ok{suffix}: {}", b.ok);
        println!("load_spurious{suffix}: {}", b.spurious.values().sum::<usize>());
        for (m, count) in &b.spurious {
            println!("#   {count} x {m}");
        }
        println!("load_p50_ms{suffix}: {:.1}", pct(&b.latencies, 0.50));
        println!("load_p99_ms{suffix}: {:.1}", pct(&b.latencies, 0.99));
        println!("load_wall_ms{suffix}: {:.1}", b.wall.as_secs_f64() * 1e3);
        println!("load_runtime_pulls{suffix}: {}", daemon._runtime.stats().calls(imaged::cri::Rpc::PullImage));
        println!("load_runtime_status_calls{suffix}: {}", daemon._runtime.stats().calls(imaged::cri::Rpc::ImageStatus));
        println!("load_idle_rss_mb{suffix}: {idle:.1}");
        println!("load_peak_rss_mb{suffix}: {peak:.1}");
        if std::env::var("LOAD_SHOW_LOG").is_ok() {
            eprintln!("{}", daemon.log());
        }
        daemon.stop();
    }
}
