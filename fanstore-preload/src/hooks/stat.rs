//! stat, lstat, fstat, fstatat, statx and the __xstat family (still imported
//! by manylinux wheels: h5py, pillow, safetensors). On LP64 Linux `struct
//! stat` and `struct stat64` are the same layout, and `ver` is ignored.

use super::{fd_hook, path_hook};
use crate::ops::stat::{empty_path_node, fd_node, stat_of, stat_path, statx_of};
use crate::ops::{Node, Outcome};
use crate::state;
use libc::{c_char, c_int, c_uint};

const _: () = assert!(std::mem::size_of::<libc::stat>() == std::mem::size_of::<libc::stat64>());

fn put_stat(buf: *mut libc::stat, n: &Node) -> c_int {
    let Some(st) = state::current() else { return -1 };
    // SAFETY: buf is the caller's out-pointer for a struct stat (hook contract).
    unsafe { buf.write(stat_of(st, n)) };
    0
}

/// The stat of output `vp` (a name that is not an input).
fn out_stat(vp: &crate::ops::VPath, follow: bool) -> Result<libc::stat, c_int> {
    let r = if follow || vp.must_be_dir { crate::ops::namespace::stat(vp.st, vp.rel)? } else { crate::ops::namespace::lstat(vp.st, vp.rel)? };
    if vp.must_be_dir && !r.is_dir() {
        return Err(libc::ENOTDIR);
    }
    Ok(crate::ops::namespace::stat_of(vp.st, vp.rel, &r))
}

unsafe fn stat_common(
    name: &'static str,
    dirfd: c_int,
    path: *const c_char,
    buf: *mut libc::stat,
    flags: c_int,
    real: impl FnOnce(*const c_char) -> c_int,
) -> c_int {
    if flags & libc::AT_EMPTY_PATH != 0 && !path.is_null() && unsafe { *path } == 0 {
        return fstat_at_empty(name, dirfd, buf, real);
    }
    let follow = flags & libc::AT_SYMLINK_NOFOLLOW == 0;
    // SAFETY: path is the caller's C string.
    unsafe {
        path_hook(
            name,
            dirfd,
            path,
            -1,
            |vp| match stat_path(vp, follow) {
                Outcome::Handled(n) => Outcome::Handled(put_stat(buf, &n)),
                Outcome::Errno(libc::ENOENT) => match out_stat(vp, follow) {
                    Ok(s) => {
                        // (inside the hook's unsafe block) buf is the caller's out-pointer for a struct stat.
                        buf.write(s);
                        Outcome::Handled(0)
                    }
                    Err(e) => Outcome::Errno(e),
                },
                Outcome::Errno(e) => Outcome::Errno(e),
                Outcome::Passthrough => Outcome::Passthrough,
            },
            real,
        )
    }
}

fn fstat_at_empty(name: &'static str, dirfd: c_int, buf: *mut libc::stat, real: impl FnOnce(*const c_char) -> c_int) -> c_int {
    let empty = c"".as_ptr();
    if dirfd == libc::AT_FDCWD && crate::paths::vcwd().is_none() {
        return real(empty);
    }
    if dirfd != libc::AT_FDCWD && crate::fd_table::get(dirfd).is_none() {
        return real(empty);
    }
    let Some(g) = crate::guard::Guard::enter() else { return real(empty) };
    // An output's fd (being written, read, a directory): as its fstat.
    if let Some(r) = crate::fd_table::get(dirfd).and_then(|t| crate::guard::catch(|| crate::ops::out::fd_stat(dirfd, t), Some(Err(libc::EIO)))) {
        drop(g);
        return match r {
            Ok(s) => {
                // SAFETY: buf is the caller's out-pointer for a struct stat.
                unsafe { buf.write(s) };
                0
            }
            Err(e) => {
                crate::errno::set_errno(e);
                -1
            }
        };
    }
    let r = crate::guard::catch(|| empty_path_node(dirfd), Outcome::Errno(libc::EIO));
    drop(g);
    match r {
        Outcome::Handled(n) => {
            crate::dlog!("{name}(fd {dirfd}, \"\") ok");
            put_stat(buf, &n)
        }
        Outcome::Passthrough => real(empty),
        Outcome::Errno(e) => {
            crate::errno::set_errno(e);
            -1
        }
    }
}

