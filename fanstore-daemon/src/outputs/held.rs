//! The bytes of outputs on the daemon side: COMMIT and OUT_OPEN, the files
//! and sidecars this rank holds, their drain to `--persist` and their
//! recovery after a kill. Names, records, directories and renames are
//! [`crate::outputs::namespace`]'s: this module stores bytes, then registers them
//! there (`crate::outputs::Outputs::put_record`), and asks it where a path leads before it
//! opens one ([`crate::outputs::Outputs::lookup`]).
//!
//! COMMIT: the bytes go into the checkpoint store ([`crate::outputs::dedup`]) when
//! they are at least `--dedup-min` bytes (the client's unnamed local file
//! that nothing can write any more is linked as a plain output first and
//! stored behind the close, by the store's commit worker); otherwise the client's unnamed
//! local file is linked at `<local>/out/<id>` (a memfd is copied there;
//! fsynced with `--fsync-outputs`). Then the record (size, mode, mtime,
//! holder = this rank, id, xxh3) is put at the metadata owner, then the name
//! is added to the listing of its parent at the parent's owner. The client's
//! close returns after both acknowledgements: from then on any stat on any
//! node (which asks the owner) sees the whole file. A failed write (ENOSPC,
//! EIO) registers nothing. A replaced output's old bytes are deleted: here,
//! or by the holder when asked (HOLDER_DROP over MPI).

use crate::caller::Caller;
use crate::ids::OUT_BIT;
use crate::memfd::MemfdBuilder;
use crate::fdio::io_errno;
use crate::outputs::held_files::drop_held;
use crate::outputs::names::{now_ns, parent};
use crate::outputs::names::Looked;
use crate::outputs::Outputs;
use fanstore_core::checksum::xxh3;
use fanstore_core::watchev::Kind;
use fanstore_core::wire::{self, OutRecord};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::sync::atomic::Ordering::Relaxed;
/// Gives an output's fd the mode and modification time of its record, so
/// fstat of it agrees with stat of the path (tar -c, rsync and cp -p read
/// them from the fd). Best effort: the bytes are what matters.
fn stamp(fd: &OwnedFd, rec: &OutRecord) {
    let ts = |ns: i64| libc::timespec { tv_sec: ns.div_euclid(1_000_000_000), tv_nsec: ns.rem_euclid(1_000_000_000) };
    let times = [ts(rec.atime_ns), ts(rec.mtime_ns)];
    // SAFETY: fchmod/futimens on an fd we own; times is two valid timespecs.
    unsafe {
        // (Owner read stays: the holder must still open its file to serve it.)
        libc::fchmod(fd.as_raw_fd(), (rec.mode & 0o7777) | 0o400);
        libc::futimens(fd.as_raw_fd(), times.as_ptr());
    }
}
/// Free bytes under which the local disk counts as full at a commit.
const FULL_DISK: u64 = 64 << 10;

impl Outputs {
    pub fn out_dir(&self) -> PathBuf {
        self.rank.id.local_dir.join("out")
    }

    fn out_file(&self, id: u64) -> PathBuf {
        self.out_dir().join(id.to_string())
    }

    /// Names held output `rec` `path` in the held journal, so a restart
    /// with the same `--local` can register it again ([`crate::outputs::Outputs::recover`]).
    pub(crate) fn write_sidecar(&self, path: &[u8], rec: &OutRecord) -> Result<(), i32> {
        self.held.set(path, rec, self.fsync_outputs.load(Relaxed))
    }

    /// Deletes what this rank holds of output `id`.
    pub(crate) fn drop_held_here(&self, id: u64) {
        drop_held(self.dedup.get().map(|d| &**d), &self.held, &self.out_dir(), id);
    }

    /// Registers held output `rec` under `path`: its sidecar here, then
    /// its record at the owner (ELOOP: a symlink is there). Ok(true) when
    /// it replaced an earlier version.
    fn put_record(&self, path: &[u8], rec: OutRecord, excl: bool) -> Result<bool, i32> {
        use crate::outputs::namespace::owner::PUT_KEEP_OWNER;
        self.write_sidecar(path, &rec)?;
        let flags = if excl { wire::COMMIT_EXCL } else { PUT_KEEP_OWNER };
        self.put_with(path, rec, flags).inspect_err(|_| self.held.drop_output(rec.id))
    }

