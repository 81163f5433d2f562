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
//!   transaction either fully applied or not at all.
//! - The file is readable and writable only by its owner (0600), and a state
//!   directory that [`Store::open`] creates is 0700.
//! - One process at a time: redb locks the file, so a second open (from this
//!   process or another) fails with [`StoreError::AlreadyOpen`].
//! - A record that no longer decodes is skipped with a warning, never fatal.
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
//! All methods block on disk I/O (including an `fsync` per write); call them
//! from `tokio::task::spawn_blocking` in async code.
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

use redb::backends::FileBackend;
use redb::{Database, DatabaseError, Durability, ReadableTable, TableDefinition};

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
    /// missing; an existing directory is left as it is. The database file is
    /// made readable and writable only by its owner (0600), also when it
    /// already existed with wider permissions. A database left by a crash is
    /// repaired (logged as a warning). Fails with
    /// [`StoreError::AlreadyOpen`] when another process, or another `Store`
    /// in this one, has it open, and with [`StoreError::UnsupportedSchema`]
    /// when a newer imaged wrote it.
    pub fn open(dir: &Path) -> Result<Self, StoreError> {
        DirBuilder::new()
            .recursive(true)
            .mode(DIR_MODE)
            .create(dir)
            .map_err(|source| StoreError::CreateDir { path: dir.to_path_buf(), source })?;
        let path = dir.join(FILE_NAME);
        let file = open_owner_only(&path)?;

        let backend = FileBackend::new(file)
            .map_err(|source| StoreError::Open { path: path.clone(), source: Box::new(source) })?;
        let repair_path = path.clone();
        let warned = Cell::new(false);
        let db = Database::builder()
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
            .map_err(|source| match source {
                DatabaseError::DatabaseAlreadyOpen => StoreError::AlreadyOpen { path: path.clone() },
                source => StoreError::Open { path: path.clone(), source: Box::new(source) },
            })?;

        let store = Self { db, path };
        store.init_schema()?;
        tracing::debug!(db = %store.path.display(), "store opened");
        Ok(store)
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
        let mut txn = self.db.begin_write().map_err(|e| self.tx_error(op, e))?;
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
