//! Recovery of intents left by a crash and pruning after GC, through the
//! store.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::super::{PodCredentials, VerifyPolicy};
use super::*;
use crate::domain::pull_record::ImagePullSecret;

const IMAGE: &str = "example.com/private:1";
const REF: &str = "sha256:aaaa";

fn t(secs: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(secs)
}

fn secret(ns: &str, name: &str, uid: &str, hash: &str) -> ImagePullSecret {
    ImagePullSecret { uid: uid.into(), namespace: ns.into(), name: name.into(), credential_hash: hash.into() }
}

fn store(dir: &std::path::Path) -> Arc<crate::store::Store> {
    Arc::new(crate::store::Store::open(dir).unwrap())
}

fn pod(secrets: Vec<ImagePullSecret>) -> impl FnOnce() -> Result<PodCredentials, std::convert::Infallible> {
    move || Ok(PodCredentials { secrets, service_account: None })
}

#[tokio::test]
async fn recovery_turns_matched_intents_into_records_without_credentials() {
    let dir = tempfile::tempdir().unwrap();
    {
        let r = PullRecords::open(VerifyPolicy::default(), Some(store(dir.path()))).unwrap();
        r.record_pull_intent(IMAGE).await.unwrap();
        r.record_pull_intent("example.com/gone:1").await.unwrap();
        // "Crash": neither pull is ever recorded.
    }
    let r = PullRecords::open(VerifyPolicy::default(), Some(store(dir.path()))).unwrap();
    assert_eq!(r.stored_intents(), ["example.com/gone:1", "example.com/private:1"]);
    let images = [crate::domain::Image {
        id: REF.into(),
        repo_tags: vec!["example.com/private:1".into()],
        ..Default::default()
    }];
    assert_eq!(r.recover_intents(&images).await.unwrap(), 1);
    assert_eq!(r.stored_intents(), ["example.com/gone:1"], "an intent for an absent image stays");
    let rec = r.record(REF).expect("record without credentials");
    let hollow: Vec<_> = rec.credential_mapping.iter().map(|(repo, c)| (repo.as_str(), c.is_empty())).collect();
    assert_eq!(hollow, [("example.com/private", true)], "a hollow entry under the intent's repository");
    // A pod without credentials must pull it; so must one with a secret.
    assert!(r.must_attempt_pull(IMAGE, REF, pod(vec![])).await.unwrap());
    assert!(r.must_attempt_pull(IMAGE, REF, pod(vec![secret("ns", "a", "u1", "h1")])).await.unwrap());
    // The gone image still counts as pulled by imaged.
    assert!(r.must_attempt_pull("example.com/gone:1", "sha256:other", pod(vec![])).await.unwrap());
    drop(r);
    let r = PullRecords::open(VerifyPolicy::default(), Some(store(dir.path()))).unwrap();
    assert!(r.record(REF).is_some() && r.stored_intents() == ["example.com/gone:1"], "recovery is durable");
}

#[tokio::test]
async fn prune_deletes_old_records_of_absent_images_only() {
    let dir = tempfile::tempdir().unwrap();
    let r = PullRecords::open(VerifyPolicy::default(), Some(store(dir.path()))).unwrap();
    for (img, id) in [("example.com/a:1", "sha256:a"), ("example.com/b:1", "sha256:b")] {
        r.record_pull_intent(img).await.unwrap();
        r.record_image_pulled(img, id, &ImagePullCredentials::node_accessible()).await.unwrap();
    }
    let cutoff = r.clock().now() + Duration::from_secs(1);
    let present: HashSet<String> = ["sha256:a".to_string()].into();
    // Records newer than the GC start stay even when absent.
    assert_eq!(r.prune_unknown_records(present.clone(), t(0)).await.unwrap(), 0);
    assert_eq!(r.prune_unknown_records(present.clone(), cutoff).await.unwrap(), 1);
    assert!(r.record("sha256:a").is_some());
    assert!(r.record("sha256:b").is_none());
    drop(r);
    let r = PullRecords::open(VerifyPolicy::default(), Some(store(dir.path()))).unwrap();
    assert!(r.record("sha256:b").is_none(), "pruned on disk too");
}

