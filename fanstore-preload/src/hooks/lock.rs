//! flock and lockf; fcntl's lock commands come here from hooks/fd.rs. On
//! an output or a virtual directory they act on the node's lock file of
//! its path (`crate::locks`, [`crate::ops::lock`]); on anything else they
//! are libc's.

use crate::errno::set_errno;
use crate::locks;
use crate::ops::lock;
use crate::real;
use libc::{c_int, off_t};

/// lockf on lock file `t` of `fd`: -1 with errno on failure.
fn lockf_on(fd: c_int, t: c_int, cmd: c_int, len: off_t) -> c_int {
    lock::lockf(fd, t, cmd, len).unwrap_or_else(|e| {
        set_errno(e);
        -1
    })
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
