//! Memfds whose pages are used again: the decoded bytes of the next file a
//! process opens go into the pages of a memfd it already closed, not into
//! fresh ones, and straight through a mapping kept with the memfd, not
//! through a write.
//!
//! Why: a file of a partition this node holds that is compressed, or under
//! 64 KiB, is decoded here in the process into a memfd ([`crate::ops::open`]).
//! On this machine a new memfd written with 128 KiB and read back costs
//! 65.6 µs, the same bytes into a memfd whose pages exist 16.0 µs: the page
//! allocation, not the decode, is most of a first read. Decoding into a
//! buffer and writing it in is a pass more over the bytes than decoding
//! into the memfd's own pages through a mapping that stays in place from
//! file to file (lz4, decode + read back, per file: 128 KiB 58-61 against
//! 42-44 µs; 8 MiB 6.1-6.4 against 4.1-4.2 ms). A mapping made per file
//! costs as much as the write it saves (its page faults and unmapping).
//!
//! ```text
//! open(2) of a compressed file           close(2) of that fd (before the real close)
//!   fill(len): a pooled entry ──────────────── marked free (no system call)
//!     (read-write memfd + its mapping,
//!      lent to one file at a time),
//!     or a new one, or none: the caller writes a memfd of its own
//!   ftruncate(len), decode into the mapping
//!   open N read-only in the kept /proc/self/fd: the program's fd
//!     (it must have the memfd's inode number, else EIO)
//! ```
//!
//! A pooled memfd is written again only when nothing but the pool can see
//! its bytes:
//! - the kernel grants a write lease (`F_SETLEASE F_WRLCK`) on the pool's
//!   read-write description, which it does only when no other open
//!   description of the file exists: not the program's fd, no dup, no fd
//!   inherited by a child, no mapping of the program's (a mapping keeps its
//!   description open), no read in flight. The pool's own mapping does not
//!   count (it holds the pool's description, and a shared mapping is not an
//!   open for write);
//! - an entry the program closed with `close` is tried first; one whose fd
//!   went away otherwise (dup2 over it, close_range) only when the pool is
//!   full, and the lease decides as always;
//! - the fd was never passed to `sendfile` or `splice`, and the process never
//!   called `vmsplice` or `io_uring_setup`: those leave references to the
//!   pages in pipes, socket buffers or rings after the call returns, so such
//!   an entry (or, after the latter two, every entry) is dropped;
//! - the pool belongs to the process that filled it: its mappings are not
//!   inherited (`MADV_DONTFORK`), a fork child closes its inherited fds, and
//!   a vfork child, which shares the parent's memory, leaves it alone.
//!
//! The pool holds at most [`SLOTS`] memfds (one fd and one mapping each) and
//! 32 MiB of pages, and makes no new entry while the process uses half of
//! its `RLIMIT_NOFILE`.

use crate::errno::errno;
use crate::lock::Locked;
use libc::c_int;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

/// Memfds kept per process.
const SLOTS: usize = 8;
/// Files larger than this are not pooled (their pages are freed at close).
pub const MAX_FILE: u64 = 16 << 20;
/// Bytes of pages the pool may keep per process (a DataLoader has one pool
/// per worker): eight files of 128 KiB are 1 MiB, two of 16 MiB fill it.
const MAX_BYTES: u64 = 32 << 20;
/// Pooled candidates whose lease is tried per fill (each try is 2 fcntl calls).
const TRIES: usize = 2;

#[derive(Clone, Copy)]
struct Slot {
    /// The pool's read-write description of the memfd.
    fd: c_int,
    /// Its inode number (the program's fd is marked with it).
    ino: u64,
    /// The memfd's size (its pages).
    size: u64,
    /// A shared read-write mapping of the memfd, `map_len` bytes (0: none).
    map: usize,
    map_len: usize,
    /// Handed out and not yet closed by the program (or being filled).
    lent: bool,
}

const NO_SLOT: Slot = Slot { fd: -1, ino: 0, size: 0, map: 0, map_len: 0, lent: false };

