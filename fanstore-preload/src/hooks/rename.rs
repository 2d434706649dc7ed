//! rename, renameat, renameat2, link and linkat: calls that name two
//! paths, dispatched by [`super::two_path_hook`]. Outputs move under the
//! mount; inputs stay (EROFS); a move across the mount's edge is EXDEV
//! ([`crate::ops::write`]).

use super::two_path_hook;
use crate::ops::write;
use crate::real;
use libc::{c_char, c_int, c_uint};

crate::hooks! {
    fn rename(old: *const c_char, new: *const c_char) -> c_int {
        two_path_hook("rename", libc::AT_FDCWD, old, libc::AT_FDCWD, new, |a, b| write::rename_paths(a, b, 0), |a, b| real::rename(a, b))
    }
    fn renameat(d1: c_int, old: *const c_char, d2: c_int, new: *const c_char) -> c_int {
        two_path_hook("renameat", d1, old, d2, new, |a, b| write::rename_paths(a, b, 0), |a, b| real::renameat(d1, a, d2, b))
    }
    fn renameat2(d1: c_int, old: *const c_char, d2: c_int, new: *const c_char, flags: c_uint) -> c_int {
        two_path_hook("renameat2", d1, old, d2, new, |a, b| write::rename_paths(a, b, flags), |a, b| real::renameat2(d1, a, d2, b, flags))
    }
    fn link(old: *const c_char, new: *const c_char) -> c_int {
        two_path_hook("link", libc::AT_FDCWD, old, libc::AT_FDCWD, new, write::link_paths, |a, b| real::link(a, b))
    }
    fn linkat(d1: c_int, old: *const c_char, d2: c_int, new: *const c_char, flags: c_int) -> c_int {
        two_path_hook("linkat", d1, old, d2, new, write::link_paths, |a, b| real::linkat(d1, a, d2, b, flags))
    }
}
