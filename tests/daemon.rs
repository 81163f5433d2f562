//! The daemon as operators run it: `imaged run` on the embedded runtime,
//! its API through a real unix socket, `imagectl` against it, signals.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::pedantic)] // test code: a failed unwrap is a failed test

mod support;

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use imaged::api::proto;
use nix::sys::signal::Signal;
use support::daemon::{Daemon, stderr, stdout};

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime")
}

fn ensure_req(uid: &str, image: &str, policy: &str) -> proto::EnsureImageRequest {
    proto::EnsureImageRequest {
        pod: Some(proto::Pod { uid: uid.into(), namespace: "ns".into(), name: uid.into(), ..Default::default() }),
        image: image.into(),
        pull_policy: policy.into(),
        ..Default::default()
    }
}

#[test]
fn the_api_serves_every_rpc_on_an_owner_only_socket() {
    let d = Daemon::start(&[]);
    let mode = std::fs::metadata(&d.socket).expect("socket").permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "socket mode {mode:o}");

    rt().block_on(async {
        let mut c = imaged::api::client(&d.socket).expect("client");
        // EnsureImage: pulled, then present.
        let r = c.ensure_image(ensure_req("p1", "busybox:1.36", "IfNotPresent")).await.expect("rpc").into_inner();
        let Some(proto::ensure_image_response::Result::Ok(ok)) = r.result else { panic!("{r:?}") };
        assert!(ok.image_ref.starts_with("sha256:"), "{ok:?}");
        let r = c.ensure_image(ensure_req("p2", "busybox:1.36", "")).await.expect("rpc").into_inner();
        let Some(proto::ensure_image_response::Result::Ok(ok2)) = r.result else { panic!("{r:?}") };
        assert_eq!(
            ok2.message,
            "Container image \"busybox:1.36\" already present on machine and can be accessed by the pod"
        );

        // A missing image: the kubelet's error, then back-off.
        let missing = "docker.io/library/missing:1";
        let r = c.ensure_image(ensure_req("p3", missing, "IfNotPresent")).await.expect("rpc").into_inner();
        let Some(proto::ensure_image_response::Result::Failure(f)) = r.result else { panic!("{r:?}") };
        assert_eq!((f.kind.as_str(), f.class.as_str()), ("ErrImagePull", "permanent"), "{f:?}");
        let r = c.ensure_image(ensure_req("p3", missing, "IfNotPresent")).await.expect("rpc").into_inner();
        let Some(proto::ensure_image_response::Result::Failure(f)) = r.result else { panic!("{r:?}") };
        assert_eq!(f.kind, "ImagePullBackOff");
        assert!(
            f.message.starts_with("Back-off pulling image \"docker.io/library/missing:1\": ErrImagePull:"),
            "{f:?}"
        );

        // ListImages: the pulled image with its node-status names.
        let images = c.list_images(proto::ListImagesRequest {}).await.expect("rpc").into_inner().images;
        let bb = images.iter().find(|i| i.id == ok.image_ref).expect("busybox listed");
        assert!(bb.repo_tags.contains(&"docker.io/library/busybox:1.36".to_string()), "{bb:?}");
        assert!(bb.names.contains(&"docker.io/library/busybox:1.36".to_string()), "{bb:?}");

        // GetStatus: runtime, queue, the back-off key.
        let s = c.get_status(proto::GetStatusRequest {}).await.expect("rpc").into_inner();
        assert_eq!(s.runtime_name, "imaged-embedded");
        assert!(s.accepting);
        assert_eq!(s.pull_mode, "serial");
        assert_eq!(s.backoffs.len(), 1, "{:?}", s.backoffs);
        assert_eq!((s.backoffs[0].pod_uid.as_str(), s.backoffs[0].backoff_ms), ("p3", 10_000));

        // ListPulls: every pull above has ended.
        let pulls = c.list_pulls(proto::ListPullsRequest {}).await.expect("rpc").into_inner().pulls;
        assert_eq!(pulls, vec![]);

        // PrefetchImage: busybox is present now.
        let req = proto::PrefetchImageRequest { image: "busybox:1.36".into(), ..Default::default() };
        let p = c.prefetch_image(req).await.expect("rpc").into_inner();
        assert_eq!((p.state.as_str(), p.image_ref.as_str()), ("present", ok.image_ref.as_str()));

        // ClearBackoff for that pod: one key; then a retry pulls again (ErrImagePull, not back-off).
        let cleared = c
            .clear_backoff(proto::ClearBackoffRequest { pod_uid: "p3".into(), image: String::new() })
            .await
            .expect("rpc")
            .into_inner()
            .cleared;
        assert_eq!(cleared, 1);
        let r = c.ensure_image(ensure_req("p3", missing, "IfNotPresent")).await.expect("rpc").into_inner();
        let Some(proto::ensure_image_response::Result::Failure(f)) = r.result else { panic!("{r:?}") };
        assert_eq!(f.kind, "ErrImagePull");

        // GarbageCollect (dry run): every image with a verdict; busybox was just ensured, so kept.
        let g = c.garbage_collect(proto::GarbageCollectRequest { dry_run: true }).await.expect("rpc").into_inner();
        assert!(g.dry_run && g.mode == "threshold", "{g:?}");
        let e = g.entries.iter().find(|e| e.id == ok.image_ref).expect("busybox in the plan");
        assert_eq!(e.verdict, "keep", "{e:?}");
        assert!(g.removed.is_empty());
        let g =
            c.delete_unused_images(proto::DeleteUnusedImagesRequest { dry_run: true }).await.expect("rpc").into_inner();
        assert_eq!(g.mode, "delete-unused");

        // WatchEvents (recent, no follow): the kubelet's events and the pull phases, then the end.
        let mut stream =
            c.watch_events(proto::WatchEventsRequest { recent: true, follow: false }).await.expect("rpc").into_inner();
        let mut reasons = Vec::new();
        let mut phases = Vec::new();
        while let Some(e) = stream.message().await.expect("stream") {
            match e.kind {
                Some(proto::event::Kind::ImageEvent(ie)) => reasons.push(ie.reason),
                Some(proto::event::Kind::PullPhase(p)) => phases.push((p.image, p.phase)),
                _ => {}
            }
        }
        for want in ["Pulling", "Pulled", "Failed", "BackOff"] {
            assert!(reasons.iter().any(|r| r == want), "{want} missing from {reasons:?}");
        }
        let bb = "docker.io/library/busybox:1.36".to_string();
        for want in ["queued", "pulling", "done"] {
            assert!(phases.contains(&(bb.clone(), want.to_string())), "{want} missing from {phases:?}");
        }
    });
}

#[test]
fn bad_requests_are_rejected_naming_the_field() {
    let d = Daemon::start(&["--set", "daemon.max_request_bytes=65536"]);
    rt().block_on(async {
        let mut c = imaged::api::client(&d.socket).expect("client");
        let cases: Vec<(proto::EnsureImageRequest, &str)> = vec![
            (ensure_req("p", "", "IfNotPresent"), "image: must not be empty"),
            (proto::EnsureImageRequest { pod: None, ..ensure_req("p", "busybox", "") }, "pod: must be set"),
            (ensure_req("", "busybox", ""), "pod.uid: must not be empty"),
            (ensure_req("p", "busybox", "Sometimes"), "pull_policy: unknown pull policy \"Sometimes\""),
            (
                proto::EnsureImageRequest {
                    pull_secrets: vec![b"{not json".to_vec()],
                    ..ensure_req("p", "busybox", "")
                },
                "pull_secrets[0]:",
            ),
            (
                // A YAML manifest is read as YAML: its base64 is what is wrong.
                proto::EnsureImageRequest {
                    pull_secrets: vec![
                        b"kind: Secret\nmetadata: {name: s, namespace: ns}\ndata: {k: \"hunter2!\"}\n".to_vec(),
                    ],
                    ..ensure_req("p", "busybox", "")
                },
                "pull_secrets[0]: Secret manifest \"ns/s\": data[\"k\"]: illegal base64 data",
            ),
        ];
        for (req, want) in cases {
            let e = c.ensure_image(req).await.expect_err("rejected");
            assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
            assert!(e.message().starts_with(want), "{:?} does not start with {want:?}", e.message());
        }
        // Larger than daemon.max_request_bytes: refused before it is decoded.
        let big =
            proto::EnsureImageRequest { pull_secrets: vec![vec![b'x'; 100_000]], ..ensure_req("p", "busybox", "") };
        let e = c.ensure_image(big).await.expect_err("oversized");
        assert!(matches!(e.code(), tonic::Code::OutOfRange | tonic::Code::ResourceExhausted), "{e:?}");
        // The daemon still serves.
        c.get_status(proto::GetStatusRequest {}).await.expect("still serving");
    });
}

