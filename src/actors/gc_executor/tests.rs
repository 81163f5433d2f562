use std::sync::Arc;
use std::time::{Duration, SystemTime};

use actix::prelude::*;

use super::*;
use crate::actors::detector::{DetectImages, DetectorActor, DetectorSettings};
use crate::clock::Clock;
use crate::cri::{CriError, CriErrorKind, Rpc};
use crate::domain::{Container, ContainerState, Image};
use crate::events::EventReason;
use crate::events::EventSink;
use crate::gc::capacity::CapacitySource;
use crate::gc::in_use_hints::InUseHints;
use crate::gc::plan::{DeleteReason, KeepReason, Verdict};
use crate::gc::policy::{GcPolicy, ProtectionRules};
use crate::testing::{
    EventLog, EventReasons, FailNext, FakeCri, GetFakeCalls, SetFakeContainers, SetFakeFs, SetFakeImages,
};

/// Executor settings for these tests: a 5-minute period, the default rules.
fn settings(policy: GcPolicy, capacity: u64) -> GcExecutorSettings {
    GcExecutorSettings {
        policy,
        rules: ProtectionRules::default(),
        period: Duration::from_secs(300),
        capacity: CapacitySource::fixed(capacity),
        pressure_check: None,
        eviction: Vec::new(),
        mailbox_capacity: DEFAULT_MAILBOX_CAPACITY,
    }
}

/// An executor (not started) over `detector`, with `fake` for image
/// filesystem info and removals.
fn executor(
    cfg: GcExecutorSettings,
    detector: Recipient<DetectImages>,
    fake: &Addr<FakeCri>,
    sink: EventSink,
    clock: Clock,
) -> GcExecutorActor {
    GcExecutorActor::new(cfg, detector, fake.clone().recipient(), fake.clone().recipient(), sink, clock)
}

const GB: u64 = 1 << 30;

fn img(id: &str, size: u64) -> Image {
    Image {
        id: id.into(),
        size,
        repo_tags: vec![format!("example.com/{}:1", id.trim_start_matches("sha256:"))],
        ..Image::default()
    }
}

/// A detector over `fake`, detecting every 5 min, images ensured within
/// `recent_window` counting as in use.
fn detector(fake: &Addr<FakeCri>, recent_window: Duration, clock: &Clock) -> Addr<DetectorActor> {
    let dcfg = DetectorSettings {
        period: Duration::from_secs(300),
        sandbox_image: String::new(),
        recent_window,
        mailbox_capacity: crate::actors::detector::DEFAULT_MAILBOX_CAPACITY,
    };
    DetectorActor::new(dcfg, FakeCri::detector_cri(fake), None, InUseHints::default(), clock.clone()).start()
}

struct Rig {
    fake: Addr<FakeCri>,
    gc: Addr<GcExecutorActor>,
    events: Addr<EventLog>,
}

/// Images a..e of 10 GiB each on a 100 GiB disk with `other` GiB used by
/// other data; GC every 5 min; min age 2 min.
async fn rig(other_gb: u64, policy: GcPolicy) -> Rig {
    let images = ["a", "b", "c", "d", "e"].map(|n| img(&format!("sha256:{n}"), 10 * GB)).to_vec();
    let fake = FakeCri::new(images, 100 * GB).start();
    fake.send(SetFakeFs { capacity: 100 * GB, other_used: other_gb * GB }).await.unwrap();
    let clock = Clock::starting_at(SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000));
    let detector = detector(&fake, policy.min_age, &clock);
    let sink = EventSink::default();
    let events = EventLog::default().start();
    sink.subscribe(events.clone().recipient());
    let cfg = settings(policy, 100 * GB);
    let gc = executor(cfg, detector.recipient(), &fake, sink, clock).start();
    Rig { fake, gc, events }
}

