//! `imagectl`: the terminal client of the imaged daemon (its gRPC API on a
//! unix socket), plus `imagectl cri …` to talk CRI to a runtime directly.
//!
//! Exit codes: 0 done; 1 the daemon or runtime failed the request; 2 the
//! image could not be ensured (the kubelet's reason is printed); 64 bad
//! usage or a request the daemon rejected as invalid; 69 no daemon
//! answering on the socket (or it is shutting down).

mod cri;

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use imaged::api::{ImagedClient, proto};
use imaged::cli::{ConfigArgs, report};
use imaged::error::AppError;
use serde_json::{Value, json};
use tonic::transport::Channel;

/// The image could not be ensured.
const EXIT_ENSURE_FAILED: u8 = 2;

#[derive(Debug, Parser)]
#[command(
    name = "imagectl",
    version,
    about = "Drive the imaged daemon: ensure images, list, GC, events, back-off, status"
)]
struct Cli {
    #[command(flatten)]
    config: ConfigArgs,
    /// The daemon's API socket (default: `daemon.socket` from the configuration).
    #[arg(long, global = true, value_name = "PATH")]
    socket: Option<PathBuf>,
    /// Output format.
    #[arg(short = 'o', long, global = true, value_enum, default_value_t = Output::Table)]
    output: Output,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Output {
    /// Human-readable tables.
    Table,
    /// JSON, one document per command (one object per line for `events`).
    Json,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Make sure an image is present, pulling it per the policy; shows progress while it waits.
    Ensure {
        /// The image, as a pod spec names it.
        image: String,
        /// Always, IfNotPresent, Never or AlwaysWithLocalFallback (default: the API server's defaulting).
        #[arg(long)]
        policy: Option<String>,
        /// The pod, NAMESPACE/NAME.
        #[arg(long, default_value = "default/imagectl")]
        pod: String,
        /// The pod's UID (back-off is per pod UID and image).
        #[arg(long, default_value = "imagectl")]
        pod_uid: String,
        /// A pull secret manifest (JSON or YAML `kind: Secret`), repeatable.
        #[arg(long = "secret", value_name = "FILE")]
        secrets: Vec<PathBuf>,
        /// Pull priority (higher first).
        #[arg(long, default_value_t = 0)]
        priority: i32,
        /// Overall pull deadline (e.g. `2m`).
        #[arg(long, value_parser = parse_deadline)]
        deadline: Option<std::time::Duration>,
    },
    /// The runtime's images, largest first.
    Images,
    /// Garbage-collect images (the threshold GC), or with `--delete-unused` every unused image.
    Gc {
        /// Plan only: show what would be removed and why.
        #[arg(long)]
        dry_run: bool,
        /// Remove every unused image old enough, whatever the disk usage.
        #[arg(long)]
        delete_unused: bool,
    },
    /// Image events and pull phases the daemon saw.
    Events {
        /// Keep printing new events until interrupted.
        #[arg(long, short = 'f')]
        follow: bool,
    },
    /// Back-off control.
    Backoff {
        #[command(subcommand)]
        command: BackoffCommand,
    },
    /// Pull images ahead of need, in the background (no pod: no events, no
    /// back-off); a pod's ensure that comes meanwhile joins the pull.
    Prefetch {
        /// The images, as pod specs name them.
        #[arg(required = true)]
        images: Vec<String>,
        /// A pull secret manifest (JSON or YAML `kind: Secret`), repeatable.
        #[arg(long = "secret", value_name = "FILE")]
        secrets: Vec<PathBuf>,
        /// Pull priority (higher first; negative lets pods' pulls go first).
        #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
        priority: i32,
        /// RuntimeClass handler the images are for.
        #[arg(long, default_value = "")]
        runtime_handler: String,
        /// Overall pull deadline (e.g. `2m`).
        #[arg(long, value_parser = parse_deadline)]
        deadline: Option<std::time::Duration>,
        /// Wait for the pulls to end (exit 2 if one failed).
        #[arg(long)]
        wait: bool,
    },
    /// Pulls the daemon holds now: running, queued (in start order) and parked.
    Pulls,
    /// Runtime, queue, back-offs, last GC and configuration summary.
    Status,
    /// Talk CRI to the runtime directly (no daemon).
    Cri {
        #[command(subcommand)]
        command: cri::Command,
    },
}

#[derive(Debug, Subcommand)]
enum BackoffCommand {
    /// Clear back-off: for a pod, an image, one pod's image, or (neither) everything.
    Clear {
        /// The pod's UID.
        #[arg(long)]
        pod: Option<String>,
        /// The image, as the pod named it.
        #[arg(long)]
        image: Option<String>,
    },
    /// The keys in back-off.
    List,
}

fn main() -> ExitCode {
    let cli: Cli = match imaged::cli::parse_or_exit() {
        Ok(c) => c,
        Err(code) => return code,
    };
    match run(cli) {
        Ok(code) => ExitCode::from(code),
        Err(e) => ExitCode::from(report("imagectl", &e) as u8),
    }
}

/// `--deadline`: a duration no larger than the daemon accepts.
fn parse_deadline(text: &str) -> Result<std::time::Duration, String> {
    let d = humantime::parse_duration(text).map_err(|e| e.to_string())?;
    imaged::domain::limits::check_duration(d, || text.to_string()).map_err(|e| e.reason())
}

fn out(e: std::io::Error) -> AppError {
    AppError::Other(format!("writing output: {e}"))
}

/// A gRPC status as the error to report, with its exit code.
fn rpc(what: &str, s: tonic::Status) -> AppError {
    match s.code() {
        tonic::Code::InvalidArgument | tonic::Code::OutOfRange => {
            AppError::Usage(format!("{what}: the daemon rejected the request: {}", s.message()))
        }
        tonic::Code::Unavailable => AppError::Unavailable(format!("{what}: {}", s.message())),
        _ => AppError::Other(format!("{what}: {}: {}", s.code(), s.message())),
    }
}

fn run(cli: Cli) -> Result<u8, AppError> {
    let cfg = cli.config.load()?;
    let _ = imaged::telemetry::init(&imaged::config::LogConfig { filter: "warn".into(), ..cfg.log.clone() });
    let command = match cli.command {
        Command::Cri { command } => return cri::run(cfg, command),
        c => c,
    };
    let socket = cli.socket.clone().unwrap_or_else(|| cfg.daemon.socket.clone());
    let json = cli.output == Output::Json;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| AppError::Other(format!("starting the client runtime: {e}")))?;
    rt.block_on(async move {
        let mut client = imaged::api::client(&socket)?;
        let mut o = std::io::stdout().lock();
        match command {
            Command::Ensure { image, policy, pod, pod_uid, secrets, priority, deadline } => {
                let (namespace, name) = pod
                    .split_once('/')
                    .ok_or_else(|| AppError::Usage(format!("--pod {pod:?}: must be NAMESPACE/NAME")))?;
                let pull_secrets = read_secrets(&secrets)?;
                let req = proto::EnsureImageRequest {
                    pod: Some(proto::Pod {
                        uid: pod_uid.clone(),
                        namespace: namespace.to_string(),
                        name: name.to_string(),
                        priority,
                        ..Default::default()
                    }),
                    container: String::new(),
                    image: image.clone(),
                    pull_policy: policy.unwrap_or_default(),
                    pull_secrets,
                    deadline_ms: deadline.map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
                };
                ensure(&mut client, req, &pod_uid, json, &mut o).await
            }
            Command::Images => {
                let images = client
                    .list_images(proto::ListImagesRequest {})
                    .await
                    .map_err(|s| rpc("ListImages", s))?
                    .into_inner()
                    .images;
                if json {
                    let v: Vec<Value> = images
                        .iter()
                        .map(|i| {
                            json!({"id": i.id, "repo_tags": i.repo_tags, "repo_digests": i.repo_digests,
                                   "size": i.size, "pinned": i.pinned})
                        })
                        .collect();
                    writeln!(o, "{}", Value::Array(v)).map_err(out)?;
                } else {
                    writeln!(o, "{:<13}  {:>10}  {:<6}  TAGS", "IMAGE ID", "SIZE", "PINNED").map_err(out)?;
                    for i in &images {
                        writeln!(
                            o,
                            "{:<13}  {:>10}  {:<6}  {}",
                            short(&i.id),
                            human_bytes(i.size),
                            i.pinned,
                            if i.repo_tags.is_empty() { "<none>".to_string() } else { i.repo_tags.join(",") }
                        )
                        .map_err(out)?;
                    }
                }
                Ok(0)
            }
            Command::Gc { dry_run, delete_unused } => {
                let report = if delete_unused {
                    client.delete_unused_images(proto::DeleteUnusedImagesRequest { dry_run }).await
                } else {
                    client.garbage_collect(proto::GarbageCollectRequest { dry_run }).await
                }
                .map_err(|s| rpc("GarbageCollect", s))?
                .into_inner();
                print_gc(&report, json, &mut o)?;
                Ok(0)
            }
            Command::Events { follow } => {
                let mut stream = client
                    .watch_events(proto::WatchEventsRequest { recent: true, follow })
                    .await
                    .map_err(|s| rpc("WatchEvents", s))?
                    .into_inner();
                while let Some(e) = stream.message().await.map_err(|s| rpc("WatchEvents", s))? {
                    print_event(&e, json, &mut o)?;
                    o.flush().map_err(out)?;
                }
                Ok(0)
            }
            Command::Backoff { command: BackoffCommand::Clear { pod, image } } => {
                let cleared = client
                    .clear_backoff(proto::ClearBackoffRequest {
                        pod_uid: pod.unwrap_or_default(),
                        image: image.unwrap_or_default(),
                    })
                    .await
                    .map_err(|s| rpc("ClearBackoff", s))?
                    .into_inner()
                    .cleared;
                if json {
                    writeln!(o, "{}", json!({"cleared": cleared})).map_err(out)?;
                } else {
                    writeln!(o, "cleared back-off for {cleared} key(s)").map_err(out)?;
                }
                Ok(0)
            }
            Command::Backoff { command: BackoffCommand::List } => {
                let s = status(&mut client).await?;
                print_backoffs(&s.backoffs, json, &mut o)?;
                Ok(0)
            }
            Command::Prefetch { images, secrets, priority, runtime_handler, deadline, wait } => {
                let pull_secrets = read_secrets(&secrets)?;
                let calls = images.iter().map(|image| {
                    let mut c = client.clone();
                    let req = proto::PrefetchImageRequest {
                        image: image.clone(),
                        runtime_handler: runtime_handler.clone(),
                        pull_secrets: pull_secrets.clone(),
                        priority,
                        deadline_ms: deadline.map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
                        wait,
                    };
                    async move { c.prefetch_image(req).await }
                });
                let mut answers = Vec::new();
                for (image, r) in images.iter().zip(futures_util::future::join_all(calls).await) {
                    answers.push((image.as_str(), r.map_err(|s| rpc("PrefetchImage", s))?.into_inner()));
                }
                print_prefetch(&answers, json, &mut o)?;
                let failed = answers.iter().any(|(_, a)| a.state == "failed");
                Ok(if failed { EXIT_ENSURE_FAILED } else { 0 })
            }
            Command::Pulls => {
                let pulls = client
                    .list_pulls(proto::ListPullsRequest {})
                    .await
                    .map_err(|s| rpc("ListPulls", s))?
                    .into_inner()
                    .pulls;
                print_pulls(&pulls, json, &mut o)?;
                Ok(0)
            }
            Command::Status => {
                let s = status(&mut client).await?;
                print_status(&s, json, &mut o)?;
                Ok(0)
            }
            Command::Cri { .. } => Ok(0),
        }
    })
}

