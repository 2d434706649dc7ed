//! CKPT_PUT: a checkpoint committed from parts (see `fanstore_core::wire`,
//! `fanstore_ckpt::parts_file`). The `fanstore` Python package's
//! `fanstore.torch.save` knows which tensors did not change since it last
//! saved them and sends those as references to the units this node's
//! checkpoint store holds; only changed tensors travel as bytes. The
//! checkpoint is then an output like any closed one: its record put at the
//! metadata owner (with a sidecar here), its name linked in its directory,
//! a close event published; every node sees it, `fanstore ckpt` shows it,
//! reads rebuild its exact bytes from the store.
//!
//! The parts are checked first (the split of their glue, every reference,
//! the new units hashed for the reply), so a refusal reaches the writer
//! before anything is registered. The store commit itself (the new units
//! encoded, the recipe, the catalog: ~150 ms per 50 MB changed here) runs
//! after the reply, once the host has a core to spare or 250 ms passed
//! ([`crate::spare_core`]), on the same connection, so the writer's next request
//! waits for it: readers of the output wait until it is stored, and
//! unlinks of other checkpoints are deferred until then
//! (`Dedup::check_and_begin_parts`). A daemon killed in between loses that
//! checkpoint (its sidecar names no bytes, so a restart does not register
//! it), where a checkpoint closed through POSIX stays a plain file until
//! stored.

use crate::caller::{Access, Caller};
use crate::ids::OUT_BIT;
use crate::outputs::names::{now_ns, Looked};
use crate::outputs::Outputs;
use fanstore_core::watchev::Kind;
use fanstore_core::wire::{self, OutRecord};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::Ordering::Relaxed;

/// What a commit from parts gives back: the blake3 of every unit, in file order.
pub type UnitHashes = Vec<[u8; 32]>;

/// The store commit of a checkpoint from parts whose record is registered:
/// [`PartsCommit::run`] it once the writer has its reply.
pub struct PartsCommit {
    dedup: std::sync::Arc<crate::outputs::dedup::Dedup>,
    path: Vec<u8>,
    id: u64,
    parts: fanstore_ckpt::parts_file::Parts,
    map: memmap2::Mmap,
}

impl PartsCommit {
    /// Runs the store commit on a thread of its own at the commit worker's
    /// nice value, and waits for it. The connection's own thread stays at
    /// the daemon's priority: lowering it and raising it back afterwards
    /// needs CAP_SYS_NICE, which a user's daemon does not have.
    ///
    /// At full priority, 4 daemons' commits after a 4-rank DCP save took
    /// the 2 cores from the communication threads that answer the metadata
    /// of DCP's `.metadata` (open 11-21 ms, close 17-25, rename 29-50 ms,
    /// against under 1 ms each with one daemon): the program waited on them.
    pub fn run(self) {
        // Kept here, not moved into the thread: a thread that cannot be
        // started drops its closure, and the commit must still run.
        let slot = std::sync::Mutex::new(Some(self));
        let take = || slot.lock().unwrap_or_else(|p| p.into_inner()).take();
        let started = std::thread::scope(|s| {
            let spawned = std::thread::Builder::new().name("fanstore-partcommit".into()).spawn_scoped(s, || {
                crate::outputs::dedup::lower_this_thread();
                let waited = crate::spare_core::wait(crate::spare_core::COMMIT_WAIT_MAX);
                log::debug!("a checkpoint's store commit waited {:.1} ms for a spare core", waited.as_secs_f64() * 1e3);
                if let Some(c) = take() {
                    c.run_here();
                }
            });
            match spawned {
                Ok(h) => {
                    let _ = h.join();
                    true
                }
                Err(e) => {
                    log::warn!("starting a thread for a checkpoint's store commit: {e}; it runs on the connection's thread");
                    false
                }
            }
        });
        if !started {
            if let Some(c) = take() {
                c.run_here();
            }
        }
    }

    fn run_here(self) {
        self.dedup.finish_parts(&self.path, self.id, &self.parts, &self.map);
    }
}