#[actix::test]
async fn gc_runs_every_period_and_frees_down_to_the_low_threshold_oldest_first() {
    tokio::time::pause();
    // 50 GiB images + 40 GiB other = 90 % used: above 85 %.
    let r = rig(40, GcPolicy::default()).await;
    tokio::time::sleep(Duration::from_millis(1)).await;
    // First run at start: every image is younger than the minimum age.
    let first = r.gc.send(RunGc { dry_run: true }).await.unwrap().expect("dry run");
    assert!(
        first.entries.iter().all(|e| matches!(e.verdict, Verdict::Keep(KeepReason::TooYoung { .. }))),
        "{:?}",
        first.entries
    );
    assert_eq!(first.usage_percent, Some(90));
    assert_eq!(first.amount_to_free, 10 * GB, "100 GiB × 20 % − 10 GiB available");
    let short = first.shortfall.as_ref().expect("target cannot be met yet");
    assert_eq!(short.eligible_bytes, 0);

    // Keep "a" in use; after the 5-minute tick the others are old enough.
    let c = Container {
        id: "c1".into(),
        name: "app".into(),
        pod_sandbox_id: "sb1".into(),
        image_ref: "sha256:a".into(),
        state: ContainerState::Running,
        ..Container::default()
    };
    r.fake.send(SetFakeContainers(vec![c], vec![])).await.unwrap();
    tokio::time::sleep(Duration::from_secs(300)).await;
    tokio::time::sleep(Duration::from_millis(1)).await;
    let calls = r.fake.send(GetFakeCalls).await.unwrap();
    assert_eq!(calls.removed.len(), 1, "one 10 GiB image frees enough: {:?}", calls.removed);
    assert_ne!(calls.removed[0], "sha256:a", "in-use image kept");
    let report = r.gc.send(GetLastGcReport).await.unwrap().expect("a report");
    assert_eq!(report.bytes_expected, 10 * GB);
    assert_eq!(report.bytes_freed_measured, Some(i128::from(10 * GB)), "verified on the filesystem");
    let a = report.entries.iter().find(|e| e.id == "sha256:a").expect("a listed");
    assert_eq!(a.explain(), "keep: in use by sb1/app", "pod unknown to the runtime: its sandbox id stands in");
    assert!(report.entries.iter().any(|e| e.verdict == Verdict::Delete(DeleteReason::Space)));
    assert!(report.entries.iter().any(|e| matches!(e.verdict, Verdict::Keep(KeepReason::NotNeeded))));
}

#[actix::test]
async fn dry_run_removes_nothing_and_delete_unused_removes_every_unused_old_image() {
    tokio::time::pause();
    let r = rig(0, GcPolicy::default()).await;
    tokio::time::sleep(Duration::from_secs(200)).await;
    let plan = r.gc.send(DeleteUnusedImages { dry_run: true }).await.unwrap().expect("plan");
    assert_eq!(plan.entries.iter().filter(|e| matches!(e.verdict, Verdict::Delete(_))).count(), 5);
    assert!(r.fake.send(GetFakeCalls).await.unwrap().removed.is_empty());
    let done = r.gc.send(DeleteUnusedImages { dry_run: false }).await.unwrap().expect("reclaim");
    assert_eq!(done.removed.len(), 5);
    assert_eq!(r.fake.send(GetFakeCalls).await.unwrap().of(Rpc::RemoveImage), 5);
}

#[actix::test]
async fn not_enough_space_emits_free_disk_space_failed_and_repeated_failures_image_gc_failed() {
    tokio::time::pause();
    // 50 GiB images + 45 GiB other = 95 %; need 15 GiB; only "b" (10 GiB) may go.
    let r = rig(45, GcPolicy::default()).await;
    let containers = ["a", "c", "d", "e"]
        .map(|n| Container { id: format!("c-{n}"), image_ref: format!("sha256:{n}"), ..Container::default() })
        .to_vec();
    r.fake.send(SetFakeContainers(containers, vec![])).await.unwrap();
    tokio::time::sleep(Duration::from_secs(200)).await;
    let err = r.gc.send(RunGc { dry_run: false }).await.unwrap().expect_err("cannot free 15 GiB");
    assert_eq!(
        err.to_string(),
        "Insufficient free disk space on the node's image filesystem (95% of 100.0 GiB used). Failed to free sufficient space by deleting unused images (freed 10737418240 bytes). Investigate disk usage, as it could be used by active images, logs, volumes, or other data."
    );
    // The run at start failed too (everything was younger than the minimum
    // age): this is the second failure in a row, so ImageGCFailed follows.
    let reasons = r.events.send(EventReasons).await.unwrap();
    assert_eq!(
        reasons,
        [EventReason::FreeDiskSpaceFailed, EventReason::FreeDiskSpaceFailed, EventReason::ImageGcFailed]
    );
}

