//! Output files being written. Each is an unnamed file in the rank's local
//! directory (O_TMPFILE; a memfd where that is not possible) that the
//! program writes natively;
//! its fds are tracked in the fd table as [`Tracked::Output`] with the index
//! of a slot here (path, O_EXCL, mode, number of tracked fds). When the last
//! tracked fd goes (close, fclose, dup2 over it, close_range, exit), the
//! file is handed to the daemon with COMMIT (SCM_RIGHTS, no copy) and the
//! reply's errno becomes close's.
//!
//! Output directories opened as fds or streams use the same slots: their
//! fds are tracked as [`Tracked::Dir`] with node id `OUT_DIR | slot`
//! (input node ids never have that bit), released when the last fd closes.
//!
//! The slot table is behind a small lock; paths are allocated before taking
//! it and freed after releasing it.

use crate::fd_table::{self, Tracked};
use crate::lock::Locked;
use crate::state::State;
use fanstore_core::wire::{self, op};
use libc::c_int;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

const SLOTS: usize = 4096;

/// Bit of a [`Tracked::Dir`] node id that marks an output directory slot.
pub const OUT_DIR: u32 = 1 << 31;

pub struct Slot {
    pub path: Vec<u8>,
    pub excl: bool,
    pub mode: u32,
    refs: u32,
    /// Unlinked while open: nothing is committed at the last close.
    unlinked: bool,
    /// The process that created it: a forked child that closes (or exits
    /// with) an inherited fd never commits the parent's unfinished file.
    pid: i32,
    /// Inherited across exec from the process that created it: committed
    /// at its last close here with COMMIT_LATE ([`crate::exec_outputs`]).
    late: bool,
    /// The file's device and inode (0, 0: unknown), by which an exec finds
    /// the fds a vfork child dup'd from it without tracking them.
    file: (u64, u64),
    /// The owner and group a chown gave it while open (`u32::MAX`: the
    /// committing process's), set on its record after the commit.
    owner: (u32, u32),
    /// For a copy of a committed output: what it was copied from. If at
    /// its last close it still has those bytes, mode and mtime (nothing
    /// written, or the same bytes written back), nothing is committed.
    pristine: Option<Pristine>,
    /// A file the daemon made ahead (`wire::STAT_NEW_FILE`): the daemon's
    /// own reference to it may outlive the reply by a few microseconds.
    made_ahead: bool,
}

/// The committed version an output being written was copied from.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Pristine {
    size: i64,
    /// xxh3 of the bytes (the record's `sum`).
    sum: u64,
    /// The copy's mtime right after the copy (futimens changes it).
    mtime: (i64, i64),
    mode: u32,
}

/// Size and mtime of `fd`'s file.
fn size_mtime(fd: c_int) -> Option<(i64, (i64, i64))> {
    // SAFETY: plain data, zero is valid.
    let mut s: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: s is a valid out-pointer; fstat on any int is safe.
    (unsafe { crate::real::fstat(fd, &mut s) } == 0).then_some((s.st_size, (s.st_mtime, s.st_mtime_nsec)))
}

/// xxh3 of the bytes of `fd`'s file (`size` bytes), read with pread.
fn file_sum(fd: c_int, size: i64) -> Option<u64> {
    let mut h = fanstore_core::checksum::StreamingChecksum::new();
    let mut buf = vec![0u8; copy_buffer_len(size)];
    let mut off = 0i64;
    while off < size {
        // SAFETY: buf is a live buffer of its length; fd is our output file.
        let n = unsafe { libc::pread(fd, buf.as_mut_ptr().cast(), buf.len(), off) };
        if n <= 0 {
            return None;
        }
        h.update(&buf[..n as usize]);
        off += n as i64;
    }
    Some(h.digest())
}

