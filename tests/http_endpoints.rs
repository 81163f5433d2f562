//! `/metrics`, `/healthz` and `/readyz` on a real loopback listener, read
//! with an HTTP client; the server stops when its shutdown future resolves.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::pedantic)] // test code: a failed unwrap is a failed test

use std::time::Duration;

use imaged::http::{Health, HttpLimits, serve_http, serve_http_with};
use imaged::metrics::{Metrics, OPENMETRICS_CONTENT_TYPE, PROMETHEUS_CONTENT_TYPE};
use imaged::testing::Scrape;
use tokio::net::TcpListener;
use tokio::sync::oneshot;

struct Server {
    base: String,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

async fn serve(metrics: Metrics, health: Health) -> Server {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (tx, rx) = oneshot::channel::<()>();
    let task = tokio::spawn(serve_http(listener, metrics, health, async move {
        let _ = rx.await;
    }));
    Server { base: format!("http://{addr}"), stop: Some(tx), task }
}

async fn serve_within(limits: HttpLimits) -> (Server, std::net::SocketAddr) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (tx, rx) = oneshot::channel::<()>();
    let health = Health::new();
    health.set_ready();
    let task = tokio::spawn(serve_http_with(limits, listener, Metrics::new(), health, async move {
        let _ = rx.await;
    }));
    (Server { base: format!("http://{addr}"), stop: Some(tx), task }, addr)
}

/// Reads until the server closes `conn` (or it resets): how long it took,
/// `None` when it stays open past `within`.
async fn closed_within(conn: &mut tokio::net::TcpStream, within: Duration) -> Option<Duration> {
    use tokio::io::AsyncReadExt;
    let start = std::time::Instant::now();
    let mut buf = [0u8; 1024];
    loop {
        match tokio::time::timeout(within.saturating_sub(start.elapsed()), conn.read(&mut buf)).await {
            Err(_) => return None,
            Ok(Ok(0) | Err(_)) => return Some(start.elapsed()),
            Ok(Ok(_)) => {}
        }
    }
}

/// What Prometheus 2.x sends when it scrapes (its default scrape protocols).
const PROMETHEUS_ACCEPT: &str = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";

impl Server {
    async fn get(&self, path: &str) -> (u16, String, String) {
        self.get_accepting(path, None).await
    }

    async fn get_accepting(&self, path: &str, accept: Option<&str>) -> (u16, String, String) {
        let mut req = reqwest::Client::new().get(format!("{}{path}", self.base));
        if let Some(a) = accept {
            req = req.header(reqwest::header::ACCEPT, a);
        }
        let resp = req.send().await.expect("request");
        let status = resp.status().as_u16();
        let ctype = resp
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        (status, ctype, resp.text().await.expect("body"))
    }

    async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        let ended = tokio::time::timeout(Duration::from_secs(10), self.task).await;
        assert!(matches!(ended, Ok(Ok(Ok(())))), "the server ends cleanly on shutdown: {ended:?}");
    }
}

#[tokio::test]
async fn metrics_are_served_in_the_text_format_with_values() {
    let metrics = Metrics::default();
    metrics.single_flight_joined();
    metrics.set_pull_queue(4, 0, 2);
    let server = serve(metrics.clone(), Health::new()).await;
    for accept in [None, Some(PROMETHEUS_ACCEPT)] {
        let (status, _, body) = server.get_accepting("/metrics", accept).await;
        assert_eq!(status, 200);
        let s = Scrape::parse(&body).expect("parses");
        assert_eq!(s.value("imaged_pull_single_flight_joins_total", &[]), Some(1.0), "{accept:?}");
        assert_eq!(s.value("imaged_pull_queue_depth", &[]), Some(4.0));
        assert_eq!(s.value("imaged_pulls_in_flight", &[]), Some(2.0));
    }
    // Live: a later change shows in the next scrape.
    metrics.single_flight_joined();
    let (_, _, body) = server.get("/metrics").await;
    assert_eq!(Scrape::parse(&body).expect("parses").value("imaged_pull_single_flight_joins_total", &[]), Some(2.0));
    server.stop().await;
}

