//! sendfile, sendfile64, splice, vmsplice, copy_file_range: calls that
//! move bytes between fds in the kernel. The first four can leave
//! references to a file's pages in a pipe or a socket buffer after they
//! return: a memfd this library filled and whose pages it would reuse after
//! the close (`crate::memfd_pool`) is freed instead once it went through
//! sendfile or splice; vmsplice turns the reuse off for the process. An
//! output fd they write into that still waits for its copy gets it first
//! (`crate::ops::lazy_copy`). The calls themselves are libc's, unchanged.

use super::fail;
use crate::ops::fd::pages_lent;
use crate::ops::lazy_copy::before_write;
use crate::real;
use libc::{c_int, c_uint, loff_t, off64_t, off_t, size_t, ssize_t};

crate::hooks! {
    fn sendfile(out_fd: c_int, in_fd: c_int, offset: *mut off_t, count: size_t) -> ssize_t {
        if let Err(e) = before_write(out_fd) {
            return fail(e);
        }
        pages_lent(in_fd);
        real::sendfile(out_fd, in_fd, offset, count)
    }
    fn sendfile64(out_fd: c_int, in_fd: c_int, offset: *mut off64_t, count: size_t) -> ssize_t {
        if let Err(e) = before_write(out_fd) {
            return fail(e);
        }
        pages_lent(in_fd);
        real::sendfile64(out_fd, in_fd, offset, count)
    }
    fn splice(fd_in: c_int, off_in: *mut loff_t, fd_out: c_int, off_out: *mut loff_t, len: size_t, flags: c_uint) -> ssize_t {
        if let Err(e) = before_write(fd_out) {
            return fail(e);
        }
        pages_lent(fd_in);
        real::splice(fd_in, off_in, fd_out, off_out, len, flags)
    }
    fn vmsplice(fd: c_int, iov: *const libc::iovec, nr_segs: size_t, flags: c_uint) -> ssize_t {
        crate::memfd_pool::turn_off();
        real::vmsplice(fd, iov, nr_segs, flags)
    }
    fn copy_file_range(fd_in: c_int, off_in: *mut loff_t, fd_out: c_int, off_out: *mut loff_t, len: size_t, flags: c_uint) -> ssize_t {
        if let Err(e) = before_write(fd_out) {
            return fail(e);
        }
        let r = real::copy_file_range(fd_in, off_in, fd_out, off_out, len, flags);
        if r < 0 && crate::errno::errno() == libc::EXDEV && flags == 0 {
            // Between an output's file (a memfd, or the daemon's disk) and
            // another file system the kernel refuses: copied here, as glibc
            // did before 2.30.
            // SAFETY: the caller's own offset pointers (probed there).
            if let Some(n) = unsafe { crate::ops::fd::copy_range_by_hand(fd_in, off_in, fd_out, off_out, len) } {
                return n;
            }
        }
        r
    }
}
