//! Memfds whose pages are used again: the decoded bytes of the next file a
//! process opens go into the pages of a memfd it already closed, not into
//! fresh ones.
//!
//! Why: a file of a partition this node holds that is compressed, or under
//! 64 KiB, is decoded here in the process into a memfd ([`crate::ops::open`]).
//! On this machine a new memfd written with 128 KiB and read back costs
//! 65.6 µs, the same bytes into a memfd whose pages exist 16.0 µs: the page
//! allocation, not the decode, is most of a first read.
//!
//! ```text
//! open(2) of a compressed file        close(2) of that fd (before the real close)
//!   take(len) ──► pooled memfd ◄──────── reopen /proc/self/fd/N read-write, push
//!   (or memfd_create)                    (its pages stay allocated)
//!   pwrite bytes, ftruncate(len)
//!   reopen read-only onto the fd number, mark the fd recyclable
//! ```
//!
//! A pooled memfd is written again only when nothing but the pool can see
//! its bytes:
//! - the program's fd was closed by `close` (dup2 over it, close_range and
//!   exec free it instead), and only fds this library marked (never a dup of
//!   one) come back;
//! - the kernel grants a write lease (`F_SETLEASE F_WRLCK`) on the pool's
//!   description, which it does only when no other open description of the
//!   file exists: no dup, no fd inherited by a child, no mapping (a mapping
//!   keeps its description open), no read in flight;
//! - the fd was never passed to `sendfile` or `splice`, and the process never
//!   called `vmsplice` or `io_uring_setup`: those leave references to the
//!   pages in pipes, socket buffers or rings after the call returns, so such
//!   an fd (or, after the latter two, every fd) is freed, not reused;
//! - the pool belongs to the process that filled it: a fork child closes its
//!   inherited copies (they share descriptions with the parent's), and a
//!   vfork child, which shares the parent's memory, leaves it alone.
//!
//! The pool holds at most [`SLOTS`] fds and 32 MiB of pages, and no fd
//! while the process uses half of its `RLIMIT_NOFILE`.

use crate::lock::Locked;
use libc::c_int;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

/// Memfds kept per process.
const SLOTS: usize = 8;
/// Files larger than this are not pooled (their pages are freed at close).
pub const MAX_FILE: u64 = 16 << 20;
/// Bytes of pages the pool may keep per process (a DataLoader has one pool
/// per worker): eight files of 128 KiB are 1 MiB, two of 16 MiB fill it.
const MAX_BYTES: u64 = 32 << 20;
/// Pooled candidates whose lease is tried per take (each try is 2 fcntl calls).
const TRIES: usize = 2;

#[derive(Clone, Copy)]
struct Slot {
    fd: c_int,
    /// The memfd's size when pooled (its pages).
    size: u64,
}

struct Pool {
    /// The process these fds belong to (0: not yet used).
    pid: i32,
    slots: [Slot; SLOTS],
    n: usize,
}

static POOL: Locked<Pool> = Locked::new(Pool { pid: 0, slots: [Slot { fd: -1, size: 0 }; SLOTS], n: 0 });
/// Set for good once the process used vmsplice or io_uring.
static OFF: AtomicBool = AtomicBool::new(false);
/// The device of the memfds made here (the kernel's internal shm mount).
static MEMFD_DEV: AtomicU64 = AtomicU64::new(u64::MAX);

fn pid() -> i32 {
    // SAFETY: getpid has no preconditions.
    unsafe { libc::getpid() }
}

fn close(fd: c_int) {
    // SAFETY: closing a descriptor the pool owns.
    unsafe { crate::real::close(fd) };
}

/// A memfd holding exactly `bytes`: a pooled one whose pages are free to
/// reuse, else a new one. Returns the fd (read-write) and its inode number.
pub fn filled(bytes: &[u8]) -> Result<(c_int, u64), c_int> {
    let len = bytes.len() as u64;
    let (fd, old) = match take(len) {
        Some(s) => (s.fd, s.size),
        None => {
            // SAFETY: a NUL-terminated name and valid flags; the fd returned is ours.
            let fd = unsafe { libc::memfd_create(c"fanstore".as_ptr(), libc::MFD_CLOEXEC) };
            if fd < 0 {
                return Err(errno());
            }
            (fd, 0)
        }
    };
    let fail = |e: c_int| {
        close(fd);
        Err(e)
    };
    let mut done = 0usize;
    while done < bytes.len() {
        let rest = &bytes[done..];
        // SAFETY: rest is a live buffer of rest.len() bytes; fd is our memfd.
        let w = unsafe { libc::pwrite(fd, rest.as_ptr().cast(), rest.len(), done as libc::off_t) };
        if w <= 0 {
            let e = if w < 0 { errno() } else { libc::EIO };
            if e == libc::EINTR {
                continue;
            }
            return fail(e);
        }
        done += w as usize;
    }
    // SAFETY: ftruncate of our memfd; fstat into a zeroed stat.
    unsafe {
        if old > len && libc::ftruncate(fd, len as libc::off_t) != 0 {
            return fail(errno());
        }
        let mut st: libc::stat = std::mem::zeroed();
        if libc::fstat(fd, &mut st) != 0 {
            return fail(errno());
        }
        MEMFD_DEV.store(st.st_dev, Relaxed);
        Ok((fd, st.st_ino))
    }
}