impl Outputs {
    /// CKPT_PUT: commits the parts file `fd` as output `path` (`flags`:
    /// COMMIT_EXCL; `mode`: permission bits of a new file).
    /// Returns the unit hashes for the reply and the store commit to run after it.
    pub fn ckpt_put(&self, path: &[u8], fd: OwnedFd, flags: u64, mode: u32, caller: &Caller) -> Result<(UnitHashes, PartsCommit), i32> {
        let excl = flags & wire::COMMIT_EXCL != 0;
        let dedup = self.dedup.get().ok_or(libc::ENOTSUP)?.clone();
        if path.is_empty() {
            return Err(libc::EEXIST);
        }
        if self.rank.view.lookup(path).is_some() {
            return Err(if excl { libc::EEXIST } else { libc::EROFS });
        }
        let (path, dir) = self.real_entry_in(path)?;
        if self.rank.view.lookup(&path).is_some() {
            return Err(if excl { libc::EEXIST } else { libc::EROFS });
        }
        self.may_write_at(&path, caller)?;
        let map = sealed_map(&fd)?;
        let parts = fanstore_ckpt::parts_file::decode(&map).map_err(|e| {
            log::warn!("rank {}: CKPT_PUT of '{}': {e}", self.rank.id.rank, String::from_utf8_lossy(&path));
            libc::EINVAL
        })?;
        let size = parts.skeleton.len() as u64;
        // A checkpoint from parts is stored whatever its size (below
        // --dedup-min only what the POSIX path keeps plain); --dedup off
        // (min u64::MAX: the store only serves what it holds) refuses it.
        if dedup.min == u64::MAX {
            return Err(libc::ENOTSUP);
        }
        let id = self.out_seq.fetch_add(1, Relaxed);
        if id >= OUT_BIT as u64 {
            return Err(libc::ENOSPC);
        }
        let hashes = dedup.check_and_begin_parts(&path, id, &parts, &map)?;
        let undo = || dedup.cancel_parts(id);
        let now = now_ns();
        let (gid, mode) = crate::outputs::namespace::inherited(caller, dir.as_ref(), libc::S_IFREG | (mode & 0o7777));
        let sum = parts.file_xxh3;
        let rec = OutRecord { size, mode, holder: self.rank.id.rank, mtime_ns: now, id, sum, atime_ns: now, ctime_ns: now, uid: caller.uid, gid, ino: wire::ino_of_path(&path), nlink: 0 };
        let staged = path.clone();
        // A symlink at the name: the checkpoint goes to its target, as open(2) follows it.
        let (path, replaced) = match self.put_held(&path, rec, excl) {
            Err(libc::ELOOP) if !excl => match self.lookup(&path, true) {
                Ok(Looked::Output { rec: r, .. }) if r.is_dir() => Err(libc::EISDIR),
                Ok(Looked::Output { path: p, .. }) => Ok(p),
                Ok(Looked::Input { .. }) => Err(libc::EROFS),
                Ok(Looked::Outside(_)) => Err(libc::EXDEV),
                Err(libc::ENOENT) => self.real_dangling(&path),
                Err(e) => Err(e),
            }
            .and_then(|p| self.put_held(&p, OutRecord { ino: wire::ino_of_path(&p), ..rec }, excl).map(|r| (p, r))),
            other => other.map(|r| (path.clone(), r)),
        }
        .inspect_err(|_| undo())?;
        dedup.settle(id, &path);
        let commit = PartsCommit { dedup: dedup.clone(), path: staged, id, parts, map };
        self.shared_commits.lock().unwrap_or_else(|p| p.into_inner()).forget(&path);
        if let Err(e) = self.link(&path, wire::KIND_FILE, true) {
            commit.run(); // the record is there: its bytes must be too
            return Err(e);
        }
        self.rank.counters.outputs.fetch_add(1, Relaxed);
        self.publish(Kind::Close, &path, b"", false, replaced, Some(&rec));
        Ok((hashes, commit))
    }

    /// A caller that is not root may write an existing file at `path`, or
    /// add a name in its directory.
    fn may_write_at(&self, path: &[u8], caller: &Caller) -> Result<(), i32> {
        if caller.is_root() {
            return Ok(());
        }
        match self.get_record(path) {
            Ok((rec, _)) if !caller.may(&rec, Access::WRITE) => Err(libc::EACCES),
            Ok(_) => Ok(()),
            Err(libc::ENOENT) => self.check_add(caller, path),
            Err(e) => Err(e),
        }
    }

    /// Registers held output `rec` at `path`: its sidecar here, then its
    /// record at the owner (as COMMIT does). Ok(true) when it replaced an
    /// earlier version.
    fn put_held(&self, path: &[u8], rec: OutRecord, excl: bool) -> Result<bool, i32> {
        use crate::outputs::namespace::owner::PUT_KEEP_OWNER;
        self.write_sidecar(path, &rec)?;
        let flags = if excl { wire::COMMIT_EXCL } else { PUT_KEEP_OWNER };
        self.put_with(path, rec, flags).inspect_err(|_| {
            let _ = std::fs::remove_file(self.out_dir().join(format!("{}.rec", rec.id)));
        })
    }
}

/// A read-only map of the parts file `fd`, which must be a memfd sealed
/// against writes and shrinking (EINVAL otherwise: its bytes could change
/// under the commit).
fn sealed_map(fd: &OwnedFd) -> Result<memmap2::Mmap, i32> {
    // SAFETY: fcntl(F_GET_SEALS) on a descriptor we own; it only reads flags.
    let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
    let need = libc::F_SEAL_WRITE | libc::F_SEAL_SHRINK;
    if seals < 0 || seals & need != need {
        return Err(libc::EINVAL);
    }
    // SAFETY: the seals forbid every write and shrink of the memfd from now
    // on, so the mapped bytes cannot change or vanish while mapped.
    unsafe { memmap2::Mmap::map(fd) }.map_err(|_| libc::EINVAL)
}
