//! The output namespace, client side: every call about the names of outputs
//! (not in the input index) is asked of the local daemon, which resolves it
//! through the daemon side's `namespace` module (the path's metadata owner
//! rank, symlinks, renames). Lookups and stat, directories, symlinks, renames,
//! unlink, chmod/utime, listings. The bytes of outputs (open, create,
//! truncate) are [`super::out`]'s.

pub use crate::lookup::{lookup, lookup_creatable, may_list_outputs, real_dir, Found, RealDir, INPUT_HOLDER};
use super::attr::{split_ns, statx_from, Attr, DEV_MAJOR, DEV_MINOR};
use super::{resolve, Outcome, VPath};
use crate::client;
use crate::errno::errno;
use crate::state::State;
use fanstore_core::wire::{self, op, OutRecord};
use libc::c_int;

/// The record of an output this process is still writing.
/// (None for one whose fd still waits for its copy: its file is the
/// committed version's, whose record says it all, identity included.)
fn own_record(rel: &[u8]) -> Option<OutRecord> {
    let (fd, idx) = crate::outputs::open_slot_of(rel)?;
    if crate::fd_table::is_lazy(fd) {
        return None;
    }
    // SAFETY: plain data, zero is valid.
    let mut s: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: s is a valid out-pointer.
    if unsafe { crate::real::fstat(fd, &mut s) } != 0 {
        return None;
    }
    let ns = |sec: i64, nsec: i64| sec * 1_000_000_000 + nsec;
    let mode = crate::outputs::mode_of(idx).unwrap_or(libc::S_IFREG | 0o644);
    let (uid, gid) = crate::outputs::owner_of(idx);
    Some(OutRecord {
        size: s.st_size as u64,
        mode,
        holder: 0,
        mtime_ns: ns(s.st_mtime, s.st_mtime_nsec),
        id: 0,
        sum: 0,
        atime_ns: ns(s.st_atime, s.st_atime_nsec),
        ctime_ns: ns(s.st_ctime, s.st_ctime_nsec),
        uid,
        gid,
        ino: 0,
        nlink: 0,
    })
}

/// The record of what a symlink outside the mount points at (the kernel's stat).
fn outside_record(abs: &[u8]) -> Result<OutRecord, c_int> {
    let c = std::ffi::CString::new(abs).map_err(|_| libc::ENOENT)?;
    // SAFETY: plain data, zero is valid.
    let mut s: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: c is NUL-terminated, s a valid out-pointer.
    if unsafe { crate::real::stat(c.as_ptr(), &mut s) } != 0 {
        return Err(errno());
    }
    Ok(OutRecord {
        size: s.st_size as u64,
        mode: s.st_mode,
        holder: INPUT_HOLDER,
        mtime_ns: s.st_mtime * 1_000_000_000 + s.st_mtime_nsec,
        id: 0,
        sum: 0,
        atime_ns: s.st_atime * 1_000_000_000 + s.st_atime_nsec,
        ctime_ns: s.st_ctime * 1_000_000_000 + s.st_ctime_nsec,
        uid: s.st_uid,
        gid: s.st_gid,
        ino: 0,
        nlink: s.st_nlink as u32,
    })
}

/// The record of output `rel` (ENOENT if there is none): symlinks followed
/// when `follow`, else a symlink's own record.
pub fn record(st: &State, rel: &[u8], follow: bool) -> Result<OutRecord, c_int> {
    if let Some(r) = own_record(rel) {
        return Ok(r);
    }
    match lookup(st, rel, follow)? {
        Found::Here { rec, .. } => Ok(rec),
        Found::Outside(abs) => outside_record(&abs),
    }
}

/// lstat of output `rel`: a symlink's own record (ENOENT if there is none).
pub fn lstat(st: &State, rel: &[u8]) -> Result<OutRecord, c_int> {
    record(st, rel, false)
}

/// The record of output `rel`, symlinks followed (ENOENT if there is none).
pub fn stat(st: &State, rel: &[u8]) -> Result<OutRecord, c_int> {
    record(st, rel, true)
}

