#![allow(clippy::pedantic)] // test code: pedantic lints are for what ships
//! Tests of [`Store`]: round trips, transactions, restarts, crash safety
//! (a child process killed with SIGKILL), permissions, corrupt values,
//! locking and schema versions.

use super::*;

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redb::ReadableDatabase;

use crate::gc::record::{ImageRecord, RecordKey};

/// Selects the child-process modes of [`crash_writer_child`] (value:
/// `write` or `hold`).
const CHILD_MODE_ENV: &str = "IMAGED_STORE_TEST_CHILD";
/// The state directory the child opens.
const CHILD_DIR_ENV: &str = "IMAGED_STORE_TEST_DIR";
/// The first batch number the writer child commits.
const CHILD_FIRST_BATCH_ENV: &str = "IMAGED_STORE_TEST_FIRST_BATCH";
/// Records per batch written by the writer child.
const BATCH_RECORDS: usize = 50;
/// A batch deletes the records of the batch this many before it, so the
/// database after batch `m` holds exactly batches `m-1` and `m`.
const KEPT_BATCHES: u64 = 2;
/// Upper bound of batches a writer child commits before exiting by itself.
const MAX_CHILD_BATCHES: u64 = 20_000;
/// How long the parent waits for a line from a child.
const CHILD_LINE_TIMEOUT: Duration = Duration::from_secs(30);

fn time(secs: u64, nanos: u32) -> SystemTime {
    UNIX_EPOCH + Duration::new(secs, nanos)
}

fn record(id: &str, handler: &str, size: u64) -> ImageRecord {
    ImageRecord {
        key: RecordKey { id: id.to_owned(), runtime_handler: handler.to_owned() },
        first_detected: time(1_700_000_000, 123_456_789),
        last_used: Some(time(1_700_000_100, 987_654_321)),
        size,
        pinned: size.is_multiple_of(2),
        repo_tags: vec![format!("docker.io/library/{id}:latest"), format!("{id}:v1")],
        repo_digests: vec![format!("docker.io/library/{id}@sha256:{size:064x}")],
    }
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o7777
}

fn sorted(mut records: Vec<ImageRecord>) -> Vec<ImageRecord> {
    records.sort_by(|a, b| a.key.cmp(&b.key));
    records
}

#[test]
fn store_is_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Store>();
    assert_send_sync::<StoreError>();
}

#[test]
fn records_round_trip_with_every_field_and_subsecond_times() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    assert_eq!(store.path(), dir.path().join("imaged.redb"));
    assert!(store.image_records().unwrap().is_empty());

    let mut never_used = record("sha256:bbb", "", 2);
    never_used.last_used = None;
    never_used.repo_tags.clear();
    never_used.repo_digests.clear();
    let mut odd_times = record("sha256:aaa", "runc-alt", 1);
    odd_times.first_detected = time(0, 1);
    odd_times.last_used = Some(time(4_102_444_800, 999_999_999));
    let same_id_default_handler = record("sha256:aaa", "", 3);
    let written = vec![never_used, odd_times, same_id_default_handler];

    store.apply_image_records(&written, &[]).unwrap();
    let read = store.image_records().unwrap();
    assert_eq!(sorted(read), sorted(written));
}

#[test]
fn upserts_replace_and_deletes_remove_in_one_transaction() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let a = record("sha256:a", "", 1);
    let b = record("sha256:b", "", 2);
    let c = record("sha256:c", "", 3);
    store.apply_image_records(&[a.clone(), b.clone(), c.clone()], &[]).unwrap();

    let mut a2 = a.clone();
    a2.size = 100;
    a2.last_used = Some(time(1_800_000_000, 5));
    let d = record("sha256:d", "kata", 4);
    // Update a, add d, delete b and a key that never existed, in one call.
    store.apply_image_records(&[a2.clone(), d.clone()], &[b.key.clone(), RecordKey::id("sha256:none")]).unwrap();
    assert_eq!(sorted(store.image_records().unwrap()), sorted(vec![a2.clone(), c.clone(), d.clone()]));

    // A key both upserted and deleted ends up deleted.
    store.apply_image_records(std::slice::from_ref(&c), std::slice::from_ref(&c.key)).unwrap();
    assert_eq!(sorted(store.image_records().unwrap()), sorted(vec![a2.clone(), d.clone()]));

    // A failing write (a time before the epoch cannot be encoded) applies
    // nothing, not even the deletes.
    let mut bad = record("sha256:bad", "", 9);
    bad.first_detected = UNIX_EPOCH - Duration::from_secs(1);
    let err = store.apply_image_records(&[bad], &[a2.key.clone()]).unwrap_err();
    assert!(matches!(err, StoreError::Encode { .. }), "{err:?}");
    assert!(err.to_string().contains("sha256:bad"), "{err}");
    assert_eq!(sorted(store.image_records().unwrap()), sorted(vec![a2.clone(), d.clone()]));

    store.replace_image_records(std::slice::from_ref(&b)).unwrap();
    assert_eq!(store.image_records().unwrap(), vec![b]);
    store.replace_image_records(&[]).unwrap();
    assert!(store.image_records().unwrap().is_empty());
}

