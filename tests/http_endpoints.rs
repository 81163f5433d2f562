//! `/metrics`, `/healthz` and `/readyz` on a real loopback listener, read
//! with an HTTP client; the server stops when its shutdown future resolves.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::pedantic)] // test code: a failed unwrap is a failed test

use std::time::Duration;

use imaged::http::{Health, serve_http};
use imaged::metrics::{CONTENT_TYPE, Metrics};
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

impl Server {
    async fn get(&self, path: &str) -> (u16, String, String) {
        let resp = reqwest::get(format!("{}{path}", self.base)).await.expect("request");
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
    let (status, ctype, body) = server.get("/metrics").await;
    assert_eq!(status, 200);
    assert_eq!(ctype, CONTENT_TYPE);
    assert!(body.ends_with("# EOF\n"), "OpenMetrics text ends with # EOF");
    let s = Scrape::parse(&body).expect("parses");
    assert_eq!(s.value("imaged_pull_single_flight_joins_total", &[]), Some(1.0));
    assert_eq!(s.value("imaged_pull_queue_depth", &[]), Some(4.0));
    assert_eq!(s.value("imaged_pulls_in_flight", &[]), Some(2.0));
    // Live: a later change shows in the next scrape.
    metrics.single_flight_joined();
    let (_, _, body) = server.get("/metrics").await;
    assert_eq!(Scrape::parse(&body).expect("parses").value("imaged_pull_single_flight_joins_total", &[]), Some(2.0));
    server.stop().await;
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

#[actix::test]
async fn readyz_says_the_runtime_is_unreachable_while_it_is_down_and_healthz_stays_green() {
    use imaged::actors::cri_gateway::{CriGatewayActor, CriSettings};
    use imaged::embedded::EmbeddedRuntime;

    let dir = tempfile::tempdir().expect("tempdir");
    let mut runtime = EmbeddedRuntime::start_in(dir.path()).expect("embedded runtime starts");
    let cfg = CriSettings { startup_timeout: Duration::from_secs(5), ..CriSettings::default() };
    let (gateway, _) = CriGatewayActor::connect(&runtime.endpoint(), &cfg).await.expect("gateway connects");
    let health = Health::new();
    health.set_ready();
    let server = serve(Metrics::default(), health.clone()).await;
    let probe = imaged::daemon::watch_runtime(gateway, health.clone(), Duration::from_millis(50));
    // Polls /readyz until it answers `status` (bounded), returning the body.
    let readyz_until = |status: u16| {
        let server = &server;
        async move {
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
    };
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
