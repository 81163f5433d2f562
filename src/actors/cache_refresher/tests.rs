use std::time::Duration;

use actix::prelude::*;

use super::*;
use crate::cri::Rpc;
use crate::domain::Image;
use crate::testing::{FailNext, FakeCri, GetFakeCalls, SetFakeImages};

fn img(id: &str, size: u64) -> Image {
    Image { id: id.into(), size, repo_tags: vec![format!("example.com/{id}:1")], ..Image::default() }
}

fn cfg(max_images: Option<usize>) -> CacheRefresherSettings {
    CacheRefresherSettings { period: Duration::from_secs(30), max_images, mailbox_capacity: DEFAULT_MAILBOX_CAPACITY }
}

#[actix::test]
async fn refreshes_at_start_and_every_period_and_readers_see_snapshots() {
    tokio::time::pause();
    let fake = FakeCri::new(vec![img("a", 10), img("b", 30)], 1_000).start();
    let (actor, reader) = CacheRefresherActor::new(fake.clone().recipient(), cfg(Some(1)));
    let _refresher = actor.start();
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(fake.send(GetFakeCalls).await.unwrap().of(Rpc::ListImages), 1, "first refresh at start");
    let snap = reader.snapshot();
    assert_eq!(snap.images().iter().map(|i| i.id.as_str()).collect::<Vec<_>>(), ["b", "a"]);
    assert_eq!(reader.node_status().len(), 1, "node_status_max_images");

    fake.send(SetFakeImages(vec![img("c", 5)])).await.unwrap();
    tokio::time::sleep(Duration::from_secs(29)).await;
    assert_eq!(reader.snapshot().len(), 2, "not refreshed before the period");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(fake.send(GetFakeCalls).await.unwrap().of(Rpc::ListImages), 2);
    assert_eq!(reader.snapshot().images()[0].id, "c");
    // The old snapshot a reader holds is unchanged.
    assert_eq!(snap.len(), 2);
}

#[actix::test]
async fn a_failed_refresh_keeps_the_previous_list() {
    tokio::time::pause();
    let fake = FakeCri::new(vec![img("a", 10)], 1_000).start();
    let (actor, reader) = CacheRefresherActor::new(fake.clone().recipient(), cfg(None));
    let refresher = actor.start();
    tokio::time::sleep(Duration::from_millis(1)).await;
    fake.send(FailNext(
        Rpc::ListImages,
        crate::cri::CriError::new(crate::cri::CriErrorKind::RuntimeUnavailable, "down"),
    ))
    .await
    .unwrap();
    let e = refresher.send(RefreshImageList).await.unwrap().expect_err("runtime down");
    assert_eq!(e.kind(), crate::cri::CriErrorKind::RuntimeUnavailable);
    assert_eq!(reader.snapshot().len(), 1);
    assert_eq!(refresher.send(RefreshImageList).await.unwrap(), Ok(1));
}
