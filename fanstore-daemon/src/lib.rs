//! # fanstore-daemon
//!
//! The per-node FanStore daemon (`fanstore-daemon`). The control CLI
//! (`fanstore`) is the `fanstore-cli` crate, which links no MPI.
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
//!    is logged). Every MPI call runs on the main thread, except that under
//!    that level a server thread posts its own remote read's receives and
//!    request ([`comm::post`]).
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
//! ## Serving clients (wire protocol: [`fanstore_core::wire`])
//!
//! - `PING` -> value = this rank.
//! - `OPEN(arg0 node id, arg1 dataset id)` -> an fd (FLAG_FD) whose bytes are
//!   exactly the file's, always a new open file description (own offset):
//!   a local uncompressed file is the extracted file opened O_RDONLY; a
//!   compressed or remote file is a memfd sealed with F_SEAL_WRITE |
//!   F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL, shared by all clients of the
//!   node through the [`cache`] (bounded by `--cache-mem`, LRU by bytes,
//!   values reference counted). Errors: ENOENT (no such node, or not a
//!   regular file), ESTALE (dataset id differs), EIO (holder gone or
//!   timed out, checksum failure, daemon stopping), EAGAIN (still loading
//!   after 600 s), ENOMEM (no memfd). See [`open`].
//! - `STATUS` -> payload = `key=value` lines ([`status::Snapshot::render`]).
//! - `STOP` -> every rank shuts down (the receiving rank tells the others).
//!
//! Peers are checked with SO_PEERCRED (same uid only); one thread per
//! connection; a client that dies mid-request only ends its own thread.
//!
//! ## Remote reads
//!
//! [`comm`]: client -> local daemon (socket) -> holder (MPI, nonblocking,
//! many in flight, compressed bytes cross compressed, payloads of 2 MiB and
//! more in 1 MiB pieces checksummed as they arrive, anything over 1 GiB in
//! pieces) -> sealed memfd -> client. Replicas are read in an order spread
//! by node id, failing over to the next holder; each request has a deadline
//! (`--remote-timeout`, default 10 s, + 1 s per 64 MiB) after which the
//! client gets EIO.
//!
//! ## Local files
//!
//! Rank r copies each partition it holds, verified, to
//! `--local`/`rank-<r>/parts/` ([`load`]) and maps the copies read-only.
//! A file's own bytes appear on its first open ([`open`], [`copies`]), or
//! before it, from background threads after ready (`--extract-ahead`,
//! `--prefill-mem`): an uncompressed file of 64 KiB or more is extracted to
//! [`fanstore_core::runtime::local_file_path`] and kept; anything else
//! (smaller, compressed, or remote) becomes a copy in the rank's copy
//! directory in shared memory, within `--cache-mem`. The shared tier map
//! ([`fanstore_core::tiers`]) tells clients which files they can open
//! directly with no message. The daemon keeps no fd per file, so the file
//! count a job can read does not depend on RLIMIT_NOFILE ([`fdlimit`]).
//!
//! ## Outputs (write path: [`outputs`], [`namespace`])
//!
//! - `COMMIT(path, fd, excl, mode)`: the client's unnamed local file
//!   (O_TMPFILE) is linked at `rank-<r>/out/<id>` (a memfd is copied there;
//!   fsynced with `--fsync-outputs`), or its bytes go into the checkpoint store
//!   ([`dedup`]) when they are at least `--dedup-min` bytes (an unnamed file
//!   nothing can write is linked all the same and stored behind the close),
//!   then the record (size, mode, mtime, holder rank, id, xxh3)
//!   is put at the metadata owner, rank xxh3(path) mod N (O_EXCL checked
//!   there, atomically; otherwise the last commit replaces the record), then
//!   the name is added to its parent directory's listing at the parent's
//!   owner. The reply (and so the client's close) comes after both: the file
//!   is then visible to every node. ENOSPC/EIO while storing: nothing is
//!   registered, the client's close fails with that errno.
//! - `OUT_STAT`/`OUT_OPEN`/`OUT_LIST`: asked of the owner (through
//!   symlinks); the bytes of a remote output cross MPI like a remote input
//!   (node id with bit 31 set) and are checked against the record's xxh3.
//! - `MKDIR`, `RMDIR` (ENOTEMPTY from the owner's listing), `UNLINK`,
//!   `SETATTR`, `SYMLINK`, `RENAME` (a file: put at the destination owner,
//!   then removed at the source owner if still the same output; in between
//!   both names show the same bytes, never a partial file; a directory: the
//!   two-phase fenced move). All of them live in [`namespace`].
//! - Inputs are never shadowed: COMMIT of an input name is EEXIST (O_EXCL)
//!   or EROFS.
//!
//! ## Namespace events ([`watch`])
//!
//! A connection that sends `WATCH_ADD` becomes a watcher session (`fanstore
//! watch`, or an inotify instance of the preload library). Every completed
//! commit, unlink, mkdir, rmdir and rename of an output is published to the
//! metadata owner of its directory, which numbers it and forwards it to the
//! nodes with watchers concerned ([`fanstore_core::watchev`]); a remote
//! output read on a node is one shared copy there ([`remote_out`]).
//!
//! With `--persist DIR` ([`persist`]) every rank drains at stop (after its
//! MPI loop ended, before it removes its socket, so `fanstore stop` returns
//! once every rank drained) and loads the drained records at start.
//!
//! What is lost when (a close has returned, so the bytes are in
//! `rank-<r>/out/<id>` or its checkpoint store, with a checksummed sidecar
//! `<id>.rec` naming the path; on stable storage only with
//! `--fsync-outputs`, so a kernel crash or power loss of the node can lose
//! what was closed since the last drain):
//! - the whole job is killed (or some ranks), and restarted with the same
//!   `--local` on the same nodes: nothing. Each rank moves its old `out/`
//!   aside at start and, once every rank is ready, registers those outputs
//!   again (and their directories) with their owners
//!   ([`outputs::Outputs::recover`]; visible shortly after `fanstore wait` returns). A
//!   rename is in the holder's sidecar (the holder is told, HOLDER_RENAME);
//!   an unlink done from another node between the drop request and its
//!   handling may come back.
//! - a rank dies and the job goes on: the records that rank owned vanish from
//!   the namespace and the bytes it held fail with EIO until a restart.
//! - a node's local directory is lost: the outputs it held are lost unless
//!   an earlier `fanstore sync` or stop drained them to `--persist`.
//! - after a successful `fanstore stop` (or `sync`) with `--persist`: nothing;
//!   the bytes and checksummed indexes are in DIR.

