//! The bytes of outputs, client side: opening an output to read (a fd from
//! the daemon) or to write (a new file this process writes natively, handed
//! to the daemon at its last close), truncate, and output directory fds.
//! Names are asked of [`super::namespace`].

use super::attr::{DEV_MAJOR, DEV_MINOR};
use super::namespace::{dir_exists, lookup, lookup_creatable, real_dir, stat, stat_of, Found, RealDir, INPUT_HOLDER};
use crate::lookup::lookup_open;
use super::open_base::wants_write;
use super::{parent_of, Outcome, VPath};
use crate::client;
use crate::errno::errno;
use crate::fd_table::{self, Tracked};
use crate::state::State;
use super::out_file::{copy_bytes, new_memory_file, new_output_file, COPY_IN_MEMORY_MAX};
use fanstore_core::wire::{op, OutRecord};
use libc::c_int;



/// A read-only fd with the bytes of output `rel` (`flags`' O_CLOEXEC kept).
pub fn open_read(st: &State, rel: &[u8], flags: c_int) -> Result<c_int, c_int> {
    open_bytes(st, rel, flags, 0)
}

/// [`open_read`], `arg0` the request's (`wire::OUT_OPEN_TO_WRITE`).
fn open_bytes(st: &State, rel: &[u8], flags: c_int, arg0: u64) -> Result<c_int, c_int> {
    let a = client::call(st, &client::request(op::OUT_OPEN, arg0, 0, rel), None)?;
    let fd = a.fd.ok_or(libc::EIO)?;
    if flags & libc::O_CLOEXEC == 0 {
        // SAFETY: fcntl on the fd we just received.
        unsafe { crate::real::fcntl(fd, libc::F_SETFD, 0) };
    }
    Ok(fd)
}

/// An fd the daemon sent with a lookup, closed unless taken.
struct PendingFd(Option<c_int>);

impl PendingFd {
    fn take(&mut self) -> Option<c_int> {
        self.0.take()
    }
}

impl Drop for PendingFd {
    fn drop(&mut self) {
        if let Some(fd) = self.0 {
            // SAFETY: an fd the daemon sent us that nothing else holds.
            unsafe { crate::real::close(fd) };
        }
    }
}

/// open(2) for reading of committed output `rel` (record `r`): its fd
/// (`have`: the one its lookup brought, else asked with OUT_OPEN), tracked
/// so that fstat gives the identity stat of its path gives (cp refuses a
/// source whose fstat names another file: "replaced while being copied").
/// An fd the table has no room for stays untracked.
fn open_committed(st: &State, rel: &[u8], flags: c_int, r: &OutRecord, have: Option<c_int>) -> Result<c_int, c_int> {
    let fd = match have {
        Some(fd) => {
            if flags & libc::O_CLOEXEC == 0 {
                // SAFETY: fcntl on the fd we just received.
                unsafe { crate::real::fcntl(fd, libc::F_SETFD, 0) };
            }
            fd
        }
        None => open_read(st, rel, flags)?,
    };
    fd_table::set_committed(fd, r.mode, super::namespace::file_ino(rel, r));
    Ok(fd)
}

