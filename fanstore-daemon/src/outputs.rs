//! The write path on the daemon side: COMMIT, OUT_STAT, OUT_OPEN, OUT_LIST,
//! MKDIR, RMDIR, UNLINK, RENAME of outputs.
//!
//! COMMIT: the bytes go into the checkpoint store ([`crate::dedup`]) when
//! they are at least `--dedup-min` bytes; otherwise the client's unnamed
//! local file is linked at `<local>/out/<id>` (a memfd is copied there;
//! fsynced with `--fsync-outputs`). Then the record (size, mode, mtime,
//! holder = this rank, id, xxh3) is put at the metadata owner (rank
//! xxh3(path) mod N, [`crate::meta`]), then the name is added to the
//! listing of its parent at the parent's owner. The
//! client's close returns after both acknowledgements: from then on any
//! stat on any node (which asks the owner) sees the whole file. A failed
//! write (ENOSPC, EIO) registers nothing. A replaced output's old bytes are
//! deleted: here, or by the holder when asked (HOLDER_DROP over MPI).
//!
//! RENAME of a file: the record is put at the destination's owner (replacing
//! any file there), then removed at the source's owner (only if it is still
//! the same output), then the listings follow. Between the first and second
//! step both names show the same bytes; a reader never sees a missing or
//! partial destination. RENAME of a directory moves its whole tree with the
//! two-phase fenced move of [`crate::meta`].

use crate::comm::{Command, MetaCall, MetaServer, OUT_BIT};
use crate::memfd::MemfdBuilder;
use crate::meta::mop;
use crate::node::Node;
use fanstore_core::checksum::xxh3;
use fanstore_core::watchev::Kind;
use fanstore_core::wire::{self, OutRecord, Reply, Request};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// Free bytes under which the local disk counts as full at a commit.
const FULL_DISK: u64 = 64 << 10;

/// How long a metadata request to another rank may take.
const META_TIMEOUT: Duration = Duration::from_secs(10);

static META_IDS: AtomicU64 = AtomicU64::new(1);

pub(crate) fn parent(path: &[u8]) -> (&[u8], &[u8]) {
    match path.iter().rposition(|&b| b == b'/') {
        Some(i) => (&path[..i], &path[i + 1..]),
        None => (&[], path),
    }
}

fn io_errno(e: &std::io::Error) -> i32 {
    match e.raw_os_error() {
        Some(libc::ENOSPC) => libc::ENOSPC,
        Some(libc::EDQUOT) => libc::EDQUOT,
        _ => libc::EIO,
    }
}

fn now_ns() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as i64)
}

impl MetaServer for Node {
    fn handle_meta(&self, msg: &[u8]) -> Vec<u8> {
        match Request::decode(msg) {
            Ok(req) if req.op == mop::HOLDER_DROP || req.op == mop::HOLDER_RENAME => {
                // Store work does not belong on the communication thread.
                let (dedup, out, fsync) = (self.dedup.get().cloned(), self.out_dir(), self.fsync_outputs.load(Relaxed));
                let spawned = std::thread::Builder::new().name("fanstore-held".into()).spawn(move || {
                    if req.op == mop::HOLDER_DROP {
                        drop_held(dedup.as_deref(), &out, req.arg0);
                    } else {
                        rename_held(dedup.as_deref(), &out, req.arg0, &req.payload, fsync);
                    }
                });
                let errno = if spawned.is_ok() { 0 } else { libc::EAGAIN };
                Reply { op: req.op, id: req.id, errno, flags: 0, value: 0, payload: Vec::new() }.encode()
            }
            Ok(req) if crate::watch::is_mop(req.op) => self.watch_meta(&req).encode(),
            Ok(req) => self.meta.lock().unwrap_or_else(|p| p.into_inner()).handle(&req).encode(),
            Err(_) => Reply { op: 0, id: 0, errno: libc::EINVAL, flags: 0, value: 0, payload: Vec::new() }.encode(),
        }
    }
}

/// Deletes what this rank holds of output `id`: its plain file and sidecar,
/// or its checkpoint.
/// Writes `out/<id>.rec`, the sidecar naming a held output for recovery
/// after a kill (a temporary file renamed into place; fsynced with `fsync`).
fn write_sidecar_in(out: &std::path::Path, path: &[u8], rec: &OutRecord, fsync: bool) -> Result<(), i32> {
    let file = out.join(format!("{}.rec", rec.id));
    let tmp = out.join(format!("{}.rec.tmp", rec.id));
    let res = (|| {
        use std::io::Write;
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&crate::persist::encode_index(&[(path.to_vec(), *rec)]))?;
        if fsync {
            f.sync_all()?;
        }
        std::fs::rename(&tmp, &file)
    })();
    res.map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        io_errno(&e)
    })
}

