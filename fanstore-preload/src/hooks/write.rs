//! Writes and namespace changes under the mount fail like a read-only file
//! system (EROFS, after the lookup errors Linux reports first). Outputs
//! under the mount arrive with the write-path issue.

use super::{cbytes, fd_hook, path_hook};
use crate::errno::set_errno;
use crate::guard::{catch, Guard};
use crate::ops::write::{self, Attr};
use crate::ops::{Outcome, VPath};
use crate::paths::{classify, maybe_ours, Class, Scratch};
use libc::{c_char, c_int, c_uint, c_void, dev_t, gid_t, mode_t, off_t, size_t, uid_t};

/// Calls naming two paths (rename, link): `virt` gets whichever are under the mount.
unsafe fn two_paths(
    name: &'static str,
    d1: c_int,
    p1: *const c_char,
    d2: c_int,
    p2: *const c_char,
    virt: impl FnOnce(Option<&VPath>, Option<&VPath>) -> Outcome<c_int>,
    real: impl FnOnce(*const c_char, *const c_char) -> c_int,
) -> c_int {
    let Some(g) = Guard::enter() else { return real(p1, p2) };
    // SAFETY: p1/p2 are the caller's C strings (or null).
    let (m1, m2) = unsafe { (maybe_ours(d1, p1), maybe_ours(d2, p2)) };
    if !m1 && !m2 {
        drop(g);
        return real(p1, p2);
    }
    let (mut s1, mut s2) = (Scratch::new(), Scratch::new());
    // SAFETY: as above.
    let (b1, b2) = unsafe { (cbytes(p1).unwrap_or(b""), cbytes(p2).unwrap_or(b"")) };
    let step = catch(
        || {
            let c1 = if m1 { classify(d1, b1, &mut s1) } else { Class::Real };
            let c2 = if m2 { classify(d2, b2, &mut s2) } else { Class::Real };
            if let Class::Err(e) = c1 {
                return Err(e);
            }
            if let Class::Err(e) = c2 {
                return Err(e);
            }
            let r1 = matches!(c1, Class::Redirect);
            let r2 = matches!(c2, Class::Redirect);
            let v1 = if let Class::Virtual(v) = &c1 { Some(v) } else { None };
            let v2 = if let Class::Virtual(v) = &c2 { Some(v) } else { None };
            if v1.is_none() && v2.is_none() {
                return Ok(Some((r1, r2)));
            }
            match virt(v1, v2) {
                Outcome::Errno(e) => Err(e),
                Outcome::Handled(_) => Ok(None),
                Outcome::Passthrough => Err(libc::EROFS),
            }
        },
        Err(libc::EIO),
    );
    drop(g);
    match step {
        Ok(Some((r1, r2))) => real(if r1 { s1.ptr() } else { p1 }, if r2 { s2.ptr() } else { p2 }),
        Ok(None) => 0,
        Err(e) => {
            crate::dlog!("{name}({}, {}) = {}", crate::debug::B(b1), crate::debug::B(b2), crate::debug::E(e));
            set_errno(e);
            -1
        }
    }
}

fn rename_like(a: Option<&VPath>, b: Option<&VPath>) -> Outcome<c_int> {
    rename_flags(a, b, 0)
}

/// renameat2: RENAME_NOREPLACE is honoured (EEXIST, atomically at the
/// destination's owner for a file); RENAME_EXCHANGE and RENAME_WHITEOUT on
/// /fanstore are EINVAL (documented).
fn rename_flags(a: Option<&VPath>, b: Option<&VPath>, flags: c_uint) -> Outcome<c_int> {
    match (a, b) {
        (Some(_), Some(_)) | (Some(_), None) | (None, Some(_)) if flags & !libc::RENAME_NOREPLACE != 0 => Outcome::Errno(libc::EINVAL),
        (Some(a), Some(b)) => write::rename(a, b, flags & libc::RENAME_NOREPLACE != 0),
        (a, b) => link_like(a, b),
    }
}

fn link_like(a: Option<&VPath>, b: Option<&VPath>) -> Outcome<c_int> {
    match (a, b) {
        (Some(a), Some(b)) => write::link(a, b),
        (Some(a), b) => write::source(a, b.is_some()),
        (None, Some(_)) => Outcome::Errno(libc::EXDEV),
        (None, None) => Outcome::Passthrough,
    }
}

/// The current time, ns since the epoch.
fn now_ns() -> i64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: ts is a valid out-pointer; CLOCK_REALTIME always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    ts.tv_sec as i64 * 1_000_000_000 + ts.tv_nsec as i64
}