/// Inode numbers of outputs: a hash of the path with the top bit set (input
/// inodes are small node ids).
pub fn ino(rel: &[u8]) -> u64 {
    fanstore_core::wire::ino_of_path(rel)
}

/// The inode number of output `rel` with record `r`. A committed file with
/// bytes has one per version (its holder and output id): a rewrite or a
/// rename over it gives a new one, as a replaced file has natively, so
/// `tail -F` reopens a log rewritten on another node, where the copy it has
/// open never changes. The path's own number otherwise: for directories and
/// symlinks, for a file its process is still writing (sqlite compares the
/// number its open saw with stat of its path before each write), and for
/// an empty file (`tar -x` leaves an empty placeholder for a symlink, then
/// checks that stat of it still gives the number fstat gave while it was open).
///
/// "The path" is the one the record was created at (its `ino`, kept
/// through renames), so a renamed file or directory keeps its number.
pub fn file_ino(rel: &[u8], r: &OutRecord) -> u64 {
    let base = if r.ino != 0 { r.ino } else { ino(rel) };
    if r.mode & libc::S_IFMT == libc::S_IFREG && r.id != 0 && r.size > 0 {
        let version = r.id ^ (u64::from(r.holder) << 40);
        base ^ (version.wrapping_mul(0x9e37_79b9_7f4a_7c15) & !(1 << 63))
    } else {
        base
    }
}

pub fn stat_of(st: &State, rel: &[u8], r: &OutRecord) -> libc::stat {
    // SAFETY: libc::stat is plain data; all-zero is valid.
    let mut s: libc::stat = unsafe { std::mem::zeroed() };
    let size = if r.is_dir() { 4096 } else { r.size.min(i64::MAX as u64) as i64 };
    s.st_dev = libc::makedev(DEV_MAJOR, DEV_MINOR);
    s.st_ino = file_ino(rel, r);
    s.st_mode = r.mode;
    // A directory's record counts its subdirectories in `size`.
    // A hard-linked file's record counts its names.
    s.st_nlink = if r.is_dir() { 2 + r.size.min(u32::MAX as u64) } else { u64::from(r.nlink.max(1)) } as _;
    // (An input reached through a symlink shows the library's owner of inputs.)
    (s.st_uid, s.st_gid) = if r.uid == fanstore_core::wire::INPUT_OWNER { (st.uid, st.gid) } else { (r.uid, r.gid) };
    s.st_size = size;
    s.st_rdev = r.rdev();
    s.st_blksize = 4096;
    s.st_blocks = (size + 511) / 512;
    (s.st_atime, s.st_atime_nsec) = split_ns(r.atime_ns);
    (s.st_mtime, s.st_mtime_nsec) = split_ns(r.mtime_ns);
    (s.st_ctime, s.st_ctime_nsec) = split_ns(r.ctime_ns);
    s
}

pub fn statx_of(st: &State, rel: &[u8], r: &OutRecord) -> libc::statx {
    statx_from(&stat_of(st, rel, r))
}

/// Ok if `dir` (relative) is an input or output directory.
pub fn dir_exists(st: &State, dir: &[u8]) -> Result<(), c_int> {
    match resolve(st, dir, true, true) {
        Ok(_) => Ok(()),
        Err(libc::ENOENT) => match stat(st, dir) {
            Ok(r) if r.is_dir() => Ok(()),
            Ok(_) => Err(libc::ENOTDIR),
            Err(e) => Err(e),
        },
        Err(e) => Err(e),
    }
}

fn simple(st: &State, op: u16, arg1: u64, payload: &[u8]) -> Outcome<c_int> {
    match client::call(st, &client::request(op, 0, arg1, payload), None) {
        Ok(_) => Outcome::Handled(0),
        Err(e) => Outcome::Errno(e),
    }
}

