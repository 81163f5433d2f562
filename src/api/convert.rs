//! Between the API's messages and imaged's types. Requests are validated
//! here: a bad one becomes `InvalidArgument` naming the field.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tonic::Status;

use super::proto;
use crate::actors::backoff_registry::{BackoffKey, BackoffView, ClearScope};
use crate::actors::gc_executor::GcReport;
use crate::actors::pull_queue::{PullInfo, PullPhase, PullPhaseChanged, PullPod, PullStage};
use crate::credentials::PullSecret;
use crate::domain::pull_policy::{PullPolicy, default_pull_policy};
use crate::domain::reference::MAX_IMAGE_LEN;
use crate::domain::{Download, Image};
use crate::ensure::{EnsureError, EnsureImageRequest, EnsureOk, PodInfo, PrefetchRequest};
use crate::events::ImageEvent;
use crate::gc::plan::{GcMode, Verdict};

fn field(name: &str, reason: impl std::fmt::Display) -> Status {
    Status::invalid_argument(format!("{name}: {reason}"))
}

/// The API's `EnsureImageRequest` as the ensure flow's.
pub fn ensure_request(r: proto::EnsureImageRequest) -> Result<EnsureImageRequest, Status> {
    if r.image.is_empty() {
        return Err(field("image", "must not be empty"));
    }
    if r.image.len() > MAX_IMAGE_LEN {
        return Err(field("image", format!("longer than {MAX_IMAGE_LEN} bytes")));
    }
    let pod = r.pod.ok_or_else(|| field("pod", "must be set (pod.uid at least: back-off is per pod)"))?;
    if pod.uid.is_empty() {
        return Err(field("pod.uid", "must not be empty"));
    }
    let pull_policy = if r.pull_policy.is_empty() {
        default_pull_policy(&r.image)
    } else {
        r.pull_policy.parse::<PullPolicy>().map_err(|e| field("pull_policy", e))?
    };
    let pull_secrets = pull_secrets(&r.pull_secrets)?;
    Ok(EnsureImageRequest {
        pod: PodInfo {
            uid: pod.uid,
            namespace: pod.namespace,
            name: pod.name,
            annotations: pod.annotations.into_iter().collect(),
            runtime_handler: pod.runtime_handler,
            priority: pod.priority,
            service_account: pod.service_account.map(service_account).transpose()?,
        },
        container: (!r.container.is_empty()).then_some(r.container),
        image: r.image,
        pull_policy,
        pull_secrets,
        credentials: Vec::new(),
        sandbox: None,
        deadline: deadline(r.deadline_ms)?,
    })
}

/// A pod's service account; its tokens become [`crate::domain::Secret`]s
/// here and are never shown again.
fn service_account(sa: proto::ServiceAccount) -> Result<crate::credentials::PodServiceAccount, Status> {
    if sa.name.is_empty() {
        return Err(field("pod.service_account.name", "must not be empty (leave service_account unset for none)"));
    }
    Ok(crate::credentials::PodServiceAccount {
        name: sa.name,
        uid: sa.uid,
        annotations: sa.annotations.into_iter().collect(),
        tokens: sa.tokens.into_iter().map(|(audience, t)| (audience, crate::domain::Secret::new(t))).collect(),
    })
}

/// The API's `PrefetchImageRequest` as the manager's (and whether to wait).
pub fn prefetch_request(r: proto::PrefetchImageRequest) -> Result<(PrefetchRequest, bool), Status> {
    if r.image.is_empty() {
        return Err(field("image", "must not be empty"));
    }
    if r.image.len() > MAX_IMAGE_LEN {
        return Err(field("image", format!("longer than {MAX_IMAGE_LEN} bytes")));
    }
    let pull_secrets = pull_secrets(&r.pull_secrets)?;
    let req = PrefetchRequest {
        image: r.image,
        runtime_handler: r.runtime_handler,
        pull_secrets,
        credentials: Vec::new(),
        priority: r.priority,
        deadline: deadline(r.deadline_ms)?,
    };
    Ok((req, r.wait))
}

