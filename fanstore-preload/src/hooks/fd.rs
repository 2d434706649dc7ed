//! close, close_range, closefrom, dup, dup2, dup3, fcntl(F_DUPFD*): the fd
//! table follows the kernel's fd numbers.

use crate::ops::fd::{after_dup, before_close, before_close_range, before_dup2};
use libc::{c_int, c_uint, c_ulong};

crate::hooks! {
    fn close(fd: c_int) -> c_int {
        before_close(fd);
        orig::close(fd)
    }
    fn close_range(first: c_uint, last: c_uint, flags: c_int) -> c_int {
        before_close_range(first, last, flags);
        orig::close_range(first, last, flags)
    }
    fn closefrom(lowfd: c_int) -> () {
        before_close_range(lowfd.max(0) as u32, u32::MAX, 0);
        orig::closefrom(lowfd)
    }
    fn dup(fd: c_int) -> c_int {
        let r = orig::dup(fd);
        after_dup(fd, r);
        r
    }
    fn dup2(old: c_int, new: c_int) -> c_int {
        before_dup2(old, new);
        let r = orig::dup2(old, new);
        if old != new {
            after_dup(old, r);
        }
        r
    }
    fn dup3(old: c_int, new: c_int, flags: c_int) -> c_int {
        before_dup2(old, new);
        let r = orig::dup3(old, new, flags);
        after_dup(old, r);
        r
    }
    fn fcntl(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
        let r = orig::fcntl(fd, cmd, arg);
        if cmd == libc::F_DUPFD || cmd == libc::F_DUPFD_CLOEXEC {
            after_dup(fd, r);
        }
        r
    }
    fn fcntl64(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
        let r = orig::fcntl64(fd, cmd, arg);
        if cmd == libc::F_DUPFD || cmd == libc::F_DUPFD_CLOEXEC {
            after_dup(fd, r);
        }
        r
    }
}