/// chmod / utime / chown of an output (committed: one still being written
/// here has no record yet and gives ENOENT). Whether the caller may is the
/// daemon's to say (it knows the caller from the connection).
pub fn setattr(vp: &VPath, attr: Attr, follow: bool) -> Outcome<c_int> {
    if let Some((fd, idx)) = crate::outputs::open_slot_of(vp.rel) {
        return setattr_own(fd, idx, attr);
    }
    let (what, value) = match attr {
        Attr::Mode(m) => (wire::SETATTR_MODE, u64::from(m & 0o7777)),
        Attr::Times { atime, mtime, now } => {
            // Two changes at the owner, access time first (each sets ctime).
            let what = if follow { 0 } else { wire::SETATTR_NOFOLLOW };
            for (w, v, now) in [(wire::SETATTR_ATIME, atime, now.0), (wire::SETATTR_MTIME, mtime, now.1)] {
                let what = if now { what | wire::SETATTR_NOW } else { what };
                if let Some(v) = v {
                    if let Err(e) = client::call(vp.st, &client::request(op::SETATTR, w | what, v as u64, vp.rel), None) {
                        return Outcome::Errno(e);
                    }
                }
            }
            return Outcome::Handled(0);
        }
        Attr::Owner { uid, gid } => (wire::SETATTR_OWNER, u64::from(uid) | u64::from(gid) << 32),
        Attr::Nothing => return record(vp.st, vp.rel, follow).map(|_| 0).into(),
    };
    let what = if follow { what } else { what | wire::SETATTR_NOFOLLOW };
    match client::call(vp.st, &client::request(op::SETATTR, what, value, vp.rel), None) {
        Ok(_) => Outcome::Handled(0),
        Err(e) => Outcome::Errno(e),
    }
}

/// chmod, chown or utime by name of an output this process is still
/// writing (git chmods its `config.lock` before closing it): the open file
/// itself changes, as fchmod and futimens change it, and its commit takes
/// the mode and the times from there. The daemon knows no such name yet.
fn setattr_own(fd: c_int, idx: u32, attr: Attr) -> Outcome<c_int> {
    let done = |r: c_int| if r == 0 { Outcome::Handled(0) } else { Outcome::Errno(errno()) };
    match attr {
        Attr::Mode(m) => {
            crate::outputs::set_mode(idx, m);
            // SAFETY: fchmod of an fd this process tracks as open.
            done(unsafe { crate::real::fchmod(fd, m & 0o7777) })
        }
        Attr::Times { atime, mtime, .. } => {
            let ts = |t: Option<i64>| match t {
                Some(ns) => libc::timespec { tv_sec: ns.div_euclid(1_000_000_000), tv_nsec: ns.rem_euclid(1_000_000_000) },
                None => libc::timespec { tv_sec: 0, tv_nsec: libc::UTIME_OMIT },
            };
            let times = [ts(atime), ts(mtime)];
            // SAFETY: futimens of an fd this process tracks as open, with two timespecs.
            done(unsafe { crate::real::futimens(fd, times.as_ptr()) })
        }
        // Kept with the open output and given to its record when it is
        // committed (tar -x as root: open, write, fchown, close).
        Attr::Owner { uid, gid } => match crate::outputs::set_owner(idx, uid, gid) {
            Ok(()) => Outcome::Handled(0),
            Err(e) => Outcome::Errno(e),
        },
        Attr::Nothing => Outcome::Handled(0),
    }
}

/// symlink(2) of output `vp` to `target` (stored as given, never checked,
/// as the kernel does).
pub fn symlink(vp: &VPath, target: &[u8]) -> Outcome<c_int> {
    if crate::outputs::open_slot_of(vp.rel).is_some() {
        return Outcome::Errno(libc::EEXIST);
    }
    let mut p = Vec::with_capacity(vp.rel.len() + 1 + target.len());
    p.extend_from_slice(vp.rel);
    p.push(0);
    p.extend_from_slice(target);
    simple(vp.st, op::SYMLINK, 0, &p)
}