/// open(2) of a name that is not an input: an output (existing or new).
pub fn open(vp: &VPath, flags: c_int, mode: u32) -> Outcome<c_int> {
    if let Some((fd, idx)) = crate::outputs::open_slot_of(vp.rel) {
        if flags & libc::O_CREAT != 0 && flags & libc::O_EXCL != 0 {
            return Outcome::Errno(libc::EEXIST);
        }
        if vp.must_be_dir || flags & libc::O_DIRECTORY != 0 {
            return Outcome::Errno(libc::ENOTDIR);
        }
        return reopen_own(fd, idx, flags).into();
    }
    let st = vp.st;
    let creat = flags & libc::O_CREAT != 0;
    let write = wants_write(flags);
    // O_NOFOLLOW: a symlink as the last component is not followed (a
    // trailing '/' follows it all the same, as natively).
    let follow = flags & libc::O_NOFOLLOW == 0 || vp.must_be_dir;
    // With O_CREAT, a missing name's answer also says whether its directory
    // exists; an open for reading gets the bytes of a file in the same
    // round trip (kept in `bytes`, closed unless the open hands it out).
    // (An O_RDWR open that keeps the bytes copies them: the same fd serves.)
    let keeps_bytes = !write || (flags & libc::O_ACCMODE == libc::O_RDWR && flags & libc::O_TRUNC == 0);
    let reading = !creat && keeps_bytes && flags & (libc::O_PATH | libc::O_DIRECTORY) == 0 && !vp.must_be_dir;
    let mut bytes = PendingFd(None);
    // A file the daemon made ahead for a new output (closed unless used).
    let mut fresh = PendingFd(None);
    let found = if creat {
        lookup_creatable(st, vp.rel, follow).map_err(|m| {
            fresh.0 = m.new_file;
            (m.errno, m.dir)
        })
    } else if reading {
        lookup_open(st, vp.rel, follow).map(|(f, fd)| {
            bytes.0 = fd;
            f
        })
        .map_err(|e| (e, None))
    } else {
        lookup(st, vp.rel, follow).map_err(|e| (e, None))
    };
    let mut dir_known = None;
    let existing = match found {
        // O_NOFOLLOW on a symlink: ELOOP, as natively (ENOTDIR with
        // O_DIRECTORY, checked first). O_PATH has no fd for an output
        // symlink itself here: ELOOP too (documented).
        Ok(Found::Here { rec, .. }) if rec.is_link() && !follow => {
            return Outcome::Errno(if creat && flags & libc::O_EXCL != 0 {
                libc::EEXIST
            } else if flags & libc::O_DIRECTORY != 0 {
                libc::ENOTDIR
            } else {
                libc::ELOOP
            });
        }
        Ok(Found::Here { rec, .. }) => Some(rec),
        // A symlink to a file outside the mount: the kernel opens it.
        Ok(Found::Outside(abs)) => return open_outside(&abs, flags, mode),
        Err((libc::ENOENT, dir)) => {
            dir_known = dir;
            None
        }
        Err((e, _)) => return Outcome::Errno(e),
    };
    if write && existing.is_some_and(|r| r.holder == INPUT_HOLDER) {
        return Outcome::Errno(libc::EROFS); // an input, through a symlink
    }
    // Permission to open it as asked (the daemon checks its reads too).
    if let Some(r) = existing.filter(|_| !(creat && flags & libc::O_EXCL != 0)) {
        let want = match flags & libc::O_ACCMODE {
            libc::O_WRONLY => libc::W_OK,
            libc::O_RDWR => libc::R_OK | libc::W_OK,
            _ if flags & libc::O_TRUNC != 0 && !r.is_dir() => libc::R_OK | libc::W_OK,
            _ => libc::R_OK,
        };
        if flags & libc::O_PATH == 0 && !super::attr::may_access(&r, want as u32) {
            return Outcome::Errno(libc::EACCES);
        }
    }
    match existing {
        Some(_) if creat && flags & libc::O_EXCL != 0 => Outcome::Errno(libc::EEXIST),
        Some(r) if r.is_dir() => {
            if write {
                return Outcome::Errno(libc::EISDIR);
            }
            open_dir(vp, flags).map(|(fd, _)| fd).into()
        }
        Some(_) if vp.must_be_dir || flags & libc::O_DIRECTORY != 0 => Outcome::Errno(libc::ENOTDIR),
        // A FIFO or a socket: its real object ([`super::special`]).
        Some(r) if r.is_special() => super::special::open(st, &r, flags),
        Some(r) if write => {
            let keep = flags & libc::O_TRUNC == 0;
            let copied_from = (keep && r.holder != INPUT_HOLDER && r.sum != fanstore_core::wire::SUM_PENDING).then_some(r.sum);
            match (copied_from, bytes.take()) {
                (Some(sum), Some(src)) if copy_on_write(flags) => open_lazy(vp, flags, mode_after_write(r.mode), sum, src).into(),
                (_, have) => create(vp, flags, mode_after_write(r.mode), keep, copied_from, have, None).into(),
            }
        }
        Some(r) => open_committed(st, vp.rel, flags, &r, bytes.take()).into(),
        None if !creat => Outcome::Errno(libc::ENOENT),
        None if vp.must_be_dir => Outcome::Errno(libc::EISDIR),
        None => match dir_known.map_or_else(|| dir_exists(st, parent_of(vp.rel)), |e| if e == 0 { Ok(()) } else { Err(e) }) {
            // The mode asked for, less the process's umask, as the kernel makes it.
            Ok(()) => create(vp, flags, libc::S_IFREG | (mode & 0o7777 & !super::attr::umask()), false, None, None, fresh.take()).into(),
            Err(e) => Outcome::Errno(e),
        },
    }
}