    /// COMMIT: stores the bytes of `fd`, then registers `path` with its
    /// owner; `flags`: the request's COMMIT_EXCL and COMMIT_SOLE bits. `fd`
    /// is closed before this returns (the store keeps at most a read-only
    /// reopening of it).
    ///
    /// A new file belongs to `caller`; a new version of an existing one
    /// keeps its owner and group (the owner rank keeps them).
    pub fn commit(&self, path: &[u8], fd: OwnedFd, flags: u64, mode: u32, caller: &Caller) -> Result<(), i32> {
        let excl = flags & wire::COMMIT_EXCL != 0;
        if path.is_empty() {
            return Err(libc::EEXIST);
        }
        if self.rank.view.lookup(path).is_some() {
            return Err(if excl { libc::EEXIST } else { libc::EROFS });
        }
        let (path, dir) = match self.real_entry_in(path) {
            // Its directory was renamed while the file was open: as natively,
            // the file is in the directory under its new name.
            Err(libc::ENOENT) => match self.meta.lock().unwrap_or_else(|p| p.into_inner()).moved(path) {
                Some(p) => self.real_entry_in(&p)?,
                None => return Err(libc::ENOENT),
            },
            other => other?,
        };
        let path = &path;
        if self.rank.view.lookup(path).is_some() {
            return Err(if excl { libc::EEXIST } else { libc::EROFS });
        }
        let id = self.out_seq.fetch_add(1, Relaxed);
        if id >= OUT_BIT as u64 {
            return Err(libc::ENOSPC);
        }
        let src = std::fs::File::from(fd);
        let meta = src.metadata().map_err(|_| libc::EIO)?;
        let file_id = {
            use std::os::unix::fs::MetadataExt;
            (meta.dev(), meta.ino())
        };
        if flags & wire::COMMIT_LATE != 0 && !self.late_commit_due(path, file_id) {
            return Ok(());
        }
        let size = meta.len();
        // The file's own modification and access times: its last write, or
        // what the program set with futimens before closing (tar, cp -p, rsync).
        let (mtime_ns, atime_ns) = {
            use std::os::unix::fs::MetadataExt;
            (meta.mtime() * 1_000_000_000 + meta.mtime_nsec(), meta.atime() * 1_000_000_000 + meta.atime_nsec())
        };
        let dedup = self.dedup.get().filter(|d| size >= d.min);
        // Before any mapping of ours: a shared mapping of this read-write fd
        // would count as writable and block the seal.
        let sealed = dedup.is_some() && size > 0 && seal_memfd(&src);
        let unnamed = self.unnamed_local(&src);
        // The client's unnamed file that nothing can write any more: its
        // writer found no other writer at its last close and sent a
        // read-only description of it (COMMIT_SOLE).
        let sole = unnamed && (flags & wire::COMMIT_SOLE != 0 || flags & wire::COMMIT_MADE_AHEAD != 0 && self.sole_once_handed_over(&src, file_id.1));
        // Stored behind the close (see crate::outputs::dedup): the commit
        // worker reads every byte and hashes the file then; the close
        // neither maps nor hashes it (SUM_PENDING until the worker has).
        // The sum may go to another rank's record: a stop that drains waits
        // for it while the ranks still answer each other
        // (crate::comm::Engine::shutdown, Dedup::sums_settled).
        let behind = dedup.is_some() && sole && size > 0;
        let map = if size > 0 && !behind {
            // SAFETY: the client handed us its output file at its last close
            // and no longer writes it (the plain path keeps and serves this
            // same file; the store keeps it as a hot copy only when nothing
            // can write it, COMMIT_SOLE); the mapping is read-only and
            // private, and with dedup it may live on as the hot copy.
            Some(std::sync::Arc::new(unsafe { memmap2::MmapOptions::new().populate().map(&src) }.map_err(|_| libc::EIO)?))
        } else {
            None
        };
        let bytes: &[u8] = map.as_deref().map_or(&[], |m| &m[..]);
        std::fs::create_dir_all(self.out_dir()).map_err(|e| io_errno(&e))?;
        if unnamed && self.local_disk_full() {
            return Err(libc::ENOSPC);
        }
        let file = self.out_file(id);
        let undo = || drop_held(dedup.map(|d| &**d), &self.held, &self.out_dir(), id);
        // A file handed over for good (the client's unnamed local file that
        // nothing can write, or its memfd once sealed against writes): the
        // store keeps its mapping as a hot copy and reads are served from
        // the file itself.
        let handed = match (&map, dedup) {
            (Some(m), Some(_)) if sealed && !sole => {
                src.try_clone().ok().map(|f| (OwnedFd::from(f), std::sync::Arc::clone(m)))
            }
            _ => None,
        };
        let sum = match (dedup, handed) {
            // Stored behind the close: a plain output until the commit worker has it.
            (Some(d), None) if behind => {
                let fd = src.try_clone().map_err(|e| io_errno(&e))?;
                self.link_plain(&src, &file).inspect_err(|_| undo())?;
                d.enqueue(path, id, OwnedFd::from(fd), size, None, file.clone());
                wire::SUM_PENDING
            }
            (Some(d), Some((file, m))) => d.stage_handed(path, id, file, m, !unnamed)?.file_xxh3,
            (Some(d), None) => d.stage(path, id, bytes)?.file_xxh3,
            (None, _) => self.store_plain(&src, sole, bytes, &file).inspect_err(|_| undo())?,
        };
        // (A new version of an existing file keeps its owner and group: PUT_KEEP_OWNER.)
        let (gid, mode) = crate::outputs::namespace::inherited(caller, dir.as_ref(), libc::S_IFREG | (mode & 0o7777));
        let uid = caller.uid;
        let rec = OutRecord { size, mode, holder: self.rank.id.rank, mtime_ns, id, sum, atime_ns, ctime_ns: now_ns(), uid, gid, ino: wire::ino_of_path(path), nlink: 0 };
        // A symlink at the name: the bytes go to its target (as open(2)
        // follows it), which must then be a file or nothing in a directory.
        let (path, replaced) = &match self.put_record(path, rec, excl) {
            Err(libc::ELOOP) if !excl => match self.lookup(path, true) {
                Ok(Looked::Output { rec: r, .. }) if r.is_dir() => Err(libc::EISDIR),
                Ok(Looked::Output { path: p, .. }) => Ok(p),
                Ok(Looked::Input { .. }) => Err(libc::EROFS),
                Ok(Looked::Outside(_)) => Err(libc::EXDEV),
                Err(libc::ENOENT) => self.real_dangling(path),
                Err(e) => Err(e),
            }
            .and_then(|p| self.put_record(&p, OutRecord { ino: wire::ino_of_path(&p), ..rec }, excl).map(|r| (p, r))),
            other => other.map(|r| (path.clone(), r)),
        }
        .inspect_err(|_| undo())?;
        if let Some(d) = dedup {
            d.settle(id, path);
        }
        {
            let mut shared = self.shared_commits.lock().unwrap_or_else(|p| p.into_inner());
            if sole {
                shared.forget(path);
            } else {
                shared.note(path, file_id, id);
            }
        }
        self.link(path, wire::KIND_FILE, true)?;
        self.rank.counters.outputs.fetch_add(1, Relaxed);
        self.publish(Kind::Close, path, b"", false, *replaced, Some(&rec));
        Ok(())
    }

