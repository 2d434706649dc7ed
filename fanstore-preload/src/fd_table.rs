//! fd -> virtual node table, lock-free.
//!
//! A two-level array of atomics indexed by fd number: 4096 lazily allocated
//! chunks of 1024 entries (4 Mi fds). Readers never lock; a fork copies it
//! with the rest of memory, which matches the inherited fds. fds above the
//! table's range are simply not tracked (their fstat shows the real file).
//!
//! Entry tag: bits 62..64 kind (1 file, 2 directory, 3 output: being
//! written, bits 0..32 its slot in [`crate::outputs`]; or, with bit 60 set,
//! a committed output opened for reading, bits 0..12 its permission bits
//! and `alias` the inode number stat of its path gives), bits 32..62 the
//! getdents position of a directory fd, bit 59 of an output being written:
//! its fd is still the committed version's read-only file, copied at the
//! first write ([`set_lazy`]), bit 61 of a file fd: a memfd this
//! library filled whose pages may be reused after its close
//! ([`crate::memfd_pool`]; never set on a dup), bits 0..32 the node id. `ino` holds
//! the real inode seen by the first fstat (0: not seen yet) so that an entry
//! left stale by a close we did not see is detected and dropped.

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicU64, Ordering};

const CHUNK: usize = 1024;
const NCHUNKS: usize = 4096;
const KIND_SHIFT: u32 = 62;
const POS_MASK: u64 = (1 << 30) - 1;
const RECYCLE_BIT: u64 = 1 << 61;
const COMMITTED_BIT: u64 = 1 << 60;
const LAZY_BIT: u64 = 1 << 59;

struct Entry {
    tag: AtomicU64,
    ino: AtomicU64,
    /// The virtual inode number of a [`Tracked::Committed`] fd.
    alias: AtomicU64,
}

static CHUNKS: [AtomicPtr<Entry>; NCHUNKS] = [const { AtomicPtr::new(std::ptr::null_mut()) }; NCHUNKS];
static ANY: AtomicBool = AtomicBool::new(false);
/// True once any fd was marked [`set_lazy`] in this process.
static LAZY_EVER: AtomicBool = AtomicBool::new(false);
/// The process whose memory this is: set at load and in every fork child
/// ([`set_owner`]).
static OWNER: AtomicI32 = AtomicI32::new(0);

/// This process owns its memory from now on (the library's load, a fork
/// child). A vfork child never runs fork handlers: until it execs it runs
/// in its parent's memory, where [`borrowed`] tells it so.
pub fn set_owner() {
    // SAFETY: getpid cannot fail.
    OWNER.store(unsafe { libc::getpid() }, Ordering::Relaxed);
}

/// Whether this is a vfork child, running in its parent's memory: the
/// tables are the parent's, whose fds stay open whatever the child closes
/// or dups (Python's subprocess: dup2 onto 0-2, close_range, execve). One
/// getpid: ask only about a tracked fd.
pub fn borrowed() -> bool {
    let owner = OWNER.load(Ordering::Relaxed);
    // SAFETY: getpid cannot fail.
    owner != 0 && owner != unsafe { libc::getpid() }
}

/// What a tracked fd refers to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tracked {
    /// A real fd holding the bytes of file node `.0`.
    File(u32),
    /// A real fd on the empty directory standing for directory node `node`.
    Dir { node: u32, pos: u32 },
    /// A memfd being written as an output (slot `.0` of [`crate::outputs`]).
    Output(u32),
    /// A committed output opened for reading (a real fd on the daemon's
    /// file or a copy of it), with the permission bits of its record; its
    /// virtual inode number is in [`alias`].
    Committed { perm: u16 },
}

