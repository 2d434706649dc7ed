//! # fanstore-daemon
//!
//! The per-node FanStore daemon (`fanstore-daemon`) and its control CLI
//! (`fanstore`).
//!
//! ```text
//! mpiexec -n NODES fanstore-daemon --data OUT --local DIR [--mount /fanstore]
//!         [--replication K] [--cache-mem SIZE] [--runtime-dir DIR] [--keep-local]
//! fanstore-daemon --data OUT --local DIR        # no launcher: MPI singleton
//! fanstore wait [--timeout S] | fanstore status | fanstore stop
//! ```
//!
//! ## Life of a rank
//!
//! 1. MPI is initialised asking for `MPI_THREAD_MULTIPLE` (the level granted
//!    is logged; every MPI call stays on the main thread regardless).
//! 2. The runtime directory (`--runtime-dir`, `$FANSTORE_RUNTIME_DIR`, else
//!    `$TMPDIR/fanstore-<uid>-<job>`) is created mode 0700; the rank publishes
//!    `node-<r>.state` ([`fanstore_core::runtime::NodeState`], status Loading).
//! 3. The manifest is fully verified and copied to the shared-memory index
//!    ([`index_shm`], `/dev/shm/...`, mode 0600) that clients map read-only.
//! 4. The socket `node-<r>.sock` ([`server`]) starts answering PING and STATUS.
//! 5. [`load`] extracts the partitions the [`placement`] gives this rank into
//!    `DIR/rank-<r>` (always that subdirectory of `--local`, for any number
//!    of ranks, so ranks sharing a host never collide and the daemon only
//!    ever deletes a directory it created).
//! 6. Every rank takes part in a collective check (MPI_Iallreduce): if any
//!    rank failed to load, every rank exits with status 1 (the failing rank
//!    names the partition file); otherwise each publishes Ready.
//! 7. The main thread becomes the communication thread ([`comm`]) until STOP
//!    (from a client, a peer, or SIGTERM/SIGINT); then every rank removes its
//!    socket, state file, shared-memory index and (unless `--keep-local`) its
//!    local directory, and exits 0.
//!
//! ## Serving OPEN
//!
//! See [`open`]: local uncompressed files are handed out as the extracted
//! file itself; compressed and remote files as sealed memfds ([`memfd`])
//! shared by all clients of the node through the [`cache`].

pub mod args;
pub mod bufpool;
pub mod cache;
pub mod client;
pub mod comm;
pub mod index_shm;
pub mod load;
pub mod memfd;
pub mod node;
pub mod open;
pub mod placement;
pub mod server;
pub mod status;
#[doc(hidden)]
pub mod testkit;

pub use fanstore_core::runtime::runtime_dir;
use std::path::Path;

/// A runtime directory that is unusable.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeDirError {
    #[error("creating runtime directory {0}: {1}")]
    Create(std::path::PathBuf, std::io::Error),
    #[error("runtime directory {0} belongs to uid {1}, not to us (uid {2})")]
    NotOurs(std::path::PathBuf, u32, u32),
}

/// Creates the runtime directory (mode 0700) or checks that an existing one is ours.
pub fn prepare_runtime_dir(dir: &Path) -> Result<(), RuntimeDirError> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let err = |e| RuntimeDirError::Create(dir.to_path_buf(), e);
    std::fs::create_dir_all(dir).map_err(err)?;
    let md = std::fs::metadata(dir).map_err(err)?;
    // SAFETY: getuid cannot fail.
    let me = unsafe { libc::getuid() };
    if md.uid() != me {
        return Err(RuntimeDirError::NotOurs(dir.to_path_buf(), md.uid(), me));
    }
    if md.permissions().mode() & 0o777 != 0o700 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(err)?;
    }
    Ok(())
}

/// Removes `node-<k>.sock` / `node-<k>.state` left by an earlier, larger job
/// (k >= nranks), so `fanstore wait` only sees this job's ranks.
pub fn remove_stale_ranks(dir: &Path, nranks: u32) {
    let Ok(rd) = std::fs::read_dir(dir) else { return };
    for e in rd.flatten() {
        let name = e.file_name();
        let name = name.to_string_lossy();
        let Some(rest) = name.strip_prefix("node-") else { continue };
        let Some((k, _)) = rest.split_once('.') else { continue };
        if k.parse::<u32>().is_ok_and(|k| k >= nranks) {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn runtime_dir_is_private_and_stale_ranks_go() {
        let d = tempfile::tempdir().unwrap();
        let rt = d.path().join("rt");
        std::fs::create_dir(&rt).unwrap();
        std::fs::set_permissions(&rt, std::fs::Permissions::from_mode(0o755)).unwrap();
        prepare_runtime_dir(&rt).unwrap();
        assert_eq!(std::fs::metadata(&rt).unwrap().permissions().mode() & 0o777, 0o700);
        for f in ["node-0.state", "node-3.state", "node-3.sock", "node-12.state", "other.txt"] {
            std::fs::write(rt.join(f), b"").unwrap();
        }
        remove_stale_ranks(&rt, 4);
        let mut left: Vec<String> =
            std::fs::read_dir(&rt).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        left.sort();
        assert_eq!(left, ["node-0.state", "node-3.sock", "node-3.state", "other.txt"]);
    }
}