/// A registry with a series in every family imaged exports.
fn every_family() -> Metrics {
    use imaged::cri::{CriError, Rpc};
    let m = Metrics::default();
    m.image_pulled(123_456_789, Duration::from_secs(3));
    m.image_garbage_collected("space", 1 << 20);
    drop(m.ensure_request(imaged::domain::pull_policy::PullPolicy::IfNotPresent));
    m.mustpull_check(imaged::domain::pull_record::MustPullResult::CredentialRecordFound);
    m.credential_plugin_ran("ecr-credential-provider", Duration::from_millis(40), true);
    m.set_credential_provider_config("sha256:ab");
    m.set_pull_queue(2, 1, 1);
    m.single_flight_joined();
    m.throttle_waited();
    m.throttle_rejected();
    m.slow_pull_blocking();
    m.set_backoff_entries(3);
    m.backoff_reset(imaged::metrics::BackoffResetReason::Cleared, 1);
    m.cri_call(Rpc::PullImage, Duration::from_millis(900), None);
    m.cri_call(Rpc::Version, Duration::from_millis(2), Some(&CriError::deadline_exceeded()));
    m.gc_run(true);
    m.store_recovered();
    m.set_config_info(&[
        ("runtime_endpoint", "unix:///run/containerd/containerd.sock".into()),
        ("odd", "a\"b\\c".into()),
    ]);
    m
}

/// The families of a text: (family name, type) in order, checking the
/// rules both formats share and those of `format`: every sample belongs to
/// the family declared last (its name, or its histogram suffixes; a
/// counter's `_total` in OpenMetrics), a family is declared once, `# HELP`
/// names it, and OpenMetrics ends with `# EOF` while the classic text has
/// no `# EOF`, `# UNIT` or `_created`.
fn check_format(text: &str, openmetrics: bool) -> Vec<(String, String)> {
    let mut families: Vec<(String, String)> = Vec::new();
    let lines: Vec<&str> = text.lines().collect();
    if openmetrics {
        assert_eq!(lines.last(), Some(&"# EOF"), "OpenMetrics ends with # EOF");
    } else {
        assert!(!text.contains("# EOF") && !text.contains("# UNIT") && !text.contains("_created"), "{text}");
    }
    for line in &lines[..lines.len() - usize::from(openmetrics)] {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, ty) = rest.split_once(' ').expect("TYPE name type");
            assert!(!families.iter().any(|(n, _)| n == name), "{name} declared twice");
            let types: &[&str] = if openmetrics {
                &["counter", "gauge", "histogram", "info", "summary", "unknown", "stateset", "gaugehistogram"]
            } else {
                &["counter", "gauge", "histogram", "summary", "untyped"]
            };
            assert!(types.contains(&ty), "{line}");
            if ty == "counter" {
                assert_eq!(name.ends_with("_total"), !openmetrics, "counter family names: {line}");
            }
            families.push((name.to_string(), ty.to_string()));
        } else if let Some(rest) = line.strip_prefix("# HELP ") {
            let name = rest.split(' ').next().expect("HELP name");
            assert!(!families.iter().any(|(n, _)| n == name), "HELP after TYPE for {name}");
        } else if line.starts_with('#') {
            assert!(openmetrics && line.starts_with("# UNIT "), "unexpected comment {line}");
        } else {
            let (family, ty) = families.last().unwrap_or_else(|| panic!("sample before any TYPE: {line}"));
            let name = line.split(['{', ' ']).next().expect("name");
            let suffix = name.strip_prefix(family.as_str()).unwrap_or_else(|| panic!("{name} outside {family}"));
            let allowed: &[&str] = match (ty.as_str(), openmetrics) {
                ("histogram", _) => &["_bucket", "_sum", "_count", "_created"],
                ("counter", true) => &["_total", "_created"],
                _ => &[""],
            };
            assert!(allowed.contains(&suffix), "{name} in {ty} {family}");
            Scrape::parse(line).unwrap_or_else(|e| panic!("{e}"));
        }
    }
    families
}