#[tokio::test]
async fn a_deletion_whose_caller_stops_waiting_is_done_in_memory_as_on_disk() {
    let dir = tempfile::tempdir().unwrap();
    let st = store(dir.path());
    let r = PullRecords::open(VerifyPolicy::default(), Some(st.clone())).unwrap();
    for (img, id) in [("example.com/a:1", "sha256:a"), ("example.com/b:1", "sha256:b")] {
        r.record_pull_intent(img).await.unwrap();
        r.record_image_pulled(img, id, &ImagePullCredentials::node_accessible()).await.unwrap();
    }
    r.sync().await.unwrap();
    let later = r.clock().now() + Duration::from_secs(1);
    // GC's prune (of b) and the CRI front's forgetting of a removed image
    // (a), each dropped after its first poll, while its commit runs.
    let present: HashSet<String> = ["sha256:a".to_string()].into();
    assert!(futures_util::poll!(std::pin::pin!(r.prune_unknown_records(present, later))).is_pending());
    assert!(futures_util::poll!(std::pin::pin!(r.forget_removed_image("sha256:a", later))).is_pending());
    let on_disk = || st.pull_records_state().unwrap().records.len();
    for _ in 0..200 {
        if on_disk() == 0 && r.record("sha256:a").is_none() && r.record("sha256:b").is_none() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(on_disk(), 0, "both deletions landed");
    // Memory no longer grants what the disk forgot.
    assert!(r.record("sha256:b").is_none(), "the pruned record is gone from memory too");
    assert!(r.record("sha256:a").is_none(), "the forgotten record is gone from memory too");
}

#[tokio::test(start_paused = true)]
async fn every_pull_refreshes_the_record_time_so_a_gc_run_in_between_keeps_it() {
    let dir = tempfile::tempdir().unwrap();
    let r = PullRecords::open(VerifyPolicy::default(), Some(store(dir.path()))).unwrap();
    let clock = r.clock();
    let node = ImagePullCredentials::node_accessible();
    r.record_pull_intent(IMAGE).await.unwrap();
    r.record_image_pulled(IMAGE, REF, &node).await.unwrap();
    assert_eq!(r.record(REF).unwrap().last_updated_time, clock.now(), "stamped with the shared clock");
    tokio::time::advance(Duration::from_secs(3600)).await;
    // A GC run starts; its detection no longer sees the image (removed, the
    // record stayed). Then the same image is pulled again with the same
    // credentials: the merge changes nothing, but the time is refreshed.
    let gc_started = clock.now();
    tokio::time::advance(Duration::from_secs(1)).await;
    r.record_pull_intent(IMAGE).await.unwrap();
    r.record_image_pulled(IMAGE, REF, &node).await.unwrap();
    let pulled_again = gc_started + Duration::from_secs(1);
    assert_eq!(r.record(REF).unwrap().last_updated_time, pulled_again);
    // The prune after that run keeps the record.
    assert_eq!(r.prune_unknown_records(HashSet::new(), gc_started).await.unwrap(), 0);
    assert!(r.record(REF).is_some());
    drop(r);
    let r = PullRecords::open(VerifyPolicy::default(), Some(store(dir.path()))).unwrap();
    assert_eq!(r.record(REF).unwrap().last_updated_time, pulled_again, "the refreshed time is on disk");
}

/// Stores, under each of `refs`, a pulled record that does not decode.
fn store_unreadable(dir: &std::path::Path, refs: &[&str]) {
    let path = store(dir).path().to_path_buf();
    let db = redb::Database::open(&path).unwrap();
    let txn = db.begin_write().unwrap();
    {
        let table: redb::TableDefinition<&str, &[u8]> = redb::TableDefinition::new("pulled_records_v1");
        let mut table = txn.open_table(table).unwrap();
        for r in refs {
            table.insert(*r, &b"{not json"[..]).unwrap();
        }
    }
    txn.commit().unwrap();
}

#[tokio::test]
async fn prune_deletes_unreadable_records_of_absent_images() {
    let dir = tempfile::tempdir().unwrap();
    store_unreadable(dir.path(), &["sha256:gone", "sha256:kept"]);
    let r = PullRecords::open(VerifyPolicy::default(), Some(store(dir.path()))).unwrap();
    // Unreadable: the image counts as pulled by imaged, the check errs to a pull.
    assert!(r.must_attempt_pull("example.com/gone:1", "sha256:gone", pod(vec![])).await.unwrap());
    let present: HashSet<String> = ["sha256:kept".to_string()].into();
    assert_eq!(r.prune_unknown_records(present.clone(), t(0)).await.unwrap(), 1, "whatever `until` is");
    drop(r);
    let r = PullRecords::open(VerifyPolicy::default(), Some(store(dir.path()))).unwrap();
    let st = r.state();
    assert!(!st.unreadable.contains("sha256:gone"), "deleted on disk");
    assert!(st.unreadable.contains("sha256:kept"), "a present image's record stays");
}

/// The intents on disk of `st`, sorted.
fn on_disk(st: &crate::store::Store) -> Vec<String> {
    let mut v = st.pull_records_state().unwrap().intents;
    v.sort();
    v
}

/// Records over a store in a new directory, after one pull of `IMAGE`
/// (as `REF`, every pod's) that kept its intent.
async fn one_pull_kept() -> (tempfile::TempDir, Arc<crate::store::Store>, PullRecords) {
    let dir = tempfile::tempdir().unwrap();
    let st = store(dir.path());
    let r = PullRecords::open(VerifyPolicy::default(), Some(st.clone())).unwrap();
    r.record_pull_intent(IMAGE).await.unwrap();
    r.record_image_pulled(IMAGE, REF, &ImagePullCredentials::node_accessible()).await.unwrap();
    (dir, st, r)
}

#[tokio::test]
async fn a_kept_intent_spares_the_names_next_pull_a_write_grants_nothing_and_outlives_its_image_up_to_a_bound() {
    let (_dir, st, r) = one_pull_kept().await;
    let node = ImagePullCredentials::node_accessible();
    let kept = || vec![IMAGE.to_string()];
    assert!(r.stored_intents().is_empty(), "the pull ended");
    assert_eq!(r.kept_intents(), [IMAGE]);
    assert_eq!(on_disk(&st), [IMAGE], "its intent stays on disk");
    // In this process it counts for nothing: another image of the name
    // that imaged never pulled is preloaded (the default policy lets every
    // pod use it), as when the kubelet has deleted the intent.
    assert!(!r.must_attempt_pull(IMAGE, "sha256:other", pod(vec![])).await.unwrap());
    // A GC run that finds the image still there keeps everything; one that
    // finds it gone deletes its record and leaves the intent on disk, for
    // the name's next pull.
    let present: HashSet<String> = [REF.to_string()].into();
    let cutoff = r.clock().now() + Duration::from_secs(1);
    assert_eq!(r.prune_unknown_records(present, cutoff).await.unwrap(), 0);
    assert_eq!(on_disk(&st), [IMAGE]);
    assert_eq!(r.prune_unknown_records(HashSet::new(), cutoff).await.unwrap(), 1);
    assert!(r.record(REF).is_none(), "the record goes");
    assert_eq!((on_disk(&st), r.kept_intents()), (kept(), kept()), "the intent outlives its image");
    // Pulled again (its intent on disk); the kubelet's removal of the image
    // through the CRI front leaves the intent as well.
    r.record_pull_intent(IMAGE).await.unwrap();
    r.record_image_pulled(IMAGE, REF, &node).await.unwrap();
    assert!(r.forget_removed_image(REF, r.clock().now() + Duration::from_secs(1)).await.unwrap());
    assert_eq!((on_disk(&st), r.kept_intents()), (kept(), kept()), "outlives the removal through the front");
    // Past the bound, a removal deletes the intents of its image's names
    // with its record, and so does a GC run's prune.
    r.bound_kept_intents(0);
    r.record_pull_intent(IMAGE).await.unwrap();
    r.record_image_pulled(IMAGE, REF, &node).await.unwrap();
    assert!(r.forget_removed_image(REF, r.clock().now() + Duration::from_secs(1)).await.unwrap());
    assert_eq!((on_disk(&st), r.kept_intents()), (vec![], vec![]), "past the bound: deleted with the record");
    r.record_pull_intent(IMAGE).await.unwrap();
    assert_eq!(on_disk(&st), [IMAGE], "the name's next pull writes its intent again");
    r.record_image_pulled(IMAGE, REF, &node).await.unwrap();
    let cutoff = r.clock().now() + Duration::from_secs(1);
    assert_eq!(r.prune_unknown_records(HashSet::new(), cutoff).await.unwrap(), 1);
    assert_eq!((on_disk(&st), r.kept_intents()), (vec![], vec![]), "past the bound: pruned with the record");
    r.bound_kept_intents(crate::pull_records::KEPT_INTENTS);
    r.record_pull_intent(IMAGE).await.unwrap();
    r.record_image_pulled(IMAGE, REF, &node).await.unwrap();
    // With every write refused, the name's next pull still begins (its
    // intent is on disk): no write before it. Another name's cannot.
    st.fence();
    r.record_pull_intent(IMAGE).await.expect("no write needed");
    assert_eq!(r.stored_intents(), [IMAGE], "open again while the pull runs");
    assert!(r.kept_intents().is_empty());
    assert!(r.record_pull_intent("example.com/private:2").await.is_err(), "a name without an intent writes one");
}

#[tokio::test]
async fn a_kept_intent_opens_again_without_waiting_for_a_write_in_progress() {
    use futures_util::FutureExt as _;
    let (_dir, st, r) = one_pull_kept().await;
    // Another write holds the lock (a removal's commit, a new name's intent).
    let held = r.inner.writes.lock().await;
    // The kept name's next pull begins at once: its intent is on disk.
    let opened = r.record_pull_intent(IMAGE).now_or_never().expect("no wait for the write in progress");
    opened.unwrap();
    assert_eq!((r.stored_intents(), r.kept_intents()), (vec![IMAGE.to_string()], vec![]), "open while it runs");
    // A name without an intent on disk waits for its turn to write one.
    let other = "example.com/private:2";
    let mut write = std::pin::pin!(r.record_pull_intent(other));
    assert!((&mut write).now_or_never().is_none(), "a new name's intent waits for the lock");
    drop(held);
    write.await.unwrap();
    assert_eq!(on_disk(&st), [IMAGE, other]);
    // The reopened pull ends as any: its intent is kept again.
    r.record_image_pulled(IMAGE, REF, &ImagePullCredentials::node_accessible()).await.unwrap();
    assert_eq!(r.kept_intents(), [IMAGE]);
}

#[tokio::test]
async fn the_bound_counts_every_intent_on_disk_and_those_a_kill_left_and_past_it_a_removal_deletes_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let node = ImagePullCredentials::node_accessible();
    let (other, third, fourth) = ("example.com/private:2", "example.com/third:1", "example.com/fourth:1");
    let names = |v: &[&str]| v.iter().map(ToString::to_string).collect::<Vec<_>>();
    {
        let st = store(dir.path());
        let r = PullRecords::open(VerifyPolicy::default(), Some(st.clone())).unwrap();
        r.bound_kept_intents(2);
        for (image, id) in [(IMAGE, REF), (other, "sha256:bbbb")] {
            r.record_pull_intent(image).await.unwrap();
            r.record_image_pulled(image, id, &node).await.unwrap();
        }
        // At the bound, not past it: the removed image's intent stays.
        assert!(r.forget_removed_image(REF, r.clock().now() + Duration::from_secs(1)).await.unwrap());
        assert_eq!((on_disk(&st), r.kept_intents()), (names(&[IMAGE, other]), names(&[IMAGE, other])));
        // Past it: a removal deletes its own image's kept intents, and
        // leaves those of images removed before.
        r.record_pull_intent(third).await.unwrap();
        r.record_image_pulled(third, "sha256:cccc", &node).await.unwrap();
        assert!(r.forget_removed_image("sha256:cccc", r.clock().now() + Duration::from_secs(1)).await.unwrap());
        assert_eq!(on_disk(&st), names(&[IMAGE, other]));
        st.fence_as_killed();
    }
    // A kill leaves both on disk; IMAGE's image is gone, so its intent
    // stays open after recovery (until its name's next pull), and counts.
    let st = store(dir.path());
    let r = PullRecords::open(VerifyPolicy::default(), Some(st.clone())).unwrap();
    r.bound_kept_intents(2);
    let images =
        [crate::domain::Image { id: "sha256:bbbb".into(), repo_tags: vec![other.into()], ..Default::default() }];
    r.recover_intents(&images).await.unwrap();
    assert_eq!(r.stored_intents(), [IMAGE], "the gone image's name keeps its intent");
    r.record_pull_intent(other).await.unwrap();
    r.record_image_pulled(other, "sha256:bbbb", &node).await.unwrap();
    assert_eq!(r.kept_intents(), [other]);
    // One open and one kept: at the bound, a removal leaves the intent;
    // with a third on disk, past it, the next removal takes its own.
    assert!(r.forget_removed_image("sha256:bbbb", r.clock().now() + Duration::from_secs(1)).await.unwrap());
    assert_eq!(on_disk(&st), names(&[IMAGE, other]));
    r.record_pull_intent(fourth).await.unwrap();
    r.record_image_pulled(fourth, "sha256:dddd", &node).await.unwrap();
    assert!(r.forget_removed_image("sha256:dddd", r.clock().now() + Duration::from_secs(1)).await.unwrap());
    assert_eq!(on_disk(&st), names(&[IMAGE, other]), "the intent the kill left counts against the bound");
}