/// Is an open with `flags` of an existing committed output served by its
/// read-only fd until the first write ([`super::lazy_copy`])? `O_RDWR`
/// alone: O_TRUNC changes the file at once, O_APPEND and O_WRONLY are
/// there to write, O_CREAT opens are left as they were (a shell's `<>`).
fn copy_on_write(flags: c_int) -> bool {
    flags & libc::O_ACCMODE == libc::O_RDWR && flags & (libc::O_CREAT | libc::O_TRUNC | libc::O_APPEND | libc::O_PATH) == 0
}

/// An `O_RDWR` open of committed output `vp` (checksum `sum`) whose
/// lookup brought `src`, a read-only fd on its bytes: that fd, tracked as
/// the output being written and marked lazy ([`super::lazy_copy`]).
fn open_lazy(vp: &VPath, flags: c_int, mode: u32, sum: u64, src: c_int) -> Result<c_int, c_int> {
    if flags & libc::O_CLOEXEC == 0 {
        // SAFETY: fcntl on the fd we just received.
        unsafe { crate::real::fcntl(src, libc::F_SETFD, 0) };
    }
    if flags & libc::O_NONBLOCK != 0 {
        // SAFETY: as above.
        unsafe { crate::real::fcntl(src, libc::F_SETFL, libc::O_NONBLOCK as libc::c_ulong) };
    }
    if !crate::outputs::track_lazy(src, vp.rel, mode, sum) {
        // SAFETY: closing the fd we received, which nothing else knows.
        unsafe { crate::real::close(src) };
        return Err(libc::EMFILE);
    }
    Ok(src)
}

/// The mode a file keeps once a process writes it: as the kernel's
/// `file_remove_privs`, a writer that is not root drops set-user-ID, and
/// set-group-ID when the group may execute (here at the open for writing).
fn mode_after_write(mode: u32) -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        return mode;
    }
    fanstore_core::wire::mode_without_privs(mode)
}

fn open_outside(abs: &[u8], flags: c_int, mode: u32) -> Outcome<c_int> {
    let Ok(c) = std::ffi::CString::new(abs) else { return Outcome::Errno(libc::ENOENT) };
    // SAFETY: c is NUL-terminated; a plain open of a path outside the mount.
    let fd = unsafe { crate::real::open(c.as_ptr(), flags, mode) };
    if fd < 0 {
        Outcome::Errno(errno())
    } else {
        Outcome::Handled(fd)
    }
}

