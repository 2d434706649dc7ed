//! Where a dataset file's own bytes live once it has been opened on this
//! node: the tier map and the node copies (format and client rules in
//! [`fanstore_core::tiers`]).
//!
//! [`TierMap`] is the daemon's writable mapping of the shared tier map.
//! [`Copies`] owns the node copies, in two places:
//! - the copy directory (`….copies` in shared memory, [`TIER_COPY`]), within
//!   `--cache-mem`: every copy made while a program waits for it (the
//!   daemon's OPEN), and small ones;
//! - the local directory (`local/in/<bucket>/<id>`, the path of an extracted
//!   file, [`TIER_EXTRACTED`]), within `--cache-disk` and while the local
//!   file system keeps a twentieth free: copies of 64 KiB or more made in
//!   the background (the prefill and the WARM hints of clients that decoded
//!   a file themselves). A file written whole into the local file system's
//!   page cache reads back faster than one in shared memory (large folios;
//!   measured here: 15 against 28 µs per 128 KiB open+read+close), while
//!   creating it costs more (100-500 µs against 60 µs), which no program
//!   waits for here.
//!
//! A copy is created unnamed (O_TMPFILE), filled, linked under its node id
//! and recorded in its place's cache ([`crate::inputs::cache`]) with its size rounded
//! up to pages; the cache's eviction hook sets the tier byte back (to what
//! it said before the copy when that still holds without it: a replicated
//! partition, a declined copy; else 0) and unlinks the file under the cache
//! lock, so a cached entry always has its file.
//! Nothing keeps an fd open per cached copy; concurrent first opens of one
//! file share one load. A copy too large for the budget is served unnamed,
//! and once its reader is done its pages serve a later one
//! ([`crate::inputs::recycle`], a bounded set of fds). Clients that open a copy
//! directly do not refresh its place in the LRU order, so for them eviction
//! is first-in first-out.

use crate::inputs::cache::Cache;
use crate::fdio::{self, open_ro, write_all_at};
use crate::fdlimit;
use crate::inputs::recycle::{Evicted, Spare, Spares};
use fanstore_core::tiers::{self, EXTRACT_MIN, TIER_COPY, TIER_DECLINED, TIER_EXTRACTED, TIER_NONE, TIER_PART, TIER_PART_DECLINED};
use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The daemon's writable view of the tier map file.
pub struct TierMap {
    map: memmap2::MmapMut,
    nodes: usize,
    path: PathBuf,
}

impl TierMap {
    /// Creates the tier map at `path` (mode 0600, replacing a stale one) for `nodes` nodes, all [`TIER_NONE`].
    pub fn create(path: &Path, dataset_id: u64, nodes: u64) -> io::Result<TierMap> {
        let _ = std::fs::remove_file(path);
        let f = std::fs::OpenOptions::new().read(true).write(true).create_new(true).mode(crate::caller::shared_mode(0o644, 0o600)).open(path)?;
        let len = tiers::HEADER_LEN as u64 + nodes;
        f.set_len(len)?;
        // SAFETY: the file was just created by us with mode 0600 and is never
        // resized; clients map it read-only and read it through atomics.
        let mut map = unsafe { memmap2::MmapOptions::new().len(len as usize).map_mut(&f) }?;
        map[..tiers::HEADER_LEN].copy_from_slice(&tiers::encode_header(dataset_id, nodes));
        Ok(TierMap { map, nodes: nodes as usize, path: path.to_path_buf() })
    }

    fn cell(&self, id: u32) -> Option<&AtomicU8> {
        if id as usize >= self.nodes {
            return None;
        }
        // SAFETY: the byte is inside the mapping (checked above); AtomicU8 has
        // u8's layout, and every access to these shared bytes is atomic.
        Some(unsafe { &*self.map.as_ptr().add(tiers::HEADER_LEN + id as usize).cast::<AtomicU8>() })
    }

    pub fn get(&self, id: u32) -> u8 {
        self.cell(id).map_or(TIER_NONE, |c| c.load(Ordering::Acquire))
    }

    pub fn set(&self, id: u32, tier: u8) {
        if let Some(c) = self.cell(id) {
            c.store(tier, Ordering::Release);
        }
    }