/// `FANSTORE_MEMFD_REUSE=0` turns the reuse off (benchmarks compare both).
fn off() -> bool {
    static READ: std::sync::Once = std::sync::Once::new();
    READ.call_once(|| {
        // SAFETY: a NUL-terminated name; getenv's result is only read here.
        let v = unsafe { libc::getenv(c"FANSTORE_MEMFD_REUSE".as_ptr()) };
        // SAFETY: v is null or a NUL-terminated string of the environment.
        if !v.is_null() && unsafe { std::ffi::CStr::from_ptr(v) }.to_bytes() == b"0" {
            OFF.store(true, Relaxed);
        }
    });
    OFF.load(Relaxed)
}

/// A pooled memfd nothing else refers to, the best fit for `len` bytes.
fn take(len: u64) -> Option<Slot> {
    if off() {
        return None;
    }
    let me = pid();
    for _ in 0..TRIES {
        let s = POOL.with(|p| {
            if p.pid != me || p.n == 0 {
                return None;
            }
            // Smallest that holds len, else the largest.
            let fits = (0..p.n).filter(|&i| p.slots[i].size >= len).min_by_key(|&i| p.slots[i].size);
            let i = fits.or_else(|| (0..p.n).max_by_key(|&i| p.slots[i].size))?;
            let s = p.slots[i];
            p.slots.copy_within(i + 1..p.n, i);
            p.n -= 1;
            Some(s)
        })?;
        if sole_description(s.fd) {
            return Some(s);
        }
        // Still referenced (a mapping, a child): back to the pool's end,
        // or freed if the pool filled up meanwhile.
        if !push(me, s) {
            close(s.fd);
        }
    }
    None
}

/// True when the kernel grants a write lease on `fd`: no other open
/// description of its file exists. The lease is released at once.
fn sole_description(fd: c_int) -> bool {
    // SAFETY: fcntl on our own fd with integer arguments.
    unsafe {
        if crate::real::fcntl(fd, libc::F_SETLEASE, libc::F_WRLCK as libc::c_ulong) != 0 {
            return false;
        }
        crate::real::fcntl(fd, libc::F_SETLEASE, libc::F_UNLCK as libc::c_ulong);
    }
    true
}

/// Adds `s` to the pool of process `me`; false if the pool is full or not `me`'s.
fn push(me: i32, s: Slot) -> bool {
    POOL.with(|p| {
        if p.pid == 0 {
            p.pid = me;
        }
        let held: u64 = p.slots[..p.n].iter().map(|s| s.size).sum();
        if p.pid != me || p.n == SLOTS || held + s.size > MAX_BYTES {
            return false;
        }
        p.slots[p.n] = s;
        p.n += 1;
        true
    })
}

/// Before the real close of `fd`, a memfd this library filled (inode `ino`):
/// keep a read-write description of it for a later [`filled`].
pub fn closing(fd: c_int, ino: u64) {
    if off() {
        return;
    }
    let me = pid();
    if POOL.with(|p| p.pid != 0 && p.pid != me) {
        return; // a vfork child: the pool is the parent's
    }
    // The number must still name that memfd (checked without opening
    // anything: a stale entry could name a device or a FIFO).
    let ours = |f: c_int| {
        // SAFETY: fstat into a zeroed stat; f is an fd number of this process.
        let st = unsafe {
            let mut st: libc::stat = std::mem::zeroed();
            (libc::fstat(f, &mut st) == 0).then_some(st)
        }?;
        let same = st.st_ino == ino && st.st_dev == MEMFD_DEV.load(Relaxed) && (st.st_mode & libc::S_IFMT) == libc::S_IFREG;
        (same && st.st_size as u64 <= MAX_FILE).then_some(st.st_size as u64)
    };
    if ours(fd).is_none() {
        return;
    }
    let path = fanstore_core::runtime::proc_fd_path(fd as u32);
    // SAFETY: path is NUL-terminated; the new fd is ours.
    let rw = unsafe { crate::real::open(path.as_ptr().cast(), libc::O_RDWR | libc::O_CLOEXEC | libc::O_NOCTTY, 0) };
    if rw < 0 {
        return;
    }
    // fds are numbered lowest first, so rw's number is about how many the
    // process has open: with half of RLIMIT_NOFILE in use the pool keeps
    // none (its fds would bring the program's EMFILE closer).
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit into a live struct.
    let roomy = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0 && (rw as u64) < lim.rlim_cur / 2;
    match ours(rw) {
        Some(size) if roomy && push(me, Slot { fd: rw, size }) => {}
        _ => close(rw),
    }
}

/// The process used an interface that keeps page references beyond the
/// call (vmsplice, io_uring): no memfd is reused from now on.
pub fn turn_off() {
    if !OFF.swap(true, Relaxed) {
        let me = pid();
        let mut fds = [-1; SLOTS];
        let n = POOL.with(|p| {
            if p.pid != me {
                return 0;
            }
            let n = p.n;
            for (d, s) in fds.iter_mut().zip(&p.slots[..n]) {
                *d = s.fd;
            }
            p.n = 0;
            n
        });
        fds[..n].iter().for_each(|&fd| close(fd));
    }
}