/// A buffer length for copying or hashing `size` bytes: the size rounded up
/// to a page, at most 1 MiB (a small file's copy then costs no fresh
/// mapping of a megabyte, which is most of its time).
pub fn copy_buffer_len(size: i64) -> usize {
    (size.clamp(1, 1 << 20) as usize).next_multiple_of(4096)
}

/// Output `fd` is a file the daemon made ahead ([`Slot::made_ahead`]).
pub fn mark_made_ahead(fd: c_int) {
    let Some(Tracked::Output(idx)) = fd_table::get(fd) else { return };
    TABLE.with(|t| {
        if let Some(Some(s)) = t.slots.get_mut(idx as usize) {
            s.made_ahead = true;
        }
    });
}

/// Output `fd` is a fresh copy of committed version `sum` ([`Slot::pristine`]).
pub fn mark_pristine(fd: c_int, sum: u64) {
    let Some(Tracked::Output(idx)) = fd_table::get(fd) else { return };
    let Some((size, mtime)) = size_mtime(fd) else { return };
    TABLE.with(|t| {
        if let Some(Some(s)) = t.slots.get_mut(idx as usize) {
            s.pristine = Some(Pristine { size, sum, mtime, mode: s.mode });
        }
    });
}

/// True if output slot `s`, whose file is `fd`, is still the version it
/// was copied from (bytes, mode, mtime, owner).
fn unchanged(fd: c_int, s: &Slot) -> bool {
    let Some(p) = s.pristine else { return false };
    if s.owner != NO_OWNER || s.mode != p.mode || size_mtime(fd) != Some((p.size, p.mtime)) {
        return false;
    }
    file_sum(fd, p.size) == Some(p.sum)
}

/// The device and inode of `fd`'s file ((0, 0) if fstat fails).
pub fn file_id(fd: c_int) -> (u64, u64) {
    // SAFETY: plain data, zero is valid.
    let mut s: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: s is a valid out-pointer; fstat on any int is safe.
    if unsafe { crate::real::fstat(fd, &mut s) } == 0 {
        (s.st_dev, s.st_ino)
    } else {
        (0, 0)
    }
}

fn pid() -> i32 {
    // SAFETY: getpid cannot fail.
    unsafe { libc::getpid() }
}

fn take_slot(slot: Box<Slot>) -> Option<usize> {
    let mut slot = Some(slot);
    let idx = TABLE.with(|t| {
        let i = t.slots.iter().position(|s| s.is_none())?;
        t.slots[i] = slot.take();
        t.high = t.high.max(i + 1);
        Some(i)
    });
    drop(slot);
    idx
}

/// A slot for output directory `path`: its node id (`OUT_DIR | slot`).
pub fn track_dir(path: &[u8]) -> Option<u32> {
    let idx = take_slot(Box::new(Slot { path: path.to_vec(), excl: false, mode: 0, refs: 1, unlinked: false, pid: 0, late: false, file: (0, 0), owner: NO_OWNER, pristine: None, made_ahead: false }))?;
    Some(OUT_DIR | idx as u32)
}

/// Copies the path of slot `idx` into `out`; its length.
pub fn path_into(idx: u32, out: &mut [u8]) -> Option<usize> {
    TABLE.with(|t| {
        let s = t.slots.get((idx & !OUT_DIR) as usize)?.as_ref()?;
        out.get_mut(..s.path.len())?.copy_from_slice(&s.path);
        Some(s.path.len())
    })
}

/// One fd (or stream) of output directory node `node` goes away.
pub fn release_dir(node: u32) {
    let s = release(node & !OUT_DIR);
    drop(s);
}

struct Table {
    slots: [Option<Box<Slot>>; SLOTS],
    /// Every occupied slot is below this index (kept low: see [`Table::live`]).
    high: usize,
}

