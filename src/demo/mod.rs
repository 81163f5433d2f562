//! `imaged demo`: the main job, on the embedded runtime.
//!
//! It starts a [`Node`] (the same one `imaged run` serves) on the embedded
//! runtime with the demo's own registries ([`catalogue`]) and a simulated
//! disk smaller than those registries, serves the daemon's API on a
//! temporary socket (so `imagectl --socket …` works while it runs), and
//! replays a node workload ([`workload`]): pods arrive, their images are
//! ensured one container at a time as the kubelet does, containers are
//! created in the runtime once a pod's images are there (so GC sees them in
//! use) and removed when the pod completes or is replaced. A failing pod
//! retries every second, as the kubelet's pod worker resyncs, until the
//! workload's horizon. [`display`] shows progress live; [`summary`] closes
//! with what happened and what imaged did better than the kubelet.
//!
//! Against another runtime, run the daemon there (`imaged run
//! --runtime-endpoint …`) and drive it with `imagectl` (`imagectl cri …` for
//! raw CRI calls).

pub mod catalogue;
pub mod display;
pub mod summary;
pub mod workload;

use std::collections::HashMap;
use std::io::{IsTerminal as _, Write};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::prelude::*;
use tokio::time::Instant;

use crate::actors::cri_gateway::CriGatewayActor;
use crate::actors::gc_executor::{GcReport, GetLastGcReport};
use crate::actors::pull_queue::{GetQueueStatus, PullPhase, PullPhaseChanged};
use crate::config::{Config, RuntimeEndpoint, Sources};
use crate::connect::ConnectedRuntime;
use crate::credentials::PullSecret;
use crate::cri::Rpc;
use crate::domain::{Container, ContainerState, ImageSpec};
use crate::embedded::EmbeddedRuntime;
use crate::ensure::EnsureImageRequest;
use crate::error::AppError;
use crate::events::{EventReason, ImageEvent};
use crate::node::Node;
use summary::{RunFacts, Tally};
use workload::{PodPlan, Workload};

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

/// `sources` with the demo's settings put before the command line's overrides.
pub fn sources(mut sources: Sources) -> Sources {
    let mut overrides: Vec<String> = SETTINGS.iter().map(|(k, v)| format!("{k}={v}")).collect();
    overrides.append(&mut sources.overrides);
    sources.overrides = overrides;
    sources
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
    t.lock().unwrap_or_else(|p| p.into_inner())
}

/// Counts events and pull phases into the tally.
struct Counter {
    tally: Shared,
    /// Images with a pull that has already been counted as throttled.
    throttled: HashMap<String, bool>,
}

impl Actor for Counter {
    type Context = Context<Self>;
    fn started(&mut self, ctx: &mut Self::Context) {
        // Publishers use try_send: a roomy mailbox so no count is lost.
        ctx.set_mailbox_capacity(1 << 16);
    }
}

impl Handler<ImageEvent> for Counter {
    type Result = ();
    fn handle(&mut self, e: ImageEvent, _: &mut Self::Context) {
        let mut t = tally(&self.tally);
        match e.reason {
            EventReason::Pulling => t.pull_requests += 1,
            EventReason::Failed => {
                t.failed_events += 1;
                if e.class == Some(crate::domain::ErrorClass::Permanent) {
                    t.failed_permanent += 1;
                }
            }
            EventReason::FreeDiskSpaceFailed => t.gc_runs_short += 1,
            _ => {}
        }
    }
}

impl Handler<PullPhaseChanged> for Counter {
    type Result = ();
    fn handle(&mut self, p: PullPhaseChanged, _: &mut Self::Context) {
        let mut t = tally(&self.tally);
        match p.phase {
            PullPhase::WaitingOnSharedPull => t.joins += 1,
            PullPhase::AlreadyPresent => t.present_at_turn += 1,
            // A pull may wait for several tokens in a row: count it once.
            PullPhase::Throttled => {
                let seen = self.throttled.entry(p.image).or_insert(false);
                if !*seen {
                    *seen = true;
                    t.throttled_pulls += 1;
                }
            }
            PullPhase::Pulling => {
                self.throttled.remove(&p.image);
            }
            _ => {}
        }
    }
}

