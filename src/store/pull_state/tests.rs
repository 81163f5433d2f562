//! Tests of the KEP-2535 tables: one transaction per write, reopen, and
//! records that do not decode.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::*;
use crate::domain::pull_record::ImagePullCredentials;

fn time(secs: u64, nanos: u32) -> SystemTime {
    UNIX_EPOCH + Duration::new(secs, nanos)
}

fn pulled(image_ref: &str) -> PulledRecord {
    PulledRecord {
        last_updated_time: time(1_700_000_000, 5),
        image_ref: image_ref.into(),
        credential_mapping: [("example.com/app".to_string(), ImagePullCredentials::node_accessible())].into(),
    }
}

#[test]
fn pull_records_and_intents_round_trip_in_one_transaction_and_survive_reopen() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = Store::open(dir.path()).unwrap();
        assert_eq!(store.pull_records_state().unwrap(), PullRecordsState::default());
        store
            .apply_pull_records(&PullRecordsWrite {
                upsert_records: vec![pulled("sha256:a"), pulled("sha256:b")],
                put_intents: vec!["example.com/app:1".into(), "example.com/app:2".into()],
                ..Default::default()
            })
            .unwrap();
        store
            .apply_pull_records(&PullRecordsWrite {
                delete_records: vec!["sha256:b".into(), "sha256:absent".into()],
                delete_intents: vec!["example.com/app:1".into()],
                ..Default::default()
            })
            .unwrap();
        // The GC records are untouched by these tables.
        assert!(store.image_records().unwrap().is_empty());
    }
    let store = Store::open(dir.path()).unwrap();
    let state = store.pull_records_state().unwrap();
    assert_eq!(state.records, [pulled("sha256:a")]);
    assert_eq!(state.intents, ["example.com/app:2"]);
    assert!(state.unreadable.is_empty());
}

#[test]
fn a_pulled_record_that_does_not_decode_is_reported_unreadable_not_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    store
        .apply_pull_records(&PullRecordsWrite { upsert_records: vec![pulled("sha256:a")], ..Default::default() })
        .unwrap();
    let misplaced = serde_json::to_vec(&pulled("sha256:elsewhere")).unwrap();
    {
        let txn = store.db.begin_write().unwrap();
        {
            let mut table = txn.open_table(PULLED_RECORDS).unwrap();
            table.insert("sha256:garbage", &[0xff, b'{'][..]).unwrap();
            table.insert("sha256:misplaced", misplaced.as_slice()).unwrap();
        }
        txn.commit().unwrap();
    }
    let state = store.pull_records_state().unwrap();
    assert_eq!(state.records, [pulled("sha256:a")]);
    assert_eq!(state.unreadable, ["sha256:garbage", "sha256:misplaced"]);
}

#[test]
fn an_unsynced_write_is_read_at_once_and_on_disk_only_after_a_sync_or_a_synced_write() {
    let write = |image_ref: &str| PullRecordsWrite {
        upsert_records: vec![pulled(image_ref)],
        delete_intents: vec![format!("example.com/app@{image_ref}")],
        ..Default::default()
    };
    let intents = |refs: &[&str]| refs.iter().map(|r| format!("example.com/app@{r}")).collect::<Vec<_>>();
    let dir = tempfile::tempdir().unwrap();
    {
        let store = Store::open(dir.path()).unwrap();
        let put =
            PullRecordsWrite { put_intents: intents(&["sha256:a", "sha256:b", "sha256:c"]), ..Default::default() };
        store.apply_pull_records(&put).unwrap();
        store.apply_pull_records_unsynced(&write("sha256:a")).unwrap();
        // Visible at once.
        assert_eq!(store.pull_records_state().unwrap().records, [pulled("sha256:a")]);
        // A synced write of anything puts it on disk; nothing left to sync.
        store.apply_pull_records(&PullRecordsWrite { delete_records: vec!["x".into()], ..Default::default() }).unwrap();
        store.apply_pull_records_unsynced(&write("sha256:b")).unwrap();
        assert!(store.sync().unwrap(), "an unsynced write to put on disk");
        assert!(!store.sync().unwrap(), "nothing since");
        // Left unsynced when the process is killed (the simulator's fence):
        // lost whole, its record and the end of its intent, and only it.
        store.apply_pull_records_unsynced(&write("sha256:c")).unwrap();
        store.fence_as_killed();
        assert!(store.sync().is_err(), "a fenced store writes nothing");
    }
    let store = Store::open(dir.path()).unwrap();
    let state = store.pull_records_state().unwrap();
    assert_eq!(state.records, [pulled("sha256:a"), pulled("sha256:b")]);
    assert_eq!(state.intents, intents(&["sha256:c"]));
}

#[test]
fn a_store_closed_with_unsynced_writes_keeps_them_and_a_fence_undoes_each_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let older = PulledRecord { last_updated_time: time(1_600_000_000, 0), ..pulled("sha256:a") };
    {
        let store = Store::open(dir.path()).unwrap();
        store
            .apply_pull_records(&PullRecordsWrite { upsert_records: vec![older.clone()], ..Default::default() })
            .unwrap();
        store
            .apply_pull_records_unsynced(&PullRecordsWrite {
                upsert_records: vec![pulled("sha256:b")],
                ..Default::default()
            })
            .unwrap();
    }
    // A graceful close (redb puts pending commits on disk).
    let store = Store::open(dir.path()).unwrap();
    assert_eq!(store.pull_records_state().unwrap().records, [older.clone(), pulled("sha256:b")]);
    // Two unsynced writes of the same keys, then a kill: back to before both.
    let w1 = PullRecordsWrite {
        upsert_records: vec![pulled("sha256:a")],
        delete_records: vec!["sha256:b".into()],
        put_intents: vec!["example.com/app:1".into()],
        ..Default::default()
    };
    let w2 = PullRecordsWrite {
        upsert_records: vec![PulledRecord { last_updated_time: time(1_800_000_000, 0), ..pulled("sha256:a") }],
        delete_intents: vec!["example.com/app:1".into()],
        ..Default::default()
    };
    store.apply_pull_records_unsynced(&w1).unwrap();
    store.apply_pull_records_unsynced(&w2).unwrap();
    store.fence_as_killed();
    drop(store);
    let state = Store::open(dir.path()).unwrap().pull_records_state().unwrap();
    assert_eq!(state.records, [older, pulled("sha256:b")]);
    assert!(state.intents.is_empty());
}
