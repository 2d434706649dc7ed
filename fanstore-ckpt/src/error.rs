//! Errors of the checkpoint store: every format fault names the file, the
//! entry and the offset; every lookup fault names the checkpoint path.

use fanstore_core::FormatError;
use std::path::PathBuf;

/// A fault of the checkpoint store.
#[derive(Debug, thiserror::Error)]
pub enum CkptError {
    /// A fault of one of the store's files: I/O, or bytes that are not what
    /// its format says (the message names the file, the entry and the offset).
    #[error(transparent)]
    Format(#[from] FormatError),
    /// A checkpoint read back with bytes that differ from the committed ones.
    #[error("checkpoint {path}: whole-file checksum mismatch (recipe {stored:#018x}, reassembled {computed:#018x})")]
    FileChecksum { path: String, stored: u64, computed: u64 },
    #[error("no checkpoint at {path}")]
    NotFound { path: String },
    #[error("{dir}: checkpoint store is in use by another process")]
    Locked { dir: PathBuf },
    #[error("invalid argument: {0}")]
    Invalid(String),
    /// A commit from parts referred to a unit the store does not hold (or
    /// holds with another length).
    #[error("no stored unit {hash} of {len} bytes")]
    UnknownUnit { hash: String, len: u64 },
}

impl CkptError {
    pub fn io(file: impl Into<PathBuf>, source: std::io::Error) -> Self {
        CkptError::Format(FormatError::io(file, source))
    }

    pub(crate) fn not_found(path: &[u8]) -> Self {
        CkptError::NotFound { path: String::from_utf8_lossy(path).into_owned() }
    }

    /// True for faults that mean stored bytes are damaged (the daemon maps these to EIO).
    pub fn is_corruption(&self) -> bool {
        match self {
            CkptError::Format(e) => e.is_corruption(),
            CkptError::FileChecksum { .. } => true,
            CkptError::NotFound { .. } | CkptError::Locked { .. } | CkptError::Invalid(_) | CkptError::UnknownUnit { .. } => false,
        }
    }
}

pub type Result<T> = std::result::Result<T, CkptError>;
