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
            // (A fork child's copy of its parent's output: `closing` leaves
            // it to the parent.)
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

/// copy_file_range between a tracked fd and another file system (the
/// kernel's EXDEV): the copy made with read and write, each offset pointer
/// used and advanced as the kernel would (null: the fd's own offset).
/// None when neither fd is tracked (the caller keeps the kernel's EXDEV) or
/// an offset pointer is bad (EFAULT is the kernel's too).
///
/// # Safety
/// `off_in` and `off_out` are null or the caller's copy_file_range
/// offset pointers (probed before use).
pub unsafe fn copy_range_by_hand(fd_in: c_int, off_in: *mut libc::loff_t, fd_out: c_int, off_out: *mut libc::loff_t, len: usize) -> Option<isize> {
    if fd_table::get(fd_in).is_none() && fd_table::get(fd_out).is_none() {
        return None;
    }
    if (!off_in.is_null() && !crate::user_mem::writable_one(off_in)) || (!off_out.is_null() && !crate::user_mem::writable_one(off_out)) {
        return None;
    }
    let mut buf = vec![0u8; len.clamp(1, 1 << 20)];
    let mut done = 0usize;
    while done < len {
        let want = buf.len().min(len - done);
        // SAFETY (block): buf is live for `want` bytes; the offset pointers
        // were probed writable above.
        let n = unsafe {
            if off_in.is_null() {
                libc::read(fd_in, buf.as_mut_ptr().cast(), want)
            } else {
                libc::pread(fd_in, buf.as_mut_ptr().cast(), want, *off_in)
            }
        };
        if n <= 0 {
            if n < 0 && done == 0 {
                return Some(-1);
            }
            break;
        }
        let n = n as usize;
        let mut put = 0usize;
        while put < n {
            // SAFETY (block): as above, the bytes just read.
            let w = unsafe {
                if off_out.is_null() {
                    crate::real::write(fd_out, buf[put..n].as_ptr().cast(), n - put)
                } else {
                    crate::real::pwrite(fd_out, buf[put..n].as_ptr().cast(), n - put, *off_out + put as i64)
                }
            };
            if w <= 0 {
                return Some(if done + put == 0 { -1 } else { (done + put) as isize });
            }
            put += w as usize;
        }
        // SAFETY: the offset pointers were probed writable above.
        unsafe {
            if !off_in.is_null() {
                *off_in += n as i64;
            }
            if !off_out.is_null() {
                *off_out += n as i64;
            }
        }
        done += n;
    }
    Some(done as isize)
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