/// `deadline_ms` (0 = none), refused when it is larger than any duration
/// imaged can wait for.
fn deadline(ms: u64) -> Result<Option<Duration>, Status> {
    if ms == 0 {
        return Ok(None);
    }
    crate::domain::limits::duration_from_millis(ms).map(Some).map_err(|e| field("deadline_ms", e))
}

fn pull_secrets(manifests: &[Vec<u8>]) -> Result<Vec<PullSecret>, Status> {
    manifests
        .iter()
        .enumerate()
        .map(|(i, bytes)| PullSecret::from_manifest(bytes).map_err(|e| field(&format!("pull_secrets[{i}]"), e)))
        .collect()
}

/// A prefetch's answer: `state` with the image ref or the reason.
pub fn prefetch_response(state: &str, image_ref: String, message: String) -> proto::PrefetchImageResponse {
    proto::PrefetchImageResponse { state: state.to_string(), image_ref, message }
}

/// An ensure's result as the API's response.
pub fn ensure_response(r: Result<EnsureOk, EnsureError>) -> proto::EnsureImageResponse {
    let result = match r {
        Ok(ok) => {
            proto::ensure_image_response::Result::Ok(proto::EnsureOk { image_ref: ok.image_ref, message: ok.message })
        }
        Err(e) => proto::ensure_image_response::Result::Failure(proto::EnsureFailure {
            kind: e.kind.to_string(),
            message: e.message,
            class: e.class.to_string(),
        }),
    };
    proto::EnsureImageResponse { result: Some(result) }
}

/// The back-off scope of a `ClearBackoffRequest`.
pub fn clear_scope(r: proto::ClearBackoffRequest) -> ClearScope {
    match (r.pod_uid.is_empty(), r.image.is_empty()) {
        (true, true) => ClearScope::All,
        (false, true) => ClearScope::Pod(r.pod_uid),
        (true, false) => ClearScope::Image(r.image),
        (false, false) => ClearScope::Key(BackoffKey { pod_uid: r.pod_uid, image: r.image }),
    }
}

/// What GC keeps by configuration: `gc.sandbox_image` (normalised as the
/// runtime names it) and the `gc.pinned_images` patterns.
#[derive(Debug, Default)]
pub struct Keeps {
    /// The sandbox image's reference, if one parses.
    pub sandbox_image: Option<String>,
    /// The patterns.
    pub patterns: Vec<String>,
}

impl Keeps {
    /// From the GC settings in force.
    pub fn of(gc: &crate::config::GcSettings) -> Self {
        let sandbox_image =
            crate::domain::reference::parse_normalized_named(gc.sandbox_image.trim()).ok().map(|n| n.docker_ref());
        Self { sandbox_image, patterns: gc.pinned_images.clone() }
    }
}

/// An image with its node-status names, and what keeps it from GC besides
/// the runtime's pin: `keeps`' sandbox image when it is that, else the
/// first of its `gc.pinned_images` patterns that matches it.
pub fn image(i: &Image, keeps: &Keeps) -> proto::Image {
    let names = || i.repo_tags.iter().chain(&i.repo_digests);
    let sandbox = keeps.sandbox_image.as_ref().filter(|s| names().any(|n| n == *s));
    let pinned_by_rule = sandbox
        .or_else(|| keeps.patterns.iter().find(|p| names().any(|n| crate::gc::policy::pattern_matches(p, n))))
        .cloned()
        .unwrap_or_default();
    proto::Image {
        pinned_by_rule,
        id: i.id.clone(),
        repo_tags: i.repo_tags.clone(),
        repo_digests: i.repo_digests.clone(),
        size: i.size,
        pinned: i.pinned,
        names: i
            .repo_digests
            .iter()
            .chain(&i.repo_tags)
            .take(crate::actors::cache_refresher::MAX_NAMES_PER_IMAGE)
            .cloned()
            .collect(),
    }
}