#[test]
fn extreme_deadlines_get_a_clear_error_and_the_daemon_keeps_serving() {
    // u64::MAX ms once panicked in tonic's set_timeout at the pull and
    // aborted the daemon with every pull in flight.
    let d = Daemon::start(&[]);
    let too_large = "deadline_ms: 18446744073709551615ms is too large: \
                     at most 2562047h47m16.854775807s (Go's largest duration)";
    rt().block_on(async {
        let mut c = imaged::api::client(&d.socket).expect("client");
        let req = proto::EnsureImageRequest { deadline_ms: u64::MAX, ..ensure_req("p1", "busybox:1.36", "Always") };
        let e = c.ensure_image(req).await.expect_err("refused");
        assert_eq!((e.code(), e.message()), (tonic::Code::InvalidArgument, too_large));
        let req = proto::PrefetchImageRequest {
            image: "busybox:1.36".into(),
            deadline_ms: u64::MAX,
            wait: true,
            ..Default::default()
        };
        let e = c.prefetch_image(req).await.expect_err("refused");
        assert_eq!((e.code(), e.message()), (tonic::Code::InvalidArgument, too_large));

        // The largest deadline accepted pulls as any other.
        let largest = u64::try_from(imaged::domain::limits::MAX_DURATION.as_millis()).expect("fits");
        let req = proto::EnsureImageRequest { deadline_ms: largest, ..ensure_req("p2", "busybox:1.36", "Always") };
        let r = c.ensure_image(req).await.expect("rpc").into_inner();
        assert!(matches!(r.result, Some(proto::ensure_image_response::Result::Ok(_))), "{r:?}");
    });

    let o = d.imagectl(&["ensure", "nginx:1.27", "--deadline", "175200000h"]);
    assert_eq!(o.status.code(), Some(64), "{}", stderr(&o));
    assert!(
        stderr(&o).contains(
            "invalid value '175200000h' for '--deadline <DEADLINE>': too large: at most 2562047h47m16.854775807s"
        ),
        "{}",
        stderr(&o)
    );
    // One grammar, Go's, as in every file imaged reads: a year is no unit.
    let o = d.imagectl(&["ensure", "nginx:1.27", "--deadline", "20000y"]);
    assert_eq!(o.status.code(), Some(64), "{}", stderr(&o));
    assert!(stderr(&o).contains("there is no month or year unit"), "{}", stderr(&o));
    // Still serving, and nothing in its log says it panicked.
    let o = d.imagectl(&["ensure", "nginx:1.27", "--deadline", "2m"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(!d.log().contains("panicked"), "{}", d.log());
}

#[test]
fn logs_are_json_lines_when_asked_and_rust_log_filters_them() {
    let d = Daemon::start(&["--log-format", "json"]);
    let o = d.imagectl(&["ensure", "busybox:1.36"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let log = d.log();
    let lines: Vec<&str> = log.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(lines.len() >= 2, "info logs expected: {log}");
    for l in &lines {
        let v: serde_json::Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}"));
        assert!(v.get("level").is_some() && v.get("message").is_some(), "{l}");
    }
    assert!(log.contains("Successfully pulled image"), "{log}");

    let quiet = Daemon::start(&["--set", "log.filter=error"]);
    let o = quiet.imagectl(&["ensure", "busybox:1.36"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(quiet.log().trim().is_empty(), "log.filter=error silences info logs: {}", quiet.log());
}

#[test]
fn imagectl_drives_the_daemon_with_tables_json_and_exit_codes() {
    let d = Daemon::start(&[]);
    let o = d.imagectl(&["ensure", "busybox:1.36", "--pod", "web/front-1", "--pod-uid", "u1"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stdout(&o).contains("image ref: sha256:"), "{}", stdout(&o));
    // Progress went to stderr: the kubelet's events for this pod, and the phases.
    let err = stderr(&o);
    assert!(err.contains("Pulling image \"busybox:1.36\"") && err.contains("Successfully pulled image"), "{err}");
    assert!(err.contains("pulling") && err.contains("docker.io/library/busybox:1.36"), "{err}");

    let o = d.imagectl(&["-o", "json", "ensure", "busybox:1.36"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(
        v["ok"]["message"],
        "Container image \"busybox:1.36\" already present on machine and can be accessed by the pod"
    );

    let o = d.imagectl(&["ensure", "docker.io/library/missing:2"]);
    assert_eq!(o.status.code(), Some(2), "{}", stdout(&o));
    assert!(stdout(&o).starts_with("ErrImagePull: "), "{}", stdout(&o));
    let o = d.imagectl(&["ensure", "busybox", "--policy", "Sometimes"]);
    assert_eq!(o.status.code(), Some(64), "{}", stderr(&o));
    assert!(stderr(&o).contains("pull_policy: unknown pull policy"), "{}", stderr(&o));
    let o = d.imagectl(&["ensure", "busybox", "--pod", "no-slash"]);
    assert_eq!(o.status.code(), Some(64));

    let o = d.imagectl(&["images"]);
    let out = stdout(&o);
    assert!(out.lines().next().is_some_and(|h| h.starts_with("IMAGE ID") && h.contains("SIZE")), "{out}");
    assert!(out.contains("docker.io/library/busybox:1.36"), "{out}");
    let o = d.imagectl(&["-o", "json", "images"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert!(v["images"].as_array().is_some_and(|a| a.iter().any(|i| i["size"] == 4_261_574)), "{v}");

    let o = d.imagectl(&["gc", "--dry-run"]);
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(out.contains("VERDICT") && out.contains("keep: in use by ensured recently"), "{out}");
    assert!(out.contains("threshold (dry run)"), "{out}");
    let o = d.imagectl(&["-o", "json", "gc", "--dry-run", "--delete-unused"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(v["mode"], "delete-unused");

    let o = d.imagectl(&["events"]);
    let out = stdout(&o);
    assert!(out.contains("Pulled") && out.contains("web/front-1"), "{out}");
    // An ensure of a present image is an event, not a log line (#16: at
    // thousands of pods a line each is spam and costs more than the ensure).
    assert!(out.contains("already present on machine"), "{out}");
    assert!(!d.log().contains("already present on machine"), "{}", d.log());
    let o = d.imagectl(&["-o", "json", "events"]);
    let first: serde_json::Value =
        serde_json::from_str(stdout(&o).lines().next().expect("an event line")).expect("json line");
    assert!(first["time_ms"].is_i64(), "{first}");

    let o = d.imagectl(&["backoff", "list"]);
    assert!(stdout(&o).contains("docker.io/library/missing:2"), "{}", stdout(&o));
    let o = d.imagectl(&["backoff", "clear", "--image", "docker.io/library/missing:2"]);
    assert_eq!(stdout(&o).trim(), "cleared back-off for 1 key(s)");

    let o = d.imagectl(&["status"]);
    let out = stdout(&o);
    assert!(out.contains("runtime: imaged-embedded") && out.contains("pull.serialize_image_pulls = true"), "{out}");
    assert!(out.contains("\nhealth:  ready\n"), "the daemon's /readyz, in status: {out}");
    let o = d.imagectl(&["-o", "json", "status"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(v["runtime_name"], "imaged-embedded");
    assert_eq!(
        (&v["health"]["alive"], &v["health"]["ready"]),
        (&serde_json::json!(true), &serde_json::json!(true)),
        "{v}"
    );

    // No daemon on a socket: 69, naming the socket.
    let nobody = d.dir.path().join("nobody.sock");
    let o = support::daemon::imagectl(&nobody, &["status"]);
    assert_eq!(o.status.code(), Some(69), "{}", stderr(&o));
    assert!(stderr(&o).contains(&format!("(imaged's API socket {})", nobody.display())), "{}", stderr(&o));
}

#[test]
fn imagectl_pulls_shows_the_running_pull_and_the_queue_behind_it() {
    let d = Daemon::start(&[]);
    let o = d.imagectl(&["pulls"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stdout(&o).contains("(no pulls running or waiting)"), "{}", stdout(&o));
    let o = d.imagectl(&["-o", "json", "pulls"]);
    assert_eq!(
        made_now(serde_json::from_slice::<serde_json::Value>(&o.stdout).expect("json")),
        serde_json::json!({"pulls": [], "downloads": [], "downloads_unavailable": ""})
    );

    // Serial pulls: nginx (400 ms) runs while redis waits behind it.
    let socket = d.socket.clone();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("rt");
    let ensures = runtime.spawn(async move {
        let c = imaged::api::client(&socket).expect("client");
        let (mut a, mut b) = (c.clone(), c);
        let first = a.ensure_image(ensure_req("p1", "nginx:1.27", "IfNotPresent"));
        let second = async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            b.ensure_image(ensure_req("p2", "redis:7", "IfNotPresent")).await
        };
        let (x, y) = tokio::join!(first, second);
        x.is_ok() && y.is_ok()
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let table = loop {
        let out = stdout(&d.imagectl(&["pulls"]));
        let line = |image: &str| out.lines().find(|l| l.contains(image)).map(str::split_whitespace);
        let nginx: Option<Vec<&str>> = line("docker.io/library/nginx:1.27").map(Iterator::collect);
        let redis: Option<Vec<&str>> = line("docker.io/library/redis:7").map(Iterator::collect);
        // The embedded runtime lists its pull as a download (as containerd
        // lists its ingests) once the pull reaches it.
        let download =
            out.lines().find(|l| l.contains("layer-sha256:")).map(|l| l.split_whitespace().collect::<Vec<_>>());
        if let (Some(n), Some(r), Some(dl)) = (nginx, redis, download)
            && n[0] == "pulling"
        {
            // STATE POS PRIO WAITERS WAITING RUNNING CREDS MUST BYTES IMAGE
            assert_eq!((n[1], n[3], n[6], n[7]), ("-", "1", "no", "no"), "{out}");
            // The one pull in the runtime's hands: the download is its own.
            assert!(n[8].contains('/') && n[8] != "-", "{out}");
            // BYTES RUNNING IDLE STALLED DOWNLOAD
            assert_eq!(dl[3], "no", "a moving download is no stall: {out}");
            assert_eq!(r[8], "-", "a queued pull has no bytes: {out}");
            assert_eq!((r[0], r[1], r[3], r[5]), ("queued", "1", "1", "-"), "{out}");
            // Each pull with the pod an API ensure names (no sandbox).
            assert!(out.contains("docker.io/library/nginx:1.27  (ns/p1)"), "{out}");
            assert!(out.contains("docker.io/library/redis:7  (ns/p2)"), "{out}");
            let status = stdout(&d.imagectl(&["status"]));
            assert!(
                status.contains("1 running, 1 queued, 0 waiting for room, 0 joined another request's pull"),
                "two pulls, one request each: none joined\n{status}"
            );
            break out;
        }
        assert!(std::time::Instant::now() < deadline, "never saw nginx pulling with redis queued:\n{out}");
        std::thread::sleep(Duration::from_millis(5));
    };
    assert!(table.starts_with("STATE"), "{table}");
    assert!(runtime.block_on(ensures).expect("task"), "both ensures answered");
    let o = d.imagectl(&["-o", "json", "pulls"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(
        made_now(v),
        serde_json::json!({"pulls": [], "downloads": [], "downloads_unavailable": ""}),
        "the pull's download ended with it"
    );
}

/// A `ListPulls` answer without its `time_ms`, which must be within a
/// minute of now.
fn made_now(mut v: serde_json::Value) -> serde_json::Value {
    let at = v.as_object_mut().and_then(|o| o.remove("time_ms")).and_then(|t| t.as_i64()).expect("time_ms");
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_millis();
    assert!((i128::try_from(now).expect("ms") - i128::from(at)).abs() < 60_000, "time_ms {at}, now {now}");
    v
}

#[test]
fn imagectl_pulls_watch_follows_a_pull_until_interrupted_and_watch_pulls_is_bounded() {
    use std::io::BufRead as _;
    let mut d = Daemon::start(&[]);
    // Bad intervals: refused by imagectl, and by the daemon.
    let o = d.imagectl(&["pulls", "--watch", "--interval", "10ms"]);
    assert_eq!(o.status.code(), Some(64), "a usage error: {}", stderr(&o));
    assert!(stderr(&o).contains("must be from 100ms to 1h0m0s"), "{}", stderr(&o));
    rt().block_on(async {
        let mut c = imaged::api::client(&d.socket).expect("client");
        for ms in [99, 3_600_001] {
            let e = c.watch_pulls(proto::WatchPullsRequest { interval_ms: ms }).await.expect_err("refused");
            assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
            assert!(e.message().contains(&format!("interval_ms {ms} is out of range")), "{}", e.message());
        }
        // At most 32 streams at once; a closed one makes room.
        let mut open = Vec::new();
        for _ in 0..32 {
            let mut s =
                c.watch_pulls(proto::WatchPullsRequest { interval_ms: 3_600_000 }).await.expect("rpc").into_inner();
            // The first answer comes at once.
            let first = tokio::time::timeout(Duration::from_secs(10), s.message()).await.expect("at once");
            assert!(first.expect("stream").is_some_and(|r| r.time_ms > 0));
            open.push(s);
        }
        let e = c.watch_pulls(proto::WatchPullsRequest::default()).await.expect_err("one too many");
        assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e:?}");
        assert!(e.message().contains("32 WatchPulls streams are open"), "{}", e.message());
        drop(open.pop());
        let give_up = std::time::Instant::now() + Duration::from_secs(10);
        while c.watch_pulls(proto::WatchPullsRequest::default()).await.is_err() {
            assert!(std::time::Instant::now() < give_up, "a closed stream never made room");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        drop(open);
        let r = c.ensure_image(ensure_req("p0", "busybox:1.36", "IfNotPresent")).await.expect("rpc").into_inner();
        assert!(matches!(r.result, Some(proto::ensure_image_response::Result::Ok(_))), "still serves: {r:?}");
    });

    // imagectl pulls --watch, JSON: one object per line, every 100 ms; it
    // sees nginx's pull (400 ms) run and end.
    let mut watch = std::process::Command::new(env!("CARGO_BIN_EXE_imagectl"))
        .env_remove("RUST_LOG")
        .args(["--socket"])
        .arg(&d.socket)
        .args(["-o", "json", "pulls", "--watch", "--interval", "100ms"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("imagectl");
    let mut lines = std::io::BufReader::new(watch.stdout.take().expect("stdout")).lines();
    // Bounded: a watch that stops answering is ended after 30 s, and the
    // asserts below say what it missed.
    let pid = nix::unistd::Pid::from_raw(i32::try_from(watch.id()).expect("pid"));
    let (done, finished) = std::sync::mpsc::channel::<()>();
    let watchdog = std::thread::spawn(move || {
        if finished.recv_timeout(Duration::from_secs(30)).is_err() {
            let _ = nix::sys::signal::kill(pid, Signal::SIGKILL);
        }
    });
    let (mut seen, mut times) = (Vec::new(), Vec::new());
    // The watch answers once, idle, before the pull is asked for.
    let first: serde_json::Value =
        serde_json::from_str(&lines.next().expect("a first answer").expect("a line")).expect("JSON");
    assert_eq!(first["pulls"], serde_json::json!([]), "{first}");
    seen.push(None);
    times.push(first["time_ms"].as_i64().expect("time_ms"));
    let socket = d.socket.clone();
    let ensure = std::thread::spawn(move || {
        rt().block_on(async move {
            let mut c = imaged::api::client(&socket).expect("client");
            c.ensure_image(ensure_req("p1", "nginx:1.27", "IfNotPresent")).await.is_ok()
        })
    });
    for line in lines {
        let v: serde_json::Value = serde_json::from_str(&line.expect("a line")).expect("one JSON object per line");
        times.push(v["time_ms"].as_i64().expect("time_ms"));
        let state =
            v["pulls"].as_array().expect("pulls").first().map(|p| p["state"].as_str().unwrap_or("").to_string());
        if seen.last() != Some(&state) {
            seen.push(state.clone());
        }
        if (seen.len() >= 3 && state.is_none()) || times.len() > 200 {
            break;
        }
    }
    let _ = done.send(());
    let _ = watchdog.join();
    let _ = watch.kill();
    let _ = watch.wait();
    assert!(ensure.join().expect("thread"), "the ensure was answered");
    assert!(seen.contains(&Some("pulling".to_string())), "the pull was seen running: {seen:?}");
    assert_eq!((seen.first(), seen.last()), (Some(&None), Some(&None)), "idle, the pull, idle again: {seen:?}");
    // About every 100 ms: one slow answer makes the next come sooner, so
    // the mean, not each gap.
    let span = times.last().expect("answers") - times[0];
    assert!(times.len() >= 4 && span / (times.len() as i64 - 1) >= 50, "about every 100 ms: {times:?}");

    // A stream open when imaged stops ends, and does not hold the stop.
    rt().block_on(async {
        let mut c = imaged::api::client(&d.socket).expect("client");
        let mut s = c.watch_pulls(proto::WatchPullsRequest { interval_ms: 3_600_000 }).await.expect("rpc").into_inner();
        assert!(s.message().await.expect("first").is_some());
        d.signal(Signal::SIGTERM);
        let end = tokio::time::timeout(Duration::from_secs(10), s.message()).await.expect("the stream ends");
        // Ended with the reason, so a client reconnects rather than stops.
        let e = end.expect_err("not a clean end: the stream did not finish, imaged stopped");
        assert_eq!((e.code(), e.message()), (tonic::Code::Unavailable, "imaged is shutting down"), "{e:?}");
        let what = e.metadata().get(imaged::api::UNAVAILABLE_WHAT).and_then(|v| v.to_str().ok());
        assert_eq!(what, Some(imaged::api::UNAVAILABLE_SHUTTING_DOWN));
    });
    assert_eq!(d.wait_exit(Duration::from_secs(20)), Some(0));
}

#[test]
fn imagectl_prefetch_pulls_in_the_background_or_waits_and_says_what_failed() {
    let d = Daemon::start(&[]);
    let o = d.imagectl(&["prefetch", "nginx:1.27", "redis:7", "--priority", "-5"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(stdout(&o), "nginx:1.27: queued\nredis:7: queued\n");
    // Waiting on the same images: they join the pulls already running (or
    // find them done), one CRI pull each.
    let o = d.imagectl(&["-o", "json", "prefetch", "--wait", "nginx:1.27", "redis:7", "busybox:1.36"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    for i in 0..3 {
        let r = &v["results"][i];
        assert!(r["state"] == "pulled" || r["state"] == "present", "{v}");
        assert!(r["image_ref"].as_str().is_some_and(|r| r.starts_with("sha256:")), "{v}");
    }
    // A pod's ensure now finds nginx present.
    let o = d.imagectl(&["ensure", "nginx:1.27"]);
    assert!(stdout(&o).contains("already present on machine"), "{}", stdout(&o));
    // Failures: exit 2, the reason per image, the others still answered.
    let o = d.imagectl(&["prefetch", "--wait", "docker.io/library/missing:3", "example.com/App:1", "busybox:1.36"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(
        out.contains("docker.io/library/missing:3: failed: Failed to pull image \"docker.io/library/missing:3\": "),
        "{out}"
    );
    assert!(
        out.contains(
            "example.com/App:1: failed: InvalidImageName: Failed to apply default image tag \"example.com/App:1\": "
        ),
        "{out}"
    );
    assert!(out.contains("busybox:1.36: present (sha256:"), "{out}");
    // No back-off for the failed prefetch: it had no pod.
    let o = d.imagectl(&["backoff", "list"]);
    assert!(!stdout(&o).contains("missing:3"), "{}", stdout(&o));
    let o = d.imagectl(&["prefetch"]);
    assert_eq!(o.status.code(), Some(64), "an image is required: {}", stderr(&o));
}

#[test]
fn sigterm_lets_the_pull_in_flight_finish_exits_0_and_persists_state() {
    let state = tempfile::tempdir().expect("state dir");
    let state_arg = format!("state.dir={}", state.path().display());
    let mut d = Daemon::start(&["--set", &state_arg]);
    let socket = d.socket.clone();
    // A worker thread drives the call while this thread watches the log.
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("rt");
    let ensure = runtime.spawn(async move {
        let mut c = imaged::api::client(&socket).expect("client");
        // nginx takes 400 ms to pull from the embedded registry.
        c.ensure_image(ensure_req("p1", "nginx:1.27", "IfNotPresent")).await
    });
    // Wait until the pull is running, then SIGTERM.
    d.wait_for_log("Pulling image \"nginx:1.27\"", Duration::from_secs(10), "pull never started");
    d.signal(Signal::SIGTERM);
    let r = runtime.block_on(ensure).expect("task").expect("the in-flight ensure completes").into_inner();
    assert!(matches!(r.result, Some(proto::ensure_image_response::Result::Ok(_))), "{r:?}");
    assert_eq!(d.wait_exit(Duration::from_secs(20)), Some(0), "{}", d.log());
    assert!(!d.socket.exists(), "socket removed on exit");
    let log = d.log();
    assert!(log.contains("shutting down") && log.contains("abandoned_pulls=0"), "{log}");
    // The image the drained pull brought is in the durable records.
    let store = imaged::store::Store::open(state.path()).expect("reopen state");
    let records = store.image_records().expect("records");
    assert!(
        records.iter().any(|r| format!("{r:?}").contains("nginx")),
        "no record for nginx in {} record(s)",
        records.len()
    );
}

#[test]
fn sighup_reloads_the_log_filter_and_a_stopped_daemon_means_exit_69() {
    let cfg_dir = tempfile::tempdir().expect("dir");
    let cfg = cfg_dir.path().join("imaged.toml");
    std::fs::write(&cfg, "[log]\nfilter = \"warn\"\n").expect("write");
    let cfg_arg = cfg.display().to_string();
    let mut d = Daemon::start(&["--config", &cfg_arg]);
    let ok = d.imagectl(&["ensure", "busybox:1.36", "--pod-uid", "before"]);
    assert_eq!(ok.status.code(), Some(0));
    assert!(!d.log().contains("Pulling image"), "info lines are filtered out at warn: {}", d.log());
    let gc_settings = |o: &std::process::Output| -> serde_json::Value {
        serde_json::from_slice::<serde_json::Value>(&o.stdout).expect("json")["settings"]["gc"].clone()
    };
    let before = gc_settings(&d.imagectl(&["status", "-o", "json"]));
    assert_eq!(before["image_gc_high_threshold_percent"], 85, "{before}");

    // The log filter and the GC policy are applied live.
    std::fs::write(
        &cfg,
        "[log]\nfilter = \"info\"\n[gc]\nimage_gc_high_threshold_percent = 90\npinned_images = [\"registry.k8s.io/*\"]\n\
         [backoff]\ninitial = \"2s\"\nmax = \"30s\"\n[pull]\nregistry_pull_qps = 50\nregistry_burst = 100\n\
         [[pull.registries]]\nregistry = \"docker.io\"\nqps = 0.5\nburst = 4\n",
    )
    .expect("write");
    d.signal(Signal::SIGHUP);
    d.wait_for_log("SIGHUP: configuration reloaded", Duration::from_secs(10), "no reload");
    let ok = d.imagectl(&["ensure", "redis:7", "--pod-uid", "after"]);
    assert_eq!(ok.status.code(), Some(0));
    assert!(d.log().contains("Pulling image \"redis:7\""), "info lines appear after the reload: {}", d.log());
    assert!(!d.log().contains("only after a restart"), "nothing else changed: {}", d.log());
    assert!(d.log().contains("gc (thresholds"), "the GC policy was applied: {}", d.log());
    assert!(d.log().contains("backoff (initial, max)"), "the back-off delays were applied: {}", d.log());
    assert!(d.log().contains("back-off delays replaced"), "by the registry: {}", d.log());
    assert!(d.log().contains("initial_ms=2000"), "{}", d.log());
    assert!(d.log().contains("pull (registry_pull_qps"), "the throttle was applied: {}", d.log());
    assert!(d.log().contains("registry pull throttle replaced qps=50.0 burst=100"), "by the queue: {}", d.log());
    // GetStatus shows the settings in force, not those at start.
    let status = d.imagectl(&["status", "-o", "json"]);
    let after = gc_settings(&status);
    assert_eq!(after["image_gc_high_threshold_percent"], 90, "{after}");
    assert_eq!(after["pinned_images"], serde_json::json!(["registry.k8s.io/*"]), "{after}");
    // The throttle and back-off delays too.
    let settings = serde_json::from_slice::<serde_json::Value>(&status.stdout).expect("json")["settings"].clone();
    assert_eq!(settings["pull"]["registry_pull_qps"], 50.0, "{settings}");
    assert_eq!(settings["pull"]["registry_burst"], 100, "{settings}");
    assert_eq!(settings["backoff"]["initial"], "2s", "{settings}");
    assert_eq!(settings["backoff"]["max"], "30s", "{settings}");
    let hub = &settings["pull"]["registries"][0];
    assert_eq!((&hub["registry"], &hub["qps"], &hub["burst"]), (&"docker.io".into(), &0.5.into(), &4.into()), "{hub}");
    assert!(d.log().contains("registries=1"), "the registry's own rate was applied: {}", d.log());

    d.signal(Signal::SIGTERM);
    assert_eq!(d.wait_exit(Duration::from_secs(20)), Some(0), "{}", d.log());
    let o = d.imagectl(&["ensure", "busybox:1.36"]);
    assert_eq!(o.status.code(), Some(69), "{}", stderr(&o));
}

#[test]
fn sighup_shows_the_new_gc_thresholds_in_config_info() {
    let cfg_dir = tempfile::tempdir().expect("dir");
    let cfg = cfg_dir.path().join("imaged.toml");
    std::fs::write(&cfg, "[gc]\nimage_gc_high_threshold_percent = 85\nimage_gc_low_threshold_percent = 80\n")
        .expect("write");
    let cfg_arg = cfg.display().to_string();
    let mut d = Daemon::start(&["--config", &cfg_arg]);
    let url = format!("http://{}/metrics", d.http_addr());
    let config_info = || {
        let text = rt().block_on(async { reqwest::get(&url).await.expect("metrics").text().await.expect("body") });
        text.lines().find(|l| l.starts_with("imaged_config_info{")).map(str::to_string).unwrap_or_default()
    };
    let before = config_info();
    assert!(before.contains("image_gc_high_threshold_percent=\"85\""), "{before}");

    std::fs::write(&cfg, "[gc]\nimage_gc_high_threshold_percent = 70\nimage_gc_low_threshold_percent = 60\n")
        .expect("write");
    d.signal(Signal::SIGHUP);
    d.wait_for_log("SIGHUP: configuration reloaded", Duration::from_secs(10), "no reload");
    let after = config_info();
    assert!(after.contains("image_gc_high_threshold_percent=\"70\""), "{after}");
    assert!(after.contains("image_gc_low_threshold_percent=\"60\""), "{after}");
    // A reload of the throttle alone shows in it too; the queue's capacity
    // beside it is named, key by key, as waiting for a restart.
    std::fs::write(
        &cfg,
        "[gc]\nimage_gc_high_threshold_percent = 70\nimage_gc_low_threshold_percent = 60\n\
         [pull]\nregistry_pull_qps = 7\nregistry_burst = 3\nqueue_capacity = 4\n",
    )
    .expect("write");
    d.signal(Signal::SIGHUP);
    d.wait_for_log_count("SIGHUP: configuration reloaded", 2, Duration::from_secs(10), "no second reload");
    let throttled = config_info();
    assert!(throttled.contains("registry_pull_qps=\"7\""), "{throttled}");
    assert!(throttled.contains("registry_burst=\"3\""), "{throttled}");
    d.wait_for_log("only after a restart", Duration::from_secs(10), "no restart warning");
    let warned =
        |log: &str| log.lines().filter(|l| l.contains("only after a restart")).map(str::to_string).collect::<Vec<_>>();
    let lines = warned(&d.log());
    assert_eq!(lines.len(), 1, "none at the first reload, which changed live keys only: {lines:?}");
    assert!(lines[0].contains(r#"keys=["pull.queue_capacity"]"#), "{lines:?}");
    // Still waiting at the next SIGHUP; what was applied is not named again.
    d.signal(Signal::SIGHUP);
    d.wait_for_log_count("SIGHUP: configuration reloaded", 3, Duration::from_secs(10), "no third reload");
    d.wait_for_log_count("only after a restart", 2, Duration::from_secs(10), "no second restart warning");
    let lines = warned(&d.log());
    assert!(lines[1].contains(r#"keys=["pull.queue_capacity"]"#), "{lines:?}");
    // imagectl status and the metric say so until the key is set back.
    let status = d.imagectl(&["status"]);
    assert!(stdout(&status).contains("restart: needed to apply pull.queue_capacity"), "{}", stdout(&status));
    let metric =
        |text: &str| text.lines().find(|l| l.starts_with("imaged_config_restart_pending ")).map(str::to_string);
    let scrape = || rt().block_on(async { reqwest::get(&url).await.expect("metrics").text().await.expect("body") });
    assert_eq!(metric(&scrape()).as_deref(), Some("imaged_config_restart_pending 1"));
    // Set back, and a key written otherwise with its default meaning
    // ("300s" for "5m"): nothing waits.
    std::fs::write(
        &cfg,
        "[gc]\nimage_gc_high_threshold_percent = 70\nimage_gc_low_threshold_percent = 60\ngc_period = \"300s\"\n\
         [pull]\nregistry_pull_qps = 7\nregistry_burst = 3\n",
    )
    .expect("write");
    d.signal(Signal::SIGHUP);
    d.wait_for_log_count("SIGHUP: configuration reloaded", 4, Duration::from_secs(10), "no fourth reload");
    // The gauge is set after the warning would be written.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while metric(&scrape()).as_deref() != Some("imaged_config_restart_pending 0") {
        assert!(std::time::Instant::now() < deadline, "{:?}", metric(&scrape()));
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(warned(&d.log()).len(), 2, "set back: nothing waits");
    let status = d.imagectl(&["status"]);
    assert!(!stdout(&status).contains("restart:"), "{}", stdout(&status));
    d.signal(Signal::SIGTERM);
    assert_eq!(d.wait_exit(Duration::from_secs(20)), Some(0), "{}", d.log());
}

#[test]
fn a_node_refuses_new_work_once_stopping_and_drains_what_runs() {
    actix::System::new().block_on(async {
        let dir = tempfile::tempdir().expect("dir");
        let mut cfg = imaged::config::Config::defaults().expect("defaults");
        cfg.endpoint = imaged::config::RuntimeEndpoint::Embedded { socket: Some(dir.path().join("cri.sock")) };
        let node = std::sync::Arc::new(imaged::node::Node::start(cfg).await.expect("node"));
        let n2 = node.clone();
        // nginx takes 400 ms; shutdown starts while it runs.
        let running = tokio::spawn(async move {
            let req = imaged::ensure::EnsureImageRequest::new(
                "p1",
                "nginx:1.27",
                imaged::domain::pull_policy::PullPolicy::IfNotPresent,
            );
            n2.ensure_image_exists(&req).await
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        let shutdown = node.shutdown(Duration::from_secs(10));
        tokio::pin!(shutdown);
        // Let shutdown mark the node, then try new work.
        tokio::select! {
            _ = &mut shutdown => panic!("shutdown finished before the pull"),
            () = tokio::time::sleep(Duration::from_millis(10)) => {}
        }
        let req = imaged::ensure::EnsureImageRequest::new(
            "p2",
            "redis:7",
            imaged::domain::pull_policy::PullPolicy::IfNotPresent,
        );
        assert_eq!(node.ensure_image_exists(&req).await.expect_err("refused"), imaged::node::NodeError::ShuttingDown);
        assert!(matches!(node.garbage_collect(true).await, Err(imaged::node::NodeError::ShuttingDown)));
        let report = shutdown.await;
        assert_eq!(report.abandoned_pulls, 0);
        let done = running.await.expect("task").expect("accepted before shutdown").expect("pulled");
        assert!(done.image_ref.starts_with("sha256:"));
    });
}

#[test]
fn metrics_and_health_are_served_next_to_the_api() {
    let d = Daemon::start(&[]);
    assert_eq!(d.imagectl(&["ensure", "busybox:1.36", "--pod-uid", "m1"]).status.code(), Some(0));
    assert_eq!(d.imagectl(&["ensure", "busybox:1.36", "--pod-uid", "m2"]).status.code(), Some(0));
    let base = format!("http://{}", d.http_addr());
    rt().block_on(async {
        let client = reqwest::Client::new();
        let get = |path: &str| client.get(format!("{base}{path}")).send();
        let ready = get("/readyz").await.expect("readyz");
        assert_eq!(ready.status(), 200);
        let live = get("/healthz").await.expect("healthz");
        assert_eq!(live.status(), 200);
        let text = get("/metrics").await.expect("metrics").text().await.expect("body");
        let value = |needle: &str| -> f64 {
            text.lines()
                .find(|l| l.starts_with(needle))
                .and_then(|l| l.rsplit(' ').next())
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{needle} not in\n{text}"))
        };
        // One pull (absent), one present: the kubelet's labels.
        assert_eq!(
            value(
                "imaged_image_manager_ensure_image_requests_total{pull_policy=\"ifnotpresent\",present_locally=\"false\",pull_required=\"true\"}"
            ),
            1.0
        );
        assert_eq!(
            value(
                "imaged_image_manager_ensure_image_requests_total{pull_policy=\"ifnotpresent\",present_locally=\"true\",pull_required=\"false\"}"
            ),
            1.0
        );
        assert!(value("imaged_cri_request_duration_seconds_count{method=\"PullImage\"}") >= 1.0);
    });
}

#[test]
fn idle_connections_to_the_metrics_port_cannot_take_the_descriptors_the_api_needs() {
    // A low limit, as a unit without LimitNOFILE= gets (1024), scaled down:
    // 400 connections that send nothing are more than the daemon has.
    let mut d = Daemon::start_with_open_file_limit(&[], 160);
    let addr: std::net::SocketAddr = d.http_addr().parse().expect("address");
    let idle: Vec<std::net::TcpStream> =
        (0..400).filter_map(|_| std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()).collect();
    assert!(idle.len() >= 300, "the kernel queues what imaged closes: {}", idle.len());
    // The API socket still accepts, and works.
    let out = d.imagectl(&["ensure", "busybox:1.36", "--pod-uid", "fd1"]);
    assert_eq!(out.status.code(), Some(0), "{}\n{}", stderr(&out), d.log());
    assert!(d.running());
    d.wait_for_log("connection limit reached", Duration::from_secs(10), "the cap is logged");
    drop(idle);
    // Freed places serve a scrape again.
    let base = format!("http://{addr}");
    rt().block_on(async {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            let r = reqwest::Client::new().get(format!("{base}/healthz")).timeout(Duration::from_secs(2)).send().await;
            if matches!(&r, Ok(r) if r.status() == 200) {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "healthz after the idle connections went: {r:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    let warnings = d.log().matches("connection limit reached").count();
    assert!(warnings <= 3, "a warning per episode, not per connection: {warnings}");
}

/// The reply of a pull overtakes its `Pulled` event, which waits for the
/// image's size: `imagectl ensure` waits for that event past the half
/// second it gives any other reply.
#[test]
fn imagectl_ensure_prints_the_pulled_event_of_a_size_lookup_slower_than_half_a_second() {
    let dir = tempfile::tempdir().expect("dir");
    let plan = dir.path().join("faults.toml");
    // Only the size lookup names the image by its id.
    let rule = "[[rule]]\nrpc = \"ImageStatus\"\nimage = \"sha256:*\"\naction = \"delay\"\ndelay = \"1500ms\"\n";
    std::fs::write(&plan, rule).expect("write plan");
    let plan_arg = format!("runtime.fault_plan={}", plan.display());
    let d = Daemon::start(&["--set", &plan_arg]);
    let o = d.imagectl(&["ensure", "busybox:1.36", "--pod", "web/front-1", "--pod-uid", "u1"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(err.contains("Successfully pulled image \"busybox:1.36\" in "), "{err}");
}

#[test]
fn a_fault_plan_file_injects_failures_and_a_panic_ends_the_daemon_loudly() {
    use std::os::unix::process::ExitStatusExt;
    let dir = tempfile::tempdir().expect("dir");
    let plan = dir.path().join("faults.toml");
    std::fs::write(
        &plan,
        r#"
        [[rule]]
        rpc = "PullImage"
        image = "*redis:*"
        action = "fail"
        kind = "RegistryUnavailable"
        message = "RegistryUnavailable: injected outage"
        [[rule]]
        rpc = "PullImage"
        image = "*nginx:*"
        action = "panic"
        "#,
    )
    .expect("write plan");
    let plan_arg = format!("runtime.fault_plan={}", plan.display());
    let mut d = Daemon::start(&["--set", &plan_arg]);
    // Injected failure: the kubelet's reason for an unreachable registry.
    let o = d.imagectl(&["ensure", "redis:7"]);
    assert_eq!(o.status.code(), Some(2), "{}", stdout(&o));
    assert!(
        stdout(&o).starts_with("RegistryUnavailable: ") && stdout(&o).contains("injected outage"),
        "{}",
        stdout(&o)
    );
    // Other images are untouched.
    assert_eq!(d.imagectl(&["ensure", "busybox:1.36"]).status.code(), Some(0));
    // An injected panic (a stand-in for a bug): the daemon does not go on half-alive.
    let o = d.imagectl(&["ensure", "nginx:1.27"]);
    assert_ne!(o.status.code(), Some(0), "{}", stdout(&o));
    let status = d.wait_status(Duration::from_secs(20));
    assert_eq!(status.signal(), Some(nix::libc::SIGABRT), "{status:?}: {}", d.log());
    let log = d.log();
    assert!(log.contains("a panic is a bug; aborting") && log.contains("injected panic in the CRI gateway"), "{log}");

    // A bad plan is a configuration error naming the key and the rule.
    std::fs::write(&plan, "[[rule]]\nrpc = \"PullImage\"\naction = \"explode\"\n").expect("write");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_imaged"))
        .args(["--set", &plan_arg, "check-config"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(64));
    let err = stderr(&out);
    assert!(err.contains("runtime.fault_plan") && err.contains("rule 1: action: unknown action \"explode\""), "{err}");
}

#[test]
fn sigterm_while_waiting_for_the_runtime_exits_0_at_once() {
    let dir = tempfile::tempdir().expect("dir");
    let log = std::fs::File::create(dir.path().join("log")).expect("log");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_imaged"))
        .env_remove("RUST_LOG")
        .args(["--runtime-endpoint", &format!("unix://{}", dir.path().join("nobody.sock").display())])
        .args(["--set", "runtime.startup_timeout=60s", "--set", "daemon.metrics_address="])
        .args(["--set", &format!("daemon.socket={}", dir.path().join("api.sock").display())])
        .arg("run")
        .stderr(log)
        .spawn()
        .expect("spawn");
    std::thread::sleep(Duration::from_millis(500));
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).expect("pid"));
    nix::sys::signal::kill(pid, Signal::SIGTERM).expect("kill");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        assert!(std::time::Instant::now() < deadline, "still waiting for the runtime after SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(0));
    let text = std::fs::read_to_string(dir.path().join("log")).expect("log");
    assert!(text.contains("stopped while starting"), "{text}");
    // The wait was said, once, at the default level: what for and how long.
    let waiting = "waiting for the CRI runtime to answer (runtime.startup_timeout 1m0s)";
    assert_eq!(text.matches(waiting).count(), 1, "{text}");
    assert!(text.lines().any(|l| l.contains(waiting) && l.contains("nobody.sock")), "{text}");
}

#[test]
fn imagectl_ensure_takes_a_yaml_pull_secret_and_never_prints_its_password() {
    let d = Daemon::start(&[]);
    let private = "registry.example.com/team/app:v1";
    // Without the secret: the registry's refusal, as the kubelet words it.
    let o = d.imagectl(&["ensure", private, "--pod-uid", "p-none"]);
    assert_eq!(o.status.code(), Some(2), "{}", stdout(&o));
    assert!(stdout(&o).starts_with("ErrImagePull: ") && stdout(&o).contains("401"), "{}", stdout(&o));
    // With a YAML kubernetes.io/dockerconfigjson Secret manifest.
    let config = r#"{"auths":{"registry.example.com":{"username":"team","password":"team-password"}}}"#;
    let yaml = format!(
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: regcred\n  namespace: default\ntype: kubernetes.io/dockerconfigjson\nstringData:\n  .dockerconfigjson: '{config}'\n"
    );
    let file = d.dir.path().join("regcred.yaml");
    std::fs::write(&file, yaml).expect("write secret");
    let secret_arg = file.display().to_string();
    let o = d.imagectl(&["ensure", private, "--pod-uid", "p-secret", "--secret", &secret_arg]);
    assert_eq!(o.status.code(), Some(0), "{} {}", stdout(&o), stderr(&o));
    // Another secret with a wrong password: the image is present, but this
    // pod must prove access (KEP-2535), so it pulls with it and is refused;
    // the password is nowhere. (The same secret with a new password would be
    // trusted as a rotation, as the kubelet does.)
    let wrong = std::fs::read_to_string(&file)
        .expect("read")
        .replace("team-password", "n0t-the-pw")
        .replace("name: regcred", "name: other");
    std::fs::write(&file, wrong).expect("write");
    let o = d.imagectl(&["ensure", private, "--pod-uid", "p-wrong", "--secret", &secret_arg]);
    assert_eq!(o.status.code(), Some(2), "{}", stdout(&o));
    let all = format!("{}{}{}", stdout(&o), stderr(&o), d.log());
    assert!(!all.contains("n0t-the-pw") && !all.contains("team-password"), "a password leaked: {all}");
    let o = d.imagectl(&["events"]);
    assert!(!stdout(&o).contains("n0t-the-pw"), "{}", stdout(&o));
}

#[test]
fn a_node_applies_only_the_live_part_of_new_gc_settings() {
    actix::System::new().block_on(async {
        let dir = tempfile::tempdir().expect("dir");
        let mut cfg = imaged::config::Config::defaults().expect("defaults");
        cfg.endpoint = imaged::config::RuntimeEndpoint::Embedded { socket: Some(dir.path().join("cri.sock")) };
        let node = imaged::node::Node::start(cfg).await.expect("node");
        let start = node.gc_settings();
        assert!(!node.update_gc_policy(&start), "the same settings change nothing");

        // A period needs a restart: not applied, not shown.
        let slower = imaged::config::GcSettings { gc_period: start.gc_period * 2, ..start.clone() };
        assert!(!node.update_gc_policy(&slower));
        assert_eq!(node.gc_settings(), start);

        // Thresholds are live; the period in the same update still is not.
        let both = imaged::config::GcSettings { high_threshold_percent: 90, ..slower };
        assert!(node.update_gc_policy(&both));
        let now = node.gc_settings();
        assert_eq!(now.high_threshold_percent, 90);
        assert_eq!(now.gc_period, start.gc_period);
        assert_eq!(
            node.config().gc.high_threshold_percent,
            start.high_threshold_percent,
            "config() stays the start config"
        );

        // The min age is also the detector's "ensured recently" window.
        let req = imaged::ensure::EnsureImageRequest::new(
            "p1",
            "busybox:1.36",
            imaged::domain::pull_policy::PullPolicy::IfNotPresent,
        );
        let id = node.ensure_image_exists(&req).await.expect("accepted").expect("pulled").image_ref;
        let detect = || node.gc().detector.send(imaged::actors::detector::DetectImages);
        let in_use = |d: &imaged::actors::detector::Detection| d.in_use.get(&id).map(|w| w.join(","));
        let before = detect().await.expect("detector").expect("detection");
        assert_eq!(in_use(&before).as_deref(), Some("ensured recently"), "within the 2m window");
        let shorter = imaged::config::GcSettings { min_age: Duration::from_millis(1), ..now };
        assert!(node.update_gc_policy(&shorter));
        tokio::time::sleep(Duration::from_millis(20)).await;
        let after = detect().await.expect("detector").expect("detection");
        assert_eq!(in_use(&after), None, "ensured 20 ms ago with a 1 ms window");
        node.shutdown(Duration::from_secs(5)).await;
    });
}

#[test]
fn imaged_run_serves_the_kubelets_image_calls_on_its_cri_socket() {
    let dir = tempfile::Builder::new().prefix("imdc").tempdir_in("/tmp").expect("tempdir");
    let cri = dir.path().join("cri.sock");
    let d = Daemon::start(&["--set", &format!("cri_server.socket={}", cri.display())]);
    let mode = std::fs::metadata(&cri).expect("CRI socket").permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "CRI socket mode {mode:o}");
    rt().block_on(async {
        use imaged::cri::proto as pb;
        let channel = imaged::cri::CriEndpoint::Unix(cri.clone()).channel(Duration::from_secs(5)).expect("channel");
        let mut kubelet = pb::image_service_client::ImageServiceClient::new(channel);
        let spec = pb::ImageSpec { image: "docker.io/library/busybox:1.36".into(), ..Default::default() };
        let pulled = kubelet
            .pull_image(pb::PullImageRequest { image: Some(spec.clone()), auth: None, sandbox_config: None })
            .await
            .expect("PullImage through imaged")
            .into_inner();
        let status = kubelet
            .image_status(pb::ImageStatusRequest { image: Some(spec), verbose: false })
            .await
            .expect("ImageStatus")
            .into_inner();
        assert_eq!(status.image.map(|i| i.id), Some(pulled.image_ref.clone()));
        // imaged's own API sees the image the kubelet pulled.
        let mut c = imaged::api::client(&d.socket).expect("client");
        let images = c.list_images(proto::ListImagesRequest {}).await.expect("rpc").into_inner().images;
        assert!(images.iter().any(|i| i.id == pulled.image_ref), "{images:?}");
    });
    assert!(d.log().contains("CRI ImageService serving"), "{}", d.log());
    assert!(!d.log().contains("local_fallback"), "no outage fallback, no warning about it: {}", d.log());
    // imagectl as crictl with an image endpoint: the README's walk-through.
    let endpoint = format!("unix://{}", cri.display());
    let pulled = d.imagectl(&["cri", "--image-endpoint", &endpoint, "pull", "docker.io/library/redis:7"]);
    assert!(pulled.status.success(), "{}", stderr(&pulled));
    assert!(stdout(&pulled).starts_with("Image is up to date for sha256:"), "{}", stdout(&pulled));
    let status = d.imagectl(&["cri", "--image-endpoint", &endpoint, "inspecti", "docker.io/library/redis:7"]);
    assert_eq!(status.status.code(), Some(0), "{}", stderr(&status));
    // As crictl, `version` and `ps` go to the runtime endpoint: the daemon's
    // runtime, named; with none named (the `embedded` default) imagectl
    // refuses rather than answer from a runtime of its own.
    let version = d.imagectl(&["cri", "--image-endpoint", &endpoint, "version"]);
    assert_eq!(version.status.code(), Some(64), "{}", stderr(&version));
    assert!(stderr(&version).contains("runtime.endpoint is \"embedded\""), "{}", stderr(&version));
    let runtime = format!("unix://{}", d.dir.path().join("cri.sock").display());
    let version = d.imagectl(&["--runtime-endpoint", &runtime, "cri", "--image-endpoint", &endpoint, "version"]);
    assert_eq!(version.status.code(), Some(0), "{}", stderr(&version));
    assert!(stdout(&version).contains("imaged-embedded"), "the runtime's answer: {}", stdout(&version));
    let ps = d.imagectl(&["--runtime-endpoint", &runtime, "cri", "--image-endpoint", &endpoint, "ps", "-a"]);
    assert_eq!(ps.status.code(), Some(0), "{}", stderr(&ps));
}

#[test]
fn imaged_run_warns_when_the_fronts_outage_fallback_may_not_decide_as_the_kubelet() {
    let dir = tempfile::Builder::new().prefix("imdf").tempdir_in("/tmp").expect("tempdir");
    let cri = dir.path().join("cri.sock");
    // No --kubelet-config, and the records in memory.
    let d = Daemon::start(&[
        "--set",
        &format!("cri_server.socket={}", cri.display()),
        "--set",
        r#"cri_server.local_fallback_namespaces=["shop"]"#,
        "--set",
        "state.dir=memory",
    ]);
    let log = d.log();
    assert!(log.contains("CRI ImageService serving"), "{log}");
    assert!(
        log.contains("without the kubelet's configuration (--kubelet-config) imaged cannot tell"),
        "the policy cannot be checked: {log}"
    );
    assert!(log.contains(r#"pull records are in memory (state.dir = "memory")"#), "{log}");
}

#[test]
fn imaged_run_warns_when_the_kubelets_config_bypasses_or_holds_back_its_front() {
    let dir = tempfile::Builder::new().prefix("imkb").tempdir_in("/tmp").expect("tempdir");
    let cri = dir.path().join("cri.sock");
    let start = |name: &str, fields: &str| {
        let kubelet = dir.path().join(name);
        let yaml = format!("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n{fields}");
        std::fs::write(&kubelet, yaml).expect("write");
        let d = Daemon::start(&[
            "--kubelet-config",
            kubelet.to_str().expect("utf-8"),
            "--set",
            &format!("cri_server.socket={}", cri.display()),
            // The runtime stays the embedded one, whatever the file says.
            "--set",
            "runtime.endpoint=embedded",
        ]);
        let log = d.log();
        assert!(log.contains("CRI ImageService serving"), "{log}");
        log
    };
    const BYPASS: &str = "the kubelet's imageServiceEndpoint is not imaged's CRI socket: its image calls bypass imaged";
    const SERIAL: &str = "the kubelet serializes its image pulls (serializeImagePulls is not false)";
    const QPS: &str = "the kubelet throttles its image pulls (registryPullQPS is not 0)";

    // A kubelet left as it was: its image calls go to containerd, one at a
    // time, at its default 5 QPS.
    let log = start("kubelet.yaml", "imageServiceEndpoint: unix:///run/containerd/containerd.sock\n");
    for warning in [BYPASS, SERIAL, QPS] {
        assert!(log.contains(warning), "{warning}: {log}");
    }
    assert!(log.contains(r#"image_service_endpoint="unix:///run/containerd/containerd.sock""#), "{log}");

    // The patch the deploy files give: no warning.
    let patched =
        format!("imageServiceEndpoint: unix://{}\nserializeImagePulls: false\nregistryPullQPS: 0\n", cri.display());
    let log = start("patched.yaml", &patched);
    for warning in [BYPASS, SERIAL, QPS] {
        assert!(!log.contains(warning), "{warning}: {log}");
    }
    // serializeImagePulls unset with maxParallelImagePulls 2 or more: the
    // kubelet's defaulting makes its pulls parallel.
    let parallel = patched.replace("serializeImagePulls: false", "maxParallelImagePulls: 4");
    let log = start("parallel.yaml", &parallel);
    assert!(!log.contains(SERIAL), "{log}");
    let log = start("one.yaml", &patched.replace("serializeImagePulls: false", "maxParallelImagePulls: 1"));
    assert!(log.contains(SERIAL), "{log}");
}

/// The embedded runtime served on its own (its images outlive imaged's
/// restarts), stopped on drop.
struct ServedRuntime(std::process::Child);

impl Drop for ServedRuntime {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_socket_activated_cri_socket_holds_the_kubelets_calls_while_imaged_restarts() {
    use imaged::cri::proto as pb;
    use std::time::Instant;
    let dir = tempfile::Builder::new().prefix("imsa").tempdir_in("/tmp").expect("tempdir");
    let (runtime, endpoint) = served_runtime(dir.path());
    // The service manager's socket (imaged-cri.socket): bound once, passed
    // to each imaged.
    let cri = dir.path().join("cri.sock");
    let listener = std::os::unix::net::UnixListener::bind(&cri).expect("bind the CRI socket");
    let front = format!("cri_server.socket={}", cri.display());
    let args = ["--set", endpoint.as_str(), "--set", front.as_str()];
    let mut first = Daemon::start_activated(&args, &listener);
    let serving = |d: &Daemon| {
        d.wait_for_log("socket_activated=true", Duration::from_secs(10), "the CRI front serves the passed socket");
    };
    serving(&first);
    let images: Vec<String> = imaged::embedded::demo_catalogue()
        .into_iter()
        .map(|i| i.name)
        .filter(|r| !r.contains("registry.example.com"))
        .collect();
    let channel = || imaged::cri::CriEndpoint::Unix(cri.clone()).channel(Duration::from_secs(5)).expect("channel");
    rt().block_on(async {
        // Four pods per image, each pulling as the kubelet does: a failed
        // call is retried (the kubelet's back-off, shortened).
        let mut pulls = Vec::new();
        for image in images.iter().cycle().take(4 * images.len()) {
            let mut kubelet = pb::image_service_client::ImageServiceClient::new(channel());
            let spec = pb::ImageSpec { image: image.clone(), ..Default::default() };
            pulls.push(tokio::spawn(async move {
                let mut failures = 0;
                loop {
                    let req = pb::PullImageRequest { image: Some(spec.clone()), auth: None, sandbox_config: None };
                    match kubelet.pull_image(req).await {
                        Ok(r) => return Ok::<_, String>((r.into_inner().image_ref, failures)),
                        Err(e) if failures < 100 => {
                            failures += 1;
                            let _ = e;
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                        Err(e) => return Err(format!("{}: {e}", spec.image)),
                    }
                }
            }));
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        // A crash in the middle of the burst.
        first.signal(Signal::SIGKILL);
        first.wait_status(Duration::from_secs(10));
        let down = Instant::now();
        // A call made while no imaged runs waits in the socket's backlog and
        // is answered by the next one: not refused.
        let mut waiting = pb::image_service_client::ImageServiceClient::new(channel());
        let gap_call = tokio::spawn(async move { waiting.image_fs_info(pb::ImageFsInfoRequest {}).await });
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!gap_call.is_finished(), "the call waits while imaged is down");
        let passed = listener.try_clone().expect("listener");
        let args: Vec<String> = args.iter().map(|a| (*a).to_string()).collect();
        let second = tokio::task::spawn_blocking(move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            Daemon::start_activated(&args, &passed)
        })
        .await
        .expect("second imaged");
        let fs = tokio::time::timeout(Duration::from_secs(30), gap_call)
            .await
            .expect("answered after the restart")
            .expect("task")
            .expect("ImageFsInfo made while imaged was down succeeds");
        let restart = down.elapsed();
        assert!(!fs.into_inner().image_filesystems.is_empty());
        let mut retried = 0;
        for p in pulls {
            let (image_ref, failures) = tokio::time::timeout(Duration::from_secs(60), p)
                .await
                .expect("every pull ends")
                .expect("task")
                .expect("every pull succeeds in the end");
            assert!(image_ref.starts_with("sha256:"), "{image_ref}");
            retried += usize::from(failures > 0);
        }
        let mut kubelet = pb::image_service_client::ImageServiceClient::new(channel());
        for image in &images {
            let spec = pb::ImageSpec { image: image.clone(), ..Default::default() };
            let status = kubelet.image_status(pb::ImageStatusRequest { image: Some(spec), verbose: false }).await;
            assert!(status.expect("ImageStatus").into_inner().image.is_some(), "{image} present");
        }
        eprintln!("restart under a burst: {restart:?} from the crash to the first answer; {retried} pulls retried");
        serving(&second);
        assert!(restart < Duration::from_secs(20), "restart took {restart:?}");
    });
    assert!(cri.exists(), "the service manager's socket file stays when imaged exits");
    drop(runtime);
}

/// `imaged embedded-runtime --socket` on its own: its image filesystem's
/// mountpoint exists only inside its simulation, so it is not on this host.
fn served_runtime(dir: &std::path::Path) -> (ServedRuntime, String) {
    use std::time::Instant;
    let rt_sock = dir.join("rt.sock");
    let runtime = ServedRuntime(
        std::process::Command::new(env!("CARGO_BIN_EXE_imaged"))
            .args(["embedded-runtime", "--socket"])
            .arg(&rt_sock)
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("embedded runtime"),
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::os::unix::net::UnixStream::connect(&rt_sock).is_err() {
        assert!(Instant::now() < deadline, "the embedded runtime did not serve");
        std::thread::sleep(Duration::from_millis(20));
    }
    (runtime, format!("runtime.endpoint=unix://{}", rt_sock.display()))
}

#[test]
fn gc_on_a_runtime_whose_image_filesystem_is_not_on_this_host() {
    let dir = tempfile::Builder::new().prefix("imgc").tempdir_in("/tmp").expect("tempdir");
    let (_runtime, endpoint) = served_runtime(dir.path());

    // Without a capacity: a clear refusal naming the mountpoint and the key.
    let d = Daemon::start(&["--set", endpoint.as_str()]);
    let o = d.imagectl(&["gc", "--dry-run"]);
    assert_eq!(o.status.code(), Some(1), "{}{}", stdout(&o), stderr(&o));
    let err = stderr(&o);
    assert!(err.contains("/var/lib/imaged/embedded") && err.contains("gc.image_fs_capacity"), "{err}");
    drop(d);

    // With one: the reported used bytes against it, and the report says so.
    let d = Daemon::start(&["--set", endpoint.as_str(), "--set", "gc.image_fs_capacity=107374182400"]);
    let o = d.imagectl(&["gc", "--dry-run"]);
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
    let out = stdout(&o);
    assert!(
        out.contains("disk measured by: ImageFsInfo used bytes, capacity 107374182400 bytes from gc.image_fs_capacity (/var/lib/imaged/embedded is not on this host)"),
        "{out}"
    );
    let o = d.imagectl(&["-o", "json", "gc", "--dry-run"]);
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("json");
    assert!(v["measured_by"].as_str().is_some_and(|m| m.starts_with("ImageFsInfo used bytes")), "{v}");
    assert!(v["usage_percent"].is_u64(), "{v}");
}

#[test]
fn gc_on_the_in_process_embedded_runtime_says_it_measured_the_simulation() {
    let d = Daemon::start(&[]);
    let o = d.imagectl(&["gc", "--dry-run"]);
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
    assert!(stdout(&o).contains("disk measured by: the embedded runtime's simulated filesystem"), "{}", stdout(&o));
}

#[test]
fn a_gc_that_misses_its_target_still_reports_what_it_removed_and_why() {
    let dir = tempfile::Builder::new().prefix("imgm").tempdir_in("/tmp").expect("tempdir");
    let (_runtime, endpoint) = served_runtime(dir.path());
    // busybox (4.3 MB) and redis (45 MB, pinned) on 80 MB: 61% used, above
    // 50%; the 10% target needs redis gone, so removing busybox misses it.
    let cfg = dir.path().join("imaged.toml");
    std::fs::write(
        &cfg,
        "[gc]\nimage_gc_high_threshold_percent = 50\nimage_gc_low_threshold_percent = 10\n\
         image_minimum_gc_age = \"0s\"\nimage_fs_capacity = 80000000\npinned_images = [\"docker.io/library/redis:7\"]\n",
    )
    .expect("write");
    let cfg_arg = cfg.display().to_string();
    let d = Daemon::start(&["--config", &cfg_arg, "--set", endpoint.as_str()]);
    for image in ["busybox:1.36", "redis:7"] {
        let o = d.imagectl(&["ensure", image, "--pod-uid", "p"]);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    }
    let o = d.imagectl(&["-o", "json", "gc"]);
    assert_eq!(o.status.code(), Some(1), "the run failed: {}{}", stdout(&o), stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("a JSON report on stdout");
    let removed: Vec<&str> = v["removed"].as_array().expect("removed").iter().filter_map(|r| r.as_str()).collect();
    assert_eq!(removed.len(), 1, "busybox only: {v}");
    let now_ms = i64::try_from(
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("after 1970").as_millis(),
    )
    .expect("fits");
    let started = v["started_ms"].as_str().and_then(|s| s.parse::<i64>().ok()).or_else(|| v["started_ms"].as_i64());
    assert!(started.is_some_and(|t| t <= now_ms && now_ms - t < 60_000), "when the run began: {v}");
    assert_eq!(v["bytes_expected"], 4_261_574, "{v}");
    assert!(v["bytes_freed_measured"].as_i64().is_some_and(|b| b > 0), "{v}");
    let missed = v["target_missed"].as_str().expect("target_missed");
    assert!(missed.contains("Failed to free sufficient space"), "the kubelet's reason: {v}");

    let status = stdout(&d.imagectl(&["status"]));
    let line = status.lines().find(|l| l.starts_with("last gc:")).expect("a last gc line");
    assert!(line.contains("removed 1 image(s)") && line.contains("freed"), "{status}");
    assert!(line.contains("s ago), delete-unused") || line.contains("s ago), threshold"), "when it ran: {status}");
    assert!(line.contains("target missed: Insufficient free disk space"), "{status}");
}

/// A daemon whose pull of nginx a fault plan holds (`action`: the rule's
/// action lines), and one ensure of it under way (its pull started).
struct HeldPull {
    _dir: tempfile::TempDir,
    daemon: Daemon,
    runtime: tokio::runtime::Runtime,
    ensure: tokio::task::JoinHandle<Result<tonic::Response<proto::EnsureImageResponse>, tonic::Status>>,
}

impl HeldPull {
    fn start(action: &str, args: &[&str]) -> Self {
        let dir = tempfile::tempdir().expect("dir");
        let plan = dir.path().join("faults.toml");
        std::fs::write(&plan, format!("[[rule]]\nrpc = \"PullImage\"\nimage = \"*nginx:*\"\n{action}\n"))
            .expect("plan");
        let plan_arg = format!("runtime.fault_plan={}", plan.display());
        let daemon = Daemon::start(&[&["--set", plan_arg.as_str()], args].concat());
        let socket = daemon.socket.clone();
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("rt");
        let ensure = runtime.spawn(async move {
            let mut c = imaged::api::client(&socket).expect("client");
            c.ensure_image(ensure_req("p1", "nginx:1.27", "IfNotPresent")).await
        });
        daemon.wait_for_log("Pulling image \"nginx:1.27\"", Duration::from_secs(10), "pull never started");
        HeldPull { _dir: dir, daemon, runtime, ensure }
    }
}

#[test]
fn a_call_during_the_drain_gets_unavailable_with_the_reason_not_no_daemon() {
    // nginx's pull is held 3 s: the drain lasts that long.
    let held = HeldPull::start("action = \"delay\"\ndelay = \"3s\"", &[]);
    let (mut d, runtime, slow) = (held.daemon, held.runtime, held.ensure);
    d.signal(Signal::SIGTERM);
    d.wait_for_log("shutting down: no new requests", Duration::from_secs(10), "no shutdown");
    // Draining: the socket is there and a new call is refused with the reason.
    assert!(d.socket.exists(), "the socket stays while pulls drain");
    let o = d.imagectl(&["ensure", "busybox:1.36", "--pod-uid", "late"]);
    assert_eq!(o.status.code(), Some(69), "{}", stderr(&o));
    assert!(stderr(&o).contains("imaged is shutting down"), "the reason, not no daemon: {}", stderr(&o));
    assert!(!slow.is_finished(), "the call came during the drain");

    let r = runtime.block_on(slow).expect("task").expect("the drained ensure completes").into_inner();
    assert!(matches!(r.result, Some(proto::ensure_image_response::Result::Ok(_))), "{r:?}");
    assert_eq!(d.wait_exit(Duration::from_secs(20)), Some(0), "{}", d.log());
    assert!(!d.socket.exists(), "socket removed on exit");
}

/// #19: the restart that used to open a private image to every pod. Pod A
/// pulls it with its secret; imaged restarts on the same runtime (whose
/// images outlive it); pod B, without a secret, must still not get it.
#[test]
fn a_private_image_stays_private_across_a_restart_with_durable_records() {
    let dir = tempfile::Builder::new().prefix("imrs").tempdir_in("/tmp").expect("tempdir");
    let (_runtime, endpoint) = served_runtime(dir.path());
    let private = "registry.example.com/team/app:v1";
    let secret = dir.path().join("regcred.yaml");
    let config = r#"{"auths":{"registry.example.com":{"username":"team","password":"team-password"}}}"#;
    std::fs::write(
        &secret,
        format!(
            "apiVersion: v1\nkind: Secret\nmetadata:\n  name: regcred\n  namespace: default\n\
             type: kubernetes.io/dockerconfigjson\nstringData:\n  .dockerconfigjson: '{config}'\n"
        ),
    )
    .expect("write secret");
    let secret_arg = secret.display().to_string();
    let state = format!("state.dir={}", dir.path().join("state").display());
    let ensure = |d: &Daemon, pod: &str, policy: &str, with_secret: bool| {
        let mut args = vec!["ensure", private, "--pod-uid", pod, "--policy", policy];
        if with_secret {
            args.extend(["--secret", &secret_arg]);
        }
        d.imagectl(&args)
    };

    let mut first = Daemon::start(&["--set", endpoint.as_str(), "--set", state.as_str()]);
    let o = ensure(&first, "pod-a", "IfNotPresent", true);
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    first.signal(Signal::SIGTERM);
    assert_eq!(first.wait_exit(Duration::from_secs(20)), Some(0), "{}", first.log());

    let second = Daemon::start(&["--set", endpoint.as_str(), "--set", state.as_str()]);
    let o = ensure(&second, "pod-b", "Never", false);
    assert_eq!(o.status.code(), Some(2), "{}{}", stdout(&o), stderr(&o));
    assert!(stdout(&o).starts_with("ErrImageNeverPull: "), "{}", stdout(&o));
    let o = ensure(&second, "pod-b", "IfNotPresent", false);
    assert_eq!(o.status.code(), Some(2), "pulled without credentials, refused: {}", stdout(&o));
    assert!(stdout(&o).starts_with("ErrImagePull: ") && stdout(&o).contains("401"), "{}", stdout(&o));
    // The pod that pulled it keeps it, without a new pull.
    let o = ensure(&second, "pod-a", "Never", true);
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    assert!(!second.log().contains("state.dir = \"memory\""), "durable: no warning: {}", second.log());
    drop(second);

    // What the durable default prevents: records in memory only forget
    // pod A's pull, the image counts as preloaded, pod B gets it, and
    // imaged said at start that this would happen.
    let memory = Daemon::start(&["--set", endpoint.as_str(), "--set", "state.dir=memory"]);
    let o = ensure(&memory, "pod-b", "Never", false);
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    assert!(memory.log().contains("state.dir = \"memory\": pull records are forgotten on restart"), "{}", memory.log());
}

#[test]
fn a_socket_path_that_cannot_be_bound_is_an_error_naming_it_not_a_panic() {
    let dir = tempfile::tempdir().expect("dir");
    let taken = dir.path().join("a-directory");
    std::fs::create_dir(&taken).expect("dir");
    for key in ["daemon.socket", "cri_server.socket"] {
        let api = dir.path().join(format!("{key}.api.sock"));
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_imaged"))
            .env_remove("RUST_LOG")
            .args(["--set", &format!("daemon.socket={}", api.display())])
            .args(["--set", &format!("{key}={}", taken.display())])
            .args(["--set", &format!("state.dir={}", dir.path().join("state").display())])
            .args(["--set", "daemon.metrics_address=", "run"])
            .output()
            .expect("run");
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{key}: {err}");
        let name = if key == "daemon.socket" { "API socket" } else { "CRI socket" };
        let want = format!("{name} {}: the path exists and is not a socket", taken.display());
        assert!(err.contains(&want) && !err.contains("panic"), "{key}: {err}");
    }
    // Stopped, not aborted: the state was closed cleanly.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_imaged"))
        .env_remove("RUST_LOG")
        .args(["--set", &format!("daemon.socket={}", taken.display())])
        .args(["--set", &format!("state.dir={}", dir.path().join("state").display())])
        .args(["--set", "daemon.metrics_address=", "--set", "log.filter=info", "run"])
        .output()
        .expect("run");
    let err = stderr(&out);
    assert!(!err.contains("not closed cleanly"), "{err}");
}

#[test]
fn a_second_stop_signal_ends_the_wait_for_pulls_in_flight() {
    let held = HeldPull::start("action = \"hang\"", &["--set", "daemon.shutdown_grace=10m"]);
    let (mut d, runtime, ensure) = (held.daemon, held.runtime, held.ensure);
    d.signal(Signal::SIGTERM);
    d.wait_for_log("shutting down", Duration::from_secs(10), "no shutdown");
    std::thread::sleep(Duration::from_millis(300));
    assert!(d.running(), "the first signal waits for the hung pull (grace 10m)");
    d.signal(Signal::SIGTERM);
    assert_eq!(d.wait_exit(Duration::from_secs(15)), Some(0), "{}", d.log());
    let log = d.log();
    assert!(log.contains("second stop signal") && log.contains("abandoned_pulls=1"), "{log}");
    // The grace (10m) did not end: the signal cut the wait short.
    assert!(log.contains("shutdown cut short with pulls still in flight"), "{log}");
    assert!(!log.contains("grace period ended"), "{log}");
    let r = runtime.block_on(ensure).expect("task").expect("answered").into_inner();
    assert!(
        matches!(r.result, Some(proto::ensure_image_response::Result::Failure(_))),
        "told, not left hanging: {r:?}"
    );
}
