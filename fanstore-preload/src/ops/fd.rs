//! Keeping the fd table right across close, dup and friends. The table is
//! updated before a real close (so a racing open reusing the number is never
//! clobbered) and after a successful dup.

use crate::fd_table::{self, Tracked};
use libc::{c_int, off_t};

/// Before a real close of `fd`. Returns the errno the close must report
/// (the commit of an output whose last fd this was failed).
#[inline]
pub fn before_close(fd: c_int) -> Option<c_int> {
    crate::locks::forget(fd);
    let mut err = None;
    super::inotify::closing(fd);
    if fd_table::any() {
        let t = fd_table::get(fd);
        if t.is_some() && fd_table::borrowed() {
            // A vfork child closing its parent's fd: the parent's tables stay.
            return None;
        }
        match t {
            // A fork child's copy of its parent's output: the parent commits it.
            Some(Tracked::Output(idx)) if crate::outputs::is_foreign(idx) => {}
            Some(Tracked::Output(idx)) => {
                let _g = crate::guard::Guard::enter();
                err = crate::outputs::closing(fd, idx);
            }
            Some(Tracked::Dir { node, .. }) if node & crate::outputs::OUT_DIR != 0 => {
                fd_table::clear(fd);
                crate::outputs::release_dir(node);
            }
            Some(Tracked::File(_)) => {
                if let Some(ino) = fd_table::recyclable(fd) {
                    let _g = crate::guard::Guard::enter();
                    crate::memfd_pool::closing(ino);
                }
            }
            _ => {}
        }
        fd_table::clear(fd);
    }
    crate::client::forget_range(fd, fd);
    crate::memfd_pool::forget_range(fd, fd);
    err
}

/// `fd` goes to a call that may keep references to its pages after it
/// returns (sendfile, splice): its memfd, if ours, is never reused.
#[inline]
pub fn pages_lent(fd: c_int) {
    if fd_table::any() {
        if let Some(ino) = fd_table::recyclable(fd) {
            let _g = crate::guard::Guard::enter();
            crate::memfd_pool::discard(ino);
        }
        fd_table::forget_recyclable(fd);
    }
}

/// After `new = dup(old)` (or dup2/dup3/F_DUPFD) returned `r`.
#[inline]
pub fn after_dup(old: c_int, r: c_int) {
    crate::locks::after_dup(old, r);
    if r >= 0 && fd_table::any() {
        if fd_table::get(old).is_some() && fd_table::borrowed() {
            // A vfork child (dup2 onto its stdout before exec): the parent's
            // tables stay; the exec passes the fd on as the parent's.
            return;
        }
        fd_table::copy(old, r);
        match fd_table::get(r) {
            Some(Tracked::Output(idx)) => crate::outputs::add_ref(r, idx),
            Some(Tracked::Dir { node, .. }) if node & crate::outputs::OUT_DIR != 0 => crate::outputs::add_ref(r, node),
            _ => {}
        }
    }
}

/// Before dup2/dup3 replaces `new` (a no-op when old == new, which dup2 leaves alone).
#[inline]
pub fn before_dup2(old: c_int, new: c_int) {
    if old != new {
        crate::locks::forget(new);
        if fd_table::any() {
            let t = fd_table::get(new);
            if t.is_some() && fd_table::borrowed() {
                return;
            }
            match t {
                Some(Tracked::Output(idx)) if !crate::outputs::is_foreign(idx) => {
                    let _g = crate::guard::Guard::enter();
                    let _ = crate::outputs::closing(new, idx);
                    fd_table::clear(new);
                }
                _ => fd_table::clear(new),
            }
        }
        crate::client::forget_range(new, new);
        crate::memfd_pool::forget_range(new, new);
    }
}

pub fn before_close_range(lo: u32, hi: u32, flags: c_int) {
    if flags & (libc::CLOSE_RANGE_CLOEXEC as c_int) == 0 {
        crate::locks::forget_range(lo.min(i32::MAX as u32) as c_int, hi.min(i32::MAX as u32) as c_int);
        if fd_table::any() && fd_table::borrowed() {
            // A vfork child closing its fds before exec: the parent's stay tracked.
            return;
        }
        if fd_table::any() {
            let _g = crate::guard::Guard::enter();
            crate::outputs::closing_range(lo, hi);
        }
        fd_table::clear_range(lo, hi);
        crate::client::forget_range(lo.min(i32::MAX as u32) as c_int, hi.min(i32::MAX as u32) as c_int);
        crate::memfd_pool::forget_range(lo.min(i32::MAX as u32) as c_int, hi.min(i32::MAX as u32) as c_int);
    }
}

/// lseek on a virtual directory fd moves its getdents64 position (d_off
/// values are positions); on anything else it is libc's.
pub fn dir_seek(fd: c_int, off: off_t, whence: c_int) -> Option<off_t> {
    let Some(Tracked::Dir { node, pos }) = fd_table::get(fd) else { return None };
    let new = match whence {
        libc::SEEK_SET => off,
        libc::SEEK_CUR => pos as off_t + off,
        _ => return Some(-1),
    };
    if !(0..=u32::MAX as off_t).contains(&new) {
        return Some(-1);
    }
    fd_table::set_pos(fd, node, new as u32);
    Some(new)
}