#[tokio::test]
async fn metrics_negotiate_openmetrics_or_the_classic_text_and_both_parse() {
    let server = serve(every_family(), Health::new()).await;
    // Prometheus asks for OpenMetrics first and gets it.
    let (status, ctype, openmetrics) = server.get_accepting("/metrics", Some(PROMETHEUS_ACCEPT)).await;
    assert_eq!((status, ctype.as_str()), (200, OPENMETRICS_CONTENT_TYPE));
    // No Accept header, */*, or the classic format asked for: the classic text.
    let (_, ctype, classic) = server.get("/metrics").await;
    assert_eq!(ctype, PROMETHEUS_CONTENT_TYPE);
    for accept in ["*/*", "text/plain;version=0.0.4", "application/openmetrics-text;q=0.2,text/plain;q=0.8"] {
        let (_, ctype, body) = server.get_accepting("/metrics", Some(accept)).await;
        assert_eq!(ctype, PROMETHEUS_CONTENT_TYPE, "{accept}");
        assert_eq!(check_format(&body, false).len(), check_format(&classic, false).len());
    }

    let om_families = check_format(&openmetrics, true);
    let classic_families = check_format(&classic, false);
    assert!(om_families.len() >= 20, "{om_families:?}");
    assert_eq!(om_families.len(), classic_families.len());
    for ((om, om_ty), (cl, cl_ty)) in om_families.iter().zip(&classic_families) {
        match om_ty.as_str() {
            "counter" => assert_eq!((cl.clone(), cl_ty.as_str()), (format!("{om}_total"), "counter")),
            _ => assert_eq!((cl, cl_ty), (om, om_ty)),
        }
    }
    // The same samples, but OpenMetrics' _created.
    let om = Scrape::parse(&openmetrics).expect("parses");
    let cl = Scrape::parse(&classic).expect("parses");
    let om_samples: Vec<_> = om.samples.iter().filter(|s| !s.name.ends_with("_created")).collect();
    assert_eq!(om_samples, cl.samples.iter().collect::<Vec<_>>());
    assert_eq!(cl.value("imaged_config_info", &[("odd", "a\"b\\c")]), Some(1.0));

    // promtool (Prometheus' own parser and linter) accepts the classic text.
    match promtool_check_metrics(&classic) {
        Some((ok, output)) => assert!(ok && output.trim().is_empty(), "promtool check metrics:\n{output}\n{classic}"),
        None => assert!(std::env::var_os("CI").is_none(), "promtool is required in CI (.ci/run installs it)"),
    }
    server.stop().await;
}

/// `promtool check metrics` on `text`: (passed, its output), or `None` when
/// promtool is not installed.
fn promtool_check_metrics(text: &str) -> Option<(bool, String)> {
    use std::io::Write;
    let mut child = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .ok()?;
    child.stdin.take().expect("stdin").write_all(text.as_bytes()).expect("write");
    let out = child.wait_with_output().expect("promtool");
    let mut output = String::from_utf8_lossy(&out.stdout).into_owned();
    output.push_str(&String::from_utf8_lossy(&out.stderr));
    Some((out.status.success(), output))
}

