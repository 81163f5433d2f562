//! `AppError`: why a binary could not do its job, and the exit code for it.

use crate::config::ConfigError;
use crate::cri::{CriError, CriErrorKind};
use crate::embedded::EmbeddedError;

/// Exit code for bad configuration or usage (BSD `EX_USAGE`).
pub const EXIT_USAGE: i32 = 64;
/// Exit code when the runtime cannot be reached (BSD `EX_UNAVAILABLE`).
pub const EXIT_UNAVAILABLE: i32 = 69;
/// Exit code for any other failure.
pub const EXIT_FAILURE: i32 = 1;

/// A failure that ends a binary.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    /// The configuration or the command line is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// Bad input on the command line (not configuration).
    #[error("{0}")]
    Usage(String),
    /// The embedded runtime could not start.
    #[error(transparent)]
    Embedded(#[from] EmbeddedError),
    /// A CRI call failed.
    #[error("{context}: {source}")]
    Cri {
        /// What imaged was doing.
        context: String,
        /// The CRI failure.
        #[source]
        source: CriError,
    },
    /// A service imaged needs is not there (no daemon on the socket, or it
    /// is shutting down).
    #[error("{0}")]
    Unavailable(String),
    /// An actor's mailbox was closed (the actor stopped).
    #[error("{0}: actor stopped")]
    Mailbox(String),
    /// Anything else (I/O, logging setup).
    #[error("{0}")]
    Other(String),
}

impl AppError {
    /// A CRI failure with context.
    pub fn cri(context: impl Into<String>, source: CriError) -> Self {
        AppError::Cri { context: context.into(), source }
    }

    /// The process exit code for this failure.
    pub fn exit_code(&self) -> i32 {
        match self {
            AppError::Config(_) | AppError::Usage(_) => EXIT_USAGE,
            AppError::Cri { source, .. } if source.kind() == CriErrorKind::RuntimeUnavailable => EXIT_UNAVAILABLE,
            AppError::Unavailable(_) => EXIT_UNAVAILABLE,
            _ => EXIT_FAILURE,
        }
    }
}
