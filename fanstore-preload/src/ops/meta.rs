//! access, readlink, realpath, xattrs and statfs under the mount.

use super::{resolve, Outcome, VPath};
use crate::fd_table::Tracked;
use crate::paths::node_abs_path;
use crate::state::State;
use libc::c_int;

/// access/faccessat: the owner may read everything; writes are EROFS;
/// execute needs an x bit on files.
pub fn access(vp: &VPath, mode: c_int, follow: bool) -> Outcome<c_int> {
    let n = match resolve(vp.st, vp.rel, vp.must_be_dir, follow) {
        Ok(n) => n,
        Err(libc::ENOENT) => {
            return match super::namespace::stat(vp.st, vp.rel) {
                Ok(r) if !super::attr::may_access(&r, (mode & 7) as u32) => Outcome::Errno(libc::EACCES),
                Ok(r) if vp.must_be_dir && !r.is_dir() => Outcome::Errno(libc::ENOTDIR),
                Ok(_) => Outcome::Handled(0),
                Err(e) => Outcome::Errno(e),
            }
        }
        Err(e) => return Outcome::Errno(e),
    };
    if mode & libc::W_OK != 0 {
        return Outcome::Errno(libc::EROFS);
    }
    if mode & libc::X_OK != 0 && !n.is_dir() && n.mode() & 0o111 == 0 {
        return Outcome::Errno(libc::EACCES);
    }
    Outcome::Handled(0)
}

/// Whether `vp` names something: an input node, else an output (asked of
/// the daemon; a symlink itself unless `follow`: lgetxattr of a dangling
/// link is ENODATA, as `ls -l` expects).
fn exists(vp: &VPath, follow: bool) -> Result<(), c_int> {
    match resolve(vp.st, vp.rel, vp.must_be_dir, follow) {
        Ok(_) => Ok(()),
        Err(libc::ENOENT) => match super::namespace::record(vp.st, vp.rel, follow || vp.must_be_dir) {
            Ok(r) if vp.must_be_dir && !r.is_dir() => Err(libc::ENOTDIR),
            Ok(_) => Ok(()),
            Err(e) => Err(e),
        },
        Err(e) => Err(e),
    }
}

/// readlink: the target of a symlink, EINVAL for anything else.
pub fn readlink(vp: &VPath) -> Outcome<std::borrow::Cow<'static, [u8]>> {
    match resolve(vp.st, vp.rel, vp.must_be_dir, false) {
        Ok(n) if super::is_symlink(&n) => Outcome::Handled(n.symlink_target().into()),
        Ok(_) => Outcome::Errno(libc::EINVAL),
        Err(libc::ENOENT) if vp.must_be_dir => Outcome::Errno(exists(vp, false).map_or_else(|e| e, |_| libc::EINVAL)),
        Err(libc::ENOENT) => super::namespace::readlink(vp.st, vp.rel).map(std::borrow::Cow::Owned).into(),
        Err(e) => Outcome::Errno(e),
    }
}

/// readlink("/proc/self/fd/N") of a tracked fd: the virtual path.
pub fn proc_fd_link(path: &[u8], out: &mut [u8]) -> Option<usize> {
    let rest = path.strip_prefix(b"/proc/self/fd/")?;
    let fd: c_int = std::str::from_utf8(rest).ok()?.parse().ok()?;
    let t = crate::fd_table::get(fd)?;
    let st = crate::state::current()?;
    node_abs_path(st, t.node(), out)
}

/// realpath: the canonical absolute path of an existing node.
pub fn realpath(vp: &VPath, out: &mut [u8]) -> Outcome<usize> {
    match resolve(vp.st, vp.rel, vp.must_be_dir, true) {
        Ok(n) => match node_abs_path(vp.st, n.id(), out) {
            Some(len) => Outcome::Handled(len),
            None => Outcome::Errno(libc::ENAMETOOLONG),
        },
        // An output: its normalised path is already canonical (outputs are never symlinks).
        Err(libc::ENOENT) => match exists(vp, true) {
            Ok(()) => match crate::paths::rel_abs_path(vp.rel, out) {
                Some(len) => Outcome::Handled(len),
                None => Outcome::Errno(libc::ENAMETOOLONG),
            },
            Err(e) => Outcome::Errno(e),
        },
        Err(e) => Outcome::Errno(e),
    }
}

/// getxattr family: no attributes (ENODATA) on an existing node.
pub fn getxattr(vp: &VPath, follow: bool) -> Outcome<isize> {
    match exists(vp, follow) {
        Ok(()) => Outcome::Errno(libc::ENODATA),
        Err(e) => Outcome::Errno(e),
    }
}

/// listxattr family: an empty list.
pub fn listxattr(vp: &VPath, follow: bool) -> Outcome<isize> {
    match exists(vp, follow) {
        Ok(()) => Outcome::Handled(0),
        Err(e) => Outcome::Errno(e),
    }
}

/// statfs of anything under the mount (it must exist).
pub fn statfs_node(vp: &VPath) -> Outcome<&'static State> {
    match exists(vp, true) {
        Ok(()) => Outcome::Handled(vp.st),
        Err(e) => Outcome::Errno(e),
    }
}

/// An xattr or statfs call on tracked fd `t`: `f` with the loaded state,
/// or libc's answer.
pub fn fd_state<T>(t: Tracked, f: impl FnOnce(&'static State) -> Outcome<T>) -> Outcome<T> {
    // A committed output's fd is the real file's, as when it was not
    // tracked: its file system (a local one: tail -F watches it with
    // inotify, not by polling as it would an unknown type) and its xattrs.
    if matches!(t, Tracked::Committed { .. }) {
        return Outcome::Passthrough;
    }
    match crate::state::current() {
        Some(st) => f(st),
        None => Outcome::Passthrough,
    }
}