/// HOLDER_RENAME at the holder: output `id` is now named `path`, in its
/// checkpoint store (if there) and in its sidecar, so a restart after a
/// kill registers it under the new name.
fn rename_held(dedup: Option<&crate::dedup::Dedup>, out: &std::path::Path, id: u64, path: &[u8], fsync: bool) {
    if let Some(d) = dedup {
        d.rename_output(id, path);
    }
    let file = out.join(format!("{id}.rec"));
    let Ok(bytes) = std::fs::read(&file) else { return };
    let Some(rec) = crate::persist::decode_index(&file, &bytes).ok().and_then(|v| v.first().map(|(_, r)| *r)) else { return };
    if let Err(e) = write_sidecar_in(out, path, &rec, fsync) {
        log::warn!("rewriting {}: errno {e}", file.display());
    }
}

fn drop_held(dedup: Option<&crate::dedup::Dedup>, out: &std::path::Path, id: u64) {
    if !dedup.is_some_and(|d| d.drop_output(id)) {
        let _ = std::fs::remove_file(out.join(id.to_string()));
    }
    let _ = std::fs::remove_file(out.join(format!("{id}.rec")));
}

impl Node {
    pub fn out_dir(&self) -> PathBuf {
        self.id.local_dir.join("out")
    }

    fn out_file(&self, id: u64) -> PathBuf {
        self.out_dir().join(id.to_string())
    }

    /// `out/<id>.rec`: the path and record of a held output, so a restart
    /// with the same `--local` can register it again ([`Node::recover`]).
    fn sidecar(&self, id: u64) -> PathBuf {
        self.out_dir().join(format!("{id}.rec"))
    }

    fn write_sidecar(&self, path: &[u8], rec: &OutRecord) -> Result<(), i32> {
        write_sidecar_in(&self.out_dir(), path, rec, self.fsync_outputs.load(Relaxed))
    }

    /// The metadata owner of `path`.
    pub fn owner(&self, path: &[u8]) -> u32 {
        (xxh3(path) % self.id.nranks.max(1) as u64) as u32
    }

    /// One metadata request at the owner of `key`: answered here when this
    /// rank owns it, else over MPI (bounded wait).
    fn meta_at(&self, key: &[u8], op: u16, arg0: u64, payload: Vec<u8>) -> Result<Reply, i32> {
        self.meta_to(self.owner(key), op, arg0, payload)
    }

