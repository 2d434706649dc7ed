//! Spare copy files: the pages of a copy nobody reads any more, written
//! again for the next copy instead of freed and allocated anew.
//!
//! A copy that is not kept (past `--cache-mem`, or evicted from it) used to
//! vanish with its reader's last fd: its pages went back to the kernel and
//! the next copy faulted in fresh ones. Fresh pages are the largest cost of
//! a remote read on a virtual machine (measured here: a new 128 KiB memfd
//! written whole 86 µs against 13 µs to rewrite one; 1.4 ms against 0.24 ms
//! at 2 MiB). So the daemon keeps its own read-write fd of such a file, up
//! to a byte budget, and writes the next copy into it once no one else
//! holds it.
//!
//! "No one else" is asked of the kernel: a write lease (`F_SETLEASE`
//! `F_WRLCK`) is granted only while the inode has no other open file
//! description: not a program's fd, nor a dup or a forked child's copy of
//! it, nor a mapping of it, nor an fd in flight in a socket message. A
//! spare has no name, so once the lease is granted nobody can open it anew;
//! the lease is released at once. A file system without leases turns the
//! recycling off (logged once) and copies get fresh files, as before.
//!
//! A spare keeps a shared mapping of its file once it is written again, and
//! the next copy is written through it: on this machine a pwrite into a
//! memfd's existing pages costs about 4x a memcpy into a kept mapping of
//! them (128 KiB 12.9-15.5 against 3.1-3.5 µs; 2 MiB 243-263 against
//! 61-67 µs; 8 MiB 2.4-2.7 against 0.59-0.75 ms). A mapping of the
//! daemon's own description does not count against the lease: it is the
//! same open file description.
//!
//! ```no_run
//! # use fanstore_daemon::inputs::recycle::{Spare, Spares};
//! # let (made, size) = (tempfile::tempfile().unwrap(), 4096);
//! let spares = Spares::new(32 << 20);
//! spares.keep(Spare::new(made, size));     // after the reader got its own fd
//! if let Some(mut s) = spares.take(size) { // later: nobody holds it any more
//!     // s is `size` bytes long; write every byte of the next copy into it
//!     let (_file, bytes) = s.parts();
//!     if let Some(b) = bytes { b.fill(0) }
//! }
//! ```

use std::collections::VecDeque;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;

/// Spares looked at per take: each look is a system call.
const LOOKS: usize = 8;
/// At most this many files are kept, whatever their size.
const MAX_FILES: usize = 64;
/// fcntl's F_SETSIG (Linux, every architecture; the libc crate lacks it).
const F_SETSIG: libc::c_int = 10;

/// A shared read-write mapping of a spare's file, unmapped on drop.
struct SpareMap {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain memory owned by one `Spare` at a time.
unsafe impl Send for SpareMap {}

impl Drop for SpareMap {
    fn drop(&mut self) {
        // SAFETY: our own mapping of `len` bytes, referred to by nothing else.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// The read-write fd of an unnamed copy file of `size` bytes that the
/// daemon may write again, with the mapping it keeps of it, if any.
pub struct Spare {
    file: File,
    size: u64,
    map: Option<SpareMap>,
    /// The file's inode number, once asked ([`Spare::ino`]): a spare
    /// written again is the same file.
    ino: Option<u64>,
    /// Whether a lease break on it signals SIGURG already ([`Spares::keep`]).
    signal_set: bool,
}

impl Spare {
    /// A copy file (the daemon's own read-write description) of `size` bytes.
    pub fn new(file: File, size: u64) -> Spare {
        Spare { file, size, map: None, ino: None, signal_set: false }
    }

    /// The file's inode number (one fstat the first time only).
    pub fn ino(&mut self) -> Result<u64, i32> {
        if let Some(i) = self.ino {
            return Ok(i);
        }
        use std::os::unix::fs::MetadataExt;
        let i = self.file.metadata().map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))?.ino();
        self.ino = Some(i);
        Ok(i)
    }

