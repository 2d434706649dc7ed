//! The shared-memory index: the verified manifest bytes copied to a file in
//! `/dev/shm` (mode 0600) that every client of the rank maps read-only.
//! The file is written under a temporary name and renamed into place, so a
//! client never maps a partial index.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
#[error("publishing the index at {path}: {source}")]
pub struct IndexShmError {
    pub path: PathBuf,
    #[source]
    pub source: std::io::Error,
}

/// A published index file; [`IndexShm::remove`] deletes it.
#[derive(Debug)]
pub struct IndexShm {
    path: PathBuf,
}

impl IndexShm {
    /// Writes `bytes` to `path` (`mode`: 0600, or 0644 for a daemon that
    /// serves every user), replacing a stale file of a previous run.
    pub fn publish(path: &Path, bytes: &[u8], mode: u32) -> Result<IndexShm, IndexShmError> {
        let err = |source| IndexShmError { path: path.to_path_buf(), source };
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(format!(".tmp{}", std::process::id()));
        let tmp = PathBuf::from(tmp);
        let _ = std::fs::remove_file(&tmp);
        let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(mode).open(&tmp).map_err(err)?;
        let res = f.write_all(bytes).and_then(|_| std::fs::rename(&tmp, path));
        if let Err(e) = res {
            let _ = std::fs::remove_file(&tmp);
            return Err(err(e));
        }
        Ok(IndexShm { path: path.to_path_buf() })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn remove(&self) {
        if let Err(e) = std::fs::remove_file(&self.path) {
            if e.kind() != std::io::ErrorKind::NotFound {
                log::warn!("removing {}: {e}", self.path.display());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn publish_mode_and_remove() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("x.index");
        std::fs::write(&p, b"stale").unwrap();
        let s = IndexShm::publish(&p, b"index bytes", 0o600).unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"index bytes");
        assert_eq!(std::fs::metadata(&p).unwrap().permissions().mode() & 0o777, 0o600);
        s.remove();
        assert!(!p.exists());
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 0);
    }
}