#[actix::test]
async fn zero_capacity_is_invalid_and_listing_failures_are_reported() {
    tokio::time::pause();
    let r = rig(0, GcPolicy::default()).await;
    r.fake.send(SetFakeFs { capacity: 0, other_used: 0 }).await.unwrap();
    // The capacity source is fixed at 100 GiB in the rig; use a zero one here.
    let clock = Clock::new();
    let detector = detector(&r.fake, Duration::from_secs(120), &clock);
    let sink = EventSink::default();
    let events = EventLog::default().start();
    sink.subscribe(events.clone().recipient());
    let cfg = settings(GcPolicy::default(), 0);
    let gc = executor(cfg, detector.recipient(), &r.fake, sink, clock).start();
    tokio::time::sleep(Duration::from_millis(1)).await;
    let err = gc.send(RunGc { dry_run: false }).await.unwrap().expect_err("capacity 0");
    assert_eq!(err, GcError::InvalidCapacity);
    assert_eq!(err.to_string(), "invalid capacity 0 on image filesystem");
    assert!(events.send(EventReasons).await.unwrap().contains(&EventReason::InvalidDiskCapacity));

    r.fake.send(FailNext(Rpc::ListImages, CriError::new(CriErrorKind::RuntimeUnavailable, "down"))).await.unwrap();
    let err = r.gc.send(RunGc { dry_run: false }).await.unwrap().expect_err("listing failed");
    assert!(matches!(err, GcError::Detection(_)), "{err:?}");
}

#[actix::test]
async fn disabled_gc_never_runs_by_itself() {
    tokio::time::pause();
    let policy = GcPolicy { high_threshold_percent: 100, ..GcPolicy::default() };
    let r = rig(45, policy).await;
    tokio::time::sleep(Duration::from_secs(3_600)).await;
    assert_eq!(r.fake.send(GetFakeCalls).await.unwrap().of(Rpc::ImageFsInfo), 0);
}

#[actix::test]
async fn a_policy_update_enables_disabled_gc_and_can_disable_it_again() {
    tokio::time::pause();
    let off = GcPolicy { high_threshold_percent: 100, ..GcPolicy::default() };
    let r = rig(45, off.clone()).await;
    tokio::time::sleep(Duration::from_secs(600)).await;
    assert_eq!(r.fake.send(GetFakeCalls).await.unwrap().of(Rpc::ImageFsInfo), 0, "off: no run");
    // Reload: the kubelet's defaults (85/80). The loop starts with a run at once.
    r.gc.send(UpdateGcPolicy { policy: GcPolicy::default(), rules: ProtectionRules::default() }).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1)).await;
    let at_once = r.fake.send(GetFakeCalls).await.unwrap().of(Rpc::ImageFsInfo);
    assert!(at_once >= 1, "on: a run at once");
    tokio::time::sleep(Duration::from_secs(300)).await;
    let after_period = r.fake.send(GetFakeCalls).await.unwrap().of(Rpc::ImageFsInfo);
    assert!(after_period > at_once, "and every period: {after_period}");
    // Off again: ticks do nothing.
    r.gc.send(UpdateGcPolicy { policy: off, rules: ProtectionRules::default() }).await.unwrap();
    tokio::time::sleep(Duration::from_secs(900)).await;
    assert_eq!(r.fake.send(GetFakeCalls).await.unwrap().of(Rpc::ImageFsInfo), after_period, "off again");
    // On again, twice: still one run per period (no timer per reload).
    for _ in 0..2 {
        r.gc.send(UpdateGcPolicy { policy: GcPolicy::default(), rules: ProtectionRules::default() }).await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(1)).await;
    let fs_calls = || async { r.fake.send(GetFakeCalls).await.unwrap().of(Rpc::ImageFsInfo) };
    let before = fs_calls().await;
    r.gc.send(RunGc { dry_run: false }).await.unwrap().expect("a run");
    let one_run = fs_calls().await - before;
    assert!(one_run >= 1);
    let start = fs_calls().await;
    tokio::time::sleep(Duration::from_secs(300)).await;
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(fs_calls().await - start, one_run, "one run in one period");
}