    /// The commit worker hashed output `id`, closed with its sum pending
    /// (`wire::SUM_PENDING`): its held entry and its record at the owner
    /// get the sum (the record only while it is still that output).
    pub fn settle_sum(&self, id: u64, sum: u64) {
        use crate::outputs::namespace::owner::mop;
        let mut pause = std::time::Duration::from_millis(5);
        for _ in 0..10 {
            // None: dropped meanwhile.
            let Some(path) = self.held.set_sum(id, sum) else { return };
            let set = |key: &[u8]| {
                let mut payload = Vec::with_capacity(16 + key.len());
                payload.extend_from_slice(&sum.to_le_bytes());
                payload.extend_from_slice(&id.to_le_bytes());
                payload.extend_from_slice(key);
                self.meta_at(key, mop::SET_SUM, 0, payload).map(|_| ())
            };
            match set(&path) {
                // A hard-linked file: its sum is in its shared record.
                Err(libc::EMLINK) => match self.linked_key_of(&path) {
                    Ok(key) => match set(&key) {
                        Ok(()) | Err(libc::ESTALE) => return,
                        Err(_) => {}
                    },
                    Err(_) => {}
                },
                // ESTALE: a newer version is there, or the sum is set.
                Ok(()) | Err(libc::ESTALE) => return,
                // Renamed meanwhile: the held entry has its new name (a
                // rename on another node reaches it as HOLDER_RENAME, soon).
                Err(libc::ENOENT) => {
                    std::thread::sleep(pause);
                    pause *= 2;
                }
                Err(e) => {
                    log::warn!("rank {}: setting the sum of output {id} ('{}'): errno {e}", self.rank.id.rank, String::from_utf8_lossy(&path));
                    return;
                }
            }
        }
    }

    /// Whether a late commit (COMMIT_LATE) of `file` at `path` is a new
    /// version: the path's current version was committed here from that
    /// same file while it was still being written ([`SharedCommits`]).
    fn late_commit_due(&self, path: &[u8], file: (u64, u64)) -> bool {
        let noted = self.shared_commits.lock().unwrap_or_else(|p| p.into_inner()).id_from(path, file);
        let Some(id) = noted else { return false };
        matches!(self.get_record(path), Ok((rec, _)) if rec.id == id && rec.holder == self.rank.id.rank)
    }

