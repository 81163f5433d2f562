//! `imaged run`: the supervised daemon. Starts a [`Node`] from the
//! configuration, serves the API on its unix socket, and handles signals:
//!
//! - SIGTERM / SIGINT: stop taking requests (new calls get `Unavailable`
//!   on the socket, which stays until the drain ends), let queued and
//!   running pulls finish for up to `daemon.shutdown_grace`,
//!   end event streams, remove the socket, exit 0. Durable state needs no
//!   flush: every store write is a committed transaction.
//! - SIGHUP: re-read the configuration from the same sources and apply the
//!   keys that are safe to change live (`log.filter`, the GC thresholds,
//!   ages, pinned images and retention); changed keys that need a restart
//!   are logged by name.
//!
//! A failure the daemon cannot serve through (the runtime unreachable at
//! start, the socket taken) ends the process with the exit code of
//! [`AppError`], for the service manager to restart it.

use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{info, warn};

use crate::api::ImagedService;
use crate::api::server::ApiSocket;
use crate::config::{Config, Loaded, Sources, changed_keys, same_meaning};
use crate::error::AppError;
use crate::http::Health;
use crate::metrics::Metrics;
use crate::node::Node;
use crate::telemetry::LogReload;

/// Makes any panic, on any thread or task, end the process (after logging
/// it) instead of leaving an actor or a connection task silently dead:
/// tokio catches task panics and actix does not restart a panicked actor,
/// so without this a daemon could go on half-alive. The service manager
/// (systemd `Restart=on-failure`, a DaemonSet) restarts the process; the
/// durable state is crash-safe. Release builds also set `panic = "abort"`.
pub fn abort_on_panic() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        tracing::error!(panic = %info, "imaged: a panic is a bug; aborting so the service manager restarts the process");
        default(info);
        std::process::abort();
    }));
}