/// truncate(2) of an output: an output this process is writing is cut in
/// place; a closed one is opened for writing with its bytes, cut, and closed
/// (committed as a new version: every node sees the new length).
pub fn truncate(vp: &VPath, len: i64) -> Outcome<c_int> {
    if len < 0 {
        return Outcome::Errno(libc::EINVAL);
    }
    if let Some(fd) = crate::outputs::open_fd_of(vp.rel) {
        if let Err(e) = super::lazy_copy::before_write(fd) {
            return Outcome::Errno(e);
        }
        // SAFETY: ftruncate of our own output file.
        return if unsafe { crate::real::ftruncate(fd, len) } == 0 { Outcome::Handled(0) } else { Outcome::Errno(errno()) };
    }
    match stat(vp.st, vp.rel) {
        Ok(r) if r.is_dir() => return Outcome::Errno(libc::EISDIR),
        Ok(r) if r.is_special() => return Outcome::Errno(libc::EINVAL), // as truncate(2) of a FIFO
        Ok(_) => {}
        Err(e) => return Outcome::Errno(e),
    }
    let fd = match open(vp, libc::O_WRONLY | libc::O_CLOEXEC, 0) {
        Outcome::Handled(fd) => fd,
        Outcome::Errno(e) => return Outcome::Errno(e),
        Outcome::Passthrough => return Outcome::Errno(libc::EIO),
    };
    // SAFETY: ftruncate of the output file we just opened.
    let cut = if unsafe { crate::real::ftruncate(fd, len) } == 0 { None } else { Some(errno()) };
    let committed = match fd_table::get(fd) {
        Some(Tracked::Output(idx)) if cut.is_none() => crate::outputs::closing(fd, idx),
        Some(Tracked::Output(idx)) => {
            // A failed cut changes nothing: drop the pending commit.
            let _ = crate::outputs::retarget(vp.rel, None);
            crate::outputs::closing(fd, idx)
        }
        _ => None,
    };
    // SAFETY: closing the fd we opened (its commit is done).
    unsafe { crate::real::close(fd) };
    match cut.or(committed) {
        None => Outcome::Handled(0),
        Some(e) => Outcome::Errno(e),
    }
}

/// Another open of an output this process is still writing (a lock file
/// opened twice, a writer reopening its file): a new description of the
/// same file (through /proc/self/fd, with the caller's access mode, O_APPEND
/// and O_TRUNC), tracked on the same slot, so the commit waits for its close.
fn reopen_own(fd: c_int, idx: u32, flags: c_int) -> Result<c_int, c_int> {
    // (Reopened as it is, a lazy fd's file would be the committed version's own.)
    super::lazy_copy::make_writable(fd)?;
    let path = fanstore_core::runtime::proc_fd_path(fd as u32);
    let f = flags & (libc::O_ACCMODE | libc::O_APPEND | libc::O_TRUNC | libc::O_CLOEXEC | libc::O_NONBLOCK);
    // SAFETY: path is NUL-terminated.
    let nfd = unsafe { crate::real::open(path.as_ptr().cast(), f, 0) };
    if nfd < 0 {
        return Err(errno());
    }
    if !fd_table::set(nfd, Tracked::Output(idx)) {
        // SAFETY: closing the fd we just opened.
        unsafe { crate::real::close(nfd) };
        return Err(libc::EMFILE);
    }
    crate::outputs::add_ref(nfd, idx);
    Ok(nfd)
}

/// Is the copy an O_RDWR open of committed bytes `src` needs small, and
/// the open unlikely to grow it much (not O_APPEND)? Then it is made in a
/// memfd: making one costs about 4 µs, where an unnamed file on the local
/// disk costs an inode (30-400 µs measured on this disk, by its block
/// group), paid again by a program that only reads it (mdtest's read
/// phase opens every file O_RDWR). Written, it is committed like any
/// output (the daemon copies a memfd to the local disk).
fn small_copy(src: c_int, flags: c_int) -> bool {
    if flags & libc::O_ACCMODE != libc::O_RDWR || flags & libc::O_APPEND != 0 {
        return false;
    }
    // SAFETY: plain data, zero is valid.
    let mut s: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: s is a valid out-pointer; fstat on any int is safe.
    unsafe { crate::real::fstat(src, &mut s) == 0 && s.st_size <= COPY_IN_MEMORY_MAX }
}