impl Tracked {
    pub fn node(self) -> u32 {
        match self {
            Tracked::File(n) => n,
            Tracked::Dir { node, .. } => node,
            Tracked::Output(_) | Tracked::Committed { .. } => u32::MAX,
        }
    }
    fn encode(self) -> u64 {
        match self {
            Tracked::File(n) => (1u64 << KIND_SHIFT) | n as u64,
            Tracked::Dir { node, pos } => (2u64 << KIND_SHIFT) | ((pos as u64 & POS_MASK) << 32) | node as u64,
            Tracked::Output(slot) => (3u64 << KIND_SHIFT) | slot as u64,
            Tracked::Committed { perm } => (3u64 << KIND_SHIFT) | COMMITTED_BIT | (perm & 0o7777) as u64,
        }
    }
    fn decode(t: u64) -> Option<Tracked> {
        let node = (t & 0xffff_ffff) as u32;
        match t >> KIND_SHIFT {
            1 => Some(Tracked::File(node)),
            2 => Some(Tracked::Dir { node, pos: ((t >> 32) & POS_MASK) as u32 }),
            3 if t & COMMITTED_BIT != 0 => Some(Tracked::Committed { perm: (t & 0o7777) as u16 }),
            3 => Some(Tracked::Output(node)),
            _ => None,
        }
    }
}

fn slot(fd: i32, create: bool) -> Option<&'static Entry> {
    if fd < 0 {
        return None;
    }
    let (c, i) = (fd as usize / CHUNK, fd as usize % CHUNK);
    let cell = CHUNKS.get(c)?;
    let mut p = cell.load(Ordering::Acquire);
    if p.is_null() {
        if !create {
            return None;
        }
        // SAFETY: calloc returns zeroed memory or null; an all-zero Entry is
        // two zero atomics, a valid "untracked" value.
        let fresh = unsafe { libc::calloc(CHUNK, std::mem::size_of::<Entry>()) } as *mut Entry;
        if fresh.is_null() {
            return None;
        }
        match cell.compare_exchange(std::ptr::null_mut(), fresh, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => p = fresh,
            Err(existing) => {
                // SAFETY: `fresh` came from calloc above and was never published.
                unsafe { libc::free(fresh.cast()) };
                p = existing;
            }
        }
    }
    // SAFETY: p points at CHUNK entries that are never freed; i < CHUNK.
    Some(unsafe { &*p.add(i) })
}

/// True once any fd has been tracked in this process (cheap gate for close/dup).
#[inline]
pub fn any() -> bool {
    ANY.load(Ordering::Relaxed)
}

#[inline]
pub fn get(fd: i32) -> Option<Tracked> {
    if !any() {
        return None;
    }
    Tracked::decode(slot(fd, false)?.tag.load(Ordering::Acquire))
}

/// Starts tracking `fd`. Returns false if the table has no room for it.
pub fn set(fd: i32, t: Tracked) -> bool {
    ANY.store(true, Ordering::Relaxed);
    match slot(fd, true) {
        Some(e) => {
            e.ino.store(0, Ordering::Relaxed);
            e.tag.store(t.encode(), Ordering::Release);
            true
        }
        None => false,
    }
}

/// Stops tracking `fd` (before the real close, so a racing open that reuses
/// the number cannot be clobbered).
#[inline]
pub fn clear(fd: i32) {
    if let Some(e) = slot(fd, false) {
        e.tag.store(0, Ordering::Release);
    }
}

/// Copies the tracking of `from` to `to` (dup); clears `to` if `from` is untracked.
pub fn copy(from: i32, to: i32) {
    match get(from) {
        Some(t) => {
            set(to, t);
            if let (Some(a), Some(b)) = (slot(from, false), slot(to, false)) {
                b.ino.store(a.ino.load(Ordering::Relaxed), Ordering::Relaxed);
                b.alias.store(a.alias.load(Ordering::Relaxed), Ordering::Relaxed);
            }
        }
        None => clear(to),
    }
}

/// Starts tracking `fd` as a committed output opened for reading, whose
/// path's stat gives inode number `alias` and permission bits `perm`.
pub fn set_committed(fd: i32, perm: u32, alias: u64) -> bool {
    let Some(e) = slot(fd, true) else { return false };
    ANY.store(true, Ordering::Relaxed);
    e.ino.store(0, Ordering::Relaxed);
    e.alias.store(alias, Ordering::Relaxed);
    e.tag.store(Tracked::Committed { perm: (perm & 0o7777) as u16 }.encode(), Ordering::Release);
    true
}

