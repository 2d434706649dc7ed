//! access, readlink, realpath, xattrs, statfs/statvfs.

use super::{cbytes, fd_hook, path_hook, put};
use crate::errno::set_errno;
use crate::ops::{meta, stat, Outcome};
use crate::real;
use crate::user_mem;
use fanstore_core::path::MAX_PATH;
use libc::{c_char, c_int, c_void, size_t, ssize_t};

unsafe fn access_common(name: &'static str, dirfd: c_int, path: *const c_char, mode: c_int, flags: c_int, real: impl FnOnce(*const c_char) -> c_int) -> c_int {
    let follow = flags & libc::AT_SYMLINK_NOFOLLOW == 0;
    // SAFETY: path is the caller's C string.
    unsafe { path_hook(name, dirfd, path, -1, |vp| meta::access(vp, mode, follow), real) }
}

unsafe fn readlink_common(name: &'static str, dirfd: c_int, path: *const c_char, buf: *mut c_char, size: size_t, real: impl FnOnce(*const c_char) -> ssize_t) -> ssize_t {
    // The link's bytes in the caller's buffer: their count, or EFAULT.
    let copy = |src: &[u8]| -> Outcome<ssize_t> {
        let n = src.len().min(size);
        if !user_mem::writable(buf, n) {
            return Outcome::Errno(libc::EFAULT);
        }
        // SAFETY: buf is writable for n bytes (probed); n <= size.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), buf as *mut u8, n) };
        Outcome::Handled(n as ssize_t)
    };
    // readlink("/proc/self/fd/N") of a virtual fd names the virtual file.
    if crate::fd_table::any() && dirfd == libc::AT_FDCWD && user_mem::cstr(path) {
        // SAFETY: path is a readable C string (probed).
        if let Some(p) = unsafe { cbytes(path) } {
            if p.starts_with(b"/proc/self/fd/") {
                let mut out = [0u8; MAX_PATH];
                if let Some(len) = meta::proc_fd_link(p, &mut out) {
                    return match copy(&out[..len]) {
                        Outcome::Handled(n) => n,
                        _ => {
                            set_errno(libc::EFAULT);
                            -1
                        }
                    };
                }
            }
        }
    }
    // SAFETY: path is the caller's C string.
    unsafe {
        path_hook(
            name,
            dirfd,
            path,
            -1,
            |vp| match meta::readlink(vp) {
                Outcome::Handled(t) => copy(&t),
                other => other.map_none(),
            },
            real,
        )
    }
}

unsafe fn realpath_common(name: &'static str, path: *const c_char, resolved: *mut c_char, real: impl FnOnce(*const c_char) -> *mut c_char) -> *mut c_char {
    // SAFETY: path is the caller's C string.
    unsafe {
        path_hook(
            name,
            libc::AT_FDCWD,
            path,
            std::ptr::null_mut(),
            |vp| {
                let mut out = [0u8; MAX_PATH];
                let len = match meta::realpath(vp, &mut out) {
                    Outcome::Handled(l) => l,
                    other => return other.map_none(),
                };
                if len >= libc::PATH_MAX as usize {
                    return Outcome::Errno(libc::ENAMETOOLONG);
                }
                if !resolved.is_null() && !user_mem::writable(resolved, len + 1) {
                    return Outcome::Errno(libc::EFAULT);
                }
                let dst = if resolved.is_null() { libc::malloc(len + 1) as *mut c_char } else { resolved };
                if dst.is_null() {
                    return Outcome::Errno(libc::ENOMEM);
                }
                // SAFETY: dst has room for len + 1 bytes (the caller's buffer, probed, or ours).
                std::ptr::copy_nonoverlapping(out.as_ptr(), dst as *mut u8, len);
                *dst.add(len) = 0;
                Outcome::Handled(dst)
            },
            real,
        )
    }
}

/// statfs and statvfs of a path: `fill` turns the mount's state into the
/// caller's struct (`ops::stat::statfs_of` or `statvfs_of`).
unsafe fn statfs_common<T>(
    name: &'static str,
    path: *const c_char,
    buf: *mut T,
    fill: fn(&crate::state::State) -> T,
    real: impl FnOnce(*const c_char) -> c_int,
) -> c_int {
    // SAFETY: path is the caller's C string; buf the caller's out-pointer (probed by put).
    unsafe { path_hook(name, libc::AT_FDCWD, path, -1, |vp| put(meta::statfs_node(vp).map(fill), buf), real) }
}

/// fstatfs and fstatvfs of an fd: `fill` as for [`statfs_common`].
unsafe fn fstatfs_common<T>(
    name: &'static str,
    fd: c_int,
    buf: *mut T,
    fill: fn(&crate::state::State) -> T,
    real: impl FnOnce() -> c_int,
) -> c_int {
    fd_hook(
        name,
        fd,
        -1,
        // SAFETY: buf is the caller's out-pointer (probed by put).
        |t| meta::fd_state(t, |st| unsafe { put(Outcome::Handled(fill(st)), buf) }),
        real,
    )
}