    /// Keeps the bytes of `src` at `file` (fsynced with `--fsync-outputs`):
    /// their xxh3. `link`: `src` is the client's unnamed file on the local
    /// disk and nothing can write it any more (COMMIT_SOLE), so it is linked
    /// there; anything else (a memfd, a file something may still write) is
    /// copied, so that what readers get is what was committed.
    fn store_plain(&self, src: &std::fs::File, link: bool, bytes: &[u8], file: &std::path::Path) -> Result<u64, i32> {
        if link {
            self.link_plain(src, file)?;
            return Ok(xxh3(bytes));
        }
        let write = || -> std::io::Result<()> {
            use std::io::Write;
            let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(file)?;
            f.write_all(bytes)?;
            if self.fsync_outputs.load(Relaxed) {
                f.sync_all()?;
            }
            Ok(())
        };
        write().map_err(|e| {
            log::warn!("rank {}: storing an output at {}: {e}", self.rank.id.rank, file.display());
            io_errno(&e)
        })?;
        Ok(xxh3(bytes))
    }

    /// Links `src`, the client's unnamed local file that nothing can write
    /// any more, at `file` (fsynced with `--fsync-outputs`).
    fn link_plain(&self, src: &std::fs::File, file: &std::path::Path) -> Result<(), i32> {
        self.link_unnamed(src, file)?;
        if self.fsync_outputs.load(Relaxed) {
            src.sync_all().map_err(|e| io_errno(&e))?;
        }
        Ok(())
    }

    /// Is `src` the client's unnamed file (O_TMPFILE) on the local disk?
    fn unnamed_local(&self, src: &std::fs::File) -> bool {
        use std::os::unix::fs::MetadataExt;
        let (Ok(m), Ok(out)) = (src.metadata(), std::fs::metadata(self.out_dir())) else { return false };
        m.file_type().is_file() && m.nlink() == 0 && m.dev() == out.dev()
    }

    /// A file made ahead here whose client could not prove it sole: once
    /// this daemon's fd of it is closed, is it? A read lease is granted
    /// only when no description of the file is open for writing.
    fn sole_once_handed_over(&self, src: &std::fs::File, ino: u64) -> bool {
        use std::os::fd::AsRawFd;
        let Some(p) = self.new_files.get() else { return false };
        if !p.wait_handed_over(ino, std::time::Duration::from_secs(1)) {
            return false;
        }
        // SAFETY: lease commands on a read-only fd of ours, taken and given back.
        unsafe {
            if libc::fcntl(src.as_raw_fd(), libc::F_SETLEASE, libc::F_RDLCK) != 0 {
                return false;
            }
            libc::fcntl(src.as_raw_fd(), libc::F_SETLEASE, libc::F_UNLCK);
        }
        true
    }

    /// Is the local disk (nearly) full? A program's write into its unnamed
    /// local file may then have failed, and a file cut short must not
    /// become visible: its commit is ENOSPC.
    fn local_disk_full(&self) -> bool {
        let Ok(dir) = std::ffi::CString::new(self.out_dir().as_os_str().as_encoded_bytes()) else { return false };
        // SAFETY: statvfs is plain data; all-zero is a valid value.
        let mut vfs: libc::statvfs = unsafe { std::mem::zeroed() };
        // SAFETY: dir is NUL-terminated and vfs a valid out-pointer.
        let r = unsafe { libc::statvfs(dir.as_ptr(), &mut vfs) };
        r == 0 && (vfs.f_bfree as u64).saturating_mul(vfs.f_frsize as u64) < FULL_DISK
    }

    /// Links the client's unnamed local file `src` at `file` (no copy).
    fn link_unnamed(&self, src: &std::fs::File, file: &std::path::Path) -> Result<(), i32> {
        crate::fdio::link_unnamed(src, file).map_err(|e| {
            log::warn!("rank {}: linking an output at {}: {e}", self.rank.id.rank, file.display());
            io_errno(&e)
        })
    }

    /// OUT_OPEN: an fd with the bytes of output `path`.
    ///
    /// A caller that is not root needs read permission, or write
    /// permission with `to_write` (wire::OUT_OPEN_TO_WRITE).
    pub fn out_open(&self, path: &[u8], to_write: bool, caller: &Caller) -> Result<OwnedFd, i32> {
        self.check_search(caller, path)?;
        let (fd, rec) = self.out_open_bytes(path)?;
        let want = if to_write { crate::caller::Access::WRITE } else { crate::caller::Access::READ };
        if !caller.is_root() && rec.holder != crate::outputs::persist::PERSISTED && !caller.may(&rec, want) {
            return Err(libc::EACCES);
        }
        if rec.holder != crate::outputs::persist::PERSISTED {
            stamp(&fd, &rec);
        }
        Ok(fd)
    }

