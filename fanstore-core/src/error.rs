//! Errors of the on-disk formats: every variant names the file, the entry and the offset.

use crate::checksum::xxh3;
use std::path::{Path, PathBuf};

/// A fault found while reading or writing a FanStore format.
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
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
}

impl FormatError {
    pub fn io(file: impl Into<PathBuf>, source: std::io::Error) -> Self {
        FormatError::Io { file: file.into(), source }
    }

    /// Checks that the xxh3 of `bytes` is `stored`, the checksum a format
    /// recorded for them; else the [`Checksum`](FormatError::Checksum) fault
    /// of `entry` (made only then) at `offset` of `file`.
    pub fn check_xxh3(file: &Path, entry: impl FnOnce() -> String, offset: u64, bytes: &[u8], stored: u64) -> Result<()> {
        let computed = xxh3(bytes);
        if computed != stored {
            return Err(FormatError::Checksum { file: file.into(), entry: entry(), offset, stored, computed });
        }
        Ok(())
    }

    /// True for faults that mean stored bytes are damaged: not for I/O
    /// errors, nor for a version this build does not read.
    pub fn is_corruption(&self) -> bool {
        matches!(
            self,
            FormatError::BadMagic { .. } | FormatError::Checksum { .. } | FormatError::Corrupt { .. } | FormatError::Truncated { .. }
        )
    }
}

pub type Result<T> = std::result::Result<T, FormatError>;