/// The virtual inode number of a [`Tracked::Committed`] fd (0 for any other).
pub fn alias(fd: i32) -> u64 {
    match (get(fd), slot(fd, false)) {
        (Some(Tracked::Committed { .. }), Some(e)) => e.alias.load(Ordering::Relaxed),
        _ => 0,
    }
}

/// Marks output fd `fd` as not yet writable: the program opened a
/// committed output O_RDWR and this fd is still a read-only one on its
/// bytes, made a writable copy at its first write ([`crate::ops::lazy_copy`]).
pub fn set_lazy(fd: i32) -> bool {
    let Some(e) = slot(fd, false) else { return false };
    LAZY_EVER.store(true, Ordering::Relaxed);
    e.tag.fetch_update(Ordering::AcqRel, Ordering::Acquire, |t| (t >> KIND_SHIFT == 3 && t & COMMITTED_BIT == 0).then_some(t | LAZY_BIT)).is_ok()
}

/// Could any fd of this process be [`set_lazy`]? (One load: the gate of
/// every write-like call.)
#[inline]
pub fn lazy_ever() -> bool {
    LAZY_EVER.load(Ordering::Relaxed)
}

/// Is `fd` an output still waiting for its writable copy ([`set_lazy`])?
#[inline]
pub fn is_lazy(fd: i32) -> bool {
    if !lazy_ever() {
        return false;
    }
    slot(fd, false).is_some_and(|e| {
        let t = e.tag.load(Ordering::Acquire);
        t >> KIND_SHIFT == 3 && t & (COMMITTED_BIT | LAZY_BIT) == LAZY_BIT
    })
}

/// `fd` now has its writable copy.
pub fn clear_lazy(fd: i32) {
    if let Some(e) = slot(fd, false) {
        e.tag.fetch_and(!LAZY_BIT, Ordering::AcqRel);
    }
}

/// Updates the getdents position of a tracked directory fd.
pub fn set_pos(fd: i32, node: u32, pos: u32) {
    if let Some(e) = slot(fd, false) {
        e.tag.store(Tracked::Dir { node, pos }.encode(), Ordering::Release);
    }
}

/// Marks file fd `fd` as a memfd of [`crate::memfd_pool`] with inode `ino`.
pub fn mark_recyclable(fd: i32, ino: u64) {
    if let Some(e) = slot(fd, false) {
        if e.tag.load(Ordering::Acquire) >> KIND_SHIFT == 1 {
            e.ino.store(ino, Ordering::Relaxed);
            e.tag.fetch_or(RECYCLE_BIT, Ordering::AcqRel);
        }
    }
}

/// The inode of `fd`'s memfd if `fd` is marked recyclable.
pub fn recyclable(fd: i32) -> Option<u64> {
    let e = slot(fd, false)?;
    let t = e.tag.load(Ordering::Acquire);
    (t >> KIND_SHIFT == 1 && t & RECYCLE_BIT != 0).then(|| e.ino.load(Ordering::Relaxed))
}

/// `fd` was passed to a call that may keep references to its pages
/// (sendfile, splice): its memfd is freed at close, never reused.
pub fn forget_recyclable(fd: i32) {
    if let Some(e) = slot(fd, false) {
        // Directory fds keep their position in these bits: files only.
        let _ = e.tag.fetch_update(Ordering::AcqRel, Ordering::Acquire, |t| (t >> KIND_SHIFT == 1).then_some(t & !RECYCLE_BIT));
    }
}

/// Checks the real inode behind a tracked fd against the one first seen.
/// Returns false (and forgets the fd) when they differ: the entry was stale.
pub fn check_ino(fd: i32, real_ino: u64) -> bool {
    let Some(e) = slot(fd, false) else { return false };
    match e.ino.compare_exchange(0, real_ino, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => true,
        Err(seen) if seen == real_ino => true,
        Err(_) => {
            e.tag.store(0, Ordering::Release);
            false
        }
    }
}

