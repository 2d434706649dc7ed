//! stat/lstat/fstatat/statx/fstat and statfs answers from the index.
//!
//! A node's identity: st_dev is FanStore's fake device, st_ino is node id + 1.
//! fstat of a virtual fd returns exactly what stat of its path returns.

use super::attr::{split_ns, statx_from, DEV_MAJOR, DEV_MINOR};
use super::{resolve, Node, Outcome, VPath};
use crate::fd_table::{self, Tracked};
use crate::state::{self, State};
use libc::c_int;

pub const BLKSIZE: i64 = 4096;
/// The st_size reported for directories (the index stores 0).
pub const DIR_SIZE: i64 = 4096;
/// f_type of statfs: "FANS", not any real file system's magic.
pub const FS_MAGIC: i64 = 0x4641_4e53;

pub fn ino(node: u32) -> u64 {
    node as u64 + 1
}

fn size_of(n: &Node) -> i64 {
    if n.is_dir() {
        DIR_SIZE
    } else {
        n.size().min(i64::MAX as u64) as i64
    }
}

/// The stat of a node.
pub fn stat_of(st: &State, n: &Node) -> libc::stat {
    // SAFETY: libc::stat is plain data; all-zero is valid.
    let mut s: libc::stat = unsafe { std::mem::zeroed() };
    let size = size_of(n);
    s.st_dev = libc::makedev(DEV_MAJOR, DEV_MINOR);
    s.st_ino = ino(n.id());
    s.st_mode = n.mode();
    s.st_nlink = n.nlink().max(1) as _;
    s.st_uid = st.uid;
    s.st_gid = st.gid;
    s.st_size = size;
    s.st_blksize = BLKSIZE as _;
    s.st_blocks = ((size + BLKSIZE - 1) / BLKSIZE * (BLKSIZE / 512)) as _;
    (s.st_atime, s.st_atime_nsec) = split_ns(n.atime_ns());
    (s.st_mtime, s.st_mtime_nsec) = split_ns(n.mtime_ns());
    (s.st_ctime, s.st_ctime_nsec) = split_ns(n.ctime_ns());
    s
}

/// The statx of a node (basic stats; no birth time).
pub fn statx_of(st: &State, n: &Node) -> libc::statx {
    statx_from(&stat_of(st, n))
}

/// stat/lstat/fstatat of a path under the mount.
pub fn stat_path(vp: &VPath, follow: bool) -> Outcome<Node> {
    resolve(vp.st, vp.rel, vp.must_be_dir, follow).into()
}

/// stat/lstat/fstatat/statx of a path under the mount: an input's, else
/// (ENOENT in the index) an output's.
pub fn stat_any(vp: &VPath, follow: bool) -> Outcome<libc::stat> {
    match stat_path(vp, follow) {
        Outcome::Handled(n) => Outcome::Handled(stat_of(vp.st, &n)),
        Outcome::Errno(libc::ENOENT) => out_stat(vp, follow).into(),
        Outcome::Errno(e) => Outcome::Errno(e),
        Outcome::Passthrough => Outcome::Passthrough,
    }
}

/// The stat of output `vp` (a name that is not an input).
fn out_stat(vp: &VPath, follow: bool) -> Result<libc::stat, c_int> {
    let r = super::namespace::record(vp.st, vp.rel, follow || vp.must_be_dir)?;
    if vp.must_be_dir && !r.is_dir() {
        return Err(libc::ENOTDIR);
    }
    Ok(super::namespace::stat_of(vp.st, vp.rel, &r))
}

/// The stat of a node, with the loaded state's owner (none: not ours).
fn node_stat(n: &Node) -> Outcome<libc::stat> {
    match state::current() {
        Some(st) => Outcome::Handled(stat_of(st, n)),
        None => Outcome::Passthrough,
    }
}

/// fstat of a tracked fd: an output's (being written, read, a directory)
/// as its own file says ([`super::out::fd_stat`]), else its node's.
pub fn fstat(fd: c_int, t: Tracked) -> Outcome<libc::stat> {
    if let Some(r) = super::out::fd_stat(fd, t) {
        return r.into();
    }
    match fd_node(fd, t) {
        Outcome::Handled(n) => node_stat(&n),
        other => other.map_none(),
    }
}