/// readlink(2) of output `rel`: its target, EINVAL if it is no symlink.
pub fn readlink(st: &State, rel: &[u8]) -> Result<Vec<u8>, c_int> {
    if crate::outputs::open_slot_of(rel).is_some() {
        return Err(libc::EINVAL);
    }
    match lookup(st, rel, false)? {
        Found::Here { rec, target, .. } if rec.is_link() => Ok(target),
        _ => Err(libc::EINVAL),
    }
}

pub fn mkdir(vp: &VPath, mode: u32) -> Outcome<c_int> {
    match resolve(vp.st, vp.rel, false, false) {
        Ok(_) => return Outcome::Errno(libc::EEXIST),
        Err(libc::ENOENT) => {}
        Err(e) => return Outcome::Errno(e),
    }
    // As the kernel: the permission and sticky bits asked for, less the umask.
    simple(vp.st, op::MKDIR, u64::from(mode & 0o1777 & !super::attr::umask()), vp.rel)
}

pub fn rmdir(vp: &VPath) -> Outcome<c_int> {
    simple(vp.st, op::RMDIR, 0, vp.rel)
}

pub fn unlink(vp: &VPath) -> Outcome<c_int> {
    if crate::outputs::retarget(vp.rel, None) {
        // Being written here: nothing is committed at its close. A file
        // that existed before (opened "r+", "a") loses its name now too.
        return match simple(vp.st, op::UNLINK, 0, vp.rel) {
            Outcome::Errno(libc::ENOENT) => Outcome::Handled(0),
            other => other,
        };
    }
    simple(vp.st, op::UNLINK, 0, vp.rel)
}

/// link(2) of output `from` as `to` (the caller checked that `to` can be
/// made): another name of the same file, at the daemon.
pub fn link(from: &VPath, to: &VPath) -> Outcome<c_int> {
    if crate::outputs::open_slot_of(from.rel).is_some() {
        // Still being written here: it has no record to share yet.
        return Outcome::Errno(libc::EPERM);
    }
    let mut p = Vec::with_capacity(from.rel.len() + 1 + to.rel.len());
    p.extend_from_slice(from.rel);
    p.push(0);
    p.extend_from_slice(to.rel);
    match client::call(from.st, &client::request(op::LINK, 0, 0, &p), None) {
        Ok(_) => Outcome::Handled(0),
        Err(e) => Outcome::Errno(e),
    }
}

pub fn rename(from: &VPath, to: &VPath, noreplace: bool) -> Outcome<c_int> {
    if noreplace && lstat(to.st, to.rel).is_ok() {
        return Outcome::Errno(libc::EEXIST);
    }
    let mut p = Vec::with_capacity(from.rel.len() + 1 + to.rel.len());
    p.extend_from_slice(from.rel);
    p.push(0);
    p.extend_from_slice(to.rel);
    let flags = if noreplace { wire::RENAME_NOREPLACE } else { 0 };
    if crate::outputs::retarget(from.rel, Some(to.rel)) {
        // Still being written here: it is committed under the new name. A
        // file that existed before (opened "r+", "a") leaves its old name
        // now, as natively (its new version replaces it at the close).
        return match client::call(from.st, &client::request(op::RENAME, flags, 0, &p), None) {
            Ok(_) | Err(libc::ENOENT) => Outcome::Handled(0),
            Err(e) => Outcome::Errno(e),
        };
    }
    let r = match client::call(from.st, &client::request(op::RENAME, flags, 0, &p), None) {
        Ok(_) => Outcome::Handled(0),
        Err(e) => Outcome::Errno(e),
    };
    if r == Outcome::Handled(0) {
        crate::outputs::moved_dir(from.rel, to.rel);
    }
    r
}

/// Names and kinds of the outputs listed under directory `rel`.
pub fn list(st: &State, rel: &[u8]) -> Result<Vec<(u8, Vec<u8>)>, c_int> {
    let mut out = Vec::new();
    loop {
        let a = client::call(st, &client::request(op::OUT_LIST, out.len() as u64, 0, rel), None)?;
        if a.reply.value == 0 {
            return Ok(out);
        }
        out.extend(fanstore_core::wire::entries(&a.reply.payload).map(|(k, n)| (k, n.to_vec())));
    }
}

