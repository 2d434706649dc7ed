//! Namespace changes and writes: inputs give the errno a read-only file
//! system gives, chosen the way Linux chooses it (lookup errors first);
//! names that are not inputs are outputs, handled by [`super::out`].

use super::attr::Attr;
use super::{parent_of, resolve, Outcome, VPath};
use crate::fd_table::Tracked;
use crate::paths::Last;
use libc::{c_int, c_uint};

/// A call that makes or removes a name, on a path that ends in "." or
/// "..": the kernel walks the directory that stands for (its errors
/// first), then refuses with `errno`. None for a path ending in a name.
fn dot_errno(vp: &VPath, errno: c_int) -> Option<c_int> {
    if vp.last == Last::Name {
        return None;
    }
    Some(super::namespace::dir_exists(vp.st, vp.rel).err().unwrap_or(errno))
}

/// unlink/unlinkat(0): ENOENT, EISDIR for directories, else EROFS.
pub fn unlink(vp: &VPath) -> Outcome<c_int> {
    if let Some(e) = dot_errno(vp, libc::EISDIR) {
        return Outcome::Errno(e);
    }
    Outcome::Errno(match resolve(vp.st, vp.rel, vp.must_be_dir, false) {
        Ok(n) if n.is_dir() => libc::EISDIR,
        Ok(_) if vp.must_be_dir => libc::ENOTDIR,
        Ok(_) => libc::EROFS,
        Err(libc::ENOENT) => return super::namespace::unlink(vp),
        Err(e) => e,
    })
}

/// rmdir/unlinkat(AT_REMOVEDIR): ENOENT, ENOTDIR, EBUSY for the mount, else EROFS;
/// a path ending in "." is EINVAL, in ".." ENOTEMPTY (as Linux says).
pub fn rmdir(vp: &VPath) -> Outcome<c_int> {
    if let Some(e) = dot_errno(vp, if vp.last == Last::Dot { libc::EINVAL } else { libc::ENOTEMPTY }) {
        return Outcome::Errno(e);
    }
    Outcome::Errno(match resolve(vp.st, vp.rel, false, false) {
        Ok(n) if !n.is_dir() => libc::ENOTDIR,
        Ok(_) if vp.rel.is_empty() => libc::EBUSY,
        Ok(_) => libc::EROFS,
        Err(libc::ENOENT) => return super::namespace::rmdir(vp),
        Err(e) => e,
    })
}

/// remove(3): unlink, and rmdir where that is a directory (EISDIR), as
/// glibc's remove does with its internal calls, which no hook sees.
pub fn remove(vp: &VPath) -> Outcome<c_int> {
    match unlink(vp) {
        Outcome::Errno(libc::EISDIR) => rmdir(vp),
        other => other,
    }
}

/// mkdir: an output directory (EEXIST on an input name).
pub fn mkdir(vp: &VPath, mode: u32) -> Outcome<c_int> {
    if let Some(e) = dot_errno(vp, libc::EEXIST) {
        return Outcome::Errno(e);
    }
    super::namespace::mkdir(vp, mode)
}

/// errno for creating `rel` (mkdir, O_CREAT, symlink, link target...):
/// EEXIST if it exists, else the parent's lookup error, else EROFS.
pub fn create_errno(vp: &VPath) -> c_int {
    if let Some(e) = dot_errno(vp, libc::EEXIST) {
        return e;
    }
    match resolve(vp.st, vp.rel, false, false) {
        Ok(_) => libc::EEXIST,
        Err(libc::ENOENT) => match resolve(vp.st, parent_of(vp.rel), true, true) {
            Ok(_) if vp.rel.is_empty() => libc::EEXIST,
            Ok(_) => libc::EROFS,
            // Not an input directory: a new name in an output one is EPERM
            // here (no hard links; callers that create outputs there, as
            // symlink(2), mknod(2) and bind(2), take EPERM as their go-ahead);
            // an existing output name (a dangling symlink too) is EEXIST.
            // (No daemon to ask: the index's answer, ENOENT.)
            Err(libc::ENOENT) => match super::namespace::lstat(vp.st, vp.rel) {
                Ok(_) => libc::EEXIST,
                Err(libc::ENOENT) => match super::namespace::stat(vp.st, parent_of(vp.rel)) {
                    Ok(r) if r.is_dir() => libc::EPERM,
                    Ok(_) => libc::ENOTDIR,
                    Err(e) => walk_errno(e),
                },
                Err(e) => walk_errno(e),
            },
            Err(e) => e,
        },
        Err(e) => e,
    }
}

