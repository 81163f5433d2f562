//! The detector's logic without actix: paused nothing, a manual clock.

use std::time::{Duration, SystemTime};

use super::*;
use crate::clock::ManualClock;
use crate::domain::ContainerState;

fn img(id: &str, tag: &str) -> Image {
    Image { id: id.into(), size: 10, repo_tags: vec![tag.into()], ..Image::default() }
}

fn settings() -> DetectorSettings {
    DetectorSettings {
        period: Duration::from_secs(300),
        sandbox_image: "registry.k8s.io/pause:3.10".into(),
        recent_window: Duration::from_secs(120),
        mailbox_capacity: 1,
    }
}

fn listed(images: Vec<Image>, containers: Vec<Container>) -> Listed {
    Listed { images, containers, ..Listed::default() }
}

fn running(image: &str) -> Container {
    Container {
        id: "c1".into(),
        pod_sandbox_id: "sb".into(),
        name: "app".into(),
        image_ref: image.into(),
        state: ContainerState::Running,
        ..Container::default()
    }
}

#[test]
fn each_source_of_in_use_is_named_and_the_rest_is_not_in_use() {
    let clock = ManualClock::new();
    let hints = InUseHints::default();
    let mut d = Detector::new(&settings(), hints.clone(), clock.clock());
    hints.ensured("sha256:recent", clock.clock().now());
    let _pulling = hints.pull_started("flight:1");
    let pause = img("sha256:pause", "registry.k8s.io/pause:3.10");
    let mut l = listed(
        vec![
            img("sha256:used", "used:1"),
            img("sha256:recent", "recent:1"),
            img("sha256:flight", "flight:1"),
            img("sha256:idle", "idle:1"),
            pause.clone(),
        ],
        vec![running("sha256:used")],
    );
    l.sandbox = Some(ImageStatus { image: Some(pause), ..ImageStatus::default() });
    let (det, _) = d.apply(l);
    let reason = |id: &str| det.in_use.get(id).map(|v| v.join(","));
    assert_eq!(
        reason("sha256:used").as_deref(),
        Some("sb/app"),
        "a container's image, named by its sandbox when the pod is not listed"
    );
    assert_eq!(reason("sha256:recent").as_deref(), Some("ensured recently"));
    assert_eq!(reason("sha256:flight").as_deref(), Some("pull in flight"));
    assert_eq!(reason("sha256:pause").as_deref(), Some("sandbox image"));
    assert_eq!(reason("sha256:idle"), None, "an image nothing uses is not in use");
    assert_eq!(det.sandbox_image_id.as_deref(), Some("sha256:pause"));
}

#[test]
fn an_ensure_hint_lapses_after_the_window() {
    let clock = ManualClock::new();
    let hints = InUseHints::default();
    let mut d = Detector::new(&settings(), hints.clone(), clock.clock());
    hints.ensured("sha256:a", clock.clock().now());
    clock.advance(Duration::from_secs(121));
    let (det, _) = d.apply(listed(vec![img("sha256:a", "a:1")], vec![]));
    assert!(det.in_use.is_empty(), "ensured 121 s ago with a 120 s window: {:?}", det.in_use);
}

#[test]
fn only_what_changed_is_written_back() {
    let clock = ManualClock::new();
    let mut d = Detector::new(&settings(), InUseHints::default(), clock.clock());
    let images = vec![img("sha256:a", "a:1"), img("sha256:b", "b:1")];

    let (first, write) = d.apply(listed(images.clone(), vec![]));
    let write = write.expect("two new records");
    let mut written: Vec<_> = write.upserts.iter().map(|r| r.key.clone()).collect();
    written.sort();
    assert_eq!(written, [RecordKey::id("sha256:a"), RecordKey::id("sha256:b")]);
    assert!(write.deletes.is_empty());
    assert_eq!(d.last().map(|l| l.at), Some(first.at), "the last detection is kept");

    clock.advance(Duration::from_secs(300));
    let (_, write) = d.apply(listed(images.clone(), vec![]));
    assert_eq!(write, None, "nothing changed, nothing to write");

    let (det, write) = d.apply(listed(vec![images[0].clone()], vec![]));
    assert_eq!(write.map(|w| w.deletes), Some(vec![RecordKey::id("sha256:b")]), "a vanished image's record goes");
    assert!(det.records.get(&RecordKey::id("sha256:b")).is_none());
}

