//! `imaged demo`: the main job, on the embedded runtime.
//!
//! It starts a [`Node`] (the same one `imaged run` serves) on the embedded
//! runtime with the demo's own registries ([`catalogue`]) and a simulated
//! disk smaller than those registries, serves the daemon's API on a
//! temporary socket (so `imagectl --socket …` works while it runs), and
//! replays a node workload ([`workload`]): pods arrive, their images are
//! ensured one container at a time as the kubelet does, containers are
//! created in the runtime once a pod's images are there (so GC sees them in
//! use) and removed when the pod completes or is replaced (one task per
//! pod, in `pods.rs`). A failing pod retries every second, as the kubelet's
//! pod worker resyncs, until the workload's horizon. What the node does is
//! counted from its events and a periodic poll (`observe.rs`); [`display`]
//! shows progress live; [`summary`] closes with what happened and what
//! imaged did better than the kubelet.
//!
//! Against another runtime, run the daemon there (`imaged run
//! --runtime-endpoint …`) and drive it with `imagectl` (`imagectl cri …` for
//! raw CRI calls).

pub mod catalogue;
pub mod display;
mod observe;
mod pods;
pub mod summary;
pub mod workload;

use std::io::{IsTerminal as _, Write};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::prelude::*;
use tokio::time::Instant;

use crate::actors::cri_gateway::CriGatewayActor;
use crate::config::{Config, DaemonSettings, RuntimeEndpoint, Sources};
use crate::connect::ConnectedRuntime;
use crate::embedded::EmbeddedRuntime;
use crate::error::AppError;
use crate::node::Node;
use observe::{Counter, Watch};
use summary::{RunFacts, Tally};
use workload::Workload;

/// The demo's settings, applied over the built-in defaults and the
/// configuration file/environment, under the command line's `--set`.
/// Durations are scaled down with the pull times (about 1:20).
pub const SETTINGS: &[(&str, &str)] = &[
    // Parallel pulls, as many nodes configure (the kubelet's maxParallelImagePulls).
    ("pull.serialize_image_pulls", "false"),
    ("pull.max_parallel_image_pulls", "4"),
    // A tight registry limit, as for a rate-limited registry (the kubelet's
    // default is 5 pulls/s, burst 10), waiting for a token instead of failing.
    ("pull.registry_pull_qps", "4"),
    ("pull.registry_burst", "8"),
    ("pull.throttle_mode", "wait"),
    ("pull.single_flight", "true"),
    // The kubelet's 10s..300s back-off, scaled.
    ("backoff.initial", "1s"),
    ("backoff.max", "8s"),
    // GC: thresholds a little below the kubelet's 85/80 so the run shows
    // whole collections; ages and periods scaled.
    ("gc.image_gc_high_threshold_percent", "80"),
    ("gc.image_gc_low_threshold_percent", "65"),
    ("gc.image_minimum_gc_age", "2s"),
    ("gc.detect_period", "500ms"),
    ("gc.gc_period", "1s"),
    ("gc.cache_refresh_period", "2s"),
    // Quiet logs: the screen is the display (RUST_LOG still wins).
    ("log.filter", "error"),
];

/// How long a failing pod waits before its next attempt (the kubelet's pod
/// worker resync, scaled).
const RETRY: Duration = Duration::from_secs(1);
/// How often the display and the counters are refreshed.
const TICK: Duration = Duration::from_millis(150);
/// The run ends at the latest this long after the workload's horizon.
const GRACE: Duration = Duration::from_secs(15);
/// The private registry's password (made up; it never leaves the process).
const PRIVATE_PASSWORD: &str = "demo-billing-token";

/// `sources` with the demo's settings put before the command line's
/// overrides. A `--set` without `=` is refused here, numbered as the
/// operator gave it (the demo's own settings would shift the number).
pub fn sources(mut sources: Sources) -> Result<Sources, crate::config::ConfigError> {
    if let Some(bad) = sources.overrides.iter().position(|o| !o.contains('=')) {
        return Err(crate::config::ConfigError::BadOverride(bad + 1));
    }
    let mut overrides: Vec<String> = SETTINGS.iter().map(|(k, v)| format!("{k}={v}")).collect();
    overrides.append(&mut sources.overrides);
    sources.overrides = overrides;
    Ok(sources)
}

/// Options of the main job.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    /// Seed of the workload.
    pub seed: u64,
    /// Serve the API on a temporary socket while the demo runs.
    pub serve_api: bool,
}

impl Default for DemoOptions {
    fn default() -> Self {
        Self { seed: workload::DEFAULT_SEED, serve_api: true }
    }
}

type Shared = Arc<Mutex<Tally>>;

fn tally(t: &Shared) -> std::sync::MutexGuard<'_, Tally> {
    t.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Starts the embedded runtime with the demo's registries and disk, and
