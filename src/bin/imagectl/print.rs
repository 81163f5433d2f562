//! How `imagectl` shows the daemon's answers: a table (or a line) for
//! people, one JSON document for scripts. Nothing here talks to the daemon.

use std::io::Write;

use imaged::api::proto;
use imaged::error::AppError;
use serde_json::{Value, json};

/// A failed write to the output, as the error to report.
pub fn out(e: std::io::Error) -> AppError {
    AppError::Other(format!("writing output: {e}"))
}

/// An image id without its `sha256:` prefix, cut to 13 characters.
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

/// Bytes that may be negative (space freed as measured: other writers may
/// have used more meanwhile), in [`human_bytes`]' units.
fn signed_bytes(b: i64) -> String {
    if b < 0 { format!("-{}", human_bytes(b.unsigned_abs())) } else { human_bytes(b.unsigned_abs()) }
}

/// A duration in milliseconds as Go prints durations (`1m30s`).
fn go_ms(ms: u64) -> String {
    imaged::domain::go_text::duration(std::time::Duration::from_millis(ms))
}

/// `imagectl images`.
pub fn print_images(images: &[proto::Image], json: bool, o: &mut impl Write) -> Result<(), AppError> {
    if json {
        let v: Vec<Value> = images
            .iter()
            .map(|i| {
                json!({"id": i.id, "repo_tags": i.repo_tags, "repo_digests": i.repo_digests,
                       "size": i.size, "pinned": i.pinned})
            })
            .collect();
        return writeln!(o, "{}", Value::Array(v)).map_err(out);
    }
    writeln!(o, "{:<13}  {:>10}  {:<6}  TAGS", "IMAGE ID", "SIZE", "PINNED").map_err(out)?;
    for i in images {
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
    Ok(())
}

/// The answer of `imagectl ensure`.
pub fn print_ensure_result(
    result: &proto::ensure_image_response::Result,
    json: bool,
    o: &mut impl Write,
) -> Result<(), AppError> {
    match result {
        proto::ensure_image_response::Result::Ok(ok) => {
            if json {
                writeln!(o, "{}", json!({"ok": true, "image_ref": ok.image_ref, "message": ok.message}))
            } else if ok.message.is_empty() {
                writeln!(o, "image ref: {}", ok.image_ref)
            } else {
                writeln!(o, "{}\nimage ref: {}", ok.message, ok.image_ref)
            }
        }
        proto::ensure_image_response::Result::Failure(f) => {
            if json {
                writeln!(o, "{}", json!({"ok": false, "kind": f.kind, "message": f.message, "class": f.class}))
            } else {
                writeln!(o, "{}: {}", f.kind, f.message)
            }
        }
    }
    .map_err(out)
}

/// `imagectl prefetch`: one line (or object) per image.
pub fn print_prefetch(
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

fn gc_json(r: &proto::GcReport) -> Value {
    json!({
        "mode": r.mode, "dry_run": r.dry_run, "usage_percent": r.usage_percent,
        "projected_usage_percent": r.projected_usage_percent, "amount_to_free": r.amount_to_free,
        "entries": r.entries.iter().map(|e| json!({"id": e.id, "repo_tags": e.repo_tags, "size": e.size,
            "verdict": e.verdict, "reason": e.reason, "used_by": e.used_by})).collect::<Vec<_>>(),
        "removed": r.removed, "failed": r.failed, "bytes_expected": r.bytes_expected,
        "bytes_freed_measured": r.bytes_freed_measured, "shortfall": r.shortfall,
        "measured_by": r.measured_by, "target_missed": r.target_missed,
    })
}

/// `imagectl gc`: the plan (or what was done) and its totals.
pub fn print_gc(r: &proto::GcReport, json: bool, o: &mut impl Write) -> Result<(), AppError> {
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
    if let Some(freed) = r.bytes_freed_measured {
        writeln!(o, "freed (measured): {}", signed_bytes(freed)).map_err(out)?;
    }
    for f in &r.failed {
        writeln!(o, "failed: {f}").map_err(out)?;
    }
    if !r.target_missed.is_empty() {
        writeln!(o, "target missed: {}", r.target_missed).map_err(out)?;
    }
    if !r.shortfall.is_empty() {
        writeln!(o, "shortfall: {}", r.shortfall).map_err(out)?;
    }
    if !r.measured_by.is_empty() {
        writeln!(o, "disk measured by: {}", r.measured_by).map_err(out)?;
    }
    Ok(())
}

/// One event or pull phase (`imagectl events`, and `ensure`'s progress).
pub fn print_event(e: &proto::Event, json: bool, o: &mut impl Write) -> Result<(), AppError> {
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
                let pod = p.pod.as_ref().map(|r| json!({"uid": r.uid, "namespace": r.namespace, "name": r.name}));
                writeln!(
                    o,
                    "{}",
                    json!({"time": ts.to_string(), "phase": {"image": p.image, "phase": p.phase, "pod": pod}})
                )
            } else {
                let pod = p.pod.as_ref().map(|r| format!("{}/{}", r.namespace, r.name)).unwrap_or_default();
                writeln!(o, "{ts}  {:<7} {:<18} {:<24} {}", "Phase", p.phase, pod, p.image)
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

/// `imagectl backoff clear`.
pub fn print_cleared(cleared: u32, json: bool, o: &mut impl Write) -> Result<(), AppError> {
    if json {
        writeln!(o, "{}", json!({"cleared": cleared})).map_err(out)
    } else {
        writeln!(o, "cleared back-off for {cleared} key(s)").map_err(out)
    }
}

/// `imagectl backoff list`.
pub fn print_backoffs(b: &[proto::BackoffEntry], json: bool, o: &mut impl Write) -> Result<(), AppError> {
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
            go_ms(e.backoff_ms),
            if e.retry_in_ms == 0 { "now".to_string() } else { go_ms(e.retry_in_ms) },
            e.previous_error
        )
        .map_err(out)?;
    }
    Ok(())
}

/// `imagectl pulls`: running, queued (in start order) and parked pulls.
pub fn print_pulls(pulls: &[proto::Pull], json: bool, o: &mut impl Write) -> Result<(), AppError> {
    if json {
        let v: Vec<Value> = pulls
            .iter()
            .map(|p| {
                json!({"image": p.image, "runtime_handler": p.runtime_handler, "state": p.state,
                       "position": (p.position > 0).then_some(p.position), "priority": p.priority,
                       "waiters": p.waiters, "waiting_ms": p.waiting_ms, "running_ms": p.running_ms,
                       "with_credentials": p.with_credentials, "must_pull": p.must_pull,
                       "pods": p.pods.iter().map(|r| json!({"uid": r.uid, "namespace": r.namespace, "name": r.name}))
                           .collect::<Vec<_>>()})
            })
            .collect();
        return writeln!(o, "{}", Value::Array(v)).map_err(out);
    }
    writeln!(
        o,
        "{:<10} {:>4} {:>5} {:>7} {:>9} {:>9}  {:<5} {:<4}  IMAGE  (PODS)",
        "STATE", "POS", "PRIO", "WAITERS", "WAITING", "RUNNING", "CREDS", "MUST"
    )
    .map_err(out)?;
    for p in pulls {
        let mut image = if p.runtime_handler.is_empty() {
            p.image.clone()
        } else {
            format!("{} (handler {})", p.image, p.runtime_handler)
        };
        if !p.pods.is_empty() {
            let pods: Vec<String> = p.pods.iter().map(|r| format!("{}/{}", r.namespace, r.name)).collect();
            image = format!("{image}  ({})", pods.join(", "));
        }
        writeln!(
            o,
            "{:<10} {:>4} {:>5} {:>7} {:>9} {:>9}  {:<5} {:<4}  {}",
            p.state,
            if p.position > 0 { p.position.to_string() } else { "-".to_string() },
            p.priority,
            p.waiters,
            go_ms(p.waiting_ms),
            p.running_ms.map_or_else(|| "-".to_string(), go_ms),
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

/// `imagectl status`.
pub fn print_status(s: &proto::StatusResponse, json: bool, o: &mut impl Write) -> Result<(), AppError> {
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
            "last gc: {}{}, removed {} image(s), {} expected{}{}",
            r.mode,
            if r.dry_run { " (dry run)" } else { "" },
            r.removed.len(),
            human_bytes(r.bytes_expected),
            r.bytes_freed_measured.map_or_else(String::new, |b| format!(", {} freed", signed_bytes(b))),
            if r.target_missed.is_empty() { String::new() } else { format!("; target missed: {}", r.target_missed) }
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test
    use super::*;

    fn pod(name: &str) -> proto::PodRef {
        proto::PodRef { uid: format!("uid-{name}"), namespace: "shop".into(), name: name.into() }
    }

    #[test]
    fn pulls_and_phases_show_their_pods() {
        let p = proto::Pull {
            image: "docker.io/library/nginx:1.27".into(),
            state: "pulling".into(),
            waiters: 2,
            pods: vec![pod("web-0"), pod("web-1")],
            ..Default::default()
        };
        let mut o = Vec::new();
        print_pulls(std::slice::from_ref(&p), false, &mut o).unwrap();
        let table = String::from_utf8(o).unwrap();
        assert!(table.contains("docker.io/library/nginx:1.27  (shop/web-0, shop/web-1)"), "{table}");
        let mut o = Vec::new();
        print_pulls(&[p], true, &mut o).unwrap();
        let v: Value = serde_json::from_slice(&o).unwrap();
        assert_eq!(v[0]["pods"][1], json!({"uid": "uid-web-1", "namespace": "shop", "name": "web-1"}));

        let e = proto::Event {
            time_ms: 0,
            kind: Some(proto::event::Kind::PullPhase(proto::PullPhase {
                image: "docker.io/library/nginx:1.27".into(),
                phase: "pulling".into(),
                pod: Some(pod("web-0")),
            })),
        };
        let mut o = Vec::new();
        print_event(&e, false, &mut o).unwrap();
        assert!(String::from_utf8(o).unwrap().contains("shop/web-0"));
    }
}