/// Runs the daemon until SIGTERM/SIGINT. `sources` are re-read on SIGHUP.
///
/// The start and stop order below is the one docs/daemon.md ("Inside") and
/// actors.md ("The daemon") describe: keep them in step.
pub async fn run(loaded: Loaded, sources: Sources, log: Option<LogReload>) -> Result<(), AppError> {
    let running = loaded.effective.values();
    let cfg = loaded.config;
    abort_on_panic();
    raise_fd_limit();
    let mut signals = Signals::install()?;
    let daemon = cfg.daemon.clone();
    // One registry for every component (a loaded Config already shares one).
    let metrics = cfg.pull.metrics.clone();
    metrics.set_config_info(&cfg.info_labels());
    let health = Health::new();
    let (stop_tx, stop_rx) = watch::channel(false);
    // HTTP first, so /healthz answers (and /readyz says why not ready)
    // while the runtime is being waited for.
    let http = serve_http(daemon.metrics_address, &metrics, &health, &stop_rx).await?;
    health.set_not_ready("waiting for the CRI runtime to answer Version");
    // SIGTERM/SIGINT while waiting for the runtime: stop at once (exit 0).
    let Some(node) = start_node(cfg, &mut signals.term).await? else { return Ok(()) };
    health.set_ready();
    let watchers = watch_actors(&node, &health);
    let rt = node.runtime();
    info!(
        endpoint = %rt.endpoint,
        runtime = %rt.version.runtime_name,
        runtime_version = %rt.version.runtime_version,
        "connected to the CRI runtime"
    );

    // The kubelet's socket before the API's: once imagectl (or a test, or
    // a readiness check) can reach the API, the CRI socket is there too.
    let serving = async {
        let cri = serve_cri(&node, &stop_rx, &sources).await?;
        let socket = ApiSocket::bind(&daemon).await?;
        let service =
            ImagedService::start(node.clone(), stop_rx.clone()).await.map_err(|e| AppError::Other(e.to_string()))?;
        Ok::<_, AppError>((cri, socket, service))
    };
    let (cri, socket, service) = match serving.await {
        Ok(s) => s,
        Err(e) => {
            // Stopped, not dropped with the System: an actor not yet
            // started would start while the runtime is torn down (and
            // panic there, hiding this error).
            node.shutdown(Duration::ZERO).await;
            return Err(e);
        }
    };
    info!(socket = %socket.path().display(), "imaged API serving");
    let service = service.with_health(health.clone());
    let mut server_stop = stop_rx.clone();
    let server = socket.serve(service, daemon.max_request_bytes, async move {
        let _ = server_stop.wait_for(|s| *s).await;
    });
    tokio::pin!(server);

    let mut reload =
        Reload { filter: node.config().log.filter.clone(), sources: sources.clone(), running, health: health.clone() };
    let why = serve_until_stop_signal(server.as_mut(), &mut signals, &node, &mut reload, log.as_ref()).await?;
    info!(signal = why, grace = ?daemon.shutdown_grace, "shutting down: no new requests; waiting for pulls in flight");
    node.stop_accepting();
    health.set_not_ready("shutting down");
    // The actors are about to be stopped on purpose: not a failure.
    for w in watchers {
        w.abort();
    }
    // The API keeps serving (and its socket stays) while pulls drain: a new
    // call gets `Unavailable` "imaged is shutting down", not "no daemon".
    // A second SIGTERM or Ctrl-C: no more waiting for pulls.
    let hurry = async {
        tokio::select! {
            _ = signals.term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        warn!("second stop signal: no more waiting for pulls in flight");
    };
    let drain = node.shutdown_unless(daemon.shutdown_grace, hurry);
    let (report, served) = drain_while_serving(drain, server.as_mut()).await;
    let _ = stop_tx.send(true);
    if let Some(h) = http {
        let _ = tokio::time::timeout(Duration::from_secs(5), h).await;
    }
    // In-flight API calls finish; streams end on `stopping`.
    match served {
        Some(r) => r?,
        None => match tokio::time::timeout(Duration::from_secs(5), &mut server).await {
            Ok(r) => r?,
            Err(_) => warn!("API calls still open 5s after shutdown; closing"),
        },
    }
    if let Some(cri) = cri {
        match tokio::time::timeout(Duration::from_secs(5), cri).await {
            Ok(Ok(Err(e))) => warn!(error = %e, "the CRI server failed"),
            Ok(_) => {}
            Err(_) => warn!("CRI calls still open 5s after shutdown; closing"),
        }
    }
    // Records written since the drain's sync (pulls answered while the
    // servers closed) go on disk too.
    if let Err(e) = node.manager().pull_records().sync().await {
        warn!(error = %e, "could not sync the pull records at exit; the next start re-verifies those pulls");
    }
    info!(abandoned_pulls = report.abandoned_pulls, "imaged stopped");
    Ok(())
}

/// Runs `drain` (the node's shutdown) while `server` goes on accepting and
/// answering API calls, so the socket stays until the drain ends. Returns
/// the drain's result, and the server's if it ended meanwhile (it should
/// not: it ends when told to, after the drain).
async fn drain_while_serving<R>(
    drain: impl Future<Output = R>,
    mut server: Pin<&mut impl Future<Output = Result<(), AppError>>>,
) -> (R, Option<Result<(), AppError>>) {
    tokio::pin!(drain);
    tokio::select! {
        r = &mut drain => (r, None),
        served = server.as_mut() => {
            warn!("the API server stopped while pulls were draining");
            (drain.await, Some(served))
        }
    }
}

/// Serves the CRI front when `[cri_server] socket` is set, until `stop`.
async fn serve_cri(
    node: &Arc<Node>,
    stop: &watch::Receiver<bool>,
    sources: &Sources,
) -> Result<Option<tokio::task::JoinHandle<Result<(), AppError>>>, AppError> {
    let settings = &node.config().cri_server;
    let Some(path) = &settings.socket else { return Ok(None) };
    // Read once for both checks (an unreadable file was refused at load).
    let kubelet =
        sources.kubelet_config.as_deref().and_then(|f| crate::kubelet_config::KubeletImageFields::read(f).ok());
    if let Some(k) = &kubelet {
        warn_if_the_kubelet_bypasses_or_limits_pulls(k, path);
    }
    let cfg = node.config();
    for reason in
        crate::cri_front::fallback_warnings(settings, &cfg.verification, cfg.state_dir.is_none(), kubelet.as_ref())
    {
        warn!("{reason}");
    }
    let socket = match ApiSocket::inherited("CRI socket", crate::api::server::CRI_FD_NAME, path)? {
        Some(passed) => passed,
        None => ApiSocket::bind_at("CRI socket", path, settings.socket_group.as_deref()).await?,
    };
    let front = crate::cri_front::CriFront::over(node, settings).await?;
    info!(socket = %socket.path().display(), socket_activated = socket.is_inherited(),
        "CRI ImageService serving (the kubelet's imageServiceEndpoint)");
    let mut stop = stop.clone();
    Ok(Some(tokio::spawn(crate::cri_front::serve(socket, front, async move {
        let _ = stop.wait_for(|s| *s).await;
    }))))
}

/// With imaged in the kubelet's path: a kubelet whose `imageServiceEndpoint`
/// is not imaged's CRI socket bypasses imaged, and the kubelet's own serial
/// pulls and pull QPS would hold pulls back before imaged's queue sees them.
fn warn_if_the_kubelet_bypasses_or_limits_pulls(
    k: &crate::kubelet_config::KubeletImageFields,
    cri_socket: &std::path::Path,
) {
    let file = &k.file;
    let ours = format!("unix://{}", cri_socket.display());
    match k.image_service_endpoint.as_deref() {
        Some(e) if e == ours || e == cri_socket.to_string_lossy() => {}
        other => warn!(file = %file.display(), image_service_endpoint = other.unwrap_or(""), cri_socket = %ours,
            "the kubelet's imageServiceEndpoint is not imaged's CRI socket: its image calls bypass imaged"),
    }
    // The kubelet's defaulting: unset, pulls are serial unless
    // maxParallelImagePulls is 2 or more.
    if k.serialize_image_pulls.unwrap_or_else(|| k.max_parallel_image_pulls.is_none_or(|n| n < 2)) {
        warn!(file = %file.display(), "the kubelet serializes its image pulls (serializeImagePulls is not false): \
            they reach imaged's CRI socket one at a time; set serializeImagePulls: false and let imaged's pull.* limits apply");
    }
    if k.registry_pull_qps.is_none_or(|q| q > 0.0) {
        warn!(file = %file.display(), "the kubelet throttles its image pulls (registryPullQPS is not 0): \
            set registryPullQPS: 0 and let imaged's pull.registry_pull_qps apply");
    }
}

/// The signals the daemon handles besides SIGINT (which comes through
/// `tokio::signal::ctrl_c`).
struct Signals {
    /// SIGTERM: stop.
    term: Signal,
    /// SIGHUP: reload.
    hup: Signal,
}

impl Signals {
    fn install() -> Result<Self, AppError> {
        let term = signal(SignalKind::terminate()).map_err(|e| AppError::Other(format!("SIGTERM handler: {e}")))?;
        let hup = signal(SignalKind::hangup()).map_err(|e| AppError::Other(format!("SIGHUP handler: {e}")))?;
        Ok(Self { term, hup })
    }
}

/// Raises the soft limit on open descriptors to the hard one, as Go
/// programs (containerd, the kubelet) do at start. systemd's default soft
/// limit is 1024: a busy node's connections (the kubelet's, imagectl's,
/// scrapers', the runtime's) and the state files share it, and the CRI
/// front cannot accept once it is reached. Children (credential plugins)
/// inherit the raised limit.
fn raise_fd_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < hard => match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            Ok(()) => info!(from = soft, to = hard, "raised the open-file limit"),
            Err(e) => warn!(soft, hard, error = %e, "cannot raise the open-file limit"),
        },
        Ok(_) => {}
        Err(e) => warn!(error = %e, "cannot read the open-file limit"),
    }
}

