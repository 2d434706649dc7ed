//! Keeping the fd table right across close, dup and friends. The table is
//! updated before a real close (so a racing open reusing the number is never
//! clobbered) and after a successful dup.

use crate::fd_table;
use libc::c_int;

#[inline]
pub fn before_close(fd: c_int) {
    if fd_table::any() {
        fd_table::clear(fd);
    }
    crate::client::forget_range(fd, fd);
}

/// After `new = dup(old)` (or dup2/dup3/F_DUPFD) returned `r`.
#[inline]
pub fn after_dup(old: c_int, r: c_int) {
    if r >= 0 && fd_table::any() {
        fd_table::copy(old, r);
    }
}

/// Before dup2/dup3 replaces `new` (a no-op when old == new, which dup2 leaves alone).
#[inline]
pub fn before_dup2(old: c_int, new: c_int) {
    if old != new {
        if fd_table::any() {
            fd_table::clear(new);
        }
        crate::client::forget_range(new, new);
    }
}

pub fn before_close_range(lo: u32, hi: u32, flags: c_int) {
    if flags & (libc::CLOSE_RANGE_CLOEXEC as c_int) == 0 {
        fd_table::clear_range(lo, hi);
        crate::client::forget_range(lo.min(i32::MAX as u32) as c_int, hi.min(i32::MAX as u32) as c_int);
    }
}