/// connects a gateway to it.
async fn embedded_runtime(cfg: &Config, dir: &std::path::Path) -> Result<ConnectedRuntime, AppError> {
    let socket = match &cfg.endpoint {
        RuntimeEndpoint::Embedded { socket } => socket.clone().unwrap_or_else(|| dir.join("embedded-cri.sock")),
        RuntimeEndpoint::Cri(e) => {
            return Err(AppError::Usage(format!(
                "the demo runs on the embedded runtime, but runtime.endpoint is {e}; \
                 against that runtime run `imaged run` and drive it with `imagectl` (`imagectl cri` for raw CRI calls)"
            )));
        }
    };
    let rt = match &cfg.embedded_state_dir {
        Some(state) => EmbeddedRuntime::start_persistent(socket, state)?,
        None => EmbeddedRuntime::start(socket)?,
    };
    for img in catalogue::remote_images(PRIVATE_PASSWORD) {
        rt.add_remote(img).map_err(|e| AppError::cri("loading the demo's registries", e))?;
    }
    rt.set_capacity(catalogue::DISK_BYTES);
    // Every node has its sandbox image.
    let pause = catalogue::size_of(catalogue::PAUSE).unwrap_or(0);
    rt.preload(crate::embedded::RemoteImage::new(catalogue::PAUSE, pause))
        .map_err(|e| AppError::cri("preloading the sandbox image", e))?;
    let endpoint = rt.endpoint();
    let (gateway, version) = CriGatewayActor::connect(&endpoint, &cfg.cri)
        .await
        .map_err(|e| AppError::cri(format!("connecting to the embedded runtime at {endpoint}"), e))?;
    Ok(ConnectedRuntime { gateway, version, endpoint, embedded: Some(rt) })
}

/// A fresh private directory for the run's sockets; removed on drop.
struct RunDir(PathBuf);

impl RunDir {
    fn create() -> Result<Self, AppError> {
        let dir = std::env::temp_dir().join(format!("imaged-demo-{}", std::process::id()));
        std::fs::create_dir_all(&dir)
            .map_err(|e| AppError::Other(format!("creating the demo's directory {}: {e}", dir.display())))?;
        Ok(Self(dir))
    }
}

impl Drop for RunDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn io(e: std::io::Error) -> AppError {
    AppError::Other(format!("writing output: {e}"))
}

/// Runs the main job, printing to stdout (redrawn when it is a terminal).
/// Returns the final tally.
pub async fn run_main_job(cfg: Config, opts: &DemoOptions) -> Result<Tally, AppError> {
    let stdout = std::io::stdout();
    let terminal = stdout.is_terminal();
    run_main_job_on(cfg, opts, stdout.lock(), terminal).await
}

/// [`run_main_job`] writing to `out`.
pub async fn run_main_job_on(
    cfg: Config,
    opts: &DemoOptions,
    out: impl Write,
    terminal: bool,
) -> Result<Tally, AppError> {
    let dir = RunDir::create()?;
    let workload = Workload::generate(opts.seed);
    let runtime = embedded_runtime(&cfg, &dir.0).await?;
    let facts_qps = (cfg.pull.qps, cfg.pull.burst);
    let mut daemon = cfg.daemon.clone();
    daemon.socket = dir.0.join("imaged.sock");
    let node = Arc::new(Node::start_on(cfg, runtime).await?);
    let shared: Shared = Arc::new(Mutex::new(Tally { pods_total: workload.pods.len(), ..Tally::default() }));
    let counter = Counter::new(shared.clone()).start();
    node.subscribe_events(counter.clone().recipient());
    node.subscribe_phases(counter.recipient()).await.map_err(|e| AppError::Other(e.to_string()))?;

    let mut display = display::Display::new(out, terminal);
    write_header(display.out(), &workload, &node)?;
    // The daemon's API on a temporary socket, for imagectl in another terminal.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let server = if opts.serve_api { Some(serve_api(&node, &daemon, stop_rx, display.out()).await?) } else { None };
    writeln!(display.out()).map_err(io)?;

    let start = Instant::now();
    let secret = pods::billing_secret();
    for pod in &workload.pods {
        actix::spawn(pods::drive_pod(
            node.clone(),
            pod.clone(),
            secret.clone(),
            shared.clone(),
            start,
            workload.horizon,
        ));
    }
    let mut watch = Watch::default();
    let interrupted = follow(&node, &shared, &mut watch, &mut display, start, start + workload.horizon + GRACE).await?;
    let elapsed = start.elapsed();
    // The last GC report and runtime counters.
    watch.poll(&node, &shared).await;
    let final_tally = tally(&shared).clone();
    let facts = RunFacts { seed: workload.seed, elapsed, qps: facts_qps.0, burst: facts_qps.1 };
    write_summary(&mut display, &final_tally, &facts, interrupted)?;

    let _ = stop_tx.send(true);
    node.shutdown(Duration::from_secs(2)).await;
    if let Some(server) = server {
        // A server that does not end in time, or whose task failed, does not
        // change what the run did.
        if let Ok(Ok(r)) = tokio::time::timeout(Duration::from_secs(3), server).await {
            r?;
        }
    }
    Ok(final_tally)
}

