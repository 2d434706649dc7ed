//! close, close_range, closefrom, dup, dup2, dup3, fcntl(F_DUPFD*): the fd
//! table follows the kernel's fd numbers. fcntl's lock commands act on a
//! lock file for outputs (`crate::locks`). An output fd waiting for its
//! copy gets it before it is duplicated, and F_GETFL reports its O_RDWR
//! ([`crate::ops::lazy_copy`]).

use crate::ops::fd::{after_dup, before_close, before_close_range, before_dup2, dir_seek};
use super::fail;
use crate::ops::lazy_copy;
use crate::real;
use libc::{c_int, c_uint, c_ulong, off_t};

/// fcntl and fcntl64 (`real`, the original, called with the fd, command and
/// argument to use): a lock command acts on the fd's lock file; a duplicate
/// made by F_DUPFD* is tracked like its original.
fn fcntl_common(fd: c_int, cmd: c_int, arg: c_ulong, real: impl FnOnce(c_int, c_int, c_ulong) -> c_int) -> c_int {
    if crate::locks::is_lock_cmd(cmd) {
        return real(crate::locks::target(fd), cmd, arg);
    }
    let dup = cmd == libc::F_DUPFD || cmd == libc::F_DUPFD_CLOEXEC;
    if dup {
        if let Err(e) = lazy_copy::before_write(fd) {
            return fail(e);
        }
    }
    let r = real(fd, cmd, arg);
    if dup {
        after_dup(fd, r);
    } else if cmd == libc::F_GETFL {
        return lazy_copy::status_flags(fd, r);
    }
    r
}

/// lseek and lseek64: a virtual directory fd's position is ours; any other
/// fd goes to `real`, the original.
fn lseek_common(fd: c_int, off: off_t, whence: c_int, real: impl FnOnce() -> off_t) -> off_t {
    match dir_seek(fd, off, whence) {
        Some(-1) => {
            crate::errno::set_errno(libc::EINVAL);
            -1
        }
        Some(p) => p,
        None => real(),
    }
}

crate::hooks! {
    fn close(fd: c_int) -> c_int {
        match before_close(fd) {
            None => real::close(fd),
            Some(e) => {
                real::close(fd);
                crate::errno::set_errno(e);
                -1
            }
        }
    }
    fn close_range(first: c_uint, last: c_uint, flags: c_int) -> c_int {
        before_close_range(first, last, flags);
        real::close_range(first, last, flags)
    }
    fn closefrom(lowfd: c_int) -> () {
        before_close_range(lowfd.max(0) as u32, u32::MAX, 0);
        real::closefrom(lowfd)
    }
    fn dup(fd: c_int) -> c_int {
        if let Err(e) = lazy_copy::before_write(fd) {
            return fail(e);
        }
        let r = real::dup(fd);
        after_dup(fd, r);
        r
    }
    fn dup2(old: c_int, new: c_int) -> c_int {
        if let Err(e) = lazy_copy::before_write(old) {
            return fail(e);
        }
        before_dup2(old, new);
        let r = real::dup2(old, new);
        if old != new {
            after_dup(old, r);
        }
        r
    }
    fn dup3(old: c_int, new: c_int, flags: c_int) -> c_int {
        if let Err(e) = lazy_copy::before_write(old) {
            return fail(e);
        }
        before_dup2(old, new);
        let r = real::dup3(old, new, flags);
        after_dup(old, r);
        r
    }
    fn fcntl(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
        fcntl_common(fd, cmd, arg, |fd, cmd, arg| real::fcntl(fd, cmd, arg))
    }
    fn lseek(fd: c_int, off: off_t, whence: c_int) -> off_t {
        lseek_common(fd, off, whence, || real::lseek(fd, off, whence))
    }
    fn lseek64(fd: c_int, off: off_t, whence: c_int) -> off_t {
        lseek_common(fd, off, whence, || real::lseek64(fd, off, whence))
    }
    fn fcntl64(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
        fcntl_common(fd, cmd, arg, |fd, cmd, arg| real::fcntl64(fd, cmd, arg))
    }
}