    /// Sets the byte of `id` to `tier` only if it is `from` (a file already
    /// extracted or copied keeps that tier); true if it did.
    pub fn set_if(&self, id: u32, from: u8, tier: u8) -> bool {
        self.cell(id).is_some_and(|c| c.compare_exchange(from, tier, Ordering::AcqRel, Ordering::Acquire).is_ok())
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// A cached copy: its inode, to tell a stale entry from a fresh one.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct CopyEntry {
    ino: u64,
    size: u64,
    /// The file's tier byte once the copy is evicted: what it said before
    /// the copy was made when that is still true without the copy
    /// ([`rest_tier`]), else [`TIER_NONE`].
    rest: u8,
}

/// The byte a file goes back to when its copy is evicted, from the byte it
/// had when the copy was made: a replicated partition stays replicated
/// (clients go on decoding its files themselves), a declined copy stays
/// declined; anything else is [`TIER_NONE`].
fn rest_tier(before: u8) -> u8 {
    match before {
        TIER_PART | TIER_DECLINED | TIER_PART_DECLINED => before,
        _ => TIER_NONE,
    }
}

/// The node copies: the copy directory in memory and its budget, and the
/// copies on the local disk, if any.
pub struct Copies {
    dir: PathBuf,
    dir_c: CString,
    tiers: Arc<TierMap>,
    pub cache: Cache<CopyEntry, i32>,
    budget: u64,
    disk: Option<DiskCopies>,
    /// Unnamed copies no one reads any more, written again for the next one.
    pub spares: Spares,
    /// Named copies the cache evicted, written again for the next named one.
    pub evicted: Arc<Evicted>,
}

/// Copies kept on the local disk, at the paths of extracted files.
pub struct DiskCopies {
    local_dir: PathBuf,
    pub cache: Cache<CopyEntry, i32>,
    budget: u64,
}

/// What a copy costs the budget: its pages (a tmpfs file holds whole pages).
fn charge(size: u64) -> u64 {
    size.div_ceil(4096).max(1) * 4096
}

impl Copies {
    /// Creates the copy directory `dir` (mode 0700; a stale one of an
    /// earlier run is removed first) holding at most `budget` bytes.
    pub fn create(dir: &Path, tiers: Arc<TierMap>, budget: u64) -> io::Result<Copies> {
        if dir.exists() {
            std::fs::remove_dir_all(dir)?;
        }
        std::fs::DirBuilder::new().mode(crate::caller::shared_mode(0o755, 0o700)).create(dir)?;
        let dir_c = CString::new(dir.as_os_str().as_bytes()).map_err(|_| io::ErrorKind::InvalidInput)?;
        let hook_dir = dir.to_path_buf();
        let hook_tiers = tiers.clone();
        let evicted = Arc::new(Evicted::new(0));
        let hook_evicted = evicted.clone();
        let on_evict: crate::inputs::cache::EvictHook<CopyEntry> = Box::new(move |id, e| {
            // The tier byte first: no client opens the name after this.
            hook_tiers.set(id, e.rest);
            hook_evicted.keep(&hook_dir, &hook_dir.join(id.to_string()), e.size);
        });
        Ok(Copies {
            dir: dir.to_path_buf(),
            dir_c,
            tiers,
            cache: Cache::with_limits(budget, usize::MAX, Some(on_evict)),
            budget,
            disk: None,
            spares: Spares::new(0),
            evicted,
        })
    }

    /// Keeps up to `budget` bytes of unnamed copies (those past the copy
    /// budget) once their readers are done, to write later copies into
    /// ([`crate::inputs::recycle`]); 0: never.
    pub fn with_spares(mut self, budget: u64) -> Copies {
        self.spares = Spares::new(budget);
        self.evicted.set_budget(budget);
        self
    }

    /// Also keeps copies of [`EXTRACT_MIN`] bytes or more made in the
    /// background on the local disk, under `local_dir/in/` (whose bucket
    /// directories the loader made), up to `budget` bytes (0: never).
    pub fn with_disk(mut self, local_dir: &Path, budget: u64) -> Copies {
        if budget == 0 {
            self.disk = None;
            return self;
        }
        let hook_dir = local_dir.to_path_buf();
        let hook_tiers = self.tiers.clone();
        let on_evict: crate::inputs::cache::EvictHook<CopyEntry> = Box::new(move |id, e| {
            hook_tiers.set(id, e.rest);
            let _ = std::fs::remove_file(fanstore_core::runtime::local_file_path(&hook_dir, id));
        });
        self.disk = Some(DiskCopies {
            local_dir: local_dir.to_path_buf(),
            cache: Cache::with_limits(budget, usize::MAX, Some(on_evict)),
            budget,
        });
        self
    }