#[test]
fn records_persist_across_reopen_after_drop() {
    let dir = tempfile::tempdir().unwrap();
    let written = vec![record("sha256:a", "", 1), record("sha256:b", "gvisor", 2)];
    {
        let store = Store::open(dir.path()).unwrap();
        store.apply_image_records(&written, &[]).unwrap();
    }
    let store = Store::open(dir.path()).unwrap();
    assert_eq!(sorted(store.image_records().unwrap()), sorted(written));
}

#[test]
fn open_creates_an_owner_only_directory_and_file() {
    let parent = tempfile::tempdir().unwrap();
    let dir = parent.path().join("var/lib/imaged");
    let store = Store::open(&dir).unwrap();
    assert_eq!(mode(&dir), 0o700);
    assert_eq!(mode(&parent.path().join("var")), 0o700);
    assert_eq!(mode(store.path()), 0o600);
}

#[test]
fn open_restricts_a_preexisting_world_readable_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(FILE_NAME);
    // An existing database, loosened to 0644.
    {
        let store = Store::open(dir.path()).unwrap();
        store.apply_image_records(&[record("sha256:a", "", 1)], &[]).unwrap();
    }
    std::fs::set_permissions(&path, Permissions::from_mode(0o644)).unwrap();
    assert_eq!(mode(&path), 0o644);
    let store = Store::open(dir.path()).unwrap();
    assert_eq!(mode(&path), 0o600);
    assert_eq!(store.image_records().unwrap().len(), 1);
    drop(store);

    // An empty file someone created as 0644 becomes a 0600 database.
    let other = tempfile::tempdir().unwrap();
    let empty = other.path().join(FILE_NAME);
    std::fs::write(&empty, b"").unwrap();
    std::fs::set_permissions(&empty, Permissions::from_mode(0o644)).unwrap();
    let store = Store::open(other.path()).unwrap();
    assert_eq!(mode(&empty), 0o600);
    assert!(store.image_records().unwrap().is_empty());
}

#[test]
fn corrupt_record_is_skipped_counted_and_the_others_load() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let good = vec![record("sha256:a", "", 1), record("sha256:c", "", 3)];
    store.apply_image_records(&good, &[]).unwrap();

    // Garbage under one key, and a valid record stored under the wrong key.
    let misplaced = serde_json::to_vec(&record("sha256:elsewhere", "", 7)).unwrap();
    {
        let txn = store.db.begin_write().unwrap();
        {
            let mut table = txn.open_table(IMAGE_RECORDS).unwrap();
            table.insert("sha256:b\0", &[0xff, 0x00, b'{', 0x13][..]).unwrap();
            table.insert("sha256:d\0", misplaced.as_slice()).unwrap();
        }
        txn.commit().unwrap();
    }

    let (records, skipped) = store.image_records_with_skipped().unwrap();
    assert_eq!(skipped, 2);
    assert_eq!(sorted(records), sorted(good.clone()));
    assert_eq!(sorted(store.image_records().unwrap()), sorted(good.clone()));

    // An upsert of the corrupt key repairs it.
    let b = record("sha256:b", "", 2);
    store.apply_image_records(&[b], &[]).unwrap();
    let (records, skipped) = store.image_records_with_skipped().unwrap();
    assert_eq!(skipped, 1);
    assert_eq!(records.len(), 3);
}