/// The pull secret manifests named by `--secret`.
fn read_secrets(files: &[PathBuf]) -> Result<Vec<Vec<u8>>, AppError> {
    files
        .iter()
        .map(|f| {
            std::fs::read(f).map_err(|e| AppError::Usage(format!("--secret {}: reading the file: {e}", f.display())))
        })
        .collect()
}

fn print_prefetch(
    answers: &[(&str, proto::PrefetchImageResponse)],
    json: bool,
    o: &mut impl Write,
) -> Result<(), AppError> {
    if json {
        let v: Vec<Value> = answers
            .iter()
            .map(|(image, a)| json!({"image": image, "state": a.state, "image_ref": a.image_ref, "message": a.message}))
            .collect();
        return writeln!(o, "{}", Value::Array(v)).map_err(out);
    }
    for (image, a) in answers {
        match a.state.as_str() {
            "failed" => writeln!(o, "{image}: failed: {}", a.message),
            _ if !a.image_ref.is_empty() => writeln!(o, "{image}: {} ({})", a.state, a.image_ref),
            _ => writeln!(o, "{image}: {}", a.state),
        }
        .map_err(out)?;
    }
    Ok(())
}

async fn status(client: &mut ImagedClient<Channel>) -> Result<proto::StatusResponse, AppError> {
    Ok(client.get_status(proto::GetStatusRequest {}).await.map_err(|s| rpc("GetStatus", s))?.into_inner())
}