    /// OUT_STAT with `wire::STAT_OPEN`: the answer of
    /// [`Outputs::out_stat_answer`] and, when it names a committed regular
    /// output (not an input, not special) that `caller` may read, an fd
    /// with its bytes (None otherwise, or if its bytes went meanwhile: the
    /// client then asks OUT_OPEN).
    pub fn out_stat_open(&self, path: &[u8], flags: u64, caller: &Caller) -> (Result<Vec<u8>, (i32, Vec<u8>)>, Option<OwnedFd>) {
        let answer = self.out_stat_answer(path, flags, caller);
        let Ok(payload) = &answer else { return (answer, None) };
        let Some(a) = wire::StatAnswer::decode(payload) else { return (answer, None) };
        let rec = a.rec;
        let plain = rec.mode & libc::S_IFMT == libc::S_IFREG && rec.holder != u32::MAX - 1 && !rec.is_linked_name();
        if !plain || !(caller.is_root() || caller.may(&rec, crate::caller::Access::READ)) {
            return (answer, None);
        }
        let real = if a.resolved.is_empty() { path } else { a.resolved };
        let fd = self.open_held(real, &rec).ok();
        if let Some(fd) = &fd {
            if rec.holder != crate::outputs::persist::PERSISTED {
                stamp(fd, &rec);
            }
        }
        (answer, fd)
    }

    /// The fd with the bytes of output `path`, and its record. A version
    /// replaced between the lookup and the open (its bytes already dropped)
    /// is looked up again: the open gets the newer one.
    fn out_open_bytes(&self, path: &[u8]) -> Result<(OwnedFd, OutRecord), i32> {
        let mut tries = 0;
        loop {
            let (path, rec) = match self.lookup(path, true)? {
                Looked::Output { path, rec, .. } => (path, rec),
                Looked::Input { node, .. } => {
                    return Ok((self.inputs.open(u64::from(node), self.rank.view.dataset_id(), None)?.ok_or(libc::EIO)?, OutRecord { holder: crate::outputs::persist::PERSISTED, ..Default::default() }))
                }
                Looked::Outside(_) => return Err(libc::EXDEV),
            };
            match self.open_held(&path, &rec) {
                Err(libc::ENOENT) if tries < 8 => tries += 1,
                other => return other.map(|fd| (fd, rec)),
            }
        }
    }

    /// The bytes of output `rec` (named `path`): from --persist, this
    /// rank's files or store, or fetched from its holder.
    fn open_held(&self, path: &[u8], rec: &OutRecord) -> Result<OwnedFd, i32> {
        let rec = *rec;
        if rec.is_dir() {
            return Err(libc::EISDIR);
        }
        // A FIFO or a socket has no bytes: opening its object could block
        // (a FIFO without a writer). Clients open it themselves on its node.
        if rec.is_special() {
            return Err(libc::ENXIO);
        }
        if rec.holder == crate::outputs::persist::PERSISTED {
            let dir = self.persist.get().ok_or(libc::EIO)?;
            if !crate::outputs::persist::data_path(dir, &rec).exists() {
                return self.open_drained_checkpoint(dir, path, &rec);
            }
            return std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_CLOEXEC)
                .open(crate::outputs::persist::data_path(dir, &rec))
                .map(OwnedFd::from)
                .map_err(|e| {
                    log::error!("rank {}: persisted output '{}': {e}", self.rank.id.rank, String::from_utf8_lossy(path));
                    libc::EIO
                });
        }
        if rec.holder == self.rank.id.rank {
            let plain = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_CLOEXEC).open(self.out_file(rec.id));
            return match (plain, self.dedup.get()) {
                (Ok(f), _) => Ok(OwnedFd::from(f)),
                // One rebuilt copy per node, shared by every process that
                // opens it (all the ranks of a node loading the checkpoint to
                // resume); a new version is a new output id, so a cached copy
                // is never served for it.
                // A hot copy (the file the checkpoint was committed from)
                // is served as it is, not through the cache: the cache would
                // keep the first fd (a memfd the store moves to the local
                // disk in the background) and count its bytes again.
                (Err(_), Some(d)) if d.holds(rec.id) => match d.open_hot(rec.id) {
                    Some(fd) => fd,
                    None => self
                        .cache
                        .get_or_load(OUT_BIT | rec.id as u32, self.rank.remote_timeout, libc::EIO, || {
                            d.open_output(rec.id, rec.size, rec.sum).map(|fd| (std::sync::Arc::new(fd), rec.size))
                        })
                        .and_then(|shared| crate::fdio::reopen(&shared)),
                },
                (Err(_), _) => Err(libc::ENOENT), // replaced or removed meanwhile
            };
        }
        // One copy per node, shared by every process that opens it ([`crate::outputs::remote_out`]).
        self.open_remote_output(path, &rec)
    }

    /// A checkpoint drained by a rank this job does not have (it ran with
    /// fewer ranks), read in place from `--persist`.
    fn open_drained_checkpoint(&self, dir: &std::path::Path, path: &[u8], rec: &OutRecord) -> Result<OwnedFd, i32> {
        let name = String::from_utf8_lossy(path);
        let cats = crate::outputs::dedup::persisted_catalogs(dir).map_err(|e| {
            log::error!("rank {}: persisted output '{name}': {e}", self.rank.id.rank);
            libc::EIO
        })?;
        let rank = *cats.get(path).ok_or_else(|| {
            log::error!("rank {}: persisted output '{name}': its bytes are in no drained store", self.rank.id.rank);
            libc::EIO
        })?;
        let bytes = crate::outputs::dedup::open_drained(dir, rank).and_then(|s| s.read(path)).map_err(|e| {
            log::error!("rank {}: persisted output '{name}': {e}", self.rank.id.rank);
            crate::outputs::dedup::errno_of(&e)
        })?;
        if bytes.len() as u64 != rec.size || xxh3(&bytes) != rec.sum {
            log::error!("rank {}: persisted output '{name}' differs from its record", self.rank.id.rank);
            return Err(libc::EIO);
        }
        let m = MemfdBuilder::unmapped(&format!("fanstore:out:{}", rec.id), rec.size).map_err(|_| libc::ENOMEM)?;
        m.write_at(&bytes, 0).map_err(|_| libc::EIO)?;
        m.seal().map_err(|_| libc::EIO)
    }

}