/// What a failed lookup of the daemon says of a path walk: its own
/// answer for the errors a walk gives (a file as a directory, a symlink
/// loop, a name too long), else (no daemon to ask, ENOENT) the index's: ENOENT.
fn walk_errno(e: c_int) -> c_int {
    match e {
        libc::ENOTDIR | libc::ELOOP | libc::ENAMETOOLONG | libc::EACCES => e,
        _ => libc::ENOENT,
    }
}

/// mknod, mknodat, mkfifo, mkfifoat: a FIFO, a socket inode or an empty
/// file where an output can be created ([`super::special::mknod`]); a type
/// mknod does not know is EINVAL before the path is looked at, as Linux;
/// elsewhere what creating the name gives (EEXIST, EROFS...).
pub fn mknod(vp: &VPath, mode: u32, dev: libc::dev_t) -> Outcome<c_int> {
    if !super::special::valid_type(mode) {
        return Outcome::Errno(libc::EINVAL);
    }
    match create_errno(vp) {
        libc::EPERM => super::special::mknod(vp, mode, dev),
        e => Outcome::Errno(e),
    }
}

/// bind(2) of unix socket `fd` to `vp`: a socket output where an output
/// can be created ([`super::special::bind`]); an existing name is
/// EADDRINUSE, as natively; elsewhere what creating the name gives.
pub fn bind(vp: &VPath, fd: c_int) -> Outcome<c_int> {
    match create_errno(vp) {
        libc::EPERM => super::special::bind(vp, fd),
        libc::EEXIST => Outcome::Errno(libc::EADDRINUSE),
        e => Outcome::Errno(e),
    }
}

/// symlink/symlinkat: a new output symlink where a new output could be
/// created; elsewhere what creating the name gives (EEXIST, EROFS...).
pub fn symlink(vp: &VPath, target: Option<&[u8]>) -> Outcome<c_int> {
    let Some(target) = target else { return Outcome::Errno(libc::EFAULT) };
    // The kernel copies the target in first: empty is ENOENT, PATH_MAX
    // bytes or more (its NUL included) ENAMETOOLONG.
    if target.is_empty() {
        return Outcome::Errno(libc::ENOENT);
    }
    if target.len() >= libc::PATH_MAX as usize {
        return Outcome::Errno(libc::ENAMETOOLONG);
    }
    match create_errno(vp) {
        libc::EPERM => super::namespace::symlink(vp, target),
        e => Outcome::Errno(e),
    }
}

/// setxattr, removexattr: the node must exist; then EROFS on an input, and
/// EOPNOTSUPP on an output, as on a file system without extended
/// attributes (cp -a and sed -i then set the mode with chmod instead of an
/// access ACL).
pub fn modify(vp: &VPath, follow: bool) -> Outcome<c_int> {
    Outcome::Errno(match resolve(vp.st, vp.rel, vp.must_be_dir, follow) {
        Ok(_) => libc::EROFS,
        Err(libc::ENOENT) if crate::outputs::open_slot_of(vp.rel).is_some() => libc::EOPNOTSUPP,
        Err(libc::ENOENT) => {
            match super::namespace::record(vp.st, vp.rel, follow) {
                Ok(_) => libc::EOPNOTSUPP,
                Err(e) => e,
            }
        }
        Err(e) => e,
    })
}

/// chmod, chown, utime family: EROFS on an input; an output's record changes.
pub fn setattr(vp: &VPath, follow: bool, attr: Attr) -> Outcome<c_int> {
    match resolve(vp.st, vp.rel, vp.must_be_dir, follow) {
        Ok(_) => Outcome::Errno(libc::EROFS),
        Err(libc::ENOENT) => super::namespace::setattr(vp, attr, follow),
        Err(e) => Outcome::Errno(e),
    }
}