pub mod args;
pub mod comm;
pub mod caller;
pub mod cpu_share;
pub mod fdio;
pub mod fdlimit;
pub mod ids;
pub mod index_shm;
pub mod memfd;
pub mod node;
pub mod inputs;
pub mod outputs;
pub mod placement;
pub mod rank;
pub mod rank_lock;
pub mod server;
pub mod spare_core;
pub mod status;
pub mod wake_cost;
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
    // SAFETY: geteuid cannot fail.
    let me = unsafe { libc::geteuid() };
    if md.uid() != me {
        return Err(RuntimeDirError::NotOurs(dir.to_path_buf(), md.uid(), me));
    }
    let mode = caller::shared_mode(0o755, 0o700);
    if md.permissions().mode() & 0o777 != mode {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode)).map_err(err)?;
    }
    Ok(())
}

/// For a daemon that serves every user ([`caller::serves_every_user`]):
/// the clients' directory in the rank's local directory, made ready for
/// processes of any uid: `.client` 0755 with `pending`, `locks`, `cwd`,
/// `fifo` and `tmp` open to all as /tmp is (01777), so that their O_EXCL
/// markers, lock files, cwd stand-ins and new outputs' unnamed files can be
/// made by whoever runs. (A daemon of one
/// user leaves it to its clients, which make it 0700.)
pub fn prepare_client_dir(local_dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    if !caller::serves_every_user() {
        return Ok(());
    }
    // Other users reach it only if every directory above it lets them pass.
    let mut up = local_dir.parent();
    while let Some(d) = up {
        use std::os::unix::fs::MetadataExt;
        if std::fs::metadata(d).is_ok_and(|m| m.mode() & 0o001 == 0) {
            log::warn!("{} is not searchable by other users (mode {:o}): their processes cannot create outputs on this node", d.display(), std::fs::metadata(d).map_or(0, |m| m.mode() & 0o7777));
            break;
        }
        up = d.parent();
    }
    let client = local_dir.join(".client");
    for (dir, mode) in [(client.clone(), 0o755), (client.join("pending"), 0o1777), (client.join("locks"), 0o1777), (client.join("cwd"), 0o1777), (client.join("fifo"), 0o1777), (client.join("tmp"), 0o1777)] {
        match std::fs::create_dir_all(&dir) {
            Ok(()) => {}
            Err(e) => return Err(e),
        }
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode))?;
    }
    Ok(())
}

