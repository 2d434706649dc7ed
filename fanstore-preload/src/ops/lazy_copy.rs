//! Copy on first write: an open `O_RDWR` of a committed output (no
//! O_CREAT, O_TRUNC or O_APPEND) hands out the read-only fd of its bytes
//! that an open for reading gets, tracked as an output being written and
//! marked lazy in the fd table. Its private, writable copy is made only when
//! something would change the file through that fd; an fd that is only
//! read (mdtest's read phase opens every file `O_RDWR`) never costs one,
//! and its close commits nothing.
//!
//! The copy replaces the read-only description at the same fd number
//! (`dup3`), with its offset, status flags and close-on-exec flag, before:
//! - `write`, `pwrite`, `writev`, `pwritev`(2), `ftruncate`, `fallocate`,
//!   `posix_fallocate`, `copy_file_range`/`sendfile`/`splice` into it, a
//!   shared `mmap` of it, `fdopen` for writing (hooks/bytes.rs, zerocopy.rs,
//!   stdio.rs, and the same system calls made raw: sud/dispatch.rs);
//! - `fchmod`, `fchown`, `futimens`, `fsetxattr`, `fremovexattr` on it
//!   (they would change the committed file itself: ops/write.rs);
//! - `dup`, `dup2`, `dup3`, `F_DUPFD` (the copies must share one writable
//!   description), another open of the same output by this process
//!   (ops/out.rs), a `fork` (lib.rs) and an exec or spawn that passes it
//!   on (exec_outputs.rs): every lazy fd is copied then.
//!
//! `fcntl(F_GETFL)` reports `O_RDWR` for a lazy fd, as the program asked.
//!
//! Not covered (documented in docs/posix.md): a write that reaches the
//! kernel by none of these paths (glibc's own internal calls, such as
//! `dprintf`, or io_uring) on a lazy fd fails with EBADF, as on an fd
//! opened read-only; it never changes the committed bytes.

use crate::errno::{errno, set_errno};
use crate::fd_table::{self, Tracked};
use crate::lock::Locked;
use libc::c_int;

/// Held while a copy is made, and across fork (lib.rs): the child never
/// inherits it taken.
static COPYING: Locked<()> = Locked::new(());

/// Before a call that changes `fd`'s file: its writable copy, if `fd` is
/// lazy. Err: the errno the call must fail with (no room for the copy).
#[inline]
pub fn before_write(fd: c_int) -> Result<(), c_int> {
    if !fd_table::is_lazy(fd) {
        return Ok(());
    }
    make_writable(fd)
}

/// [`before_write`] for a call that may pass `fd` on (dup, exec): its
/// failure is the call's.
#[cold]
pub fn make_writable(fd: c_int) -> Result<(), c_int> {
    if fd_table::borrowed() {
        // A vfork child runs in its parent's memory: the parent's fd stays
        // as it is, and so does this one (read-only).
        return Ok(());
    }
    let saved = errno();
    COPYING.lock();
    let r = copy_now(fd);
    COPYING.unlock();
    match r {
        Ok(()) => {
            set_errno(saved);
            Ok(())
        }
        Err(e) => {
            crate::dlog!("copy on write of fd {fd}: {}", crate::debug::E(e));
            Err(e)
        }
    }
}

/// Every lazy fd of this process gets its copy (before a fork, an exec, a spawn).
pub fn make_all_writable() {
    if !fd_table::lazy_ever() {
        return;
    }
    for fd in 0..=crate::outputs::max_fd() {
        if fd_table::is_lazy(fd) {
            let _ = make_writable(fd);
        }
    }
}

pub fn fork_prepare() {
    make_all_writable();
    COPYING.lock();
}

pub fn fork_release() {
    COPYING.unlock();
}

/// The copy itself, with [`COPYING`] held.
fn copy_now(fd: c_int) -> Result<(), c_int> {
    if !fd_table::is_lazy(fd) {
        return Ok(()); // another thread made it meanwhile
    }
    let Some(Tracked::Output(idx)) = fd_table::get(fd) else { return Ok(()) };
    // SAFETY: plain data, zero is valid.
    let mut s: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: s is a valid out-pointer; fstat on any int is safe.
    if unsafe { crate::real::fstat(fd, &mut s) } != 0 {
        return Err(errno());
    }
    let new = super::out_file::new_copy_file(s.st_size);
    if new < 0 {
        return Err(errno());
    }
    let fail = |e: c_int| {
        // SAFETY: closing the file made above, which nothing else knows.
        unsafe { crate::real::close(new) };
        Err(e)
    };
    if let Err(e) = super::out_file::copy_bytes(fd, new, s.st_size) {
        return fail(e);
    }
    // SAFETY (block): fcntl and lseek queries and settings on our two fds.
    let (pos, status, fd_flags) = unsafe {
        (crate::real::lseek(fd, 0, libc::SEEK_CUR), crate::real::fcntl(fd, libc::F_GETFL, 0), crate::real::fcntl(fd, libc::F_GETFD, 0))
    };
    if pos < 0 || status < 0 || fd_flags < 0 {
        return fail(errno());
    }
    // SAFETY (block): as above.
    unsafe {
        if crate::real::lseek(new, pos, libc::SEEK_SET) < 0 {
            return fail(errno());
        }
        crate::real::fcntl(new, libc::F_SETFL, (status & (libc::O_APPEND | libc::O_NONBLOCK)) as libc::c_ulong);
    }
    let cloexec = if fd_flags & libc::FD_CLOEXEC != 0 { libc::O_CLOEXEC } else { 0 };
    // The fd number now names the copy: dup3 replaces it atomically, so a
    // read in another thread sees one description or the other, never none.
    // SAFETY: both fds are ours.
    if unsafe { crate::real::dup3(new, fd, cloexec) } < 0 {
        return fail(errno());
    }
    // SAFETY: closing our own fd (its description lives on as `fd`).
    unsafe { crate::real::close(new) };
    fd_table::clear_lazy(fd);
    crate::outputs::copied(idx, fd);
    Ok(())
}

/// `fcntl(fd, F_GETFL)` returned `flags`: a lazy fd reports the `O_RDWR`
/// its open asked for.
#[inline]
pub fn status_flags(fd: c_int, flags: c_int) -> c_int {
    if flags >= 0 && fd_table::is_lazy(fd) {
        (flags & !libc::O_ACCMODE) | libc::O_RDWR
    } else {
        flags
    }
}