struct Pool {
    /// The process these fds belong to (0: not yet used).
    pid: i32,
    slots: [Slot; SLOTS],
    n: usize,
    /// This process's `/proc/self/fd` directory, opened once (-1: not yet,
    /// or the program took its number): the program's description of a
    /// pooled memfd is opened relative to it, a shorter path walk than the
    /// whole `/proc/self/fd/N` (open + close, 4.3-4.5 against 5.9-6.0 µs).
    fd_dir: c_int,
}

static POOL: Locked<Pool> = Locked::new(Pool { pid: 0, slots: [NO_SLOT; SLOTS], n: 0, fd_dir: -1 });
/// Set for good once the process used vmsplice or io_uring.
static OFF: AtomicBool = AtomicBool::new(false);
/// Set once the pool made an entry (until then the close hooks skip it).
static EVER: AtomicBool = AtomicBool::new(false);

fn pid() -> i32 {
    // SAFETY: getpid has no preconditions.
    unsafe { libc::getpid() }
}

fn close(fd: c_int) {
    // SAFETY: closing a descriptor the pool owns.
    unsafe { crate::real::close(fd) };
}

/// Unmaps and closes an entry that left the pool.
fn release(s: Slot) {
    if s.map != 0 {
        // SAFETY: the pool's own mapping, which nothing else refers to.
        unsafe { libc::munmap(s.map as *mut libc::c_void, s.map_len) };
    }
    if s.fd >= 0 {
        close(s.fd);
    }
}

/// A read-only fd of a memfd holding exactly `len` bytes, written by
/// `write` into the memfd's pages, with the memfd's inode number; `flags`
/// are the program's open flags (O_CLOEXEC, O_NONBLOCK, O_NOCTTY, O_PATH
/// are kept). None when the pool has no memfd to give (off, full, or
/// `len` over [`MAX_FILE`]): the caller writes a memfd of its own.
pub fn fill(len: u64, flags: c_int, write: impl FnOnce(&mut [u8]) -> Result<(), c_int>) -> Option<Result<(c_int, u64), c_int>> {
    if off() || len > MAX_FILE {
        return None;
    }
    let me = pid();
    let mut s = take(me, len).or_else(|| new_entry(me, len))?;
    let res = fill_slot(&mut s, len, write).map_err(Reopen::Failed).and_then(|()| reopen_pooled(me, &s, flags));
    match res {
        Ok(ro) => {
            put_back(me, s);
            Some(Ok((ro, s.ino)))
        }
        Err(Reopen::Failed(e)) => {
            // Its bytes are unknown now: it goes back free (the next fill writes all of them).
            s.lent = false;
            put_back(me, s);
            Some(Err(e))
        }
        Err(Reopen::Stolen) => {
            release(Slot { fd: -1, ..s });
            Some(Err(libc::EIO))
        }
    }
}