/// A GC report, every image it lists with its verdict and explanation.
pub fn gc_report(r: &GcReport) -> proto::GcReport {
    let shortfall = r.shortfall.as_ref().map_or_else(String::new, |s| {
        let held: Vec<String> =
            s.held.iter().map(|h| format!("{:?}: {} image(s), {} bytes", h.reason, h.images, h.bytes)).collect();
        format!(
            "wanted {} bytes, {} eligible; held: {}; {} bytes not accounted for by images",
            s.wanted,
            s.eligible_bytes,
            if held.is_empty() { "nothing".to_string() } else { held.join(", ") },
            s.unaccounted_bytes
        )
    });
    proto::GcReport {
        mode: match r.mode {
            GcMode::Threshold => "threshold",
            GcMode::DeleteUnused => "delete-unused",
        }
        .to_string(),
        dry_run: r.dry_run,
        started_ms: unix_ms(r.started),
        measured_by: r.measured_by.clone(),
        usage_percent: r.usage_percent.map(u32::from),
        projected_usage_percent: r.projected_usage_percent.map(u32::from),
        amount_to_free: r.amount_to_free,
        entries: r
            .entries
            .iter()
            .map(|e| proto::GcEntry {
                id: e.id.clone(),
                repo_tags: e.repo_tags.clone(),
                size: e.size,
                verdict: match e.verdict {
                    Verdict::Delete(_) => "delete",
                    Verdict::Keep(_) => "keep",
                }
                .to_string(),
                reason: e.explain(),
                used_by: e.used_by.clone(),
            })
            .collect(),
        removed: r.removed.iter().map(|x| x.id.clone()).collect(),
        failed: r.failed.iter().map(|(id, e)| format!("{id}: {e}")).collect(),
        bytes_expected: r.bytes_expected,
        bytes_freed_measured: r.bytes_freed_measured.map(|b| i64::try_from(b).unwrap_or(i64::MAX)),
        shortfall,
        target_missed: r.target_missed.clone().unwrap_or_default(),
        kept_unlisted: r
            .kept_unlisted
            .iter()
            .map(|h| proto::GcHeld {
                reason: format!("{:?}", h.reason),
                images: u64::try_from(h.images).unwrap_or(u64::MAX),
                bytes: h.bytes,
            })
            .collect(),
    }
}

/// One back-off entry.
pub fn backoff(v: &BackoffView) -> proto::BackoffEntry {
    proto::BackoffEntry {
        pod_uid: v.key.pod_uid.clone(),
        image: v.key.image.clone(),
        backoff_ms: millis(v.backoff),
        retry_in_ms: v.retry_in.map_or(0, millis),
        previous_error: v.previous_error.clone().unwrap_or_default(),
    }
}

/// One pull the queue holds.
pub fn pull(p: &PullInfo) -> proto::Pull {
    proto::Pull {
        image: p.image.clone(),
        runtime_handler: p.runtime_handler.clone(),
        state: p.stage.name().to_string(),
        position: p.stage.position().map_or(0, |n| u32::try_from(n).unwrap_or(u32::MAX)),
        priority: p.priority,
        waiters: u32::try_from(p.waiters).unwrap_or(u32::MAX),
        waiting_ms: millis(p.waiting),
        running_ms: p.running.map(millis),
        with_credentials: p.with_credentials,
        must_pull: p.must_pull,
        pods: p.pods.iter().map(pod_ref).collect(),
        downloaded_bytes: None,
        download_total_bytes: None,
    }
}

/// How a listing judges stalls: idle for `after` (`pull.stall_warning`),
/// or named by the stall check as under `pull.min_download_rate`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Stall<'a> {
    /// Idle this long is stalled (`None`: never).
    pub after: Option<Duration>,
    /// The check's slow downloads, by ingest key.
    pub slow: &'a [String],
}