/// The run's opening lines: the node, the registries and disk, the workload.
fn write_header(o: &mut impl Write, workload: &Workload, node: &Node) -> Result<(), AppError> {
    let rt = node.runtime();
    writeln!(
        o,
        "imaged demo: {} pods over {} images on {} {} (a simulated node; pull times scaled about 1:20)",
        workload.pods.len(),
        workload.images().len(),
        rt.version.runtime_name,
        rt.version.runtime_version
    )
    .map_err(io)?;
    writeln!(
        o,
        "  registries: {} images (2 private, 2 on a slow host); disk {}; GC at {}% down to {}%, min age {}",
        catalogue::IMAGES.len(),
        summary::bytes(catalogue::DISK_BYTES),
        node.config().gc.high_threshold_percent,
        node.config().gc.low_threshold_percent,
        crate::domain::go_text::duration(node.config().gc.min_age)
    )
    .map_err(io)?;

    let count = |k| workload.pods.iter().filter(|p| p.kind == k).count();
    writeln!(
        o,
        "  workload: {} DaemonSet pods at boot, {} replicas (scale-outs with a shared mesh sidecar, an autoscaler, \
         3 rollouts), {} batch-job pods; billing pods with and without their pull secret; a crash-looping pod \
         whose image does not exist",
        count(workload::PodKind::DaemonSet),
        count(workload::PodKind::Replica),
        count(workload::PodKind::Job)
    )
    .map_err(io)
}

/// Serves the daemon's API on `daemon.socket` until `stop` turns true, and
/// says so on `o`.
async fn serve_api(
    node: &Arc<Node>,
    daemon: &DaemonSettings,
    stop: tokio::sync::watch::Receiver<bool>,
    o: &mut impl Write,
) -> Result<tokio::task::JoinHandle<Result<(), AppError>>, AppError> {
    let socket = crate::api::server::ApiSocket::bind(daemon).await?;
    writeln!(
        o,
        "  while it runs, from another terminal: imagectl --socket {} status   (or: images, events --follow)",
        socket.path().display()
    )
    .map_err(io)?;
    let service = crate::api::ImagedService::start(node.clone(), stop.clone())
        .await
        .map_err(|e| AppError::Other(e.to_string()))?;
    let mut stop = stop;
    Ok(actix::spawn(socket.serve(service, daemon.max_request_bytes, async move {
        let _ = stop.wait_for(|s| *s).await;
    })))
}

/// Refreshes the tally and the display every [`TICK`] until every pod has
/// settled, `give_up` passes or Ctrl-C; returns whether Ctrl-C ended it.
async fn follow<W: Write>(
    node: &Node,
    shared: &Shared,
    watch: &mut Watch,
    display: &mut display::Display<W>,
    start: Instant,
    give_up: Instant,
) -> Result<bool, AppError> {
    let mut tick = tokio::time::interval(TICK);
    // Ctrl-C ends the run early, with the summary so far.
    let interrupt = tokio::signal::ctrl_c();
    tokio::pin!(interrupt);
    let mut interrupted = false;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = &mut interrupt => interrupted = true,
        }
        watch.poll(node, shared).await;
        let t = tally(shared).clone();
        display.update(&t, start.elapsed()).map_err(io)?;
        if interrupted || t.pods_settled >= t.pods_total || Instant::now() >= give_up {
            return Ok(interrupted);
        }
    }
}

/// The display's last frame, the summary, and a note when pods were still
/// in progress.
fn write_summary<W: Write>(
    display: &mut display::Display<W>,
    t: &Tally,
    facts: &RunFacts,
    interrupted: bool,
) -> Result<(), AppError> {
    display.finish(t, facts.elapsed).map_err(io)?;
    write!(display.out(), "{}", summary::render(t, facts)).map_err(io)?;
    if t.pods_settled < t.pods_total {
        writeln!(
            display.out(),
            "  (the run was {} at {:.0} s: {} pods were still in progress)",
            if interrupted { "interrupted" } else { "cut" },
            facts.elapsed.as_secs_f64(),
            t.pods_total - t.pods_settled
        )
        .map_err(io)?;
    }
    display.out().flush().map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_demo_settings_come_before_the_command_line() {
        let s = sources(Sources { overrides: vec!["gc.gc_period=5s".into()], ..Sources::default() }).expect("valid");
        assert_eq!(s.overrides.len(), SETTINGS.len() + 1);
        assert_eq!(s.overrides.last().map(String::as_str), Some("gc.gc_period=5s"));
        let cfg = Config::load(&s).expect("the demo's settings are valid");
        assert_eq!(cfg.gc.gc_period, Duration::from_secs(5), "the command line wins");
        assert_eq!(cfg.gc.min_age, Duration::from_secs(2));
    }

    #[test]
    fn a_set_without_equals_is_numbered_as_the_operator_gave_it() {
        let given = Sources { overrides: vec!["gc.gc_period=5s".into(), "oops".into()], ..Sources::default() };
        let err = sources(given).expect_err("no =").to_string();
        assert!(err.contains("--set number 2 "), "{err}");
    }
}
