//! The embedded database holding all of imaged's durable state: one
//! [redb](https://docs.rs/redb) file, `<state dir>/imaged.redb`, opened once
//! per process as a [`Store`] and shared (`Arc<Store>`).
//!
//! It holds the GC image records ([`ImageRecord`]), so that first detected
//! and last used times survive restarts, and the KEP-2535 pull intents and
//! pulled records ([`crate::pull_records`]), so that a restart never lets a
//! pod without credentials use a private image another pod pulled.
//!
//! # Guarantees
//!
//! - Every write is one redb write transaction committed with
//!   [`redb::Durability::Immediate`]: when a write method returns `Ok`, the
//!   change is on disk; a crash (even `SIGKILL` or power loss) leaves each
//!   transaction either fully applied or not at all. The one exception,
//!   [`Store::apply_pull_records_unsynced`], is named so: its change is
//!   visible at once and on disk after the next synced write or
//!   [`Store::sync`]; a crash before loses it, and every unsynced write
//!   after the last synced one (never one alone, never part of one: what
//!   is on disk is always every write up to some point, in order).
//! - The file is readable and writable only by its owner (0600), and a state
//!   directory that [`Store::open`] creates is 0700.
//! - One process at a time: redb locks the file, so a second open (from this
//!   process or another) fails with [`StoreError::AlreadyOpen`].
//! - A record that no longer decodes is skipped with a warning, never fatal.
//! - A damaged file (not a redb database, truncated, corrupted pages) never
//!   fails [`Store::open`]: it is moved aside as
//!   `imaged.redb.damaged-<UTC time>` and an empty database opened
//!   ([`Store::recovery`]).
//!
//! # Schema
//!
//! | table | key | value |
//! |---|---|---|
//! | `meta` | `&str` (`"schema_version"`) | `u64` ([`SCHEMA_VERSION`]) |
//! | `image_records_v1` | `"<id>\0<runtime_handler>"` | [`ImageRecord`] as JSON |
//! | `pull_intents_v1` | image (normalised reference) | `u64`: Unix seconds when recorded |
//! | `pulled_records_v1` | image ref (image id) | [`PulledRecord`] as JSON |
//!
//! Adding a table does not change [`SCHEMA_VERSION`] (new tables get new
//! names; an older imaged ignores them). Changing how an existing table is
//! encoded does, and an imaged refuses to open a database whose schema
//! version it does not know ([`StoreError::UnsupportedSchema`]), so a
//! downgrade never misreads newer data.
//!
//! All methods block on disk I/O (including an `fsync` per synced write);
//! call them from `tokio::task::spawn_blocking` in async code.
//!
//! Here: opening, permissions and the schema. `image_records.rs`: the GC
//! image records table; `pull_state.rs`: the KEP-2535 tables; `error.rs`:
//! [`StoreError`].
//!
//! [`ImageRecord`]: crate::gc::record::ImageRecord
//! [`PulledRecord`]: crate::domain::pull_record::PulledRecord

use std::cell::Cell;
use std::fs::{DirBuilder, File, OpenOptions, Permissions};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redb::backends::FileBackend;
use redb::{Database, DatabaseError, Durability, ReadableDatabase, ReadableTable, TableDefinition};

mod error;
mod image_records;
mod pull_state;

pub use error::StoreError;
pub use pull_state::{PullRecordsState, PullRecordsWrite};

#[cfg(test)]
mod tests;

/// Name of the database file inside the state directory.
pub const FILE_NAME: &str = "imaged.redb";

/// The schema version this build writes and understands.
pub const SCHEMA_VERSION: u64 = 1;

/// `meta`: small named values about the database itself.
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");

/// Key of the schema version in [`META`].
const SCHEMA_VERSION_KEY: &str = "schema_version";

/// Key in [`META`] of when the GC loop first began on this database (Unix
/// milliseconds): the kubelet's `beganGC`, kept across restarts
/// ([`Store::gc_began_once`]).
const GC_BEGAN_KEY: &str = "gc_began_unix_ms";

/// `image_records_v1`: `"<id>\0<runtime_handler>"` → [`ImageRecord`](crate::gc::record::ImageRecord) as JSON.
const IMAGE_RECORDS: TableDefinition<&str, &[u8]> = TableDefinition::new("image_records_v1");

