//! Metrics scraped after real flows on the embedded runtime: pulls, a
//! shared pull, a failure with back-off, a GC run, the throttle; values
//! parsed from `Metrics::encode()` and asserted.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::pedantic)] // test code: a failed unwrap is a failed test

use std::time::Duration;

use actix::Addr;
use imaged::actors::backoff_registry::{BackoffRegistryActor, ClearBackoff, ClearScope};
use imaged::actors::cri_gateway::CriGatewayActor;
use imaged::actors::cri_gateway::{CriDeadlines, CriSettings};
use imaged::actors::gc_executor::RunGc;
use imaged::actors::pull_queue::{Concurrency, GetQueueStatus, PullQueueActor, PullQueueSettings, ThrottleMode};
use imaged::config::Config;
use imaged::domain::pull_policy::PullPolicy;
use imaged::embedded::{EmbeddedRuntime, RemoteImage};
use imaged::ensure::{EnsureImageRequest, EnsureSettings, ImageManager};
use imaged::metrics::{Metrics, PULL_DURATION_BUCKETS};
use imaged::node::{GcParts, GcService};
use imaged::testing::{Scrape, StartedManager, start_manager};

struct Stack {
    _dir: tempfile::TempDir,
    runtime: EmbeddedRuntime,
    manager: ImageManager,
    gateway: Addr<CriGatewayActor>,
    queue: Addr<PullQueueActor>,
    backoff: Addr<BackoffRegistryActor>,
    cfg: Config,
    metrics: Metrics,
}

async fn stack(pull: PullQueueSettings) -> Stack {
    let metrics = Metrics::default();
    let dir = tempfile::tempdir().expect("tempdir");
    let runtime = EmbeddedRuntime::start_in(dir.path()).expect("embedded runtime starts");
    let cfg = Config::from_toml("[gc]\nimage_minimum_gc_age = \"0s\"").expect("config").with_metrics(&metrics);
    let cri = CriSettings {
        startup_timeout: Duration::from_secs(5),
        deadlines: CriDeadlines::uniform(Some(Duration::from_secs(10))),
        ..cfg.cri.clone()
    };
    let (gateway, _) = CriGatewayActor::connect(&runtime.endpoint(), &cri).await.expect("gateway connects");
    let pull = PullQueueSettings { metrics: metrics.clone(), ..pull };
    let StartedManager { manager, queue, backoff } =
        start_manager(&gateway, &pull, &cfg.backoff, EnsureSettings::default()).await.expect("manager");
    Stack { _dir: dir, runtime, manager, gateway, queue, backoff, cfg, metrics }
}

fn parallel() -> PullQueueSettings {
    PullQueueSettings { concurrency: Concurrency::Parallel(None), qps: 0.0, ..PullQueueSettings::default() }
}

fn scrape(m: &Metrics) -> Scrape {
    Scrape::parse(&m.encode()).expect("the scrape parses")
}

fn ensure_requests(s: &Scrape, policy: &str, present: &str, required: &str) -> Option<f64> {
    s.value(
        "imaged_image_manager_ensure_image_requests_total",
        &[("pull_policy", policy), ("present_locally", present), ("pull_required", required)],
    )
}

