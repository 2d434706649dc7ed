//! One running daemon per rank directory.
//!
//! At start a rank takes over what it finds of its rank under `--local`
//! (`rank-<r>`: the extracted partitions, outputs) and in the runtime
//! directory (`node-<r>.sock`, `.state`, the index in shared memory): an
//! earlier job that was killed left them, and they are removed, its outputs
//! kept aside for recovery. That is only right when no daemon still runs
//! there. Two jobs on one node given the same `--local` (or the same
//! `FANSTORE_RUNTIME_DIR`) would otherwise have the second remove the
//! first's files under its readers (EIO) and take its outputs as a killed
//! run's.
//!
//! So each rank holds an exclusive `flock` on two small files for its life,
//! taken before it touches anything of its rank:
//!
//! ```text
//! <runtime>/node-<r>.lock      pid of the holder, one line
//! <local>/rank-<r>.lock        pid of the holder, one line
//! ```
//!
//! A lock dies with its process (even under `kill -9`), so a killed job's
//! leftovers are still taken over; a running job's are refused with an
//! error naming the file and the holder's pid. A file system that refuses
//! `flock` (some network file systems) gets a warning and no lock. The
//! paths, and the removal of a lock file nobody holds, are in
//! [`fanstore_core::rank_lock`] (the control CLI cleans up after dead ranks).
//!
//! ```no_run
//! # use std::path::Path;
//! use fanstore_daemon::rank_lock::RankLock;
//! let mut lock = RankLock::claim_runtime(Path::new("/tmp/fanstore-rt"), 0)?;
//! lock.claim_local(Path::new("/local/fanstore"), 0)?;
//! // ... serve ...
//! lock.release();
//! # Ok::<(), fanstore_daemon::rank_lock::RankLockError>(())
//! ```

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Where the lock files are, and the removal of one nobody holds: shared
/// with the control CLI, in fanstore-core.
pub use fanstore_core::rank_lock::{local_lock_path, remove_if_unheld, runtime_lock_path};

/// How long a claim waits for a holder that is exiting (its lock goes
/// when its process has gone, a moment after `kill -9`).
const HOLDER_EXIT_WAIT: Duration = Duration::from_secs(3);

#[derive(Debug, thiserror::Error)]
pub enum RankLockError {
    #[error(
        "{path}: rank {rank} of a running FanStore job (pid {holder}) uses this {what}; \
         give each job its own {option} (or stop that job: fanstore stop)"
    )]
    InUse { path: PathBuf, rank: u32, holder: String, what: &'static str, option: &'static str },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The rank's locks, held until [`release`](RankLock::release) or exit.
#[derive(Debug)]
pub struct RankLock {
    held: Vec<(PathBuf, File)>,
}

impl RankLock {
    /// Locks `rank`'s file in `runtime` (which must exist), or says which
    /// job holds it. [`claim_local`](Self::claim_local) takes the other.
    pub fn claim_runtime(runtime: &Path, rank: u32) -> Result<RankLock, RankLockError> {
        Self::claim_runtime_waiting(runtime, rank, HOLDER_EXIT_WAIT)
    }

    /// Also locks `rank`'s file in `local_root` (created if missing), or
    /// says which job holds it (the runtime directory's lock is kept: the
    /// rank may still report its failure there).
    pub fn claim_local(&mut self, local_root: &Path, rank: u32) -> Result<(), RankLockError> {
        self.claim_local_waiting(local_root, rank, HOLDER_EXIT_WAIT)
    }

    fn claim_runtime_waiting(runtime: &Path, rank: u32, wait: Duration) -> Result<RankLock, RankLockError> {
        let mut lock = RankLock { held: Vec::with_capacity(2) };
        let option = "runtime directory (--runtime-dir, FANSTORE_RUNTIME_DIR)";
        lock.add(runtime_lock_path(runtime, rank), rank, "runtime directory", option, wait)?;
        Ok(lock)
    }

    fn claim_local_waiting(&mut self, local_root: &Path, rank: u32, wait: Duration) -> Result<(), RankLockError> {
        std::fs::create_dir_all(local_root).map_err(|source| RankLockError::Io { path: local_root.to_path_buf(), source })?;
        self.add(local_lock_path(local_root, rank), rank, "local directory", "--local directory", wait)
    }

    fn add(&mut self, path: PathBuf, rank: u32, what: &'static str, option: &'static str, wait: Duration) -> Result<(), RankLockError> {
        match lock_file(&path, rank, what, option, wait)? {
            Some(f) => self.held.push((path, f)),
            None => log::warn!("{}: the file system refuses flock: rank {rank} runs without checking that no other job uses it", path.display()),
        }
        Ok(())
    }

