//! The daemon's HTTP endpoints, served on a loopback TCP listener:
//!
//! - `GET /metrics`: every metric, in the OpenMetrics text format when the
//!   `Accept` header asks for it (as Prometheus does), in the classic
//!   Prometheus text format (`text/plain; version=0.0.4`) otherwise
//!   ([`Format::negotiate`]);
//! - `GET /healthz`: 200 while every component is alive, 503 naming each
//!   component that failed and why;
//! - `GET /readyz`: 200 once the runtime answered `Version` (the daemon
//!   calls [`Health::set_ready`]) and nothing failed; 503 before, while
//!   shutting down, when a component failed, or while the runtime is
//!   unreachable ([`Health::unreachable`]), one line per reason.
//!
//! [`Health`] is the cloneable handle the daemon and its supervisor drive.
//! [`serve_http`] takes the listener and a shutdown future, like the rest
//! of the crate's servers, so tests bind `127.0.0.1:0`.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tokio::net::TcpListener;

use crate::metrics::{Format, Metrics};

#[derive(Debug)]
struct HealthState {
    /// Set once the runtime answered `Version`; cleared on shutdown.
    ready: bool,
    /// Why the daemon is not ready (before it is ready: "starting").
    not_ready_reason: String,
    /// Failed components: name → reason.
    failed: BTreeMap<String, String>,
    /// Dependencies that cannot be reached (the CRI runtime): name → reason.
    /// Not ready while any is listed; liveness is unaffected.
    unreachable: BTreeMap<String, String>,
    /// Configuration keys a SIGHUP read that keep their old value until a
    /// restart (neither liveness nor readiness: the daemon runs as before).
    restart_pending: Vec<String>,
}

/// Liveness and readiness, shared by the daemon, its supervisor and the
/// HTTP endpoints. Cheap to clone. Starts alive and not ready ("starting").
#[derive(Debug, Clone)]
pub struct Health {
    state: Arc<Mutex<HealthState>>,
}

impl Default for Health {
    fn default() -> Self {
        Self::new()
    }
}

/// What [`Health::liveness`] or [`Health::readiness`] says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Alive (or ready).
    Ok,
    /// Not, with one line per reason.
    Failing(Vec<String>),
}