    /// A new, empty copy file grown to `size` bytes, every one allocated.
    pub fn allocated(file: File, size: u64) -> Result<Spare, i32> {
        resize(&file, 0, size)?;
        Ok(Spare::new(file, size))
    }

    pub fn file(&self) -> &File {
        &self.file
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    /// The first `len` bytes (at most `size`) through the kept mapping, if
    /// one exists; empty otherwise.
    pub fn mapped(&self, len: usize) -> &[u8] {
        let len = len.min(usize::try_from(self.size).unwrap_or(usize::MAX));
        match &self.map {
            // SAFETY: the mapping covers at least `size` bytes of the file,
            // all of them allocated; writes to them need `&mut self`.
            Some(m) if len <= m.len => unsafe { std::slice::from_raw_parts(m.ptr.as_ptr(), len) },
            _ => &[],
        }
    }

    /// The file, and its `size` bytes through the kept mapping (made or
    /// grown now; None if mapping fails: write the file instead).
    pub fn parts(&mut self) -> (&File, Option<&mut [u8]>) {
        let len = usize::try_from(self.size).unwrap_or(usize::MAX);
        if len == 0 {
            return (&self.file, None);
        }
        if self.map.as_ref().is_none_or(|m| m.len < len) {
            self.map = None;
            let want = len.next_multiple_of(4096);
            // SAFETY: a new shared mapping of our own file, which is `len`
            // bytes long (the pages past its end are never touched).
            let p = unsafe {
                libc::mmap(std::ptr::null_mut(), want, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, self.file.as_raw_fd(), 0)
            };
            if p == libc::MAP_FAILED {
                return (&self.file, None);
            }
            // Writable page table entries now, not one write fault per page
            // later (best effort: older kernels lack it).
            // SAFETY: madvise on the mapping just made.
            unsafe { libc::madvise(p, len, MADV_POPULATE_WRITE) };
            self.map = NonNull::new(p.cast::<u8>()).map(|ptr| SpareMap { ptr, len: want });
        }
        match &self.map {
            // SAFETY: the mapping covers `len` bytes of the file, all of them
            // allocated (see `Spares::take`); `&mut self` makes this the only
            // reference to them in this process, and the lease granted at the
            // take says no one else has the file open.
            Some(m) => (&self.file, Some(unsafe { std::slice::from_raw_parts_mut(m.ptr.as_ptr(), len) })),
            None => (&self.file, None),
        }
    }
}

/// The smallest evicted copy kept for its pages ([`Evicted`]).
pub const EVICTED_MIN: u64 = 256 << 10;

/// madvise's MADV_POPULATE_WRITE (Linux 5.14).
const MADV_POPULATE_WRITE: libc::c_int = 23;

/// A bounded set of unnamed copy files kept for reuse.
pub struct Spares {
    kept: Mutex<VecDeque<Spare>>,
    budget: u64,
    bytes: AtomicU64,
    usable: AtomicBool,
    /// Copies written into a spare (STATUS `copies_reused`).
    pub reused: AtomicU64,
}

/// Whether `f` has no open file description but the caller's. Err: the
/// file system grants no leases.
fn unshared(f: &File) -> Result<bool, i32> {
    // SAFETY: F_SETLEASE on our own fd; no pointer arguments.
    if unsafe { libc::fcntl(f.as_raw_fd(), libc::F_SETLEASE, libc::F_WRLCK) } == 0 {
        // SAFETY: as above; releases the lease just granted.
        unsafe { libc::fcntl(f.as_raw_fd(), libc::F_SETLEASE, libc::F_UNLCK) };
        return Ok(true);
    }
    match std::io::Error::last_os_error().raw_os_error() {
        Some(libc::EAGAIN) | Some(libc::EBUSY) => Ok(false),
        Some(e) => Err(e),
        None => Err(libc::EIO),
    }
}

/// Sizes `f`, a copy file of `old` bytes all written, to `new` bytes with
/// every byte allocated: what it gains is allocated (so a write through a
/// mapping never meets a full file system), what it loses is truncated.
fn resize(f: &File, old: u64, new: u64) -> Result<(), i32> {
    let last = || std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO);
    if new > old {
        let (Ok(at), Ok(len)) = (libc::off_t::try_from(old), libc::off_t::try_from(new - old)) else { return Err(libc::EFBIG) };
        // SAFETY: fallocate on our own file; no pointer arguments.
        return if unsafe { libc::fallocate(f.as_raw_fd(), 0, at, len) } == 0 { Ok(()) } else { Err(last()) };
    }
    if new == old {
        return Ok(());
    }
    f.set_len(new).map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))
}

