//! flock and lockf; fcntl's lock commands come here from hooks/fd.rs. On
//! an output or a virtual directory they act on the node's lock file of
//! its path (`crate::locks`); on anything else they are libc's.

use crate::locks;
use crate::real;
use libc::{c_int, off_t};

/// lockf(3) on a lock file: the range starts at `fd`'s offset, as lockf
/// says, expressed as an fcntl lock on the lock file.
fn lockf_on(fd: c_int, lock_fd: c_int, cmd: c_int, len: off_t) -> c_int {
    // SAFETY: lseek on the caller's fd, which only reads its offset.
    let start = unsafe { crate::real::lseek(fd, 0, libc::SEEK_CUR) };
    if start < 0 {
        return -1;
    }
    // SAFETY: plain data, zero is valid.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_whence = libc::SEEK_SET as i16;
    fl.l_start = start;
    fl.l_len = len;
    let (fcmd, ty) = match cmd {
        libc::F_LOCK => (libc::F_SETLKW, libc::F_WRLCK),
        libc::F_TLOCK => (libc::F_SETLK, libc::F_WRLCK),
        libc::F_ULOCK => (libc::F_SETLK, libc::F_UNLCK),
        libc::F_TEST => (libc::F_GETLK, libc::F_WRLCK),
        _ => {
            crate::errno::set_errno(libc::EINVAL);
            return -1;
        }
    };
    fl.l_type = ty as i16;
    // SAFETY: fl is a valid struct flock for the lock file's fcntl.
    let r = unsafe { crate::real::fcntl(lock_fd, fcmd, &mut fl as *mut libc::flock as libc::c_ulong) };
    if r == 0 && cmd == libc::F_TEST && fl.l_type != libc::F_UNLCK as i16 {
        // SAFETY: getpid has no preconditions.
        if fl.l_pid != unsafe { libc::getpid() } {
            crate::errno::set_errno(libc::EACCES);
            return -1;
        }
    }
    r
}

crate::hooks! {
    fn flock(fd: c_int, op: c_int) -> c_int {
        real::flock(locks::target(fd), op)
    }
    fn lockf(fd: c_int, cmd: c_int, len: off_t) -> c_int {
        match locks::target(fd) {
            t if t == fd => real::lockf(fd, cmd, len),
            t => lockf_on(fd, t, cmd, len),
        }
    }
    fn lockf64(fd: c_int, cmd: c_int, len: off_t) -> c_int {
        match locks::target(fd) {
            t if t == fd => real::lockf64(fd, cmd, len),
            t => lockf_on(fd, t, cmd, len),
        }
    }
}