    /// One metadata request at rank `dest`.
    /// EBUSY (a path fenced by a directory move in flight) is retried until
    /// the move ends, at most [`META_TIMEOUT`].
    pub(crate) fn meta_to(&self, dest: u32, op: u16, arg0: u64, payload: Vec<u8>) -> Result<Reply, i32> {
        let deadline = std::time::Instant::now() + META_TIMEOUT;
        let mut pause = Duration::from_millis(1);
        loop {
            match self.meta_once(dest, op, arg0, payload.clone()) {
                Err(libc::EBUSY) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(32));
                }
                other => return other,
            }
        }
    }

    fn meta_once(&self, dest: u32, op: u16, arg0: u64, payload: Vec<u8>) -> Result<Reply, i32> {
        let id = META_IDS.fetch_add(1, Relaxed);
        let req = Request { op, id, arg0, arg1: 0, payload };
        let rep = if dest == self.id.rank {
            Reply::decode(&self.handle_meta(&req.encode())).map_err(|_| libc::EIO)?
        } else {
            let (tx, rx) = crossbeam::channel::bounded(1);
            let call = MetaCall { dest, id, msg: req.encode(), reply: tx, timeout: META_TIMEOUT };
            self.comm.send(Command::Meta(call)).map_err(|_| libc::EIO)?;
            let b = rx.recv_timeout(META_TIMEOUT + Duration::from_secs(1)).map_err(|_| {
                log::warn!("rank {}: metadata rank {dest} did not answer", self.id.rank);
                libc::EIO
            })?;
            Reply::decode(&b).map_err(|_| libc::EIO)?
        };
        if rep.errno != 0 {
            return Err(rep.errno);
        }
        Ok(rep)
    }

    fn link(&self, path: &[u8], kind: u8, add: bool) -> Result<(), i32> {
        let (dir, name) = parent(path);
        let mut p = dir.to_vec();
        p.push(0);
        p.extend_from_slice(name);
        let op = if add { mop::ADD } else { mop::REMOVE };
        self.meta_at(dir, op, kind as u64, p).map(|_| ())
    }

    /// The record of output `path` (file or directory).
    pub fn out_stat(&self, path: &[u8]) -> Result<OutRecord, i32> {
        let r = self.on_record(path, mop::GET, 0, path.to_vec())?;
        OutRecord::decode(&r.payload).ok_or(libc::EIO)
    }

    /// Why `path` has no record, as the kernel's path walk says it: ENOTDIR
    /// when its deepest existing ancestor is a file, else ENOENT.
    fn missing_errno(&self, path: &[u8]) -> i32 {
        let mut p = parent(path).0;
        while !p.is_empty() {
            if let Some(n) = self.view.lookup(p) {
                return if n.is_dir() { libc::ENOENT } else { libc::ENOTDIR };
            }
            match self.meta_at(p, mop::GET, 0, p.to_vec()) {
                Ok(r) => {
                    return match OutRecord::decode(&r.payload) {
                        Some(rec) if !rec.is_dir() => libc::ENOTDIR,
                        _ => libc::ENOENT,
                    }
                }
                Err(libc::ENOENT) => p = parent(p).0,
                Err(e) => return e,
            }
        }
        libc::ENOENT
    }

    /// Ok if `dir` is an input or output directory.
    fn dir_exists(&self, dir: &[u8]) -> Result<(), i32> {
        if let Some(n) = self.view.lookup(dir) {
            return if n.is_dir() { Ok(()) } else { Err(libc::ENOTDIR) };
        }
        match self.out_stat(dir) {
            Ok(r) if r.is_dir() => Ok(()),
            Ok(_) => Err(libc::ENOTDIR),
            Err(e) => Err(e),
        }
    }

    /// Puts `rec` at the owner of `path`: Ok(true) when it replaced a file.
    fn put(&self, path: &[u8], rec: OutRecord, excl: bool) -> Result<bool, i32> {
        let mut p = Vec::with_capacity(OutRecord::LEN + path.len());
        rec.encode_into(&mut p);
        p.extend_from_slice(path);
        let r = self.meta_at(path, mop::PUT, if excl { wire::COMMIT_EXCL } else { 0 }, p)?;
        // A record of the same output (a rename retried after a failure
        // between its steps) is not a replaced one.
        let old = OutRecord::decode(&r.payload);
        if let Some(old) = old.filter(|o| (o.id, o.holder) != (rec.id, rec.holder)) {
            self.drop_data(&old);
        }
        Ok(old.is_some())
    }

    /// Deletes the bytes of a replaced or unlinked output: here, or at its
    /// holder (asked over MPI; a holder that is gone keeps them until its
    /// local directory is removed). Persisted bytes stay in `--persist`.
    fn drop_data(&self, old: &OutRecord) {
        if old.is_dir() || old.holder >= self.id.nranks {
            return;
        }
        if old.holder == self.id.rank {
            drop_held(self.dedup.get().map(|d| &**d), &self.out_dir(), old.id);
        } else if let Err(e) = self.meta_to(old.holder, mop::HOLDER_DROP, old.id, Vec::new()) {
            log::warn!("rank {}: rank {} did not drop output {}: errno {e}", self.id.rank, old.holder, old.id);
        }
    }

    /// COMMIT: stores the bytes of `fd`, then registers `path` with its owner.
    pub fn commit(&self, path: &[u8], fd: &OwnedFd, excl: bool, mode: u32) -> Result<(), i32> {
        if path.is_empty() {
            return Err(libc::EEXIST);
        }
        if self.view.lookup(path).is_some() {
            return Err(if excl { libc::EEXIST } else { libc::EROFS });
        }
        self.dir_exists(parent(path).0)?;
        let id = self.out_seq.fetch_add(1, Relaxed);
        if id >= OUT_BIT as u64 {
            return Err(libc::ENOSPC);
        }
        let src = std::fs::File::from(fd.try_clone().map_err(|_| libc::EMFILE)?);
        let size = src.metadata().map_err(|_| libc::EIO)?.len();
        let map = if size > 0 {
            // SAFETY: the client handed us its output file at its last close
            // and no longer writes it; the mapping is read-only and private.
            Some(unsafe { memmap2::MmapOptions::new().populate().map(&src) }.map_err(|_| libc::EIO)?)
        } else {
            None
        };
        let bytes: &[u8] = map.as_deref().unwrap_or(&[]);
        std::fs::create_dir_all(self.out_dir()).map_err(|e| io_errno(&e))?;
        let unnamed = self.unnamed_local(&src);
        if unnamed && self.local_disk_full() {
            return Err(libc::ENOSPC);
        }
        let dedup = self.dedup.get().filter(|d| size >= d.min);
        let file = self.out_file(id);
        let undo = || match dedup {
            Some(d) => {
                d.drop_output(id);
            }
            None => {
                let _ = std::fs::remove_file(&file);
            }
        };
        let sum = match dedup {
            Some(d) => d.stage(path, id, bytes)?.file_xxh3,
            None => self.store_plain(&src, unnamed, bytes, &file).inspect_err(|_| undo())?,
        };
        let rec = OutRecord { size, mode: libc::S_IFREG | (mode & 0o7777), holder: self.id.rank, mtime_ns: now_ns(), id, sum };
        if let Err(e) = self.write_sidecar(path, &rec) {
            undo();
            return Err(e);
        }
        let replaced = match self.put(path, rec, excl) {
            Ok(r) => r,
            Err(e) => {
                undo();
                let _ = std::fs::remove_file(self.sidecar(id));
                return Err(e);
            }
        };
        if let Some(d) = dedup {
            d.settle(id, path);
        }
        self.link(path, wire::KIND_FILE, true)?;
        self.counters.outputs.fetch_add(1, Relaxed);
        self.publish(Kind::Close, path, b"", false, replaced, Some(&rec));
        Ok(())
    }

    /// Keeps the bytes of `src` at `file` (fsynced with `--fsync-outputs`):
    /// their xxh3. An unnamed file on the local disk (the client's
    /// O_TMPFILE) is linked there; anything else (a memfd) is copied.
    fn store_plain(&self, src: &std::fs::File, unnamed: bool, bytes: &[u8], file: &std::path::Path) -> Result<u64, i32> {
        if unnamed {
            self.link_unnamed(src, file)?;
            if self.fsync_outputs.load(Relaxed) {
                src.sync_all().map_err(|e| io_errno(&e))?;
            }
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
            log::warn!("rank {}: storing an output at {}: {e}", self.id.rank, file.display());
            io_errno(&e)
        })?;
        Ok(xxh3(bytes))
    }

    /// Is `src` the client's unnamed file (O_TMPFILE) on the local disk?
    fn unnamed_local(&self, src: &std::fs::File) -> bool {
        use std::os::unix::fs::MetadataExt;
        let (Ok(m), Ok(out)) = (src.metadata(), std::fs::metadata(self.out_dir())) else { return false };
        m.file_type().is_file() && m.nlink() == 0 && m.dev() == out.dev()
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
        let proc = std::ffi::CString::new(format!("/proc/self/fd/{}", src.as_raw_fd())).map_err(|_| libc::EINVAL)?;
        let dst = std::ffi::CString::new(file.as_os_str().as_encoded_bytes()).map_err(|_| libc::EINVAL)?;
        // SAFETY: both paths are NUL-terminated; linkat of /proc/self/fd/N with
        // AT_SYMLINK_FOLLOW gives an O_TMPFILE file its name (open(2)).
        let r = unsafe { libc::linkat(libc::AT_FDCWD, proc.as_ptr(), libc::AT_FDCWD, dst.as_ptr(), libc::AT_SYMLINK_FOLLOW) };
        if r != 0 {
            let e = std::io::Error::last_os_error();
            log::warn!("rank {}: linking an output at {}: {e}", self.id.rank, file.display());
            return Err(io_errno(&e));
        }
        Ok(())
    }

    /// OUT_OPEN: an fd with the bytes of output `path`.
    pub fn out_open(&self, path: &[u8]) -> Result<OwnedFd, i32> {
        let rec = self.out_stat(path)?;
        if rec.is_dir() {
            return Err(libc::EISDIR);
        }
        if rec.holder == crate::persist::PERSISTED {
            let dir = self.persist.get().ok_or(libc::EIO)?;
            if !crate::persist::data_path(dir, &rec).exists() {
                return self.open_drained_checkpoint(dir, path, &rec);
            }
            return std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_CLOEXEC)
                .open(crate::persist::data_path(dir, &rec))
                .map(OwnedFd::from)
                .map_err(|e| {
                    log::error!("rank {}: persisted output '{}': {e}", self.id.rank, String::from_utf8_lossy(path));
                    libc::EIO
                });
        }
        if rec.holder == self.id.rank {
            let plain = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_CLOEXEC).open(self.out_file(rec.id));
            return match (plain, self.dedup.get()) {
                (Ok(f), _) => Ok(OwnedFd::from(f)),
                // One rebuilt copy per node, shared by every process that
                // opens it (all the ranks of a node loading the checkpoint to
                // resume); a new version is a new output id, so a cached copy
                // is never served for it.
                (Err(_), Some(d)) if d.holds(rec.id) => self
                    .cache
                    .get_or_load(OUT_BIT | rec.id as u32, self.remote_timeout, libc::EIO, || {
                        d.open_output(rec.id, rec.size, rec.sum).map(|fd| (std::sync::Arc::new(fd), rec.size))
                    })
                    .and_then(|shared| crate::open::reopen(&shared)),
                (Err(_), _) => Err(libc::ENOENT), // replaced or removed meanwhile
            };
        }
        // One copy per node, shared by every process that opens it ([`crate::remote_out`]).
        self.open_remote_output(path, &rec)
    }

    /// A checkpoint drained by a rank this job does not have (it ran with
    /// fewer ranks), read in place from `--persist`.
    fn open_drained_checkpoint(&self, dir: &std::path::Path, path: &[u8], rec: &OutRecord) -> Result<OwnedFd, i32> {
        let name = String::from_utf8_lossy(path);
        let cats = crate::dedup::persisted_catalogs(dir).map_err(|e| {
            log::error!("rank {}: persisted output '{name}': {e}", self.id.rank);
            libc::EIO
        })?;
        let rank = *cats.get(path).ok_or_else(|| {
            log::error!("rank {}: persisted output '{name}': its bytes are in no drained store", self.id.rank);
            libc::EIO
        })?;
        let bytes = crate::dedup::open_drained(dir, rank).and_then(|s| s.read(path)).map_err(|e| {
            log::error!("rank {}: persisted output '{name}': {e}", self.id.rank);
            crate::dedup::errno_of(&e)
        })?;
        if bytes.len() as u64 != rec.size || xxh3(&bytes) != rec.sum {
            log::error!("rank {}: persisted output '{name}' differs from its record", self.id.rank);
            return Err(libc::EIO);
        }
        let m = MemfdBuilder::unmapped(&format!("fanstore:out:{}", rec.id), rec.size).map_err(|_| libc::ENOMEM)?;
        m.write_at(&bytes, 0).map_err(|_| libc::EIO)?;
        m.seal().map_err(|_| libc::EIO)
    }

    /// OUT_LIST: entries of output listing `dir` after `skip`.
    pub fn out_list(&self, dir: &[u8], skip: u64) -> Result<Reply, i32> {
        self.meta_at(dir, mop::LIST, skip, dir.to_vec())
    }

    pub fn out_mkdir(&self, path: &[u8], mode: u32) -> Result<(), i32> {
        if path.is_empty() || self.view.lookup(path).is_some() {
            return Err(libc::EEXIST);
        }
        self.dir_exists(parent(path).0)?;
        let rec = OutRecord { mode: libc::S_IFDIR | (mode & 0o7777), holder: self.id.rank, mtime_ns: now_ns(), ..Default::default() };
        let mut p = Vec::new();
        rec.encode_into(&mut p);
        p.extend_from_slice(path);
        self.meta_at(path, mop::MKDIR, 0, p)?;
        self.link(path, wire::KIND_DIR, true)?;
        self.publish(Kind::Mkdir, path, b"", true, false, None);
        Ok(())
    }

    pub fn out_rmdir(&self, path: &[u8]) -> Result<(), i32> {
        if let Some(n) = self.view.lookup(path) {
            return Err(if n.is_dir() { libc::EROFS } else { libc::ENOTDIR });
        }
        self.on_record(path, mop::RMDIR, 0, path.to_vec())?;
        self.link(path, wire::KIND_DIR, false)?;
        self.publish(Kind::Rmdir, path, b"", true, false, None);
        Ok(())
    }

    /// A request about the record of `path` at its owner; a missing record
    /// is ENOENT or ENOTDIR as [`Self::missing_errno`] says.
    fn on_record(&self, path: &[u8], op: u16, arg0: u64, payload: Vec<u8>) -> Result<Reply, i32> {
        match self.meta_at(path, op, arg0, payload) {
            Err(libc::ENOENT) => Err(self.missing_errno(path)),
            other => other,
        }
    }

    pub fn out_unlink(&self, path: &[u8]) -> Result<(), i32> {
        if let Some(n) = self.view.lookup(path) {
            return Err(if n.is_dir() { libc::EISDIR } else { libc::EROFS });
        }
        let r = self.on_record(path, mop::DEL, 0, path.to_vec())?;
        let old = OutRecord::decode(&r.payload);
        if let Some(old) = &old {
            self.drop_data(old);
        }
        self.link(path, wire::KIND_FILE, false)?;
        self.publish(Kind::Delete, path, b"", false, false, old.as_ref());
        Ok(())
    }

    /// Renames output directory `from` (and everything below it) to `to`:
    /// the two-phase move of [`crate::meta`] (module doc). `to` may be an
    /// empty directory (replaced); a non-empty one is ENOTEMPTY, a file
    /// ENOTDIR. Called by [`Self::out_rename`] after the parent and ancestor checks.
    fn rename_dir(&self, from: &[u8], to: &[u8]) -> Result<(), i32> {
        use crate::meta::Moved;
        // (Both parents and the ancestor relation were checked by out_rename.)
        match self.out_stat(to) {
            Ok(r) if !r.is_dir() => return Err(libc::ENOTDIR),
            Ok(_) => {
                self.meta_at(to, mop::RMDIR, 0, to.to_vec())?; // ENOTEMPTY unless empty
                self.link(to, wire::KIND_DIR, false)?;
            }
            Err(libc::ENOENT) => {}
            Err(e) => return Err(e),
        }
        let tx = META_IDS.fetch_add(1, Relaxed) | (u64::from(self.id.rank) << 48);
        let mut names = from.to_vec();
        names.push(0);
        names.extend_from_slice(to);
        let mut moved = Vec::new();
        let mut prepared = Vec::new();
        let mut failed = None;
        for r in 0..self.id.nranks {
            match self.meta_once(r, mop::MOVE_PREP, tx, names.clone()) {
                Ok(rep) => {
                    prepared.push(r);
                    match Moved::decode_all(&rep.payload) {
                        Some(m) => moved.extend(m),
                        None => failed = Some(libc::EIO),
                    }
                }
                Err(e) => failed = Some(e),
            }
            if failed.is_some() {
                break;
            }
        }
        let (entries, result) = match failed {
            // Abort: everything goes back under its old name.
            Some(e) => (moved, Err(e)),
            None => {
                // Never return before the commit: the fences must be lifted.
                for (path, add) in [(from, false), (to, true)] {
                    if let Err(e) = self.link(path, wire::KIND_DIR, add) {
                        log::error!("rank {}: listing of the parent of '{}': errno {e}", self.id.rank, String::from_utf8_lossy(path));
                    }
                }
                (moved.into_iter().map(|m| m.renamed(from, to)).collect::<Vec<_>>(), Ok(()))
            }
        };
        let mut per_rank = vec![Vec::new(); self.id.nranks as usize];
        let mut files = Vec::new();
        for e in &entries {
            if let Moved::Record(p, r) = e {
                if !r.is_dir() {
                    files.push((p.clone(), *r));
                }
            }
            e.encode_into(&mut per_rank[self.owner(e.path()) as usize]);
        }
        for (r, payload) in per_rank.into_iter().enumerate() {
            let r = r as u32;
            if !prepared.contains(&r) && payload.is_empty() {
                continue;
            }
            if let Err(e) = self.meta_once(r, mop::MOVE_COMMIT, tx, payload) {
                log::error!("rank {}: moving '{}': rank {r} did not commit: errno {e}", self.id.rank, String::from_utf8_lossy(from));
            }
        }
        if result.is_ok() {
            for (path, rec) in files {
                self.renamed_at_holder(&path, &rec);
            }
        }
        result
    }

    /// Tells the holder of output `rec` that it is now named `path` (its
    /// sidecar here, or its checkpoint store's name there).
    fn renamed_at_holder(&self, path: &[u8], rec: &OutRecord) {
        if rec.holder == self.id.rank {
            let _ = self.write_sidecar(path, rec);
            if let Some(d) = self.dedup.get() {
                d.rename_output(rec.id, path);
            }
        } else if rec.holder < self.id.nranks {
            if let Err(e) = self.meta_to(rec.holder, mop::HOLDER_RENAME, rec.id, path.to_vec()) {
                log::warn!("rank {}: rank {} did not rename output {}: errno {e}", self.id.rank, rec.holder, rec.id);
            }
        }
    }

    /// chmod / utime of an output: the record at its owner changes (EROFS on an input).
    pub fn out_setattr(&self, path: &[u8], what: u64, value: u64) -> Result<(), i32> {
        if self.view.lookup(path).is_some() {
            return Err(libc::EROFS);
        }
        let mut payload = value.to_le_bytes().to_vec();
        payload.extend_from_slice(path);
        self.on_record(path, mop::SETATTR, what, payload).map(|_| ())
    }

    pub fn out_rename(&self, from: &[u8], to: &[u8]) -> Result<(), i32> {
        if self.view.lookup(from).is_some() || self.view.lookup(to).is_some() {
            return Err(libc::EROFS);
        }
        // As the kernel: both parents are resolved (old, then new) before the entry.
        self.dir_exists(parent(from).0)?;
        self.dir_exists(parent(to).0)?;
        let rec = self.out_stat(from)?;
        if from == to {
            return Ok(());
        }
        // Then the ancestor checks, before any type check (as lock_rename's trap).
        if crate::meta::at_or_below(to, from) {
            return Err(libc::EINVAL);
        }
        if crate::meta::at_or_below(from, to) {
            return Err(libc::ENOTEMPTY);
        }
        if rec.is_dir() {
            self.rename_dir(from, to)?;
            self.publish(Kind::Rename, from, to, true, false, None);
            return Ok(());
        }
        if rec.holder == self.id.rank {
            // A restart with the same --local recovers it under the new name.
            self.write_sidecar(to, &rec)?;
        }
        let replaced = self.put(to, rec, false)?;
        self.link(to, wire::KIND_FILE, true)?;
        match self.meta_at(from, mop::DEL, rec.id, from.to_vec()) {
            Ok(_) | Err(libc::ENOENT) => {}
            Err(e) => return Err(e),
        }
        // The holder's checkpoint store shows the new name (reads go by id).
        if rec.holder == self.id.rank {
            if let Some(d) = self.dedup.get() {
                d.rename_output(rec.id, to);
            }
        } else if rec.holder < self.id.nranks {
            if let Err(e) = self.meta_to(rec.holder, mop::HOLDER_RENAME, rec.id, to.to_vec()) {
                log::warn!("rank {}: rank {} did not rename output {}: errno {e}", self.id.rank, rec.holder, rec.id);
            }
        }
        self.link(from, wire::KIND_FILE, false)?;
        self.publish(Kind::Rename, from, to, false, replaced, Some(&rec));
        Ok(())
    }
}

