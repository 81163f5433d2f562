//! How `imagectl` shows the daemon's answers: a table (or a line) for
//! people, the API's message as JSON or YAML for scripts (field names as in
//! `proto/imaged/v1/imaged.proto`). Nothing here talks to the daemon.

use std::io::Write;

use imaged::api::proto;
use imaged::error::AppError;
use serde::Serialize;

use crate::output::{Format, Plain, out};

/// An image id without its `sha256:` prefix, cut to 13 characters.
pub fn short(id: &str) -> &str {
    let hex = id.strip_prefix("sha256:").unwrap_or(id);
    hex.get(..13).unwrap_or(hex)
}

pub fn human_bytes(b: u64) -> String {
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
pub fn print_images(r: &proto::ListImagesResponse, f: Format, o: &mut impl Write) -> Result<(), AppError> {
    if f.is_document() {
        return f.document(r, o);
    }
    let mut t = Plain::new(&["IMAGE ID", "SIZE", "PINNED", "TAGS"]).right(&[1]);
    for i in &r.images {
        let tags = if i.repo_tags.is_empty() { "<none>".to_string() } else { i.repo_tags.join(",") };
        // Pinned by the runtime or by a gc.pinned_images rule: either way
        // GC never removes it (as the CRI front reports it to the kubelet).
        let pinned = i.pinned || !i.pinned_by_rule.is_empty();
        t.row([short(&i.id).to_string(), human_bytes(i.size), pinned.to_string(), tags]);
    }
    t.write(o)
}

/// `imagectl ensure -o json|yaml`: the answer's oneof flattened, as proto3
/// JSON has it: `{"ok": {...}}` or `{"failure": {...}}`.
#[derive(Serialize)]
struct EnsureDoc<'a> {
    #[serde(flatten)]
    result: &'a proto::ensure_image_response::Result,
}

/// The answer of `imagectl ensure`.
pub fn print_ensure_result(
    result: &proto::ensure_image_response::Result,
    f: Format,
    o: &mut impl Write,
) -> Result<(), AppError> {
    if f.is_document() {
        return f.document(&EnsureDoc { result }, o);
    }
    match result {
        proto::ensure_image_response::Result::Ok(ok) => {
            if ok.message.is_empty() {
                writeln!(o, "image ref: {}", ok.image_ref)
            } else {
                writeln!(o, "{}\nimage ref: {}", ok.message, ok.image_ref)
            }
        }
        proto::ensure_image_response::Result::Failure(fail) => writeln!(o, "{}: {}", fail.kind, fail.message),
    }
    .map_err(out)
}

/// `imagectl prefetch -o json|yaml`: one result per image, in the order given.
#[derive(Serialize)]
struct PrefetchDoc<'a> {
    results: Vec<PrefetchItem<'a>>,
}

#[derive(Serialize)]
struct PrefetchItem<'a> {
    /// The image as given on the command line.
    image: &'a str,
    #[serde(flatten)]
    answer: &'a proto::PrefetchImageResponse,
}