/// fstatat/statx with `AT_EMPTY_PATH` and an empty path: the stat of
/// `dirfd` itself (an output's fd as its fstat; Rust's File::metadata is
/// statx of the fd), or of the virtual cwd.
pub fn empty_path_stat(dirfd: c_int) -> Outcome<libc::stat> {
    if let Some(r) = fd_table::get(dirfd).and_then(|t| super::out::fd_stat(dirfd, t)) {
        return r.into();
    }
    match empty_path_node(dirfd) {
        Outcome::Handled(n) => node_stat(&n),
        other => other.map_none(),
    }
}

/// The node behind a tracked fd, after checking that the fd still refers
/// to what we opened (real fstat): a stale entry is dropped and the call
/// passes through.
pub fn fd_node(fd: c_int, t: Tracked) -> Outcome<Node> {
    let Some(st) = state::current() else { return Outcome::Passthrough };
    // SAFETY: plain data, zero is valid.
    let mut real: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: real is a valid out-pointer; fstat on any int is safe.
    if unsafe { crate::real::fstat(fd, &mut real) } != 0 {
        fd_table::clear(fd);
        return Outcome::Passthrough;
    }
    let fresh = match t {
        Tracked::Dir { .. } => real.st_ino == st.empty_ino,
        Tracked::File(_) => fd_table::check_ino(fd, real.st_ino),
        // Outputs have no node (their stat: `ops::out::fd_stat`).
        Tracked::Output(_) | Tracked::Committed { .. } => return Outcome::Passthrough,
    };
    if !fresh {
        fd_table::clear(fd);
        return Outcome::Passthrough;
    }
    match st.view.node(t.node()) {
        Some(n) => Outcome::Handled(n),
        None => Outcome::Passthrough,
    }
}

/// The node an `AT_EMPTY_PATH` call names: `dirfd` itself (tracked fd or virtual cwd).
pub fn empty_path_node(dirfd: c_int) -> Outcome<Node> {
    if dirfd == libc::AT_FDCWD {
        return match (crate::vcwd::vcwd(), state::current()) {
            (Some(n), Some(st)) => st.view.node(n).map_or(Outcome::Passthrough, Outcome::Handled),
            _ => Outcome::Passthrough,
        };
    }
    match fd_table::get(dirfd) {
        Some(t) => fd_node(dirfd, t),
        None => Outcome::Passthrough,
    }
}

/// statfs of the mount.
pub fn statfs_of(st: &State) -> libc::statfs {
    // SAFETY: plain data, zero is valid.
    let mut s: libc::statfs = unsafe { std::mem::zeroed() };
    s.f_type = FS_MAGIC as _;
    s.f_bsize = BLKSIZE as _;
    s.f_frsize = BLKSIZE as _;
    s.f_blocks = st.view.total_bytes().div_ceil(BLKSIZE as u64) as _;
    s.f_bfree = 0;
    s.f_bavail = 0;
    s.f_files = st.view.node_count() as _;
    s.f_ffree = 0;
    s.f_namelen = 255;
    // glibc's f_flags is the first word after f_frsize (libc names it padding).
    // SAFETY: on LP64 glibc `struct statfs` has five fsword_t after f_frsize,
    // the first being f_flags; the write stays inside `s`.
    unsafe { std::ptr::addr_of_mut!(s.f_frsize).add(1).write(STATFS_FLAGS as _) };
    s
}

const STATFS_FLAGS: u64 = libc::ST_RDONLY | libc::ST_NOSUID | libc::ST_NODEV;

pub fn statvfs_of(st: &State) -> libc::statvfs {
    let f = statfs_of(st);
    // SAFETY: plain data, zero is valid.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    s.f_bsize = f.f_bsize as _;
    s.f_frsize = f.f_frsize as _;
    s.f_blocks = f.f_blocks as _;
    s.f_files = f.f_files as _;
    s.f_fsid = FS_MAGIC as _;
    s.f_flag = STATFS_FLAGS as _;
    s.f_namemax = 255;
    s
}
