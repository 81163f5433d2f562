//! Why a [`Store`](super::Store) operation failed.

use std::io;
use std::path::PathBuf;

use redb::DatabaseError;

use crate::gc::record::RecordKey;

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
    /// The state directory can be written by its group or by others.
    #[error(
        "state directory {} has mode {mode:04o}: its group or others can write it (and replace the \
         database); run `chmod 0700 {}`",
        path.display(),
        path.display()
    )]
    DirWritableByOthers {
        /// The directory.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
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
    /// The store was fenced ([`Store::fence`](super::Store::fence)): the
    /// simulator killed the process that had it open, and nothing it left
    /// running may write any more.
    #[error("database {} is fenced: its process was killed", path.display())]
    Fenced {
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
    /// redb panicked while the database was opened and checked (a bug of
    /// redb's on a damaged file; caught only in builds that unwind).
    #[error("the database {} could not be read: redb panicked ({message})", path.display())]
    Panicked {
        /// The database file.
        path: PathBuf,
        /// The panic's message.
        message: String,
    },
    /// A damaged database could not be moved aside; nothing was changed.
    #[error("cannot move the damaged database {} aside to {}", from.display(), to.display())]
    MoveAside {
        /// The database file.
        from: PathBuf,
        /// Where it was to go.
        to: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
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

impl StoreError {
    /// Whether this error says the database file itself is damaged (not a
    /// redb file, truncated, corrupted pages, redb panicked on it), as
    /// opposed to the environment (permissions, I/O errors, the lock, a
    /// newer schema, an older file format), which moving the file aside
    /// would not fix or would lose data for.
    pub fn is_damage(&self) -> bool {
        match self {
            Self::Open { source, .. } => match source.as_ref() {
                DatabaseError::Storage(s) => storage_is_damage(s),
                DatabaseError::RepairAborted => true,
                _ => false,
            },
            Self::Transaction { source, .. } => match source.as_ref() {
                redb::Error::Corrupted(_)
                | redb::Error::TableTypeMismatch { .. }
                | redb::Error::TableIsMultimap(_)
                | redb::Error::TableIsNotMultimap(_)
                | redb::Error::TypeDefinitionChanged { .. } => true,
                redb::Error::Io(e) => io_is_damage(e),
                _ => false,
            },
            Self::Panicked { .. } => true,
            _ => false,
        }
    }
}

/// A storage error that comes from the file's content.
fn storage_is_damage(e: &redb::StorageError) -> bool {
    match e {
        redb::StorageError::Corrupted(_) => true,
        redb::StorageError::Io(e) => io_is_damage(e),
        _ => false,
    }
}

/// redb reports "not a redb file" and short reads as these I/O kinds; any
/// other kind (permission, EIO, no space) is the environment's.
fn io_is_damage(e: &io::Error) -> bool {
    matches!(e.kind(), io::ErrorKind::InvalidData | io::ErrorKind::UnexpectedEof)
}