/// Both times now (utime with a null argument).
fn now() -> Attr {
    let t = now_ns();
    Attr::Times { atime: Some(t), mtime: Some(t) }
}

/// utimes' argument (null: now; else [atime, mtime]).
///
/// # Safety
/// `times` is null or points at two readable timevals.
unsafe fn timeval_attr(times: *const libc::timeval) -> Attr {
    if times.is_null() {
        return now();
    }
    // SAFETY: the caller passes two timevals: [0] access, [1] modification.
    let (a, m) = unsafe { (*times, *times.add(1)) };
    let ns = |t: libc::timeval| t.tv_sec as i64 * 1_000_000_000 + t.tv_usec as i64 * 1000;
    Attr::Times { atime: Some(ns(a)), mtime: Some(ns(m)) }
}

/// utimensat's argument (null or UTIME_NOW: now; UTIME_OMIT: unchanged).
///
/// # Safety
/// `times` is null or points at two readable timespecs.
unsafe fn timespec_attr(times: *const libc::timespec) -> Attr {
    if times.is_null() {
        return now();
    }
    // SAFETY: the caller passes two timespecs: [0] access, [1] modification.
    let (a, m) = unsafe { (*times, *times.add(1)) };
    let one = |t: libc::timespec| match t.tv_nsec {
        libc::UTIME_NOW => Some(now_ns()),
        libc::UTIME_OMIT => None,
        ns => Some(t.tv_sec as i64 * 1_000_000_000 + ns as i64),
    };
    match (one(a), one(m)) {
        (None, None) => Attr::Nothing,
        (atime, mtime) => Attr::Times { atime, mtime },
    }
}

/// fchmod, fchown, futimens, fsetxattr of a tracked fd: an input (or a
/// directory) is read-only; an output's fd is a real file of ours, changed
/// natively (one being written: its commit takes the mode and times; a
/// committed one opened: its record stays as it is, as before such fds
/// were tracked).
fn ro_fd(t: crate::fd_table::Tracked) -> Outcome<c_int> {
    if crate::ops::out::is_output(t) {
        return Outcome::Passthrough;
    }
    Outcome::Errno(libc::EROFS)
}