    /// The copies on the local disk, if kept.
    pub fn disk(&self) -> Option<&DiskCopies> {
        self.disk.as_ref()
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path(&self, id: u32) -> PathBuf {
        self.dir.join(id.to_string())
    }

    /// A read-only fd on the copy of node `id` (`size` bytes), made now by
    /// `fill` (which writes the file's exact bytes into the destination it is given)
    /// unless a copy exists or is being made by another thread (then waits
    /// at most `wait`). `relieve` frees fds when the process runs out.
    ///
    /// `answered` tells, after `fill`, whether the reader has its own fd of
    /// the copy already (the communication thread sent it one,
    /// [`crate::inputs::client_reply`]): then no fd is made here, and the result is
    /// `Ok(None)`.
    pub fn open(
        &self,
        id: u32,
        size: u64,
        wait: Duration,
        relieve: &dyn Fn(),
        fill: &Fill<'_>,
        answered: &dyn Fn() -> bool,
    ) -> Result<Option<OwnedFd>, i32> {
        let placed = match self.tiers.get(id) {
            TIER_COPY => Some((self.path(id), &self.cache)),
            TIER_EXTRACTED => self.disk.as_ref().map(|d| (d.path(id), &d.cache)),
            _ => None,
        };
        if let Some((path, cache)) = placed {
            if let Ok(fd) = fdlimit::retry(relieve, || open_ro(&path)) {
                cache.touch(id);
                cache.stats.hits.fetch_add(1, Ordering::Relaxed);
                return Ok(Some(fd));
            }
        }
        let mut last = libc::EIO;
        for _ in 0..3 {
            let mut fresh: Option<Spare> = None;
            let entry = self.cache.get_or_load(id, wait, libc::EIO, || {
                let rest = rest_tier(self.tiers.get(id));
                let mut f = self.make(id, size, relieve, fill)?;
                let ino = f.ino()?;
                fresh = Some(f);
                Ok((CopyEntry { ino, size, rest }, charge(size)))
            });
            let entry = match entry {
                Ok(e) => e,
                Err(libc::ENOSPC) => {
                    // The copy directory's file system is full: make room, try again.
                    self.cache.shed();
                    self.evicted.shed();
                    last = libc::ENOSPC;
                    continue;
                }
                Err(e) => return Err(e),
            };
            if let Some(f) = fresh {
                // Our own load. The reader has its own description of the
                // file already, or gets a read-only one of the file we filled.
                let fd = if answered() {
                    None
                } else {
                    Some(fdlimit::retry(relieve, || open_ro(&fdio::proc_fd(f.file().as_raw_fd())))?)
                };
                if !self.fits(size) {
                    // Unnamed: its pages serve a later copy once the reader is done.
                    self.spares.keep(f);
                }
                return Ok(fd);
            }
            match fdlimit::retry(relieve, || open_ro(&self.path(id))) {
                Ok(fd) => return Ok(Some(fd)),
                // Evicted between the lookup and the open: load it again.
                Err(libc::ENOENT) => {
                    self.cache.invalidate(id, |e| *e == entry);
                    last = libc::ENOENT;
                }
                Err(e) => return Err(e),
            }
        }
        log::error!("copy of node {id}: gave up after 3 tries (errno {last})");
        Err(libc::EIO)
    }

    /// An unnamed file in the copy directory, filled by `fill`, then linked
    /// as `<id>` and recorded in the tier map (unless larger than the whole
    /// budget: then it is served unnamed, written into a spare when one is
    /// free (through the mapping kept with it), and kept as a spare after).
    /// A named copy is written into an evicted copy's file when one is free
    /// ([`Evicted`]), renamed to `<id>` once filled.
    fn make(&self, id: u32, size: u64, relieve: &dyn Fn(), fill: &Fill<'_>) -> Result<Spare, i32> {
        let named = charge(size) <= self.budget;
        // `fill` writes every byte of the file, so a spare's old bytes never show.
        if let Some(s) = if named { None } else { self.spares.take(size) } {
            let mut slot = Some(s);
            let renew = || Spare::allocated(self.tmpfile(relieve)?, size);
            fill(&mut CopyDst::spare(&mut slot, size, &renew))?;
            // A fill that lent the spare out gives it back (or wrote a new one).
            return slot.ok_or(libc::EIO);
        }
        if let Some((f, private)) = if named && self.evicted.wants(size) { self.evicted.take(size) } else { None } {
            let published = fill(&mut CopyDst::file(&f)).and_then(|()| {
                std::fs::rename(&private, self.path(id)).map_err(|e| {
                    log::error!("publishing the copy {}: {e}", self.path(id).display());
                    libc::EIO
                })
            });
            if let Err(e) = published {
                let _ = std::fs::remove_file(&private);
                return Err(e);
            }
            self.tiers.set(id, TIER_COPY);
            return Ok(Spare::new(f, size));
        }
        let f = self.tmpfile(relieve)?;
        fill(&mut CopyDst::file(&f))?;
        if named {
            link_unnamed(&f, &self.path(id))?;
            self.tiers.set(id, TIER_COPY);
        }
        Ok(Spare::new(f, size))
    }

    /// A new unnamed read-write file in the copy directory.
    fn tmpfile(&self, relieve: &dyn Fn()) -> Result<File, i32> {
        fdlimit::retry(relieve, || {
            // SAFETY: dir_c is a NUL-terminated path; O_TMPFILE needs a mode.
            let fd = unsafe { libc::open(self.dir_c.as_ptr(), libc::O_TMPFILE | libc::O_RDWR | libc::O_CLOEXEC, 0o400) };
            if fd < 0 {
                return Err(fdlimit::errno_of(&io::Error::last_os_error()));
            }
            // SAFETY: fd is a fresh fd that nothing else owns.
            Ok(File::from(unsafe { OwnedFd::from_raw_fd(fd) }))
        })
    }

    /// Makes the copy of node `id` now unless it exists (no fd for anyone):
    /// the background prefill and WARM copies. On the local disk when
    /// [`Copies::fits_disk`], else (or when that fails) in the copy
    /// directory. Returns false when the copy could not be made.
    pub fn prefill(&self, id: u32, size: u64, relieve: &dyn Fn(), fill: &Fill<'_>) -> bool {
        if matches!(self.tiers.get(id), TIER_COPY | TIER_EXTRACTED) {
            return true;
        }
        if let Some(d) = self.disk.as_ref().filter(|_| self.fits_disk(size)) {
            let made = d.cache.get_or_load(id, Duration::from_secs(10), libc::EIO, || {
                let rest = rest_tier(self.tiers.get(id));
                let f = self.make_on_disk(d, id, relieve, fill)?;
                let ino = f.metadata().map_err(|e| fdlimit::errno_of(&e))?.ino();
                Ok((CopyEntry { ino, size, rest }, charge(size)))
            });
            match made {
                Ok(_) => return true,
                Err(e) => log::debug!("copy of node {id} on the local disk: errno {e}; trying the copy directory"),
            }
        }
        self.keep(id, size, relieve, fill).is_some()
    }

    /// Makes the named copy of node `id` in the copy directory now unless
    /// it exists or is being made (then waits for that), with no fd for
    /// anyone: a concurrent OPEN of the file waits for this copy instead of
    /// making its own. `Some(true)`: made by this call; `Some(false)`: it
    /// was there; `None`: it does not fit the budget, or the fill failed.
    pub fn keep(&self, id: u32, size: u64, relieve: &dyn Fn(), fill: &Fill<'_>) -> Option<bool> {
        if matches!(self.tiers.get(id), TIER_COPY | TIER_EXTRACTED) {
            return Some(false);
        }
        if !self.fits(size) {
            return None;
        }
        let mut made = false;
        self.cache
            .get_or_load(id, Duration::from_secs(10), libc::EIO, || {
                let rest = rest_tier(self.tiers.get(id));
                let f = self.make(id, size, relieve, fill)?;
                let ino = f.file().metadata().map_err(|e| fdlimit::errno_of(&e))?.ino();
                made = true;
                Ok((CopyEntry { ino, size, rest }, charge(size)))
            })
            .ok()
            .map(|_| made)
    }

    /// An unnamed file in `local/in/<bucket>/`, filled by `fill`, then
    /// linked at the file's extraction path and recorded in the tier map.
    fn make_on_disk(&self, d: &DiskCopies, id: u32, relieve: &dyn Fn(), fill: &Fill<'_>) -> Result<File, i32> {
        let name = d.path(id);
        let bucket = name.parent().ok_or(libc::EIO)?;
        let bucket_c = CString::new(bucket.as_os_str().as_bytes()).map_err(|_| libc::EIO)?;
        let f = fdlimit::retry(relieve, || {
            // SAFETY: bucket_c is a NUL-terminated path; O_TMPFILE needs a mode.
            let fd = unsafe { libc::open(bucket_c.as_ptr(), libc::O_TMPFILE | libc::O_RDWR | libc::O_CLOEXEC, 0o400) };
            if fd < 0 {
                return Err(fdlimit::errno_of(&io::Error::last_os_error()));
            }
            // SAFETY: fd is a fresh fd that nothing else owns.
            Ok(File::from(unsafe { OwnedFd::from_raw_fd(fd) }))
        })?;
        fill(&mut CopyDst::file(&f))?;
        link_unnamed(&f, &name)?;
        self.tiers.set(id, TIER_EXTRACTED);
        Ok(f)
    }

    /// Whether a copy of `size` bytes can be kept (named) in the copy directory.
    pub fn fits(&self, size: u64) -> bool {
        charge(size) <= self.budget
    }

    /// Whether a background copy of `size` bytes goes to the local disk: of
    /// [`EXTRACT_MIN`] bytes or more, within `--cache-disk`, and leaving a
    /// twentieth of the local file system free.
    pub fn fits_disk(&self, size: u64) -> bool {
        self.disk.as_ref().is_some_and(|d| {
            size >= EXTRACT_MIN && charge(size) <= d.budget && room_for(&d.local_dir, charge(size))
        })
    }

    /// Whether a copy of `size` bytes fits the copy directory's free room
    /// now, evicting nothing.
    pub fn has_room(&self, size: u64) -> bool {
        self.cache.usage().0.saturating_add(charge(size)) <= self.budget
    }

    /// Whether a background copy of `size` bytes can be kept somewhere.
    pub fn can_keep(&self, size: u64) -> bool {
        self.fits(size) || self.fits_disk(size)
    }

    /// (bytes, entries) held in the copy directory.
    pub fn usage(&self) -> (u64, usize) {
        self.cache.usage()
    }

    /// (bytes, entries) held on the local disk.
    pub fn disk_usage(&self) -> (u64, usize) {
        self.disk.as_ref().map(|d| d.cache.usage()).unwrap_or_default()
    }
}

impl DiskCopies {
    fn path(&self, id: u32) -> PathBuf {
        fanstore_core::runtime::local_file_path(&self.local_dir, id)
    }
}

/// Links the unnamed file `f` at `name`, replacing a leftover no cache entry
/// owns (the caller holds the id's load).
fn link_unnamed(f: &File, name: &Path) -> Result<(), i32> {
    for attempt in 0..2 {
        let e = match fdio::link_unnamed(f, name) {
            Ok(()) => return Ok(()),
            Err(e) => fdlimit::errno_of(&e),
        };
        if e == libc::EEXIST && attempt == 0 {
            let _ = std::fs::remove_file(name);
            continue;
        }
        log::error!("linking the copy {}: errno {e}", name.display());
        return Err(libc::EIO);
    }
    Err(libc::EIO)
}

/// True when `dir` is on a file system held in memory (tmpfs, ramfs): a
/// "local disk" there is RAM the training program needs, and files on it
/// read no faster than the copy directory's. Looks at the nearest existing
/// ancestor when `dir` does not exist yet.
pub fn in_memory(dir: &Path) -> bool {
    const TMPFS_MAGIC: i64 = 0x0102_1994;
    const RAMFS_MAGIC: i64 = 0x8584_58f6;
    let Some(dir) = dir.ancestors().find(|d| d.exists()) else { return false };
    let Ok(c) = CString::new(dir.as_os_str().as_bytes()) else { return false };
    // SAFETY: an all-zero statfs is a valid value of this plain C struct.
    let mut s: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: c is NUL-terminated and s a valid out-pointer.
    if unsafe { libc::statfs(c.as_ptr(), &mut s) } != 0 {
        return false;
    }
    matches!(s.f_type as i64, TMPFS_MAGIC | RAMFS_MAGIC)
}

/// True when writing `len` more bytes under `dir` leaves a twentieth of its
/// file system free.
pub fn room_for(dir: &Path, len: u64) -> bool {
    space(dir).is_some_and(|(free, total)| free >= len.saturating_add(total / 20))
}

/// (bytes free for this user, total bytes) of the file system holding `dir`.
pub fn space(dir: &Path) -> Option<(u64, u64)> {
    let c = CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: an all-zero statvfs is a valid value of this plain C struct.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: c is NUL-terminated and s a valid out-pointer.
    if unsafe { libc::statvfs(c.as_ptr(), &mut s) } != 0 {
        return None;
    }
    let frag = s.f_frsize as u64;
    Some(((s.f_bavail as u64).saturating_mul(frag), (s.f_blocks as u64).saturating_mul(frag)))
}


/// Where a copy's bytes are written: its file, through the mapping kept with
/// it when it is a spare ([`crate::inputs::recycle`]), else with pwrite. Every byte
/// of the file must be written.
///
/// A spare can be lent to a remote read ([`CopyDst::lend`]) so the payload
/// is received straight into its pages, and given back once verified
/// ([`CopyDst::restore`]). A spare lent to a read that timed out stays with
/// the communication thread until the late bytes are in; the destination
/// then gets a new file of the same size for whatever writes it next.
pub struct CopyDst<'a> {
    to: To<'a>,
}

enum To<'a> {
    /// A new file, written with pwrite.
    File(&'a File),
    /// A spare of `size` bytes (None while lent); `renew` makes a new one.
    Spare { slot: &'a mut Option<Spare>, size: u64, renew: &'a Renew<'a> },
}

/// Makes a new spare-shaped file of the copy's size, every byte allocated.
pub type Renew<'a> = dyn Fn() -> Result<Spare, i32> + 'a;

/// What a copy is filled by: it writes the file's exact bytes into the
/// destination it is given.
pub type Fill<'a> = dyn Fn(&mut CopyDst<'_>) -> Result<(), i32> + 'a;

impl<'a> CopyDst<'a> {
    /// A destination written with pwrite.
    pub fn file(file: &'a File) -> CopyDst<'a> {
        CopyDst { to: To::File(file) }
    }

    /// The spare in `slot` (`size` bytes long, mapped now); `renew` gives
    /// a replacement should a lent spare not come back.
    fn spare(slot: &'a mut Option<Spare>, size: u64, renew: &'a Renew<'a>) -> CopyDst<'a> {
        if let Some(s) = slot.as_mut() {
            s.parts();
        }
        CopyDst { to: To::Spare { slot, size, renew } }
    }

    /// Whether the bytes go through a kept mapping (the file's pages exist).
    pub fn is_mapped(&self) -> bool {
        match &self.to {
            To::File(_) => false,
            To::Spare { slot, size, .. } => slot.as_ref().is_some_and(|s| *size > 0 && s.mapped(*size as usize).len() as u64 == *size),
        }
    }

    /// The file written with pwrite (None for a lent spare).
    pub fn as_file(&self) -> Option<&File> {
        match &self.to {
            To::File(f) => Some(f),
            To::Spare { slot, .. } => slot.as_ref().map(|s| s.file()),
        }
    }

    /// The mapped spare itself, to receive the file's exact bytes into
    /// (all of its mapping); None unless [`CopyDst::is_mapped`]. Give it
    /// back with [`CopyDst::restore`] once they are verified.
    pub fn lend(&mut self) -> Option<Spare> {
        if !self.is_mapped() {
            return None;
        }
        match &mut self.to {
            To::Spare { slot, .. } => slot.take(),
            To::File(_) => None,
        }
    }

    /// Gives back a spare from [`CopyDst::lend`], written whole.
    pub fn restore(&mut self, s: Spare) {
        if let To::Spare { slot, .. } = &mut self.to {
            **slot = Some(s);
        }
    }

    /// Where `len` bytes of the whole file go: the file, and its mapping if
    /// it is a mapped spare. EIO if a spare is not `len` bytes long.
    fn target(&mut self, len: usize) -> Result<(&File, Option<&mut [u8]>), i32> {
        match &mut self.to {
            To::File(f) => Ok((*f, None)),
            To::Spare { slot, size, renew } => {
                if slot.is_none() {
                    **slot = Some(renew()?);
                }
                match slot.as_mut() {
                    Some(s) if len as u64 == *size => Ok(s.parts()),
                    _ => Err(libc::EIO),
                }
            }
        }
    }

    /// Writes `bytes` as the whole file. EIO if the file is a spare not
    /// that long.
    pub fn write_all(&mut self, bytes: &[u8]) -> Result<(), i32> {
        match self.target(bytes.len())? {
            (_, Some(m)) => {
                m.copy_from_slice(bytes);
                Ok(())
            }
            (f, None) => write_all_at(f, bytes, 0),
        }
    }

    /// Lets `make` produce the file's `len` bytes in memory: straight into
    /// the mapping, else into `scratch` (resized to `len`), then written in.
    pub fn write_with(&mut self, len: usize, scratch: &mut Vec<u8>, make: impl FnOnce(&mut [u8]) -> Result<(), i32>) -> Result<(), i32> {
        match self.target(len)? {
            (_, Some(m)) => make(m),
            (f, None) => {
                scratch.resize(len, 0);
                make(&mut scratch[..len])?;
                write_all_at(f, &scratch[..len], 0)
            }
        }
    }
}


#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::sync::atomic::AtomicUsize;

    fn setup(budget: u64) -> (tempfile::TempDir, Arc<TierMap>, Copies) {
        let d = tempfile::tempdir().unwrap();
        let tiers = Arc::new(TierMap::create(&d.path().join("x.tiers"), 9, 10).unwrap());
        let copies = Copies::create(&d.path().join("x.copies"), tiers.clone(), budget).unwrap();
        (d, tiers, copies)
    }

    impl Copies {
        /// `open` for a reader that gets its fd from it (nobody answered).
        fn open_fd(&self, id: u32, size: u64, wait: Duration, relieve: &dyn Fn(), fill: &Fill<'_>) -> Result<OwnedFd, i32> {
            self.open(id, size, wait, relieve, fill, &|| false).map(|fd| fd.expect("not answered: an fd is made"))
        }
    }

    fn read(fd: OwnedFd) -> Vec<u8> {
        let mut v = Vec::new();
        File::from(fd).read_to_end(&mut v).unwrap();
        v
    }

    #[test]
    fn a_copy_is_made_once_published_and_evicted_by_budget() {
        let (_d, tiers, c) = setup(8192);
        let loads = AtomicUsize::new(0);
        let fill = |b: u8| {
            let loads = &loads;
            move |d: &mut CopyDst<'_>| {
                loads.fetch_add(1, Ordering::Relaxed);
                d.write_all(&[b; 100])
            }
        };
        let w = Duration::from_secs(1);
        assert_eq!(read(c.open_fd(1, 100, w, &|| {}, &fill(1)).unwrap()), vec![1; 100]);
        assert_eq!(tiers.get(1), TIER_COPY);
        assert_eq!(std::fs::read(c.dir().join("1")).unwrap(), vec![1; 100]);
        // Served from the named file, no second load.
        assert_eq!(read(c.open_fd(1, 100, w, &|| {}, &fill(9)).unwrap()), vec![1; 100]);
        assert_eq!(loads.load(Ordering::Relaxed), 1);
        // A third page-sized copy evicts the oldest: tier byte cleared, file gone.
        c.open_fd(2, 100, w, &|| {}, &fill(2)).unwrap();
        c.open_fd(3, 100, w, &|| {}, &fill(3)).unwrap();
        assert_eq!(c.usage(), (8192, 2));
        let gone: Vec<u32> = (1..=3).filter(|&i| tiers.get(i) == TIER_NONE).collect();
        assert_eq!(gone.len(), 1);
        assert!(!c.dir().join(gone[0].to_string()).exists());
        // The fd of a copy is read-only.
        let fd = c.open_fd(3, 100, w, &|| {}, &fill(3)).unwrap();
        let mut f = File::from(fd);
        assert!(std::io::Write::write_all(&mut f, b"x").is_err());
    }