/// Serves `/metrics`, `/healthz` and `/readyz` on `address`, if set, until
/// `stop` turns true.
async fn serve_http(
    address: Option<SocketAddr>,
    metrics: &Metrics,
    health: &Health,
    stop: &watch::Receiver<bool>,
) -> Result<Option<JoinHandle<std::io::Result<()>>>, AppError> {
    let Some(addr) = address else { return Ok(None) };
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| AppError::Other(format!("daemon.metrics_address {addr}: cannot listen: {e}")))?;
    let mut stop = stop.clone();
    Ok(Some(tokio::spawn(crate::http::serve_http(listener, metrics.clone(), health.clone(), async move {
        let _ = stop.wait_for(|s| *s).await;
    }))))
}

/// Starts the node, waiting for the runtime; `None` when SIGTERM or SIGINT
/// came first (the daemon then stops at once, exit 0).
async fn start_node(cfg: Config, term: &mut Signal) -> Result<Option<Arc<Node>>, AppError> {
    tokio::select! {
        n = Node::start(cfg) => Ok(Some(Arc::new(n?))),
        _ = term.recv() => {
            info!(signal = "SIGTERM", "stopped while starting");
            Ok(None)
        }
        _ = tokio::signal::ctrl_c() => {
            info!(signal = "SIGINT", "stopped while starting");
            Ok(None)
        }
    }
}