impl Health {
    /// Alive, not ready yet.
    pub fn new() -> Self {
        Self {
            state: Arc::new(Mutex::new(HealthState {
                ready: false,
                not_ready_reason: "starting: the runtime has not answered Version yet".into(),
                failed: BTreeMap::new(),
                unreachable: BTreeMap::new(),
                restart_pending: Vec::new(),
            })),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HealthState> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The runtime answered `Version`: ready to serve.
    pub fn set_ready(&self) {
        self.lock().ready = true;
    }

    /// Not ready any more (e.g. `"shutting down"`); liveness is unaffected.
    pub fn set_not_ready(&self, reason: impl Into<String>) {
        let mut s = self.lock();
        s.ready = false;
        s.not_ready_reason = reason.into();
    }

    /// `component` failed (an actor stopped, its restart budget ran out…):
    /// `/healthz` and `/readyz` answer 503 naming it until it recovers.
    pub fn component_failed(&self, component: impl Into<String>, reason: impl Into<String>) {
        let (component, reason) = (component.into(), reason.into());
        tracing::warn!(component = %component, reason = %reason, "component failed; health is red");
        self.lock().failed.insert(component, reason);
    }

    /// `component` works again (restarted).
    pub fn component_recovered(&self, component: &str) {
        if self.lock().failed.remove(component).is_some() {
            tracing::info!(component, "component recovered");
        }
    }

    /// `dependency` (e.g. `cri_runtime`) cannot be reached: `/readyz`
    /// answers 503 naming it and `reason` until [`reachable`](Self::reachable);
    /// `/healthz` is unaffected (the process is fine). Logged when it turns
    /// unreachable, not on every repeat.
    pub fn unreachable(&self, dependency: impl Into<String>, reason: impl Into<String>) {
        let (dependency, reason) = (dependency.into(), reason.into());
        let mut s = self.lock();
        if !s.unreachable.contains_key(&dependency) {
            tracing::warn!(dependency = %dependency, reason = %reason, "dependency unreachable; not ready");
        }
        s.unreachable.insert(dependency, reason);
    }

    /// `dependency` answers again.
    pub fn reachable(&self, dependency: &str) {
        if self.lock().unreachable.remove(dependency).is_some() {
            tracing::info!(dependency, "dependency reachable again");
        }
    }

    /// The changed configuration keys that wait for a restart (a SIGHUP's
    /// finding, replacing the last one's; empty: none).
    pub fn set_restart_pending(&self, keys: Vec<String>) {
        self.lock().restart_pending = keys;
    }

    /// What [`set_restart_pending`](Self::set_restart_pending) last said.
    pub fn restart_pending(&self) -> Vec<String> {
        self.lock().restart_pending.clone()
    }

    /// True while no component has failed.
    pub fn is_alive(&self) -> bool {
        self.lock().failed.is_empty()
    }

    /// True when ready and alive.
    pub fn is_ready(&self) -> bool {
        let s = self.lock();
        s.ready && s.failed.is_empty() && s.unreachable.is_empty()
    }

    /// Liveness, with a line per failed component.
    pub fn liveness(&self) -> Verdict {
        let s = self.lock();
        if s.failed.is_empty() {
            Verdict::Ok
        } else {
            Verdict::Failing(s.failed.iter().map(|(c, r)| format!("{c}: {r}")).collect())
        }
    }

    /// Readiness: not ready (with the reason), and every failed component.
    pub fn readiness(&self) -> Verdict {
        let s = self.lock();
        let mut lines: Vec<String> = s.failed.iter().chain(&s.unreachable).map(|(c, r)| format!("{c}: {r}")).collect();
        if !s.ready {
            lines.insert(0, format!("not ready: {}", s.not_ready_reason));
        }
        if lines.is_empty() { Verdict::Ok } else { Verdict::Failing(lines) }
    }

    /// Marks `component` failed when `alive()` turns false, checking every
    /// `period` on a task of the current runtime (e.g. with
    /// `addr.connected()` for an actor that must never stop). Ends once it
    /// has reported the failure.
    pub fn watch(
        &self,
        component: impl Into<String>,
        period: Duration,
        alive: impl Fn() -> bool + Send + 'static,
    ) -> tokio::task::JoinHandle<()> {
        self.watch_all(period, vec![(component.into(), Box::new(alive))])
    }

    /// [`watch`](Self::watch) for several components on one task and one
    /// timer: every `period`, each `(name, alive)` still alive is checked,
    /// and one whose `alive()` turned false is marked failed (`"stopped"`)
    /// and no longer checked. Ends once every one has been reported. One
    /// wake-up a period for all of them, so an idle daemon sleeps.
    pub fn watch_all(&self, period: Duration, components: Vec<(String, AliveCheck)>) -> tokio::task::JoinHandle<()> {
        let health = self.clone();
        tokio::spawn(async move {
            let mut components = components;
            let mut every = tokio::time::interval(period);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            while !components.is_empty() {
                every.tick().await;
                components.retain(|(name, alive)| {
                    let up = alive();
                    if !up {
                        health.component_failed(name.clone(), "stopped");
                    }
                    up
                });
            }
        })
    }
}

/// Whether a watched component still runs (see [`Health::watch_all`]).
pub type AliveCheck = Box<dyn Fn() -> bool + Send + 'static>;

#[derive(Clone)]
struct AppState {
    metrics: Metrics,
    health: Health,
}

/// The router: `/metrics`, `/healthz`, `/readyz` (GET; other methods get 405).
pub fn router(metrics: Metrics, health: Health) -> Router {
    Router::new()
        .route("/metrics", get(metrics_handler))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(AppState { metrics, health })
}

/// What one client may hold of the HTTP listener.
///
/// Any local user or `hostNetwork` pod can reach the metrics port: without
/// these bounds, a thousand connections that send nothing would hold a
/// thousand of the daemon's descriptors for ever, and the CRI front and the
/// API socket, which share them, could no longer accept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HttpLimits {
    /// Connections served at once; one more is closed as soon as it is
    /// accepted (a scraper holds one).
    pub max_connections: usize,
    /// How long a connection may take to send a request's headers, counted
    /// from when the server waits for them: an idle keep-alive connection
    /// is closed after this too.
    pub header_read_timeout: Duration,
    /// How long shutdown waits for requests in progress.
    pub shutdown_grace: Duration,
}

impl Default for HttpLimits {
    fn default() -> Self {
        Self {
            max_connections: 64,
            header_read_timeout: Duration::from_secs(10),
            shutdown_grace: Duration::from_secs(5),
        }
    }
}

/// How long an accept loop rests after `accept` fails (out of descriptors:
/// `EMFILE`), rather than spinning on the error.
pub const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(100);

/// Serves [`router`] on `listener` until `shutdown` resolves, then lets
/// requests in progress finish, within [`HttpLimits::default`].
pub async fn serve_http(
    listener: TcpListener,
    metrics: Metrics,
    health: Health,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_http_with(HttpLimits::default(), listener, metrics, health, shutdown).await
}

/// [`serve_http`] within `limits`.
pub async fn serve_http_with(
    limits: HttpLimits,
    listener: TcpListener,
    metrics: Metrics,
    health: Health,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    use hyper_util::rt::{TokioIo, TokioTimer};
    use tower::ServiceExt as _;

    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, "serving /metrics, /healthz and /readyz");
    }
    let app = router(metrics, health);
    let permits = Arc::new(tokio::sync::Semaphore::new(limits.max_connections));
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder.timer(TokioTimer::new()).header_read_timeout(limits.header_read_timeout);
    let mut over_cap = Warned::default();
    let mut accept_failed = Warned::default();
    tokio::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            biased;
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    if accept_failed.first() {
                        tracing::warn!(error = %e, "metrics listener: accept failed; retrying");
                    }
                    tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                    continue;
                }
            },
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            if over_cap.first() {
                tracing::warn!(
                    max = limits.max_connections,
                    "metrics listener: connection limit reached; closing new connections until one ends"
                );
            }
            drop(stream);
            continue;
        };
        if permits.available_permits() > 0 {
            over_cap = Warned::default();
        }
        accept_failed = Warned::default();
        let app = app.clone();
        let service = hyper::service::service_fn(move |req| app.clone().oneshot(req));
        let conn = graceful.watch(builder.serve_connection(TokioIo::new(stream), service));
        tokio::spawn(async move {
            // A client that goes away mid-request is its own business.
            let _ = conn.await;
            drop(permit);
        });
    }
    drop(listener);
    // Idle connections close at once; requests in progress get the grace.
    let _ = tokio::time::timeout(limits.shutdown_grace, graceful.shutdown()).await;
    Ok(())
}