/// A new output file ([`new_output_file`]) tracked as output `vp.rel`;
/// with `keep`, it starts with the output's current bytes ("a", "r+" of an
/// existing output).
///
/// `copied_from`: the committed version's checksum when the file starts as
/// a copy of it (`keep`).
///
/// `have`: an fd with those bytes its lookup already brought (closed here).
///
/// `fresh`: an empty unnamed file the daemon made ahead for it
/// (`wire::STAT_NEW_FILE`), used instead of making one (closed if unused).
fn create(vp: &VPath, flags: c_int, mode: u32, keep: bool, copied_from: Option<u64>, have: Option<c_int>, fresh: Option<c_int>) -> Result<c_int, c_int> {
    let mut have = PendingFd(have);
    let mut fresh = PendingFd(fresh);
    let excl = flags & libc::O_CREAT != 0 && flags & libc::O_EXCL != 0;
    if excl {
        // Exclusive among the node's processes from now on ([`crate::pending`]);
        // a creator that committed just before the claim is seen here.
        crate::pending::claim(vp.st, vp.rel)?;
        if lookup(vp.st, vp.rel, false).is_ok() {
            crate::pending::release(vp.st, vp.rel);
            return Err(libc::EEXIST);
        }
    }
    let ahead = if keep || have.0.is_some() { None } else { fresh.take() };
    let made_ahead = ahead.is_some();
    let fd = match (ahead, &have.0) {
        (Some(f), _) => {
            // Made a while ago: its times become its creation's, now, as
            // those of a file open(O_CREAT) makes (pjdfstest open/00.t).
            // SAFETY: futimens with a null times pointer on the fd we hold.
            unsafe { libc::futimens(f, std::ptr::null()) };
            if flags & libc::O_CLOEXEC == 0 {
                // SAFETY: fcntl on the fd the daemon just sent us.
                unsafe { crate::real::fcntl(f, libc::F_SETFD, 0) };
            }
            f
        }
        (None, Some(src)) if keep && copied_from.is_some() && small_copy(*src, flags) => new_memory_file(flags),
        _ => new_output_file(vp.st, flags),
    };
    if fd < 0 {
        let e = errno();
        if excl {
            crate::pending::release(vp.st, vp.rel);
        }
        return Err(e);
    }
    let fail = |e: c_int| {
        // SAFETY: closing the file we created.
        unsafe { crate::real::close(fd) };
        if excl {
            crate::pending::release(vp.st, vp.rel);
        }
        Err(e)
    };
    if keep {
        let src = match have.take().map_or_else(|| open_bytes(vp.st, vp.rel, libc::O_CLOEXEC, fanstore_core::wire::OUT_OPEN_TO_WRITE), Ok) {
            Ok(s) => s,
            Err(e) => return fail(e),
        };
        // SAFETY: plain data, zero is valid.
        let mut s: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: s is a valid out-pointer; fstat on any int is safe.
        let size = if unsafe { crate::real::fstat(src, &mut s) } == 0 { s.st_size } else { 1 << 20 };
        let copied = copy_bytes(src, fd, size);
        // SAFETY: closing our own fd.
        unsafe { crate::real::close(src) };
        if copied.is_err() {
            return fail(libc::EIO);
        }
    }
    if flags & libc::O_APPEND != 0 {
        // SAFETY: fcntl on our own output file.
        unsafe { crate::real::fcntl(fd, libc::F_SETFL, libc::O_APPEND as libc::c_ulong) };
    }
    if !crate::outputs::track(fd, vp.rel, flags & libc::O_EXCL != 0, mode) {
        return fail(libc::EMFILE);
    }
    if made_ahead {
        crate::outputs::mark_made_ahead(fd);
    }
    if let Some(sum) = copied_from {
        // A copy of a committed output: if nothing changes it before its
        // last close, there is nothing to commit (mdtest's read phase opens
        // every file O_RDWR and only reads it).
        crate::outputs::mark_pristine(fd, sum);
    }
    Ok(fd)
}