#[test]
fn loaded_records_keep_their_first_detection() {
    let clock = ManualClock::new();
    let earlier = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
    let mut old = Detector::new(&settings(), InUseHints::default(), crate::clock::Clock::starting_at(earlier));
    let (_, write) = old.apply(listed(vec![img("sha256:a", "a:1")], vec![]));
    let stored = write.expect("written").upserts;
    let first_detected = stored[0].first_detected;
    assert!(first_detected >= earlier && first_detected < earlier + Duration::from_secs(60));

    let mut d = Detector::new(&settings(), InUseHints::default(), clock.clock());
    d.load(stored);
    let (det, write) = d.apply(listed(vec![img("sha256:a", "a:1")], vec![]));
    let a = det.records.get(&RecordKey::id("sha256:a")).expect("a");
    assert_eq!(a.first_detected, first_detected, "first detected comes from the store");
    assert_eq!(write, None, "an unused image seen again changes nothing");
}

#[test]
fn a_new_window_decides_from_the_next_detection() {
    let clock = ManualClock::new();
    let hints = InUseHints::default();
    let mut d = Detector::new(&settings(), hints.clone(), clock.clock());
    hints.ensured("sha256:a", clock.clock().now());
    clock.advance(Duration::from_secs(60));
    let (det, _) = d.apply(listed(vec![img("sha256:a", "a:1")], vec![]));
    assert!(det.in_use.contains_key("sha256:a"), "ensured 60 s ago with a 120 s window");
    // A reload lowers gc.image_minimum_gc_age to 30 s.
    d.set_recent_window(Duration::from_secs(30));
    let (det, _) = d.apply(listed(vec![img("sha256:a", "a:1")], vec![]));
    assert!(det.in_use.is_empty(), "ensured 60 s ago with a 30 s window: {:?}", det.in_use);
}

#[test]
fn records_are_updated_in_place_unless_someone_still_holds_the_last_detection() {
    let clock = ManualClock::new();
    let mut d = Detector::new(&settings(), InUseHints::default(), clock.clock());
    let (first, _) = d.apply(listed(vec![img("sha256:a", "a:1")], vec![]));
    let first_records = Arc::as_ptr(&first.records);
    drop(first);
    clock.advance(Duration::from_secs(300));
    let (second, _) = d.apply(listed(vec![img("sha256:a", "a:1"), img("sha256:b", "b:1")], vec![]));
    assert_eq!(Arc::as_ptr(&second.records), first_records, "nobody held them: updated in place, no copy");
    // A GC run still planning over the second detection keeps its view.
    clock.advance(Duration::from_secs(300));
    let (third, _) = d.apply(listed(vec![img("sha256:b", "b:1")], vec![]));
    assert!(!Arc::ptr_eq(&second.records, &third.records), "copied for the holder");
    assert_eq!(second.records.len(), 2, "the holder's view is unchanged");
    assert_eq!(third.records.len(), 1);
    assert!(Arc::ptr_eq(&d.last().expect("last").records, &third.records));
}

#[test]
fn images_used_again_are_touched_not_copied_and_a_failed_write_rewrites_everything() {
    let clock = ManualClock::new();
    let mut d = Detector::new(&settings(), InUseHints::default(), clock.clock());
    let images = vec![img("sha256:a", "a:1"), img("sha256:b", "b:1")];
    let (_, first) = d.apply(listed(images.clone(), vec![running("sha256:a")]));
    assert_eq!(first.expect("new records").upserts.len(), 2);
    d.persisted(Ok(Vec::new()));

    // Steady state: a's container runs on; only its last-used time moves.
    clock.advance(Duration::from_secs(300));
    let (_, w) = d.apply(listed(images.clone(), vec![running("sha256:a")]));
    let w = w.expect("a was used again");
    assert!(!w.replace_all && w.upserts.is_empty() && w.deletes.is_empty(), "{w:?}");
    assert_eq!((w.used, w.used_at), (vec![RecordKey::id("sha256:a")], clock.clock().now()));

    // The store had no record of a: written whole next time, not touched.
    d.persisted(Ok(vec![RecordKey::id("sha256:a")]));
    clock.advance(Duration::from_secs(300));
    let (_, w) = d.apply(listed(images.clone(), vec![running("sha256:a")]));
    let w = w.expect("a again");
    assert_eq!(w.upserts.iter().map(|r| r.key.clone()).collect::<Vec<_>>(), vec![RecordKey::id("sha256:a")]);
    assert!(w.used.is_empty(), "{w:?}");
    assert_eq!(w.upserts[0].last_used, Some(clock.clock().now()));

    // A failed write: what the store holds is unknown, so all is replaced,
    // even when nothing changed since.
    d.persisted(Err(()));
    clock.advance(Duration::from_secs(300));
    let (_, w) = d.apply(listed(images, vec![]));
    let w = w.expect("a full rewrite");
    assert!(w.replace_all && w.upserts.len() == 2, "{w:?}");
    d.persisted(Ok(Vec::new()));
    let (_, w) = d.apply(listed(vec![img("sha256:a", "a:1"), img("sha256:b", "b:1")], vec![]));
    assert_eq!(w, None, "back to writing only changes");
}

