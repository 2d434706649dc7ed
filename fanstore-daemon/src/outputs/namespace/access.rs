//! Permission checks on the output namespace for a caller that is not
//! root (root passes them all, as with the kernel, and costs nothing):
//! search permission on the directory a name is looked up in, write and
//! search permission on the directory a name is added to or removed from,
//! the sticky-directory rule. Each check costs one lookup of that
//! directory's record at its owner rank; directories of the dataset
//! (inputs) are searchable by everyone and hold outputs of every user.
//!
//! Only the directory that holds the name is checked, not every directory
//! above it: a caller that may not search `a` can still reach `a/b/c` by
//! its full path (the kernel refuses it). Checking every ancestor would
//! cost one lookup per path component on every call.

use crate::caller::{Access, Caller};
use crate::outputs::names::{parent, Looked};
use crate::outputs::Outputs;
use fanstore_core::wire::OutRecord;

/// Adding a name in directory `dir` (its record; None: the mount's root or
/// a directory of the dataset, open to all): write and search permission
/// for a caller that is not root (EACCES).
pub(crate) fn may_add_in(caller: &Caller, dir: Option<&OutRecord>) -> Result<(), i32> {
    match dir {
        Some(d) if !caller.is_root() && !caller.may(d, Access::CHANGE_DIR) => Err(libc::EACCES),
        _ => Ok(()),
    }
}

/// The group and mode a new entry of `mode` made by `caller` in directory
/// `dir` gets, as the kernel's `inode_init_owner` gives them: in a
/// set-group-ID directory the directory's group, and a new directory keeps
/// S_ISGID; else the caller's group. A file asking for set-group-ID in a
/// group its creator is not in (nor root) loses it.
pub(crate) fn inherited(caller: &Caller, dir: Option<&OutRecord>, mode: u32) -> (u32, u32) {
    let is_dir = mode & libc::S_IFMT == libc::S_IFDIR;
    let (gid, mode) = match dir {
        Some(d) if d.mode & libc::S_ISGID != 0 => (d.gid, if is_dir { mode | libc::S_ISGID } else { mode }),
        _ => (caller.gid, mode),
    };
    let sgid_exec = libc::S_ISGID | libc::S_IXGRP;
    if !is_dir && mode & sgid_exec == sgid_exec && !caller.is_root() && !caller.in_group(gid) {
        return (gid, mode & !libc::S_ISGID);
    }
    (gid, mode)
}

impl Outputs {
    /// The record of output directory `dir` if `caller` (not root) may
    /// `want` it; None for root, the mount's root, or a directory of the
    /// dataset. EACCES if refused; a missing directory gives its lookup's
    /// errno (ENOENT, ENOTDIR) for the caller to report as it would anyway.
    pub(crate) fn check_dir(&self, caller: &Caller, dir: &[u8], want: Access) -> Result<Option<OutRecord>, i32> {
        if caller.is_root() || dir.is_empty() || self.rank.view.lookup(dir).is_some() {
            return Ok(None);
        }
        match self.lookup(dir, true) {
            Ok(Looked::Output { rec, .. }) if !rec.is_dir() => Err(libc::ENOTDIR),
            Ok(Looked::Output { rec, .. }) if caller.may(&rec, want) => Ok(Some(rec)),
            Ok(Looked::Output { .. }) => Err(libc::EACCES),
            Ok(_) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Search permission on the directory that holds `path`'s last name.
    pub(crate) fn check_search(&self, caller: &Caller, path: &[u8]) -> Result<(), i32> {
        match self.check_dir(caller, parent(path).0, Access::SEARCH) {
            Err(libc::EACCES) => Err(libc::EACCES),
            // Missing or not a directory: the lookup itself says so.
            _ => Ok(()),
        }
    }

    /// Adding a name at `path`: write and search permission on its directory.
    pub(crate) fn check_add(&self, caller: &Caller, path: &[u8]) -> Result<(), i32> {
        match self.check_dir(caller, parent(path).0, Access::CHANGE_DIR) {
            Err(libc::EACCES) => Err(libc::EACCES),
            _ => Ok(()),
        }
    }

    /// Removing (or renaming away) the name `path`, whose record is
    /// `victim`: write and search permission on its directory, and the
    /// sticky rule (EPERM).
    pub(crate) fn check_remove(&self, caller: &Caller, path: &[u8], victim: &OutRecord) -> Result<(), i32> {
        match self.check_dir(caller, parent(path).0, Access::CHANGE_DIR) {
            Ok(Some(dir)) if !caller.may_remove_from(&dir, victim) => Err(libc::EPERM),
            Err(libc::EACCES) => Err(libc::EACCES),
            _ => Ok(()),
        }
    }
}
