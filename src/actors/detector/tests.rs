use std::time::{Duration, SystemTime};

use actix::prelude::*;

use super::*;
use crate::cri::Rpc;
use crate::domain::{Container, ContainerState, Image, PodSandbox};
use crate::gc::record::RecordKey;
use crate::testing::{FakeCri, GetFakeCalls, SetFakeContainers, SetFakeImages};

fn img(id: &str, size: u64, tag: &str) -> Image {
    Image { id: id.into(), size, repo_tags: vec![tag.into()], ..Image::default() }
}

fn container(id: &str, image: &str, sandbox: &str) -> Container {
    Container {
        id: id.into(),
        pod_sandbox_id: sandbox.into(),
        name: format!("c-{id}"),
        image_ref: image.into(),
        state: ContainerState::Exited,
        ..Container::default()
    }
}

fn cfg() -> DetectorSettings {
    DetectorSettings {
        period: Duration::from_secs(300),
        sandbox_image: "registry.k8s.io/pause:3.10".into(),
        recent_window: Duration::from_secs(120),
        mailbox_capacity: DEFAULT_MAILBOX_CAPACITY,
    }
}

const BASE: u64 = 1_700_000_000;

fn clock() -> Clock {
    Clock::starting_at(SystemTime::UNIX_EPOCH + Duration::from_secs(BASE))
}

fn at(secs: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(BASE + secs)
}

#[actix::test]
async fn detects_at_start_and_every_period_with_kubelet_record_rules() {
    tokio::time::pause();
    let fake = FakeCri::new(
        vec![
            img("sha256:a", 10, "a:1"),
            img("sha256:b", 20, "b:1"),
            img("sha256:pause", 1, "registry.k8s.io/pause:3.10"),
        ],
        1_000,
    )
    .start();
    let sandbox = PodSandbox { id: "sb".into(), name: "web".into(), namespace: "prod".into(), ..PodSandbox::default() };
    fake.send(SetFakeContainers(vec![container("c1", "sha256:a", "sb")], vec![sandbox])).await.unwrap();
    let hints = InUseHints::default();
    let detector = DetectorActor::new(cfg(), FakeCri::detector_cri(&fake), None, hints.clone(), clock()).start();
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(fake.send(GetFakeCalls).await.unwrap().of(Rpc::ListImages), 1, "first detection at start");

    let d = detector.send(GetLastDetection).await.unwrap().expect("detected");
    assert_eq!(d.in_use.get("sha256:a"), Some(&vec!["prod/web/c-c1".to_string()]));
    assert_eq!(d.in_use.get("sha256:pause"), Some(&vec!["sandbox image".to_string()]));
    assert_eq!(d.sandbox_image_id.as_deref(), Some("sha256:pause"));
    let a = d.records.get(&RecordKey::id("sha256:a")).expect("record a");
    assert_eq!((a.first_detected, a.last_used), (at(0), Some(at(0))));
    let b = d.records.get(&RecordKey::id("sha256:b")).expect("record b");
    assert_eq!((b.first_detected, b.last_used, b.size), (at(0), None, 20));

    // Five minutes later: b vanished, c is new and ensured recently, a is no longer used.
    fake.send(SetFakeContainers(vec![], vec![])).await.unwrap();
    fake.send(SetFakeImages(vec![img("sha256:a", 10, "a:1"), img("sha256:c", 30, "c:1")])).await.unwrap();
    hints.ensured("sha256:c", at(250));
    let pulling = hints.pull_started("a:1");
    tokio::time::sleep(Duration::from_secs(300)).await;
    assert_eq!(fake.send(GetFakeCalls).await.unwrap().of(Rpc::ListImages), 2);
    let d = detector.send(GetLastDetection).await.unwrap().expect("detected");
    assert!(d.records.get(&RecordKey::id("sha256:b")).is_none(), "vanished image dropped");
    let a = d.records.get(&RecordKey::id("sha256:a")).expect("a");
    assert_eq!(a.first_detected, at(0), "first detected kept");
    let c = d.records.get(&RecordKey::id("sha256:c")).expect("c");
    assert_eq!(c.first_detected, d.at, "first detected at the detection that saw it");
    assert!(d.at > at(299) && d.at < at(301));
    assert_eq!(d.in_use.get("sha256:c"), Some(&vec!["ensured recently".to_string()]));
    assert_eq!(d.in_use.get("sha256:a"), Some(&vec!["pull in flight".to_string()]), "a re-pull of a:1 is running");
    drop(pulling);
}

#[actix::test]
async fn records_survive_a_restart_through_the_store() {
    tokio::time::pause();
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeCri::new(vec![img("sha256:a", 10, "a:1")], 1_000).start();
    {
        let store = Arc::new(Store::open(dir.path()).unwrap());
        let d = DetectorActor::new(
            cfg(),
            FakeCri::detector_cri(&fake),
            Some(store.clone()),
            InUseHints::default(),
            clock(),
        )
        .start();
        d.send(DetectImages).await.unwrap().expect("detect");
        // Let the background write finish (bounded).
        for _ in 0..100 {
            if !store.image_records().unwrap().is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(store.image_records().unwrap().len(), 1);
        d.send(crate::actors::Stop).await.unwrap();
    }
    // A new detector, an hour later, on the same state directory.
    let mut opened = None;
    for _ in 0..100 {
        if let Ok(s) = Store::open(dir.path()) {
            opened = Some(Arc::new(s));
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let store = opened.expect("the first detector released the store");
    let later = Clock::starting_at(at(3_600));
    let d = DetectorActor::new(cfg(), FakeCri::detector_cri(&fake), Some(store), InUseHints::default(), later).start();
    let det = d.send(DetectImages).await.unwrap().expect("detect");
    let a = det.records.get(&RecordKey::id("sha256:a")).expect("a");
    assert_eq!(a.first_detected, at(0), "first detected survives the restart");
}