    #[test]
    fn larger_than_the_budget_is_served_unnamed() {
        let (_d, tiers, c) = setup(4096);
        let fd = c.open_fd(4, 10_000, Duration::from_secs(1), &|| {}, &|d| d.write_all(&[7; 10_000])).unwrap();
        assert_eq!(read(fd), vec![7; 10_000]);
        assert!(!c.fits(10_000) && c.fits(4096) && c.fits(1));
        assert_eq!(tiers.get(4), TIER_NONE);
        assert_eq!(std::fs::read_dir(c.dir()).unwrap().count(), 0);
    }

    #[test]
    fn unnamed_copies_are_written_again_through_the_spares_mapping() {
        let (_d, _tiers, c) = setup(4096);
        let c = c.with_spares(1 << 20);
        let w = Duration::from_secs(1);
        let mapped = std::sync::Mutex::new(Vec::new());
        let fill = |b: u8, len: usize| {
            let mapped = &mapped;
            move |d: &mut CopyDst<'_>| {
                mapped.lock().unwrap().push(d.is_mapped());
                let mut scratch = Vec::new();
                d.write_with(len, &mut scratch, |out| {
                    out.iter_mut().enumerate().for_each(|(i, x)| *x = b ^ i as u8);
                    Ok(())
                })
            }
        };
        let want = |b: u8, len: usize| (0..len).map(|i| b ^ i as u8).collect::<Vec<u8>>();
        assert_eq!(read(c.open_fd(4, 10_000, w, &|| {}, &fill(1, 10_000)).unwrap()), want(1, 10_000));
        // The reader closed: its file is written again (through a mapping),
        // larger, then smaller, with exactly the new bytes each time.
        assert_eq!(read(c.open_fd(5, 30_000, w, &|| {}, &fill(2, 30_000)).unwrap()), want(2, 30_000));
        assert_eq!(read(c.open_fd(6, 5_000, w, &|| {}, &fill(3, 5_000)).unwrap()), want(3, 5_000));
        // A reader still open: a new file, written with pwrite.
        let held = c.open_fd(7, 6_000, w, &|| {}, &fill(4, 6_000)).unwrap();
        assert_eq!(read(c.open_fd(8, 6_000, w, &|| {}, &fill(5, 6_000)).unwrap()), want(5, 6_000));
        assert_eq!(read(held), want(4, 6_000), "a file a reader holds was written again");
        assert_eq!(*mapped.lock().unwrap(), [false, true, true, true, false]);
        assert_eq!(c.spares.reused.load(Ordering::Relaxed), 3);
        // A mapped destination of the wrong length is refused, not overrun.
        let mut slot = c.spares.take(6_000);
        assert!(slot.is_some(), "no free spare");
        let renew = || Err(libc::ENOSPC);
        let mut d = CopyDst::spare(&mut slot, 6_000, &renew);
        assert!(d.is_mapped());
        assert_eq!(d.write_all(&[0u8; 10]), Err(libc::EIO));
    }