/// `pull_intents_v1`: image → Unix seconds when the intent was recorded.
const PULL_INTENTS: TableDefinition<&str, u64> = TableDefinition::new("pull_intents_v1");

/// `pulled_records_v1`: image ref → [`PulledRecord`](crate::domain::pull_record::PulledRecord) as JSON.
const PULLED_RECORDS: TableDefinition<&str, &[u8]> = TableDefinition::new("pulled_records_v1");

/// Upper bound of redb's page cache. redb's default (1 GiB) is far more than
/// a node agent should hold; the records of 100 000 images fit in a few tens
/// of MiB, and a miss only costs a read from the page cache of the kernel.
const CACHE_SIZE_BYTES: usize = 32 * 1024 * 1024;

/// Owner-only permissions of the database file.
const FILE_MODE: u32 = 0o600;

/// Permissions of a state directory created by [`Store::open`].
const DIR_MODE: u32 = 0o700;

/// imaged's durable state: one redb database. `Send + Sync`; share it as
/// `Arc<Store>`. Closed (and its lock released) when dropped.
pub struct Store {
    /// The database; redb serialises write transactions internally.
    db: Database,
    /// `<dir>/imaged.redb`, for error messages and logs.
    path: PathBuf,
    /// Set when `open` replaced a damaged database.
    recovery: Option<Recovery>,
    /// Set by [`Store::fence`]: every write fails from then on.
    fenced: std::sync::atomic::AtomicBool,
    /// How to undo the unsynced writes ([`Store::apply_pull_records_unsynced`])
    /// made since the last synced one, oldest first: [`Store::sync`] has
    /// work to do while it is not empty, and [`Store::fence_as_killed`]
    /// undoes them.
    /// Changed only while holding redb's write lock (inside a write
    /// transaction), so it orders with the commits.
    unsynced: std::sync::Mutex<Vec<Undo>>,
    /// Where durable writes' durations go ([`Store::set_metrics`]).
    metrics: std::sync::OnceLock<crate::metrics::Metrics>,
    /// Tests: the next pull-records write commits, then reports a failure,
    /// as a commit whose second fsync fails after the data reached the disk.
    #[cfg(test)]
    pub(crate) fail_after_next_commit: std::sync::atomic::AtomicBool,
    /// Tests: the next pull-records write fails before it writes anything.
    #[cfg(test)]
    pub(crate) refuse_next_write: std::sync::atomic::AtomicBool,
}

/// The value a key of the KEP-2535 tables had before an unsynced write
/// (`None`: absent).
#[derive(Debug, Clone)]
enum Undo {
    Record(String, Option<Vec<u8>>),
    Intent(String, Option<u64>),
}

/// What [`Store::open`] did with a damaged database.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recovery {
    /// Where the damaged file was moved: `<dir>/imaged.redb.damaged-<UTC time>`.
    pub moved_to: PathBuf,
    /// Why it was judged damaged (the error, with its causes).
    pub reason: String,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("path", &self.path).finish_non_exhaustive()
    }
}

// === impl Store ===