impl Spares {
    /// Keeps at most `budget` bytes of spare files (0: none).
    pub fn new(budget: u64) -> Spares {
        Spares {
            kept: Mutex::new(VecDeque::new()),
            budget,
            bytes: AtomicU64::new(0),
            usable: AtomicBool::new(budget > 0),
            reused: AtomicU64::new(0),
        }
    }

    /// Keeps `s`, the read-write fd of an unnamed copy (and its mapping),
    /// for a later [`Spares::take`]. Call it only after the reader's own
    /// description of the file exists. Drops the oldest spares over budget.
    pub fn keep(&self, mut s: Spare) {
        let size = s.size;
        if !self.usable.load(Relaxed) || size == 0 || size > self.budget {
            return;
        }
        // A lease's break (someone opening the file while the lease is
        // held, for the microseconds of a take) signals the lease holder,
        // with SIGIO by default, whose default action ends the process. No
        // one can open an unnamed spare but through this process's
        // /proc/PID/fd; should someone, SIGURG (ignored by default) is the
        // signal instead.
        // SAFETY: F_SETSIG on our own fd; no pointer arguments.
        if !s.signal_set && unsafe { libc::fcntl(s.file.as_raw_fd(), F_SETSIG, libc::SIGURG) } != 0 {
            return;
        }
        s.signal_set = true;
        let mut dropped = Vec::new();
        {
            let Ok(mut kept) = self.kept.lock() else { return };
            kept.push_back(s);
            let mut bytes = self.bytes.load(Relaxed) + size;
            while bytes > self.budget || kept.len() > MAX_FILES {
                let Some(old) = kept.pop_front() else { break };
                bytes -= old.size;
                dropped.push(old);
            }
            self.bytes.store(bytes, Relaxed);
        }
        drop(dropped); // closed and unmapped outside the lock
    }

    /// A kept file nobody else holds, sized to `size` bytes, oldest first;
    /// None when none is free. Every byte of `0..size` is allocated (a
    /// write through the mapping never meets a full file system). The
    /// caller must write every byte of `0..size` before anyone reads it.
    pub fn take(&self, size: u64) -> Option<Spare> {
        if !self.usable.load(Relaxed) {
            return None;
        }
        let found = {
            let mut kept = self.kept.lock().ok()?;
            let mut found = None;
            for i in 0..kept.len().min(LOOKS) {
                match unshared(&kept[i].file) {
                    Ok(true) => {
                        found = kept.remove(i);
                        break;
                    }
                    Ok(false) => {}
                    Err(e) => {
                        log::warn!("copy files cannot be reused here (F_SETLEASE: errno {e}): each copy gets new pages");
                        self.usable.store(false, Relaxed);
                        kept.clear();
                        self.bytes.store(0, Relaxed);
                        return None;
                    }
                }
            }
            if let Some(s) = &found {
                self.bytes.fetch_sub(s.size, Relaxed);
            }
            found
        };
        let mut s = found?;
        if resize(&s.file, s.size, size).is_err() {
            return None;
        }
        s.size = size;
        self.reused.fetch_add(1, Relaxed);
        Some(s)
    }

    /// Closes every spare (the process is short of fds). Returns how many.
    pub fn shed(&self) -> usize {
        let Ok(mut kept) = self.kept.lock() else { return 0 };
        let n = kept.len();
        kept.clear();
        self.bytes.store(0, Relaxed);
        n
    }

    /// (bytes, files) kept.
    pub fn usage(&self) -> (u64, usize) {
        (self.bytes.load(Relaxed), self.kept.lock().map(|k| k.len()).unwrap_or(0))
    }
}

