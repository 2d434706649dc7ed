//! chdir, fchdir and getcwd with a virtual cwd: after chdir("/fanstore/x")
//! relative paths resolve under it and getcwd returns it (the moves
//! themselves, real cwd included, are [`crate::vcwd`]'s).

use super::{resolve, Outcome, VPath};
use crate::fd_table::Tracked;
use crate::paths::node_abs_path;
use crate::state;
use crate::vcwd::{enter, enter_output, replace_vcwd, vcwd};
use fanstore_core::path::MAX_PATH;
use libc::c_int;

pub fn chdir(vp: &VPath) -> Outcome<c_int> {
    match resolve(vp.st, vp.rel, true, true) {
        Ok(n) => {
            enter(vp.st, n.id());
            Outcome::Handled(0)
        }
        Err(libc::ENOENT) => enter_output(vp.st, vp.rel).into(),
        Err(e) => Outcome::Errno(e),
    }
}

pub fn fchdir(_fd: c_int, t: Tracked) -> Outcome<c_int> {
    match (t, state::current()) {
        (Tracked::Dir { node, .. }, Some(st)) if node & crate::outputs::OUT_DIR != 0 => {
            let mut p = [0u8; MAX_PATH];
            match crate::outputs::path_into(node, &mut p) {
                Some(n) => enter_output(st, &p[..n]).into(),
                None => Outcome::Errno(libc::EBADF),
            }
        }
        (Tracked::Dir { node, .. }, Some(st)) => {
            enter(st, node);
            Outcome::Handled(0)
        }
        (Tracked::Dir { .. }, None) => Outcome::Passthrough,
        (Tracked::File(_) | Tracked::Output(_) | Tracked::Committed { .. }, _) => Outcome::Errno(libc::ENOTDIR),
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
    replace_vcwd(None);
}
