//! fopen/freopen of virtual files: the real fd from [`super::open`], then
//! libc's own fdopen (or freopen through `/proc/self/fd`), so stdio (and
//! C++ streams on top of it) work natively. fclose must be seen: glibc
//! closes the fd internally, not through close().

use super::{open, Outcome, VPath};
use crate::errno::errno;
use crate::fd_table::{self, Tracked};
use libc::{c_int, FILE};
use std::ffi::CStr;

/// The fd of `vp` opened as fopen's `mode` asks (EINVAL for a mode that
/// is null or not fopen's).
fn open_as(vp: &VPath, mode: Option<&CStr>) -> Outcome<c_int> {
    let Some(flags) = mode.and_then(|m| open::fopen_flags(m.to_bytes())) else {
        return Outcome::Errno(libc::EINVAL);
    };
    open::open(vp, flags, 0o666)
}

/// fopen of `vp`: a stream on its fd, read-only for an input, in the
/// caller's mode for an output.
pub fn fopen(vp: &VPath, mode: Option<&CStr>) -> Outcome<*mut FILE> {
    let fd = match open_as(vp, mode) {
        Outcome::Handled(fd) => fd,
        Outcome::Errno(e) => return Outcome::Errno(e),
        Outcome::Passthrough => return Outcome::Passthrough,
    };
    let m = match mode {
        Some(m) if matches!(fd_table::get(fd), Some(Tracked::Output(_))) => m,
        _ => c"r",
    };
    // The stream writes through glibc's internal write, which no hook sees.
    if let Err(e) = super::lazy_copy::before_write(fd) {
        fd_table::clear(fd);
        // SAFETY: closing the fd this call opened, which nothing else knows.
        unsafe { crate::real::close(fd) };
        return Outcome::Errno(e);
    }
    // SAFETY: fd is the open fd just made; m is NUL-terminated.
    let f = unsafe { crate::real::fdopen(fd, m.as_ptr()) };
    if f.is_null() {
        let e = errno();
        fd_table::clear(fd);
        // SAFETY: closing the fd this call opened, which nothing else knows.
        unsafe { crate::real::close(fd) };
        return Outcome::Errno(e);
    }
    Outcome::Handled(f)
}

/// Does fopen mode `mode` open for writing ("w", "a", "r+", ...)?
pub fn writes(mode: Option<&CStr>) -> bool {
    mode.and_then(|m| open::fopen_flags(m.to_bytes())).is_some_and(super::open_base::wants_write)
}

/// Before freopen gives `stream` a new file: its old fd `old` is closed
/// inside glibc, so the tables forget it first.
pub fn replacing(old: c_int) {
    if old >= 0 {
        super::fd::before_close(old);
    }
}

/// freopen of `vp` onto `stream`: the fd opened as `mode` asks is reopened
/// through `/proc/self/fd` so that the stream gets its own description of
/// the same bytes, then ours is closed. `node` receives what the fd table
/// said of it, for [`reopened`].
///
/// # Safety
/// `stream` is a live `FILE *` (freopen's contract).
pub unsafe fn freopen(vp: &VPath, mode: Option<&CStr>, stream: *mut FILE, node: &mut Option<Tracked>) -> Outcome<*mut FILE> {
    let fd = match open_as(vp, mode) {
        Outcome::Handled(fd) => fd,
        Outcome::Errno(e) => return Outcome::Errno(e),
        Outcome::Passthrough => return Outcome::Passthrough,
    };
    // (Reopened as it is, a lazy fd's file would be the committed version's own.)
    if let Err(e) = super::lazy_copy::before_write(fd) {
        fd_table::clear(fd);
        // SAFETY: closing the fd this call opened, which nothing else knows.
        unsafe { crate::real::close(fd) };
        return Outcome::Errno(e);
    }
    *node = fd_table::get(fd);
    let mut p = *b"/proc/self/fd/\0\0\0\0\0\0\0\0\0\0\0\0";
    let s = fd.to_string();
    p[14..14 + s.len()].copy_from_slice(s.as_bytes());
    // SAFETY: p is NUL-terminated, "r" too; stream is live (the contract).
    let f = unsafe { crate::real::freopen(p.as_ptr().cast(), c"r".as_ptr(), stream) };
    fd_table::clear(fd);
    // SAFETY: closing the fd this call opened; the stream has its own.
    unsafe { crate::real::close(fd) };
    if f.is_null() {
        return Outcome::Errno(errno());
    }
    Outcome::Handled(f)
}

/// After a successful freopen of a virtual file: the stream's new fd
/// `fd` is what the fd opened for it was.
pub fn reopened(fd: c_int, t: Tracked) {
    fd_table::set(fd, t);
}

/// Before fclose of a stream on `fd` (glibc closes the fd internally):
/// an output's buffer must reach its file first (`flush`), then the
/// tables as for close. The errno fclose must report, if any.
pub fn before_fclose(fd: c_int, flush: impl FnOnce()) -> Option<c_int> {
    if matches!(fd_table::get(fd), Some(Tracked::Output(_))) {
        flush();
    }
    super::fd::before_close(fd)
}