impl Outputs {
    /// Loads the records drained to `dir` by an earlier job: those this rank
    /// owns now, and the listings of the directories it owns. Returns how
    /// many records it keeps.
    pub fn load_persisted(&self, dir: &std::path::Path) -> Result<usize, crate::outputs::persist::PersistError> {
        let all = crate::outputs::persist::read_all(dir)?;
        let stores = crate::outputs::dedup::persisted_catalogs(dir)
            .map_err(|e| crate::outputs::persist::PersistError::Io(dir.join(crate::outputs::dedup::STORE_DIR), std::io::Error::other(e.to_string())))?;
        let mut m = self.meta.lock().unwrap_or_else(|p| p.into_inner());
        let mut n = 0;
        for (path, mut rec) in all {
            if self.rank.view.lookup(&path).is_some() {
                continue; // an input of this dataset now: inputs win
            }
            if !rec.is_dir() && !rec.is_linked_name() {
                rec.holder = crate::outputs::persist::PERSISTED;
                // A checkpoint drained with rank s's store is held by rank s
                // again (which copied that store back at start).
                if let Some(&s) = stores.get(&path).filter(|_| !crate::outputs::persist::data_path(dir, &rec).exists()) {
                    if s >= self.rank.id.nranks {
                        log::warn!(
                            "rank {}: '{}' was drained by rank {s} of a larger job: only `fanstore export` can read it",
                            self.rank.id.rank,
                            String::from_utf8_lossy(&path)
                        );
                    } else {
                        rec.holder = s;
                        if s == self.rank.id.rank && !self.dedup.get().is_some_and(|d| d.claim(rec.id, &path)) {
                            log::warn!("rank {}: the drained store has no checkpoint '{}'", self.rank.id.rank, String::from_utf8_lossy(&path));
                        }
                        if s == self.rank.id.rank {
                            self.out_seq.fetch_max(rec.id + 1, Relaxed);
                        }
                    }
                }
            }
            if self.owner(&path) == self.rank.id.rank {
                if rec.is_link() {
                    // The owner keeps a symlink's target beside its record.
                    let file = crate::outputs::persist::data_path(dir, &rec);
                    let target = std::fs::read(&file).map_err(|e| crate::outputs::persist::PersistError::Io(file.clone(), e))?;
                    if target.len() as u64 != rec.size || xxh3(&target) != rec.sum {
                        return Err(crate::outputs::persist::PersistError::Data(file, String::from_utf8_lossy(&path).into_owned()));
                    }
                    m.insert_link(&path, rec, &target);
                } else {
                    m.insert(&path, rec);
                }
                n += 1;
            }
            if fanstore_core::wire::is_linked_key(&path) {
                continue; // a hard-linked file's shared record: no name, no listing
            }
            let (d, name) = parent(&path);
            if self.owner(d) == self.rank.id.rank {
                m.add_child(d, name, rec.kind());
            }
            // Every rank reads every record: each marks its own tier map.
            if let Some(id) = self.input_dir(d) {
                self.mark_input_dir_here(id);
            }
        }
        Ok(n)
    }

    /// Drains to `dir`: the output bytes this rank holds, then the records it
    /// owns (files now held by `dir`). Returns (files copied, records).
    pub fn drain(&self, dir: &std::path::Path) -> Result<(usize, usize), crate::outputs::persist::PersistError> {
        let files = self.drain_data(dir)?;
        let recs = self.drain_meta(dir, false)?;
        Ok((files, recs))
    }