#[tokio::test]
async fn readyz_turns_green_once_ready_and_healthz_names_what_failed() {
    let health = Health::new();
    let server = serve(Metrics::default(), health.clone()).await;

    let (status, _, body) = server.get("/readyz").await;
    assert_eq!(status, 503);
    assert!(body.contains("not ready: starting"), "{body}");
    assert_eq!(server.get("/healthz").await.0, 200);

    health.set_ready();
    let (status, ctype, body) = server.get("/readyz").await;
    assert_eq!((status, body.as_str()), (200, "ok\n"));
    assert!(ctype.starts_with("text/plain"), "{ctype}");

    health.component_failed("cri_gateway", "stopped");
    let (status, _, body) = server.get("/healthz").await;
    assert_eq!((status, body.as_str()), (503, "cri_gateway: stopped\n"));
    let (status, _, body) = server.get("/readyz").await;
    assert_eq!((status, body.as_str()), (503, "cri_gateway: stopped\n"));

    health.component_recovered("cri_gateway");
    assert_eq!(server.get("/healthz").await.0, 200);
    health.set_not_ready("shutting down");
    let (status, _, body) = server.get("/readyz").await;
    assert_eq!((status, body.as_str()), (503, "not ready: shutting down\n"));
    server.stop().await;
}

#[tokio::test]
async fn unknown_paths_and_other_methods_are_refused() {
    let server = serve(Metrics::default(), Health::new()).await;
    assert_eq!(server.get("/nope").await.0, 404);
    let resp = reqwest::Client::new().post(format!("{}/metrics", server.base)).send().await.expect("request");
    assert_eq!(resp.status().as_u16(), 405);
    server.stop().await;
}

/// An embedded runtime in `dir`, a gateway connected to it, and a ready
/// `Health` served over HTTP (for a runtime watch to keep).
async fn runtime_watched(
    dir: &std::path::Path,
) -> (imaged::embedded::EmbeddedRuntime, actix::Addr<imaged::actors::cri_gateway::CriGatewayActor>, Health, Server) {
    use imaged::actors::cri_gateway::{CriGatewayActor, CriSettings};
    let runtime = imaged::embedded::EmbeddedRuntime::start_in(dir).expect("embedded runtime starts");
    let cfg = CriSettings { startup_timeout: Duration::from_secs(5), ..CriSettings::default() };
    let (gateway, _) = CriGatewayActor::connect(&runtime.endpoint(), &cfg).await.expect("gateway connects");
    let health = Health::new();
    health.set_ready();
    let server = serve(Metrics::default(), health.clone()).await;
    (runtime, gateway, health, server)
}

