//! write, pwrite, writev, pwritev(2), ftruncate, fallocate,
//! posix_fallocate, mmap: the calls that change an open file's bytes, or
//! map it so that stores change them. An output opened `O_RDWR` whose fd
//! is still the committed version's read-only file gets its writable copy
//! first ([`crate::ops::lazy_copy`]); everything else is libc's call,
//! unchanged, after one relaxed load (no fd was ever lazy) or one fd table
//! lookup.

use crate::ops::lazy_copy::before_write;
use crate::real;
use libc::{c_int, c_void, off64_t, off_t, size_t, ssize_t};

/// `before_write(fd)`, or return -1 with its errno from the hook.
macro_rules! copied_or_fail {
    ($fd:expr) => {
        if let Err(e) = before_write($fd) {
            return super::fail(e);
        }
    };
}

/// Does an mmap with `flags` of `fd` write through to its file (a shared
/// mapping of a file)? A private or anonymous one never does.
pub(crate) fn maps_shared(flags: c_int, fd: c_int) -> bool {
    fd >= 0 && flags & libc::MAP_ANONYMOUS == 0 && flags & (libc::MAP_SHARED | libc::MAP_PRIVATE) != libc::MAP_PRIVATE
}

/// mmap and mmap64 (`real`, the original).
fn mmap_common(flags: c_int, fd: c_int, real: impl FnOnce() -> *mut c_void) -> *mut c_void {
    if maps_shared(flags, fd) {
        if let Err(e) = before_write(fd) {
            crate::errno::set_errno(e);
            return libc::MAP_FAILED;
        }
    }
    real()
}

crate::hooks! {
    fn write(fd: c_int, buf: *const c_void, count: size_t) -> ssize_t {
        copied_or_fail!(fd);
        real::write(fd, buf, count)
    }
    fn pwrite(fd: c_int, buf: *const c_void, count: size_t, offset: off_t) -> ssize_t {
        copied_or_fail!(fd);
        real::pwrite(fd, buf, count, offset)
    }
    fn pwrite64(fd: c_int, buf: *const c_void, count: size_t, offset: off64_t) -> ssize_t {
        copied_or_fail!(fd);
        real::pwrite64(fd, buf, count, offset)
    }
    fn writev(fd: c_int, iov: *const libc::iovec, iovcnt: c_int) -> ssize_t {
        copied_or_fail!(fd);
        real::writev(fd, iov, iovcnt)
    }
    fn pwritev(fd: c_int, iov: *const libc::iovec, iovcnt: c_int, offset: off_t) -> ssize_t {
        copied_or_fail!(fd);
        real::pwritev(fd, iov, iovcnt, offset)
    }
    fn pwritev64(fd: c_int, iov: *const libc::iovec, iovcnt: c_int, offset: off64_t) -> ssize_t {
        copied_or_fail!(fd);
        real::pwritev64(fd, iov, iovcnt, offset)
    }
    fn pwritev2(fd: c_int, iov: *const libc::iovec, iovcnt: c_int, offset: off_t, flags: c_int) -> ssize_t {
        copied_or_fail!(fd);
        real::pwritev2(fd, iov, iovcnt, offset, flags)
    }
    fn pwritev64v2(fd: c_int, iov: *const libc::iovec, iovcnt: c_int, offset: off64_t, flags: c_int) -> ssize_t {
        copied_or_fail!(fd);
        real::pwritev64v2(fd, iov, iovcnt, offset, flags)
    }
    fn ftruncate(fd: c_int, length: off_t) -> c_int {
        copied_or_fail!(fd);
        real::ftruncate(fd, length)
    }
    fn ftruncate64(fd: c_int, length: off64_t) -> c_int {
        copied_or_fail!(fd);
        real::ftruncate64(fd, length)
    }
    fn fallocate(fd: c_int, mode: c_int, offset: off_t, len: off_t) -> c_int {
        copied_or_fail!(fd);
        real::fallocate(fd, mode, offset, len)
    }
    fn fallocate64(fd: c_int, mode: c_int, offset: off64_t, len: off64_t) -> c_int {
        copied_or_fail!(fd);
        real::fallocate64(fd, mode, offset, len)
    }
    // posix_fallocate returns its error number (errno is left alone).
    fn posix_fallocate(fd: c_int, offset: off_t, len: off_t) -> c_int {
        match before_write(fd) {
            Ok(()) => real::posix_fallocate(fd, offset, len),
            Err(e) => e,
        }
    }
    fn posix_fallocate64(fd: c_int, offset: off64_t, len: off64_t) -> c_int {
        match before_write(fd) {
            Ok(()) => real::posix_fallocate64(fd, offset, len),
            Err(e) => e,
        }
    }
    fn mmap(addr: *mut c_void, len: size_t, prot: c_int, flags: c_int, fd: c_int, offset: off_t) -> *mut c_void {
        mmap_common(flags, fd, || real::mmap(addr, len, prot, flags, fd, offset))
    }
    fn mmap64(addr: *mut c_void, len: size_t, prot: c_int, flags: c_int, fd: c_int, offset: off64_t) -> *mut c_void {
        mmap_common(flags, fd, || real::mmap64(addr, len, prot, flags, fd, offset))
    }
}

#[cfg(test)]
mod tests {
    use super::maps_shared;

    #[test]
    fn only_shared_file_mappings_write_through() {
        assert!(maps_shared(libc::MAP_SHARED, 3));
        assert!(maps_shared(libc::MAP_SHARED_VALIDATE, 3));
        assert!(!maps_shared(libc::MAP_PRIVATE, 3));
        assert!(!maps_shared(libc::MAP_SHARED | libc::MAP_ANONYMOUS, 3));
        assert!(!maps_shared(libc::MAP_SHARED, -1));
    }
}