impl Table {
    /// The slots that may be occupied: a lookup by path (every stat, open
    /// and rename under the mount asks whether this process writes the
    /// path) scans these, not all SLOTS (4,096 empty slots cost about 2 µs,
    /// more than the stat itself).
    fn live(&mut self) -> &mut [Option<Box<Slot>>] {
        while self.high > 0 && self.slots[self.high - 1].is_none() {
            self.high -= 1;
        }
        &mut self.slots[..self.high]
    }
}

static TABLE: Locked<Table> = Locked::new(Table { slots: [const { None }; SLOTS], high: 0 });
/// Highest fd ever tracked as an output (bounds the scans of close_range and exit).
static MAX_FD: AtomicI32 = AtomicI32::new(-1);
static EXIT_HOOK: AtomicBool = AtomicBool::new(false);

pub fn fork_prepare() {
    TABLE.lock();
}
pub fn fork_release() {
    TABLE.unlock();
}

/// Starts tracking output file `fd` as output `path`. False if the table is full.
pub fn track(fd: c_int, path: &[u8], excl: bool, mode: u32) -> bool {
    let file = file_id(fd);
    let slot = Slot { path: path.to_vec(), excl, mode, refs: 1, unlinked: false, pid: pid(), late: false, file, owner: NO_OWNER, pristine: None, made_ahead: false };
    if install(fd, slot).is_none() {
        return false;
    }
    exit_hook();
    true
}

/// Puts `slot` in the table with `fd` tracked on it: its index (None: the
/// table is full, or the fd out of the fd table's range).
fn install(fd: c_int, slot: Slot) -> Option<u32> {
    let idx = take_slot(Box::new(slot))?;
    if !fd_table::set(fd, Tracked::Output(idx as u32)) {
        let s = TABLE.with(|t| t.slots[idx].take());
        drop(s);
        return None;
    }
    MAX_FD.fetch_max(fd, Ordering::Relaxed);
    Some(idx as u32)
}

/// Commits at exit what is still open (registered once).
fn exit_hook() {
    if !EXIT_HOOK.swap(true, Ordering::Relaxed) {
        // SAFETY: registering a plain extern "C" fn with no arguments.
        unsafe { libc::atexit(at_exit) };
    }
}

/// Starts tracking `fd`, a read-only fd on the bytes of committed output
/// `path` (checksum `sum`) that the program opened `O_RDWR`, as that output
/// being written, marked lazy: its writable copy is made at its first
/// write ([`crate::ops::lazy_copy`]), and a close before any commits
/// nothing. False if the table is full.
pub fn track_lazy(fd: c_int, path: &[u8], mode: u32, sum: u64) -> bool {
    let pristine = Some(Pristine { size: -1, sum, mtime: (0, 0), mode });
    let slot = Slot { path: path.to_vec(), excl: false, mode, refs: 1, unlinked: false, pid: pid(), late: false, file: (0, 0), owner: NO_OWNER, pristine, made_ahead: false };
    let Some(idx) = install(fd, slot) else { return false };
    if !fd_table::set_lazy(fd) {
        fd_table::clear(fd);
        let s = TABLE.with(|t| t.slots[idx as usize].take());
        drop(s);
        return false;
    }
    true
}

/// Lazy output `fd` (slot `idx`) is now its writable copy: the copy's
/// identity, and the size and mtime its close compares ([`Slot::pristine`]).
pub fn copied(idx: u32, fd: c_int) {
    let file = file_id(fd);
    let now = size_mtime(fd);
    TABLE.with(|t| {
        if let Some(Some(s)) = t.slots.get_mut(idx as usize) {
            s.file = file;
            match (now, s.pristine.as_mut()) {
                (Some((size, mtime)), Some(p)) => (p.size, p.mtime) = (size, mtime),
                _ => s.pristine = None,
            }
        }
    });
    exit_hook();
}