    /// Removes the lock files (a directory they leave empty can go) and
    /// lets the locks go.
    pub fn release(self) {
        for (path, _file) in &self.held {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Opens and locks `path`, writing our pid into it. `Ok(None)`: the file
/// system does not support flock.
fn lock_file(path: &Path, rank: u32, what: &'static str, option: &'static str, wait: Duration) -> Result<Option<File>, RankLockError> {
    let io = |source| RankLockError::Io { path: path.to_path_buf(), source };
    let mut f = OpenOptions::new().read(true).write(true).create(true).truncate(false).mode(0o600).open(path).map_err(io)?;
    let start = Instant::now();
    loop {
        // SAFETY: flock on a descriptor we own; it shares no memory.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            break;
        }
        let e = std::io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EWOULDBLOCK) if start.elapsed() < wait => std::thread::sleep(Duration::from_millis(50)),
            Some(libc::EWOULDBLOCK) => {
                let mut holder = String::new();
                let _ = f.read_to_string(&mut holder);
                let holder = holder.trim();
                let holder = if holder.is_empty() { "unknown".to_string() } else { holder.to_string() };
                return Err(RankLockError::InUse { path: path.to_path_buf(), rank, holder, what, option });
            }
            Some(libc::ENOLCK | libc::EOPNOTSUPP | libc::ENOSYS) => return Ok(None),
            Some(libc::EINTR) => {}
            _ => return Err(io(e)),
        }
    }
    f.set_len(0).map_err(io)?;
    f.rewind().map_err(io)?;
    writeln!(f, "{}", std::process::id()).map_err(io)?;
    Ok(Some(f))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dirs() -> (tempfile::TempDir, PathBuf, PathBuf) {
        let base = tempfile::tempdir().unwrap();
        let rt = base.path().join("rt");
        std::fs::create_dir_all(&rt).unwrap();
        let local = base.path().join("local");
        (base, rt, local)
    }

    #[test]
    fn a_second_claim_of_a_held_rank_is_refused_naming_the_file_and_the_holder() {
        let (_base, rt, local) = dirs();
        let claim = |rt: &Path, local: &Path, rank, wait| -> Result<RankLock, RankLockError> {
            let mut l = RankLock::claim_runtime_waiting(rt, rank, wait)?;
            match l.claim_local_waiting(local, rank, wait) {
                Ok(()) => Ok(l),
                Err(e) => {
                    l.release();
                    Err(e)
                }
            }
        };
        let long = HOLDER_EXIT_WAIT;
        let first = claim(&rt, &local, 3, long).unwrap();
        assert_eq!(std::fs::read_to_string(local_lock_path(&local, 3)).unwrap().trim(), std::process::id().to_string());
        // flock locks belong to the open file description: a second open in
        // this process conflicts like another process's would.
        let other_rt = rt.parent().unwrap().join("rt2");
        std::fs::create_dir_all(&other_rt).unwrap();
        let wait = Duration::from_millis(200);
        let t = Instant::now();
        let err = claim(&other_rt, &local, 3, wait).unwrap_err();
        assert!(t.elapsed() >= wait, "refused before the holder had time to exit");
        let msg = err.to_string();
        assert!(msg.contains(&local_lock_path(&local, 3).display().to_string()), "{msg}");
        assert!(msg.contains(&format!("pid {}", std::process::id())) && msg.contains("--local"), "{msg}");
        // Another rank of the same directories is free.
        let other = claim(&rt, &local, 4, long).unwrap();
        // The same local directory, but the runtime directory held: refused too.
        let err = claim(&rt, &local.join("elsewhere"), 3, wait).unwrap_err();
        assert!(err.to_string().contains(&runtime_lock_path(&rt, 3).display().to_string()), "{err}");
        first.release();
        other.release();
        assert!(!local_lock_path(&local, 3).exists() && !runtime_lock_path(&rt, 3).exists());
        // Released: the rank can be claimed again.
        claim(&other_rt, &local, 3, long).unwrap().release();
    }

    #[test]
    fn a_lock_file_left_by_a_dead_holder_is_taken_over() {
        let (_base, rt, local) = dirs();
        std::fs::create_dir_all(&local).unwrap();
        // A killed daemon leaves its file, with its pid, but no lock.
        std::fs::write(local_lock_path(&local, 0), "999999\n").unwrap();
        std::fs::write(runtime_lock_path(&rt, 0), "999999\n").unwrap();
        let mut lock = RankLock::claim_runtime(&rt, 0).unwrap();
        lock.claim_local(&local, 0).unwrap();
        assert_eq!(std::fs::read_to_string(runtime_lock_path(&rt, 0)).unwrap(), format!("{}\n", std::process::id()));
        lock.release();
    }
}
