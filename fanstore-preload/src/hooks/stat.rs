//! stat, lstat, fstat, fstatat, statx and the __xstat family (still imported
//! by manylinux wheels: h5py, pillow, safetensors). On LP64 Linux `struct
//! stat` and `struct stat64` are the same layout, and `ver` is ignored.
//! The answers are [`crate::ops::stat`]'s.

use super::{empty_path_hook, fd_hook, path_hook, put};
use crate::ops::attr::statx_from;
use crate::ops::stat;
use crate::real;
use crate::user_mem;
use libc::{c_char, c_int, c_uint};

const _: () = assert!(std::mem::size_of::<libc::stat>() == std::mem::size_of::<libc::stat64>());

/// Is this an `AT_EMPTY_PATH` call on `dirfd` itself? (A bad `path` is
/// not: the path hook gives it to libc.)
///
/// # Safety
/// `path` is null, a NUL-terminated string, or a bad pointer (probed).
unsafe fn empty_path(path: *const c_char, flags: c_int) -> bool {
    // SAFETY: a readable C string (probed) has at least its NUL.
    flags & libc::AT_EMPTY_PATH != 0 && user_mem::cstr(path) && unsafe { *path } == 0
}

unsafe fn stat_common(
    name: &'static str,
    dirfd: c_int,
    path: *const c_char,
    buf: *mut libc::stat,
    flags: c_int,
    real: impl FnOnce(*const c_char) -> c_int,
) -> c_int {
    // SAFETY (whole block): path is the caller's C string, buf its
    // out-pointer for a struct stat (either possibly bad: probed).
    unsafe {
        if empty_path(path, flags) {
            return empty_path_hook(name, dirfd, -1, || put(stat::empty_path_stat(dirfd), buf), || real(path));
        }
        let follow = flags & libc::AT_SYMLINK_NOFOLLOW == 0;
        path_hook(name, dirfd, path, -1, |vp| put(stat::stat_any(vp, follow), buf), real)
    }
}

fn fstat_common(name: &'static str, fd: c_int, buf: *mut libc::stat, real: impl FnOnce() -> c_int) -> c_int {
    // SAFETY: buf is the caller's out-pointer for a struct stat (probed).
    fd_hook(name, fd, -1, |t| unsafe { put(stat::fstat(fd, t), buf) }, real)
}

unsafe fn statx_common(
    dirfd: c_int,
    path: *const c_char,
    flags: c_int,
    buf: *mut libc::statx,
    real: impl Fn(*const c_char) -> c_int,
) -> c_int {
    // SAFETY (whole block): path is the caller's C string, buf its
    // out-pointer for a struct statx (either possibly bad: probed).
    unsafe {
        if empty_path(path, flags) {
            return empty_path_hook("statx", dirfd, -1, || put(stat::empty_path_stat(dirfd).map(|s| statx_from(&s)), buf), || real(path));
        }
        let follow = flags & libc::AT_SYMLINK_NOFOLLOW == 0;
        path_hook("statx", dirfd, path, -1, |vp| put(stat::stat_any(vp, follow).map(|s| statx_from(&s)), buf), real)
    }
}

crate::hooks! {
    fn stat(path: *const c_char, buf: *mut libc::stat) -> c_int {
        stat_common("stat", libc::AT_FDCWD, path, buf, 0, |p| real::stat(p, buf))
    }
    fn stat64(path: *const c_char, buf: *mut libc::stat) -> c_int {
        stat_common("stat64", libc::AT_FDCWD, path, buf, 0, |p| real::stat64(p, buf))
    }
    fn lstat(path: *const c_char, buf: *mut libc::stat) -> c_int {
        stat_common("lstat", libc::AT_FDCWD, path, buf, libc::AT_SYMLINK_NOFOLLOW, |p| real::lstat(p, buf))
    }
    fn lstat64(path: *const c_char, buf: *mut libc::stat) -> c_int {
        stat_common("lstat64", libc::AT_FDCWD, path, buf, libc::AT_SYMLINK_NOFOLLOW, |p| real::lstat64(p, buf))
    }
    fn fstatat(dirfd: c_int, path: *const c_char, buf: *mut libc::stat, flags: c_int) -> c_int {
        stat_common("fstatat", dirfd, path, buf, flags, |p| real::fstatat(dirfd, p, buf, flags))
    }
    fn fstatat64(dirfd: c_int, path: *const c_char, buf: *mut libc::stat, flags: c_int) -> c_int {
        stat_common("fstatat64", dirfd, path, buf, flags, |p| real::fstatat64(dirfd, p, buf, flags))
    }
    fn fstat(fd: c_int, buf: *mut libc::stat) -> c_int {
        fstat_common("fstat", fd, buf, || real::fstat(fd, buf))
    }
    fn fstat64(fd: c_int, buf: *mut libc::stat) -> c_int {
        fstat_common("fstat64", fd, buf, || real::fstat64(fd, buf))
    }
    fn statx(dirfd: c_int, path: *const c_char, flags: c_int, mask: c_uint, buf: *mut libc::statx) -> c_int {
        statx_common(dirfd, path, flags, buf, |p| real::statx(dirfd, p, flags, mask, buf))
    }
    fn __xstat(ver: c_int, path: *const c_char, buf: *mut libc::stat) -> c_int {
        stat_common("__xstat", libc::AT_FDCWD, path, buf, 0, |p| real::__xstat(ver, p, buf))
    }
    fn __xstat64(ver: c_int, path: *const c_char, buf: *mut libc::stat) -> c_int {
        stat_common("__xstat64", libc::AT_FDCWD, path, buf, 0, |p| real::__xstat64(ver, p, buf))
    }
    fn __lxstat(ver: c_int, path: *const c_char, buf: *mut libc::stat) -> c_int {
        stat_common("__lxstat", libc::AT_FDCWD, path, buf, libc::AT_SYMLINK_NOFOLLOW, |p| real::__lxstat(ver, p, buf))
    }
    fn __lxstat64(ver: c_int, path: *const c_char, buf: *mut libc::stat) -> c_int {
        stat_common("__lxstat64", libc::AT_FDCWD, path, buf, libc::AT_SYMLINK_NOFOLLOW, |p| real::__lxstat64(ver, p, buf))
    }
    fn __fxstat(ver: c_int, fd: c_int, buf: *mut libc::stat) -> c_int {
        fstat_common("__fxstat", fd, buf, || real::__fxstat(ver, fd, buf))
    }
    fn __fxstat64(ver: c_int, fd: c_int, buf: *mut libc::stat) -> c_int {
        fstat_common("__fxstat64", fd, buf, || real::__fxstat64(ver, fd, buf))
    }
    fn __fxstatat(ver: c_int, dirfd: c_int, path: *const c_char, buf: *mut libc::stat, flags: c_int) -> c_int {
        stat_common("__fxstatat", dirfd, path, buf, flags, |p| real::__fxstatat(ver, dirfd, p, buf, flags))
    }
    fn __fxstatat64(ver: c_int, dirfd: c_int, path: *const c_char, buf: *mut libc::stat, flags: c_int) -> c_int {
        stat_common("__fxstatat64", dirfd, path, buf, flags, |p| real::__fxstatat64(ver, dirfd, p, buf, flags))
    }
}

/// `newfstatat` is the syscall's name, not a glibc symbol; a program that
/// declares it itself gets fstatat semantics.
#[no_mangle]
pub unsafe extern "C" fn newfstatat(dirfd: c_int, path: *const c_char, buf: *mut libc::stat, flags: c_int) -> c_int {
    // SAFETY: same contract as fstatat.
    unsafe { fstatat(dirfd, path, buf, flags) }
}