/// `ListPulls`' answer: the pulls, and the runtime's downloads (or why
/// they are not known). A download not written since the earliest of the
/// running pulls started (every download, when none runs) is none of
/// theirs: a partial ingest an abandoned pull left, or another client's;
/// it is marked so and never judged. While one pull is in the runtime's
/// hands, the other downloads are its own and their bytes are summed into
/// it. A download is shown stalled by `stall`: idle for
/// `pull.stall_warning`, or slow — under `pull.min_download_rate`, which
/// needs readings over time that only the queue's check keeps, so the
/// check names them.
pub fn pulls(
    pulls: &[PullInfo],
    downloads: Result<Vec<Download>, String>,
    stall: &Stall<'_>,
    now: SystemTime,
) -> proto::ListPullsResponse {
    let mut listed: Vec<proto::Pull> = pulls.iter().map(pull).collect();
    let (mut downloads, unavailable) = match downloads {
        Ok(d) => (d, String::new()),
        Err(why) => (Vec::new(), why),
    };
    downloads.sort_by(|a, b| a.started.cmp(&b.started).then_with(|| a.reference.cmp(&b.reference)));
    // The earliest running pull's start on the wall clock, a second early
    // (its `running` is read on another clock, a moment apart).
    let earliest =
        pulls.iter().filter_map(|p| p.running).max().and_then(|r| now.checked_sub(r + Duration::from_secs(1)));
    let theirs = |d: &Download| earliest.is_some_and(|e| d.updated >= e);
    let in_runtime: Vec<usize> =
        pulls.iter().enumerate().filter(|(_, p)| matches!(p.stage, PullStage::Pulling)).map(|(i, _)| i).collect();
    if let ([only], true) = (in_runtime.as_slice(), unavailable.is_empty()) {
        let own: Vec<Download> = downloads.iter().filter(|d| theirs(d)).cloned().collect();
        let (done, total) = crate::domain::download::progress(&own);
        listed[*only].downloaded_bytes = Some(done);
        listed[*only].download_total_bytes = Some(total);
    }
    let slow = |d: &Download| stall.slow.contains(&d.reference);
    let download = |d: &Download| proto::Download {
        r#ref: d.reference.clone(),
        digest: d.digest.clone(),
        offset: d.offset,
        total: d.total,
        running_ms: millis(now.duration_since(d.started).unwrap_or_default()),
        idle_ms: millis(d.idle(now)),
        stalled: theirs(d) && (stall.after.is_some_and(|after| d.stalled(now, after)) || slow(d)),
        before_pulls: !theirs(d),
        slow: theirs(d) && slow(d),
    };
    proto::ListPullsResponse {
        pulls: listed,
        downloads: downloads.iter().map(download).collect(),
        downloads_unavailable: unavailable,
        time_ms: now
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX)),
    }
}