pub fn fork_prepare() {
    POOL.lock();
}

pub fn fork_parent() {
    POOL.unlock();
}

/// In a fork child: the inherited fds share descriptions with the parent's
/// pool, so they are closed; the child starts an empty pool of its own.
pub fn fork_child() {
    // SAFETY: the prepare handler took the lock and this is the child's only thread.
    let p = unsafe { POOL.force() };
    for s in &p.slots[..p.n] {
        crate::sud::close_unhooked(s.fd);
    }
    p.n = 0;
    p.pid = pid();
    POOL.unlock();
}

fn errno() -> c_int {
    // SAFETY: reading this thread's errno.
    unsafe { *libc::__errno_location() }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_all(fd: c_int) -> Vec<u8> {
        let mut out = vec![0u8; 1 << 20];
        // SAFETY: pread into a live buffer of its length.
        let n = unsafe { libc::pread(fd, out.as_mut_ptr().cast(), out.len(), 0) };
        out.truncate(n.max(0) as usize);
        out
    }

    fn reopen_ro(fd: c_int) -> c_int {
        let path = fanstore_core::runtime::proc_fd_path(fd as u32);
        // SAFETY: NUL-terminated path.
        unsafe { libc::open(path.as_ptr().cast(), libc::O_RDONLY | libc::O_CLOEXEC) }
    }

    /// One test (the pool is per process): reuse, and every case that must not reuse.
    #[test]
    fn pages_are_reused_only_when_nothing_else_sees_them() {
        // A memfd handed out, read-only, as an open() does.
        let (rw, ino) = filled(&[1u8; 100_000]).expect("memfd");
        let ro = reopen_ro(rw);
        close(rw);
        closing(ro, ino);
        close(ro);
        // Closed and unmapped: the next file gets its inode, with exactly its bytes.
        let (rw2, ino2) = filled(&[2u8; 50_000]).expect("memfd");
        assert_eq!(ino2, ino, "the closed memfd was not reused");
        assert_eq!(read_all(rw2), vec![2u8; 50_000], "old bytes past the new length");
        // Still mapped after its fd was closed: not reused.
        let ro2 = reopen_ro(rw2);
        close(rw2);
        // SAFETY: a read-only shared mapping of our memfd.
        let map = unsafe { libc::mmap(std::ptr::null_mut(), 50_000, libc::PROT_READ, libc::MAP_SHARED, ro2, 0) };
        assert_ne!(map, libc::MAP_FAILED);
        closing(ro2, ino2);
        close(ro2);
        let (rw3, ino3) = filled(&[3u8; 60_000]).expect("memfd");
        assert_ne!(ino3, ino2, "a mapped memfd was reused");
        // SAFETY: the mapping made above.
        let mapped = unsafe { std::slice::from_raw_parts(map as *const u8, 50_000) };
        assert!(mapped.iter().all(|&b| b == 2), "the mapping's bytes changed");
        // SAFETY: unmapping it; from now on nothing refers to that memfd but the pool.
        unsafe { libc::munmap(map, 50_000) };
        let (rw4, ino4) = filled(&[4u8; 10]).expect("memfd");
        assert_eq!(ino4, ino2, "the unmapped memfd was not reused");
        assert_eq!(read_all(rw4), vec![4u8; 10]);
        // A dup still open: not reused.
        let ro3 = reopen_ro(rw3);
        close(rw3);
        // SAFETY: dup of our fd.
        let dup = unsafe { libc::dup(ro3) };
        closing(ro3, ino3);
        close(ro3);
        let (rw5, ino5) = filled(&[5u8; 10]).expect("memfd");
        assert_ne!(ino5, ino3, "a memfd with a dup open was reused");
        assert_eq!(read_all(dup), vec![3u8; 60_000]);
        // The wrong inode (an fd number reused by another file): not pooled.
        let (rw6, _) = filled(&[6u8; 10]).expect("memfd");
        let before = POOL.with(|p| p.n);
        closing(rw6, 12345);
        assert_eq!(POOL.with(|p| p.n), before);
        // Off: nothing pooled is reused.
        turn_off();
        assert_eq!(POOL.with(|p| p.n), 0);
        let (rw7, ino7) = filled(&[7u8; 10]).expect("memfd");
        closing(rw7, ino7);
        assert_eq!(POOL.with(|p| p.n), 0);
        // The byte cap (fd -1 stands for a memfd; nothing closes it).
        let me = pid();
        assert!(push(me, Slot { fd: -1, size: 20 << 20 }));
        assert!(!push(me, Slot { fd: -1, size: 20 << 20 }), "more than MAX_BYTES kept");
        assert!(push(me, Slot { fd: -1, size: 1 << 20 }));
        assert!(!push(me + 1, Slot { fd: -1, size: 1 }), "another process's pool");
        POOL.with(|p| p.n = 0);
        for fd in [rw4, rw5, rw6, rw7, dup] {
            close(fd);
        }
    }
}
