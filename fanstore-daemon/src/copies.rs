//! Where a dataset file's own bytes live once it has been opened on this
//! node: the tier map and the copy directory (format and client rules in
//! [`fanstore_core::tiers`]).
//!
//! [`TierMap`] is the daemon's writable mapping of the shared tier map.
//! [`Copies`] owns the copy directory (`….copies` in shared memory): a file
//! is created unnamed (O_TMPFILE), filled, linked under its node id and
//! recorded in the node cache ([`crate::cache`]) with its size rounded up to
//! pages; the cache's eviction hook clears the tier byte and unlinks the
//! file under the cache lock, so a cached entry always has its file. Nothing
//! keeps an fd open per copy; concurrent first opens of one file share one
//! load. Clients that open a copy directly do not refresh its place in the
//! LRU order, so for them eviction is first-in first-out.

use crate::cache::Cache;
use crate::fdlimit;
use fanstore_core::tiers::{self, TIER_COPY, TIER_NONE};
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
        let f = std::fs::OpenOptions::new().read(true).write(true).create_new(true).mode(0o600).open(path)?;
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
    /// extracted or copied keeps that tier).
    pub fn set_if(&self, id: u32, from: u8, tier: u8) {
        if let Some(c) = self.cell(id) {
            let _ = c.compare_exchange(from, tier, Ordering::AcqRel, Ordering::Acquire);
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// A cached copy: its inode, to tell a stale entry from a fresh one.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct CopyEntry {
    ino: u64,
}

/// The copy directory and its budget.
pub struct Copies {
    dir: PathBuf,
    dir_c: CString,
    tiers: Arc<TierMap>,
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
        std::fs::DirBuilder::new().mode(0o700).create(dir)?;
        let dir_c = CString::new(dir.as_os_str().as_bytes()).map_err(|_| io::ErrorKind::InvalidInput)?;
        let hook_dir = dir.to_path_buf();
        let hook_tiers = tiers.clone();
        let on_evict: crate::cache::EvictHook<CopyEntry> = Box::new(move |id, _| {
            hook_tiers.set(id, TIER_NONE);
            let _ = std::fs::remove_file(hook_dir.join(id.to_string()));
        });
        Ok(Copies {
            dir: dir.to_path_buf(),
            dir_c,
            tiers,
            cache: Cache::with_limits(budget, usize::MAX, Some(on_evict)),
            budget,
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path(&self, id: u32) -> PathBuf {
        self.dir.join(id.to_string())
    }

    /// A read-only fd on the copy of node `id` (`size` bytes), made now by
    /// `fill` (which writes the file's exact bytes into the file it is given)
    /// unless a copy exists or is being made by another thread (then waits
    /// at most `wait`). `relieve` frees fds when the process runs out.
    pub fn open(
        &self,
        id: u32,
        size: u64,
        wait: Duration,
        relieve: &dyn Fn(),
        fill: &dyn Fn(&File) -> Result<(), i32>,
    ) -> Result<OwnedFd, i32> {
        if self.tiers.get(id) == TIER_COPY {
            if let Ok(fd) = fdlimit::retry(relieve, || open_ro(&self.path(id))) {
                self.cache.touch(id);
                self.cache.stats.hits.fetch_add(1, Ordering::Relaxed);
                return Ok(fd);
            }
        }
        let mut last = libc::EIO;
        for _ in 0..3 {
            let mut fresh: Option<File> = None;
            let entry = self.cache.get_or_load(id, wait, libc::EIO, || {
                let f = self.make(id, size, relieve, fill)?;
                let ino = f.metadata().map_err(|e| fdlimit::errno_of(&e))?.ino();
                fresh = Some(f);
                Ok((CopyEntry { ino }, charge(size)))
            });
            let entry = match entry {
                Ok(e) => e,
                Err(libc::ENOSPC) => {
                    // The copy directory's file system is full: make room, try again.
                    self.cache.shed();
                    last = libc::ENOSPC;
                    continue;
                }
                Err(e) => return Err(e),
            };
            if let Some(f) = fresh {
                // Our own load: a read-only description of the file we filled.
                return fdlimit::retry(relieve, || open_ro(Path::new(&format!("/proc/self/fd/{}", f.as_raw_fd()))));
            }
            match fdlimit::retry(relieve, || open_ro(&self.path(id))) {
                Ok(fd) => return Ok(fd),
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
    /// budget: then it is served unnamed and vanishes with its last fd).
    fn make(&self, id: u32, size: u64, relieve: &dyn Fn(), fill: &dyn Fn(&File) -> Result<(), i32>) -> Result<File, i32> {
        let f = fdlimit::retry(relieve, || {
            // SAFETY: dir_c is a NUL-terminated path; O_TMPFILE needs a mode.
            let fd = unsafe { libc::open(self.dir_c.as_ptr(), libc::O_TMPFILE | libc::O_RDWR | libc::O_CLOEXEC, 0o400) };
            if fd < 0 {
                return Err(fdlimit::errno_of(&io::Error::last_os_error()));
            }
            // SAFETY: fd is a fresh fd that nothing else owns.
            Ok(File::from(unsafe { OwnedFd::from_raw_fd(fd) }))
        })?;
        fill(&f)?;
        if charge(size) <= self.budget {
            let name = self.path(id);
            let src = CString::new(format!("/proc/self/fd/{}", f.as_raw_fd())).map_err(|_| libc::EIO)?;
            let dst = CString::new(name.as_os_str().as_bytes()).map_err(|_| libc::EIO)?;
            for attempt in 0..2 {
                // SAFETY: both paths are NUL-terminated; AT_SYMLINK_FOLLOW links
                // the file the /proc link points to (our unnamed file).
                let r = unsafe { libc::linkat(libc::AT_FDCWD, src.as_ptr(), libc::AT_FDCWD, dst.as_ptr(), libc::AT_SYMLINK_FOLLOW) };
                if r == 0 {
                    break;
                }
                let e = fdlimit::errno_of(&io::Error::last_os_error());
                if e == libc::EEXIST && attempt == 0 {
                    // A leftover no cache entry owns (we hold the id's load): replace it.
                    let _ = std::fs::remove_file(&name);
                    continue;
                }
                log::error!("linking the copy {}: errno {e}", name.display());
                return Err(libc::EIO);
            }
            self.tiers.set(id, TIER_COPY);
        }
        Ok(f)
    }

    /// Makes the copy of node `id` now unless it exists (no fd for anyone):
    /// the background prefill. Returns false when the copy could not be made.
    pub fn prefill(&self, id: u32, size: u64, relieve: &dyn Fn(), fill: &dyn Fn(&File) -> Result<(), i32>) -> bool {
        if self.tiers.get(id) == TIER_COPY {
            return true;
        }
        self.cache.get_or_load(id, Duration::from_secs(10), libc::EIO, || {
            let f = self.make(id, size, relieve, fill)?;
            let ino = f.metadata().map_err(|e| fdlimit::errno_of(&e))?.ino();
            Ok((CopyEntry { ino }, charge(size)))
        })
        .is_ok()
    }

    /// Whether a copy of `size` bytes can be kept (named) within the budget.
    pub fn fits(&self, size: u64) -> bool {
        charge(size) <= self.budget
    }

    /// (bytes, entries) held.
    pub fn usage(&self) -> (u64, usize) {
        self.cache.usage()
    }
}

/// Opens `path` read-only (O_NOATIME where allowed); the errno on failure.
pub fn open_ro(path: &Path) -> Result<OwnedFd, i32> {
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_CLOEXEC | libc::O_NOATIME)
        .open(path)
        .or_else(|e| match e.raw_os_error() {
            Some(libc::EPERM) => std::fs::OpenOptions::new().read(true).custom_flags(libc::O_CLOEXEC).open(path),
            _ => Err(e),
        })
        .map(OwnedFd::from)
        .map_err(|e| fdlimit::errno_of(&e))
}

/// Writes all of `bytes` at `offset` of `f`.
pub fn write_all_at(f: &File, bytes: &[u8], offset: u64) -> Result<(), i32> {
    use std::os::unix::fs::FileExt;
    f.write_all_at(bytes, offset).map_err(|e| fdlimit::errno_of(&e))
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
            move |f: &File| {
                loads.fetch_add(1, Ordering::Relaxed);
                write_all_at(f, &[b; 100], 0)
            }
        };
        let w = Duration::from_secs(1);
        assert_eq!(read(c.open(1, 100, w, &|| {}, &fill(1)).unwrap()), vec![1; 100]);
        assert_eq!(tiers.get(1), TIER_COPY);
        assert_eq!(std::fs::read(c.dir().join("1")).unwrap(), vec![1; 100]);
        // Served from the named file, no second load.
        assert_eq!(read(c.open(1, 100, w, &|| {}, &fill(9)).unwrap()), vec![1; 100]);
        assert_eq!(loads.load(Ordering::Relaxed), 1);
        // A third page-sized copy evicts the oldest: tier byte cleared, file gone.
        c.open(2, 100, w, &|| {}, &fill(2)).unwrap();
        c.open(3, 100, w, &|| {}, &fill(3)).unwrap();
        assert_eq!(c.usage(), (8192, 2));
        let gone: Vec<u32> = (1..=3).filter(|&i| tiers.get(i) == TIER_NONE).collect();
        assert_eq!(gone.len(), 1);
        assert!(!c.dir().join(gone[0].to_string()).exists());
        // The fd of a copy is read-only.
        let fd = c.open(3, 100, w, &|| {}, &fill(3)).unwrap();
        let mut f = File::from(fd);
        assert!(std::io::Write::write_all(&mut f, b"x").is_err());
    }

    #[test]
    fn larger_than_the_budget_is_served_unnamed() {
        let (_d, tiers, c) = setup(4096);
        let fd = c.open(4, 10_000, Duration::from_secs(1), &|| {}, &|f| write_all_at(f, &[7; 10_000], 0)).unwrap();
        assert_eq!(read(fd), vec![7; 10_000]);
        assert!(!c.fits(10_000) && c.fits(4096) && c.fits(1));
        assert_eq!(tiers.get(4), TIER_NONE);
        assert_eq!(std::fs::read_dir(c.dir()).unwrap().count(), 0);
    }

    #[test]
    fn a_copy_unlinked_behind_the_cache_is_made_again() {
        let (_d, _tiers, c) = setup(1 << 20);
        let w = Duration::from_secs(1);
        c.open(5, 10, w, &|| {}, &|f| write_all_at(f, b"0123456789", 0)).unwrap();
        std::fs::remove_file(c.dir().join("5")).unwrap();
        let fd = c.open(5, 10, w, &|| {}, &|f| write_all_at(f, b"abcdefghij", 0)).unwrap();
        assert_eq!(read(fd), b"abcdefghij");
        assert!(c.dir().join("5").exists());
    }

    #[test]
    fn prefill_publishes_without_an_fd_and_is_idempotent() {
        let (_d, tiers, c) = setup(1 << 20);
        let loads = AtomicUsize::new(0);
        let fill = |f: &File| {
            loads.fetch_add(1, Ordering::Relaxed);
            write_all_at(f, b"pre", 0)
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
        assert_eq!(c.open(6, 10, Duration::from_secs(1), &|| {}, &|_| Err(libc::EIO)).err(), Some(libc::EIO));
        assert_eq!(tiers.get(6), TIER_NONE);
        assert_eq!(std::fs::read_dir(c.dir()).unwrap().count(), 0);
    }
}