impl Store {
    /// Opens (creating if needed) `<dir>/imaged.redb`.
    ///
    /// The directory (and any missing parent) is created with mode 0700 if
    /// missing; an existing one that its group or others can write is
    /// refused ([`StoreError::DirWritableByOthers`], naming the fix). The database file is
    /// made readable and writable only by its owner (0600), also when it
    /// already existed with wider permissions. A database left by a crash is
    /// repaired (logged as a warning).
    ///
    /// Every open checks the whole file (redb's integrity check over every
    /// page checksum, then a read of every entry of every table). A file
    /// that is damaged ([`StoreError::is_damage`]: not a redb file,
    /// truncated, corrupted pages) is moved aside to
    /// `imaged.redb.damaged-<UTC time>` in the same directory, an error is
    /// logged naming it and what was lost, and an empty database is opened
    /// in its place ([`Store::recovery`] says so). Fails, changing nothing,
    /// with [`StoreError::AlreadyOpen`] when another process, or another
    /// `Store` in this one, has it open, with
    /// [`StoreError::UnsupportedSchema`] when a newer imaged wrote it, and
    /// with the I/O error for what moving aside cannot fix (permissions,
    /// a failing disk).
    pub fn open(dir: &Path) -> Result<Self, StoreError> {
        DirBuilder::new()
            .recursive(true)
            .mode(DIR_MODE)
            .create(dir)
            .map_err(|source| StoreError::CreateDir { path: dir.to_path_buf(), source })?;
        check_dir_mode(dir)?;
        let path = dir.join(FILE_NAME);
        let damage = match open_checked(&path) {
            Ok(store) => return Ok(store),
            Err(e) if e.is_damage() => e,
            Err(e) => return Err(e),
        };
        let moved_to = move_aside(&path)?;
        let reason = error_chain(&damage);
        tracing::error!(
            db = %path.display(),
            moved_to = %moved_to.display(),
            %reason,
            "the state database is damaged; it was moved aside and imaged starts with an empty one. \
             Lost: the GC image records (first-detected and last-used times: every image's age \
             restarts now) and the KEP-2535 pull intents and pulled records (images present now \
             count as never pulled by imaged, i.e. preloaded: under credential_verification.policy \
             NeverVerifyPreloadedImages or NeverVerifyAllowlistedImages pods no longer need \
             credentials for them; only AlwaysVerify re-verifies them; remove private images from the \
             runtime to force pulls). The damaged file is kept for inspection at moved_to; to go \
             back to it, stop imaged and move it over the database file"
        );
        let mut store = open_checked(&path)?;
        store.recovery = Some(Recovery { moved_to, reason });
        Ok(store)
    }

    /// When [`Store::open`] found the database damaged and started an empty
    /// one: where the damaged file went and why.
    pub fn recovery(&self) -> Option<&Recovery> {
        self.recovery.as_ref()
    }

    /// The database file, `<dir>/imaged.redb`.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Creates the tables of a new database and records its schema version,
    /// or checks the version of an existing one (changing nothing when it is
    /// unsupported).
    fn init_schema(&self) -> Result<(), StoreError> {
        let op = "initialising the schema";
        let mut txn = self.begin_write(op)?;
        txn.set_durability(Durability::Immediate).map_err(|e| self.tx_error(op, e))?;
        {
            let mut meta = txn.open_table(META).map_err(|e| self.tx_error(op, e))?;
            let found = meta.get(SCHEMA_VERSION_KEY).map_err(|e| self.tx_error(op, e))?.map(|v| v.value());
            match found {
                Some(SCHEMA_VERSION) => {}
                None => {
                    meta.insert(SCHEMA_VERSION_KEY, SCHEMA_VERSION).map_err(|e| self.tx_error(op, e))?;
                }
                // Dropping the transaction aborts it: nothing is written.
                Some(found) => {
                    return Err(StoreError::UnsupportedSchema {
                        path: self.path.clone(),
                        found,
                        supported: SCHEMA_VERSION,
                    });
                }
            }
            txn.open_table(IMAGE_RECORDS).map_err(|e| self.tx_error(op, e))?;
            txn.open_table(PULL_INTENTS).map_err(|e| self.tx_error(op, e))?;
            txn.open_table(PULLED_RECORDS).map_err(|e| self.tx_error(op, e))?;
        }
        txn.commit().map_err(|e| self.tx_error(op, e))
    }

    /// Reads every key and value of every table (bytes only, nothing
    /// decoded), so that a page redb cannot read fails the open rather than
    /// a later read.
    fn read_every_entry(&self) -> Result<(), StoreError> {
        let op = "reading every entry";
        let txn = self.db.begin_read().map_err(|e| self.tx_error(op, e))?;
        let meta = txn.open_table(META).map_err(|e| self.tx_error(op, e))?;
        for entry in meta.iter().map_err(|e| self.tx_error(op, e))? {
            let (key, value) = entry.map_err(|e| self.tx_error(op, e))?;
            let _ = (key.value(), value.value());
        }
        for def in [IMAGE_RECORDS, PULLED_RECORDS] {
            let table = txn.open_table(def).map_err(|e| self.tx_error(op, e))?;
            for entry in table.iter().map_err(|e| self.tx_error(op, e))? {
                let (key, value) = entry.map_err(|e| self.tx_error(op, e))?;
                let _ = (key.value(), value.value());
            }
        }
        let intents = txn.open_table(PULL_INTENTS).map_err(|e| self.tx_error(op, e))?;
        for entry in intents.iter().map_err(|e| self.tx_error(op, e))? {
            let (key, value) = entry.map_err(|e| self.tx_error(op, e))?;
            let _ = (key.value(), value.value());
        }
        Ok(())
    }