/// Calls EnsureImage while printing this pod's events and the image's pull
/// phases to stderr.
async fn ensure(
    client: &mut ImagedClient<Channel>,
    req: proto::EnsureImageRequest,
    pod_uid: &str,
    json: bool,
    o: &mut impl Write,
) -> Result<u8, AppError> {
    let image = req.image.clone();
    let mut watcher = client.clone();
    let progress = match watcher.watch_events(proto::WatchEventsRequest { recent: false, follow: true }).await {
        Ok(s) => Some(s.into_inner()),
        Err(_) => None,
    };
    let uid = pod_uid.to_string();
    // Prints this pod's events and the image's phases; finishes at the
    // pod's final event for the image (Pulled, Failed, BackOff, ...).
    let printer = async move {
        let Some(mut stream) = progress else { return std::future::pending::<()>().await };
        let mut err = std::io::stderr();
        while let Ok(Some(e)) = stream.message().await {
            let (mine, last) = match &e.kind {
                Some(proto::event::Kind::ImageEvent(ie)) => (ie.pod_uid == uid, ie.reason != "Pulling"),
                Some(proto::event::Kind::PullPhase(p)) => (phase_matches(&p.image, &image), false),
                _ => (false, false),
            };
            if mine {
                let _ = print_event(&e, false, &mut err);
                if last {
                    return;
                }
            }
        }
        std::future::pending::<()>().await
    };
    let call = client.ensure_image(req);
    tokio::pin!(call);
    tokio::pin!(printer);
    let mut final_event_seen = false;
    let result = loop {
        tokio::select! {
            r = &mut call => break r,
            () = &mut printer, if !final_event_seen => final_event_seen = true,
        }
    };
    if !final_event_seen {
        // The reply can overtake the pod's last event; give it a moment.
        let _ = tokio::time::timeout(std::time::Duration::from_millis(500), &mut printer).await;
    }
    let result = result.map_err(|s| rpc("EnsureImage", s))?.into_inner().result;
    match result {
        Some(proto::ensure_image_response::Result::Ok(ok)) => {
            if json {
                writeln!(o, "{}", json!({"ok": true, "image_ref": ok.image_ref, "message": ok.message}))
                    .map_err(out)?;
            } else if ok.message.is_empty() {
                writeln!(o, "image ref: {}", ok.image_ref).map_err(out)?;
            } else {
                writeln!(o, "{}\nimage ref: {}", ok.message, ok.image_ref).map_err(out)?;
            }
            Ok(0)
        }
        Some(proto::ensure_image_response::Result::Failure(f)) => {
            if json {
                writeln!(o, "{}", json!({"ok": false, "kind": f.kind, "message": f.message, "class": f.class}))
                    .map_err(out)?;
            } else {
                writeln!(o, "{}: {}", f.kind, f.message).map_err(out)?;
            }
            Ok(EXIT_ENSURE_FAILED)
        }
        None => Err(AppError::Other("EnsureImage: the daemon sent an empty result".into())),
    }
}