#[tokio::test]
async fn kept_intents_go_at_a_graceful_stop_and_after_a_kill_are_recovered_as_any() {
    let dir = tempfile::tempdir().unwrap();
    let a = secret("ns", "a", "u1", "h1");
    let other = "example.com/private:2";
    {
        let st = store(dir.path());
        let r = PullRecords::open(VerifyPolicy::default(), Some(st.clone())).unwrap();
        for image in [IMAGE, other] {
            r.record_pull_intent(image).await.unwrap();
        }
        r.record_image_pulled(IMAGE, REF, &ImagePullCredentials::secret(a.clone())).await.unwrap();
        r.record_image_pulled(other, "sha256:bbbb", &ImagePullCredentials::secret(a.clone())).await.unwrap();
        assert_eq!(on_disk(&st), [IMAGE, other]);
        r.sync().await.unwrap();
        assert_eq!(on_disk(&st), Vec::<String>::new(), "a graceful stop deletes them");
        // Both pulled again, then killed.
        for (image, id) in [(IMAGE, REF), (other, "sha256:bbbb")] {
            r.record_pull_intent(image).await.unwrap();
            r.record_image_pulled(image, id, &ImagePullCredentials::secret(a.clone())).await.unwrap();
        }
        st.fence_as_killed();
    }
    let r = PullRecords::open(VerifyPolicy::default(), Some(store(dir.path()))).unwrap();
    assert_eq!(r.stored_intents(), [IMAGE, other], "left by the kill, as intents of pulls in flight");
    assert!(r.has_stored_intents());
    // `other` now names an image brought outside imaged, with a preloaded
    // name of its own.
    let outside = "sha256:outside";
    let images = [
        crate::domain::Image { id: REF.into(), repo_tags: vec![IMAGE.into()], ..Default::default() },
        crate::domain::Image {
            id: outside.into(),
            repo_tags: vec![other.into(), "example.com/preloaded:1".into()],
            ..Default::default()
        },
    ];
    assert_eq!(r.recover_intents(&images).await.unwrap(), 2);
    assert!(r.stored_intents().is_empty());
    // The image the name resolved to keeps its record as it was: the pod
    // whose secret pulled it still uses it without pulling.
    assert!(!r.must_attempt_pull(IMAGE, REF, pod(vec![a])).await.unwrap());
    assert!(r.must_attempt_pull(IMAGE, REF, pod(vec![])).await.unwrap());
    // The outside image counts as pulled by imaged under the recovered
    // name (a hollow entry: pods pull it); its own name, which imaged
    // never pulled, stays preloaded (kubernetes/kubernetes#138175).
    let entries = r.record(outside).map(|rec| rec.credential_mapping.clone()).unwrap_or_default();
    assert_eq!(
        entries.into_iter().collect::<Vec<_>>(),
        [("example.com/private".to_string(), ImagePullCredentials::default())]
    );
    assert!(r.must_attempt_pull(other, outside, pod(vec![])).await.unwrap());
    assert!(!r.must_attempt_pull("example.com/preloaded:1", outside, pod(vec![])).await.unwrap());
}