/// A new memfd (not pooled) holding exactly `bytes`, written with pwrite:
/// what a file gets when [`fill`] has no memfd to give. Returns the fd
/// (read-write) and its inode number.
pub fn written(bytes: &[u8]) -> Result<(c_int, u64), c_int> {
    // SAFETY: a NUL-terminated name and valid flags; the fd returned is ours.
    let fd = unsafe { libc::memfd_create(c"fanstore".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(errno());
    }
    let fail = |e: c_int| {
        close(fd);
        Err(e)
    };
    let mut done = 0usize;
    while done < bytes.len() {
        let rest = &bytes[done..];
        // SAFETY: rest is a live buffer of rest.len() bytes; fd is our memfd.
        let w = unsafe { crate::real::pwrite(fd, rest.as_ptr().cast(), rest.len(), done as libc::off_t) };
        if w <= 0 {
            let e = if w < 0 { errno() } else { libc::EIO };
            if e == libc::EINTR {
                continue;
            }
            return fail(e);
        }
        done += w as usize;
    }
    match ino_of(fd) {
        Some(ino) => Ok((fd, ino)),
        None => fail(errno()),
    }
}

/// Sizes `s`'s memfd to `len`, maps it whole and lets `write` fill it.
fn fill_slot(s: &mut Slot, len: u64, write: impl FnOnce(&mut [u8]) -> Result<(), c_int>) -> Result<(), c_int> {
    let n = len as usize;
    if s.size != len {
        // SAFETY: ftruncate of the pool's memfd.
        if unsafe { crate::real::ftruncate(s.fd, len as libc::off_t) } != 0 {
            return Err(errno());
        }
        s.size = len;
    }
    if n == 0 {
        return write(&mut []);
    }
    if s.map_len < n {
        if s.map != 0 {
            // SAFETY: the pool's own mapping.
            unsafe { libc::munmap(s.map as *mut libc::c_void, s.map_len) };
            (s.map, s.map_len) = (0, 0);
        }
        let want = n.next_multiple_of(4096).max(64 << 10).min(MAX_FILE as usize);
        // SAFETY: a new shared mapping of our memfd (the pages past the
        // file's end are never touched).
        let m = unsafe {
            crate::real::mmap(std::ptr::null_mut(), want, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, s.fd, 0)
        };
        if m == libc::MAP_FAILED {
            return Err(errno());
        }
        // Not inherited: a fork child never sees (or keeps alive) the pool's mapping.
        // SAFETY: madvise on the mapping just made.
        if unsafe { libc::madvise(m, want, libc::MADV_DONTFORK) } != 0 {
            let e = errno();
            // SAFETY: unmapping the mapping just made.
            unsafe { libc::munmap(m, want) };
            return Err(e);
        }
        (s.map, s.map_len) = (m as usize, want);
    }
    // SAFETY: the mapping covers `n` bytes of the memfd, which is `len` bytes
    // long; the entry is lent to this call only and its lease was granted,
    // so no other thread or description reads or writes these pages.
    let dst = unsafe { std::slice::from_raw_parts_mut(s.map as *mut u8, n) };
    write(dst)
}

/// A new read-only description of the file of `fd` (the pool's memfd, or
/// one the daemon sent): the program's fd, with its open flags (O_CLOEXEC,
/// O_NONBLOCK, O_NOCTTY, O_PATH kept).
pub fn reopen_ro(fd: c_int, flags: c_int) -> Result<c_int, c_int> {
    let path = fanstore_core::runtime::proc_fd_path(fd as u32);
    // SAFETY: path is NUL-terminated; the fd returned is the caller's.
    let fd = unsafe { crate::real::open(path.as_ptr().cast(), ro_flags(flags), 0) };
    if fd < 0 {
        return Err(errno());
    }
    Ok(fd)
}

/// The flags of the program's read-only description: its open flags'
/// O_CLOEXEC, O_NONBLOCK, O_NOCTTY and O_PATH.
fn ro_flags(flags: c_int) -> c_int {
    libc::O_RDONLY | (flags & (libc::O_CLOEXEC | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_PATH))
}

/// Why [`reopen_pooled`] failed.
enum Reopen {
    /// The open's own error (EMFILE, ...): the entry stays in the pool.
    Failed(c_int),
    /// The entry's number is not the pool's memfd any more: the program
    /// took it without a hooked call (a raw dup2 or close). The entry
    /// leaves the pool and its number is left alone.
    Stolen,
}

/// [`reopen_ro`] of pooled entry `s` of process `me`, relative to the pool's
/// `/proc/self/fd` directory. The new fd must have `s`'s inode number, else
/// it is closed unread: if the program took the entry's number without a
/// hooked call, the entry is [`Reopen::Stolen`]; if it took the directory's,
/// the directory is forgotten (not closed) and the whole `/proc/self/fd/N`
/// path is tried. Never another file than the memfd.
fn reopen_pooled(me: i32, s: &Slot, flags: c_int) -> Result<c_int, Reopen> {
    let dir = POOL.with(|p| (p.pid == me).then_some(p.fd_dir)).unwrap_or(-1);
    let dir = if dir >= 0 { dir } else { open_fd_dir(me).map_err(Reopen::Failed)? };
    let path = fanstore_core::runtime::proc_fd_path(s.fd as u32);
    // SAFETY: path[14..] is the NUL-terminated decimal name of s.fd; the fd
    // returned is the caller's.
    let fd = unsafe { crate::real::openat(dir, path[14..].as_ptr().cast(), ro_flags(flags), 0) };
    if fd >= 0 && ino_of(fd) == Some(s.ino) {
        return Ok(fd);
    }
    let e = errno();
    if fd < 0 && matches!(e, libc::EMFILE | libc::ENFILE | libc::ENOMEM | libc::EINTR) {
        return Err(Reopen::Failed(e));
    }
    if fd >= 0 {
        close(fd);
    }
    if ino_of(s.fd) != Some(s.ino) {
        crate::dlog!("memfd pool: fd {} is no longer the pool's memfd: it leaves the pool", s.fd);
        return Err(Reopen::Stolen);
    }
    crate::dlog!("memfd pool: fd {dir} is no longer /proc/self/fd: forgotten");
    POOL.with(|p| {
        if p.fd_dir == dir {
            p.fd_dir = -1;
        }
    });
    let fd = reopen_ro(s.fd, flags).map_err(Reopen::Failed)?;
    if ino_of(fd) == Some(s.ino) {
        return Ok(fd);
    }
    close(fd);
    Err(Reopen::Stolen)
}

/// The inode number of the file of `fd`.
fn ino_of(fd: c_int) -> Option<u64> {
    // SAFETY: fstat (libc's, not the hook) of a live fd into a zeroed stat.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        (crate::real::fstat(fd, &mut st) == 0).then_some(st.st_ino)
    }
}

