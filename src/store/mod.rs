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

use std::cell::Cell;
use std::fs::{DirBuilder, File, OpenOptions, Permissions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use redb::backends::FileBackend;
use redb::{
    Database, DatabaseError, Durability, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition,
};

use crate::domain::pull_record::PulledRecord;
use crate::gc::record::{ImageRecord, RecordKey};

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

/// `image_records_v1`: [`encode_key`] → [`ImageRecord`] as JSON.
const IMAGE_RECORDS: TableDefinition<&str, &[u8]> = TableDefinition::new("image_records_v1");

/// `pull_intents_v1`: image → Unix seconds when the intent was recorded.
const PULL_INTENTS: TableDefinition<&str, u64> = TableDefinition::new("pull_intents_v1");

/// `pulled_records_v1`: image ref → [`PulledRecord`] as JSON.
const PULLED_RECORDS: TableDefinition<&str, &[u8]> = TableDefinition::new("pulled_records_v1");

/// Upper bound of redb's page cache. redb's default (1 GiB) is far more than
/// a node agent should hold; the records of 100 000 images fit in a few tens
/// of MiB, and a miss only costs a read from the page cache of the kernel.
const CACHE_SIZE_BYTES: usize = 32 * 1024 * 1024;

/// Owner-only permissions of the database file.
const FILE_MODE: u32 = 0o600;

/// Permissions of a state directory created by [`Store::open`].
const DIR_MODE: u32 = 0o700;

/// Why a [`Store`] operation failed. Every variant names the database (or
/// directory) path and the step that failed; the cause, if any, is the
/// [`std::error::Error::source`].
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The state directory could not be created.
    #[error("cannot create state directory {}", path.display())]
    CreateDir {
        /// The directory.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// The database file could not be opened or created.
    #[error("cannot open database file {}", path.display())]
    OpenFile {
        /// The database file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// The database file could not be restricted to its owner (mode 0600).
    #[error("cannot restrict database file {} to owner-only access (mode 0600)", path.display())]
    Permissions {
        /// The database file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// The database is already open, by another process or by another
    /// [`Store`] in this one: redb holds a lock on the file while it is open.
    #[error(
        "database {} is already open (by another imaged process, or another Store in this one); \
         only one may use a state directory at a time",
        path.display()
    )]
    AlreadyOpen {
        /// The database file.
        path: PathBuf,
    },
    /// redb could not open the database (corrupt file, unsupported file
    /// format, I/O error, failed repair).
    #[error("cannot open database {}", path.display())]
    Open {
        /// The database file.
        path: PathBuf,
        /// redb's error (boxed: it is large).
        #[source]
        source: Box<DatabaseError>,
    },
    /// The database was written with a schema version this build does not
    /// know (normally by a newer imaged); it is left untouched.
    #[error(
        "database {} has schema version {found}, but this imaged only supports version {supported}; \
         it was probably written by a newer imaged and is left untouched",
        path.display()
    )]
    UnsupportedSchema {
        /// The database file.
        path: PathBuf,
        /// The version found in the `meta` table.
        found: u64,
        /// The version this build supports ([`SCHEMA_VERSION`]).
        supported: u64,
    },
    /// A transaction on the open database failed; nothing of it was applied.
    #[error("{op} failed in database {}", path.display())]
    Transaction {
        /// The database file.
        path: PathBuf,
        /// What was being done, e.g. "committing image records".
        op: &'static str,
        /// redb's error (boxed: it is large).
        #[source]
        source: Box<redb::Error>,
    },
    /// A record could not be serialised (e.g. a time before the Unix epoch);
    /// nothing of the write was applied.
    #[error(
        "cannot encode the image record of {:?} (runtime handler {:?}) for database {}",
        key.id,
        key.runtime_handler,
        path.display()
    )]
    Encode {
        /// The database file.
        path: PathBuf,
        /// The record's key.
        key: RecordKey,
        /// The serialisation error.
        #[source]
        source: serde_json::Error,
    },
    /// The blocking task running a store write panicked or was cancelled.
    #[error("store write task failed: {0}")]
    Blocking(String),
    /// A pulled record could not be serialised; nothing of the write was applied.
    #[error("cannot encode the pulled record of image {image_ref:?} for database {}", path.display())]
    EncodePulled {
        /// The database file.
        path: PathBuf,
        /// The record's image ref.
        image_ref: String,
        /// The serialisation error.
        #[source]
        source: serde_json::Error,
    },
}

/// The KEP-2535 state read at start: pulled records, intents.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PullRecordsState {
    /// Records that decode.
    pub records: Vec<PulledRecord>,
    /// Image refs whose stored record does not decode (kept: the image
    /// counts as pulled by imaged, and pods must pull it to use it).
    pub unreadable: Vec<String>,
    /// Images with a pull intent (pulls that began and never ended).
    pub intents: Vec<String>,
}