#[actix::test]
async fn min_age_counts_from_the_first_detection_before_a_restart() {
    tokio::time::pause();
    let dir = tempfile::tempdir().unwrap();
    let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    let fake = FakeCri::new(vec![img("sha256:old", 10 * GB)], 100 * GB).start();
    let policy = GcPolicy { min_age: Duration::from_secs(1_800), ..GcPolicy::default() };
    let dcfg = || DetectorSettings {
        period: Duration::from_secs(300),
        sandbox_image: String::new(),
        recent_window: Duration::from_secs(600),
        mailbox_capacity: crate::actors::detector::DEFAULT_MAILBOX_CAPACITY,
    };
    {
        let store = Arc::new(crate::store::Store::open(dir.path()).unwrap());
        let d = DetectorActor::new(
            dcfg(),
            FakeCri::detector_cri(&fake),
            Some(store.clone()),
            InUseHints::default(),
            Clock::starting_at(t0),
        )
        .start();
        d.send(crate::actors::detector::DetectImages).await.unwrap().expect("detect");
        for _ in 0..100 {
            if !store.image_records().unwrap().is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        d.send(crate::actors::Stop).await.unwrap();
    }
    // imaged restarts an hour later; the image was first seen an hour ago.
    let mut store = None;
    for _ in 0..100 {
        if let Ok(s) = crate::store::Store::open(dir.path()) {
            store = Some(Arc::new(s));
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let clock = Clock::starting_at(t0 + Duration::from_secs(3_600));
    let d =
        DetectorActor::new(dcfg(), FakeCri::detector_cri(&fake), store, InUseHints::default(), clock.clone()).start();
    let cfg = settings(policy, 100 * GB);
    let gc = executor(cfg, d.recipient(), &fake, EventSink::default(), clock).start();
    // For one ensure window after the restart it may be in use (ensured
    // just before it); then its age, older than min age though imaged
    // restarted less than min age ago, is what counts.
    let plan = gc.send(DeleteUnusedImages { dry_run: true }).await.unwrap().expect("plan");
    assert_eq!(plan.entries[0].verdict, Verdict::Keep(KeepReason::InUse), "{plan:?}");
    assert_eq!(plan.entries[0].used_by, ["maybe ensured before imaged started"]);
    tokio::time::sleep(Duration::from_secs(601)).await;
    let plan = gc.send(DeleteUnusedImages { dry_run: true }).await.unwrap().expect("plan");
    assert_eq!(
        plan.entries[0].verdict,
        Verdict::Delete(DeleteReason::Space),
        "old enough: its age survived the restart"
    );
}

#[actix::test]
async fn a_requested_run_waits_for_the_one_going_on_instead_of_failing_busy() {
    tokio::time::pause();
    let r = rig(0, GcPolicy::default()).await;
    tokio::time::sleep(Duration::from_secs(200)).await;
    let listed = r.fake.send(GetFakeCalls).await.unwrap().of(Rpc::ListImages);
    // Three at once: each message arrives while the one before is running.
    let (a, b, c) = tokio::join!(
        r.gc.send(RunGc { dry_run: true }),
        r.gc.send(DeleteUnusedImages { dry_run: true }),
        r.gc.send(RunGc { dry_run: true }),
    );
    for outcome in [a.unwrap(), b.unwrap(), c.unwrap()] {
        assert!(outcome.is_ok(), "{outcome:?}");
    }
    let runs = r.fake.send(GetFakeCalls).await.unwrap().of(Rpc::ListImages) - listed;
    assert_eq!(runs, 3, "three runs (a detection each), one after another");
}

/// The detector, with something happening while the next detection runs
/// once armed (after the GC run began, before its removals).
struct DuringDetection {
    detector: Recipient<crate::actors::detector::DetectImages>,
    meanwhile: Arc<dyn Fn() -> futures_util::future::BoxFuture<'static, ()> + Send + Sync>,
    armed: Arc<std::sync::atomic::AtomicBool>,
}

impl Actor for DuringDetection {
    type Context = Context<Self>;
}

impl Handler<crate::actors::detector::DetectImages> for DuringDetection {
    type Result = ResponseFuture<Result<Arc<crate::actors::detector::Detection>, CriError>>;
    fn handle(&mut self, m: crate::actors::detector::DetectImages, _: &mut Self::Context) -> Self::Result {
        let (detector, meanwhile) = (self.detector.clone(), self.meanwhile.clone());
        let armed = self.armed.swap(false, std::sync::atomic::Ordering::SeqCst);
        Box::pin(async move {
            let detection = detector.send(m).await.expect("detector");
            if armed {
                meanwhile().await;
            }
            detection
        })
    }
}

/// Images a, b, c on a fake runtime, GC with the hints and the status
/// check, and `meanwhile` during the first requested run's detection.
async fn racing_rig(
    meanwhile: impl Fn(&Addr<FakeCri>, &InUseHints, &Clock) -> futures_util::future::BoxFuture<'static, ()>
    + Send
    + Sync
    + 'static,
) -> (Addr<FakeCri>, Addr<GcExecutorActor>) {
    let images = ["a", "b", "c"].map(|n| img(&format!("sha256:{n}"), 10 * GB)).to_vec();
    let fake = FakeCri::new(images, 100 * GB).start();
    let clock = Clock::starting_at(SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000));
    let hints = InUseHints::default();
    let dcfg = DetectorSettings {
        period: Duration::from_secs(300),
        sandbox_image: String::new(),
        recent_window: Duration::from_secs(120),
        mailbox_capacity: crate::actors::detector::DEFAULT_MAILBOX_CAPACITY,
    };
    let detector = DetectorActor::new(dcfg, FakeCri::detector_cri(&fake), None, hints.clone(), clock.clone()).start();
    let (f, h, c) = (fake.clone(), hints.clone(), clock.clone());
    let meanwhile = Arc::new(move || meanwhile(&f, &h, &c));
    let armed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let wrapped = DuringDetection { detector: detector.recipient(), meanwhile, armed: armed.clone() }.start();
    let cfg = settings(GcPolicy::default(), 100 * GB);
    let gc = executor(cfg, wrapped.recipient(), &fake, EventSink::default(), clock)
        .with_hints(hints)
        .with_status_check(fake.clone().recipient())
        .start();
    tokio::time::sleep(Duration::from_secs(200)).await;
    armed.store(true, std::sync::atomic::Ordering::SeqCst);
    (fake, gc)
}

#[actix::test]
async fn an_image_ensured_since_the_run_began_is_not_removed() {
    tokio::time::pause();
    let (fake, gc) = racing_rig(|_, hints, clock| {
        hints.ensured("sha256:b", clock.now());
        Box::pin(async {})
    })
    .await;
    // Planned from a detection that knew nothing of the ensure: "b" is
    // kept at its removal all the same, and the run says why.
    let err = gc.send(DeleteUnusedImages { dry_run: false }).await.unwrap().expect_err("b not removed");
    let report = err.report().expect("a report");
    assert_eq!(report.removed.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(), ["sha256:a", "sha256:c"]);
    assert_eq!(report.failed, [("sha256:b".to_string(), super::run::IN_USE_SINCE_PLANNED.to_string())]);
    assert!(err.to_string().contains(super::run::IN_USE_SINCE_PLANNED), "{err}");
    assert_eq!(fake.send(GetFakeCalls).await.unwrap().removed, ["sha256:a", "sha256:c"]);
}

#[actix::test]
async fn an_image_the_runtime_pinned_since_the_detection_is_not_removed() {
    tokio::time::pause();
    let (fake, gc) = racing_rig(|fake, _, _| {
        let fake = fake.clone();
        Box::pin(async move {
            let mut images = ["a", "b", "c"].map(|n| img(&format!("sha256:{n}"), 10 * GB)).to_vec();
            images[2].pinned = true;
            fake.send(SetFakeImages(images)).await.expect("fake");
        })
    })
    .await;
    let err = gc.send(DeleteUnusedImages { dry_run: false }).await.unwrap().expect_err("c not removed");
    let report = err.report().expect("a report");
    assert_eq!(report.failed, [("sha256:c".to_string(), super::run::PINNED_SINCE_PLANNED.to_string())]);
    assert_eq!(fake.send(GetFakeCalls).await.unwrap().removed, ["sha256:a", "sha256:b"]);
    // A status that cannot be read keeps the image too.
    fake.send(FailNext(Rpc::ImageStatus, CriError::new(CriErrorKind::DeadlineExceeded, "slow"))).await.unwrap();
    fake.send(SetFakeImages(vec![img("sha256:d", GB)])).await.unwrap();
    tokio::time::sleep(Duration::from_secs(400)).await;
    let err = gc.send(DeleteUnusedImages { dry_run: false }).await.unwrap().expect_err("d not removed");
    let failed = &err.report().expect("a report").failed;
    assert!(failed[0].1.starts_with("not removed: its status could not be read: "), "{failed:?}");
}

/// Removes through `fake`, first noting who holds the detector's last
/// detection: the detector, this remover, and anyone else.
struct HoldersAtRemoval {
    detector: Addr<DetectorActor>,
    fake: Addr<FakeCri>,
    holders: Vec<usize>,
}

impl Actor for HoldersAtRemoval {
    type Context = Context<Self>;
}

impl Handler<crate::actors::cri_gateway::RemoveImage> for HoldersAtRemoval {
    type Result = ResponseActFuture<Self, Result<(), CriError>>;
    fn handle(&mut self, m: crate::actors::cri_gateway::RemoveImage, _: &mut Self::Context) -> Self::Result {
        let (detector, fake) = (self.detector.clone(), self.fake.clone());
        Box::pin(
            async move {
                let last = detector.send(crate::actors::detector::GetLastDetection).await.ok().flatten();
                let holders = last.as_ref().map_or(0, Arc::strong_count);
                drop(last);
                let removed =
                    fake.send(m).await.unwrap_or_else(|e| Err(CriError::new(CriErrorKind::Other, e.to_string())));
                (holders, removed)
            }
            .into_actor(self)
            .map(|(holders, removed), act, _| {
                act.holders.push(holders);
                removed
            }),
        )
    }
}

#[derive(Message)]
#[rtype(result = "Vec<usize>")]
struct Holders;

impl Handler<Holders> for HoldersAtRemoval {
    type Result = MessageResult<Holders>;
    fn handle(&mut self, _: Holders, _: &mut Self::Context) -> Self::Result {
        MessageResult(self.holders.clone())
    }
}

#[actix::test]
async fn a_run_lets_go_of_its_detection_before_it_removes_anything() {
    // A detection while a run removes images (the detector's tick) updates
    // the records in place only if nobody else holds them: a run that kept
    // its detection made every such detection copy all the records.
    tokio::time::pause();
    let images = ["a", "b", "c"].map(|n| img(&format!("sha256:{n}"), 10 * GB)).to_vec();
    let fake = FakeCri::new(images, 100 * GB).start();
    let clock = Clock::starting_at(SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000));
    let detector = detector(&fake, Duration::ZERO, &clock);
    let remover = HoldersAtRemoval { detector: detector.clone(), fake: fake.clone(), holders: Vec::new() }.start();
    let policy = GcPolicy { min_age: Duration::ZERO, ..GcPolicy::default() };
    let gc = GcExecutorActor::new(
        settings(policy, 100 * GB),
        detector.recipient(),
        fake.clone().recipient(),
        remover.clone().recipient(),
        EventSink::default(),
        clock,
    )
    .with_pull_records(crate::pull_records::PullRecords::in_memory(crate::pull_records::VerifyPolicy::default()))
    .start();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let done = gc.send(DeleteUnusedImages { dry_run: false }).await.unwrap().expect("reclaim");
    assert_eq!(done.removed.len(), 3);
    let holders = remover.send(Holders).await.unwrap();
    assert_eq!(holders, vec![2, 2, 2], "the detector and the remover's look only, at each removal");
}

#[actix::test]
async fn the_periodic_runs_report_is_bounded_from_the_start_and_a_requested_run_answers_every_image() {
    tokio::time::pause();
    // More images than a kept report lists of one reason, all too young to go.
    let n = KEPT_LISTED_PER_REASON + 10;
    let images = (0..n).map(|i| img(&format!("sha256:{i:04}"), GB)).collect();
    let fake = FakeCri::new(images, 1000 * GB).start();
    let clock = Clock::starting_at(SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000));
    let detector = detector(&fake, Duration::from_secs(120), &clock);
    let cfg = settings(GcPolicy::default(), 1000 * GB);
    let gc = executor(cfg, detector.recipient(), &fake, EventSink::default(), clock).start();
    tokio::time::sleep(Duration::from_millis(1)).await;

    let periodic = gc.send(GetLastGcReport).await.unwrap().expect("the start's run");
    assert_eq!(periodic.entries.len(), KEPT_LISTED_PER_REASON, "{:?}", periodic.kept_unlisted);
    assert_eq!(periodic.kept_unlisted.len(), 1);
    let unlisted = &periodic.kept_unlisted[0];
    assert_eq!((unlisted.images, unlisted.bytes), (10, 10 * GB));
    let Verdict::Keep(reason) = &periodic.entries[0].verdict else { panic!("{:?}", periodic.entries[0]) };
    assert_eq!(unlisted.reason, reason.kind(), "the same reason for every image");

    let asked = gc.send(RunGc { dry_run: false }).await.unwrap().expect("a run");
    assert_eq!(asked.entries.len(), n, "who asked gets every image");
    assert!(asked.kept_unlisted.is_empty());
    let kept = gc.send(GetLastGcReport).await.unwrap().expect("kept");
    assert!(!Arc::ptr_eq(&kept, &asked), "the executor keeps its bounded copy");
    assert_eq!(kept.entries.len(), KEPT_LISTED_PER_REASON);
    assert_eq!(kept.started, asked.started);
}