impl Node {
    /// Loads the records drained to `dir` by an earlier job: those this rank
    /// owns now, and the listings of the directories it owns. Returns how
    /// many records it keeps.
    pub fn load_persisted(&self, dir: &std::path::Path) -> Result<usize, crate::persist::PersistError> {
        let all = crate::persist::read_all(dir)?;
        let stores = crate::dedup::persisted_catalogs(dir)
            .map_err(|e| crate::persist::PersistError::Io(dir.join(crate::dedup::STORE_DIR), std::io::Error::other(e.to_string())))?;
        let mut m = self.meta.lock().unwrap_or_else(|p| p.into_inner());
        let mut n = 0;
        for (path, mut rec) in all {
            if self.view.lookup(&path).is_some() {
                continue; // an input of this dataset now: inputs win
            }
            if !rec.is_dir() {
                rec.holder = crate::persist::PERSISTED;
                // A checkpoint drained with rank s's store is held by rank s
                // again (which copied that store back at start).
                if let Some(&s) = stores.get(&path).filter(|_| !crate::persist::data_path(dir, &rec).exists()) {
                    if s >= self.id.nranks {
                        log::warn!(
                            "rank {}: '{}' was drained by rank {s} of a larger job: only `fanstore export` can read it",
                            self.id.rank,
                            String::from_utf8_lossy(&path)
                        );
                    } else {
                        rec.holder = s;
                        if s == self.id.rank && !self.dedup.get().is_some_and(|d| d.claim(rec.id, &path)) {
                            log::warn!("rank {}: the drained store has no checkpoint '{}'", self.id.rank, String::from_utf8_lossy(&path));
                        }
                        if s == self.id.rank {
                            self.out_seq.fetch_max(rec.id + 1, Relaxed);
                        }
                    }
                }
            }
            if self.owner(&path) == self.id.rank {
                m.insert(&path, rec);
                n += 1;
            }
            let (d, name) = parent(&path);
            if self.owner(d) == self.id.rank {
                m.add_child(d, name, if rec.is_dir() { wire::KIND_DIR } else { wire::KIND_FILE });
            }
        }
        Ok(n)
    }