/// Named copies the cache evicted, kept under private names in the copy
/// directory for their pages: the next named copy is written into one of
/// them and renamed to its own name, instead of new pages that are
/// allocated while the evicted ones are freed. Beyond `--cache-mem` every
/// new copy evicts one, and on this machine 4 daemons, 4 readers (3/4
/// remote) read 0.71-0.75x as fast with `--cache-mem 16M` (evicting) as
/// with `--cache-mem 0` (unnamed copies in [`Spares`]).
///
/// A private name (`.evicted-N`) is never opened by clients (they open a
/// copy by its node id, after the tier map says it exists; the eviction
/// sets the tier byte back before the rename). So once renamed, a file only
/// loses descriptions, and the write lease, asked after the rename, says
/// when none but ours is left. Those still held are looked at again later.
///
/// Only copies of [`EVICTED_MIN`] bytes or more are kept: reusing a file
/// costs an open, a lease and two renames, about what a small file's new
/// pages cost (128 KiB copies measured no faster either way; 2 and 8 MiB
/// copies 12% and 24% faster in aggregate).
pub struct Evicted {
    kept: Mutex<VecDeque<(std::path::PathBuf, u64)>>,
    min: AtomicU64,
    budget: AtomicU64,
    bytes: AtomicU64,
    seq: AtomicU64,
    usable: AtomicBool,
    /// Copies written into an evicted file (STATUS `copies_reused`).
    pub reused: AtomicU64,
}

impl Default for Evicted {
    fn default() -> Self {
        Evicted::new(0)
    }
}

impl Evicted {
    /// Keeps at most `budget` bytes of evicted files (0: none).
    pub fn new(budget: u64) -> Evicted {
        Evicted {
            kept: Mutex::new(VecDeque::new()),
            min: AtomicU64::new(EVICTED_MIN),
            budget: AtomicU64::new(budget),
            bytes: AtomicU64::new(0),
            seq: AtomicU64::new(0),
            usable: AtomicBool::new(true),
            reused: AtomicU64::new(0),
        }
    }

    pub fn set_budget(&self, budget: u64) {
        self.budget.store(budget, Relaxed);
    }

    /// Keeps copies of `min` bytes or more (default [`EVICTED_MIN`]).
    pub fn set_min_size(&self, min: u64) {
        self.min.store(min, Relaxed);
    }

    /// Whether a copy of `size` bytes is worth writing into an evicted file.
    pub fn wants(&self, size: u64) -> bool {
        size >= self.min.load(Relaxed) && size <= self.budget.load(Relaxed)
    }

    /// The copy `name` (of `size` bytes, in directory `dir`) was evicted
    /// and its tier byte cleared: renamed to a private name and kept, or
    /// (over budget, or not reusable here) removed. Files over budget go
    /// oldest first.
    pub fn keep(&self, dir: &std::path::Path, name: &std::path::Path, size: u64) {
        let budget = self.budget.load(Relaxed);
        if !self.usable.load(Relaxed) || size == 0 || !self.wants(size) {
            let _ = std::fs::remove_file(name);
            return;
        }
        let private = dir.join(format!(".evicted-{}", self.seq.fetch_add(1, Relaxed)));
        if std::fs::rename(name, &private).is_err() {
            let _ = std::fs::remove_file(name);
            return;
        }
        let mut dropped = Vec::new();
        if let Ok(mut kept) = self.kept.lock() {
            kept.push_back((private, size));
            let mut bytes = self.bytes.load(Relaxed) + size;
            while bytes > budget || kept.len() > MAX_FILES {
                let Some((old, n)) = kept.pop_front() else { break };
                bytes -= n;
                dropped.push(old);
            }
            self.bytes.store(bytes, Relaxed);
        }
        for old in dropped {
            let _ = std::fs::remove_file(old);
        }
    }