    /// A fill lends the spare (as a remote read does, to receive into its
    /// pages) and writes the bytes through it: the reader sees exactly
    /// them, in the spare's own file. A fill whose spare never comes back
    /// (a receive that timed out keeps it) writes into a new file instead,
    /// and one that neither gives it back nor writes fails the open.
    #[test]
    fn a_spare_lent_to_a_fill_is_given_back_or_replaced() {
        let (_d, _tiers, c) = setup(4096);
        let c = c.with_spares(1 << 20);
        let w = Duration::from_secs(1);
        let plain = |d: &mut CopyDst<'_>| d.write_all(&[7u8; 20_000]);
        drop(c.open_fd(1, 20_000, w, &|| {}, &plain).unwrap());
        let spare_ino = std::sync::Mutex::new(0u64);
        let lend_and_restore = |d: &mut CopyDst<'_>| {
            let mut s = d.lend().expect("a mapped spare to lend");
            assert!(d.lend().is_none() && d.as_file().is_none(), "lent twice");
            *spare_ino.lock().unwrap() = s.file().metadata().unwrap().ino();
            let (_, bytes) = s.parts();
            bytes.expect("mapped").iter_mut().enumerate().for_each(|(i, x)| *x = i as u8);
            d.restore(s);
            Ok(())
        };
        let fd = c.open_fd(2, 20_000, w, &|| {}, &lend_and_restore).unwrap();
        let ino = std::fs::File::from(fd.try_clone().unwrap()).metadata().unwrap().ino();
        assert_eq!(ino, *spare_ino.lock().unwrap(), "the lent spare is not the copy served");
        assert_eq!(read(fd), (0..20_000).map(|i| i as u8).collect::<Vec<u8>>());
        // Lost: the bytes go into a new file of the same size.
        let lost = std::sync::Mutex::new(Vec::new());
        let lend_and_lose = |d: &mut CopyDst<'_>| {
            lost.lock().unwrap().push(d.lend().expect("a mapped spare to lend"));
            d.write_all(&[9u8; 20_000])
        };
        let fd = c.open_fd(3, 20_000, w, &|| {}, &lend_and_lose).unwrap();
        let ino = std::fs::File::from(fd.try_clone().unwrap()).metadata().unwrap().ino();
        assert_ne!(ino, lost.lock().unwrap()[0].file().metadata().unwrap().ino());
        assert_eq!(read(fd), vec![9u8; 20_000]);
        // Neither given back nor written: no copy, no fd.
        let lend_only = |d: &mut CopyDst<'_>| {
            lost.lock().unwrap().push(d.lend().expect("a mapped spare to lend"));
            Ok(())
        };
        assert_eq!(c.open_fd(4, 20_000, w, &|| {}, &lend_only).err(), Some(libc::EIO));
    }

    /// A reader answered during the fill (the communication thread sent it
    /// its own fd of the copy) gets no second fd, and the copy's file is
    /// still kept as a spare: the next copy of its size is written into it
    /// once the reader is done, and not while it reads.
    #[test]
    fn a_copy_whose_reader_was_answered_during_the_fill_makes_no_fd_and_stays_a_spare() {
        let (_d, _tiers, c) = setup(4096);
        let c = c.with_spares(1 << 20);
        let w = Duration::from_secs(1);
        let sent: std::sync::Mutex<Option<OwnedFd>> = std::sync::Mutex::new(None);
        let answer = |d: &mut CopyDst<'_>| {
            d.write_all(&[5u8; 20_000])?;
            let f = d.as_file().expect("an unnamed copy file");
            *sent.lock().unwrap() = Some(crate::fdio::reopen_raw(f.as_raw_fd())?);
            Ok(())
        };
        assert!(c.open(1, 20_000, w, &|| {}, &answer, &|| true).unwrap().is_none());
        let reader = sent.lock().unwrap().take().unwrap();
        let ino = |fd: &OwnedFd| std::fs::File::from(fd.try_clone().unwrap()).metadata().unwrap().ino();
        let first = ino(&reader);
        // Held by its reader: the next copy gets another file.
        let fd = c.open_fd(2, 20_000, w, &|| {}, &|d| d.write_all(&[6u8; 20_000])).unwrap();
        assert_ne!(ino(&fd), first);
        assert_eq!(read(reader), vec![5u8; 20_000]);
        drop(fd);
        // Both are done: copy 3 is written into the first copy's file.
        let fd = c.open_fd(3, 20_000, w, &|| {}, &|d| d.write_all(&[7u8; 20_000])).unwrap();
        assert_eq!(ino(&fd), first, "the answered copy's file was not kept");
        assert_eq!(read(fd), vec![7u8; 20_000]);
    }

    #[test]
    fn named_copies_are_written_into_the_files_of_evicted_ones() {
        let (_d, tiers, c) = setup(8192);
        let c = c.with_spares(1 << 20);
        c.evicted.set_min_size(1);
        let w = Duration::from_secs(1);
        let ino = |id: u32| std::fs::metadata(c.dir().join(id.to_string())).unwrap().ino();
        let fill = |b: u8, len: usize| move |d: &mut CopyDst<'_>| d.write_all(&vec![b; len]);
        read(c.open_fd(1, 4000, w, &|| {}, &fill(1, 4000)).unwrap());
        read(c.open_fd(2, 4000, w, &|| {}, &fill(2, 4000)).unwrap());
        let (ino1, ino2) = (ino(1), ino(2));
        // A reader of copy 2 keeps its fd. The cache evicts after a load:
        // copy 3 evicts copy 1, whose file copy 4 takes (no reader holds
        // it), under its own name.
        let reader2 = c.open_fd(2, 4000, w, &|| {}, &|_| Err(libc::EIO)).unwrap();
        assert_eq!(read(c.open_fd(3, 4000, w, &|| {}, &fill(3, 4000)).unwrap()), vec![3; 4000]);
        let ino3 = ino(3);
        assert_eq!(tiers.get(1), TIER_NONE);
        assert!(!c.dir().join("1").exists(), "the evicted name still opens");
        assert_eq!(read(c.open_fd(4, 6000, w, &|| {}, &fill(4, 6000)).unwrap()), vec![4; 6000]);
        assert_eq!(ino(4), ino1, "the evicted copy's file was not reused");
        assert_eq!(std::fs::read(c.dir().join("4")).unwrap(), vec![4; 6000]);
        // Copy 4 (a whole budget) evicted copies 2, still read, and 3: copy
        // 5 passes over copy 2's file and takes copy 3's; copy 2's reader
        // is untouched.
        assert_eq!(read(c.open_fd(5, 4000, w, &|| {}, &fill(5, 4000)).unwrap()), vec![5; 4000]);
        assert_eq!(ino(5), ino3);
        assert_ne!(ino(5), ino2, "a file a reader holds was written again");
        assert_eq!(read(reader2), vec![2; 4000]);
        assert_eq!(c.evicted.reused.load(Ordering::Relaxed), 2);
        // Nothing but copies and private names in the directory.
        for e in std::fs::read_dir(c.dir()).unwrap() {
            let n = e.unwrap().file_name().into_string().unwrap();
            assert!(n.parse::<u32>().is_ok() || n.starts_with(".evicted-"), "{n}");
        }
    }

    #[test]
    fn a_copy_unlinked_behind_the_cache_is_made_again() {
        let (_d, _tiers, c) = setup(1 << 20);
        let w = Duration::from_secs(1);
        c.open_fd(5, 10, w, &|| {}, &|d| d.write_all(b"0123456789")).unwrap();
        std::fs::remove_file(c.dir().join("5")).unwrap();
        let fd = c.open_fd(5, 10, w, &|| {}, &|d| d.write_all(b"abcdefghij")).unwrap();
        assert_eq!(read(fd), b"abcdefghij");
        assert!(c.dir().join("5").exists());
    }

    #[test]
    fn prefill_publishes_without_an_fd_and_is_idempotent() {
        let (_d, tiers, c) = setup(1 << 20);
        let loads = AtomicUsize::new(0);
        let fill = |d: &mut CopyDst<'_>| {
            loads.fetch_add(1, Ordering::Relaxed);
            d.write_all(b"pre")
        };
        assert!(c.prefill(7, 3, &|| {}, &fill));
        assert!(c.prefill(7, 3, &|| {}, &fill));
        assert_eq!(loads.load(Ordering::Relaxed), 1);
        assert_eq!(tiers.get(7), TIER_COPY);
        assert_eq!(std::fs::read(c.dir().join("7")).unwrap(), b"pre");
        assert!(!c.prefill(8, 3, &|| {}, &|_| Err(libc::EIO)));
        assert_eq!(tiers.get(8), TIER_NONE);
    }

    #[test]
    fn a_failed_fill_leaves_nothing() {
        let (_d, tiers, c) = setup(1 << 20);
        assert_eq!(c.open_fd(6, 10, Duration::from_secs(1), &|| {}, &|_| Err(libc::EIO)).err(), Some(libc::EIO));
        assert_eq!(tiers.get(6), TIER_NONE);
        assert_eq!(std::fs::read_dir(c.dir()).unwrap().count(), 0);
    }

    #[test]
    fn background_copies_of_large_files_go_to_the_local_disk_within_its_budget() {
        let (d, tiers, c) = setup(1 << 20);
        let local = d.path().join("local");
        crate::inputs::load::prepare_local_dir(&local).unwrap();
        let big = EXTRACT_MIN as usize;
        // Room for two large copies on disk.
        let c = c.with_disk(&local, 2 * EXTRACT_MIN);
        let fill = |b: u8, len: usize| move |d: &mut CopyDst<'_>| d.write_all(&vec![b; len]);
        assert!(c.can_keep(EXTRACT_MIN) && c.fits_disk(EXTRACT_MIN) && !c.fits_disk(EXTRACT_MIN - 1));
        assert!(c.prefill(1, EXTRACT_MIN, &|| {}, &fill(1, big)));
        let on_disk = |id| fanstore_core::runtime::local_file_path(&local, id);
        assert_eq!(tiers.get(1), TIER_EXTRACTED);
        assert_eq!(std::fs::read(on_disk(1)).unwrap(), vec![1; big]);
        assert_eq!(c.disk_usage(), (EXTRACT_MIN, 1));
        assert_eq!(c.usage(), (0, 0));
        // A small file goes to the copy directory.
        assert!(c.prefill(2, 10, &|| {}, &fill(2, 10)));
        assert_eq!(tiers.get(2), TIER_COPY);
        // The daemon's OPEN finds the disk copy without loading it again.
        let fd = c.open_fd(1, EXTRACT_MIN, Duration::from_secs(1), &|| {}, &|_| Err(libc::EIO)).unwrap();
        assert_eq!(read(fd), vec![1; big]);
        // Two more large copies: the least recently used one is evicted,
        // its tier byte cleared and its file unlinked.
        assert!(c.prefill(3, EXTRACT_MIN, &|| {}, &fill(3, big)));
        assert!(c.prefill(4, EXTRACT_MIN, &|| {}, &fill(4, big)));
        assert_eq!(c.disk_usage(), (2 * EXTRACT_MIN, 2));
        assert_eq!(tiers.get(1), TIER_NONE);
        assert!(!on_disk(1).exists());
        assert!(on_disk(3).exists() && on_disk(4).exists());
        // An OPEN while a program waits makes its copy in memory.
        let fd = c.open_fd(5, EXTRACT_MIN, Duration::from_secs(1), &|| {}, &fill(5, big)).unwrap();
        assert_eq!(read(fd), vec![5; big]);
        assert_eq!(tiers.get(5), TIER_COPY);
    }

    #[test]
    fn a_failed_disk_copy_falls_back_to_the_copy_directory() {
        let (d, tiers, c) = setup(1 << 20);
        // No bucket directories: O_TMPFILE in local/in/xx fails.
        let c = c.with_disk(&d.path().join("missing"), 1 << 30);
        std::fs::create_dir_all(d.path().join("missing")).unwrap();
        let big = EXTRACT_MIN as usize;
        assert!(c.prefill(6, EXTRACT_MIN, &|| {}, &|d| d.write_all(&vec![6; big])));
        assert_eq!(tiers.get(6), TIER_COPY);
        assert_eq!(std::fs::read(c.dir().join("6")).unwrap(), vec![6; big]);
        // --cache-disk 0: every copy in memory.
        let (_d2, tiers2, c2) = setup(1 << 20);
        let c2 = c2.with_disk(Path::new("/nonexistent"), 0);
        assert!(c2.disk().is_none() && !c2.fits_disk(EXTRACT_MIN));
        assert!(c2.prefill(7, EXTRACT_MIN, &|| {}, &|d| d.write_all(&vec![7; big])));
        assert_eq!(tiers2.get(7), TIER_COPY);
    }
}