/// [`rig`]'s images on a disk whose other data is set later, GC every
/// 5 min, the filesystem checked every `pressure` between runs.
async fn pressure_rig(pressure: Option<Duration>) -> Rig {
    pressure_rig_evicting(pressure, Vec::new()).await
}

/// [`pressure_rig`] on a node whose kubelet evicts below `eviction`.
async fn pressure_rig_evicting(
    pressure: Option<Duration>,
    eviction: Vec<crate::gc::eviction::AvailableThreshold>,
) -> Rig {
    let images = ["a", "b", "c", "d", "e"].map(|n| img(&format!("sha256:{n}"), 10 * GB)).to_vec();
    let fake = FakeCri::new(images, 100 * GB).start();
    fake.send(SetFakeFs { capacity: 100 * GB, other_used: 0 }).await.unwrap();
    let clock = Clock::starting_at(SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000));
    let detector = detector(&fake, GcPolicy::default().min_age, &clock);
    let sink = EventSink::default();
    let events = EventLog::default().start();
    sink.subscribe(events.clone().recipient());
    let cfg = GcExecutorSettings { pressure_check: pressure, eviction, ..settings(GcPolicy::default(), 100 * GB) };
    let gc = executor(cfg, detector.recipient(), &fake, sink, clock).start();
    Rig { fake, gc, events }
}