#[tokio::test]
async fn only_the_last_pull_that_records_keeps_the_intent_and_a_failed_or_unknown_end_keeps_it_open() {
    let dir = tempfile::tempdir().unwrap();
    let st = store(dir.path());
    let r = PullRecords::open(VerifyPolicy::default(), Some(st.clone())).unwrap();
    let node = ImagePullCredentials::node_accessible();
    // Two pulls of the name: the first records (not the last), the second
    // fails (the last): the intent is deleted, none is kept.
    r.record_pull_intent(IMAGE).await.unwrap();
    r.record_pull_intent(IMAGE).await.unwrap();
    r.record_image_pulled(IMAGE, REF, &node).await.unwrap();
    assert_eq!((r.stored_intents(), r.kept_intents()), (vec![IMAGE.to_string()], vec![]), "one pull still runs");
    r.record_image_pull_failed(IMAGE).await;
    assert_eq!((on_disk(&st), r.kept_intents()), (vec![], vec![]));
    // A record written without its pull's intent keeps nothing; nor do
    // records kept in memory only.
    r.record_image_pulled("example.com/private:2", "sha256:bbbb", &node).await.unwrap();
    assert!(r.kept_intents().is_empty() && on_disk(&st).is_empty());
    let memory = PullRecords::in_memory(VerifyPolicy::default());
    memory.record_pull_intent(IMAGE).await.unwrap();
    memory.record_image_pulled(IMAGE, REF, &node).await.unwrap();
    assert!(memory.kept_intents().is_empty() && memory.stored_intents().is_empty());
    // Kept, reopened by the next pull, which ends unknown: it stays open,
    // and a graceful stop leaves it on disk (that pull may still run).
    r.record_pull_intent(IMAGE).await.unwrap();
    r.record_image_pulled(IMAGE, REF, &node).await.unwrap();
    assert_eq!(r.kept_intents(), [IMAGE]);
    r.record_pull_intent(IMAGE).await.unwrap();
    r.record_image_pull_unknown(IMAGE).await;
    r.sync().await.unwrap();
    assert_eq!(
        (on_disk(&st), r.stored_intents(), r.kept_intents()),
        (vec![IMAGE.to_string()], vec![IMAGE.to_string()], vec![])
    );
}