    /// Drains to `dir`: the output bytes this rank holds, then the records it
    /// owns (files now held by `dir`). Returns (files copied, records).
    pub fn drain(&self, dir: &std::path::Path) -> Result<(usize, usize), crate::persist::PersistError> {
        let files = self.drain_data(dir)?;
        let recs = self.drain_meta(dir, false)?;
        Ok((files, recs))
    }

    /// Copies every output file this rank holds into `dir` (content-addressed),
    /// and its checkpoint store; returns the outputs drained.
    pub fn drain_data(&self, dir: &std::path::Path) -> Result<usize, crate::persist::PersistError> {
        let mut files = 0;
        if let Ok(rd) = std::fs::read_dir(self.out_dir()) {
            for e in rd.flatten() {
                if e.path().extension().is_some() || e.file_type().map_or(true, |t| t.is_dir()) {
                    continue; // sidecars, the checkpoint store
                }
                let known = std::fs::read(self.out_dir().join(format!("{}.rec", e.file_name().to_string_lossy())))
                    .ok()
                    .and_then(|b| crate::persist::decode_index(&e.path(), &b).ok())
                    .and_then(|mut r| r.pop())
                    .map(|(_, rec)| (rec.size, rec.sum));
                crate::persist::drain_file(dir, &e.path(), known)?;
                files += 1;
            }
        }
        if let Some(d) = self.dedup.get() {
            let dst = crate::dedup::drained_dir(dir, self.id.rank);
            files += d.drain_to(&dst).map_err(|e| crate::persist::PersistError::Io(dst, e))?;
        }
        Ok(files)
    }

