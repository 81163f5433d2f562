//! Image GC against the embedded runtime: the simulated image filesystem
//! fills past the high threshold and GC brings it under the low one,
//! keeping in-use, pinned-by-rule and sandbox images, with the reclaim
//! verified on the filesystem.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::pedantic)] // test code: a failed unwrap is a failed test

mod support;

use std::time::Duration;

use imaged::actors::gc_executor::{DeleteUnusedImages, GetLastGcReport, RunGc};
use imaged::config::Config;
use imaged::cri::Rpc;
use imaged::domain::{Container, ContainerState, ImageSpec};
use imaged::embedded::RemoteImage;
use imaged::gc::plan::{DeleteReason, KeepReason, Verdict};
use imaged::node::{GcParts, GcService};
use support::fixture::runtime;

fn settings() -> imaged::config::GcSettings {
    let cfg = Config::from_toml(
        "[gc]\nimage_minimum_gc_age = \"0s\"\nsandbox_image = \"registry.k8s.io/pause:3.10\"\npinned_images = [\"example.com/keep/*\"]",
    )
    .expect("config");
    cfg.gc
}

#[actix::test]
async fn gc_brings_a_full_filesystem_under_the_low_threshold() {
    let rt = runtime().await;
    rt.runtime.set_capacity(1_000);
    // 9 images of 100 bytes: 90 % used, above the 85 % threshold.
    for name in ["a", "b", "c", "d", "e", "f"] {
        rt.runtime.preload(RemoteImage::new(format!("example.com/app/{name}:1"), 100)).expect("preload");
    }
    let used = rt.runtime.preload(RemoteImage::new("example.com/app/used:1", 100)).expect("preload");
    rt.runtime.preload(RemoteImage::new("example.com/keep/base:1", 100)).expect("preload");
    rt.runtime.preload(RemoteImage::new("registry.k8s.io/pause:3.10", 100)).expect("preload");
    rt.runtime.add_container(Container {
        id: "c1".into(),
        name: "web".into(),
        image: ImageSpec::new("example.com/app/used:1"),
        image_ref: used.clone(),
        state: ContainerState::Exited,
        ..Container::default()
    });
    let svc = GcService::start(&rt.gateway, &settings(), rt.runtime.capacity_source(), GcParts::default());

    let plan = svc.executor.send(RunGc { dry_run: true }).await.unwrap().expect("plan");
    assert_eq!(plan.usage_percent, Some(90));
    assert_eq!(plan.amount_to_free, 100, "1000 × 20 % − 100 available");
    let verdict = |id: &str| plan.entries.iter().find(|e| e.id == id).map(|e| e.verdict.clone());
    assert_eq!(verdict(&used), Some(Verdict::Keep(KeepReason::InUse)));
    assert_eq!(
        verdict(&RemoteImage::new("example.com/keep/base:1", 0).id),
        Some(Verdict::Keep(KeepReason::PinnedByRule("example.com/keep/*".into())))
    );
    assert_eq!(
        verdict(&RemoteImage::new("registry.k8s.io/pause:3.10", 0).id),
        Some(Verdict::Keep(KeepReason::SandboxImage))
    );
    assert_eq!(rt.runtime.stats().calls(Rpc::RemoveImage), 0, "a dry run removes nothing");

    let report = svc.executor.send(RunGc { dry_run: false }).await.unwrap().expect("gc");
    assert_eq!(report.removed.len(), 1);
    assert_eq!(report.removed[0].reason, DeleteReason::Space.to_string());
    assert_eq!(report.bytes_freed_measured, Some(100), "reclaim verified on the filesystem");
    assert_eq!(rt.runtime.used_bytes(), 800, "80 %: at the low threshold");
    assert!(svc.executor.send(GetLastGcReport).await.unwrap().is_some());

    // Disk-pressure reclaim removes every other unused image.
    let reclaim = svc.executor.send(DeleteUnusedImages { dry_run: false }).await.unwrap().expect("reclaim");
    assert_eq!(reclaim.removed.len(), 5);
    let left: Vec<String> = rt.runtime.images().into_iter().flat_map(|i| i.repo_tags).collect();
    let mut left = left;
    left.sort();
    assert_eq!(left, ["example.com/app/used:1", "example.com/keep/base:1", "registry.k8s.io/pause:3.10"]);
}