crate::hooks! {
    fn access(path: *const c_char, mode: c_int) -> c_int {
        access_common("access", libc::AT_FDCWD, path, mode, 0, |p| real::access(p, mode))
    }
    fn faccessat(dirfd: c_int, path: *const c_char, mode: c_int, flags: c_int) -> c_int {
        access_common("faccessat", dirfd, path, mode, flags, |p| real::faccessat(dirfd, p, mode, flags))
    }
    fn euidaccess(path: *const c_char, mode: c_int) -> c_int {
        access_common("euidaccess", libc::AT_FDCWD, path, mode, 0, |p| real::euidaccess(p, mode))
    }
    fn eaccess(path: *const c_char, mode: c_int) -> c_int {
        access_common("eaccess", libc::AT_FDCWD, path, mode, 0, |p| real::eaccess(p, mode))
    }
    fn readlink(path: *const c_char, buf: *mut c_char, size: size_t) -> ssize_t {
        readlink_common("readlink", libc::AT_FDCWD, path, buf, size, |p| real::readlink(p, buf, size))
    }
    fn readlinkat(dirfd: c_int, path: *const c_char, buf: *mut c_char, size: size_t) -> ssize_t {
        readlink_common("readlinkat", dirfd, path, buf, size, |p| real::readlinkat(dirfd, p, buf, size))
    }
    fn realpath(path: *const c_char, resolved: *mut c_char) -> *mut c_char {
        realpath_common("realpath", path, resolved, |p| real::realpath(p, resolved))
    }
    fn canonicalize_file_name(path: *const c_char) -> *mut c_char {
        realpath_common("canonicalize_file_name", path, std::ptr::null_mut(), |p| real::canonicalize_file_name(p))
    }
    fn getxattr(path: *const c_char, name: *const c_char, value: *mut c_void, size: size_t) -> ssize_t {
        path_hook("getxattr", libc::AT_FDCWD, path, -1, |vp| meta::getxattr(vp, true), |p| real::getxattr(p, name, value, size))
    }
    fn lgetxattr(path: *const c_char, name: *const c_char, value: *mut c_void, size: size_t) -> ssize_t {
        path_hook("lgetxattr", libc::AT_FDCWD, path, -1, |vp| meta::getxattr(vp, false), |p| real::lgetxattr(p, name, value, size))
    }
    fn fgetxattr(fd: c_int, name: *const c_char, value: *mut c_void, size: size_t) -> ssize_t {
        fd_hook("fgetxattr", fd, -1, |t| meta::fd_state(t, |_| Outcome::Errno(libc::ENODATA)), || real::fgetxattr(fd, name, value, size))
    }
    fn listxattr(path: *const c_char, list: *mut c_char, size: size_t) -> ssize_t {
        path_hook("listxattr", libc::AT_FDCWD, path, -1, |vp| meta::listxattr(vp, true), |p| real::listxattr(p, list, size))
    }
    fn llistxattr(path: *const c_char, list: *mut c_char, size: size_t) -> ssize_t {
        path_hook("llistxattr", libc::AT_FDCWD, path, -1, |vp| meta::listxattr(vp, false), |p| real::llistxattr(p, list, size))
    }
    fn flistxattr(fd: c_int, list: *mut c_char, size: size_t) -> ssize_t {
        fd_hook("flistxattr", fd, -1, |t| meta::fd_state(t, |_| Outcome::Handled(0)), || real::flistxattr(fd, list, size))
    }
    fn statfs(path: *const c_char, buf: *mut libc::statfs) -> c_int {
        statfs_common("statfs", path, buf, stat::statfs_of, |p| real::statfs(p, buf))
    }
    fn statfs64(path: *const c_char, buf: *mut libc::statfs) -> c_int {
        statfs_common("statfs64", path, buf, stat::statfs_of, |p| real::statfs64(p, buf))
    }
    fn fstatfs(fd: c_int, buf: *mut libc::statfs) -> c_int {
        fstatfs_common("fstatfs", fd, buf, stat::statfs_of, || real::fstatfs(fd, buf))
    }
    fn fstatfs64(fd: c_int, buf: *mut libc::statfs) -> c_int {
        fstatfs_common("fstatfs64", fd, buf, stat::statfs_of, || real::fstatfs64(fd, buf))
    }
    fn statvfs(path: *const c_char, buf: *mut libc::statvfs) -> c_int {
        statfs_common("statvfs", path, buf, stat::statvfs_of, |p| real::statvfs(p, buf))
    }
    fn statvfs64(path: *const c_char, buf: *mut libc::statvfs) -> c_int {
        statfs_common("statvfs64", path, buf, stat::statvfs_of, |p| real::statvfs64(p, buf))
    }
    fn fstatvfs(fd: c_int, buf: *mut libc::statvfs) -> c_int {
        fstatfs_common("fstatvfs", fd, buf, stat::statvfs_of, || real::fstatvfs(fd, buf))
    }
    fn fstatvfs64(fd: c_int, buf: *mut libc::statvfs) -> c_int {
        fstatfs_common("fstatvfs64", fd, buf, stat::statvfs_of, || real::fstatvfs64(fd, buf))
    }
}