    /// Seconds [`crate::outputs::Outputs::drain`] may take here, at a pessimistic rate for a
    /// busy shared file system (200 files/s and 50 MB/s, measured here at
    /// ~7,000 files/s and ~1 GB/s to the local disk): the output files this
    /// rank holds and its checkpoint store, at most a day.
    pub fn drain_estimate_secs(&self) -> i32 {
        fn walk(dir: &std::path::Path, files: &mut u64, bytes: &mut u64) {
            let Ok(rd) = std::fs::read_dir(dir) else { return };
            for e in rd.flatten() {
                match e.file_type() {
                    Ok(t) if t.is_dir() => walk(&e.path(), files, bytes),
                    Ok(_) => {
                        *files += 1;
                        *bytes += e.metadata().map_or(0, |m| m.len());
                    }
                    Err(_) => {}
                }
            }
        }
        let (mut files, mut bytes) = (0, 0);
        walk(&self.out_dir(), &mut files, &mut bytes);
        i32::try_from((files / 200 + bytes / (50 << 20)).min(86_400)).unwrap_or(86_400)
    }

    /// Copies every output file this rank holds into `dir` (content-addressed),
    /// and its checkpoint store; returns the outputs drained.
    pub fn drain_data(&self, dir: &std::path::Path) -> Result<usize, crate::outputs::persist::PersistError> {
        if let Some(d) = self.dedup.get() {
            d.wait_committed(); // queued checkpoints go in as deduplicated, not as plain files
        }
        let mut files = 0;
        let mut unsynced = 0;
        if let Ok(rd) = std::fs::read_dir(self.out_dir()) {
            for e in rd.flatten() {
                if e.path().extension().is_some() || !e.file_type().is_ok_and(|t| t.is_file()) {
                    continue; // sidecars, the checkpoint store, FIFOs and sockets (no bytes)
                }
                let known = e.file_name().to_str().and_then(|n| n.parse().ok()).and_then(|id| self.held.get(id)).map(|(_, rec)| (rec.size, rec.sum)).filter(|&(_, sum)| sum != wire::SUM_PENDING);
                crate::outputs::persist::drain_file(dir, &e.path(), known, &mut unsynced)?;
                files += 1;
                if unsynced >= crate::outputs::persist::UNSYNCED_MAX {
                    crate::outputs::persist::flush(dir)?;
                    unsynced = 0;
                }
            }
        }
        if unsynced > 0 {
            crate::outputs::persist::flush(dir)?; // before the index names them (drain_meta)
        }
        if let Some(d) = self.dedup.get() {
            let dst = crate::outputs::dedup::drained_dir(dir, self.rank.id.rank);
            files += d.drain_to(&dst).map_err(|e| crate::outputs::persist::PersistError::Io(dst, e))?;
        }
        Ok(files)
    }

    /// Writes the records this rank owns to `dir`; with `only_present`, only
    /// files whose bytes are already there (a sync racing with commits).
    pub fn drain_meta(&self, dir: &std::path::Path, only_present: bool) -> Result<usize, crate::outputs::persist::PersistError> {
        let mut recs = self.meta.lock().unwrap_or_else(|p| p.into_inner()).all();
        if only_present {
            let drained = crate::outputs::dedup::persisted_catalogs(dir).unwrap_or_default();
            recs.retain(|(p, r)| r.is_dir() || r.is_linked_name() || crate::outputs::persist::data_path(dir, r).exists() || drained.contains_key(p));
        }
        // (A hard-linked file's names stay pointers to its shared record,
        // which is drained like any file's.)
        for (_, r) in recs.iter_mut() {
            if !r.is_dir() && !r.is_linked_name() {
                r.holder = crate::outputs::persist::PERSISTED;
            }
        }
        recs.sort_by(|a, b| a.0.cmp(&b.0));
        crate::outputs::persist::write_index(dir, self.rank.id.rank, self.rank.id.nranks, &recs)?;
        Ok(recs.len())
    }
}

impl Outputs {
    /// Creates the output directories leading to `dir` that are missing
    /// (recovered files whose directories lived in a dead rank's memory).
    fn ensure_dirs(&self, dir: &[u8]) {
        if dir.is_empty() || self.rank.view.lookup(dir).is_some() {
            return;
        }
        self.ensure_dirs(parent(dir).0);
        match self.out_mkdir(dir, 0o755, &Caller::this_process()) {
            Ok(()) | Err(libc::EEXIST) => {}
            Err(e) => log::warn!("rank {}: recreating '{}': errno {e}", self.rank.id.rank, String::from_utf8_lossy(dir)),
        }
    }