#[test]
fn the_sandbox_image_stays_protected_when_its_status_call_fails() {
    let clock = ManualClock::new();
    let mut d = Detector::new(&settings(), InUseHints::default(), clock.clock());
    let pause = img("sha256:pause", "registry.k8s.io/pause:3.10");
    let idle = img("sha256:idle", "idle:1");
    // The status call failed (`sandbox: None`): found by its name in the list.
    let (det, _) = d.apply(listed(vec![pause.clone(), idle.clone()], Vec::new()));
    assert_eq!(det.sandbox_image_id.as_deref(), Some("sha256:pause"));
    assert!(det.in_use.contains_key("sha256:pause"), "{:?}", det.in_use);
    // Listed under a digest only: the id it resolved to last time.
    let by_digest =
        Image { repo_tags: Vec::new(), repo_digests: vec!["registry.k8s.io/pause@sha256:d".into()], ..pause };
    let (det, _) = d.apply(listed(vec![by_digest, idle.clone()], Vec::new()));
    assert_eq!(det.sandbox_image_id.as_deref(), Some("sha256:pause"));
    // An image that is gone protects nothing.
    let (det, _) = d.apply(listed(vec![idle.clone()], Vec::new()));
    assert_eq!(det.sandbox_image_id, None);
    assert!(!det.in_use.contains_key("sha256:idle"));
    // A status that answers "absent" is believed.
    let mut l = listed(vec![idle], Vec::new());
    l.sandbox = Some(ImageStatus::default());
    assert_eq!(d.apply(l).0.sandbox_image_id, None);
}

#[test]
fn after_a_restart_on_durable_records_their_images_count_as_in_use_for_one_window_without_a_use() {
    let clock = ManualClock::new();
    let mut d = Detector::new(&settings(), InUseHints::default(), clock.clock());
    // Records from before the restart: "old" was last used long ago.
    let (_, _) = d.apply(listed(vec![img("sha256:old", "old:1")], vec![]));
    let before: Vec<ImageRecord> = d.last().unwrap().records.iter().cloned().collect();
    let last_used = before[0].last_used;
    clock.advance(Duration::from_secs(3_600));
    let mut restarted = Detector::new(&settings(), InUseHints::default(), clock.clock());
    restarted.load(before);
    let l = || listed(vec![img("sha256:old", "old:1"), img("sha256:new", "new:1")], vec![]);
    let (det, write) = restarted.apply(l());
    assert_eq!(
        det.used_by("sha256:old"),
        ["maybe ensured before imaged started"],
        "it may have been ensured just before the restart"
    );
    assert!(det.is_in_use("sha256:old"));
    // An image the records did not know (pulled and ensured just before a
    // crash, before a detection recorded it) too: never used, the max-age
    // pass would take it at once, min age or not.
    assert!(det.is_in_use("sha256:new"));
    assert_eq!(det.used_by("sha256:new"), ["maybe ensured before imaged started"]);
    assert_eq!(det.in_use_ids(), std::collections::HashSet::from(["sha256:old".to_string(), "sha256:new".to_string()]));
    let old = det.records.get(&RecordKey::id("sha256:old")).unwrap();
    assert_eq!(old.last_used, last_used, "the grace is not a use");
    assert!(write.is_some_and(|w| w.upserts.iter().all(|r| r.key.id != "sha256:old")), "nothing to write for it");
    clock.advance(Duration::from_secs(121));
    let (det, _) = restarted.apply(l());
    assert!(det.in_use.is_empty(), "one window only: {:?}", det.in_use);
    assert!(!det.is_in_use("sha256:old") && det.used_by("sha256:old").is_empty(), "one window only");
}

#[test]
fn no_grace_without_a_window_and_a_grace_with_no_records() {
    let clock = ManualClock::new();
    let zero = DetectorSettings { recent_window: Duration::ZERO, ..settings() };
    let mut d = Detector::new(&zero, InUseHints::default(), clock.clock());
    let (first, _) = d.apply(listed(vec![img("sha256:a", "a:1")], vec![]));
    let mut restarted = Detector::new(&zero, InUseHints::default(), clock.clock());
    restarted.load(first.records.iter().cloned().collect());
    assert!(restarted.apply(listed(vec![img("sha256:a", "a:1")], vec![])).0.in_use_ids().is_empty());
    // A store with no records yet (a crash before the first detection
    // wrote any): its images may have been ensured all the same.
    let mut empty = Detector::new(&settings(), InUseHints::default(), clock.clock());
    empty.load(vec![]);
    assert!(empty.apply(listed(vec![img("sha256:a", "a:1")], vec![])).0.is_in_use("sha256:a"));
}