/// truncate: EISDIR for directories, EROFS for inputs; an output is
/// rewritten at its new length ([`super::out::truncate`]).
pub fn truncate(vp: &VPath, len: i64) -> Outcome<c_int> {
    Outcome::Errno(match resolve(vp.st, vp.rel, vp.must_be_dir, true) {
        Ok(n) if n.is_dir() => libc::EISDIR,
        Ok(_) => libc::EROFS,
        Err(libc::ENOENT) => return super::out::truncate(vp, len),
        Err(e) => e,
    })
}

/// rename/link source side: ENOENT if missing, else EROFS (or EXDEV when
/// the other side is outside the mount).
pub fn source(vp: &VPath, other_virtual: bool) -> Outcome<c_int> {
    Outcome::Errno(match resolve(vp.st, vp.rel, false, false) {
        Ok(_) if other_virtual => libc::EROFS,
        Ok(_) => libc::EXDEV,
        Err(libc::ENOENT) if !other_virtual => match super::namespace::stat(vp.st, vp.rel) {
            Ok(_) => libc::EXDEV,
            Err(e) => e,
        },
        Err(e) => e,
    })
}

/// link inside the mount: an input source is EROFS; an output source gives
/// what creating the new name gives (EEXIST, ENOENT, ENOTDIR, EPERM: no
/// hard links among outputs yet).
pub fn link(a: &VPath, b: &VPath) -> Outcome<c_int> {
    match resolve(a.st, a.rel, false, false) {
        Err(libc::ENOENT) => match super::namespace::lstat(a.st, a.rel) {
            Ok(r) if r.is_dir() => Outcome::Errno(libc::EPERM),
            // A new name in an output directory: a hard link of the output.
            Ok(_) => match create_errno(b) {
                libc::EPERM => super::namespace::link(a, b),
                e => Outcome::Errno(e),
            },
            Err(e) => Outcome::Errno(e),
        },
        _ => source(a, true),
    }
}

/// rename/renameat/renameat2 inside the mount: outputs move (atomically
/// replacing an output at the destination), inputs stay (EROFS).
pub fn rename(a: &VPath, b: &VPath, noreplace: bool) -> Outcome<c_int> {
    match resolve(a.st, a.rel, false, false) {
        Err(libc::ENOENT) => super::namespace::rename(a, b, noreplace),
        _ => source(a, true),
    }
}

/// rename, renameat, renameat2 with whichever of the two paths are under
/// the mount. RENAME_NOREPLACE is honoured (EEXIST, atomically at the
/// destination's owner for a file); RENAME_EXCHANGE and RENAME_WHITEOUT on
/// /fanstore are EINVAL (documented).
pub fn rename_paths(a: Option<&VPath>, b: Option<&VPath>, flags: c_uint) -> Outcome<c_int> {
    match (a, b) {
        (Some(_), Some(_)) | (Some(_), None) | (None, Some(_)) if flags & !libc::RENAME_NOREPLACE != 0 => Outcome::Errno(libc::EINVAL),
        (Some(a), Some(b)) if a.last != Last::Name || b.last != Last::Name => Outcome::Errno(rename_dots(a, b, flags)),
        (Some(a), Some(b)) => rename(a, b, flags & libc::RENAME_NOREPLACE != 0),
        (a, b) => link_paths(a, b),
    }
}

/// rename of a path ending in "." or "..": the directories of both names
/// are walked first (old, then new: their errors), then EBUSY (EEXIST for
/// a new name so written with RENAME_NOREPLACE), as Linux answers.
fn rename_dots(a: &VPath, b: &VPath, flags: c_uint) -> c_int {
    for v in [a, b] {
        let dir = if v.last == Last::Name { parent_of(v.rel) } else { v.rel };
        if let Err(e) = super::namespace::dir_exists(v.st, dir) {
            return e;
        }
    }
    if a.last == Last::Name && flags & libc::RENAME_NOREPLACE != 0 {
        return libc::EEXIST;
    }
    libc::EBUSY
}

/// link and linkat with whichever of the two paths are under the mount
/// (also rename's answer when one side is outside it).
pub fn link_paths(a: Option<&VPath>, b: Option<&VPath>) -> Outcome<c_int> {
    match (a, b) {
        (Some(a), Some(b)) => link(a, b),
        (Some(a), b) => source(a, b.is_some()),
        (None, Some(_)) => Outcome::Errno(libc::EXDEV),
        (None, None) => Outcome::Passthrough,
    }
}