fn fstat_common(name: &'static str, fd: c_int, buf: *mut libc::stat, real: impl FnOnce() -> c_int) -> c_int {
    fd_hook(
        name,
        fd,
        -1,
        |t| {
            if let Some(r) = crate::ops::out::fd_stat(fd, t) {
                return match r {
                    Ok(s) => {
                        // SAFETY: buf is the caller's out-pointer for a struct stat.
                        unsafe { buf.write(s) };
                        Outcome::Handled(0)
                    }
                    Err(e) => Outcome::Errno(e),
                };
            }
            match fd_node(fd, t) {
                Outcome::Handled(n) => Outcome::Handled(put_stat(buf, &n)),
                other => other.map_none(),
            }
        },
        real,
    )
}

unsafe fn statx_common(
    dirfd: c_int,
    path: *const c_char,
    flags: c_int,
    buf: *mut libc::statx,
    real: impl Fn(*const c_char) -> c_int,
) -> c_int {
    let put = |n: &Node| -> c_int {
        let Some(st) = state::current() else { return -1 };
        // SAFETY: buf is the caller's out-pointer for a struct statx.
        unsafe { buf.write(statx_of(st, n)) };
        0
    };
    if flags & libc::AT_EMPTY_PATH != 0 && !path.is_null() && unsafe { *path } == 0 {
        let tracked = if dirfd == libc::AT_FDCWD { crate::paths::vcwd().is_some() } else { crate::fd_table::get(dirfd).is_some() };
        if !tracked {
            return real(path);
        }
        let Some(g) = crate::guard::Guard::enter() else { return real(path) };
        // An output's fd (being written, read, a directory): as its fstat
        // (Rust's File::metadata is statx of the fd).
        if let Some(r) = crate::fd_table::get(dirfd).and_then(|t| crate::guard::catch(|| crate::ops::out::fd_stat(dirfd, t), Some(Err(libc::EIO)))) {
            drop(g);
            return match r {
                Ok(s) => {
                    // SAFETY: buf is the caller's out-pointer for a struct statx.
                    unsafe { buf.write(crate::ops::stat::statx_from(&s)) };
                    0
                }
                Err(e) => {
                    crate::errno::set_errno(e);
                    -1
                }
            };
        }
        let r = crate::guard::catch(|| empty_path_node(dirfd), Outcome::Errno(libc::EIO));
        drop(g);
        return match r {
            Outcome::Handled(n) => put(&n),
            Outcome::Passthrough => real(path),
            Outcome::Errno(e) => {
                crate::errno::set_errno(e);
                -1
            }
        };
    }
    let follow = flags & libc::AT_SYMLINK_NOFOLLOW == 0;
    // SAFETY: path is the caller's C string.
    unsafe {
        path_hook(
            "statx",
            dirfd,
            path,
            -1,
            |vp| match stat_path(vp, follow) {
                Outcome::Handled(n) => Outcome::Handled(put(&n)),
                Outcome::Errno(libc::ENOENT) => match if follow || vp.must_be_dir { crate::ops::namespace::stat(vp.st, vp.rel) } else { crate::ops::namespace::lstat(vp.st, vp.rel) } {
                    Ok(r) if vp.must_be_dir && !r.is_dir() => Outcome::Errno(libc::ENOTDIR),
                    Ok(r) => {
                        // (inside the hook's unsafe block) buf is the caller's out-pointer for a struct statx.
                        buf.write(crate::ops::namespace::statx_of(vp.st, vp.rel, &r));
                        Outcome::Handled(0)
                    }
                    Err(e) => Outcome::Errno(e),
                },
                other => other.map_none(),
            },
            real,
        )
    }
}

