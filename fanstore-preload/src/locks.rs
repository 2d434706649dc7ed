//! Advisory locks (flock, fcntl record and OFD locks, lockf) on outputs and
//! virtual directories, shared by every process of a node.
//!
//! The fd a program holds for an output is its own private file (a memfd or
//! an unnamed file until the close commits it), and every virtual directory
//! fd is a descriptor of the same empty stand-in directory; locking either
//! directly would exclude nobody, or everybody. So a lock call on such an fd
//! is applied instead to a **lock file** of its path in the node's client
//! directory, `<local dir>/.client/locks/<xxh3 of the path, hex>`, opened
//! once per program fd (and duplicated with it, so a dup shares its flock
//! as it would natively). Closing the program's fd closes its lock fd: a
//! flock goes when its last description goes, and the process's POSIX
//! locks on the file go at the first close, as the kernel does for a file.
//!
//! Scope: the processes of one node exclude each other (they share the lock
//! directory); processes on different nodes do not (each node has its own).
//! Inputs are real files (extracted or copied per node) and keep the
//! kernel's own locks.

use crate::fd_table::{self, Tracked};
use crate::lock::Locked;
use libc::c_int;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

/// Program fds with a lock fd at the same time (per process).
const MAX: usize = 256;

/// (program fd, lock fd) pairs; -1 marks a free entry.
static TABLE: Locked<[(c_int, c_int); MAX]> = Locked::new([(-1, -1); MAX]);
/// Entries in use: close and dup skip the table while it is 0.
static USED: AtomicUsize = AtomicUsize::new(0);

/// The path (relative to the mount) a lock on `fd` is about, if it is an
/// output or a virtual directory.
fn lock_key(fd: c_int) -> Option<u64> {
    let mut buf = [0u8; fanstore_core::path::MAX_PATH];
    let len = match fd_table::get(fd)? {
        Tracked::Output(idx) => crate::outputs::path_into(idx, &mut buf)?,
        Tracked::Dir { node, .. } if node & crate::outputs::OUT_DIR != 0 => crate::outputs::path_into(node, &mut buf)?,
        Tracked::Dir { node, .. } => crate::paths::node_abs_path(crate::state::current()?, node, &mut buf)?,
        // (a committed output read: its fd's own lock, as before it was tracked)
        Tracked::File(_) | Tracked::Committed { .. } => return None,
    };
    let rel = &buf[..len];
    // Directories are hashed by absolute path and outputs by relative one:
    // the first byte ('/' or not) keeps the two apart.
    Some(fanstore_core::checksum::xxh3(rel))
}

fn open_lock_file(key: u64) -> Option<c_int> {
    let st = crate::state::current()?;
    let mut dir = st.local_dir.clone();
    dir.extend_from_slice(format!("/{}/locks", crate::state::CLIENT_DIR).as_bytes());
    let mut path = dir.clone();
    path.extend_from_slice(format!("/{key:016x}\0").as_bytes());
    dir.push(0);
    let open = || {
        // SAFETY: path is NUL-terminated; a plain open of our own lock file.
        unsafe { crate::real::open(path.as_ptr().cast(), libc::O_RDWR | libc::O_CREAT | libc::O_CLOEXEC, 0o600) }
    };
    let mut fd = open();
    if fd < 0 {
        // SAFETY: dir is NUL-terminated.
        unsafe { crate::real::mkdir(dir.as_ptr().cast(), 0o700) };
        fd = open();
    }
    (fd >= 0).then_some(fd)
}

/// The fd a lock call on `fd` acts on: its lock file's fd for an output or
/// a virtual directory, else `fd` itself.
pub fn target(fd: c_int) -> c_int {
    if !fd_table::any() {
        return fd;
    }
    if USED.load(Relaxed) > 0 {
        if let Some(l) = TABLE.with(|t| t.iter().find(|e| e.0 == fd).map(|e| e.1)) {
            return l;
        }
    }
    let Some(key) = lock_key(fd) else { return fd };
    let Some(l) = open_lock_file(key) else { return fd };
    let kept = TABLE.with(|t| match t.iter_mut().find(|e| e.0 < 0) {
        Some(e) => {
            *e = (fd, l);
            USED.fetch_add(1, Relaxed);
            true
        }
        None => false,
    });
    if kept {
        l
    } else {
        // SAFETY: closing the lock fd we just opened.
        unsafe { crate::real::close(l) };
        crate::dlog!("more than {MAX} locked fds: fd {fd} is locked on its own file");
        fd
    }
}

/// `fd` is being closed (or replaced by dup2): its lock fd goes with it.
pub fn forget(fd: c_int) {
    forget_range(fd, fd);
}

/// Every fd in `lo..=hi` is being closed.
pub fn forget_range(lo: c_int, hi: c_int) {
    if USED.load(Relaxed) == 0 {
        return;
    }
    let mut closing = [-1; MAX];
    let mut n = 0;
    TABLE.with(|t| {
        for e in t.iter_mut().filter(|e| e.0 >= lo && e.0 <= hi) {
            closing[n] = e.1;
            n += 1;
            *e = (-1, -1);
            USED.fetch_sub(1, Relaxed);
        }
    });
    for &l in &closing[..n] {
        // SAFETY: closing a lock fd this module opened and no longer lists.
        unsafe { crate::real::close(l) };
    }
}

/// After `new = dup(old)`: the new fd shares the old one's lock
/// description (a flock held through either is the same lock).
pub fn after_dup(old: c_int, new: c_int) {
    if new < 0 || USED.load(Relaxed) == 0 {
        return;
    }
    let Some(l) = TABLE.with(|t| t.iter().find(|e| e.0 == old).map(|e| e.1)) else { return };
    // SAFETY: duplicating our own lock fd.
    let nl = unsafe { crate::real::fcntl(l, libc::F_DUPFD_CLOEXEC, 0) };
    if nl < 0 {
        return;
    }
    let kept = TABLE.with(|t| match t.iter_mut().find(|e| e.0 < 0) {
        Some(e) => {
            *e = (new, nl);
            USED.fetch_add(1, Relaxed);
            true
        }
        None => false,
    });
    if !kept {
        // SAFETY: closing the duplicate we just made.
        unsafe { crate::real::close(nl) };
    }
}

/// Is `cmd` an fcntl lock command?
pub fn is_lock_cmd(cmd: c_int) -> bool {
    matches!(cmd, libc::F_SETLK | libc::F_SETLKW | libc::F_GETLK | libc::F_OFD_SETLK | libc::F_OFD_SETLKW | libc::F_OFD_GETLK)
}

pub fn fork_prepare() {
    TABLE.lock();
}

pub fn fork_release() {
    TABLE.unlock();
}