    /// Writes the records this rank owns to `dir`; with `only_present`, only
    /// files whose bytes are already there (a sync racing with commits).
    pub fn drain_meta(&self, dir: &std::path::Path, only_present: bool) -> Result<usize, crate::persist::PersistError> {
        let mut recs = self.meta.lock().unwrap_or_else(|p| p.into_inner()).all();
        if only_present {
            let drained = crate::dedup::persisted_catalogs(dir).unwrap_or_default();
            recs.retain(|(p, r)| r.is_dir() || crate::persist::data_path(dir, r).exists() || drained.contains_key(p));
        }
        for (_, r) in recs.iter_mut() {
            if !r.is_dir() {
                r.holder = crate::persist::PERSISTED;
            }
        }
        recs.sort_by(|a, b| a.0.cmp(&b.0));
        crate::persist::write_index(dir, self.id.rank, self.id.nranks, &recs)?;
        Ok(recs.len())
    }
}

impl Node {
    /// Creates the output directories leading to `dir` that are missing
    /// (recovered files whose directories lived in a dead rank's memory).
    fn ensure_dirs(&self, dir: &[u8]) {
        if dir.is_empty() || self.view.lookup(dir).is_some() {
            return;
        }
        self.ensure_dirs(parent(dir).0);
        match self.out_mkdir(dir, 0o755) {
            Ok(()) | Err(libc::EEXIST) => {}
            Err(e) => log::warn!("rank {}: recreating '{}': errno {e}", self.id.rank, String::from_utf8_lossy(dir)),
        }
    }