/// `imagectl prefetch`: one line (or result) per image.
pub fn print_prefetch(
    answers: &[(&str, proto::PrefetchImageResponse)],
    f: Format,
    o: &mut impl Write,
) -> Result<(), AppError> {
    if f.is_document() {
        let results = answers.iter().map(|(image, answer)| PrefetchItem { image, answer }).collect();
        return f.document(&PrefetchDoc { results }, o);
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

/// `imagectl gc`: the plan (or what was done) and its totals.
pub fn print_gc(r: &proto::GcReport, f: Format, o: &mut impl Write) -> Result<(), AppError> {
    if f.is_document() {
        return f.document(r, o);
    }
    let mut t = Plain::new(&["IMAGE ID", "SIZE", "VERDICT", "IMAGE", "REASON"]).right(&[1]);
    for e in &r.entries {
        let name = e.repo_tags.first().map_or("<none>", String::as_str);
        t.row([short(&e.id), &human_bytes(e.size), &e.verdict, name, &e.reason]);
    }
    t.write(o)?;
    if !r.kept_unlisted.is_empty() {
        let held: Vec<String> =
            r.kept_unlisted.iter().map(|h| format!("{} {} ({})", h.images, h.reason, human_bytes(h.bytes))).collect();
        writeln!(o, "also kept, not listed: {}", held.join(", ")).map_err(out)?;
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
    for failed in &r.failed {
        writeln!(o, "failed: {failed}").map_err(out)?;
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

/// `imagectl events -o json|yaml`: an event with its oneof flattened
/// (`{"time_ms": …, "image_event": {…}}`, `"pull_phase"` or `"lagged"`).
#[derive(Serialize)]
struct EventDoc<'a> {
    time_ms: i64,
    #[serde(flatten)]
    kind: &'a proto::event::Kind,
}

/// The reason (or phase) column's width: the longest phase,
/// `waiting-on-shared-pull`, and reason, `FreeDiskSpaceFailed`, fit.
const REASON_WIDTH: usize = 22;

/// One event or pull phase (`imagectl events`, and `ensure`'s progress).
pub fn print_event(e: &proto::Event, f: Format, o: &mut impl Write) -> Result<(), AppError> {
    let Some(kind) = &e.kind else { return Ok(()) };
    if f.is_document() {
        return f.stream_item(&EventDoc { time_ms: e.time_ms, kind }, o);
    }
    let ts = humantime::format_rfc3339_millis(
        std::time::UNIX_EPOCH + std::time::Duration::from_millis(u64::try_from(e.time_ms).unwrap_or(0)),
    );
    match kind {
        proto::event::Kind::ImageEvent(ie) => {
            let pod =
                if ie.pod_name.is_empty() { "node".to_string() } else { format!("{}/{}", ie.namespace, ie.pod_name) };
            writeln!(o, "{ts}  {:<7} {:<REASON_WIDTH$} {:<24} {}", ie.r#type, ie.reason, pod, ie.message)
        }
        proto::event::Kind::PullPhase(p) => {
            let pod = p.pod.as_ref().map(|r| format!("{}/{}", r.namespace, r.name)).unwrap_or_default();
            writeln!(o, "{ts}  {:<7} {:<REASON_WIDTH$} {:<24} {}", "Phase", p.phase, pod, p.image)
        }
        proto::event::Kind::Lagged(n) => writeln!(o, "{ts}  ({n} event(s) dropped: this watcher fell behind)"),
    }
    .map_err(out)
}

/// `imagectl backoff clear`.
pub fn print_cleared(r: proto::ClearBackoffResponse, f: Format, o: &mut impl Write) -> Result<(), AppError> {
    if f.is_document() {
        return f.document(&r, o);
    }
    writeln!(o, "cleared back-off for {} key(s)", r.cleared).map_err(out)
}

/// `imagectl backoff list -o json|yaml`.
#[derive(Serialize)]
struct BackoffsDoc<'a> {
    backoffs: &'a [proto::BackoffEntry],
}

/// `imagectl backoff list`.
pub fn print_backoffs(backoffs: &[proto::BackoffEntry], f: Format, o: &mut impl Write) -> Result<(), AppError> {
    if f.is_document() {
        return f.document(&BackoffsDoc { backoffs }, o);
    }
    let mut t = Plain::new(&["POD UID", "IMAGE", "BACKOFF", "RETRY IN", "PREVIOUS ERROR"]).right(&[2, 3]);
    for e in backoffs {
        let retry = if e.retry_in_ms == 0 { "now".to_string() } else { go_ms(e.retry_in_ms) };
        t.row([e.pod_uid.clone(), e.image.clone(), go_ms(e.backoff_ms), retry, e.previous_error.clone()]);
    }
    t.write(o)
}

/// `imagectl pulls`: running, queued (in start order) and parked pulls.
pub fn print_pulls(r: &proto::ListPullsResponse, f: Format, o: &mut impl Write) -> Result<(), AppError> {
    if f.is_document() {
        return f.document(r, o);
    }
    if r.pulls.is_empty() && r.downloads.is_empty() {
        return writeln!(o, "(no pulls running or waiting)").map_err(out);
    }
    let yes_no = |b: bool| if b { "yes" } else { "no" }.to_string();
    let mut t = Plain::new(&[
        "STATE",
        "POS",
        "PRIO",
        "WAITERS",
        "WAITING",
        "RUNNING",
        "CREDS",
        "MUST",
        "BYTES",
        "IMAGE  (PODS)",
    ])
    .right(&[1, 2, 3, 4, 5]);
    for p in &r.pulls {
        let mut image = if p.runtime_handler.is_empty() {
            p.image.clone()
        } else {
            format!("{} (handler {})", p.image, p.runtime_handler)
        };
        if !p.pods.is_empty() {
            let pods: Vec<String> = p.pods.iter().map(|r| format!("{}/{}", r.namespace, r.name)).collect();
            image = format!("{image}  ({})", pods.join(", "));
        }
        t.row([
            p.state.clone(),
            if p.position > 0 { p.position.to_string() } else { "-".to_string() },
            p.priority.to_string(),
            p.waiters.to_string(),
            go_ms(p.waiting_ms),
            p.running_ms.map_or_else(|| "-".to_string(), go_ms),
            yes_no(p.with_credentials),
            yes_no(p.must_pull),
            match (p.downloaded_bytes, p.download_total_bytes) {
                (Some(done), Some(total)) => format!("{}/{}", human_bytes(done), human_bytes(total)),
                _ => "-".to_string(),
            },
            image,
        ]);
    }
    if r.pulls.is_empty() {
        writeln!(o, "(no pulls running or waiting)").map_err(out)?;
    } else {
        t.write(o)?;
    }
    print_downloads(r, o)
}

/// One answer of `imagectl pulls --watch`: the time it was made, then the
/// listing, then a blank line; JSON: one object per line; YAML: one
/// document each.
pub fn print_pulls_watched(r: &proto::ListPullsResponse, f: Format, o: &mut impl Write) -> Result<(), AppError> {
    if f.is_document() {
        return f.stream_item(r, o);
    }
    let at = std::time::UNIX_EPOCH + std::time::Duration::from_millis(u64::try_from(r.time_ms).unwrap_or(0));
    writeln!(o, "{}", humantime::format_rfc3339_millis(at)).map_err(out)?;
    print_pulls(r, f, o)?;
    writeln!(o).map_err(out)
}

/// The runtime's downloads under the pulls: each blob's bytes, how long
/// it has run and how long it has written nothing; or why they are not
/// known, while a pull runs.
fn print_downloads(r: &proto::ListPullsResponse, o: &mut impl Write) -> Result<(), AppError> {
    if r.downloads.is_empty() {
        if !r.downloads_unavailable.is_empty() && r.pulls.iter().any(|p| p.state == "pulling") {
            writeln!(o, "\n(the runtime's downloads are not known: {})", r.downloads_unavailable).map_err(out)?;
        }
        return Ok(());
    }
    writeln!(o).map_err(out)?;
    let mut t = Plain::new(&["BYTES", "RUNNING", "IDLE", "STALLED", "DOWNLOAD (RUNTIME)"]).right(&[1, 2]);
    for d in &r.downloads {
        let bytes = if d.total > 0 {
            format!("{}/{}", human_bytes(d.offset), human_bytes(d.total))
        } else {
            human_bytes(d.offset)
        };
        t.row([
            bytes,
            go_ms(d.running_ms),
            go_ms(d.idle_ms),
            match (d.before_pulls, d.slow, d.stalled) {
                (true, _, _) => "-",
                (false, true, _) => "slow",
                (false, false, true) => "yes",
                (false, false, false) => "no",
            }
            .to_string(),
            d.r#ref.clone(),
        ]);
    }
    t.write(o)
}

/// The settings as `section.key = value` lines, in the message's order
/// (strings bare, `""` when empty; lists as JSON; `<none>` when absent).
fn settings_lines(s: &proto::Settings) -> Vec<String> {
    use serde_yaml_ng::Value;
    // serde_yaml_ng's mapping keeps the fields' order.
    let Ok(Value::Mapping(sections)) = serde_yaml_ng::to_value(s) else { return Vec::new() };
    let mut lines = Vec::new();
    for (section, keys) in &sections {
        let (Value::String(section), Value::Mapping(keys)) = (section, keys) else { continue };
        for (key, value) in keys {
            let Value::String(key) = key else { continue };
            let value = match value {
                Value::String(s) if s.is_empty() => "\"\"".to_string(),
                Value::String(s) => s.clone(),
                Value::Null => "<none>".to_string(),
                v => serde_json::to_string(v).unwrap_or_default(),
            };
            lines.push(format!("{section}.{key} = {value}"));
        }
    }
    lines
}

/// When a GC run began, as `imagectl status` says it: `"2026-11-26T12:30:01Z
/// (3m12s ago), "` (Go duration text); empty when unknown (an older daemon).
fn gc_started(started_ms: i64, now: std::time::SystemTime) -> String {
    let Ok(ms) = u64::try_from(started_ms) else { return String::new() };
    if ms == 0 {
        return String::new();
    }
    let at = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms);
    let ago = whole_seconds_since(at, now);
    format!("{} ({} ago), ", humantime::format_rfc3339_seconds(at), imaged::domain::go_text::duration(ago))
}

/// How long from `at` to `now`, in whole seconds ("3m12s ago", not
/// "3m12.345s ago"); zero for a time to come.
fn whole_seconds_since(at: std::time::SystemTime, now: std::time::SystemTime) -> std::time::Duration {
    now.duration_since(at).map_or(std::time::Duration::ZERO, |d| std::time::Duration::from_secs(d.as_secs()))
}

/// `imagectl status`'s prefetch lines: the declared images by state, then
/// each one not present, with how long it has been so (nothing without a
/// declared list).
fn print_declared(
    declared: &[proto::DeclaredImage],
    now: std::time::SystemTime,
    o: &mut impl Write,
) -> Result<(), AppError> {
    if declared.is_empty() {
        return Ok(());
    }
    let counts: Vec<String> = imaged::node::prefetch_ticker::DeclaredState::NAMES
        .iter()
        .filter_map(|state| {
            let n = declared.iter().filter(|d| d.state == *state).count();
            (n > 0).then(|| format!("{n} {state}"))
        })
        .collect();
    writeln!(o, "prefetch: {} declared — {}", declared.len(), counts.join(", ")).map_err(out)?;
    for d in declared.iter().filter(|d| d.state != "present") {
        let ago = whole_seconds_since(
            std::time::UNIX_EPOCH + std::time::Duration::from_millis(u64::try_from(d.since_ms).unwrap_or(0)),
            now,
        );
        let why = if d.error.is_empty() { String::new() } else { format!(": {}", d.error) };
        writeln!(o, "  {} {} for {}{why}", d.image, d.state, imaged::domain::go_text::duration(ago)).map_err(out)?;
    }
    Ok(())
}

/// `imagectl status`.
pub fn print_status(s: &proto::StatusResponse, f: Format, o: &mut impl Write) -> Result<(), AppError> {
    if f.is_document() {
        return f.document(s, o);
    }
    writeln!(o, "imaged {} ({})", s.version, if s.accepting { "serving" } else { "shutting down" }).map_err(out)?;
    writeln!(o, "runtime: {} {} (CRI {}) at {}", s.runtime_name, s.runtime_version, s.runtime_api_version, s.endpoint)
        .map_err(out)?;
    // A daemon from before `health`, or a service without it, sends none.
    if let Some(h) = &s.health {
        match (h.ready, h.alive) {
            (true, _) => writeln!(o, "health:  ready"),
            (false, alive) => writeln!(
                o,
                "health:  {} — {}",
                if alive { "not ready" } else { "failing" },
                // "not ready: shutting down" reads "not ready — shutting down".
                h.reasons.iter().map(|r| r.strip_prefix("not ready: ").unwrap_or(r)).collect::<Vec<_>>().join("; ")
            ),
        }
        .map_err(out)?;
        if !h.restart_pending.is_empty() {
            writeln!(o, "restart: needed to apply {}", h.restart_pending.join(", ")).map_err(out)?;
        }
    }
    writeln!(
        o,
        "pulls:   {} — {} running, {} queued, {} waiting for room, {} joined another request's pull",
        s.pull_mode,
        s.running,
        s.queued,
        s.parked,
        // Each running or queued pull's first request is not a join.
        s.waiters.saturating_sub(s.running.saturating_add(s.queued))
    )
    .map_err(out)?;
    writeln!(o, "backoff: {} key(s)", s.backoffs.len()).map_err(out)?;
    print_declared(&s.prefetch, std::time::SystemTime::now(), o)?;
    match &s.last_gc {
        Some(r) => writeln!(
            o,
            "last gc: {}{}{}, removed {} image(s), {} expected{}{}",
            gc_started(r.started_ms, std::time::SystemTime::now()),
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
    // A daemon from before `settings` sends only the lines.
    let lines = s.settings.as_ref().map_or_else(|| s.config.clone(), settings_lines);
    for line in &lines {
        writeln!(o, "  {line}").map_err(out)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test
    use super::*;
    use serde_json::{Value, json};

    fn pod(name: &str) -> proto::PodRef {
        proto::PodRef { uid: format!("uid-{name}"), namespace: "shop".into(), name: name.into() }
    }

    fn text(f: impl FnOnce(&mut Vec<u8>) -> Result<(), AppError>) -> String {
        let mut o = Vec::new();
        f(&mut o).unwrap();
        String::from_utf8(o).unwrap()
    }

    #[test]
    fn every_reason_and_phase_keeps_the_pod_column_in_line() {
        use imaged::actors::pull_queue::PullPhase;
        let phases = [
            PullPhase::Queued,
            PullPhase::Parked,
            PullPhase::WaitingOnSharedPull,
            PullPhase::Throttled,
            PullPhase::Pulling,
            PullPhase::Stalled,
            PullPhase::AlreadyPresent,
            PullPhase::Done,
            PullPhase::Failed,
        ];
        let mut lines = Vec::new();
        for phase in phases {
            let kind = proto::event::Kind::PullPhase(proto::PullPhase {
                image: "docker.io/library/nginx:1.27".into(),
                phase: imaged::api::convert::phase_name(phase).into(),
                pod: Some(pod("web")),
            });
            lines.push(text(|o| print_event(&proto::Event { time_ms: 0, kind: Some(kind) }, Format::Table, o)));
        }
        for reason in ["Pulling", "ErrImageNeverPull", "InvalidDiskCapacity", "FreeDiskSpaceFailed", "ImageGCFailed"] {
            let kind = proto::event::Kind::ImageEvent(proto::ImageEvent {
                r#type: "Warning".into(),
                reason: reason.into(),
                namespace: "shop".into(),
                pod_name: "web".into(),
                message: "m".into(),
                ..Default::default()
            });
            lines.push(text(|o| print_event(&proto::Event { time_ms: 0, kind: Some(kind) }, Format::Table, o)));
        }
        for l in &lines {
            assert_eq!(l.find("shop/web"), lines[0].find("shop/web"), "{l:?} against {:?}", lines[0]);
        }
    }

    #[test]
    fn gc_counts_the_kept_images_a_kept_report_does_not_list() {
        let entry = proto::GcEntry {
            id: "sha256:0123456789abcdef".into(),
            repo_tags: vec!["example.com/app:1".into()],
            size: 1_000,
            verdict: "keep".into(),
            reason: "keep: in use by shop/web/c1".into(),
            used_by: vec!["shop/web/c1".into()],
        };
        let mut r = proto::GcReport { mode: "threshold".into(), entries: vec![entry], ..Default::default() };
        let whole = text(|o| print_gc(&r, Format::Table, o));
        assert!(!whole.contains("not listed"), "{whole}");
        r.kept_unlisted = vec![
            proto::GcHeld { reason: "InUse".into(), images: 98_000, bytes: 1_200_000_000_000 },
            proto::GcHeld { reason: "TooYoung".into(), images: 3, bytes: 3_000 },
        ];
        let kept = text(|o| print_gc(&r, Format::Table, o));
        assert!(kept.contains("also kept, not listed: 98000 InUse (1.2TB), 3 TooYoung (3.0kB)\n"), "{kept}");
    }

    #[test]
    fn pulls_show_the_runtimes_downloads_their_bytes_and_stalls() {
        let p = proto::Pull {
            image: "docker.io/library/nginx:1.27".into(),
            state: "pulling".into(),
            downloaded_bytes: Some(1_500_000),
            download_total_bytes: Some(8_000_000),
            ..Default::default()
        };
        let d = |r: &str, offset, total, stalled| proto::Download {
            r#ref: r.into(),
            offset,
            total,
            running_ms: 90_000,
            idle_ms: if stalled { 75_000 } else { 0 },
            stalled,
            ..Default::default()
        };
        let r = proto::ListPullsResponse {
            pulls: vec![p.clone()],
            downloads: vec![
                d("layer-sha256:aa", 1_000_000, 7_000_000, true),
                d("manifest-sha256:bb", 500_000, 0, false),
                proto::Download { before_pulls: true, ..d("layer-sha256:cc", 9, 10, false) },
                proto::Download { slow: true, ..d("layer-sha256:dd", 20_000, 9_000_000, true) },
            ],
            downloads_unavailable: String::new(),
            time_ms: 0,
        };
        let table = text(|o| print_pulls(&r, Format::Table, o));
        let row = |needle: &str| {
            table.lines().find(|l| l.contains(needle)).map(|l| l.split_whitespace().collect::<Vec<_>>()).unwrap()
        };
        assert_eq!(row("nginx")[8], "1.5MB/8.0MB", "{table}");
        assert_eq!(row("layer-sha256:aa"), ["1.0MB/7.0MB", "1m30s", "1m15s", "yes", "layer-sha256:aa"], "{table}");
        assert_eq!(row("manifest-sha256:bb"), ["500.0kB", "1m30s", "0s", "no", "manifest-sha256:bb"], "{table}");
        assert_eq!(row("layer-sha256:cc")[3], "-", "not the pulls', not judged: {table}");
        assert_eq!(row("layer-sha256:dd")[3], "slow", "under the floor: {table}");
        // Not known while a pull runs: the reason, once.
        let r = proto::ListPullsResponse {
            pulls: vec![proto::Pull { downloaded_bytes: None, download_total_bytes: None, ..p }],
            downloads: vec![],
            downloads_unavailable: "rpc error: code = Unimplemented desc = unknown service".into(),
            time_ms: 0,
        };
        let table = text(|o| print_pulls(&r, Format::Table, o));
        assert!(table.contains("(the runtime's downloads are not known: rpc error: code = Unimplemented"), "{table}");
        assert_eq!(table.lines().find(|l| l.contains("nginx")).unwrap().split_whitespace().nth(8), Some("-"));
        let v: Value = serde_json::from_str(&text(|o| print_pulls(&r, Format::Json, o))).unwrap();
        assert_eq!(v["downloads_unavailable"], "rpc error: code = Unimplemented desc = unknown service");
        // No pull: nothing about downloads.
        let idle = proto::ListPullsResponse { downloads_unavailable: "x".into(), ..Default::default() };
        assert_eq!(text(|o| print_pulls(&idle, Format::Table, o)), "(no pulls running or waiting)\n");
    }

    #[test]
    fn a_watched_listing_says_when_it_was_made_and_json_is_one_line_each() {
        let r = proto::ListPullsResponse { time_ms: 1_764_343_927_123, ..Default::default() };
        let table = text(|o| print_pulls_watched(&r, Format::Table, o));
        assert_eq!(table, "2025-11-28T15:32:07.123Z\n(no pulls running or waiting)\n\n");
        let lines = text(|o| {
            print_pulls_watched(&r, Format::Json, o)?;
            print_pulls_watched(&r, Format::Json, o)
        });
        assert_eq!(lines.lines().count(), 2, "{lines}");
        let v: Value = serde_json::from_str(lines.lines().next().unwrap()).unwrap();
        assert_eq!(v["time_ms"], 1_764_343_927_123_i64);
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
        let r = proto::ListPullsResponse { pulls: vec![p], ..Default::default() };
        let table = text(|o| print_pulls(&r, Format::Table, o));
        assert!(table.contains("docker.io/library/nginx:1.27  (shop/web-0, shop/web-1)"), "{table}");
        let v: Value = serde_json::from_str(&text(|o| print_pulls(&r, Format::Json, o))).unwrap();
        assert_eq!(v["pulls"][0]["pods"][1], json!({"uid": "uid-web-1", "namespace": "shop", "name": "web-1"}));
        assert_eq!(v["pulls"][0]["running_ms"], Value::Null, "absent optional fields are null, never missing");

        let e = proto::Event {
            time_ms: 1_000,
            kind: Some(proto::event::Kind::PullPhase(proto::PullPhase {
                image: "docker.io/library/nginx:1.27".into(),
                phase: "pulling".into(),
                pod: Some(pod("web-0")),
            })),
        };
        assert!(text(|o| print_event(&e, Format::Table, o)).contains("shop/web-0"));
        // A oneof is flattened into its message, named as in the .proto.
        let line = text(|o| print_event(&e, Format::Json, o));
        assert_eq!(line.lines().count(), 1, "{line}");
        let v: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["time_ms"], 1_000);
        assert_eq!(v["pull_phase"]["pod"]["name"], "web-0");
        let yaml = text(|o| print_event(&e, Format::Yaml, o));
        assert!(yaml.starts_with("---\n"), "{yaml}");
        let v: Value = serde_yaml_ng::from_str(&yaml).unwrap();
        assert_eq!(v["pull_phase"]["phase"], "pulling");
    }

    #[test]
    fn ensure_answers_are_ok_or_failure_objects() {
        let ok = proto::ensure_image_response::Result::Ok(proto::EnsureOk {
            image_ref: "sha256:abc".into(),
            message: "present".into(),
        });
        let v: Value = serde_json::from_str(&text(|o| print_ensure_result(&ok, Format::Json, o))).unwrap();
        assert_eq!(v, json!({"ok": {"image_ref": "sha256:abc", "message": "present"}}));
        let failure = proto::ensure_image_response::Result::Failure(proto::EnsureFailure {
            kind: "ErrImagePull".into(),
            message: "nope".into(),
            class: "permanent".into(),
        });
        let v: Value = serde_yaml_ng::from_str(&text(|o| print_ensure_result(&failure, Format::Yaml, o))).unwrap();
        assert_eq!(v, json!({"failure": {"kind": "ErrImagePull", "message": "nope", "class": "permanent"}}));
        assert_eq!(text(|o| print_ensure_result(&failure, Format::Table, o)), "ErrImagePull: nope\n");
    }

    #[test]
    fn status_prints_the_settings_as_an_object_and_as_lines() {
        let s = proto::StatusResponse {
            config: vec!["legacy = line".into()],
            settings: Some(proto::Settings {
                gc: Some(proto::GcSettings {
                    image_gc_high_threshold_percent: 85,
                    pinned_images: vec!["registry.k8s.io/*".into()],
                    image_minimum_gc_age: "2m0s".into(),
                    ..Default::default()
                }),
                pull: Some(proto::PullSettings { max_parallel_image_pulls: None, ..Default::default() }),
                state: Some(proto::StateSettings { dir: String::new() }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let v: Value = serde_json::from_str(&text(|o| print_status(&s, Format::Json, o))).unwrap();
        assert_eq!(v["settings"]["gc"]["image_gc_high_threshold_percent"], 85);
        assert_eq!(v["settings"]["gc"]["pinned_images"], json!(["registry.k8s.io/*"]));
        assert!(v.get("config").is_none(), "the legacy lines are not printed: {v}");
        let table = text(|o| print_status(&s, Format::Table, o));
        for want in [
            "  gc.image_gc_high_threshold_percent = 85\n",
            "  gc.image_minimum_gc_age = 2m0s\n",
            "  gc.pinned_images = [\"registry.k8s.io/*\"]\n",
            "  pull.max_parallel_image_pulls = <none>\n",
            "  state.dir = \"\"\n",
        ] {
            assert!(table.contains(want), "{want:?} in:\n{table}");
        }
        // In the message's order: pull, backoff, gc, state.
        let at = |key: &str| table.find(key).unwrap();
        assert!(at("pull.serialize_image_pulls") < at("pull.max_parallel_image_pulls"), "{table}");
        assert!(at("pull.throttle_mode") < at("gc.") && at("gc.") < at("state.dir"), "{table}");
        assert!(!table.contains("legacy"), "{table}");
        // An older daemon: the lines it sent.
        let old = proto::StatusResponse { config: vec!["pull.mode = serial".into()], ..Default::default() };
        assert!(text(|o| print_status(&old, Format::Table, o)).contains("  pull.mode = serial\n"));
    }

    #[test]
    fn status_counts_the_declared_images_and_names_those_not_present() {
        let now = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_800_000_000);
        let ms = |ago_s: u64| i64::try_from((1_800_000_000 - ago_s) * 1000).unwrap();
        let d = |image: &str, state: &str, error: &str, ago_s: u64| proto::DeclaredImage {
            image: image.into(),
            state: state.into(),
            image_ref: if state == "present" { "sha256:aa".into() } else { String::new() },
            error: error.into(),
            since_ms: ms(ago_s),
        };
        let declared = [
            d("docker.io/library/redis:7", "present", "", 600),
            d("docker.io/library/nginx:1.27", "present", "", 5),
            d("quay.io/team/app:2", "failed", "Failed to pull image \"quay.io/team/app:2\": not found", 192),
            d("quay.io/team/big:1", "pulling", "", 42),
        ];
        let lines = text(|o| print_declared(&declared, now, o));
        assert_eq!(
            lines,
            "prefetch: 4 declared — 2 present, 1 pulling, 1 failed\n\
             \x20 quay.io/team/app:2 failed for 3m12s: Failed to pull image \"quay.io/team/app:2\": not found\n\
             \x20 quay.io/team/big:1 pulling for 42s\n"
        );
        assert_eq!(text(|o| print_declared(&[], now, o)), "", "no list, no line");
        let s = proto::StatusResponse { prefetch: declared.to_vec(), ..Default::default() };
        let table = text(|o| print_status(&s, Format::Table, o));
        assert!(table.contains("\nprefetch: 4 declared"), "{table}");
        let json = text(|o| print_status(&s, Format::Json, o));
        assert!(json.contains("\"state\": \"failed\""), "{json}");
    }

    #[test]
    fn status_says_what_the_daemons_health_endpoints_say() {
        let with = |health: Option<proto::DaemonHealth>| {
            let s = proto::StatusResponse { health, ..Default::default() };
            let table = text(|o| print_status(&s, Format::Table, o));
            table.lines().find(|l| l.starts_with("health:")).map(str::to_string)
        };
        let h = |alive: bool, ready: bool, reasons: &[&str]| {
            Some(proto::DaemonHealth {
                alive,
                ready,
                reasons: reasons.iter().map(|r| (*r).to_string()).collect(),
                restart_pending: Vec::new(),
            })
        };
        assert_eq!(with(h(true, true, &[])).as_deref(), Some("health:  ready"));
        assert_eq!(
            with(h(true, false, &["cri_runtime: unreachable: connection refused"])).as_deref(),
            Some("health:  not ready — cri_runtime: unreachable: connection refused")
        );
        assert_eq!(
            with(h(true, false, &["not ready: shutting down"])).as_deref(),
            Some("health:  not ready — shutting down")
        );
        assert_eq!(
            with(h(false, false, &["pull_queue: stopped", "cri_runtime: unreachable: x"])).as_deref(),
            Some("health:  failing — pull_queue: stopped; cri_runtime: unreachable: x")
        );
        assert_eq!(with(None), None, "an older daemon, or one without health: no line");
        // Keys that wait for a restart get a line of their own, only then.
        let pending = proto::DaemonHealth {
            alive: true,
            ready: true,
            restart_pending: vec!["daemon.event_buffer".into(), "pull.queue_capacity".into()],
            ..Default::default()
        };
        let s = proto::StatusResponse { health: Some(pending), ..Default::default() };
        let table = text(|o| print_status(&s, Format::Table, o));
        let lines: Vec<&str> =
            table.lines().filter(|l| l.starts_with("health:") || l.starts_with("restart:")).collect();
        assert_eq!(lines, ["health:  ready", "restart: needed to apply daemon.event_buffer, pull.queue_capacity"]);
        let s = proto::StatusResponse { health: h(true, true, &[]), ..Default::default() };
        assert!(!text(|o| print_status(&s, Format::Table, o)).contains("restart:"));
    }

    #[test]
    fn the_last_gc_says_when_it_began_in_whole_seconds_ago() {
        let t0 = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_795_000_000);
        let ms = 1_795_000_000_000 - 192_345; // 3m12.345s before t0
        assert_eq!(gc_started(ms, t0), "2026-11-18T11:03:27Z (3m12s ago), ");
        assert_eq!(gc_started(1_795_000_000_000, t0), "2026-11-18T11:06:40Z (0s ago), ");
        // A clock that went back: not "ago" in the future.
        assert_eq!(gc_started(1_795_000_005_000, t0), "2026-11-18T11:06:45Z (0s ago), ");
        assert_eq!(gc_started(0, t0), "", "an older daemon sends none");
        assert_eq!(gc_started(-5, t0), "");
        let s = proto::StatusResponse {
            last_gc: Some(proto::GcReport { mode: "threshold".into(), started_ms: ms, ..Default::default() }),
            ..Default::default()
        };
        let table = text(|o| print_status(&s, Format::Table, o));
        let line = table.lines().find(|l| l.starts_with("last gc:")).unwrap();
        assert!(line.starts_with("last gc: 2026-11-18T11:03:27Z ("), "{line}");
        assert!(line.contains(" ago), threshold, removed 0 image(s)"), "{line}");
    }
}