/// Tracks `fd` as output `path` created by process `creator`, inherited
/// across an exec ([`crate::exec_outputs`]): None if the table is full.
/// This process commits it at its last close: as its own if it created it
/// (bash's child opened it before the exec), else late (COMMIT_LATE: the
/// creator's commit may have come first, while this process still wrote).
pub fn adopt(fd: c_int, path: &[u8], excl: bool, mode: u32, creator: i32) -> Option<u32> {
    let late = creator != pid();
    let slot = Slot { path: path.to_vec(), excl: excl && !late, mode, refs: 1, unlinked: false, pid: pid(), late, file: file_id(fd), owner: NO_OWNER, pristine: None, made_ahead: false };
    let idx = install(fd, slot)?;
    exit_hook();
    Some(idx)
}

/// Output slot `idx`'s creating process (0 for one this process inherited
/// late: whoever it goes to next commits it late too), O_EXCL claim and mode.
pub fn slot_info(idx: u32) -> Option<(i32, bool, u32)> {
    TABLE.with(|t| {
        t.slots.get(idx as usize)?.as_ref().filter(|s| !s.unlinked && s.refs > 0).map(|s| (if s.late { 0 } else { s.pid }, s.excl, s.mode))
    })
}

/// The output slot whose file is `file` (device, inode), if any.
pub fn slot_of_file(file: (u64, u64)) -> Option<u32> {
    if file == (0, 0) {
        return None;
    }
    TABLE.with(|t| t.live().iter().position(|s| s.as_ref().is_some_and(|s| s.refs > 0 && !s.unlinked && s.mode & libc::S_IFMT == libc::S_IFREG && s.file == file)))
        .map(|i| i as u32)
}

/// The highest fd ever tracked as an output (-1: none).
pub fn max_fd() -> c_int {
    MAX_FD.load(Ordering::Relaxed)
}

/// Another fd (dup) now refers to output slot `idx`.
pub fn add_ref(fd: c_int, idx: u32) {
    TABLE.with(|t| {
        if let Some(Some(s)) = t.slots.get_mut((idx & !OUT_DIR) as usize) {
            s.refs += 1;
        }
    });
    MAX_FD.fetch_max(fd, Ordering::Relaxed);
}

/// An fd of this process on the output being written at `path`, if any
/// (the writer sees its own file before the commit, as POSIX wants).
pub fn open_fd_of(path: &[u8]) -> Option<c_int> {
    open_slot_of(path).map(|(fd, _)| fd)
}

/// The mode (type and permission bits) output slot `idx` will be committed with.
pub fn mode_of(idx: u32) -> Option<u32> {
    TABLE.with(|t| t.slots.get((idx & !OUT_DIR) as usize)?.as_ref().map(|s| s.mode))
}

/// fchmod of an output being written: the mode its commit registers.
pub fn set_mode(idx: u32, perm: u32) {
    TABLE.with(|t| {
        if let Some(Some(s)) = t.slots.get_mut((idx & !OUT_DIR) as usize) {
            s.mode = (s.mode & libc::S_IFMT) | (perm & 0o7777);
        }
    });
}

const NO_OWNER: (u32, u32) = (u32::MAX, u32::MAX);

/// The owner and group output slot `idx` shows before its commit: what a
/// chown gave it, else this process's effective ids.
pub fn owner_of(idx: u32) -> (u32, u32) {
    let set = TABLE.with(|t| t.slots.get((idx & !OUT_DIR) as usize)?.as_ref().map(|s| s.owner)).unwrap_or(NO_OWNER);
    // SAFETY: geteuid and getegid have no preconditions and cannot fail.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    (if set.0 == u32::MAX { uid } else { set.0 }, if set.1 == u32::MAX { gid } else { set.1 })
}