#[test]
fn second_open_in_the_same_process_fails_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let first = Store::open(dir.path()).unwrap();
    let err = Store::open(dir.path()).unwrap_err();
    assert!(matches!(err, StoreError::AlreadyOpen { .. }), "{err:?}");
    let message = err.to_string();
    assert!(message.contains(&first.path().display().to_string()), "{message}");
    assert!(message.contains("already open"), "{message}");
    // The first store is unaffected, and the lock goes with it.
    first.apply_image_records(&[record("sha256:a", "", 1)], &[]).unwrap();
    drop(first);
    assert_eq!(Store::open(dir.path()).unwrap().image_records().unwrap().len(), 1);
}

#[test]
fn open_while_another_process_holds_the_database_fails_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let (mut child, lines) = spawn_child("hold", dir.path(), 0);
    // The test harness prints lines of its own first, and the first line of
    // the child follows its `test … ... ` prefix.
    let line = loop {
        match lines.recv_timeout(CHILD_LINE_TIMEOUT) {
            Ok(line) if line.ends_with("open") => break Ok(line),
            Ok(_) => continue,
            Err(e) => break Err(e),
        }
    };
    if line.is_err() {
        let _ = child.kill();
        let _ = child.wait();
        panic!("holder child did not open the database: {line:?}");
    }
    let result = Store::open(dir.path());
    child.kill().unwrap();
    child.wait().unwrap();
    let err = result.unwrap_err();
    assert!(matches!(err, StoreError::AlreadyOpen { .. }), "{err:?}");
    // Killed with the lock held: the lock goes with the process.
    Store::open(dir.path()).unwrap();
}

#[test]
fn newer_schema_version_is_refused_and_left_untouched() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = Store::open(dir.path()).unwrap();
        store.apply_image_records(&[record("sha256:a", "", 1)], &[]).unwrap();
        let txn = store.db.begin_write().unwrap();
        txn.open_table(META).unwrap().insert(SCHEMA_VERSION_KEY, SCHEMA_VERSION + 1).unwrap();
        txn.commit().unwrap();
    }
    let err = Store::open(dir.path()).unwrap_err();
    match &err {
        StoreError::UnsupportedSchema { found, supported, .. } => {
            assert_eq!((*found, *supported), (SCHEMA_VERSION + 1, SCHEMA_VERSION));
        }
        other => panic!("expected UnsupportedSchema, got {other:?}"),
    }
    let message = err.to_string();
    assert!(message.contains("schema version 2"), "{message}");
    assert!(message.contains(FILE_NAME), "{message}");

    // The version was not overwritten by the refused open.
    let db = Database::open(dir.path().join(FILE_NAME)).unwrap();
    let txn = db.begin_read().unwrap();
    let version = txn.open_table(META).unwrap().get(SCHEMA_VERSION_KEY).unwrap().unwrap().value();
    assert_eq!(version, SCHEMA_VERSION + 1);
}

#[test]
fn schema_version_is_recorded_on_create() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let txn = store.db.begin_read().unwrap();
    let version = txn.open_table(META).unwrap().get(SCHEMA_VERSION_KEY).unwrap().unwrap().value();
    assert_eq!(version, SCHEMA_VERSION);
}

#[test]
fn a_state_directory_others_can_write_is_refused_naming_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    std::fs::create_dir(&state).unwrap();
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o777)).unwrap();
    let err = Store::open(&state).unwrap_err();
    assert!(matches!(err, StoreError::DirWritableByOthers { mode: 0o777, .. }), "{err:?}");
    let text = err.to_string();
    assert!(text.contains("0777") && text.contains(&format!("chmod 0700 {}", state.display())), "{text}");
    assert!(!state.join(FILE_NAME).exists(), "nothing created");
    // Group-writable too; readable by others is fine.
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o770)).unwrap();
    assert!(matches!(Store::open(&state), Err(StoreError::DirWritableByOthers { .. })));
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o755)).unwrap();
    Store::open(&state).unwrap();
}

#[test]
fn open_fails_clearly_when_the_directory_cannot_be_created() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("not-a-dir");
    std::fs::write(&file, b"x").unwrap();
    let err = Store::open(&file.join("state")).unwrap_err();
    assert!(matches!(err, StoreError::CreateDir { .. }), "{err:?}");
    assert!(err.to_string().contains("not-a-dir"), "{err}");
}

// === damaged files ===

/// redb's file header: magic number, then its flag bytes (byte 9, the
/// "god byte", holds the repair-needed flag redb sets on open).
const REDB_HEADER_FLAGS_END: usize = 16;