#[actix::test]
async fn pulls_joins_failures_and_gc_show_in_the_scrape() {
    let st = stack(parallel()).await;
    st.runtime.preload(RemoteImage::new("example.com/present:1", 1_000)).expect("preload");
    st.runtime
        .add_remote(RemoteImage::new("example.com/shared:1", 2_000).latency(Duration::from_millis(300)))
        .expect("add");
    let m = &st.manager;

    m.ensure_image_exists(&EnsureImageRequest::new("p0", "example.com/present:1", PullPolicy::IfNotPresent))
        .await
        .expect("present");
    // Three pods at once: one pull, two joins.
    let reqs: Vec<EnsureImageRequest> = (1..=3)
        .map(|i| EnsureImageRequest::new(format!("p{i}"), "example.com/shared:1", PullPolicy::IfNotPresent))
        .collect();
    let results = futures_util::future::join_all(reqs.iter().map(|r| m.ensure_image_exists(r))).await;
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    assert_eq!(st.runtime.stats().calls(imaged::cri::Rpc::PullImage), 1, "one shared pull");
    // A missing image: the pull fails and the pod backs off.
    let err = m
        .ensure_image_exists(&EnsureImageRequest::new("p4", "example.com/missing:1", PullPolicy::Always))
        .await
        .expect_err("missing");
    assert_eq!(err.kind.to_string(), "ErrImagePull");
    // A pull's duration is observed with its `Pulled` event, after the size lookup.
    m.settled().await;

    let s = scrape(&st.metrics);
    assert_eq!(ensure_requests(&s, "ifnotpresent", "true", "false"), Some(1.0));
    assert_eq!(ensure_requests(&s, "ifnotpresent", "false", "true"), Some(3.0));
    assert_eq!(ensure_requests(&s, "always", "unknown", "true"), Some(1.0));
    assert_eq!(s.value("imaged_pull_single_flight_joins_total", &[]), Some(2.0));
    // Every pod whose image was pulled (joiners too) observes its total
    // time, under the image's size bucket and the kubelet's buckets.
    let small = [("image_size_in_bytes", "0-10MB")];
    assert_eq!(s.value("imaged_image_pull_duration_seconds_count", &small), Some(3.0));
    assert_eq!(s.value("imaged_image_pull_duration_seconds_bucket", &[small[0], ("le", "+Inf")]), Some(3.0));
    let buckets: Vec<&str> = s
        .samples
        .iter()
        .filter(|x| {
            x.name == "imaged_image_pull_duration_seconds_bucket" && x.labels["image_size_in_bytes"] == "0-10MB"
        })
        .map(|x| x.labels["le"].as_str())
        .collect();
    let want: Vec<String> =
        PULL_DURATION_BUCKETS.iter().map(|b| format!("{b:?}")).chain(["+Inf".to_string()]).collect();
    assert_eq!(buckets, want, "the kubelet's buckets");
    assert_eq!(s.value("imaged_cri_request_duration_seconds_count", &[("method", "PullImage")]), Some(2.0));
    assert_eq!(s.sum("imaged_cri_request_errors_total", &[("method", "PullImage")]), 1.0);
    assert_eq!(s.sum("imaged_cri_request_errors_total", &[("method", "ImageStatus")]), 0.0);
    // Presence checks: 1 + 3, and the size lookup after the pull.
    assert_eq!(s.value("imaged_cri_request_duration_seconds_count", &[("method", "ImageStatus")]), Some(5.0));
    assert_eq!(s.value("imaged_backoff_entries", &[]), Some(1.0));
    assert_eq!(
        s.by_label("imaged_pull_failures_total", "reason"),
        [("not_found".to_string(), 1.0)],
        "the missing image's pull, and nothing else"
    );
    assert_eq!(s.value("imaged_pull_failures_total", &[("registry", "example.com")]), Some(1.0));
    assert_eq!(s.value("imaged_pulls_in_flight", &[]), Some(0.0));
    assert_eq!(s.value("imaged_pull_queue_depth", &[]), Some(0.0));

    // GC: 4 images of 1000/2000 bytes on a 4000-byte filesystem (75 %) with
    // thresholds 50/40: space-driven removals of unused images.
    st.runtime.set_capacity(4_000);
    st.runtime.preload(RemoteImage::new("example.com/old:1", 1_000)).expect("preload");
    let gc = imaged::config::GcSettings { high_threshold_percent: 50, low_threshold_percent: 40, ..st.cfg.gc.clone() };
    let svc = GcService::start(&st.gateway, &gc, st.runtime.capacity_source(), GcParts::default());
    let report = svc.executor.send(RunGc { dry_run: false }).await.expect("executor").expect("gc");
    assert!(!report.removed.is_empty());
    let freed: u64 = report.removed.iter().map(|r| r.size).sum();
    let s = scrape(&st.metrics);
    assert_eq!(s.value("imaged_image_gc_runs_total", &[("result", "success")]), Some(1.0));
    assert_eq!(
        s.value("imaged_image_garbage_collected_total", &[("reason", "space")]),
        Some(report.removed.len() as f64)
    );
    assert_eq!(s.value("imaged_image_gc_freed_bytes_total", &[]), Some(freed as f64));
    let measured = report.bytes_freed_measured.expect("measured after the run");
    assert!(measured > 0, "{measured}");
    assert_eq!(s.value("imaged_image_gc_reclaimed_bytes_total", &[]), Some(measured as f64));
    assert!(
        s.value("imaged_cri_request_duration_seconds_count", &[("method", "RemoveImage")]).is_some_and(|n| n >= 1.0)
    );
}