/// fchown (or chown) of an output being written: by chown(2)'s rules for
/// this process (root: anyone; else its own uid and one of its groups,
/// EPERM otherwise), kept for the record and given to it after the
/// commit. Like chown(2), drops set-user-ID (and set-group-ID with a
/// group x bit) from its mode.
pub fn set_owner(idx: u32, uid: u32, gid: u32) -> Result<(), c_int> {
    // SAFETY: geteuid and getegid have no preconditions and cannot fail.
    let (euid, egid) = unsafe { (libc::geteuid(), libc::getegid()) };
    let (cur_uid, cur_gid) = owner_of(idx);
    if euid != 0 {
        let uid_ok = uid == u32::MAX || uid == cur_uid;
        let gid_ok = gid == u32::MAX || gid == cur_gid || gid == egid || in_groups(gid);
        if cur_uid != euid || !uid_ok || !gid_ok {
            return Err(libc::EPERM);
        }
    }
    TABLE.with(|t| {
        if let Some(Some(s)) = t.slots.get_mut((idx & !OUT_DIR) as usize) {
            if uid != u32::MAX {
                s.owner.0 = uid;
            }
            if gid != u32::MAX {
                s.owner.1 = gid;
            }
            if uid != u32::MAX || gid != u32::MAX {
                s.mode = wire::mode_without_privs(s.mode);
            }
        }
    });
    Ok(())
}

/// True if `gid` is one of this process's supplementary groups.
fn in_groups(gid: u32) -> bool {
    let mut groups = [0 as libc::gid_t; 256];
    // SAFETY: groups has room for the 256 entries we say.
    let n = unsafe { libc::getgroups(groups.len() as c_int, groups.as_mut_ptr()) };
    n > 0 && groups[..n as usize].contains(&gid)
}

/// [`open_fd_of`] with the output's slot index.
pub fn open_slot_of(path: &[u8]) -> Option<(c_int, u32)> {
    let max = MAX_FD.load(Ordering::Relaxed);
    if max < 0 {
        return None;
    }
    let idx = TABLE.with(|t| {
        t.live().iter().position(|s| s.as_ref().is_some_and(|s| s.refs > 0 && !s.unlinked && s.mode & libc::S_IFMT == libc::S_IFREG && s.path == path))
    })?;
    let fd = (0..=max).find(|&fd| fd_table::get(fd) == Some(Tracked::Output(idx as u32)))?;
    Some((fd, idx as u32))
}

/// rename (`to` = Some) or unlink (None) of an output this process is still
/// writing: the pending commit goes to the new name, or is dropped. False if
/// no output of this process is open at `from`.
pub fn retarget(from: &[u8], to: Option<&[u8]>) -> bool {
    let mut new = to.map(|t| t.to_vec());
    let found = TABLE.with(|t| {
        let Some(s) = t.live().iter_mut().flatten().find(|s| s.mode & libc::S_IFMT == libc::S_IFREG && s.path == from) else {
            return None;
        };
        match new.as_mut() {
            Some(n) => std::mem::swap(&mut s.path, n),
            None => s.unlinked = true,
        }
        let excl = s.excl;
        s.excl &= new.is_none(); // renamed: its exclusive claim stays with the old name
        Some(excl)
    });
    drop(new);
    if found == Some(true) {
        if let Some(st) = crate::state::current() {
            crate::pending::release(st, from);
        }
    }
    found.is_some()
}

/// A directory renamed by this process: the outputs it is still writing
/// below `from` are committed below `to`, and its open output directories
/// (fds, cwd) there are named by their new path, as a native rename leaves
/// open files and a cwd inside the moved tree.
pub fn moved_dir(from: &[u8], to: &[u8]) {
    let below = |p: &[u8]| p.starts_with(from) && p.get(from.len()) == Some(&b'/');
    let mut start = 0;
    loop {
        // Find the next slot below `from` (its path copied to the stack: no
        // allocation under the lock), then build its new path outside.
        let mut old = [0u8; fanstore_core::path::MAX_PATH];
        let found = TABLE.with(|t| {
            let (i, s) = t.live().iter().enumerate().skip(start).find_map(|(i, s)| s.as_ref().filter(|s| below(&s.path)).map(|s| (i, s)))?;
            let n = s.path.len().min(old.len());
            old[..n].copy_from_slice(&s.path[..n]);
            Some((i, n))
        });
        let Some((i, n)) = found else { return };
        let mut new = [to, &old[from.len()..n]].concat();
        TABLE.with(|t| {
            if let Some(Some(s)) = t.slots.get_mut(i) {
                if s.path[..] == old[..n] {
                    std::mem::swap(&mut s.path, &mut new);
                }
            }
        });
        drop(new);
        start = i + 1;
    }
}

