//! The virtual cwd: after chdir("/fanstore/x") relative paths resolve under
//! it and getcwd returns it. The real cwd moves to the empty read-only
//! directory, so a relative path that escapes the hooks (a raw syscall, a
//! child program) finds nothing instead of unrelated real files.

use super::{resolve, Outcome, VPath};
use crate::fd_table::Tracked;
use crate::paths::{node_abs_path, set_vcwd, vcwd};
use crate::state;
use fanstore_core::path::MAX_PATH;
use libc::c_int;

pub fn chdir(vp: &VPath) -> Outcome<c_int> {
    match resolve(vp.st, vp.rel, true, true) {
        Ok(n) => {
            // SAFETY: empty_dir is NUL-terminated.
            unsafe { crate::real::chdir(vp.st.empty_dir.as_ptr()) };
            set_vcwd(Some(n.id()));
            Outcome::Handled(0)
        }
        Err(e) => Outcome::Errno(e),
    }
}

pub fn fchdir(fd: c_int, t: Tracked) -> Outcome<c_int> {
    match t {
        Tracked::Dir { node, .. } => {
            // SAFETY: fd is a tracked fd on the empty directory.
            unsafe { crate::real::fchdir(fd) };
            set_vcwd(Some(node));
            Outcome::Handled(0)
        }
        Tracked::File(_) => Outcome::Errno(libc::ENOTDIR),
    }
}

/// The virtual cwd as an absolute path, if set.
pub fn current(out: &mut [u8; MAX_PATH]) -> Option<usize> {
    let n = vcwd()?;
    let st = state::current()?;
    node_abs_path(st, n, out)
}

/// A successful real chdir/fchdir leaves the virtual cwd.
pub fn left_virtual() {
    set_vcwd(None);
}