#[actix::test]
async fn a_disk_that_fills_between_runs_is_cleaned_within_a_pressure_check_not_at_the_next_period() {
    tokio::time::pause();
    for pressure in [Some(Duration::from_secs(10)), None] {
        let r = pressure_rig(pressure).await;
        // The run at start (50 % used) removes nothing; three minutes on,
        // every image is past the minimum age.
        tokio::time::sleep(Duration::from_secs(180)).await;
        assert!(r.fake.send(GetFakeCalls).await.unwrap().removed.is_empty());
        // Other data fills the disk to 90 %, two minutes before the next run.
        r.fake.send(SetFakeFs { capacity: 100 * GB, other_used: 40 * GB }).await.unwrap();
        tokio::time::sleep(Duration::from_secs(11)).await;
        tokio::time::sleep(Duration::from_millis(1)).await;
        let removed = r.fake.send(GetFakeCalls).await.unwrap().removed.len();
        match pressure {
            Some(_) => assert_eq!(removed, 1, "cleaned down to the low threshold within one check"),
            None => assert_eq!(removed, 0, "off: the kubelet's wait for the period"),
        }
        // Off, the periodic run at 5 minutes does it.
        tokio::time::sleep(Duration::from_secs(120)).await;
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(r.fake.send(GetFakeCalls).await.unwrap().removed.len(), 1);
    }
}