    /// An evicted file nobody holds any more, opened read-write and sized
    /// to `size` bytes (every byte allocated), with its private name; None
    /// when none is free. The caller writes every byte of `0..size`, then
    /// renames it to the copy's name (or removes it).
    pub fn take(&self, size: u64) -> Option<(File, std::path::PathBuf)> {
        if !self.usable.load(Relaxed) {
            return None;
        }
        for _ in 0..LOOKS {
            let (name, old) = self.kept.lock().ok()?.pop_front()?;
            self.bytes.fetch_sub(old, Relaxed);
            let f = match std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
                .open(&name)
            {
                Ok(f) => f,
                Err(e) if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) => {
                    if let Ok(mut kept) = self.kept.lock() {
                        kept.push_front((name, old));
                        self.bytes.fetch_add(old, Relaxed);
                    }
                    return None;
                }
                Err(_) => {
                    let _ = std::fs::remove_file(&name);
                    continue;
                }
            };
            // As for spares: a lease break signals SIGURG, not SIGIO.
            // SAFETY: F_SETSIG on our own fd; no pointer arguments.
            unsafe { libc::fcntl(f.as_raw_fd(), F_SETSIG, libc::SIGURG) };
            match unshared(&f) {
                Ok(true) => {}
                Ok(false) => {
                    // A reader still has it: looked at again after the others.
                    drop(f);
                    if let Ok(mut kept) = self.kept.lock() {
                        kept.push_back((name, old));
                        self.bytes.fetch_add(old, Relaxed);
                    }
                    continue;
                }
                Err(e) => {
                    log::warn!("evicted copies cannot be reused here (F_SETLEASE: errno {e}): each copy gets new pages");
                    self.usable.store(false, Relaxed);
                    let _ = std::fs::remove_file(&name);
                    return None;
                }
            }
            if resize(&f, old, size).is_err() {
                let _ = std::fs::remove_file(&name);
                return None;
            }
            self.reused.fetch_add(1, Relaxed);
            return Some((f, name));
        }
        None
    }

    /// Removes every kept file (the copy directory's file system is full).
    pub fn shed(&self) -> usize {
        let Ok(mut kept) = self.kept.lock() else { return 0 };
        let n = kept.len();
        for (name, _) in kept.drain(..) {
            let _ = std::fs::remove_file(name);
        }
        self.bytes.store(0, Relaxed);
        n
    }

    /// (bytes, files) kept.
    pub fn usage(&self) -> (u64, usize) {
        (self.bytes.load(Relaxed), self.kept.lock().map(|k| k.len()).unwrap_or(0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::fd::{FromRawFd, OwnedFd};
    use std::os::unix::fs::{FileExt, MetadataExt};

    /// An unnamed read-write file in `dir` holding `bytes`.
    /// Where the daemon keeps spares: the copy directory, in shared memory
    /// (tmpfs). Not the test's TMPDIR: on overlayfs (a container's /tmp) a
    /// write lease is granted while another process maps the file, so the
    /// lease would not tell that a spare is still read.
    fn spare_dir() -> tempfile::TempDir {
        tempfile::tempdir_in("/dev/shm").unwrap()
    }

    fn unnamed(dir: &std::path::Path, bytes: &[u8]) -> File {
        let c = std::ffi::CString::new(dir.to_str().unwrap()).unwrap();
        // SAFETY: c is NUL-terminated; O_TMPFILE needs a mode.
        let fd = unsafe { libc::open(c.as_ptr(), libc::O_TMPFILE | libc::O_RDWR | libc::O_CLOEXEC, 0o400) };
        assert!(fd >= 0, "{}", std::io::Error::last_os_error());
        // SAFETY: a fresh fd nothing else owns.
        let f = File::from(unsafe { OwnedFd::from_raw_fd(fd) });
        f.write_all_at(bytes, 0).unwrap();
        f
    }

    /// A reader's own description, as the daemon hands one out.
    fn reader(f: &File) -> File {
        File::open(format!("/proc/self/fd/{}", f.as_raw_fd())).unwrap()
    }

    fn contents(mut r: &File) -> Vec<u8> {
        let mut v = Vec::new();
        r.read_to_end(&mut v).unwrap();
        v
    }

    #[test]
    fn a_file_someone_still_reads_is_never_written_again() {
        let d = spare_dir();
        let s = Spares::new(1 << 20);
        let f = unnamed(d.path(), b"first copy");
        let r = reader(&f);
        s.keep(Spare::new(f, 10));
        assert!(s.take(10).is_none(), "a spare was handed out while a reader held it");
        let dup = r.try_clone().unwrap();
        drop(r);
        assert!(s.take(10).is_none(), "a spare was handed out while a dup of the reader's fd was open");
        assert_eq!(contents(&dup), b"first copy");
        drop(dup);
        let again = s.take(4).expect("a spare nobody holds is reused");
        assert_eq!(again.file().metadata().unwrap().len(), 4);
        assert_eq!(s.reused.load(Relaxed), 1);
        assert_eq!(s.usage(), (0, 0));
    }

    #[test]
    fn a_mapping_holds_the_file_like_an_fd() {
        let d = spare_dir();
        let s = Spares::new(1 << 20);
        let f = unnamed(d.path(), &[7u8; 4096]);
        let r = reader(&f);
        // SAFETY: a read-only shared mapping of our own unnamed file.
        let m = unsafe { memmap2::Mmap::map(&r) }.unwrap();
        drop(r);
        s.keep(Spare::new(f, 4096));
        assert!(s.take(4096).is_none(), "a spare was handed out while mapped");
        assert_eq!(m[4095], 7);
        drop(m);
        assert!(s.take(4096).is_some());
    }

    #[test]
    fn the_pages_of_a_reused_spare_are_the_same_inode_rewritten() {
        let d = spare_dir();
        let s = Spares::new(1 << 20);
        let f = unnamed(d.path(), &[1u8; 8192]);
        let ino = f.metadata().unwrap().ino();
        s.keep(Spare::new(f, 8192));
        let sp = s.take(8192).unwrap();
        assert_eq!(sp.file().metadata().unwrap().ino(), ino);
        sp.file().write_all_at(&[2u8; 8192], 0).unwrap();
        assert_eq!(contents(&reader(sp.file())), vec![2u8; 8192]);
    }

    #[test]
    fn a_copy_written_through_the_kept_mapping_is_what_readers_read() {
        let d = spare_dir();
        let s = Spares::new(1 << 20);
        let f = unnamed(d.path(), &[1u8; 5000]);
        let ino = f.metadata().unwrap().ino();
        s.keep(Spare::new(f, 5000));
        // Grown, shrunk, grown again: the reader sees exactly the bytes written.
        for (round, size) in [(2u8, 9000usize), (3, 100), (4, 20_000), (5, 20_000)] {
            let mut sp = s.take(size as u64).expect("a spare nobody holds");
            assert_eq!(sp.file().metadata().unwrap().ino(), ino);
            let (_, bytes) = sp.parts();
            let bytes = bytes.expect("a mapping");
            assert_eq!(bytes.len(), size);
            bytes.fill(round);
            let r = reader(sp.file());
            assert_eq!(contents(&r), vec![round; size], "round {round}");
            // The mapping kept with the spare does not hold it; the reader does.
            s.keep(sp);
            assert!(s.take(1).is_none(), "a spare was handed out while a reader held it");
            drop(r);
        }
        // Every byte of a grown spare is allocated (the fallocate), so no
        // write through the mapping can meet a full file system.
        let sp = s.take(64 << 10).unwrap();
        assert!(sp.file().metadata().unwrap().blocks() * 512 >= 64 << 10);
    }

    #[test]
    fn an_open_that_breaks_a_held_lease_does_not_end_the_process() {
        use std::os::unix::fs::OpenOptionsExt;
        let d = spare_dir();
        let s = Spares::new(1 << 20);
        s.keep(Spare::new(unnamed(d.path(), b"x"), 1));
        let kept = s.kept.lock().unwrap();
        let f = &kept[0].file;
        // SAFETY: F_SETLEASE on our own fd.
        assert_eq!(unsafe { libc::fcntl(f.as_raw_fd(), libc::F_SETLEASE, libc::F_WRLCK) }, 0);
        // Breaks the lease and signals its holder, this process (SIGIO would end it).
        let r = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(format!("/proc/self/fd/{}", f.as_raw_fd()));
        assert_eq!(r.err().and_then(|e| e.raw_os_error()), Some(libc::EWOULDBLOCK));
        std::thread::sleep(std::time::Duration::from_millis(50));
        // SAFETY: as above.
        unsafe { libc::fcntl(f.as_raw_fd(), libc::F_SETLEASE, libc::F_UNLCK) };
    }

    #[test]
    fn an_evicted_copy_is_reused_only_once_no_reader_holds_it() {
        let d = spare_dir();
        let e = Evicted::new(1 << 20);
        // Small files, for the test (the default keeps none under EVICTED_MIN).
        e.set_min_size(1);
        assert!(!Evicted::new(1 << 20).wants(EVICTED_MIN - 1) && Evicted::new(1 << 20).wants(EVICTED_MIN));
        let name = d.path().join("7");
        std::fs::write(&name, [7u8; 5000]).unwrap();
        let ino = std::fs::metadata(&name).unwrap().ino();
        let reader = File::open(&name).unwrap();
        e.keep(d.path(), &name, 5000);
        assert!(!name.exists(), "the evicted name still opens");
        assert_eq!(e.usage(), (5000, 1));
        assert!(e.take(100).is_none(), "an evicted file was handed out while a reader held it");
        assert_eq!(contents(&reader), vec![7u8; 5000]);
        drop(reader);
        // Grown: every new byte allocated; the same inode, under its private name.
        let (f, private) = e.take(9000).expect("an evicted file nobody holds");
        assert_eq!(f.metadata().unwrap().ino(), ino);
        assert_eq!(f.metadata().unwrap().len(), 9000);
        assert!(f.metadata().unwrap().blocks() * 512 >= 9000);
        assert!(private.file_name().unwrap().to_str().unwrap().starts_with(".evicted-"));
        assert_eq!(e.reused.load(Relaxed), 1);
        assert_eq!(e.usage(), (0, 0));
        // Over budget: removed, oldest first; none kept with budget 0.
        let d2 = spare_dir();
        let small = Evicted::new(6000);
        small.set_min_size(1);
        for i in 0..3 {
            let n = d2.path().join(format!("n{i}"));
            std::fs::write(&n, [i as u8; 4000]).unwrap();
            small.keep(d2.path(), &n, 4000);
            assert!(!n.exists());
        }
        assert_eq!(small.usage(), (4000, 1));
        assert_eq!(std::fs::read_dir(d2.path()).unwrap().count(), 1, "files over budget stayed");
        assert_eq!(small.shed(), 1);
        assert_eq!(std::fs::read_dir(d2.path()).unwrap().count(), 0, "shed files stayed");
        assert!(private.exists());
        let none = Evicted::new(0);
        let n = d.path().join("x");
        std::fs::write(&n, b"x").unwrap();
        none.keep(d.path(), &n, 1);
        assert!(!n.exists() && none.usage() == (0, 0));
    }

    #[test]
    fn the_budget_bounds_what_is_kept_oldest_out_first() {
        let d = spare_dir();
        let s = Spares::new(10_000);
        for i in 0..4u8 {
            s.keep(Spare::new(unnamed(d.path(), &[i; 4000]), 4000));
        }
        assert_eq!(s.usage(), (8000, 2));
        let sp = s.take(4000).unwrap();
        assert_eq!(contents(&reader(sp.file()))[0], 2, "the oldest kept spare comes first");
        s.keep(Spare::new(unnamed(d.path(), b"x"), 20_000));
        assert_eq!(s.usage(), (4000, 1), "a file over the whole budget is not kept");
        assert_eq!(s.shed(), 1);
        assert!(s.take(1).is_none());
        let none = Spares::new(0);
        none.keep(Spare::new(unnamed(d.path(), b"y"), 1));
        assert_eq!(none.usage(), (0, 0));
    }
}