/// Whether a phase's (normalised) image is the one asked for (as written).
fn phase_matches(phase_image: &str, asked: &str) -> bool {
    imaged::domain::reference::parse_normalized_named(asked)
        .map_or(phase_image == asked, |n| phase_image == n.docker_ref())
}

fn short(id: &str) -> &str {
    let hex = id.strip_prefix("sha256:").unwrap_or(id);
    hex.get(..13).unwrap_or(hex)
}

fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "kB", "MB", "GB", "TB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1000.0 && u < UNITS.len() - 1 {
        v /= 1000.0;
        u += 1;
    }
    if u == 0 { format!("{b}B") } else { format!("{v:.1}{}", UNITS[u]) }
}

fn gc_json(r: &proto::GcReport) -> Value {
    json!({
        "mode": r.mode, "dry_run": r.dry_run, "usage_percent": r.usage_percent,
        "projected_usage_percent": r.projected_usage_percent, "amount_to_free": r.amount_to_free,
        "entries": r.entries.iter().map(|e| json!({"id": e.id, "repo_tags": e.repo_tags, "size": e.size,
            "verdict": e.verdict, "reason": e.reason, "used_by": e.used_by})).collect::<Vec<_>>(),
        "removed": r.removed, "failed": r.failed, "bytes_expected": r.bytes_expected,
        "bytes_freed_measured": r.bytes_freed_measured, "shortfall": r.shortfall,
    })
}