/// fchown, futimens, fsetxattr, fremovexattr of a tracked fd: an input
/// (or a directory) is read-only; an output's fd is a real file of ours,
/// changed natively (one being written: its commit takes the mode and
/// times; a committed one opened: its record stays as it is, as before
/// such fds were tracked).
///
/// An output fd still waiting for its copy ([`super::lazy_copy`]) gets it
/// first: the change is the copy's, never the committed version's file.
pub fn fd_attr(fd: c_int, t: Tracked) -> Outcome<c_int> {
    if super::out::is_output(t) {
        return match super::lazy_copy::before_write(fd) {
            Ok(()) => Outcome::Passthrough,
            Err(e) => Outcome::Errno(e),
        };
    }
    Outcome::Errno(libc::EROFS)
}

/// fchmod of a tracked fd: an output being written changes natively and
/// its commit registers the new mode (fstat shows it too); else [`fd_attr`].
pub fn fchmod(fd: c_int, t: Tracked, mode: u32) -> Outcome<c_int> {
    match t {
        Tracked::Output(idx) => {
            if let Err(e) = super::lazy_copy::before_write(fd) {
                return Outcome::Errno(e);
            }
            crate::outputs::set_mode(idx, mode);
            Outcome::Passthrough
        }
        other => fd_attr(fd, other),
    }
}

/// fchown of a tracked fd: an output being written keeps the new owner for
/// its record ([`crate::outputs::set_owner`]); else [`fd_attr`].
pub fn fchown(fd: c_int, t: Tracked, uid: u32, gid: u32) -> Outcome<c_int> {
    match t {
        Tracked::Output(idx) => match super::lazy_copy::before_write(fd).and_then(|()| crate::outputs::set_owner(idx, uid, gid)) {
            Ok(()) => Outcome::Handled(0),
            Err(e) => Outcome::Errno(e),
        },
        other => fd_attr(fd, other),
    }
}

/// After a successful fsetxattr of `fd` named `name`: an access ACL sets
/// the file's mode bits too (sed -i and cp -p copy the original's
/// permissions that way): an output's commit takes them.
pub fn xattr_set(fd: c_int, name: Option<&[u8]>) {
    if name == Some(b"system.posix_acl_access") {
        super::out::mode_from_file(fd);
    }
}

/// The current time, ns since the epoch.
fn now_ns() -> i64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: ts is a valid out-pointer; CLOCK_REALTIME always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    ts.tv_sec as i64 * 1_000_000_000 + ts.tv_nsec as i64
}

/// Both times now (a utime family call with a null argument).
fn now() -> Attr {
    let t = now_ns();
    Attr::Times { atime: Some(t), mtime: Some(t), now: (true, true) }
}

/// utime's argument (None: now).
pub fn utimbuf_times(t: Option<&libc::utimbuf>) -> Attr {
    t.map_or_else(now, |t| Attr::Times {
        atime: Some(t.actime as i64 * 1_000_000_000),
        mtime: Some(t.modtime as i64 * 1_000_000_000),
        now: (false, false),
    })
}

/// utimes' argument (None: now; else [atime, mtime]).
pub fn timeval_times(t: Option<&[libc::timeval; 2]>) -> Attr {
    let Some(&[a, m]) = t else { return now() };
    let ns = |t: libc::timeval| t.tv_sec as i64 * 1_000_000_000 + t.tv_usec as i64 * 1000;
    Attr::Times { atime: Some(ns(a)), mtime: Some(ns(m)), now: (false, false) }
}

/// utimensat's argument (None or UTIME_NOW: now; UTIME_OMIT: unchanged).
pub fn timespec_times(t: Option<&[libc::timespec; 2]>) -> Attr {
    let Some(&[a, m]) = t else { return now() };
    let one = |t: libc::timespec| match t.tv_nsec {
        libc::UTIME_NOW => Some(now_ns()),
        libc::UTIME_OMIT => None,
        ns => Some(t.tv_sec as i64 * 1_000_000_000 + ns as i64),
    };
    let now = (a.tv_nsec == libc::UTIME_NOW, m.tv_nsec == libc::UTIME_NOW);
    match (one(a), one(m)) {
        (None, None) => Attr::Nothing,
        (atime, mtime) => Attr::Times { atime, mtime, now },
    }
}