    /// When the GC loop first began on this database: the time kept by
    /// the first call (on any start), else `now`, kept from then on (one
    /// durable write). Before the Unix epoch counts as the epoch.
    pub fn gc_began_once(&self, now: SystemTime) -> Result<SystemTime, StoreError> {
        let op = "recording when GC began";
        let ms = |t: SystemTime| {
            t.duration_since(UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        };
        let at = |ms: u64| UNIX_EPOCH + Duration::from_millis(ms);
        {
            let txn = self.db.begin_read().map_err(|e| self.tx_error(op, e))?;
            let meta = txn.open_table(META).map_err(|e| self.tx_error(op, e))?;
            if let Some(kept) = meta.get(GC_BEGAN_KEY).map_err(|e| self.tx_error(op, e))? {
                return Ok(at(kept.value()));
            }
        }
        let mut txn = self.begin_write(op)?;
        txn.set_durability(Durability::Immediate).map_err(|e| self.tx_error(op, e))?;
        let began = {
            let mut meta = txn.open_table(META).map_err(|e| self.tx_error(op, e))?;
            // Another handle may have written it since the read.
            let kept = meta.get(GC_BEGAN_KEY).map_err(|e| self.tx_error(op, e))?.map(|v| v.value());
            match kept {
                Some(kept) => kept,
                None => {
                    meta.insert(GC_BEGAN_KEY, ms(now)).map_err(|e| self.tx_error(op, e))?;
                    ms(now)
                }
            }
        };
        let carried = self.synced_from_here();
        txn.commit().map_err(|e| self.tx_error(op, e)).inspect_err(|_| self.not_synced(carried))?;
        Ok(at(began))
    }

    /// Refuses every write from now on ([`StoreError::Fenced`]); reads go
    /// on. The simulator's end of a process: a dead process writes nothing
    /// more, but the tasks it left on a shared tokio runtime (an intent
    /// guard dropped with its pull, a prefetch's end) still run and would.
    pub fn fence(&self) {
        self.fenced.store(true, std::sync::atomic::Ordering::Release);
    }

    /// [`Store::fence`], then undoes the unsynced writes since the last
    /// synced one (one synced write): the simulator's `kill -9`, which loses
    /// them, where redb would put them on disk when the dead process's store
    /// closes in the simulator's process.
    pub fn fence_as_killed(&self) {
        self.fence();
        if let Err(e) = self.undo_unsynced() {
            tracing::warn!(db = %self.path.display(), error = %e, "could not undo the unsynced writes of a killed store");
        }
    }

    fn undo_unsynced(&self) -> Result<(), StoreError> {
        let op = "undoing unsynced writes";
        let txn = self.db.begin_write().map_err(|e| self.tx_error(op, e))?;
        let undo = self.journal().clone();
        if undo.is_empty() {
            return Ok(());
        }
        {
            let mut records = txn.open_table(PULLED_RECORDS).map_err(|e| self.tx_error(op, e))?;
            let mut intents = txn.open_table(PULL_INTENTS).map_err(|e| self.tx_error(op, e))?;
            for u in undo.into_iter().rev() {
                let r = match u {
                    Undo::Record(key, Some(was)) => records.insert(key.as_str(), was.as_slice()).map(drop),
                    Undo::Record(key, None) => records.remove(key.as_str()).map(drop),
                    Undo::Intent(key, Some(was)) => intents.insert(key.as_str(), was).map(drop),
                    Undo::Intent(key, None) => intents.remove(key.as_str()).map(drop),
                };
                r.map_err(|e| self.tx_error(op, e))?;
            }
        }
        txn.commit().map_err(|e| self.tx_error(op, e))?;
        self.journal().clear();
        Ok(())
    }

    fn journal(&self) -> std::sync::MutexGuard<'_, Vec<Undo>> {
        self.unsynced.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A synced write is about to commit (under redb's write lock): the
    /// unsynced writes before it will be on disk with it. Returns them,
    /// for [`Store::not_synced`] should the commit fail.
    fn synced_from_here(&self) -> Vec<Undo> {
        std::mem::take(&mut *self.journal())
    }

    /// A synced commit failed: the unsynced writes before it are not on disk.
    fn not_synced(&self, carried: Vec<Undo>) {
        let mut journal = self.journal();
        let later = std::mem::replace(&mut *journal, carried);
        journal.extend(later);
    }

    /// Counts the durations of durable writes of the pull records and the
    /// image records in `metrics` (`imaged_store_write_duration_seconds`)
    /// from now on; the first handle given stays.
    pub fn set_metrics(&self, metrics: &crate::metrics::Metrics) {
        let _ = self.metrics.set(metrics.clone());
    }

    /// Commits `txn`, a durable write begun at `began` (of the pull records'
    /// tables, or the image records'), and counts how long it took.
    fn commit_timed(
        &self,
        op: &'static str,
        txn: redb::WriteTransaction,
        began: std::time::Instant,
        pull_records: bool,
    ) -> Result<(), StoreError> {
        let carried = self.synced_from_here();
        let r = txn.commit().map_err(|e| self.tx_error(op, e));
        if r.is_err() {
            self.not_synced(carried);
        }
        if let Some(m) = self.metrics.get() {
            m.store_written(pull_records, began.elapsed());
        }
        r
    }

    /// A write transaction, unless the store is fenced.
    fn begin_write(&self, op: &'static str) -> Result<redb::WriteTransaction, StoreError> {
        if self.fenced.load(std::sync::atomic::Ordering::Acquire) {
            return Err(StoreError::Fenced { path: self.path.clone() });
        }
        self.db.begin_write().map_err(|e| self.tx_error(op, e))
    }

    /// Wraps a redb error with this database's path and the step that failed.
    fn tx_error(&self, op: &'static str, source: impl Into<redb::Error>) -> StoreError {
        StoreError::Transaction { path: self.path.clone(), op, source: Box::new(source.into()) }
    }
}

/// Opens (creating if needed) the database file with owner-only
/// permissions, fixing the mode of a file that already existed with wider
/// (or narrower) ones.
fn open_owner_only(path: &Path) -> Result<File, StoreError> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(FILE_MODE)
        .open(path)
        .map_err(|source| StoreError::OpenFile { path: path.to_path_buf(), source })?;
    let mode = file
        .metadata()
        .map_err(|source| StoreError::Permissions { path: path.to_path_buf(), source })?
        .permissions()
        .mode();
    if mode & 0o7777 != FILE_MODE {
        file.set_permissions(Permissions::from_mode(FILE_MODE))
            .map_err(|source| StoreError::Permissions { path: path.to_path_buf(), source })?;
        tracing::info!(
            db = %path.display(),
            old_mode = format_args!("{:o}", mode & 0o7777),
            "restricted database file to owner-only access (0600)"
        );
    }
    Ok(file)
}

/// Refuses a state directory that group or others can write: whoever can
/// write it can replace the database (and with it the KEP-2535 records
/// that decide which pods may use private images).
fn check_dir_mode(dir: &Path) -> Result<(), StoreError> {
    let mode = std::fs::metadata(dir)
        .map_err(|source| StoreError::CreateDir { path: dir.to_path_buf(), source })?
        .permissions()
        .mode()
        & 0o7777;
    if mode & 0o022 != 0 {
        return Err(StoreError::DirWritableByOthers { path: dir.to_path_buf(), mode });
    }
    Ok(())
}

/// Opens the database at `path` and checks all of it: redb's integrity
/// check (every page checksum; a file left by a crash is rolled back to its
/// last commit), the schema, and a read of every entry of every table.
///
/// redb reports a damaged file as an error (its internal "cannot happen"
/// checks return `Corrupted` in builds without debug assertions, which is
/// why `Cargo.toml` turns them off for redb in every profile). Should redb
/// still panic, the panic is caught here and returned as
/// [`StoreError::Panicked`] — but only in a build that unwinds: the release
/// profile aborts on panic, and the daemon's panic hook aborts in every
/// build, so there the checks above are what keeps a damaged file from
/// ending the process.
fn open_checked(path: &Path) -> Result<Store, StoreError> {
    let file = open_owner_only(path)?;
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| open_database(file, path))) {
        Ok(result) => result,
        Err(payload) => {
            let message = payload
                .downcast_ref::<&str>()
                .map(|s| (*s).to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "no message".to_string());
            Err(StoreError::Panicked { path: path.to_path_buf(), message })
        }
    }
}