/// One tracked fd of output slot `idx` goes away; the slot if it was the last.
fn release(idx: u32) -> Option<Box<Slot>> {
    TABLE.with(|t| {
        let s = t.slots.get_mut(idx as usize)?;
        let last = match s {
            Some(x) => {
                x.refs = x.refs.saturating_sub(1);
                x.refs == 0
            }
            None => false,
        };
        if last {
            s.take()
        } else {
            None
        }
    })
}

/// Was output slot `idx` created by another process? (A child after fork,
/// or after vfork, where the memory is the parent's: nothing may change.)
pub fn is_foreign(idx: u32) -> bool {
    let me = pid();
    TABLE.with(|t| matches!(t.slots.get(idx as usize), Some(Some(s)) if s.pid != me))
}

/// `fd` (tracked as output slot `idx`) is about to be closed: commits the
/// output if this was its last fd. Returns the errno close must report.
pub fn closing(fd: c_int, idx: u32) -> Option<c_int> {
    if is_foreign(idx) {
        return None;
    }
    // Still the committed version's own file: nothing reached it.
    let lazy = fd_table::is_lazy(fd);
    fd_table::clear(fd);
    let slot = release(idx)?;
    if slot.unlinked || lazy {
        return None;
    }
    // (Loaded here if need be: a program exec'd with an output as its
    // stdout may never name a path under the mount.)
    let Some(st) = crate::state::state() else { return Some(libc::EIO) };
    let r = commit(st, fd, &slot).err();
    if slot.excl {
        crate::pending::release(st, &slot.path); // after the record exists
    }
    r
}

/// COMMIT: hands the output file to the daemon and waits for the owner's answer.
pub fn commit(st: &State, fd: c_int, s: &Slot) -> Result<(), c_int> {
    if unchanged(fd, s) {
        crate::dlog!("close of {}: unchanged copy, nothing to commit", crate::debug::B(&s.path));
        return Ok(());
    }
    let ro = read_only(fd);
    let mut flags = if s.excl { wire::COMMIT_EXCL } else { 0 };
    if s.late {
        flags |= wire::COMMIT_LATE;
    }
    match ro {
        Some((_, true)) => flags |= wire::COMMIT_SOLE,
        Some((_, false)) if s.made_ahead => flags |= wire::COMMIT_MADE_AHEAD,
        _ => {}
    }
    let req = crate::client::request(op::COMMIT, flags, s.mode as u64, &s.path);
    let r = crate::client::call(st, &req, Some(ro.map_or(fd, |(r, _)| r))).map(|_| ());
    if let Some((r, _)) = ro {
        // SAFETY: closing the fd read_only opened.
        unsafe { crate::real::close(r) };
    }
    crate::dlog!("commit of {} (sole {}) = {:?}", crate::debug::B(&s.path), flags & wire::COMMIT_SOLE != 0, r);
    if r.is_ok() && s.owner != NO_OWNER {
        // A chown while it was open: its mode already lost what chown drops.
        let what = wire::SETATTR_OWNER | wire::SETATTR_NOFOLLOW | wire::SETATTR_KEEP_MODE;
        let value = u64::from(s.owner.0) | u64::from(s.owner.1) << 32;
        return crate::client::call(st, &crate::client::request(op::SETATTR, what, value, &s.path), None).map(|_| ());
    }
    r
}