#[tokio::test]
async fn a_stop_dropped_while_it_deletes_the_kept_intents_leaves_the_next_pull_writing_its_own() {
    let (_dir, st, r) = one_pull_kept().await;
    // The stop's sync, dropped after its first poll (a shutdown cut short)
    // while its commit runs: the commit lands all the same.
    assert!(futures_util::poll!(std::pin::pin!(r.sync())).is_pending());
    for _ in 0..200 {
        if on_disk(&st).is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(on_disk(&st).is_empty(), "the deletion landed");
    // Memory did not keep the intent it deleted: the next pull writes one.
    r.record_pull_intent(IMAGE).await.unwrap();
    assert_eq!(on_disk(&st), [IMAGE], "no pull without its intent on disk");
}

#[tokio::test]
async fn a_recovered_name_must_pull_though_its_image_has_a_record_under_another_name() {
    // A mirror: the same image id, recorded under Y with a secret.
    const Y: &str = "mirror.example.com/private:1";
    let dir = tempfile::tempdir().unwrap();
    {
        let r = PullRecords::open(VerifyPolicy::default(), Some(store(dir.path()))).unwrap();
        r.record_pull_intent(Y).await.unwrap();
        r.record_image_pulled(Y, REF, &ImagePullCredentials::secret(secret("ns", "y", "u1", "h1"))).await.unwrap();
        r.record_pull_intent(IMAGE).await.unwrap();
        // "Crash": IMAGE's pull brought REF, its record was never written
        // (Y's kept intent is left too).
    }
    let r = PullRecords::open(VerifyPolicy::default(), Some(store(dir.path()))).unwrap();
    let images =
        [crate::domain::Image { id: REF.into(), repo_tags: vec![IMAGE.into(), Y.into()], ..Default::default() }];
    assert_eq!(r.recover_intents(&images).await.unwrap(), 2);
    assert!(
        r.must_attempt_pull(IMAGE, REF, pod(vec![])).await.unwrap(),
        "a pod without credentials must pull the recovered name, not take it for preloaded"
    );
    let ys = r.record(REF).unwrap().credential_mapping["mirror.example.com/private"].clone();
    assert_eq!(ys, ImagePullCredentials::secret(secret("ns", "y", "u1", "h1")), "Y's entry as it was");

    // With no record of the image before, a later pull of Y with a secret
    // must not hand the recovered name back its preloaded standing.
    let dir = tempfile::tempdir().unwrap();
    {
        let r = PullRecords::open(VerifyPolicy::default(), Some(store(dir.path()))).unwrap();
        r.record_pull_intent(IMAGE).await.unwrap();
    }
    let r = PullRecords::open(VerifyPolicy::default(), Some(store(dir.path()))).unwrap();
    assert_eq!(r.recover_intents(&images).await.unwrap(), 1);
    r.record_pull_intent(Y).await.unwrap();
    r.record_image_pulled(Y, REF, &ImagePullCredentials::secret(secret("ns", "y", "u1", "h1"))).await.unwrap();
    assert!(r.must_attempt_pull(IMAGE, REF, pod(vec![])).await.unwrap());
}