/// An fd standing for output directory `vp` (a real fd on the empty
/// directory, tracked as `OUT_DIR | slot`): (fd, node id). ENOENT/ENOTDIR
/// if `vp` is not an output directory.
pub fn open_dir(vp: &VPath, flags: c_int) -> Result<(c_int, u32), c_int> {
    let real = match real_dir(vp.st, vp.rel)? {
        RealDir::Output(p) => p,
        RealDir::Input(n) => return super::open_base::open_dir(vp.st, &n, flags).map(|fd| (fd, n.id())),
    };
    let node = crate::outputs::track_dir(&real).ok_or(libc::EMFILE)?;
    let f = libc::O_RDONLY | libc::O_DIRECTORY | (flags & (libc::O_CLOEXEC | libc::O_PATH));
    // SAFETY: empty_dir is a NUL-terminated path; plain open.
    let fd = unsafe { crate::real::open(vp.st.empty_dir.as_ptr(), f, 0) };
    if fd < 0 {
        let e = errno();
        crate::outputs::release_dir(node);
        return Err(e);
    }
    if !fd_table::set(fd, Tracked::Dir { node, pos: 0 }) {
        // SAFETY: closing the fd we just opened.
        unsafe { crate::real::close(fd) };
        crate::outputs::release_dir(node);
        return Err(libc::EMFILE);
    }
    Ok((fd, node))
}

/// Is `t` an output's file (being written, or a committed one opened)?
pub fn is_output(t: Tracked) -> bool {
    matches!(t, Tracked::Output(_) | Tracked::Committed { .. })
}

/// After a change of output `fd`'s mode bits made by the kernel (an access
/// ACL set through fsetxattr): the mode its commit registers is the file's
/// own again. Nothing for any other fd; errno is left as it was.
pub fn mode_from_file(fd: c_int) {
    let Some(Tracked::Output(idx)) = fd_table::get(fd) else { return };
    // SAFETY: plain data, zero is valid.
    let mut s: libc::stat = unsafe { std::mem::zeroed() };
    let saved = errno();
    // SAFETY: s is a valid out-pointer; fd is the caller's open output.
    if unsafe { crate::real::fstat(fd, &mut s) } == 0 {
        crate::outputs::set_mode(idx, s.st_mode);
    }
    crate::errno::set_errno(saved);
}

/// Forget `fd` if it is an output (used where an fd is replaced internally).
pub fn untrack(fd: c_int) {
    if let Some(Tracked::Output(_)) = fd_table::get(fd) {
        fd_table::clear(fd);
    }
}

/// fstat of an fd standing for an output directory, an output being
/// written or a committed output read (None: not one of those).
pub fn fd_stat(fd: c_int, t: Tracked) -> Option<Result<libc::stat, c_int>> {
    let slot = match t {
        // A committed output read: the real file's size and times under
        // the identity (device, inode, mode) that stat of its path gave.
        Tracked::Committed { perm } => {
            let alias = fd_table::alias(fd);
            // SAFETY: plain data, zero is valid.
            let mut s: libc::stat = unsafe { std::mem::zeroed() };
            // SAFETY: s is a valid out-pointer; fstat on any int is safe.
            if unsafe { crate::real::fstat(fd, &mut s) } != 0 {
                fd_table::clear(fd);
                return None;
            }
            // A close we did not see left the entry: the fd is another file now.
            if !fd_table::check_ino(fd, s.st_ino) {
                return None;
            }
            s.st_dev = libc::makedev(DEV_MAJOR, DEV_MINOR);
            s.st_ino = alias;
            s.st_mode = libc::S_IFREG | u32::from(perm);
            return Some(Ok(s));
        }
        Tracked::Dir { node, .. } if node & crate::outputs::OUT_DIR != 0 => node,
        // An output being written: the identity (device, inode, mode) that
        // stat of its path gives, size and times of the real file, so that
        // programs comparing the two (sqlite: "was the database moved?") agree.
        Tracked::Output(idx) => idx,
        _ => return None,
    };
    let st = crate::state::current()?;
    let mut buf = [0u8; fanstore_core::path::MAX_PATH];
    let n = crate::outputs::path_into(slot, &mut buf)?;
    Some(stat(st, &buf[..n]).map(|r| stat_of(st, &buf[..n], &r)))
}