/// Polls `/readyz` until it answers `status` (bounded), returning the body.
async fn readyz_until(server: &Server, status: u16) -> String {
    let mut last = (0, String::new());
    for _ in 0..200 {
        let (s, _, body) = server.get("/readyz").await;
        if s == status {
            return body;
        }
        last = (s, body);
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("/readyz never answered {status}; last {last:?}");
}

#[actix::test]
async fn calls_finding_the_runtime_gone_and_back_bring_the_next_probe_forward() {
    use imaged::actors::cri_gateway::GetImageStatus;
    use imaged::domain::ImageSpec;

    let dir = tempfile::tempdir().expect("tempdir");
    let (mut runtime, gateway, health, server) = runtime_watched(dir.path()).await;
    // Probes once at start (green once it answered), then not for an hour:
    // only a failed call can bring the next one forward.
    health.unreachable("cri_runtime", "not probed yet");
    let probe = imaged::daemon::watch_runtime(gateway.clone(), health.clone(), Duration::from_secs(3600));
    readyz_until(&server, 200).await;

    runtime.stop();
    tokio::time::sleep(imaged::daemon::RUNTIME_PROBE_SPACING + Duration::from_millis(200)).await;
    let early = server.get("/readyz").await;
    assert_eq!(early.0, 200, "no call, no probe: the outage is not seen yet: {early:?}");
    let status = || GetImageStatus { image: ImageSpec::new("example.com/app:1"), verbose: false };
    let failed = gateway.send(status()).await.expect("gateway");
    assert!(failed.is_err(), "the runtime is down: {failed:?}");
    let body = readyz_until(&server, 503).await;
    assert!(body.contains("cri_runtime: unreachable"), "the probe it brought forward confirmed it: {body}");

    // Back: the first call that succeeds brings the next probe forward too.
    runtime.resume().expect("runtime resumes");
    tokio::time::sleep(imaged::daemon::RUNTIME_PROBE_SPACING + Duration::from_millis(200)).await;
    assert_eq!(server.get("/readyz").await.0, 503, "no call, no probe: the return is not seen yet");
    let mut answered = false;
    for _ in 0..100 {
        if gateway.send(status()).await.expect("gateway").is_ok() {
            answered = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(answered, "the runtime answers again");
    let body = readyz_until(&server, 200).await;
    assert!(!body.contains("cri_runtime"), "{body}");
    probe.abort();
    server.stop().await;
}

#[actix::test]
async fn readyz_says_the_runtime_is_unreachable_while_it_is_down_and_healthz_stays_green() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut runtime, gateway, health, server) = runtime_watched(dir.path()).await;
    let probe = imaged::daemon::watch_runtime(gateway, health.clone(), Duration::from_millis(50));
    let readyz_until = |status: u16| readyz_until(&server, status);
    readyz_until(200).await;

    runtime.stop();
    let body = readyz_until(503).await;
    assert!(body.contains("cri_runtime: unreachable"), "{body}");
    assert!(!body.contains("not ready: starting"), "the runtime is the reason: {body}");
    assert_eq!(server.get("/healthz").await.0, 200, "the process itself is fine");

    runtime.resume().expect("runtime resumes");
    let body = readyz_until(200).await;
    assert!(!body.contains("cri_runtime"), "{body}");
    probe.abort();
    server.stop().await;
}

#[tokio::test]
async fn a_connection_that_sends_nothing_is_closed_after_the_header_read_timeout() {
    let limits = HttpLimits { header_read_timeout: Duration::from_millis(300), ..HttpLimits::default() };
    let (server, addr) = serve_within(limits).await;
    let mut idle = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let took = closed_within(&mut idle, Duration::from_secs(10)).await.expect("the idle connection is closed");
    assert!(took >= Duration::from_millis(250), "not before the timeout: {took:?}");

    // A keep-alive connection that goes quiet after a request is closed too.
    use tokio::io::AsyncWriteExt;
    let mut kept = tokio::net::TcpStream::connect(addr).await.expect("connect");
    kept.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").await.expect("write");
    assert!(closed_within(&mut kept, Duration::from_secs(10)).await.is_some(), "the quiet keep-alive is closed");
    assert_eq!(server.get("/healthz").await.0, 200, "still serving");
    server.stop().await;
}

#[tokio::test]
async fn connections_past_the_limit_are_closed_and_the_served_ones_still_answer() {
    let limits =
        HttpLimits { max_connections: 3, header_read_timeout: Duration::from_secs(60), ..HttpLimits::default() };
    let (server, addr) = serve_within(limits).await;
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(tokio::net::TcpStream::connect(addr).await.expect("connect"));
    }
    // The server has taken all three (a served connection stays open).
    for c in &mut held {
        assert_eq!(closed_within(c, Duration::from_millis(200)).await, None, "a served connection stays open");
    }
    let mut over = tokio::net::TcpStream::connect(addr).await.expect("the kernel accepts it");
    assert!(closed_within(&mut over, Duration::from_secs(10)).await.is_some(), "one past the limit is closed at once");

    // One ends: its place is free for a scrape.
    held.pop();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let answered = tokio::time::timeout(
            Duration::from_secs(2),
            reqwest::Client::new().get(format!("{}/healthz", server.base)).send(),
        )
        .await;
        if matches!(&answered, Ok(Ok(r)) if r.status() == 200) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "a freed place serves a scrape: {answered:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Shutdown closes the idle ones and ends promptly.
    server.stop().await;
    for c in &mut held {
        assert!(closed_within(c, Duration::from_secs(5)).await.is_some(), "closed at shutdown");
    }
}