#[actix::test]
async fn the_node_status_image_list_comes_from_the_cache() {
    let rt = runtime().await;
    rt.runtime.preload(RemoteImage::new("example.com/big:1", 300)).expect("preload");
    rt.runtime.preload(RemoteImage::new("example.com/small:1", 10)).expect("preload");
    let svc = GcService::start(&rt.gateway, &settings(), rt.runtime.capacity_source(), GcParts::default());
    let reader = svc.images.clone();
    // The first refresh runs at start (bounded wait).
    for _ in 0..50 {
        if !reader.snapshot().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let status = reader.node_status();
    assert_eq!(status.len(), 2);
    assert_eq!(status[0].size_bytes, 300);
    assert!(status[0].names.iter().any(|n| n == "example.com/big:1"));
    assert!(status[0].names[0].contains('@'), "digests first: {:?}", status[0].names);
}

#[actix::test]
async fn the_max_age_counts_from_the_first_start_on_durable_state_not_from_each_restart() {
    use imaged::actors::Stop;
    use imaged::clock::Clock;
    use imaged::pull_records::{PullRecords, VerifyPolicy};
    use imaged::store::Store;
    use std::sync::Arc;
    use std::time::SystemTime;

    let dir = tempfile::tempdir().expect("tempdir");
    let rt = runtime().await;
    let old = rt.runtime.preload(RemoteImage::new("example.com/app/old:1", 100)).expect("preload");
    let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    let hour = Duration::from_secs(3_600);
    // imaged starting at `at` on the state in `dir`; its GC's dry-run
    // verdict on the never-used image; then it stops.
    let (rt, state, old) = (&rt, dir.path(), &old);
    let verdict_at = move |at: SystemTime, survives: bool| {
        async move {
            let toml = format!(
                "[gc]\nimage_minimum_gc_age = \"0s\"\nimage_maximum_gc_age = \"1h\"\nmax_age_survives_restarts = {survives}"
            );
            let settings = Config::from_toml(&toml).expect("config").gc;
            // The previous start's actors let go of the database as they stop.
            let mut store = None;
            for _ in 0..200 {
                if let Ok(s) = Store::open(state) {
                    store = Some(Arc::new(s));
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            let parts = GcParts {
                store: Some(store.expect("the state opens")),
                pull_records: Some(PullRecords::in_memory(VerifyPolicy::default()).with_clock(Clock::starting_at(at))),
                ..GcParts::default()
            };
            let svc = GcService::start(&rt.gateway, &settings, rt.runtime.capacity_source(), parts);
            let plan = svc.executor.send(RunGc { dry_run: true }).await.unwrap().expect("plan");
            for stop in [svc.executor.recipient::<Stop>(), svc.detector.recipient(), svc.refresher.recipient()] {
                let _ = stop.send(Stop).await;
            }
            plan.entries.iter().find(|e| e.id == *old).map(|e| e.verdict.clone())
        }
    };
    let kept = Some(Verdict::Keep(KeepReason::NotNeeded));
    let by_age = Some(Verdict::Delete(DeleteReason::Age));
    assert_eq!(verdict_at(t0, true).await, kept, "the loop has just begun");
    assert_eq!(verdict_at(t0 + 2 * hour, true).await, by_age, "began at the first start, 2 h ago: unused for longer");
    assert_eq!(
        verdict_at(t0 + 3 * hour, false).await,
        kept,
        "as the kubelet: the loop begins at each start and waits max age again"
    );
    assert_eq!(verdict_at(t0 + 4 * hour, true).await, by_age, "the kept start was not replaced");
}