/// [`open_checked`] without the panic guard.
fn open_database(file: File, path: &Path) -> Result<Store, StoreError> {
    let open_error = |source| match source {
        DatabaseError::DatabaseAlreadyOpen => StoreError::AlreadyOpen { path: path.to_path_buf() },
        source => StoreError::Open { path: path.to_path_buf(), source: Box::new(source) },
    };
    let backend = FileBackend::new(file)
        .map_err(|source| StoreError::Open { path: path.to_path_buf(), source: Box::new(source) })?;
    let repair_path = path.to_path_buf();
    let warned = Cell::new(false);
    let mut db = Database::builder()
        .set_cache_size(CACHE_SIZE_BYTES)
        .set_repair_callback(move |_session| {
            if !warned.replace(true) {
                tracing::warn!(
                    db = %repair_path.display(),
                    "database was not closed cleanly; repairing it"
                );
            }
        })
        .create_with_backend(backend)
        .map_err(open_error)?;
    if !db.check_integrity().map_err(open_error)? {
        tracing::warn!(
            db = %path.display(),
            "database failed its integrity check and was repaired (back to its last intact commit)"
        );
    }
    let store = Store {
        db,
        path: path.to_path_buf(),
        recovery: None,
        fenced: std::sync::atomic::AtomicBool::new(false),
        unsynced: std::sync::Mutex::default(),
        metrics: std::sync::OnceLock::new(),
        #[cfg(test)]
        fail_after_next_commit: std::sync::atomic::AtomicBool::new(false),
        #[cfg(test)]
        refuse_next_write: std::sync::atomic::AtomicBool::new(false),
    };
    store.init_schema()?;
    store.read_every_entry()?;
    tracing::debug!(db = %store.path.display(), "store opened");
    Ok(store)
}