/// The billing namespace's `regcred` secret for the private registry.
fn billing_secret() -> PullSecret {
    let json = format!(
        r#"{{"auths":{{"{}":{{"username":"{}","password":"{}"}}}}}}"#,
        catalogue::PRIVATE_HOST,
        catalogue::PRIVATE_USER,
        PRIVATE_PASSWORD
    );
    PullSecret::new("billing", "regcred", "kubernetes.io/dockerconfigjson")
        .with_uid("billing-regcred-uid")
        .with_data(".dockerconfigjson", json.into_bytes())
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
    let rt = EmbeddedRuntime::start(socket)?;
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
    let counter = Counter { tally: shared.clone(), throttled: HashMap::new() }.start();
    node.subscribe_events(counter.clone().recipient());
    node.subscribe_phases(counter.recipient()).await.map_err(|e| AppError::Other(e.to_string()))?;

    let mut display = display::Display::new(out, terminal);
    let o = display.out();
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
        humantime::format_duration(node.config().gc.min_age)
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
    .map_err(io)?;
    // The daemon's API on a temporary socket, for imagectl in another terminal.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let server = if opts.serve_api {
        let socket = crate::api::server::ApiSocket::bind(&daemon).await?;
        writeln!(
            o,
            "  while it runs, from another terminal: imagectl --socket {} status   (or: images, events --follow)",
            socket.path().display()
        )
        .map_err(io)?;
        let service = crate::api::ImagedService::start(node.clone(), stop_rx.clone())
            .await
            .map_err(|e| AppError::Other(e.to_string()))?;
        let mut stop = stop_rx.clone();
        Some(actix::spawn(socket.serve(service, daemon.max_request_bytes, async move {
            let _ = stop.wait_for(|s| *s).await;
        })))
    } else {
        None
    };
    writeln!(o).map_err(io)?;

    let start = Instant::now();
    let secret = billing_secret();
    for pod in &workload.pods {
        actix::spawn(drive_pod(node.clone(), pod.clone(), secret.clone(), shared.clone(), start, workload.horizon));
    }

    let mut watch = Watch::default();
    let mut tick = tokio::time::interval(TICK);
    let give_up = start + workload.horizon + GRACE;
    // Ctrl-C ends the run early, with the summary so far.
    let interrupt = tokio::signal::ctrl_c();
    tokio::pin!(interrupt);
    let mut interrupted = false;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = &mut interrupt => interrupted = true,
        }
        watch.poll(&node, &shared).await;
        let t = tally(&shared).clone();
        display.update(&t, start.elapsed()).map_err(io)?;
        if interrupted || t.pods_settled >= t.pods_total || Instant::now() >= give_up {
            break;
        }
    }
    let elapsed = start.elapsed();
    // The last GC report and runtime counters.
    watch.poll(&node, &shared).await;
    let final_tally = tally(&shared).clone();
    display.finish(&final_tally, elapsed).map_err(io)?;
    let facts = RunFacts { seed: workload.seed, elapsed, qps: facts_qps.0, burst: facts_qps.1 };
    write!(display.out(), "{}", summary::render(&final_tally, &facts)).map_err(io)?;
    if final_tally.pods_settled < final_tally.pods_total {
        writeln!(
            display.out(),
            "  (the run was {} at {:.0} s: {} pods were still in progress)",
            if interrupted { "interrupted" } else { "cut" },
            elapsed.as_secs_f64(),
            final_tally.pods_total - final_tally.pods_settled
        )
        .map_err(io)?;
    }
    display.out().flush().map_err(io)?;

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

/// What the periodic poll remembers between ticks.
#[derive(Default)]
struct Watch {
    last_gc: Option<Arc<GcReport>>,
    images: HashMap<String, u64>,
}

impl Watch {
    /// Reads the queue, the runtime's counters and image set, and the last GC report.
    async fn poll(&mut self, node: &Node, shared: &Shared) {
        let queue = node.queue().send(GetQueueStatus).await.ok();
        let last = node.gc().executor.send(GetLastGcReport).await.ok().flatten();
        let Some(rt) = node.runtime().embedded.as_ref() else { return };
        let stats = rt.stats();
        let now: HashMap<String, u64> = rt.images().into_iter().map(|i| (i.id, i.size)).collect();
        // Only GC removes images in the demo: what went is what GC freed.
        let gone: Vec<u64> = self.images.iter().filter(|(id, _)| !now.contains_key(*id)).map(|(_, s)| *s).collect();
        self.images = now;
        let mut t = tally(shared);
        if let Some(q) = queue {
            t.running = q.running;
            t.queued = q.queued;
            t.parked = q.parked;
        }
        t.cri_pulls = stats.calls(Rpc::PullImage);
        t.max_parallel_pulls = stats.max_pulls_in_flight;
        t.disk_capacity = rt.capacity_bytes();
        t.disk_used = rt.used_bytes();
        t.disk_peak = t.disk_peak.max(t.disk_used);
        t.gc_images_removed += gone.len() as u64;
        t.gc_bytes_freed += gone.iter().sum::<u64>();
        if let Some(r) = last
            && !self.last_gc.as_ref().is_some_and(|l| Arc::ptr_eq(l, &r))
        {
            t.gc_runs += 1;
            self.last_gc = Some(r);
        }
    }
}

/// A short reason for a pod that never started, from its last error (a
/// back-off message carries the error it backs off from).
fn why_not_started(kind: &str, message: &str) -> String {
    let cause = if message.contains("401 Unauthorized") {
        "unauthorized"
    } else if message.contains(": not found") {
        "image not found"
    } else if message.contains("no space left on device") {
        "disk full"
    } else {
        return kind.to_string();
    };
    format!("{kind} ({cause})")
}

/// What a pod does after an ensure.
enum Step {
    /// Ensure the next container's image.
    Next,
    /// Try again after [`RETRY`].
    Retry,
    /// Stop trying (horizon, deletion, or the node stopping).
    GiveUp,
}