/// Logs a condition once per episode, not once per connection: `first`
/// is true once until the episode ends (a fresh `Warned`).
#[derive(Debug, Default)]
pub(crate) struct Warned(bool);

impl Warned {
    pub(crate) fn first(&mut self) -> bool {
        !std::mem::replace(&mut self.0, true)
    }
}

async fn metrics_handler(State(s): State<AppState>, headers: axum::http::HeaderMap) -> Response {
    // Several Accept headers count as one list, as HTTP says.
    let accept: Vec<&str> = headers.get_all(header::ACCEPT).iter().filter_map(|v| v.to_str().ok()).collect();
    let format = Format::negotiate((!accept.is_empty()).then(|| accept.join(",")).as_deref());
    ([(header::CONTENT_TYPE, format.content_type()), (header::VARY, "Accept")], s.metrics.encode_as(format))
        .into_response()
}

fn verdict_response(v: Verdict) -> Response {
    let text = [(header::CONTENT_TYPE, "text/plain; charset=utf-8")];
    match v {
        Verdict::Ok => (StatusCode::OK, text, "ok\n".to_string()).into_response(),
        Verdict::Failing(lines) => {
            let mut body = lines.join("\n");
            body.push('\n');
            (StatusCode::SERVICE_UNAVAILABLE, text, body).into_response()
        }
    }
}