/// A pull's pod on the wire.
fn pod_ref(p: &PullPod) -> proto::PodRef {
    proto::PodRef { uid: p.uid.clone(), namespace: p.namespace.clone(), name: p.name.clone() }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn now_ms() -> i64 {
    unix_ms(SystemTime::now())
}

/// `t` in Unix milliseconds (0 before the epoch).
fn unix_ms(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// A phase's name on the wire.
pub fn phase_name(p: PullPhase) -> &'static str {
    match p {
        PullPhase::Queued => "queued",
        PullPhase::Parked => "parked",
        PullPhase::WaitingOnSharedPull => "waiting-on-shared-pull",
        PullPhase::Throttled => "throttled",
        PullPhase::Pulling => "pulling",
        PullPhase::Stalled => "stalled",
        PullPhase::AlreadyPresent => "already-present",
        PullPhase::Done => "done",
        PullPhase::Failed => "failed",
    }
}

/// An image event on the wire.
pub fn image_event(e: &ImageEvent) -> proto::Event {
    proto::Event {
        time_ms: now_ms(),
        kind: Some(proto::event::Kind::ImageEvent(proto::ImageEvent {
            r#type: e.event_type.to_string(),
            reason: e.reason.to_string(),
            message: e.message.clone(),
            pod_uid: e.object.pod_uid.clone(),
            namespace: e.object.namespace.clone(),
            pod_name: e.object.pod_name.clone(),
            container: e.object.container.clone().unwrap_or_default(),
            image: e.image.clone(),
            class: e.class.map(|c| c.to_string()).unwrap_or_default(),
        })),
    }
}

/// A pull phase on the wire.
pub fn phase_event(p: &PullPhaseChanged) -> proto::Event {
    proto::Event {
        time_ms: now_ms(),
        kind: Some(proto::event::Kind::PullPhase(proto::PullPhase {
            image: p.image.clone(),
            phase: phase_name(p.phase).to_string(),
            pod: p.pod.as_ref().map(pod_ref),
        })),
    }
}

/// The watcher fell behind by `n` events.
pub fn lagged(n: u64) -> proto::Event {
    proto::Event { time_ms: now_ms(), kind: Some(proto::event::Kind::Lagged(n)) }
}

/// A declared prefetch image as `GetStatus` gives it.
pub(super) fn declared_image(d: &crate::node::prefetch_ticker::DeclaredImage) -> proto::DeclaredImage {
    use crate::node::prefetch_ticker::DeclaredState;
    let (image_ref, error) = match &d.state {
        DeclaredState::Present(image_ref) => (image_ref.clone(), String::new()),
        DeclaredState::Failed(error) => (String::new(), error.clone()),
        DeclaredState::Pending | DeclaredState::Pulling => (String::new(), String::new()),
    };
    let since_ms = unix_ms(d.since);
    proto::DeclaredImage { image: d.image.clone(), state: d.state.name().to_string(), image_ref, error, since_ms }
}

/// What `health` says now, as `GetStatus` sends it.
pub(super) fn daemon_health(health: &crate::http::Health) -> proto::DaemonHealth {
    use crate::http::Verdict;
    let reasons = match health.readiness() {
        Verdict::Ok => Vec::new(),
        Verdict::Failing(lines) => lines,
    };
    proto::DaemonHealth {
        alive: health.is_alive(),
        ready: reasons.is_empty(),
        reasons,
        restart_pending: health.restart_pending(),
    }
}

#[cfg(test)]
#[allow(clippy::pedantic)] // test code: pedantic lints are for what ships
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::testing::props::{config, marker};

    #[test]
    fn downloads_older_than_the_running_pulls_are_none_of_theirs_never_stalled_never_summed() {
        let at = |secs: u64| SystemTime::UNIX_EPOCH + Duration::from_secs(secs);
        let download = |reference: &str, offset, updated| Download {
            reference: reference.into(),
            digest: String::new(),
            offset,
            total: 1000,
            started: at(0),
            updated: at(updated),
        };
        let pulling = PullInfo {
            image: "docker.io/library/nginx:1.27".into(),
            runtime_handler: String::new(),
            stage: PullStage::Pulling,
            priority: 0,
            waiters: 1,
            waiting: Duration::from_secs(200),
            running: Some(Duration::from_secs(200)),
            with_credentials: false,
            must_pull: false,
            pods: Vec::new(),
        };
        // The pull started at 800; an abandoned ingest was last written at
        // 500, one of the pull's at 900 (idle 100 s), one just now.
        let listing =
            vec![download("layer-old", 5, 500), download("layer-idle", 10, 900), download("layer-moving", 20, 1000)];
        let idle = Stall { after: Some(Duration::from_secs(60)), slow: &[] };
        let r = pulls(std::slice::from_ref(&pulling), Ok(listing.clone()), &idle, at(1000));
        let marks: Vec<(&str, bool, bool)> =
            r.downloads.iter().map(|d| (d.r#ref.as_str(), d.before_pulls, d.stalled)).collect();
        // (Oldest first, then by key.)
        assert_eq!(marks, [("layer-idle", false, true), ("layer-moving", false, false), ("layer-old", true, false)]);
        assert_eq!((r.pulls[0].downloaded_bytes, r.pulls[0].download_total_bytes), (Some(30), Some(2000)));
        assert!(r.downloads.iter().all(|d| !d.slow));
        // The check names the moving one and the old one slow: only the
        // pulls' own is shown so (and stalled).
        let slow = ["layer-moving".to_string(), "layer-old".to_string()];
        let r = pulls(&[pulling], Ok(listing.clone()), &Stall { slow: &slow, ..idle }, at(1000));
        let marks: Vec<(&str, bool, bool)> =
            r.downloads.iter().map(|d| (d.r#ref.as_str(), d.slow, d.stalled)).collect();
        assert_eq!(marks, [("layer-idle", false, true), ("layer-moving", true, true), ("layer-old", false, false)]);
        // No pull running: every download is before them.
        let r = pulls(&[], Ok(listing), &Stall { slow: &slow, ..idle }, at(1000));
        assert!(r.downloads.iter().all(|d| d.before_pulls && !d.stalled && !d.slow), "{:?}", r.downloads);
    }

    /// Largest `deadline_ms` accepted.
    fn max_deadline_ms() -> u64 {
        u64::try_from(crate::domain::limits::MAX_DURATION.as_millis()).unwrap()
    }

    fn image() -> impl Strategy<Value = String> {
        prop_oneof![
            4 => "[a-z0-9./:@-]{0,40}",
            1 => Just(String::new()),
            1 => "\\PC{0,40}",
            1 => (4090usize..4100).prop_map(|n| "a".repeat(n)),
        ]
    }

    /// A pull secret manifest: valid, with a password that is not base64
    /// (the marker then must not be shown), or any bytes.
    fn manifest() -> impl Strategy<Value = (Vec<u8>, String)> {
        prop_oneof![
            marker().prop_map(|m| {
                let config = format!(r#"{{"auths":{{"r.io":{{"username":"u","password":"{m}"}}}}}}"#);
                let data = base64::Engine::encode(&base64::engine::general_purpose::STANDARD, config);
                let text = format!(
                    "kind: Secret\nmetadata: {{name: s, namespace: ns}}\ntype: kubernetes.io/dockerconfigjson\ndata: {{.dockerconfigjson: {data}}}\n"
                );
                (text.into_bytes(), m)
            }),
            marker().prop_map(|m| {
                (format!("kind: Secret\nmetadata: {{name: s}}\ndata: {{k: \"{m}!\"}}\n").into_bytes(), m)
            }),
            (prop::collection::vec(any::<u8>(), 0..64), marker()).prop_map(|(b, m)| (b, m)),
        ]
    }

    fn deadline_ms() -> impl Strategy<Value = u64> {
        prop_oneof![Just(0), any::<u64>(), (max_deadline_ms() - 2)..=(max_deadline_ms() + 2)]
    }

    /// The field a request's first problem is in (the order ensure_request checks).
    fn first_bad_field(
        image: &str,
        pod: Option<&proto::Pod>,
        policy: &str,
        secrets: &[Vec<u8>],
        deadline: u64,
    ) -> Option<String> {
        if image.is_empty() || image.len() > MAX_IMAGE_LEN {
            return Some("image".into());
        }
        match pod {
            None => return Some("pod".into()),
            Some(p) if p.uid.is_empty() => return Some("pod.uid".into()),
            _ => {}
        }
        if !policy.is_empty() && policy.parse::<PullPolicy>().is_err() {
            return Some("pull_policy".into());
        }
        if let Some(i) = secrets.iter().position(|b| PullSecret::from_manifest(b).is_err()) {
            return Some(format!("pull_secrets[{i}]"));
        }
        (deadline > max_deadline_ms()).then(|| "deadline_ms".into())
    }

    /// A refusal is `InvalidArgument` naming the first bad field, and shows
    /// none of the planted secrets.
    fn refused_naming(e: &tonic::Status, want: Option<String>, markers: &[String]) -> Result<(), TestCaseError> {
        prop_assert_eq!(e.code(), tonic::Code::InvalidArgument);
        let field = want.ok_or_else(|| TestCaseError::fail(format!("refused: {}", e.message())))?;
        prop_assert!(e.message().starts_with(&format!("{field}: ")), "{} does not name {}", e.message(), field);
        for m in markers {
            prop_assert!(!e.message().contains(m.as_str()), "{} leaked in {}", m, e.message());
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(config(256))]

        #[test]
        fn an_ensure_request_converts_or_names_its_first_bad_field(
            image in image(),
            pod in proptest::option::weighted(0.9, ("\\PC{0,8}", prop::collection::hash_map("\\PC{0,8}", "\\PC{0,8}", 0..4), any::<i32>())),
            container in "\\PC{0,8}",
            policy in prop_oneof![Just(String::new()), Just("Always".to_string()), Just("IfNotPresent".to_string()), Just("Never".to_string()), "\\PC{0,12}"],
            secrets in prop::collection::vec(manifest(), 0..3),
            deadline in deadline_ms(),
        ) {
            let pod = pod.map(|(uid, annotations, priority)| proto::Pod {
                uid,
                namespace: "ns".into(),
                name: "n".into(),
                annotations,
                runtime_handler: String::new(),
                priority,
                service_account: None,
            });
            let (pull_secrets, markers): (Vec<Vec<u8>>, Vec<String>) = secrets.into_iter().unzip();
            let want = first_bad_field(&image, pod.as_ref(), &policy, &pull_secrets, deadline);
            let req = proto::EnsureImageRequest {
                pod: pod.clone(),
                container,
                image: image.clone(),
                pull_policy: policy,
                pull_secrets: pull_secrets.clone(),
                deadline_ms: deadline,
            };
            match (ensure_request(req), want) {
                (Ok(r), None) => {
                    let pod = pod.unwrap();
                    prop_assert_eq!(r.image, image);
                    prop_assert_eq!(r.pod.uid, pod.uid);
                    prop_assert_eq!(r.pod.annotations.len(), pod.annotations.len());
                    prop_assert_eq!(r.pull_secrets.len(), pull_secrets.len());
                    prop_assert_eq!(r.deadline.is_some(), deadline != 0);
                }
                (Ok(_), Some(field)) => prop_assert!(false, "accepted, wanted an error naming {}", field),
                (Err(e), want) => refused_naming(&e, want, &markers)?,
            }
        }

        #[test]
        fn a_prefetch_request_converts_or_names_its_first_bad_field(
            image in image(),
            secrets in prop::collection::vec(manifest(), 0..3),
            deadline in deadline_ms(),
            wait in any::<bool>(),
        ) {
            let (pull_secrets, markers): (Vec<Vec<u8>>, Vec<String>) = secrets.into_iter().unzip();
            let pod = proto::Pod { uid: "u".into(), ..Default::default() };
            let want = first_bad_field(&image, Some(&pod), "", &pull_secrets, deadline);
            let req = proto::PrefetchImageRequest {
                image: image.clone(),
                runtime_handler: String::new(),
                pull_secrets,
                priority: 0,
                deadline_ms: deadline,
                wait,
            };
            match (prefetch_request(req), want) {
                (Ok((r, w)), None) => {
                    prop_assert_eq!(r.image, image);
                    prop_assert_eq!(w, wait);
                }
                (Ok(_), Some(field)) => prop_assert!(false, "accepted, wanted an error naming {}", field),
                (Err(e), want) => refused_naming(&e, want, &markers)?,
            }
        }
    }

    #[test]
    fn health_is_sent_as_the_endpoints_say_it() {
        use crate::http::Health;
        let h = Health::new();
        h.set_ready();
        assert_eq!(
            daemon_health(&h),
            proto::DaemonHealth { alive: true, ready: true, reasons: vec![], restart_pending: vec![] }
        );
        h.unreachable("cri_runtime", "unreachable: connection refused");
        assert_eq!(
            daemon_health(&h),
            proto::DaemonHealth {
                alive: true,
                ready: false,
                reasons: vec!["cri_runtime: unreachable: connection refused".into()],
                restart_pending: vec![],
            }
        );
        // Keys waiting for a restart are shown, and neither fail nor unready it.
        h.set_restart_pending(vec!["pull.queue_capacity".into()]);
        assert_eq!(daemon_health(&h).restart_pending, ["pull.queue_capacity"]);
        h.reachable("cri_runtime");
        assert!(daemon_health(&h).ready);
        h.set_restart_pending(Vec::new());
        assert_eq!(daemon_health(&h).restart_pending, Vec::<String>::new());
        h.unreachable("cri_runtime", "unreachable: connection refused");
        h.component_failed("pull_queue", "stopped");
        let d = daemon_health(&h);
        assert!(!d.alive && !d.ready, "{d:?}");
        assert_eq!(d.reasons, vec!["pull_queue: stopped", "cri_runtime: unreachable: connection refused"]);
    }
}