/// Before the commit of an unnamed output file whose last fd (as far as
/// this process knows) is `fd`: a read-only description of the file takes
/// the place of the writable one at `fd` (so the program's writable
/// description is gone, unless something else holds it), and a read lease
/// tells whether any process still has the file open for writing or mapped
/// writable (the kernel grants one only when none has). Returns that
/// read-only fd, to hand over and close, and true when the file had no
/// writer left: nothing can change its bytes any more (reachable only
/// through fds to it), so the daemon may serve reads from it as it is.
/// None for a sealable memfd (the daemon seals it, which needs it
/// writable) or when the file cannot be reopened.
///
/// A file the daemon made ahead may fail the lease only because the
/// daemon's own fd of it is not closed yet (it closes it just after its
/// reply): its commit says so (COMMIT_MADE_AHEAD) and the daemon checks
/// again once its fd is closed.
fn read_only(fd: c_int) -> Option<(c_int, bool)> {
    // SAFETY: fcntl queries on an fd of ours; no pointers.
    let seals = unsafe { crate::real::fcntl(fd, libc::F_GET_SEALS, 0) };
    if seals >= 0 && seals & libc::F_SEAL_SEAL == 0 {
        return None;
    }
    let mut path = *b"/proc/self/fd/\0\0\0\0\0\0\0\0\0\0\0\0";
    let digits = fd.to_string();
    path[14..14 + digits.len()].copy_from_slice(digits.as_bytes());
    // SAFETY: path is NUL-terminated (fd has at most 10 digits); the result is checked.
    let ro = unsafe { crate::real::open(path.as_ptr().cast(), libc::O_RDONLY | libc::O_CLOEXEC, 0) };
    if ro < 0 {
        return None;
    }
    // SAFETY: fcntl/dup3 on fds of ours; dup3 replaces what `fd` names
    // atomically, so the fd number stays taken for the caller's close.
    let replaced = unsafe {
        let cloexec = crate::real::fcntl(fd, libc::F_GETFD, 0) & libc::FD_CLOEXEC != 0;
        crate::real::dup3(ro, fd, if cloexec { libc::O_CLOEXEC } else { 0 }) >= 0
    };
    if !replaced {
        // SAFETY: closing the fd opened above.
        unsafe { crate::real::close(ro) };
        return None;
    }
    // SAFETY: lease commands on a read-only fd of ours (taken and given back).
    let sole = unsafe { crate::real::fcntl(ro, libc::F_SETLEASE, libc::F_RDLCK as libc::c_ulong) } == 0;
    if sole {
        // SAFETY: as above.
        unsafe { crate::real::fcntl(ro, libc::F_SETLEASE, libc::F_UNLCK as libc::c_ulong) };
    }
    Some((ro, sole))
}

/// Closing `lo..=hi`: commits the outputs whose last fd is among them.
pub fn closing_range(lo: u32, hi: u32) {
    let max = MAX_FD.load(Ordering::Relaxed);
    if max < 0 || lo > max as u32 {
        return;
    }
    for fd in lo..=hi.min(max as u32) {
        if let Some(Tracked::Output(idx)) = fd_table::get(fd as c_int) {
            let _ = closing(fd as c_int, idx);
        }
    }
}

/// Exit handler: flush stdio, then commit every output still open.
extern "C" fn at_exit() {
    // SAFETY: fflush(NULL) flushes every open output stream.
    unsafe { libc::fflush(std::ptr::null_mut()) };
    commit_all();
}

/// `_exit`: commits every output this process still has open, without
/// flushing stdio (its buffers are lost, as natively). A process that ends
/// with `_exit` leaves a file with the bytes it wrote, natively: dash ends
/// that way, so `sh -c 'cmd' 2> /fanstore/out/err` lost its file.
pub fn commit_all() {
    if MAX_FD.load(Ordering::Relaxed) < 0 {
        return;
    }
    let Some(_g) = crate::guard::Guard::enter() else { return };
    closing_range(0, u32::MAX);
}