async fn healthz(State(s): State<AppState>) -> Response {
    verdict_response(s.health.liveness())
}

async fn readyz(State(s): State<AppState>) -> Response {
    verdict_response(s.health.readiness())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_starts_alive_and_not_ready() {
        let h = Health::new();
        assert!(h.is_alive());
        assert!(!h.is_ready());
        assert_eq!(
            h.readiness(),
            Verdict::Failing(vec!["not ready: starting: the runtime has not answered Version yet".into()])
        );
        h.set_ready();
        assert_eq!(h.readiness(), Verdict::Ok);
    }

    #[test]
    fn a_failed_component_turns_both_red_until_it_recovers() {
        let h = Health::new();
        h.set_ready();
        h.component_failed("pull_queue", "restart budget exhausted (3 in 60s)");
        let want = vec!["pull_queue: restart budget exhausted (3 in 60s)".to_string()];
        assert_eq!(h.liveness(), Verdict::Failing(want.clone()));
        assert_eq!(h.readiness(), Verdict::Failing(want));
        h.component_recovered("pull_queue");
        assert_eq!(h.liveness(), Verdict::Ok);
        assert!(h.is_ready());
        h.set_not_ready("shutting down");
        assert_eq!(h.readiness(), Verdict::Failing(vec!["not ready: shutting down".into()]));
        assert!(h.is_alive());
    }

    #[tokio::test(start_paused = true)]
    async fn watch_reports_a_stopped_component() {
        let h = Health::new();
        let alive = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let flag = alive.clone();
        let task =
            h.watch("gc_executor", Duration::from_secs(1), move || flag.load(std::sync::atomic::Ordering::SeqCst));
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert!(h.is_alive());
        alive.store(false, std::sync::atomic::Ordering::SeqCst);
        task.await.expect("watch ends after reporting");
        assert_eq!(h.liveness(), Verdict::Failing(vec!["gc_executor: stopped".into()]));
    }

    #[tokio::test(start_paused = true)]
    async fn one_watch_reports_each_component_that_stops_within_a_period() {
        use std::sync::atomic::{AtomicBool, Ordering};
        let h = Health::new();
        let flags: Vec<Arc<AtomicBool>> = (0..3).map(|_| Arc::new(AtomicBool::new(true))).collect();
        let checks: Vec<(String, AliveCheck)> = ["cri_gateway", "pull_queue", "detector"]
            .iter()
            .zip(&flags)
            .map(|(name, f)| {
                let f = f.clone();
                ((*name).to_string(), Box::new(move || f.load(Ordering::SeqCst)) as AliveCheck)
            })
            .collect();
        let period = Duration::from_secs(5);
        let task = h.watch_all(period, checks);
        tokio::time::sleep(3 * period).await;
        assert!(h.is_alive());
        flags[1].store(false, Ordering::SeqCst);
        tokio::time::sleep(period).await;
        assert_eq!(h.liveness(), Verdict::Failing(vec!["pull_queue: stopped".into()]), "within one period");
        // Reported once, then no longer checked.
        h.component_recovered("pull_queue");
        tokio::time::sleep(2 * period).await;
        assert!(h.is_alive());
        assert!(!task.is_finished(), "the others are still watched");
        flags[0].store(false, Ordering::SeqCst);
        flags[2].store(false, Ordering::SeqCst);
        task.await.expect("the watch ends once every component is reported");
        assert_eq!(h.liveness(), Verdict::Failing(vec!["cri_gateway: stopped".into(), "detector: stopped".into()]));
    }
}
