//! truncate, chmod, chown and the utime family. Under the mount an input
//! fails like a read-only file system (EROFS, after the lookup errors Linux
//! reports first); an output's record or open file changes
//! ([`crate::ops::write`]). Bad `times` go to libc untouched (the
//! kernel's EFAULT for utimensat; glibc converts the others itself).

use super::{fd_hook, path_hook};
use crate::ops::attr::Attr;
use crate::ops::write;
use crate::real;
use crate::user_mem::readable_or_null;
use libc::{c_char, c_int, gid_t, mode_t, off_t, uid_t};

crate::hooks! {
    fn truncate(path: *const c_char, len: off_t) -> c_int {
        path_hook("truncate", libc::AT_FDCWD, path, -1, |vp| write::truncate(vp, len as i64), |p| real::truncate(p, len))
    }
    fn truncate64(path: *const c_char, len: off_t) -> c_int {
        path_hook("truncate64", libc::AT_FDCWD, path, -1, |vp| write::truncate(vp, len as i64), |p| real::truncate64(p, len))
    }
    fn chmod(path: *const c_char, mode: mode_t) -> c_int {
        path_hook("chmod", libc::AT_FDCWD, path, -1, |vp| write::setattr(vp, true, Attr::Mode(mode)), |p| real::chmod(p, mode))
    }
    fn fchmod(fd: c_int, mode: mode_t) -> c_int {
        fd_hook("fchmod", fd, -1, |t| write::fchmod(fd, t, mode), || real::fchmod(fd, mode))
    }
    fn fchmodat(dirfd: c_int, path: *const c_char, mode: mode_t, flags: c_int) -> c_int {
        let follow = flags & libc::AT_SYMLINK_NOFOLLOW == 0;
        path_hook("fchmodat", dirfd, path, -1, |vp| write::setattr(vp, follow, Attr::Mode(mode)), |p| real::fchmodat(dirfd, p, mode, flags))
    }
    fn chown(path: *const c_char, uid: uid_t, gid: gid_t) -> c_int {
        path_hook("chown", libc::AT_FDCWD, path, -1, |vp| write::setattr(vp, true, Attr::Owner { uid, gid }), |p| real::chown(p, uid, gid))
    }
    fn lchown(path: *const c_char, uid: uid_t, gid: gid_t) -> c_int {
        path_hook("lchown", libc::AT_FDCWD, path, -1, |vp| write::setattr(vp, false, Attr::Owner { uid, gid }), |p| real::lchown(p, uid, gid))
    }
    fn fchown(fd: c_int, uid: uid_t, gid: gid_t) -> c_int {
        fd_hook("fchown", fd, -1, |t| write::fchown(fd, t, uid, gid), || real::fchown(fd, uid, gid))
    }
    fn fchownat(dirfd: c_int, path: *const c_char, uid: uid_t, gid: gid_t, flags: c_int) -> c_int {
        let follow = flags & libc::AT_SYMLINK_NOFOLLOW == 0;
        path_hook("fchownat", dirfd, path, -1, |vp| write::setattr(vp, follow, Attr::Owner { uid, gid }), |p| real::fchownat(dirfd, p, uid, gid, flags))
    }
    fn utime(path: *const c_char, times: *const libc::utimbuf) -> c_int {
        if !readable_or_null(times) {
            return real::utime(path, times);
        }
        path_hook("utime", libc::AT_FDCWD, path, -1,
            // (inside the hook's unsafe body) times is null or points at the caller's utimbuf.
            |vp| write::setattr(vp, true, write::utimbuf_times(times.as_ref())),
            |p| real::utime(p, times))
    }
    fn utimes(path: *const c_char, times: *const libc::timeval) -> c_int {
        if !readable_or_null(times.cast::<[libc::timeval; 2]>()) {
            return real::utimes(path, times);
        }
        path_hook("utimes", libc::AT_FDCWD, path, -1,
            // (inside the hook's unsafe body) times is null or points at the caller's two timevals.
            |vp| write::setattr(vp, true, write::timeval_times(times.cast::<[libc::timeval; 2]>().as_ref())),
            |p| real::utimes(p, times))
    }
    fn lutimes(path: *const c_char, times: *const libc::timeval) -> c_int {
        if !readable_or_null(times.cast::<[libc::timeval; 2]>()) {
            return real::lutimes(path, times);
        }
        path_hook("lutimes", libc::AT_FDCWD, path, -1,
            // (inside the hook's unsafe body) times is null or points at the caller's two timevals.
            |vp| write::setattr(vp, false, write::timeval_times(times.cast::<[libc::timeval; 2]>().as_ref())),
            |p| real::lutimes(p, times))
    }
    fn futimesat(dirfd: c_int, path: *const c_char, times: *const libc::timeval) -> c_int {
        if !readable_or_null(times.cast::<[libc::timeval; 2]>()) {
            return real::futimesat(dirfd, path, times);
        }
        path_hook("futimesat", dirfd, path, -1,
            // (inside the hook's unsafe body) times is null or points at the caller's two timevals.
            |vp| write::setattr(vp, true, write::timeval_times(times.cast::<[libc::timeval; 2]>().as_ref())),
            |p| real::futimesat(dirfd, p, times))
    }
    fn utimensat(dirfd: c_int, path: *const c_char, times: *const libc::timespec, flags: c_int) -> c_int {
        if !readable_or_null(times.cast::<[libc::timespec; 2]>()) {
            return real::utimensat(dirfd, path, times, flags);
        }
        if path.is_null() {
            return fd_hook("utimensat", dirfd, -1, |t| write::fd_attr(dirfd, t), || real::utimensat(dirfd, path, times, flags));
        }
        let follow = flags & libc::AT_SYMLINK_NOFOLLOW == 0;
        path_hook("utimensat", dirfd, path, -1,
            // (inside the hook's unsafe body) times is null or points at the caller's two timespecs.
            |vp| write::setattr(vp, follow, write::timespec_times(times.cast::<[libc::timespec; 2]>().as_ref())),
            |p| real::utimensat(dirfd, p, times, flags))
    }
    fn futimens(fd: c_int, times: *const libc::timespec) -> c_int {
        fd_hook("futimens", fd, -1, |t| write::fd_attr(fd, t), || real::futimens(fd, times))
    }
}
