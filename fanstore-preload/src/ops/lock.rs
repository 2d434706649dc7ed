//! lockf(3) where it acts on a lock file (an output's or a virtual
//! directory's, `crate::locks`): expressed as an fcntl lock on that file.

use crate::errno::errno;
use libc::{c_int, off_t};

/// lockf(`fd`, `cmd`, `len`) on lock file `lock_fd`: the range starts at
/// `fd`'s offset, as lockf says. The value lockf returns, or its errno.
pub fn lockf(fd: c_int, lock_fd: c_int, cmd: c_int, len: off_t) -> Result<c_int, c_int> {
    // SAFETY: lseek on the caller's fd, which only reads its offset.
    let start = unsafe { crate::real::lseek(fd, 0, libc::SEEK_CUR) };
    if start < 0 {
        return Err(errno());
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
        _ => return Err(libc::EINVAL),
    };
    fl.l_type = ty as i16;
    // SAFETY: fl is a valid struct flock for the lock file's fcntl.
    let r = unsafe { crate::real::fcntl(lock_fd, fcmd, &mut fl as *mut libc::flock as libc::c_ulong) };
    if r == -1 {
        return Err(errno());
    }
    if r == 0 && cmd == libc::F_TEST && fl.l_type != libc::F_UNLCK as i16 {
        // SAFETY: getpid has no preconditions.
        if fl.l_pid != unsafe { libc::getpid() } {
            return Err(libc::EACCES);
        }
    }
    Ok(r)
}