#[actix::test]
async fn a_pressure_gc_cannot_fix_is_not_run_again_until_more_is_used() {
    tokio::time::pause();
    let r = pressure_rig(Some(Duration::from_secs(10))).await;
    tokio::time::sleep(Duration::from_secs(180)).await;
    // Every image in use: no run can free anything.
    let containers = ["a", "b", "c", "d", "e"]
        .map(|n| Container {
            id: format!("c-{n}"),
            name: n.into(),
            pod_sandbox_id: "sb1".into(),
            image_ref: format!("sha256:{n}"),
            state: ContainerState::Running,
            ..Container::default()
        })
        .to_vec();
    r.fake.send(SetFakeContainers(containers, vec![])).await.unwrap();
    r.fake.send(SetFakeFs { capacity: 100 * GB, other_used: 40 * GB }).await.unwrap();
    let failed = |r: &Rig| {
        let r = r.events.clone();
        async move {
            let events = r.send(crate::testing::TakeEvents).await.unwrap();
            events.iter().filter(|e| e.reason == EventReason::FreeDiskSpaceFailed).count()
        }
    };
    tokio::time::sleep(Duration::from_secs(11)).await;
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(failed(&r).await, 1, "one run, at the first check above the threshold");
    // Checks every 10 s for a minute, nothing added: no more runs, no more events.
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(failed(&r).await, 0, "the same usage is not run again");
    // More is used: the next check runs again.
    r.fake.send(SetFakeFs { capacity: 100 * GB, other_used: 41 * GB }).await.unwrap();
    tokio::time::sleep(Duration::from_secs(10)).await;
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(failed(&r).await, 1, "usage grew: run again");
}