/// Log lines written while `f` runs on this thread.
fn with_logs<R>(f: impl FnOnce() -> R) -> (R, String) {
    let buf = crate::testing::LogLines::default();
    let writer = buf.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::WARN)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let result = tracing::subscriber::with_default(subscriber, f);
    let log = buf.text();
    (result, log)
}

/// A store in `dir` holding `n` image records and a pulled record and an
/// intent; returns the file's bytes.
fn good_store(dir: &Path, n: usize) -> Vec<u8> {
    let store = Store::open(dir).unwrap();
    let records: Vec<_> = (0..n).map(|i| record(&format!("img-{i:05}"), "", 1000 + i as u64)).collect();
    store.apply_image_records(&records, &[]).unwrap();
    store
        .apply_pull_records(&PullRecordsWrite {
            put_intents: vec!["docker.io/library/a:1".into()],
            ..Default::default()
        })
        .unwrap();
    drop(store);
    std::fs::read(dir.join(FILE_NAME)).unwrap()
}

/// Opens `dir` whose database holds `damaged` and checks the recovery: the
/// open succeeds, the bytes moved aside intact under a
/// `imaged.redb.damaged-<time>` name the error log names, and the new
/// store is empty, usable and survives a reopen.
fn assert_recovers(dir: &Path, damaged: &[u8]) {
    std::fs::write(dir.join(FILE_NAME), damaged).unwrap();
    let (store, log) = with_logs(|| Store::open(dir));
    let store = store.unwrap();
    let recovery = store.recovery().cloned().expect("the damaged database was replaced");
    let name = recovery.moved_to.file_name().unwrap().to_str().unwrap().to_owned();
    assert!(name.starts_with("imaged.redb.damaged-") && name.ends_with('Z'), "{name}");
    assert_eq!(recovery.moved_to.parent(), Some(dir));
    let kept = std::fs::read(&recovery.moved_to).unwrap();
    let diff: Vec<usize> = kept.iter().zip(damaged).enumerate().filter(|(_, (a, b))| a != b).map(|(i, _)| i).collect();
    // redb sets its "needs repair" flag in the file header when it opens a
    // file for writing; every other byte is the operator's.
    assert!(
        kept.len() == damaged.len() && diff.iter().all(|&i| i < REDB_HEADER_FLAGS_END),
        "the damaged bytes are kept: len {} vs {}, {} differ, first {:?} last {:?}",
        kept.len(),
        damaged.len(),
        diff.len(),
        diff.first(),
        diff.last()
    );
    assert!(log.contains("ERROR") && log.contains(&recovery.moved_to.display().to_string()), "{log}");
    assert!(log.contains("image records") && log.contains("pulled records") && log.contains("AlwaysVerify"), "{log}");
    assert!(store.image_records().unwrap().is_empty());
    assert_eq!(store.pull_records_state().unwrap(), PullRecordsState::default());
    store.apply_image_records(&[record("fresh", "", 2)], &[]).unwrap();
    drop(store);
    let reopened = Store::open(dir).unwrap();
    assert!(reopened.recovery().is_none());
    assert_eq!(reopened.image_records().unwrap(), vec![record("fresh", "", 2)]);
}

#[test]
fn a_junk_file_is_moved_aside_and_an_empty_store_opens() {
    let dir = tempfile::tempdir().unwrap();
    assert_recovers(dir.path(), &vec![0x5a; 8192]);
}

#[test]
fn a_truncated_file_is_moved_aside_and_an_empty_store_opens() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = good_store(dir.path(), 2000);
    assert!(bytes.len() > 64 * 1024, "{}", bytes.len());
    assert_recovers(dir.path(), &bytes[..bytes.len() / 3]);
}

#[test]
fn a_file_with_corrupted_pages_is_moved_aside_and_an_empty_store_opens() {
    let dir = tempfile::tempdir().unwrap();
    let mut bytes = good_store(dir.path(), 2000);
    // Every byte of the middle eighth of the file flipped: record pages,
    // well past redb's header.
    let (from, to) = (bytes.len() * 7 / 16, bytes.len() * 9 / 16);
    for b in &mut bytes[from..to] {
        *b = !*b;
    }
    assert_recovers(dir.path(), &bytes);
}

#[test]
fn a_clean_store_is_not_moved_aside() {
    let dir = tempfile::tempdir().unwrap();
    good_store(dir.path(), 10);
    let store = Store::open(dir.path()).unwrap();
    assert!(store.recovery().is_none());
    assert_eq!(store.image_records().unwrap().len(), 10);
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1, "nothing moved aside");
}