/// Whether process `pid` of this host exists (one of another user's too).
pub fn pid_alive(pid: u64) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else { return false };
    if pid <= 0 {
        return false;
    }
    // SAFETY: kill with signal 0 only checks that the process exists.
    let r = unsafe { libc::kill(pid, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// A tomb (a tree renamed `*.removing` to be removed) untouched for this
/// long is no one's: a removal in progress unlinks its entries, which
/// touches it.
pub const TOMB_ABANDONED: std::time::Duration = std::time::Duration::from_secs(60);

/// Removes the trees in `dir` whose names start with `prefix` and hold
/// `.removing`, untouched for `idle`: copy directories in /dev/shm that a
/// rank of an earlier job renamed aside and was killed while removing (the
/// MPICH 4.0 finalize hang: one rank's watchdog ends it, and the launcher
/// kills the others mid-removal; 96 + 15 + 38 MiB were left so here by one
/// benchmark job). A later job with another runtime directory never meets
/// them by name. Each is renamed first, so that ranks sweeping at once
/// remove each tree once. Returns how many went.
pub fn sweep_abandoned_tombs(dir: &Path, prefix: &str, idle: std::time::Duration) -> usize {
    let Ok(rd) = std::fs::read_dir(dir) else { return 0 };
    let mut swept = 0;
    for e in rd.flatten() {
        let name = e.file_name();
        let name = name.to_string_lossy();
        if !name.starts_with(prefix) || !name.contains(".removing") {
            continue;
        }
        let Ok(md) = e.metadata() else { continue };
        let age = md.modified().ok().and_then(|m| std::time::SystemTime::now().duration_since(m).ok()).unwrap_or_default();
        if !md.is_dir() || age < idle {
            continue;
        }
        let mine = dir.join(format!("{name}.swept-{}", std::process::id()));
        if std::fs::rename(e.path(), &mine).is_ok() && std::fs::remove_dir_all(&mine).is_ok() {
            swept += 1;
        }
    }
    swept
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
            if name.ends_with(".lock") {
                rank_lock::remove_if_unheld(&e.path());
                continue;
            }
            let _ = std::fs::remove_file(e.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn abandoned_tombs_of_this_prefix_go_and_nothing_else() {
        let d = tempfile::tempdir().unwrap();
        let old = std::time::SystemTime::now() - std::time::Duration::from_secs(600);
        let mk = |name: &str, age_old: bool| {
            let p = d.path().join(name);
            std::fs::create_dir(&p).unwrap();
            std::fs::write(p.join("1"), b"x").unwrap();
            if age_old {
                std::fs::File::open(&p).unwrap().set_modified(old).unwrap();
            }
        };
        mk("fanstore-7-job-aa-r0.copies.removing", true); // abandoned
        mk("fanstore-7-job-aa-r1.copies.removing.swept-1", true); // a sweeper killed mid-removal
        mk("fanstore-7-job-bb-r0.copies.removing", false); // a removal in progress
        mk("fanstore-7-job-cc-r0.copies", true); // a live copy directory
        mk("fanstore-8-job-aa-r0.copies.removing", true); // another user's
        let n = sweep_abandoned_tombs(d.path(), "fanstore-7-", TOMB_ABANDONED);
        let mut left: Vec<String> =
            std::fs::read_dir(d.path()).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        left.sort();
        assert_eq!(n, 2);
        assert_eq!(left, ["fanstore-7-job-bb-r0.copies.removing", "fanstore-7-job-cc-r0.copies", "fanstore-8-job-aa-r0.copies.removing"]);
    }

    #[test]
    fn runtime_dir_is_private_and_stale_ranks_go() {
        let d = tempfile::tempdir().unwrap();
        let rt = d.path().join("rt");
        std::fs::create_dir(&rt).unwrap();
        std::fs::set_permissions(&rt, std::fs::Permissions::from_mode(0o750)).unwrap();
        prepare_runtime_dir(&rt).unwrap();
        // Private, unless this daemon (root) serves every user.
        let want = if caller::serves_every_user() { 0o755 } else { 0o700 };
        assert_eq!(std::fs::metadata(&rt).unwrap().permissions().mode() & 0o777, want);
        for f in ["node-0.state", "node-3.state", "node-3.sock", "node-12.state", "node-5.lock", "other.txt"] {
            std::fs::write(rt.join(f), b"").unwrap();
        }
        // Rank 6 of a running job: its lock file stays.
        let held = rank_lock::RankLock::claim_runtime(&rt, 6).unwrap();
        remove_stale_ranks(&rt, 4);
        let mut left: Vec<String> =
            std::fs::read_dir(&rt).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        left.sort();
        assert_eq!(left, ["node-0.state", "node-3.sock", "node-3.state", "node-6.lock", "other.txt"]);
        held.release();
    }
}