    /// Registers again the outputs a killed earlier run of this rank held
    /// (moved aside to `from` at start): each `<id>` its held journal (or
    /// an older version's `<id>.rec`) names moves into this run's `out/` and is put at its owner (replacing
    /// nothing newer: an existing record wins). Returns how many.
    pub fn recover(&self, from: &std::path::Path) -> usize {
        let mut n = 0;
        for (path, mut rec) in crate::outputs::held_journal::recovered(from) {
            let data = from.join(rec.id.to_string());
            let id = self.out_seq.fetch_add(1, Relaxed);
            let dedup = self.dedup.get();
            let in_store = match dedup.and_then(|d| d.find_recovered(&path, rec.id)) {
                Some(key) if !data.exists() => dedup.is_some_and(|d| d.claim(id, &key)),
                _ => false,
            };
            if !in_store && (std::fs::create_dir_all(self.out_dir()).is_err() || std::fs::rename(&data, self.out_file(id)).is_err()) {
                continue;
            }
            rec.id = id;
            rec.holder = self.rank.id.rank;
            if rec.sum == wire::SUM_PENDING && !rec.is_dir() && !rec.is_link() && !rec.is_special() && rec.size > 0 {
                // Killed before its commit worker hashed it: hashed now.
                let mut h = HashingWriter(fanstore_core::checksum::StreamingChecksum::new());
                let read = match dedup.filter(|_| in_store) {
                    Some(d) => d.read_output(id, &mut h).ok(),
                    None => std::fs::File::open(self.out_file(id)).and_then(|mut f| std::io::copy(&mut f, &mut h)).ok(),
                };
                if read != Some(rec.size) {
                    drop_held(dedup.map(|d| &**d), &self.held, &self.out_dir(), id);
                    continue;
                }
                rec.sum = h.0.digest();
            }
            self.ensure_dirs(parent(&path).0);
            let put = || if rec.is_link() {
                match std::fs::read(self.out_file(id)) {
                    Ok(target) if xxh3(&target) == rec.sum => self.put_link(&path, rec, &target, wire::COMMIT_EXCL),
                    _ => Err(libc::EIO),
                }
            } else {
                self.put(&path, rec, true)
            };
            let ok = self.write_sidecar(&path, &rec).is_ok()
                && match put() {
                    Ok(_) => self.link(&path, rec.kind(), true).is_ok(),
                    Err(_) => false,
                };
            if ok {
                if let Some(d) = dedup.filter(|_| in_store) {
                    d.settle(id, &path);
                } else if let Some(d) = dedup.filter(|d| !rec.is_link() && !rec.is_dir() && !rec.is_special() && rec.size >= d.min) {
                    // Closed but not stored when the run was killed (its commit
                    // was queued behind the close): stored now, as then.
                    self.enqueue_recovered(d, &path, id);
                }
                n += 1;
            } else {
                drop_held(dedup.map(|d| &**d), &self.held, &self.out_dir(), id);
            }
        }
        let _ = std::fs::remove_dir_all(from);
        if let Some(d) = self.dedup.get() {
            let swept = d.sweep_unclaimed();
            if swept > 0 {
                log::info!("rank {}: {swept} checkpoints of a killed run were never registered: released", self.rank.id.rank);
            }
        }
        n
    }
}

impl Outputs {
    /// Queues the recovered plain output `id` (`out/<id>`, which only the
    /// daemon writes) for the checkpoint store's commit worker.
    fn enqueue_recovered(&self, d: &crate::outputs::dedup::Dedup, path: &[u8], id: u64) {
        let plain = self.out_file(id);
        let Ok(f) = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_CLOEXEC).open(&plain) else { return };
        let Some(len) = f.metadata().ok().map(|m| m.len()).filter(|&l| l > 0) else { return };
        // No sum passed: the store computes it from the file itself.
        d.enqueue(path, id, OwnedFd::from(f), len, None, plain);
        d.settle(id, path);
    }
}

/// A writer that only hashes what it is given.
struct HashingWriter(fanstore_core::checksum::StreamingChecksum);

impl std::io::Write for HashingWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.update(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Seals a client's output memfd against every write, shrink and growth;
/// false if it is not a sealable memfd or something still maps it writable
/// (then its bytes could still change, and it is not kept).
fn seal_memfd(f: &std::fs::File) -> bool {
    use std::os::fd::AsRawFd;
    let seals = libc::F_SEAL_WRITE | libc::F_SEAL_SHRINK | libc::F_SEAL_GROW;
    // SAFETY: fcntl on a descriptor we own; F_ADD_SEALS only changes the
    // file's seal set (EINVAL/EPERM/EBUSY when it cannot).
    unsafe { libc::fcntl(f.as_raw_fd(), libc::F_ADD_SEALS, seals) == 0 }
}