/// Serves the API, reloading on SIGHUP, until SIGTERM or SIGINT (returned
/// by name). The server ending on its own is an error.
async fn serve_until_stop_signal(
    mut server: Pin<&mut impl Future<Output = Result<(), AppError>>>,
    signals: &mut Signals,
    node: &Node,
    reload: &mut Reload,
    log: Option<&LogReload>,
) -> Result<&'static str, AppError> {
    loop {
        tokio::select! {
            r = &mut server => {
                // The server ended on its own: an I/O failure on the socket.
                return r.and(Err(AppError::Other("API server stopped unexpectedly".into())));
            }
            _ = signals.term.recv() => return Ok("SIGTERM"),
            _ = tokio::signal::ctrl_c() => return Ok("SIGINT"),
            _ = signals.hup.recv() => reload.apply(node, log),
        }
    }
}

/// How often the daemon asks the runtime for `Version` to keep `/readyz`
/// true: every 5 s, the kubelet's own period for its runtime check
/// (`updateRuntimeUp`). Once a second, an idle daemon cost an idle
/// containerd about 2,000 wake-ups a minute (`real_idle_*` in
/// `benches/real.rs`).
pub const RUNTIME_PROBE_PERIOD: Duration = Duration::from_secs(5);
/// How often the daemon checks that every actor still runs (`/healthz`),
/// all on one task and timer, ticking with the runtime probe.
pub const ACTOR_CHECK_PERIOD: Duration = RUNTIME_PROBE_PERIOD;
/// How long a probe waits for the runtime's `Version` before calling it unreachable.
pub const RUNTIME_PROBE_DEADLINE: Duration = Duration::from_secs(2);
/// The shortest time between two probes when calls failing for an
/// unavailable runtime bring them forward.
pub const RUNTIME_PROBE_SPACING: Duration = Duration::from_secs(1);

/// Asks the runtime for `Version` through `gateway` every `period` (one
/// probe at a time, each bounded by [`RUNTIME_PROBE_DEADLINE`]), and at
/// once (at most every [`RUNTIME_PROBE_SPACING`]) when any call through
/// the gateway fails because the runtime is unavailable or succeeds after
/// such a failure: a failure or no answer makes `/readyz` answer 503 with
/// `cri_runtime: unreachable: <error>` until a probe succeeds again. On a
/// busy node an outage and its end show within about a second, on an idle
/// one within `period`; a call alone never changes readiness. Ends when the gateway stops (the actor watch
/// reports that) or when the caller aborts the task.
pub fn watch_runtime(
    gateway: actix::Addr<crate::actors::cri_gateway::CriGatewayActor>,
    health: Health,
    period: Duration,
) -> JoinHandle<()> {
    const DEPENDENCY: &str = "cri_runtime";
    tokio::spawn(async move {
        let Ok(reader) = gateway.send(crate::actors::cri_gateway::GetReader).await else { return };
        let mut every = tokio::time::interval(period);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last: Option<tokio::time::Instant> = None;
        loop {
            tokio::select! {
                _ = every.tick() => {}
                () = reader.runtime_changed() => {
                    if let Some(last) = last {
                        tokio::time::sleep_until(last + RUNTIME_PROBE_SPACING).await;
                    }
                }
            }
            last = Some(tokio::time::Instant::now());
            let probe = gateway.send(crate::actors::cri_gateway::GetVersion);
            match tokio::time::timeout(RUNTIME_PROBE_DEADLINE, probe).await {
                Ok(Ok(Ok(_))) => health.reachable(DEPENDENCY),
                Ok(Ok(Err(e))) => health.unreachable(DEPENDENCY, format!("unreachable: {e}")),
                Ok(Err(_)) => return,
                Err(_) => health.unreachable(
                    DEPENDENCY,
                    format!("unreachable: no Version answer within {}s", RUNTIME_PROBE_DEADLINE.as_secs()),
                ),
            }
            // The probe's own failure or success, and calls that ended
            // while it ran, are what it just found out.
            reader.forget_runtime_change();
        }
    })
}

