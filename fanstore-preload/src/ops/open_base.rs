//! What the opens of inputs ([`super::open`]) and of outputs
//! ([`super::out`]) share, below both: whether an open's flags ask to
//! write, and the fd that stands for an input directory (an output name
//! may lead to one through a symlink).

use super::Node;
use crate::fd_table::{self, Tracked};
use crate::state::State;
use libc::c_int;

pub fn wants_write(flags: c_int) -> bool {
    flags & libc::O_ACCMODE != libc::O_RDONLY || flags & (libc::O_CREAT | libc::O_TRUNC) != 0
}

/// A real fd standing for directory node `n`.
pub fn open_dir(st: &State, n: &Node, flags: c_int) -> Result<c_int, c_int> {
    let f = libc::O_RDONLY | libc::O_DIRECTORY | (flags & (libc::O_CLOEXEC | libc::O_PATH));
    // SAFETY: empty_dir is a NUL-terminated path; plain open.
    let fd = unsafe { crate::real::open(st.empty_dir.as_ptr(), f, 0) };
    if fd < 0 {
        // SAFETY: reading this thread's errno.
        return Err(unsafe { *libc::__errno_location() });
    }
    if !fd_table::set(fd, Tracked::Dir { node: n.id(), pos: 0 }) {
        // SAFETY: closing the fd we just opened.
        unsafe { crate::real::close(fd) };
        return Err(libc::EMFILE);
    }
    Ok(fd)
}