crate::hooks! {
    fn truncate(path: *const c_char, len: off_t) -> c_int {
        path_hook("truncate", libc::AT_FDCWD, path, -1, |vp| write::truncate(vp, len as i64), |p| orig::truncate(p, len))
    }
    fn truncate64(path: *const c_char, len: off_t) -> c_int {
        path_hook("truncate64", libc::AT_FDCWD, path, -1, |vp| write::truncate(vp, len as i64), |p| orig::truncate64(p, len))
    }
    fn chmod(path: *const c_char, mode: mode_t) -> c_int {
        path_hook("chmod", libc::AT_FDCWD, path, -1, |vp| write::setattr(vp, true, Attr::Mode(mode)), |p| orig::chmod(p, mode))
    }
    fn fchmod(fd: c_int, mode: mode_t) -> c_int {
        fd_hook("fchmod", fd, -1, |t| match t {
            // The file's own mode changes too (fstat shows it); the commit registers it.
            crate::fd_table::Tracked::Output(idx) => {
                crate::outputs::set_mode(idx, mode);
                Outcome::Passthrough
            }
            other => ro_fd(other),
        }, || orig::fchmod(fd, mode))
    }
    fn fchmodat(dirfd: c_int, path: *const c_char, mode: mode_t, flags: c_int) -> c_int {
        let follow = flags & libc::AT_SYMLINK_NOFOLLOW == 0;
        path_hook("fchmodat", dirfd, path, -1, |vp| write::setattr(vp, follow, Attr::Mode(mode)), |p| orig::fchmodat(dirfd, p, mode, flags))
    }
    fn chown(path: *const c_char, uid: uid_t, gid: gid_t) -> c_int {
        path_hook("chown", libc::AT_FDCWD, path, -1, |vp| write::setattr(vp, true, Attr::Owner { uid, gid }), |p| orig::chown(p, uid, gid))
    }
    fn lchown(path: *const c_char, uid: uid_t, gid: gid_t) -> c_int {
        path_hook("lchown", libc::AT_FDCWD, path, -1, |vp| write::setattr(vp, false, Attr::Owner { uid, gid }), |p| orig::lchown(p, uid, gid))
    }
    fn fchown(fd: c_int, uid: uid_t, gid: gid_t) -> c_int {
        fd_hook("fchown", fd, -1, ro_fd, || orig::fchown(fd, uid, gid))
    }
    fn fchownat(dirfd: c_int, path: *const c_char, uid: uid_t, gid: gid_t, flags: c_int) -> c_int {
        let follow = flags & libc::AT_SYMLINK_NOFOLLOW == 0;
        path_hook("fchownat", dirfd, path, -1, |vp| write::setattr(vp, follow, Attr::Owner { uid, gid }), |p| orig::fchownat(dirfd, p, uid, gid, flags))
    }
    fn unlink(path: *const c_char) -> c_int {
        path_hook("unlink", libc::AT_FDCWD, path, -1, write::unlink, |p| orig::unlink(p))
    }
    fn unlinkat(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int {
        path_hook("unlinkat", dirfd, path, -1,
            |vp| if flags & libc::AT_REMOVEDIR != 0 { write::rmdir(vp) } else { write::unlink(vp) },
            |p| orig::unlinkat(dirfd, p, flags))
    }
    fn rmdir(path: *const c_char) -> c_int {
        path_hook("rmdir", libc::AT_FDCWD, path, -1, write::rmdir, |p| orig::rmdir(p))
    }
    fn remove(path: *const c_char) -> c_int {
        path_hook("remove", libc::AT_FDCWD, path, -1, write::remove, |p| orig::remove(p))
    }
    fn mkdir(path: *const c_char, mode: mode_t) -> c_int {
        path_hook("mkdir", libc::AT_FDCWD, path, -1, |vp| write::mkdir(vp, mode as u32), |p| orig::mkdir(p, mode))
    }
    fn mkdirat(dirfd: c_int, path: *const c_char, mode: mode_t) -> c_int {
        path_hook("mkdirat", dirfd, path, -1, |vp| write::mkdir(vp, mode as u32), |p| orig::mkdirat(dirfd, p, mode))
    }
    fn mknod(path: *const c_char, mode: mode_t, dev: dev_t) -> c_int {
        path_hook("mknod", libc::AT_FDCWD, path, -1, write::create, |p| orig::mknod(p, mode, dev))
    }
    fn mknodat(dirfd: c_int, path: *const c_char, mode: mode_t, dev: dev_t) -> c_int {
        path_hook("mknodat", dirfd, path, -1, write::create, |p| orig::mknodat(dirfd, p, mode, dev))
    }
    fn mkfifo(path: *const c_char, mode: mode_t) -> c_int {
        path_hook("mkfifo", libc::AT_FDCWD, path, -1, write::create, |p| orig::mkfifo(p, mode))
    }
    fn mkfifoat(dirfd: c_int, path: *const c_char, mode: mode_t) -> c_int {
        path_hook("mkfifoat", dirfd, path, -1, write::create, |p| orig::mkfifoat(dirfd, p, mode))
    }
    fn symlink(target: *const c_char, linkpath: *const c_char) -> c_int {
        path_hook("symlink", libc::AT_FDCWD, linkpath, -1, |vp| write::symlink(vp, cbytes(target)), |p| orig::symlink(target, p))
    }
    fn symlinkat(target: *const c_char, dirfd: c_int, linkpath: *const c_char) -> c_int {
        path_hook("symlinkat", dirfd, linkpath, -1, |vp| write::symlink(vp, cbytes(target)), |p| orig::symlinkat(target, dirfd, p))
    }
    fn rename(old: *const c_char, new: *const c_char) -> c_int {
        two_paths("rename", libc::AT_FDCWD, old, libc::AT_FDCWD, new, rename_like, |a, b| orig::rename(a, b))
    }
    fn renameat(d1: c_int, old: *const c_char, d2: c_int, new: *const c_char) -> c_int {
        two_paths("renameat", d1, old, d2, new, rename_like, |a, b| orig::renameat(d1, a, d2, b))
    }
    fn renameat2(d1: c_int, old: *const c_char, d2: c_int, new: *const c_char, flags: c_uint) -> c_int {
        two_paths("renameat2", d1, old, d2, new, |a, b| rename_flags(a, b, flags), |a, b| orig::renameat2(d1, a, d2, b, flags))
    }
    fn link(old: *const c_char, new: *const c_char) -> c_int {
        two_paths("link", libc::AT_FDCWD, old, libc::AT_FDCWD, new, link_like, |a, b| orig::link(a, b))
    }
    fn linkat(d1: c_int, old: *const c_char, d2: c_int, new: *const c_char, flags: c_int) -> c_int {
        two_paths("linkat", d1, old, d2, new, link_like, |a, b| orig::linkat(d1, a, d2, b, flags))
    }
    fn utime(path: *const c_char, times: *const libc::utimbuf) -> c_int {
        // SAFETY: times is null or points at the caller's utimbuf.
        let attr = unsafe { times.as_ref() }
            .map_or_else(now, |t| Attr::Times { atime: Some(t.actime as i64 * 1_000_000_000), mtime: Some(t.modtime as i64 * 1_000_000_000) });
        path_hook("utime", libc::AT_FDCWD, path, -1, |vp| write::setattr(vp, true, attr), |p| orig::utime(p, times))
    }
    fn utimes(path: *const c_char, times: *const libc::timeval) -> c_int {
        // SAFETY: times is null or points at the caller's two timevals.
        let attr = unsafe { timeval_attr(times) };
        path_hook("utimes", libc::AT_FDCWD, path, -1, |vp| write::setattr(vp, true, attr), |p| orig::utimes(p, times))
    }
    fn lutimes(path: *const c_char, times: *const libc::timeval) -> c_int {
        // SAFETY: times is null or points at the caller's two timevals.
        let attr = unsafe { timeval_attr(times) };
        path_hook("lutimes", libc::AT_FDCWD, path, -1, |vp| write::setattr(vp, false, attr), |p| orig::lutimes(p, times))
    }
    fn futimesat(dirfd: c_int, path: *const c_char, times: *const libc::timeval) -> c_int {
        // SAFETY: times is null or points at the caller's two timevals.
        let attr = unsafe { timeval_attr(times) };
        path_hook("futimesat", dirfd, path, -1, |vp| write::setattr(vp, true, attr), |p| orig::futimesat(dirfd, p, times))
    }
    fn utimensat(dirfd: c_int, path: *const c_char, times: *const libc::timespec, flags: c_int) -> c_int {
        if path.is_null() {
            return fd_hook("utimensat", dirfd, -1, ro_fd, || orig::utimensat(dirfd, path, times, flags));
        }
        let follow = flags & libc::AT_SYMLINK_NOFOLLOW == 0;
        // SAFETY: times is null or points at the caller's two timespecs.
        let attr = unsafe { timespec_attr(times) };
        path_hook("utimensat", dirfd, path, -1, |vp| write::setattr(vp, follow, attr), |p| orig::utimensat(dirfd, p, times, flags))
    }
    fn futimens(fd: c_int, times: *const libc::timespec) -> c_int {
        fd_hook("futimens", fd, -1, ro_fd, || orig::futimens(fd, times))
    }
    fn setxattr(path: *const c_char, name: *const c_char, value: *const c_void, size: size_t, flags: c_int) -> c_int {
        path_hook("setxattr", libc::AT_FDCWD, path, -1, |vp| write::modify(vp, true), |p| orig::setxattr(p, name, value, size, flags))
    }
    fn lsetxattr(path: *const c_char, name: *const c_char, value: *const c_void, size: size_t, flags: c_int) -> c_int {
        path_hook("lsetxattr", libc::AT_FDCWD, path, -1, |vp| write::modify(vp, false), |p| orig::lsetxattr(p, name, value, size, flags))
    }
    fn fsetxattr(fd: c_int, name: *const c_char, value: *const c_void, size: size_t, flags: c_int) -> c_int {
        let r = fd_hook("fsetxattr", fd, -1, ro_fd, || orig::fsetxattr(fd, name, value, size, flags));
        // An access ACL sets the file's mode bits too (sed -i and cp -p copy
        // the original's permissions that way): its commit takes them.
        // SAFETY: name is the caller's C string.
        if r == 0 && unsafe { super::cbytes(name) } == Some(b"system.posix_acl_access") {
            crate::ops::out::mode_from_file(fd);
        }
        r
    }
    fn removexattr(path: *const c_char, name: *const c_char) -> c_int {
        path_hook("removexattr", libc::AT_FDCWD, path, -1, |vp| write::modify(vp, true), |p| orig::removexattr(p, name))
    }
    fn lremovexattr(path: *const c_char, name: *const c_char) -> c_int {
        path_hook("lremovexattr", libc::AT_FDCWD, path, -1, |vp| write::modify(vp, false), |p| orig::lremovexattr(p, name))
    }
    fn fremovexattr(fd: c_int, name: *const c_char) -> c_int {
        fd_hook("fremovexattr", fd, -1, ro_fd, || orig::fremovexattr(fd, name))
    }
}