fn print_gc(r: &proto::GcReport, json: bool, o: &mut impl Write) -> Result<(), AppError> {
    if json {
        return writeln!(o, "{}", gc_json(r)).map_err(out);
    }
    writeln!(o, "{:<13}  {:>10}  {:<7} {:<40} REASON", "IMAGE ID", "SIZE", "VERDICT", "IMAGE").map_err(out)?;
    for e in &r.entries {
        let name = e.repo_tags.first().map_or("<none>", String::as_str);
        writeln!(o, "{:<13}  {:>10}  {:<7} {:<40} {}", short(&e.id), human_bytes(e.size), e.verdict, name, e.reason)
            .map_err(out)?;
    }
    let usage = |p: Option<u32>| p.map_or_else(|| "unknown".to_string(), |p| format!("{p}%"));
    writeln!(
        o,
        "{} ({}): disk usage {} -> {}; {} {} image(s), {}",
        r.mode,
        if r.dry_run { "dry run" } else { "done" },
        usage(r.usage_percent),
        usage(r.projected_usage_percent),
        if r.dry_run { "would remove" } else { "removed" },
        if r.dry_run { r.entries.iter().filter(|e| e.verdict == "delete").count() } else { r.removed.len() },
        human_bytes(r.bytes_expected)
    )
    .map_err(out)?;
    for f in &r.failed {
        writeln!(o, "failed: {f}").map_err(out)?;
    }
    if !r.shortfall.is_empty() {
        writeln!(o, "shortfall: {}", r.shortfall).map_err(out)?;
    }
    Ok(())
}