#[actix::test]
async fn a_pressure_check_runs_gc_before_a_looser_kubelet_eviction_line_than_the_high_threshold() {
    tokio::time::pause();
    use crate::gc::eviction::AvailableThreshold;
    // The kubelet evicts below 20 % free (usage above 80 %); GC's high
    // threshold is 85 %. Other data brings usage to 82 %.
    for (eviction, removed) in [(vec![AvailableThreshold::Percent(2000)], 1), (Vec::new(), 0)] {
        let r = pressure_rig_evicting(Some(Duration::from_secs(10)), eviction.clone()).await;
        tokio::time::sleep(Duration::from_secs(185)).await;
        let measured = r.fake.send(GetFakeCalls).await.unwrap().of(crate::cri::Rpc::ImageFsInfo);
        r.fake.send(SetFakeFs { capacity: 100 * GB, other_used: 32 * GB }).await.unwrap();
        tokio::time::sleep(Duration::from_secs(6)).await;
        tokio::time::sleep(Duration::from_millis(1)).await;
        let calls = r.fake.send(GetFakeCalls).await.unwrap();
        assert_eq!(calls.removed.len(), removed, "eviction lines {eviction:?}");
        // One check (at 190 s); a run it starts takes its measurement and
        // measures once more, after its removals.
        assert_eq!(calls.of(crate::cri::Rpc::ImageFsInfo) - measured, 1 + removed as u64, "{eviction:?}");
        if removed > 0 {
            let report = r.gc.send(GetLastGcReport).await.unwrap().expect("a run");
            // A run at 80 % (the last usage before 81 %, where the
            // kubelet may evict), down to 75 %: 7 GB, one 10 GB image.
            assert_eq!(report.amount_to_free, 7 * GB, "{report:?}");
        }
    }
}
