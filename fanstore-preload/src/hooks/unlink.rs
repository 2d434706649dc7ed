//! unlink, unlinkat, rmdir and remove (glibc's remove calls unlink and
//! rmdir internally, out of the hooks' sight). Under the mount an input is
//! read-only (EROFS after the lookup errors); an output name goes away
//! ([`crate::ops::write`]).

use super::path_hook;
use crate::ops::write;
use crate::real;
use libc::{c_char, c_int};

crate::hooks! {
    fn unlink(path: *const c_char) -> c_int {
        path_hook("unlink", libc::AT_FDCWD, path, -1, write::unlink, |p| real::unlink(p))
    }
    fn unlinkat(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int {
        path_hook("unlinkat", dirfd, path, -1,
            |vp| if flags & libc::AT_REMOVEDIR != 0 { write::rmdir(vp) } else { write::unlink(vp) },
            |p| real::unlinkat(dirfd, p, flags))
    }
    fn rmdir(path: *const c_char) -> c_int {
        path_hook("rmdir", libc::AT_FDCWD, path, -1, write::rmdir, |p| real::rmdir(p))
    }
    fn remove(path: *const c_char) -> c_int {
        path_hook("remove", libc::AT_FDCWD, path, -1, write::remove, |p| real::remove(p))
    }
}