fn print_event(e: &proto::Event, json: bool, o: &mut impl Write) -> Result<(), AppError> {
    let ts = humantime::format_rfc3339_millis(
        std::time::UNIX_EPOCH + std::time::Duration::from_millis(u64::try_from(e.time_ms).unwrap_or(0)),
    );
    match &e.kind {
        Some(proto::event::Kind::ImageEvent(ie)) => {
            if json {
                writeln!(
                    o,
                    "{}",
                    json!({"time": ts.to_string(), "event": {"type": ie.r#type, "reason": ie.reason,
                    "message": ie.message, "pod_uid": ie.pod_uid, "namespace": ie.namespace, "pod": ie.pod_name,
                    "image": ie.image, "class": ie.class}})
                )
            } else {
                let pod = if ie.pod_name.is_empty() {
                    "node".to_string()
                } else {
                    format!("{}/{}", ie.namespace, ie.pod_name)
                };
                writeln!(o, "{ts}  {:<7} {:<18} {:<24} {}", ie.r#type, ie.reason, pod, ie.message)
            }
        }
        Some(proto::event::Kind::PullPhase(p)) => {
            if json {
                writeln!(o, "{}", json!({"time": ts.to_string(), "phase": {"image": p.image, "phase": p.phase}}))
            } else {
                writeln!(o, "{ts}  {:<7} {:<18} {:<24} {}", "Phase", p.phase, "", p.image)
            }
        }
        Some(proto::event::Kind::Lagged(n)) => {
            if json {
                writeln!(o, "{}", json!({"time": ts.to_string(), "lagged": n}))
            } else {
                writeln!(o, "{ts}  ({n} event(s) dropped: this watcher fell behind)")
            }
        }
        None => Ok(()),
    }
    .map_err(out)
}

fn print_backoffs(b: &[proto::BackoffEntry], json: bool, o: &mut impl Write) -> Result<(), AppError> {
    if json {
        let v: Vec<Value> = b
            .iter()
            .map(|e| {
                json!({"pod_uid": e.pod_uid, "image": e.image, "backoff_ms": e.backoff_ms,
                       "retry_in_ms": e.retry_in_ms, "previous_error": e.previous_error})
            })
            .collect();
        return writeln!(o, "{}", Value::Array(v)).map_err(out);
    }
    writeln!(o, "{:<24} {:<40} {:>8} {:>9}  PREVIOUS ERROR", "POD UID", "IMAGE", "BACKOFF", "RETRY IN").map_err(out)?;
    for e in b {
        writeln!(
            o,
            "{:<24} {:<40} {:>8} {:>9}  {}",
            e.pod_uid,
            e.image,
            imaged::domain::go_text::duration(std::time::Duration::from_millis(e.backoff_ms)),
            if e.retry_in_ms == 0 {
                "now".to_string()
            } else {
                imaged::domain::go_text::duration(std::time::Duration::from_millis(e.retry_in_ms))
            },
            e.previous_error
        )
        .map_err(out)?;
    }
    Ok(())
}

fn print_pulls(pulls: &[proto::Pull], json: bool, o: &mut impl Write) -> Result<(), AppError> {
    if json {
        let v: Vec<Value> = pulls
            .iter()
            .map(|p| {
                json!({"image": p.image, "runtime_handler": p.runtime_handler, "state": p.state,
                       "position": (p.position > 0).then_some(p.position), "priority": p.priority,
                       "waiters": p.waiters, "waiting_ms": p.waiting_ms, "running_ms": p.running_ms,
                       "with_credentials": p.with_credentials, "must_pull": p.must_pull})
            })
            .collect();
        return writeln!(o, "{}", Value::Array(v)).map_err(out);
    }
    let ms = |v: u64| imaged::domain::go_text::duration(std::time::Duration::from_millis(v));
    writeln!(
        o,
        "{:<10} {:>4} {:>5} {:>7} {:>9} {:>9}  {:<5} {:<4}  IMAGE",
        "STATE", "POS", "PRIO", "WAITERS", "WAITING", "RUNNING", "CREDS", "MUST"
    )
    .map_err(out)?;
    for p in pulls {
        let image = if p.runtime_handler.is_empty() {
            p.image.clone()
        } else {
            format!("{} (handler {})", p.image, p.runtime_handler)
        };
        writeln!(
            o,
            "{:<10} {:>4} {:>5} {:>7} {:>9} {:>9}  {:<5} {:<4}  {}",
            p.state,
            if p.position > 0 { p.position.to_string() } else { "-".to_string() },
            p.priority,
            p.waiters,
            ms(p.waiting_ms),
            p.running_ms.map_or_else(|| "-".to_string(), ms),
            if p.with_credentials { "yes" } else { "no" },
            if p.must_pull { "yes" } else { "no" },
            image
        )
        .map_err(out)?;
    }
    if pulls.is_empty() {
        writeln!(o, "(no pulls running or waiting)").map_err(out)?;
    }
    Ok(())
}

fn print_status(s: &proto::StatusResponse, json: bool, o: &mut impl Write) -> Result<(), AppError> {
    if json {
        let v = json!({
            "version": s.version, "accepting": s.accepting,
            "runtime": {"name": s.runtime_name, "version": s.runtime_version,
                        "api_version": s.runtime_api_version, "endpoint": s.endpoint},
            "queue": {"mode": s.pull_mode, "queued": s.queued, "running": s.running,
                      "parked": s.parked, "waiters": s.waiters},
            "backoffs": s.backoffs.len(),
            "last_gc": s.last_gc.as_ref().map(gc_json),
            "config": s.config,
        });
        return writeln!(o, "{v}").map_err(out);
    }
    writeln!(o, "imaged {} ({})", s.version, if s.accepting { "serving" } else { "shutting down" }).map_err(out)?;
    writeln!(o, "runtime: {} {} (CRI {}) at {}", s.runtime_name, s.runtime_version, s.runtime_api_version, s.endpoint)
        .map_err(out)?;
    writeln!(
        o,
        "pulls:   {} — {} running, {} queued, {} waiting for room, {} sharing a pull",
        s.pull_mode, s.running, s.queued, s.parked, s.waiters
    )
    .map_err(out)?;
    writeln!(o, "backoff: {} key(s)", s.backoffs.len()).map_err(out)?;
    match &s.last_gc {
        Some(r) => writeln!(
            o,
            "last gc: {}{}, removed {} image(s), {} expected",
            r.mode,
            if r.dry_run { " (dry run)" } else { "" },
            r.removed.len(),
            human_bytes(r.bytes_expected)
        ),
        None => writeln!(o, "last gc: none yet"),
    }
    .map_err(out)?;
    writeln!(o, "config:").map_err(out)?;
    for line in &s.config {
        writeln!(o, "  {line}").map_err(out)?;
    }
    Ok(())
}
