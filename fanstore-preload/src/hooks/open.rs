//! open, openat, the fortified __open_2 variants and creat.
//! The mode argument is variadic in C; on the Linux ABIs we support a
//! variadic int is passed like a named one, so it is declared as a plain
//! argument and forwarded as is.

use super::path_hook;
use crate::ops;
use crate::real;
use libc::{c_char, c_int, mode_t};

#[inline]
unsafe fn open_common(
    name: &'static str,
    dirfd: c_int,
    path: *const c_char,
    flags: c_int,
    mode: mode_t,
    real: impl FnOnce(*const c_char) -> c_int,
) -> c_int {
    // SAFETY: path is the caller's C string (hook contract).
    unsafe { path_hook(name, dirfd, path, -1, |vp| ops::open::open(vp, flags, mode), real) }
}

crate::hooks! {
    fn open(path: *const c_char, flags: c_int, mode: mode_t) -> c_int {
        open_common("open", libc::AT_FDCWD, path, flags, mode, |p| real::open(p, flags, mode))
    }
    fn open64(path: *const c_char, flags: c_int, mode: mode_t) -> c_int {
        open_common("open64", libc::AT_FDCWD, path, flags, mode, |p| real::open64(p, flags, mode))
    }
    fn openat(dirfd: c_int, path: *const c_char, flags: c_int, mode: mode_t) -> c_int {
        open_common("openat", dirfd, path, flags, mode, |p| real::openat(dirfd, p, flags, mode))
    }
    fn openat64(dirfd: c_int, path: *const c_char, flags: c_int, mode: mode_t) -> c_int {
        open_common("openat64", dirfd, path, flags, mode, |p| real::openat64(dirfd, p, flags, mode))
    }
    fn __open_2(path: *const c_char, flags: c_int) -> c_int {
        open_common("__open_2", libc::AT_FDCWD, path, flags, 0o666, |p| real::__open_2(p, flags))
    }
    fn __open64_2(path: *const c_char, flags: c_int) -> c_int {
        open_common("__open64_2", libc::AT_FDCWD, path, flags, 0o666, |p| real::__open64_2(p, flags))
    }
    fn __openat_2(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int {
        open_common("__openat_2", dirfd, path, flags, 0o666, |p| real::__openat_2(dirfd, p, flags))
    }
    fn __openat64_2(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int {
        open_common("__openat64_2", dirfd, path, flags, 0o666, |p| real::__openat64_2(dirfd, p, flags))
    }
    fn creat(path: *const c_char, mode: mode_t) -> c_int {
        let flags = libc::O_CREAT | libc::O_WRONLY | libc::O_TRUNC;
        open_common("creat", libc::AT_FDCWD, path, flags, mode, |p| real::creat(p, mode))
    }
    fn creat64(path: *const c_char, mode: mode_t) -> c_int {
        let flags = libc::O_CREAT | libc::O_WRONLY | libc::O_TRUNC;
        open_common("creat64", libc::AT_FDCWD, path, flags, mode, |p| real::creat64(p, mode))
    }
}