/// Forgets every tracked fd in `lo..=hi` (close_range, closefrom).
pub fn clear_range(lo: u32, hi: u32) {
    if !any() {
        return;
    }
    let hi = (hi as u64).min((CHUNK * NCHUNKS) as u64 - 1) as usize;
    let mut fd = lo as usize;
    while fd <= hi {
        let (c, i) = (fd / CHUNK, fd % CHUNK);
        let p = CHUNKS[c].load(Ordering::Acquire);
        if p.is_null() {
            fd = (c + 1) * CHUNK;
            continue;
        }
        let end = hi.min((c + 1) * CHUNK - 1);
        for j in i..=(end % CHUNK) {
            // SAFETY: p points at CHUNK live entries and j < CHUNK.
            unsafe { &*p.add(j) }.tag.store(0, Ordering::Release);
        }
        fd = end + 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn track_copy_clear() {
        assert!(set(5000, Tracked::File(7)));
        assert_eq!(get(5000), Some(Tracked::File(7)));
        copy(5000, 5001);
        assert_eq!(get(5001), Some(Tracked::File(7)));
        set(5002, Tracked::Dir { node: 3, pos: 0 });
        set_pos(5002, 3, 12345);
        assert_eq!(get(5002), Some(Tracked::Dir { node: 3, pos: 12345 }));
        assert!(check_ino(5000, 99));
        assert!(check_ino(5000, 99));
        assert!(!check_ino(5000, 100));
        assert_eq!(get(5000), None);
        clear_range(4000, u32::MAX);
        assert_eq!(get(5001), None);
        assert_eq!(get(5002), None);
        assert_eq!(get(-1), None);
        assert_eq!(get(i32::MAX), None);
        assert!(!set(i32::MAX, Tracked::File(1)));
    }

    #[test]
    fn a_lazy_mark_stays_on_its_output_fd() {
        assert!(set(7100, Tracked::Output(12)));
        assert!(!is_lazy(7100));
        assert!(set_lazy(7100));
        assert!(is_lazy(7100));
        assert_eq!(get(7100), Some(Tracked::Output(12)), "the mark does not change what the fd is");
        clear_lazy(7100);
        assert!(!is_lazy(7100));
        assert!(set(7101, Tracked::File(3)));
        assert!(!set_lazy(7101), "only an output's fd can wait for its copy");
        assert!(!is_lazy(7101));
        assert!(set_lazy(7100));
        set(7100, Tracked::File(1));
        assert!(!is_lazy(7100), "a new tracking drops the mark");
    }

    #[test]
    fn recyclable_marks_stay_on_their_fd() {
        assert!(set(6000, Tracked::File(9)));
        mark_recyclable(6000, 77);
        assert_eq!(get(6000), Some(Tracked::File(9)));
        assert_eq!(recyclable(6000), Some(77));
        assert!(check_ino(6000, 77));
        copy(6000, 6001);
        assert_eq!(get(6001), Some(Tracked::File(9)));
        assert_eq!(recyclable(6001), None, "a dup must not be reused");
        forget_recyclable(6000);
        assert_eq!(recyclable(6000), None);
        assert_eq!(get(6000), Some(Tracked::File(9)));
        set(6002, Tracked::Dir { node: 1, pos: 0 });
        mark_recyclable(6002, 5);
        assert_eq!(recyclable(6002), None);
        clear_range(6000, 6002);
    }

    #[test]
    fn a_committed_output_keeps_its_alias_and_mode_through_dup() {
        assert!(set_committed(7000, 0o100640, 0x8000_0000_0000_0042));
        assert_eq!(get(7000), Some(Tracked::Committed { perm: 0o640 }));
        assert_eq!(alias(7000), 0x8000_0000_0000_0042);
        copy(7000, 7001);
        assert_eq!(get(7001), Some(Tracked::Committed { perm: 0o640 }));
        assert_eq!(alias(7001), 0x8000_0000_0000_0042);
        assert!(set(7002, Tracked::Output(4095)));
        assert_eq!(get(7002), Some(Tracked::Output(4095)), "an output's slot never reads as committed");
        assert_eq!(alias(7002), 0);
        clear_range(7000, 7002);
        assert_eq!(get(7001), None);
    }
}