/// One write transaction of KEP-2535 state (see [`Store::apply_pull_records`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PullRecordsWrite {
    /// Records to insert or replace (by image ref).
    pub upsert_records: Vec<PulledRecord>,
    /// Image refs whose records to delete.
    pub delete_records: Vec<String>,
    /// Images whose intents to record.
    pub put_intents: Vec<String>,
    /// Images whose intents to delete.
    pub delete_intents: Vec<String>,
}

impl PullRecordsWrite {
    /// Nothing to write.
    pub fn is_empty(&self) -> bool {
        self.upsert_records.is_empty()
            && self.delete_records.is_empty()
            && self.put_intents.is_empty()
            && self.delete_intents.is_empty()
    }
}

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

    /// All GC image records, in key order. Records that do not decode are
    /// skipped (see [`Store::image_records_with_skipped`]).
    pub fn image_records(&self) -> Result<Vec<ImageRecord>, StoreError> {
        self.image_records_with_skipped().map(|(records, _)| records)
    }

    /// All GC image records that decode, in key order, and how many did not.
    ///
    /// A record that does not decode (corruption, an unknown older format, a
    /// value whose key does not match the key it is stored under) is skipped
    /// with a `warn` log naming its key; it stays in the database until an
    /// upsert or delete of that key, or [`Store::replace_image_records`],
    /// replaces it. Failing to read the table at all is an error.
    pub fn image_records_with_skipped(&self) -> Result<(Vec<ImageRecord>, usize), StoreError> {
        let op = "reading image records";
        let txn = self.db.begin_read().map_err(|e| self.tx_error(op, e))?;
        let table = txn.open_table(IMAGE_RECORDS).map_err(|e| self.tx_error(op, e))?;
        let len = table.len().map_err(|e| self.tx_error(op, e))?;
        let mut records = Vec::with_capacity(usize::try_from(len).unwrap_or(0));
        let mut skipped = 0;
        for entry in table.iter().map_err(|e| self.tx_error(op, e))? {
            let (key, value) = entry.map_err(|e| self.tx_error(op, e))?;
            let key = key.value();
            match decode_record(key, value.value()) {
                Ok(record) => records.push(record),
                Err(reason) => {
                    skipped += 1;
                    tracing::warn!(
                        db = %self.path.display(),
                        key = %key.escape_debug(),
                        %reason,
                        "skipping image record that does not decode"
                    );
                }
            }
        }
        Ok((records, skipped))
    }

    /// Applies `upserts` (insert or replace, by key) and then `deletes` (a
    /// missing key is not an error) in one write transaction: when this
    /// returns `Ok` all of it is durable, and a crash applies all or none of
    /// it. A key both upserted and deleted ends up deleted.
    pub fn apply_image_records(&self, upserts: &[ImageRecord], deletes: &[RecordKey]) -> Result<(), StoreError> {
        let encoded = self.encode_records(upserts)?;
        let op = "committing image records";
        self.write(op, |table| {
            for (key, value) in &encoded {
                table.insert(key.as_str(), value.as_slice())?;
            }
            for key in deletes {
                table.remove(encode_key(key).as_str())?;
            }
            Ok(())
        })
    }

    /// Replaces every image record with `all`, in one durable write
    /// transaction (like [`Store::apply_image_records`]). Also drops records
    /// that no longer decode.
    pub fn replace_image_records(&self, all: &[ImageRecord]) -> Result<(), StoreError> {
        let encoded = self.encode_records(all)?;
        self.write("replacing image records", |table| {
            table.retain(|_, _| false)?;
            for (key, value) in &encoded {
                table.insert(key.as_str(), value.as_slice())?;
            }
            Ok(())
        })
    }

    /// The pulled records (and the keys of those that do not decode) and the
    /// pull intents, from one read transaction.
    pub fn pull_records_state(&self) -> Result<PullRecordsState, StoreError> {
        let op = "reading pull records";
        let txn = self.db.begin_read().map_err(|e| self.tx_error(op, e))?;
        let mut state = PullRecordsState::default();
        let records = txn.open_table(PULLED_RECORDS).map_err(|e| self.tx_error(op, e))?;
        for entry in records.iter().map_err(|e| self.tx_error(op, e))? {
            let (key, value) = entry.map_err(|e| self.tx_error(op, e))?;
            let key = key.value();
            match serde_json::from_slice::<PulledRecord>(value.value()) {
                Ok(record) if record.image_ref == key => state.records.push(record),
                Ok(record) => {
                    tracing::warn!(db = %self.path.display(), key = %key.escape_debug(), found = %record.image_ref.escape_debug(), "pulled record is stored under another image ref; treating it as unreadable");
                    state.unreadable.push(key.to_string());
                }
                Err(reason) => {
                    tracing::warn!(db = %self.path.display(), key = %key.escape_debug(), %reason, "pulled record does not decode; treating it as unreadable");
                    state.unreadable.push(key.to_string());
                }
            }
        }
        let intents = txn.open_table(PULL_INTENTS).map_err(|e| self.tx_error(op, e))?;
        for entry in intents.iter().map_err(|e| self.tx_error(op, e))? {
            let (key, _) = entry.map_err(|e| self.tx_error(op, e))?;
            state.intents.push(key.value().to_string());
        }
        Ok(state)
    }

    /// Applies `w` in one durable write transaction: record upserts, then
    /// record deletes, intent puts, intent deletes. When this returns `Ok`
    /// all of it is on disk; a crash applies all or none of it.
    pub fn apply_pull_records(&self, w: &PullRecordsWrite) -> Result<(), StoreError> {
        let encoded =
            w.upsert_records
                .iter()
                .map(|r| {
                    serde_json::to_vec(r).map(|v| (r.image_ref.as_str(), v)).map_err(|source| {
                        StoreError::EncodePulled { path: self.path.clone(), image_ref: r.image_ref.clone(), source }
                    })
                })
                .collect::<Result<Vec<_>, _>>()?;
        let now =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or_default();
        let op = "committing pull records";
        let mut txn = self.db.begin_write().map_err(|e| self.tx_error(op, e))?;
        txn.set_durability(Durability::Immediate).map_err(|e| self.tx_error(op, e))?;
        {
            let mut records = txn.open_table(PULLED_RECORDS).map_err(|e| self.tx_error(op, e))?;
            for (key, value) in &encoded {
                records.insert(*key, value.as_slice()).map_err(|e| self.tx_error(op, e))?;
            }
            for key in &w.delete_records {
                records.remove(key.as_str()).map_err(|e| self.tx_error(op, e))?;
            }
            let mut intents = txn.open_table(PULL_INTENTS).map_err(|e| self.tx_error(op, e))?;
            for key in &w.put_intents {
                intents.insert(key.as_str(), now).map_err(|e| self.tx_error(op, e))?;
            }
            for key in &w.delete_intents {
                intents.remove(key.as_str()).map_err(|e| self.tx_error(op, e))?;
            }
        }
        txn.commit().map_err(|e| self.tx_error(op, e))
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

    /// Runs `f` on the image records table in one write transaction and
    /// commits it durably; any error aborts the whole transaction.
    fn write(
        &self,
        op: &'static str,
        f: impl FnOnce(&mut redb::Table<'_, &'static str, &'static [u8]>) -> Result<(), redb::StorageError>,
    ) -> Result<(), StoreError> {
        let mut txn = self.db.begin_write().map_err(|e| self.tx_error(op, e))?;
        txn.set_durability(Durability::Immediate).map_err(|e| self.tx_error(op, e))?;
        {
            let mut table = txn.open_table(IMAGE_RECORDS).map_err(|e| self.tx_error(op, e))?;
            f(&mut table).map_err(|e| self.tx_error(op, e))?;
        }
        txn.commit().map_err(|e| self.tx_error(op, e))
    }

    /// Encodes records before a write transaction starts, so the write lock
    /// is not held while serialising.
    fn encode_records(&self, records: &[ImageRecord]) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        records
            .iter()
            .map(|record| {
                let value = serde_json::to_vec(record).map_err(|source| StoreError::Encode {
                    path: self.path.clone(),
                    key: record.key.clone(),
                    source,
                })?;
                Ok((encode_key(&record.key), value))
            })
            .collect()
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

/// The table key of a record: `"<id>\0<runtime_handler>"`. Image ids and
/// handler names never contain NUL, so the encoding is unambiguous, and it
/// sorts by id, then handler.
fn encode_key(key: &RecordKey) -> String {
    let mut encoded = String::with_capacity(key.id.len() + 1 + key.runtime_handler.len());
    encoded.push_str(&key.id);
    encoded.push('\0');
    encoded.push_str(&key.runtime_handler);
    encoded
}

/// Decodes a stored record, checking that it belongs under `key`.
fn decode_record(key: &str, value: &[u8]) -> Result<ImageRecord, String> {
    let record: ImageRecord = serde_json::from_slice(value).map_err(|e| e.to_string())?;
    if encode_key(&record.key) != key {
        return Err(format!(
            "record is for {:?} (runtime handler {:?}), not for its key",
            record.key.id, record.key.runtime_handler
        ));
    }
    Ok(record)
}