/// Moves a damaged database file aside, next to where it was, as
/// `imaged.redb.damaged-<UTC time>` (`.1`, `.2`, … appended when that
/// name is taken), keeping its bytes for the operator.
fn move_aside(path: &Path) -> Result<PathBuf, StoreError> {
    let stamp: String = humantime::format_rfc3339_seconds(std::time::SystemTime::now())
        .to_string()
        .chars()
        .filter(|c| *c != '-' && *c != ':')
        .collect();
    let base = format!("{FILE_NAME}.damaged-{stamp}");
    let mut to = path.with_file_name(&base);
    // Bounded: a hundred recoveries within one second is not a real case.
    for n in 1..=MAX_ASIDE_SUFFIX {
        if std::fs::symlink_metadata(&to).is_err() {
            break;
        }
        to = path.with_file_name(format!("{base}.{n}"));
    }
    if std::fs::symlink_metadata(&to).is_ok() {
        return Err(StoreError::MoveAside {
            from: path.to_path_buf(),
            to,
            source: std::io::Error::new(std::io::ErrorKind::AlreadyExists, "every candidate name is taken"),
        });
    }
    std::fs::rename(path, &to).map_err(|source| StoreError::MoveAside {
        from: path.to_path_buf(),
        to: to.clone(),
        source,
    })?;
    // Make the rename durable; the move itself already happened, so a
    // failure here only weakens a crash right now.
    if let Some(dir) = path.parent()
        && let Err(e) = File::open(dir).and_then(|d| d.sync_all())
    {
        tracing::warn!(dir = %dir.display(), error = %e, "cannot sync the state directory after moving the database aside");
    }
    Ok(to)
}

/// Largest `.N` suffix [`move_aside`] tries.
const MAX_ASIDE_SUFFIX: u32 = 100;

/// An error and its sources, `: `-joined.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}