/// Opens this process's `/proc/self/fd` for the pool of `me` (kept high,
/// close-on-exec), kept in the pool.
fn open_fd_dir(me: i32) -> Result<c_int, c_int> {
    // SAFETY: a NUL-terminated path; the fd returned is ours.
    let d = unsafe { crate::real::open(c"/proc/self/fd".as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC, 0) };
    if d < 0 {
        return Err(errno());
    }
    let d = crate::client::move_high(d);
    let kept = POOL.with(|p| {
        if (p.pid == me || p.pid == 0) && p.fd_dir < 0 {
            p.pid = me;
            p.fd_dir = d;
            true
        } else {
            false
        }
    });
    if !kept {
        // Another thread kept one meanwhile: use that one.
        close(d);
        return POOL.with(|p| (p.pid == me).then_some(p.fd_dir)).filter(|&o| o >= 0).ok_or(libc::EIO);
    }
    Ok(d)
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

/// A pooled entry nothing else refers to, lent to the caller: the best fit
/// for `len` bytes among those the program closed, else (the pool full) one
/// still lent whose fd went away without a `close`. Taken out of the pool.
fn take(me: i32, len: u64) -> Option<Slot> {
    let mut tried = [u64::MAX; TRIES];
    for t in 0..TRIES {
        let (s, was_lent) = POOL.with(|p| {
            if p.pid != me || p.n == 0 {
                return None;
            }
            let untried = |i: usize| !tried[..t].contains(&p.slots[i].ino);
            // Smallest free one that holds len, else the largest free one,
            // else (full) the next lent one.
            let cand = |i: &usize| !p.slots[*i].lent && untried(*i);
            let fits = (0..p.n).filter(cand).filter(|&i| p.slots[i].size >= len).min_by_key(|&i| p.slots[i].size);
            let i = match fits.or_else(|| (0..p.n).filter(cand).max_by_key(|&i| p.slots[i].size)) {
                Some(i) => i,
                // The first lent one: a failed try goes to the end, so
                // successive fills go round the pool.
                None if p.n == SLOTS => (0..p.n).find(|&i| p.slots[i].lent && untried(i))?,
                None => return None,
            };
            let s = p.slots[i];
            p.slots.copy_within(i + 1..p.n, i);
            p.n -= 1;
            Some((s, s.lent))
        })?;
        tried[t] = s.ino;
        if ino_of(s.fd) != Some(s.ino) {
            // The program took its number without a hooked call (a raw dup2
            // or close): neither truncated, nor leased, nor kept.
            crate::dlog!("memfd pool: fd {} is no longer the pool's memfd: it leaves the pool", s.fd);
            release(Slot { fd: -1, ..s });
            continue;
        }
        if sole_description(s.fd) {
            return Some(Slot { lent: true, ..s });
        }
        // Still referenced (a mapping, a dup, a child): back to the pool's end.
        put_back(me, Slot { lent: was_lent, ..s });
    }
    None
}

/// A new memfd for the pool, lent to the caller; None if the pool has no
/// room for it (or the process uses half of its fds).
fn new_entry(me: i32, len: u64) -> Option<Slot> {
    let room = POOL.with(|p| {
        let held: u64 = p.slots[..p.n].iter().map(|s| s.size).sum();
        (p.pid == 0 || p.pid == me) && p.n < SLOTS && held + len <= MAX_BYTES
    });
    if !room {
        return None;
    }
    // SAFETY: a NUL-terminated name and valid flags; the fd returned is ours.
    let made = unsafe { libc::memfd_create(c"fanstore".as_ptr(), libc::MFD_CLOEXEC) };
    if made < 0 {
        return None;
    }
    // fds are numbered lowest first, so this number is about how many the
    // process has open: with half of RLIMIT_NOFILE in use the pool keeps
    // none (its fds would bring the program's EMFILE closer).
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit into a live struct.
    let roomy = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0 && (made as u64) < lim.rlim_cur / 2;
    // The kernel never grants a lease on memfd_create's own description (it
    // is not counted as open for write): the pool keeps a reopened one, far
    // above the numbers programs use.
    let path = fanstore_core::runtime::proc_fd_path(made as u32);
    // SAFETY: path is NUL-terminated; the new fd is ours.
    let fd = if roomy { unsafe { crate::real::open(path.as_ptr().cast(), libc::O_RDWR | libc::O_CLOEXEC | libc::O_NOCTTY, 0) } } else { -1 };
    close(made);
    if fd < 0 {
        return None;
    }
    let fd = crate::client::move_high(fd);
    match ino_of(fd) {
        Some(ino) => {
            EVER.store(true, Relaxed);
            Some(Slot { fd, ino, size: 0, map: 0, map_len: 0, lent: true })
        }
        None => {
            close(fd);
            None
        }
    }
}

/// The program is closing or replacing fds `lo..=hi`: pool entries among
/// them leave the pool (their mappings are unmapped; the numbers are the
/// program's now, so they are not closed here), and so does the pool's
/// `/proc/self/fd` directory. Skipped while this thread is already inside
/// the library (our own closes keep the pool right). The process is checked
/// (a vfork child shares the parent's memory: its closes are not the
/// parent's) only when a number matches, so a close costs no system call.
#[inline]
pub fn forget_range(lo: c_int, hi: c_int) {
    if !EVER.load(Relaxed) {
        return;
    }
    let Some(_g) = crate::guard::Guard::enter() else { return };
    let hit = |fd: c_int| (lo..=hi).contains(&fd);
    let mut gone = [NO_SLOT; SLOTS];
    let n = POOL.with(|p| {
        if !hit(p.fd_dir) && !p.slots[..p.n].iter().any(|s| hit(s.fd)) {
            return 0;
        }
        if p.pid != pid() {
            return 0;
        }
        if hit(p.fd_dir) {
            p.fd_dir = -1;
        }
        let mut k = 0;
        let mut i = 0;
        while i < p.n {
            if hit(p.slots[i].fd) {
                gone[k] = p.slots[i];
                k += 1;
                p.slots.copy_within(i + 1..p.n, i);
                p.n -= 1;
            } else {
                i += 1;
            }
        }
        k
    });
    for s in &gone[..n] {
        release(Slot { fd: -1, ..*s });
    }
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

/// Returns `s` to the pool of process `me` (at its end), or releases it if
/// the pool is full, over its byte cap, off, or not `me`'s.
fn put_back(me: i32, s: Slot) {
    let kept = !OFF.load(Relaxed)
        && POOL.with(|p| {
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
        });
    if !kept {
        release(s);
    }
}

/// Before the real close of `fd`, a memfd this library filled (inode `ino`):
/// its pool entry, if any, is free to fill again once its lease is granted.
/// No system call: the lease, not this hint, decides (so a hint from a fork
/// or vfork child, whose pool is not this one, does no harm).
pub fn closing(ino: u64) {
    POOL.with(|p| {
        if let Some(s) = p.slots[..p.n].iter_mut().find(|s| s.ino == ino && s.lent) {
            s.lent = false;
        }
    });
}

/// The memfd of inode `ino` went to a call that may keep references to its
/// pages (sendfile, splice): its entry leaves the pool for good.
pub fn discard(ino: u64) {
    let me = pid();
    let gone = POOL.with(|p| {
        if p.pid != me {
            return None;
        }
        let i = (0..p.n).find(|&i| p.slots[i].ino == ino)?;
        let s = p.slots[i];
        p.slots.copy_within(i + 1..p.n, i);
        p.n -= 1;
        Some(s)
    });
    if let Some(s) = gone {
        release(s);
    }
}

/// The process used an interface that keeps page references beyond the
/// call (vmsplice, io_uring): no memfd is reused from now on.
pub fn turn_off() {
    if !OFF.swap(true, Relaxed) {
        let me = pid();
        let mut gone = [NO_SLOT; SLOTS];
        let n = POOL.with(|p| {
            if p.pid != me {
                return 0;
            }
            let n = p.n;
            gone[..n].copy_from_slice(&p.slots[..n]);
            p.n = 0;
            n
        });
        gone[..n].iter().for_each(|&s| release(s));
    }
}

pub fn fork_prepare() {
    POOL.lock();
}

pub fn fork_parent() {
    POOL.unlock();
}

/// In a fork child: the inherited fds share descriptions with the parent's
/// pool, so they are closed (the mappings were not inherited:
/// MADV_DONTFORK); the child starts an empty pool of its own.
pub fn fork_child() {
    // SAFETY: the prepare handler took the lock and this is the child's only thread.
    let p = unsafe { POOL.force() };
    for s in &p.slots[..p.n] {
        crate::unhooked::close_unhooked(s.fd);
    }
    // It is the parent's /proc/PID/fd.
    if p.fd_dir >= 0 {
        crate::unhooked::close_unhooked(p.fd_dir);
        p.fd_dir = -1;
    }
    p.n = 0;
    p.pid = pid();
    POOL.unlock();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_all(fd: c_int) -> Vec<u8> {
        let mut out = vec![0u8; 20 << 20];
        // SAFETY: pread into a live buffer of its length.
        let n = unsafe { libc::pread(fd, out.as_mut_ptr().cast(), out.len(), 0) };
        out.truncate(n.max(0) as usize);
        out
    }

    /// A file as `open` makes it through the pool: the program's fd and the inode.
    #[track_caller]
    fn put(bytes: &[u8]) -> (c_int, u64) {
        match put_maybe(bytes) {
            Some(r) => r,
            None => panic!("the pool gave no memfd for {} bytes", bytes.len()),
        }
    }

    fn put_maybe(bytes: &[u8]) -> Option<(c_int, u64)> {
        fill(bytes.len() as u64, libc::O_CLOEXEC, |d| {
            d.copy_from_slice(bytes);
            Ok(())
        })
        .map(|r| r.expect("fill"))
    }

    fn lent(ino: u64) -> Option<bool> {
        POOL.with(|p| p.slots[..p.n].iter().find(|s| s.ino == ino).map(|s| s.lent))
    }

    /// One test (the pool is per process): reuse, and every case that must not reuse.
    #[test]
    fn pages_are_reused_only_when_nothing_else_sees_them() {
        let (ro, ino) = put(&[1u8; 100_000]);
        assert_eq!(read_all(ro), vec![1u8; 100_000]);
        // SAFETY: a write attempt on our fd.
        assert_eq!(unsafe { libc::write(ro, b"x".as_ptr().cast(), 1) }, -1, "the program's fd is writable");
        assert_eq!(lent(ino), Some(true));
        closing(ino);
        close(ro);
        assert_eq!(lent(ino), Some(false));
        // Closed and unmapped: the next file gets its inode, with exactly its bytes.
        let (ro2, ino2) = put(&[2u8; 50_000]);
        assert_eq!(ino2, ino, "the closed memfd was not reused");
        assert_eq!(read_all(ro2), vec![2u8; 50_000], "old bytes past the new length");
        // Mapped by the program after its fd was closed: not reused.
        // SAFETY: a read-only shared mapping of our memfd.
        let map = unsafe { libc::mmap(std::ptr::null_mut(), 50_000, libc::PROT_READ, libc::MAP_SHARED, ro2, 0) };
        assert_ne!(map, libc::MAP_FAILED);
        closing(ino2);
        close(ro2);
        let (ro3, ino3) = put(&[3u8; 60_000]);
        assert_ne!(ino3, ino2, "a mapped memfd was reused");
        // SAFETY: the mapping made above.
        let mapped = unsafe { std::slice::from_raw_parts(map as *const u8, 50_000) };
        assert!(mapped.iter().all(|&b| b == 2), "the mapping's bytes changed");
        // SAFETY: unmapping it; from now on nothing refers to that memfd but the pool.
        unsafe { libc::munmap(map, 50_000) };
        let (ro4, ino4) = put(&[4u8; 10]);
        assert_eq!(ino4, ino2, "the unmapped memfd was not reused");
        assert_eq!(read_all(ro4), vec![4u8; 10]);
        // A dup still open: not reused.
        // SAFETY: dup of our fd.
        let dup = unsafe { libc::dup(ro3) };
        closing(ino3);
        close(ro3);
        let (ro5, ino5) = put(&[5u8; 10]);
        assert_ne!(ino5, ino3, "a memfd with a dup open was reused");
        assert_eq!(read_all(dup), vec![3u8; 60_000]);
        // A hint for another inode frees nothing.
        closing(12345);
        assert_eq!(lent(ino5), Some(true));
        // Sent to sendfile or splice: the entry leaves the pool.
        discard(ino5);
        assert_eq!(lent(ino5), None);
        assert_eq!(read_all(ro5), vec![5u8; 10], "the program's fd outlives the entry");
        // The pool full of lent entries: one whose fd went away without a
        // close hint (dup2 over it) is taken back once the lease says so;
        // those still open never are.
        let mut held = vec![ro4, ro5, dup];
        while POOL.with(|p| p.n) < SLOTS {
            held.push(put(&[6u8; 1000]).0);
        }
        let victim = held.pop().expect("an fd");
        let victim_ino = POOL.with(|p| p.slots[SLOTS - 1].ino);
        close(victim); // no closing(): the entry stays lent
        // Each fill tries at most TRIES entries (the rest fall back to a
        // memfd of their own): within a round of the pool, the one nobody
        // holds is found.
        let (ro7, ino7) = (0..2 * SLOTS).find_map(|_| put_maybe(&[7u8; 2000])).expect("the lent entry nobody holds was never taken back");
        assert_eq!(ino7, victim_ino, "another entry than the one nobody holds was taken");
        assert_eq!(read_all(ro7), vec![7u8; 2000]);
        for &fd in &held {
            let b = read_all(fd);
            assert!(b.iter().all(|&x| x == b[0]), "a file still open changed");
        }
        held.push(ro7);
        // Nothing free and every entry held: no memfd from the pool.
        assert!(put_maybe(&[8u8; 10]).is_none(), "a held memfd was given out");
        // The program closes a number the pool holds (closefrom, dup2 onto
        // it): that entry leaves the pool, and no other.
        let (pfd, pino) = POOL.with(|p| (p.slots[0].fd, p.slots[0].ino));
        assert!(pfd > 100, "the pool's fd {pfd} sits among the program's numbers");
        forget_range(pfd, pfd);
        assert_eq!(lent(pino), None, "an entry whose number the program closed stayed");
        assert_eq!(POOL.with(|p| p.n), SLOTS - 1);
        close(pfd);
        // The program takes numbers of the pool's without a hooked call (a
        // raw dup3): never another file's bytes, the program's files are
        // never written, and a stolen entry leaves the pool.
        let tmp = std::env::temp_dir().join(format!("fanstore-pool-test-{}", std::process::id()));
        std::fs::create_dir_all(&tmp).expect("temp dir");
        let other = tmp.join("own");
        std::fs::write(&other, b"the program's own file").expect("temp file");
        let of = std::fs::OpenOptions::new().read(true).write(true).open(&other).expect("open temp file");
        let ofd = std::os::fd::AsRawFd::as_raw_fd(&of);
        let ro7 = held.pop().expect("an fd");
        closing(ino7);
        close(ro7);
        let dir = POOL.with(|p| p.fd_dir);
        assert!(dir > 100, "the pool's /proc/self/fd sits among the program's numbers: {dir}");
        // The directory's number: a directory of the program's holding a file
        // named like the free entry's fd.
        let free_fd = POOL.with(|p| p.slots[..p.n].iter().find(|s| s.ino == ino7).map(|s| s.fd)).expect("entry");
        std::fs::write(tmp.join(free_fd.to_string()), b"not the pool's bytes").expect("decoy");
        let tdir = std::fs::File::open(&tmp).expect("open temp dir");
        // A dup3 no hook sees (libc's syscall() is hooked, and raw system
        // calls are trapped).
        let raw_dup3 = |from: c_int, to: c_int| crate::unhooked::syscall_unhooked(libc::SYS_dup3, [from as u64, to as u64, 0, 0, 0, 0]);
        assert_eq!(raw_dup3(std::os::fd::AsRawFd::as_raw_fd(&tdir), dir), dir as i64);
        let (ro8, ino8) = put(&[8u8; 3000]);
        assert_eq!((ino8, read_all(ro8)), (ino7, vec![8u8; 3000]), "through a stolen directory number");
        assert_ne!(POOL.with(|p| p.fd_dir), dir, "the stolen directory number stayed the pool's");
        closing(ino8);
        close(ro8);
        // The entry's number: the program's own file.
        assert_eq!(raw_dup3(ofd, free_fd), free_fd as i64);
        // The free entry is tried first: found stolen, it leaves the pool,
        // and the file gets another memfd.
        let (ro9, ino9) = put(&[9u8; 4000]);
        assert_ne!(ino9, ino8, "a stolen memfd number was used");
        assert_eq!(read_all(ro9), vec![9u8; 4000]);
        assert!(POOL.with(|p| p.fd_dir) > 100, "a good directory was forgotten");
        assert_eq!(lent(ino8), None, "a stolen number stayed in the pool");
        assert_eq!(std::fs::read(&other).expect("temp file"), b"the program's own file", "the program's file was written");
        // Taken between the check and the reopen: the reopen refuses it.
        let stolen = Slot { fd: free_fd, ino: ino8, ..NO_SLOT };
        assert!(matches!(reopen_pooled(pid(), &stolen, libc::O_CLOEXEC), Err(Reopen::Stolen)));
        close(ro9);
        close(dir);
        close(free_fd);
        drop((of, tdir));
        let _ = std::fs::remove_dir_all(&tmp);
        // Off: the pool is emptied and gives nothing.
        turn_off();
        assert_eq!(POOL.with(|p| p.n), 0);
        assert!(put_maybe(&[9u8; 10]).is_none());
        for fd in held {
            close(fd);
        }
    }

    #[test]
    fn a_memfd_of_its_own_holds_exactly_the_bytes() {
        let (fd, _) = written(&[7u8; 70_000]).expect("memfd");
        assert_eq!(read_all(fd), vec![7u8; 70_000]);
        close(fd);
    }
}
