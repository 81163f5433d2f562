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