/// One pod's life on the node: arrive, ensure its images container by
/// container (retrying every [`RETRY`] on failure until the horizon or its
/// deletion), create its containers, and remove them when it stops.
async fn drive_pod(
    node: Arc<Node>,
    pod: PodPlan,
    secret: PullSecret,
    shared: Shared,
    start: Instant,
    horizon: Duration,
) {
    tokio::time::sleep_until(start + pod.arrive).await;
    let give_up = start + pod.stop.map_or(horizon, |s| s.min(horizon));
    let mut next = 0;
    let mut refs: Vec<String> = Vec::new();
    let mut failing = false;
    while next < pod.containers.len() {
        let c = &pod.containers[next];
        let mut req = EnsureImageRequest::new(pod.uid.clone(), c.image.clone(), c.policy);
        req.pod.namespace = pod.namespace.clone();
        req.pod.name = pod.name.clone();
        req.pod.priority = pod.priority;
        req.container = Some(c.name.clone());
        if pod.pull_secret {
            req.pull_secrets = vec![secret.clone()];
        }
        let t0 = Instant::now();
        let result = node.ensure_image_exists(&req).await;
        let took = t0.elapsed();
        let step = {
            let mut t = tally(&shared);
            t.ensure_calls += 1;
            match result {
                Ok(Ok(ok)) => {
                    t.ensure_ok.push(took);
                    refs.push(ok.image_ref);
                    next += 1;
                    Step::Next
                }
                Ok(Err(e)) => {
                    *t.ensure_errors.entry(e.kind.to_string()).or_insert(0) += 1;
                    if e.message.contains("pull QPS exceeded") {
                        t.qps_exceeded += 1;
                    }
                    if !failing {
                        failing = true;
                        t.pods_failing += 1;
                    }
                    if Instant::now() + RETRY >= give_up {
                        t.pods_failing -= 1;
                        *t.never_started.entry(why_not_started(&e.kind.to_string(), &e.message)).or_insert(0) += 1;
                        t.pods_settled += 1;
                        Step::GiveUp
                    } else {
                        Step::Retry
                    }
                }
                // The node is stopping: the run is over.
                Err(_) => {
                    if failing {
                        t.pods_failing -= 1;
                    }
                    *t.never_started.entry("node stopping".into()).or_insert(0) += 1;
                    t.pods_settled += 1;
                    Step::GiveUp
                }
            }
        };
        match step {
            Step::Next => {}
            Step::Retry => tokio::time::sleep(RETRY).await,
            Step::GiveUp => return,
        }
    }
    let Some(rt) = node.runtime().embedded.as_ref() else {
        tally(&shared).pods_settled += 1;
        return;
    };
    let ids: Vec<String> = pod.containers.iter().map(|c| format!("{}-{}", pod.uid, c.name)).collect();
    for ((c, image_ref), id) in pod.containers.iter().zip(&refs).zip(&ids) {
        rt.add_container(Container {
            id: id.clone(),
            pod_sandbox_id: pod.uid.clone(),
            name: c.name.clone(),
            image: ImageSpec::new(c.image.clone()),
            image_ref: image_ref.clone(),
            image_id: image_ref.clone(),
            state: ContainerState::Running,
            ..Container::default()
        });
    }
    {
        let mut t = tally(&shared);
        t.pods_started += 1;
        if failing {
            t.pods_failing -= 1;
        }
        t.pods_settled += usize::from(pod.stop.is_none());
    }
    if let Some(stop) = pod.stop {
        tokio::time::sleep_until(start + stop).await;
        for id in &ids {
            rt.remove_container(id);
        }
        let mut t = tally(&shared);
        t.pods_stopped += 1;
        t.pods_settled += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pod_that_never_started_is_explained_by_its_last_error() {
        let backoff = "Back-off pulling image \"ghcr.io/acme/legacy-reporter:0.3.1\": ErrImagePull: failed to pull and \
                       unpack image \"ghcr.io/acme/legacy-reporter:0.3.1\": failed to resolve reference \
                       \"ghcr.io/acme/legacy-reporter:0.3.1\": ghcr.io/acme/legacy-reporter:0.3.1: not found";
        assert_eq!(why_not_started("ImagePullBackOff", backoff), "ImagePullBackOff (image not found)");
        let unauthorized = "failed to pull and unpack image \"x\": pulling from host h failed with status code \
                            [manifests 4.2.0]: 401 Unauthorized";
        assert_eq!(why_not_started("ErrImagePull", unauthorized), "ErrImagePull (unauthorized)");
        assert_eq!(why_not_started("ErrImagePull", "pull QPS exceeded"), "ErrImagePull");
    }

    #[test]
    fn the_demo_settings_come_before_the_command_line() {
        let s = sources(Sources { overrides: vec!["gc.gc_period=5s".into()], ..Sources::default() });
        assert_eq!(s.overrides.len(), SETTINGS.len() + 1);
        assert_eq!(s.overrides.last().map(String::as_str), Some("gc.gc_period=5s"));
        let cfg = Config::load(&s).expect("the demo's settings are valid");
        assert_eq!(cfg.gc.gc_period, Duration::from_secs(5), "the command line wins");
        assert_eq!(cfg.gc.min_age, Duration::from_secs(2));
    }
}
