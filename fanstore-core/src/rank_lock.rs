//! Where a daemon rank's lock files are, and how a leftover one is removed.
//!
//! Each rank of a running job holds an exclusive `flock` on two small files
//! for its life (the daemon's `rank_lock::RankLock` takes them):
//!
//! ```text
//! <runtime>/node-<r>.lock      pid of the holder, one line
//! <local>/rank-<r>.lock        pid of the holder, one line
//! ```
//!
//! A lock dies with its process (even under `kill -9`), so a file nobody
//! holds was left by a killed daemon: the daemon removes those of a larger
//! earlier job at start, and `fanstore stop` those of the dead ranks it
//! cleans up after.
//!
//! ```no_run
//! use fanstore_core::rank_lock::{remove_if_unheld, runtime_lock_path};
//! remove_if_unheld(&runtime_lock_path("/tmp/fanstore-rt".as_ref(), 3));
//! ```

use std::fs::OpenOptions;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

/// The lock file of `rank` in the runtime directory.
pub fn runtime_lock_path(runtime: &Path, rank: u32) -> PathBuf {
    runtime.join(format!("node-{rank}.lock"))
}

/// The lock file of `rank` in the `--local` directory.
pub fn local_lock_path(local_root: &Path, rank: u32) -> PathBuf {
    local_root.join(format!("rank-{rank}.lock"))
}

/// Removes the lock file at `path` unless a running daemon holds it (a
/// rank of a killed, larger job left it).
pub fn remove_if_unheld(path: &Path) {
    let Ok(f) = OpenOptions::new().read(true).open(path) else { return };
    // SAFETY: flock on a descriptor we own; it shares no memory.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
        let _ = std::fs::remove_file(path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unheld_lock_file_goes_and_a_held_one_stays() {
        let d = tempfile::tempdir().unwrap();
        let (held, left) = (runtime_lock_path(d.path(), 1), local_lock_path(d.path(), 2));
        assert_eq!(held, d.path().join("node-1.lock"));
        assert_eq!(left, d.path().join("rank-2.lock"));
        std::fs::write(&held, "1\n").unwrap();
        std::fs::write(&left, "999999\n").unwrap();
        // flock locks belong to the open file description: a second open in
        // this process conflicts like another process's would.
        let holder = std::fs::File::open(&held).unwrap();
        // SAFETY: flock on a descriptor we own.
        assert_eq!(unsafe { libc::flock(holder.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) }, 0);
        remove_if_unheld(&held);
        remove_if_unheld(&left);
        remove_if_unheld(&d.path().join("node-9.lock")); // missing: nothing to do
        assert!(held.exists() && !left.exists());
    }
}