#[test]
fn environment_errors_are_not_damage() {
    let io = |kind| StoreError::Open {
        path: PathBuf::from("x"),
        source: Box::new(DatabaseError::Storage(redb::StorageError::Io(std::io::Error::from(kind)))),
    };
    assert!(!io(std::io::ErrorKind::PermissionDenied).is_damage());
    assert!(!io(std::io::ErrorKind::StorageFull).is_damage());
    assert!(io(std::io::ErrorKind::InvalidData).is_damage());
    assert!(!StoreError::AlreadyOpen { path: PathBuf::from("x") }.is_damage());
    assert!(!StoreError::UnsupportedSchema { path: PathBuf::from("x"), found: 9, supported: 1 }.is_damage());
}

// === crash safety ===

/// Key of record `i` of batch `batch` (sorts by batch).
fn batch_key(batch: u64, i: usize) -> RecordKey {
    RecordKey { id: format!("sha256:{batch:010}-{i:03}"), runtime_handler: String::new() }
}

fn batch_record(batch: u64, i: usize) -> ImageRecord {
    ImageRecord {
        key: batch_key(batch, i),
        first_detected: time(1_700_000_000 + batch, i as u32),
        last_used: Some(time(1_700_000_000 + batch, 999_999_999 - i as u32)),
        size: batch * 1_000 + i as u64,
        pinned: i.is_multiple_of(3),
        repo_tags: vec![format!("registry.example/batch-{batch}:{i}")],
        repo_digests: vec![format!("registry.example/batch-{batch}@sha256:{i:064x}")],
    }
}

/// The transaction of batch `batch`: its records, and deletes of batch
/// `batch - KEPT_BATCHES`.
fn batch_transaction(batch: u64) -> (Vec<ImageRecord>, Vec<RecordKey>) {
    let upserts = (0..BATCH_RECORDS).map(|i| batch_record(batch, i)).collect();
    let deletes = match batch.checked_sub(KEPT_BATCHES) {
        Some(old) => (0..BATCH_RECORDS).map(|i| batch_key(old, i)).collect(),
        None => Vec::new(),
    };
    (upserts, deletes)
}

/// The batch a record belongs to, from its key.
fn batch_of(record: &ImageRecord) -> u64 {
    record.key.id["sha256:".len().."sha256:".len() + 10].parse().unwrap()
}

/// Runs the test binary itself as a child in `mode` (see
/// [`crash_writer_child`]); returns it and a channel of its stdout lines.
fn spawn_child(mode: &str, dir: &Path, first_batch: u64) -> (Child, mpsc::Receiver<String>) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "store::tests::crash_writer_child", "--nocapture", "--test-threads=1"])
        .env(CHILD_MODE_ENV, mode)
        .env(CHILD_DIR_ENV, dir)
        .env(CHILD_FIRST_BATCH_ENV, first_batch.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    (child, rx)
}

/// Not a test on its own: the body of the child processes of the crash and
/// lock tests, selected by [`CHILD_MODE_ENV`]; returns at once otherwise.
/// `write`: commits batches from [`CHILD_FIRST_BATCH_ENV`] on, printing
/// `committed <n>` after each commit, until killed. `hold`: opens the store,
/// prints `open` and waits to be killed.
#[test]
fn crash_writer_child() {
    let Ok(mode) = std::env::var(CHILD_MODE_ENV) else { return };
    let dir = PathBuf::from(std::env::var(CHILD_DIR_ENV).unwrap());
    let store = Store::open(&dir).unwrap();
    match mode.as_str() {
        "write" => {
            let first: u64 = std::env::var(CHILD_FIRST_BATCH_ENV).unwrap().parse().unwrap();
            for batch in first..first + MAX_CHILD_BATCHES {
                let (upserts, deletes) = batch_transaction(batch);
                store.apply_image_records(&upserts, &deletes).unwrap();
                // stdout is line-buffered: each line reaches the pipe at once.
                println!("committed {batch}");
            }
        }
        "hold" => {
            println!("open");
            std::thread::sleep(CHILD_LINE_TIMEOUT);
        }
        other => panic!("unknown child mode {other:?}"),
    }
}