/// Turns health red, naming the actor, if any actor stops while the daemon
/// runs (a panic aborts the process; this catches an actor that stopped
/// without one), and `/readyz` red while the runtime is unreachable
/// ([`watch_runtime`]). Returns the watchers, to end before a deliberate stop.
fn watch_actors(node: &Node, health: &Health) -> Vec<tokio::task::JoinHandle<()>> {
    let gateway = node.gateway().clone();
    let queue = node.queue().clone();
    let backoff = node.backoff().clone();
    let gc = node.gc().clone();
    let (detector, executor, refresher) = (gc.detector.clone(), gc.executor.clone(), gc.refresher.clone());
    let probed = gateway.clone();
    let actors: Vec<(String, crate::http::AliveCheck)> = vec![
        ("cri_gateway".into(), Box::new(move || gateway.connected())),
        ("pull_queue".into(), Box::new(move || queue.connected())),
        ("backoff_registry".into(), Box::new(move || backoff.connected())),
        ("detector".into(), Box::new(move || detector.connected())),
        ("gc_executor".into(), Box::new(move || executor.connected())),
        ("cache_refresher".into(), Box::new(move || refresher.connected())),
    ];
    vec![watch_runtime(probed, health.clone(), RUNTIME_PROBE_PERIOD), health.watch_all(ACTOR_CHECK_PERIOD, actors)]
}

/// What a SIGHUP compares a new configuration with.
struct Reload {
    /// Where the configuration comes from (the environment is read again).
    sources: Sources,
    /// The log filter in force (the process's; the node keeps the rest).
    filter: String,
    /// Every key's value as it runs: those loaded at start, with the live
    /// keys each reload applied.
    running: BTreeMap<String, toml::Value>,
    /// Where the keys waiting for a restart are shown (`imagectl status`).
    health: Health,
}

impl Reload {
    /// SIGHUP: reloads what is safe to change live; names the changed keys
    /// that keep their value until a restart.
    fn apply(&mut self, node: &Node, log: Option<&LogReload>) {
        let sources = Sources { env: Some(std::env::vars().collect()), ..self.sources.clone() };
        let (new, values) = match Config::load_full(&sources) {
            Ok(loaded) => {
                loaded.warn();
                let values = loaded.effective.values();
                (loaded.config, values)
            }
            Err(e) => {
                warn!(error = %e, "SIGHUP: configuration not reloaded; keeping the running one");
                return;
            }
        };
        let mut applied = Vec::new();
        if new.log.filter != self.filter {
            match log.map(|l| l.set_filter(&new.log.filter)) {
                Some(Ok(true)) => applied.push("log.filter"),
                Some(Ok(false)) => warn!("SIGHUP: log.filter not applied: RUST_LOG is set and takes precedence"),
                Some(Err(e)) => warn!(error = %e, "SIGHUP: log.filter not applied"),
                None => {}
            }
            // Asked for once: a later SIGHUP with the same filter says nothing.
            self.filter.clone_from(&new.log.filter);
        }
        let r = node.reload(&new);
        applied.extend(r.applied.iter().copied());
        info!(applied = ?applied, "SIGHUP: configuration reloaded");
        let changed = changed_keys(&self.running, &values);
        // A key written otherwise with the same meaning ("300s" for "5m")
        // changes nothing a restart would.
        let restart: Vec<String> = r
            .restart_keys(&changed)
            .into_iter()
            .filter(|k| !same_meaning(k, self.running.get(k), values.get(k)))
            .collect();
        for key in changed.iter().filter(|k| !restart.contains(k)) {
            match values.get(key) {
                Some(v) => self.running.insert(key.clone(), v.clone()),
                None => self.running.remove(key),
            };
        }
        // A difference no key shows (a configuration built in code) is
        // named by its section.
        let pending =
            if restart.is_empty() { r.needs_restart.iter().map(|s| (*s).to_string()).collect() } else { restart };
        if !pending.is_empty() {
            warn!(keys = ?pending, "SIGHUP: these changed settings take effect only after a restart");
        }
        node.config().pull.metrics.set_restart_pending(pending.len());
        self.health.set_restart_pending(pending);
    }
}
