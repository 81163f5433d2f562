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