crate::hooks! {
    fn stat(path: *const c_char, buf: *mut libc::stat) -> c_int {
        stat_common("stat", libc::AT_FDCWD, path, buf, 0, |p| orig::stat(p, buf))
    }
    fn stat64(path: *const c_char, buf: *mut libc::stat) -> c_int {
        stat_common("stat64", libc::AT_FDCWD, path, buf, 0, |p| orig::stat64(p, buf))
    }
    fn lstat(path: *const c_char, buf: *mut libc::stat) -> c_int {
        stat_common("lstat", libc::AT_FDCWD, path, buf, libc::AT_SYMLINK_NOFOLLOW, |p| orig::lstat(p, buf))
    }
    fn lstat64(path: *const c_char, buf: *mut libc::stat) -> c_int {
        stat_common("lstat64", libc::AT_FDCWD, path, buf, libc::AT_SYMLINK_NOFOLLOW, |p| orig::lstat64(p, buf))
    }
    fn fstatat(dirfd: c_int, path: *const c_char, buf: *mut libc::stat, flags: c_int) -> c_int {
        stat_common("fstatat", dirfd, path, buf, flags, |p| orig::fstatat(dirfd, p, buf, flags))
    }
    fn fstatat64(dirfd: c_int, path: *const c_char, buf: *mut libc::stat, flags: c_int) -> c_int {
        stat_common("fstatat64", dirfd, path, buf, flags, |p| orig::fstatat64(dirfd, p, buf, flags))
    }
    fn fstat(fd: c_int, buf: *mut libc::stat) -> c_int {
        fstat_common("fstat", fd, buf, || orig::fstat(fd, buf))
    }
    fn fstat64(fd: c_int, buf: *mut libc::stat) -> c_int {
        fstat_common("fstat64", fd, buf, || orig::fstat64(fd, buf))
    }
    fn statx(dirfd: c_int, path: *const c_char, flags: c_int, mask: c_uint, buf: *mut libc::statx) -> c_int {
        statx_common(dirfd, path, flags, buf, |p| orig::statx(dirfd, p, flags, mask, buf))
    }
    fn __xstat(ver: c_int, path: *const c_char, buf: *mut libc::stat) -> c_int {
        stat_common("__xstat", libc::AT_FDCWD, path, buf, 0, |p| orig::__xstat(ver, p, buf))
    }
    fn __xstat64(ver: c_int, path: *const c_char, buf: *mut libc::stat) -> c_int {
        stat_common("__xstat64", libc::AT_FDCWD, path, buf, 0, |p| orig::__xstat64(ver, p, buf))
    }
    fn __lxstat(ver: c_int, path: *const c_char, buf: *mut libc::stat) -> c_int {
        stat_common("__lxstat", libc::AT_FDCWD, path, buf, libc::AT_SYMLINK_NOFOLLOW, |p| orig::__lxstat(ver, p, buf))
    }
    fn __lxstat64(ver: c_int, path: *const c_char, buf: *mut libc::stat) -> c_int {
        stat_common("__lxstat64", libc::AT_FDCWD, path, buf, libc::AT_SYMLINK_NOFOLLOW, |p| orig::__lxstat64(ver, p, buf))
    }
    fn __fxstat(ver: c_int, fd: c_int, buf: *mut libc::stat) -> c_int {
        fstat_common("__fxstat", fd, buf, || orig::__fxstat(ver, fd, buf))
    }
    fn __fxstat64(ver: c_int, fd: c_int, buf: *mut libc::stat) -> c_int {
        fstat_common("__fxstat64", fd, buf, || orig::__fxstat64(ver, fd, buf))
    }
    fn __fxstatat(ver: c_int, dirfd: c_int, path: *const c_char, buf: *mut libc::stat, flags: c_int) -> c_int {
        stat_common("__fxstatat", dirfd, path, buf, flags, |p| orig::__fxstatat(ver, dirfd, p, buf, flags))
    }
    fn __fxstatat64(ver: c_int, dirfd: c_int, path: *const c_char, buf: *mut libc::stat, flags: c_int) -> c_int {
        stat_common("__fxstatat64", dirfd, path, buf, flags, |p| orig::__fxstatat64(ver, dirfd, p, buf, flags))
    }
}

/// `newfstatat` is the syscall's name, not a glibc symbol; a program that
/// declares it itself gets fstatat semantics.
#[no_mangle]
pub unsafe extern "C" fn newfstatat(dirfd: c_int, path: *const c_char, buf: *mut libc::stat, flags: c_int) -> c_int {
    // SAFETY: same contract as fstatat.
    unsafe { fstatat(dirfd, path, buf, flags) }
}
