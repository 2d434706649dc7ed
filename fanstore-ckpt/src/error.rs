//! Errors of the checkpoint store: every format fault names the file, the
//! entry and the offset; every lookup fault names the checkpoint path.

use std::path::PathBuf;

/// A fault of the checkpoint store.
#[derive(Debug, thiserror::Error)]
pub enum CkptError {
    #[error("{file}: I/O error: {source}")]
    Io {
        file: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{file}: not a FanStore {what} (bad magic at offset 0)")]
    BadMagic { file: PathBuf, what: &'static str },
    #[error("{file}: unsupported {what} format version {found} (this build reads version {supported})")]
    UnsupportedVersion {
        file: PathBuf,
        what: &'static str,
        found: u32,
        supported: u32,
    },
    #[error("{file}: checksum mismatch in {entry} at offset {offset} (stored {stored:#018x}, computed {computed:#018x})")]
    Checksum {
        file: PathBuf,
        entry: String,
        offset: u64,
        stored: u64,
        computed: u64,
    },
    #[error("{file}: corrupt {entry} at offset {offset}: {problem}")]
    Corrupt {
        file: PathBuf,
        entry: String,
        offset: u64,
        problem: String,
    },
    #[error("{file}: truncated: {entry} at offset {offset} needs {needed} bytes, file has {len}")]
    Truncated {
        file: PathBuf,
        entry: String,
        offset: u64,
        needed: u64,
        len: u64,
    },
    /// A checkpoint read back with bytes that differ from the committed ones.
    #[error("checkpoint {path}: whole-file checksum mismatch (recipe {stored:#018x}, reassembled {computed:#018x})")]
    FileChecksum { path: String, stored: u64, computed: u64 },
    #[error("no checkpoint at {path}")]
    NotFound { path: String },
    #[error("{dir}: checkpoint store is in use by another process")]
    Locked { dir: PathBuf },
    #[error("invalid argument: {0}")]
    Invalid(String),
}

impl CkptError {
    pub fn io(file: impl Into<PathBuf>, source: std::io::Error) -> Self {
        CkptError::Io { file: file.into(), source }
    }

    pub(crate) fn not_found(path: &[u8]) -> Self {
        CkptError::NotFound { path: String::from_utf8_lossy(path).into_owned() }
    }

    /// True for faults that mean stored bytes are damaged (the daemon maps these to EIO).
    pub fn is_corruption(&self) -> bool {
        matches!(
            self,
            CkptError::BadMagic { .. }
                | CkptError::Checksum { .. }
                | CkptError::Corrupt { .. }
                | CkptError::Truncated { .. }
                | CkptError::FileChecksum { .. }
        )
    }
}

pub type Result<T> = std::result::Result<T, CkptError>;
