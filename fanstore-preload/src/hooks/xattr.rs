//! setxattr, removexattr and their l/f forms (the reading ones are in
//! meta.rs): an input is read-only (EROFS); an output has no extended
//! attributes (EOPNOTSUPP); an output's fd is changed natively
//! ([`crate::ops::write`]).

use super::{cbytes, fd_hook, path_hook};
use crate::ops::write;
use crate::real;
use libc::{c_char, c_int, c_void, size_t};

crate::hooks! {
    fn setxattr(path: *const c_char, name: *const c_char, value: *const c_void, size: size_t, flags: c_int) -> c_int {
        path_hook("setxattr", libc::AT_FDCWD, path, -1, |vp| write::modify(vp, true), |p| real::setxattr(p, name, value, size, flags))
    }
    fn lsetxattr(path: *const c_char, name: *const c_char, value: *const c_void, size: size_t, flags: c_int) -> c_int {
        path_hook("lsetxattr", libc::AT_FDCWD, path, -1, |vp| write::modify(vp, false), |p| real::lsetxattr(p, name, value, size, flags))
    }
    fn fsetxattr(fd: c_int, name: *const c_char, value: *const c_void, size: size_t, flags: c_int) -> c_int {
        let r = fd_hook("fsetxattr", fd, -1, |t| write::fd_attr(fd, t), || real::fsetxattr(fd, name, value, size, flags));
        if r == 0 && crate::user_mem::cstr(name) {
            // SAFETY: name is a readable C string (probed).
            write::xattr_set(fd, unsafe { cbytes(name) });
        }
        r
    }
    fn removexattr(path: *const c_char, name: *const c_char) -> c_int {
        path_hook("removexattr", libc::AT_FDCWD, path, -1, |vp| write::modify(vp, true), |p| real::removexattr(p, name))
    }
    fn lremovexattr(path: *const c_char, name: *const c_char) -> c_int {
        path_hook("lremovexattr", libc::AT_FDCWD, path, -1, |vp| write::modify(vp, false), |p| real::lremovexattr(p, name))
    }
    fn fremovexattr(fd: c_int, name: *const c_char) -> c_int {
        fd_hook("fremovexattr", fd, -1, |t| write::fd_attr(fd, t), || real::fremovexattr(fd, name))
    }
}