/// Checks that the database holds exactly the state after some batch `m >=
/// at_least` (every record of batches `m-1` and `m`, byte for byte, and
/// nothing else), and returns `m`.
fn check_complete_batches(dir: &Path, at_least: u64) -> u64 {
    let store = Store::open(dir).unwrap();
    let (records, skipped) = store.image_records_with_skipped().unwrap();
    assert_eq!(skipped, 0);
    let mut batches = std::collections::BTreeMap::<u64, Vec<ImageRecord>>::new();
    for record in records {
        batches.entry(batch_of(&record)).or_default().push(record);
    }
    let last = *batches.keys().next_back().expect("no batch survived");
    assert!(last >= at_least, "batch {at_least} was reported committed but the last batch is {last}");
    let expected: Vec<u64> = (last.saturating_sub(KEPT_BATCHES - 1)..=last).collect();
    assert_eq!(batches.keys().copied().collect::<Vec<_>>(), expected, "partial or missing batch");
    for (batch, records) in batches {
        let want: Vec<ImageRecord> = (0..BATCH_RECORDS).map(|i| batch_record(batch, i)).collect();
        assert_eq!(sorted(records), want, "batch {batch} is partial or altered");
    }
    last
}

#[test]
fn sigkill_mid_write_leaves_each_transaction_all_or_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut next_batch = 0;
    // Several rounds on the same database, each killed at a different point.
    for (round, kill_delay_us) in [0_u64, 500, 1_000, 2_000, 3_500, 5_000, 8_000].into_iter().enumerate() {
        let extra_commits = 3;
        let (mut child, lines) = spawn_child("write", dir.path(), next_batch);
        let target = next_batch + extra_commits;
        let mut last_reported = None;
        let outcome = loop {
            match lines.recv_timeout(CHILD_LINE_TIMEOUT) {
                Ok(line) => {
                    // The first one follows the harness's `test … ... `.
                    if let Some((_, n)) = line.split_once("committed ") {
                        let n: u64 = n.parse().unwrap();
                        last_reported = Some(n);
                        if n >= target {
                            break Ok(());
                        }
                    }
                }
                Err(e) => break Err(e),
            }
        };
        // Vary the kill point within the next transaction(s).
        std::thread::sleep(Duration::from_micros(kill_delay_us));
        child.kill().unwrap();
        let status = child.wait().unwrap();
        assert!(outcome.is_ok(), "round {round}: child stopped reporting ({outcome:?}, {status})");
        assert_eq!(std::os::unix::process::ExitStatusExt::signal(&status), Some(9), "{status}");
        let reported = last_reported.unwrap();
        let last = check_complete_batches(dir.path(), reported);
        eprintln!("round {round}: last reported commit {reported}, database holds batch {last}");
        next_batch = last + 1;
    }
}

#[test]
fn touching_records_sets_last_used_and_names_those_the_store_lacks() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let a = record("sha256:a", "", 1);
    let b = record("sha256:b", "kata", 2);
    store.apply_image_records(&[a.clone(), b.clone()], &[]).unwrap();
    let at = time(1_800_000_100, 7);
    let c = record("sha256:c", "", 3);
    let missing = store
        .apply_image_records_touching(
            std::slice::from_ref(&c),
            &[b.key.clone(), RecordKey::id("sha256:gone")],
            at,
            std::slice::from_ref(&a.key),
        )
        .unwrap();
    assert_eq!(missing, vec![RecordKey::id("sha256:gone")], "no record to touch: the caller writes it whole");
    let mut b2 = b.clone();
    b2.last_used = Some(at);
    assert_eq!(sorted(store.image_records().unwrap()), sorted(vec![b2, c]), "b touched, c added, a deleted");
}

#[test]
fn the_gc_loops_first_start_is_kept_once_and_read_back_after_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let t0 = UNIX_EPOCH + Duration::from_millis(1_700_000_000_123);
    {
        let store = Store::open(dir.path()).unwrap();
        assert_eq!(store.gc_began_once(t0).unwrap(), t0, "nothing kept: now is kept");
        assert_eq!(store.gc_began_once(t0 + Duration::from_secs(60)).unwrap(), t0, "the kept one, not now");
    }
    let store = Store::open(dir.path()).unwrap();
    assert_eq!(store.gc_began_once(t0 + Duration::from_secs(3_600)).unwrap(), t0, "after a reopen too");
    let other = tempfile::tempdir().unwrap();
    let fresh = Store::open(other.path()).unwrap();
    fresh.fence();
    assert!(fresh.gc_began_once(t0).is_err(), "a fenced store writes nothing, and says so");
}
