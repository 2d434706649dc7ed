//! mkdir, mknod, mkfifo, symlink and their *at forms: names made other
//! than by opening a file. Under the mount a directory or a symlink is an
//! output, and so is a FIFO, a socket inode or an empty file made by mknod
//! ([`crate::ops::special`]; a device file made by root is a record only).

use super::{cbytes, path_hook};
use crate::ops::write;
use crate::real;
use crate::user_mem;
use libc::{c_char, c_int, dev_t, mode_t};

crate::hooks! {
    fn mkdir(path: *const c_char, mode: mode_t) -> c_int {
        path_hook("mkdir", libc::AT_FDCWD, path, -1, |vp| write::mkdir(vp, mode as u32), |p| real::mkdir(p, mode))
    }
    fn mkdirat(dirfd: c_int, path: *const c_char, mode: mode_t) -> c_int {
        path_hook("mkdirat", dirfd, path, -1, |vp| write::mkdir(vp, mode as u32), |p| real::mkdirat(dirfd, p, mode))
    }
    fn mknod(path: *const c_char, mode: mode_t, dev: dev_t) -> c_int {
        path_hook("mknod", libc::AT_FDCWD, path, -1, |vp| write::mknod(vp, mode as u32, dev), |p| real::mknod(p, mode, dev))
    }
    fn mknodat(dirfd: c_int, path: *const c_char, mode: mode_t, dev: dev_t) -> c_int {
        path_hook("mknodat", dirfd, path, -1, |vp| write::mknod(vp, mode as u32, dev), |p| real::mknodat(dirfd, p, mode, dev))
    }
    fn mkfifo(path: *const c_char, mode: mode_t) -> c_int {
        path_hook("mkfifo", libc::AT_FDCWD, path, -1, |vp| write::mknod(vp, libc::S_IFIFO | (mode as u32 & 0o7777), 0), |p| real::mkfifo(p, mode))
    }
    fn mkfifoat(dirfd: c_int, path: *const c_char, mode: mode_t) -> c_int {
        path_hook("mkfifoat", dirfd, path, -1, |vp| write::mknod(vp, libc::S_IFIFO | (mode as u32 & 0o7777), 0), |p| real::mkfifoat(dirfd, p, mode))
    }
    fn symlink(target: *const c_char, linkpath: *const c_char) -> c_int {
        // A bad target: the kernel's EFAULT (it reads the target first).
        if !user_mem::cstr(target) {
            return real::symlink(target, linkpath);
        }
        path_hook("symlink", libc::AT_FDCWD, linkpath, -1, |vp| write::symlink(vp, cbytes(target)), |p| real::symlink(target, p))
    }
    fn symlinkat(target: *const c_char, dirfd: c_int, linkpath: *const c_char) -> c_int {
        if !user_mem::cstr(target) {
            return real::symlinkat(target, dirfd, linkpath);
        }
        path_hook("symlinkat", dirfd, linkpath, -1, |vp| write::symlink(vp, cbytes(target)), |p| real::symlinkat(target, dirfd, p))
    }
}