    /// Registers again the outputs a killed earlier run of this rank held
    /// (moved aside to `from` at start): each `<id>` with its `<id>.rec`
    /// moves into this run's `out/` and is put at its owner (replacing
    /// nothing newer: an existing record wins). Returns how many.
    pub fn recover(&self, from: &std::path::Path) -> usize {
        let mut n = 0;
        let Ok(rd) = std::fs::read_dir(from) else { return 0 };
        for e in rd.flatten() {
            let p = e.path();
            if p.extension().and_then(|x| x.to_str()) != Some("rec") {
                continue;
            }
            let Ok(b) = std::fs::read(&p) else { continue };
            let Ok(mut recs) = crate::persist::decode_index(&p, &b) else {
                log::warn!("rank {}: ignoring damaged {}", self.id.rank, p.display());
                continue;
            };
            let Some((path, mut rec)) = recs.pop() else { continue };
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
            rec.holder = self.id.rank;
            self.ensure_dirs(parent(&path).0);
            let ok = self.write_sidecar(&path, &rec).is_ok()
                && match self.put(&path, rec, true) {
                    Ok(_) => self.link(&path, wire::KIND_FILE, true).is_ok(),
                    Err(_) => false,
                };
            if ok {
                if let Some(d) = dedup.filter(|_| in_store) {
                    d.settle(id, &path);
                }
                n += 1;
            } else {
                drop_held(dedup.map(|d| &**d), &self.out_dir(), id);
            }
        }
        let _ = std::fs::remove_dir_all(from);
        if let Some(d) = self.dedup.get() {
            let swept = d.sweep_unclaimed();
            if swept > 0 {
                log::info!("rank {}: {swept} checkpoints of a killed run were never registered: released", self.id.rank);
            }
        }
        n
    }
}