#[actix::test]
async fn in_flight_and_queue_depth_follow_the_queue() {
    let st = stack(PullQueueSettings { qps: 0.0, ..PullQueueSettings::default() }).await;
    for n in ["a", "b", "c"] {
        st.runtime
            .add_remote(RemoteImage::new(format!("example.com/{n}:1"), 10).latency(Duration::from_millis(400)))
            .expect("add");
    }
    let manager = st.manager.clone();
    let pulls = actix::spawn(async move {
        let reqs: Vec<EnsureImageRequest> = ["a", "b", "c"]
            .iter()
            .map(|n| EnsureImageRequest::new(*n, format!("example.com/{n}:1"), PullPolicy::Always))
            .collect();
        futures_util::future::join_all(reqs.iter().map(|r| manager.ensure_image_exists(r))).await
    });
    // Serial: one runs, two wait. Poll the queue (bounded) until it says so.
    let mut status = None;
    for _ in 0..100 {
        let s = st.queue.send(GetQueueStatus).await.expect("status");
        if s.running == 1 && s.queued == 2 {
            status = Some(s);
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(status.is_some(), "the queue reached 1 running, 2 queued");
    let s = scrape(&st.metrics);
    assert_eq!(s.value("imaged_pulls_in_flight", &[]), Some(1.0));
    assert_eq!(s.value("imaged_pull_queue_depth", &[]), Some(2.0));
    let results = pulls.await.expect("pulls task");
    assert!(results.iter().all(Result::is_ok));
    let s = scrape(&st.metrics);
    assert_eq!(s.value("imaged_pulls_in_flight", &[]), Some(0.0));
    assert_eq!(s.value("imaged_pull_queue_depth", &[]), Some(0.0));
}

#[actix::test]
async fn throttle_rejections_are_counted() {
    let pull = PullQueueSettings {
        concurrency: Concurrency::Parallel(None),
        qps: 0.001,
        burst: 1,
        throttle_mode: ThrottleMode::Fail,
        ..PullQueueSettings::default()
    };
    let st = stack(pull).await;
    for n in ["a", "b"] {
        st.runtime.add_remote(RemoteImage::new(format!("example.com/{n}:1"), 10)).expect("add");
    }
    let ok = st.manager.ensure_image_exists(&EnsureImageRequest::new("a", "example.com/a:1", PullPolicy::Always)).await;
    assert!(ok.is_ok(), "{ok:?}");
    let err = st
        .manager
        .ensure_image_exists(&EnsureImageRequest::new("b", "example.com/b:1", PullPolicy::Always))
        .await
        .expect_err("no token left");
    assert!(err.message.contains("pull QPS exceeded"), "{}", err.message);
    let s = scrape(&st.metrics);
    assert_eq!(s.value("imaged_pull_throttle_rejections_total", &[]), Some(1.0));
    assert_eq!(s.value("imaged_pull_throttle_waits_total", &[]), Some(0.0));
    let failures = [("registry", "example.com"), ("reason", "qps_exceeded")];
    assert_eq!(s.value("imaged_pull_failures_total", &failures), Some(1.0));
    assert_eq!(s.value("imaged_backoff_entries", &[]), Some(1.0));
    // An operator clears the back-off: the gauge follows.
    let cleared = st.backoff.send(ClearBackoff { scope: ClearScope::All }).await.expect("registry");
    assert_eq!(cleared, 1);
    assert_eq!(scrape(&st.metrics).value("imaged_backoff_entries", &[]), Some(0.0));
}

#[test]
fn a_loaded_configuration_shares_one_registry() {
    let cfg = Config::defaults().expect("defaults");
    assert!(cfg.cri.metrics.same_registry(&cfg.pull.metrics));
    assert!(cfg.cri.metrics.same_registry(&cfg.backoff.metrics));
    assert!(cfg.cri.metrics.same_registry(&cfg.gc.metrics));
    assert!(cfg.cri.metrics.same_registry(&cfg.credentials.metrics));
    let m = Metrics::default();
    let cfg = cfg.with_metrics(&m);
    assert!(cfg.gc.metrics.same_registry(&m) && cfg.cri.metrics.same_registry(&m));
    assert!(cfg.credentials.metrics.same_registry(&m));
}

#[actix::test]
async fn throttle_waits_are_counted_once_per_pull() {
    let pull =
        PullQueueSettings { qps: 20.0, burst: 1, throttle_mode: ThrottleMode::Wait, ..PullQueueSettings::default() };
    let st = stack(pull).await;
    for n in ["a", "b"] {
        st.runtime.add_remote(RemoteImage::new(format!("example.com/{n}:1"), 10)).expect("add");
    }
    for n in ["a", "b"] {
        let r = EnsureImageRequest::new(n, format!("example.com/{n}:1"), PullPolicy::Always);
        st.manager.ensure_image_exists(&r).await.expect("pulled after waiting for a token");
    }
    let s = scrape(&st.metrics);
    assert_eq!(s.value("imaged_pull_throttle_waits_total", &[]), Some(1.0), "the second pull waited");
    assert_eq!(s.value("imaged_pull_throttle_rejections_total", &[]), Some(0.0));
}

#[actix::test]
async fn a_node_counts_must_pull_checks_in_its_registry() {
    let dir = tempfile::tempdir().expect("tempdir");
    let metrics = Metrics::default();
    let mut cfg = Config::defaults().expect("defaults").with_metrics(&metrics);
    cfg.endpoint = imaged::config::RuntimeEndpoint::Embedded { socket: Some(dir.path().join("cri.sock")) };
    let node = imaged::node::Node::start(cfg).await.expect("node starts");
    let req = |uid: &str| EnsureImageRequest::new(uid, "redis:7", PullPolicy::IfNotPresent);
    node.ensure_image_exists(&req("a")).await.expect("accepted").expect("pulled");
    // Present now, pulled by imaged without credentials: the record lets any pod use it.
    let ok = node.ensure_image_exists(&req("b")).await.expect("accepted").expect("present");
    assert!(ok.message.ends_with("already present on machine and can be accessed by the pod"), "{}", ok.message);
    let s = scrape(&metrics);
    let checks = |result| s.value("imaged_imagemanager_image_mustpull_checks_total", &[("result", result)]);
    assert_eq!(checks("credentialRecordFound"), Some(1.0));
    assert_eq!(checks("mustAuthenticate"), None);
}

#[actix::test]
async fn a_reload_applies_the_live_parts_and_names_the_rest() {
    let dir = tempfile::tempdir().expect("tempdir");
    let metrics = Metrics::default();
    let mut cfg = Config::defaults().expect("defaults").with_metrics(&metrics);
    cfg.endpoint = imaged::config::RuntimeEndpoint::Embedded { socket: Some(dir.path().join("cri.sock")) };
    let node = imaged::node::Node::start(cfg.clone()).await.expect("node starts");
    // The same configuration again: nothing to do.
    assert_eq!(node.reload(&cfg), imaged::node::Reloaded::default());

    let mut new = cfg.clone();
    new.pull.qps = 0.5;
    new.pull.burst = 2;
    new.gc.high_threshold_percent = 70;
    new.gc.low_threshold_percent = 60;
    new.backoff.delays.initial = Duration::from_secs(3);
    new.pull.capacity = Some(4);
    new.prefetch.images = vec!["busybox:1.36".into()];
    new.cri_server.refuse_remove_pinned = !cfg.cri_server.refuse_remove_pinned;
    new.pull.registry_limits = std::collections::HashMap::from([("docker.io".to_string(), 1)]);
    new.pull.pull_deadline = Some(Duration::from_secs(90));
    new.pull.concurrency = imaged::actors::pull_queue::Concurrency::Parallel(Some(3));
    new.pull.stall_timeout = Some(Duration::from_secs(120));
    new.pull.min_download_rate = 100 << 10;
    let r = node.reload(&new);
    assert_eq!(
        r.applied,
        [
            "gc (thresholds, ages, pinned_images, keep_newest_tags_per_repo)",
            "pull (registry_pull_qps, registry_burst, throttle_mode, registries' qps and burst)",
            "pull (max_parallel_pulls_per_registry, registries' max_parallel)",
            "pull (serialize_image_pulls, max_parallel_image_pulls)",
            "pull (pull_deadline, transient_retries, transient_retry_delay)",
            "pull (slow_pull_warning, stall_warning, stall_timeout, min_download_rate)",
            "backoff (initial, max)",
        ]
    );
    // The queue's capacity needs a restart, and so do the CRI front's
    // settings and a prefetch list on a node started without one.
    assert_eq!(r.needs_restart, ["pull", "cri_server", "prefetch (images, refresh: imaged started with no list)"]);
    let in_force = node.settings_in_force();
    assert_eq!((in_force.pull.qps, in_force.pull.burst), (0.5, 2));
    assert_eq!(in_force.gc.high_threshold_percent, 70);
    assert_eq!(in_force.backoff.delays.initial, Duration::from_secs(3));
    assert_eq!(in_force.pull.capacity, cfg.pull.capacity, "kept until a restart");
    assert_eq!(in_force.pull.registry_limits.get("docker.io"), Some(&1));
    assert_eq!(in_force.pull.pull_deadline, Some(Duration::from_secs(90)));
    assert_eq!(in_force.pull.concurrency, imaged::actors::pull_queue::Concurrency::Parallel(Some(3)));
    assert_eq!(
        (in_force.pull.stall_timeout, in_force.pull.min_download_rate),
        (Some(Duration::from_secs(120)), 100 << 10)
    );
    let s = scrape(&metrics);
    let info = s.value(
        "imaged_config_info",
        &[("registry_pull_qps", "0.5"), ("registry_burst", "2"), ("image_gc_high_threshold_percent", "70")],
    );
    assert_eq!(info, Some(1.0), "config_info shows the settings in force");

    // Again: what was applied is in force; only the restart-bound changes remain.
    let again = node.reload(&new);
    assert!(again.applied.is_empty(), "{again:?}");
    assert_eq!(again.needs_restart, r.needs_restart);
}

#[actix::test]
async fn every_key_the_reload_calls_live_is_applied_and_the_others_are_named() {
    // Each key of LIVE_KEYS, changed alone (with what it needs), is applied
    // by Node::reload with nothing left for a restart; keys outside it are
    // named, key by key, as the daemon's SIGHUP log names them.
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = format!("runtime.embedded_socket={}", dir.path().join("cri.sock").display());
    // Started with a prefetch list, so the list and its refresh are live.
    let base: Vec<String> = vec![socket, r#"prefetch.images=["busybox:1.36"]"#.into()];
    let load = |more: &[&str]| {
        let mut overrides = base.clone();
        overrides.extend(more.iter().map(|s| s.to_string()));
        Config::load_full(&imaged::config::Sources { overrides, ..Default::default() }).expect("a valid change")
    };
    let start = load(&[]);
    let node = imaged::node::Node::start(start.config.clone()).await.expect("node starts");
    let live: &[&[&str]] = &[
        &["gc.image_gc_high_threshold_percent=90"],
        &["gc.image_gc_low_threshold_percent=70"],
        &["gc.image_minimum_gc_age=3m"],
        &["gc.image_maximum_gc_age=48h"],
        &[r#"gc.pinned_images=["registry.k8s.io/*"]"#],
        &["gc.keep_newest_tags_per_repo=2"],
        &["pull.registry_pull_qps=7.0"],
        &["pull.registry_burst=3"],
        &["pull.throttle_mode=wait"],
        &[r#"pull.registries=[{registry="docker.io", qps=0.5, burst=4, max_parallel=1}]"#],
        &["pull.serialize_image_pulls=false", "pull.max_parallel_pulls_per_registry=2"],
        &["pull.serialize_image_pulls=false"],
        &["pull.serialize_image_pulls=false", "pull.max_parallel_image_pulls=3"],
        &["pull.pull_deadline=5m"],
        &["pull.transient_retries=2"],
        &["pull.transient_retries=2", "pull.transient_retry_delay=2s"],
        &["pull.slow_pull_warning=2m"],
        &["pull.stall_warning=2m"],
        &["pull.stall_timeout=5m"],
        &["pull.min_download_rate=100Ki"],
        &["backoff.initial=5s"],
        &["backoff.max=60s"],
        &["prefetch.keep=false"],
        &[r#"prefetch.images=["busybox:1.36", "redis:7"]"#],
        &["prefetch.refresh=30m"],
    ];
    let mut covered = std::collections::BTreeSet::new();
    for change in live {
        let new = load(change);
        let changed = imaged::config::changed_keys(&start.effective.values(), &new.effective.values());
        assert_eq!(changed.len(), change.len(), "{change:?} changes {changed:?}");
        let r = node.reload(&new.config);
        assert!(!r.applied.is_empty() && r.needs_restart.is_empty(), "{change:?}: {r:?}");
        assert_eq!(r.restart_keys(&changed), Vec::<String>::new(), "{change:?}");
        assert_eq!(node.settings_in_force(), new.config, "{change:?} is in force");
        // Back to the start, live too.
        let back = node.reload(&start.config);
        assert!(back.needs_restart.is_empty(), "{change:?} undone: {back:?}");
        covered.extend(changed);
    }
    // Every live key is checked here but the daemon's own log.filter.
    let listed: std::collections::BTreeSet<String> =
        imaged::node::LIVE_KEYS.iter().filter(|k| **k != "log.filter").map(|k| k.to_string()).collect();
    assert_eq!(covered, listed);

    // Keys outside it are named one by one, live ones left out.
    let new =
        load(&["pull.queue_capacity=4", "pull.registry_pull_qps=9.0", "daemon.event_buffer=64", "gc.gc_period=1m"]);
    let changed = imaged::config::changed_keys(&start.effective.values(), &new.effective.values());
    let r = node.reload(&new.config);
    assert_eq!(r.restart_keys(&changed), ["daemon.event_buffer", "gc.gc_period", "pull.queue_capacity"]);
    // And the node did leave them: its own comparison names their sections.
    assert_eq!(
        r.needs_restart,
        ["gc (periods, sandbox_image, node_status_max_images, eviction_available)", "pull", "daemon"]
    );
    let in_force = node.settings_in_force();
    assert_eq!(
        (in_force.pull.capacity, in_force.daemon.event_buffer),
        (start.config.pull.capacity, start.config.daemon.event_buffer)
    );
    assert_eq!(in_force.gc.gc_period, start.config.gc.gc_period);
    assert_eq!(node.settings_in_force().pull.qps, 9.0, "the live key among them is applied");
}

#[actix::test]
async fn a_failed_pull_counts_once_however_many_wait_on_it() {
    let st = stack(parallel()).await;
    // The image is in no registry: the pull fails (not found) after 200 ms,
    // while the other pods join it.
    let slow = imaged::fault::FaultPlan::new(1)
        .rule(imaged::fault::FaultRule::on(imaged::cri::Rpc::PullImage).delay(Duration::from_millis(200)));
    st.runtime.set_fault_plan(slow);
    let reqs: Vec<EnsureImageRequest> = (1..=3)
        .map(|i| EnsureImageRequest::new(format!("p{i}"), "quay.example/team/app:1", PullPolicy::IfNotPresent))
        .collect();
    let results = futures_util::future::join_all(reqs.iter().map(|r| st.manager.ensure_image_exists(r))).await;
    assert!(results.iter().all(Result::is_err), "{results:?}");
    let pulls = st.runtime.stats().calls(imaged::cri::Rpc::PullImage);
    assert_eq!(pulls, 1, "one pull for the three");
    let s = scrape(&st.metrics);
    let failures = [("registry", "quay.example"), ("reason", "not_found")];
    assert_eq!(s.value("imaged_pull_failures_total", &failures), Some(1.0), "once per pull, not per pod");
}

#[actix::test]
async fn durable_writes_are_timed_by_table() {
    let dir = tempfile::tempdir().expect("tempdir");
    let metrics = Metrics::default();
    let mut cfg = Config::defaults().expect("defaults").with_metrics(&metrics);
    cfg.endpoint = imaged::config::RuntimeEndpoint::Embedded { socket: Some(dir.path().join("cri.sock")) };
    cfg.state_dir = Some(dir.path().join("state"));
    let node = imaged::node::Node::start(cfg).await.expect("node starts");
    let req = EnsureImageRequest::new("a", "redis:7", PullPolicy::IfNotPresent);
    node.ensure_image_exists(&req).await.expect("accepted").expect("pulled");
    // Its record is written behind the answer.
    node.manager().settled().await;
    let s = scrape(&metrics);
    let count = |table| s.value("imaged_store_write_duration_seconds_count", &[("table", table)]);
    // The pull's intent; its record (anonymous: every pod may use the
    // image) is written unsynced, and only synced writes are timed.
    assert_eq!(count("pull_records"), Some(1.0));
    let sum = s.value("imaged_store_write_duration_seconds_sum", &[("table", "pull_records")]);
    assert!(sum.is_some_and(|t| t > 0.0), "{sum:?}");
    // Image records are written by detections (none may have run yet).
    assert!(count("image_records").is_some(), "the series exists from the start");
    // The kubelet's file counts, read from the tables at the scrape: the
    // image's record, and the name's intent kept for its next pull.
    assert_eq!(s.value("imaged_imagemanager_ondisk_pulledrecords", &[]), Some(1.0));
    assert_eq!(s.value("imaged_imagemanager_ondisk_pullintents", &[]), Some(1.0));
    node.shutdown(Duration::from_secs(5)).await;
    // A graceful stop deletes the kept intents.
    let s = scrape(&metrics);
    assert_eq!(s.value("imaged_imagemanager_ondisk_pullintents", &[]), Some(0.0));
    assert_eq!(s.value("imaged_imagemanager_ondisk_pulledrecords", &[]), Some(1.0));
}
