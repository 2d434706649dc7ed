//! `O_CREAT | O_EXCL` among the processes of a node.
//!
//! An output has no record until its first close, so two processes that
//! create the same new name with O_EXCL would both succeed at open, and the
//! second would only learn of the first at its close (EEXIST from the
//! commit). Lock-file protocols (`filelock`, pid files) decide at open. So an
//! exclusive create also creates a **marker** of its path in the node's client
//! directory, `<local dir>/.client/pending/<xxh3 of the path, hex>`, with
//! O_EXCL and the creator's pid inside; a second exclusive create on the node
//! finds it and fails with EEXIST at open, as natively. The marker goes when
//! the output is committed (after its record exists), renamed or unlinked
//! while pending; one left by a dead process is taken over.
//!
//! Across nodes the owner rank still decides at the first close (EEXIST
//! from close for the later of two creators), as the README says.

use crate::errno::errno;
use crate::state::State;
use libc::c_int;

fn marker(st: &State, rel: &[u8]) -> Vec<u8> {
    let mut p = st.local_dir.clone();
    p.extend_from_slice(format!("/{}/pending/{:016x}\0", crate::state::CLIENT_DIR, fanstore_core::checksum::xxh3(rel)).as_bytes());
    p
}

/// The pid written in marker `m`, if it can be read.
fn holder(m: &[u8]) -> Option<i32> {
    // SAFETY: m is NUL-terminated; a plain read-only open of our marker.
    let fd = unsafe { crate::real::open(m.as_ptr().cast(), libc::O_RDONLY | libc::O_CLOEXEC, 0) };
    if fd < 0 {
        return None;
    }
    let mut buf = [0u8; 16];
    // SAFETY: buf is writable for its length.
    let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
    // SAFETY: closing the fd we opened.
    unsafe { crate::real::close(fd) };
    std::str::from_utf8(buf.get(..usize::try_from(n).ok()?)?).ok()?.trim().parse().ok()
}

/// Claims the exclusive create of `rel` on this node: EEXIST if a live
/// process of the node is creating it.
pub fn claim(st: &State, rel: &[u8]) -> Result<(), c_int> {
    let m = marker(st, rel);
    for _ in 0..3 {
        // SAFETY: m is NUL-terminated; an exclusive create of our marker.
        let fd = unsafe { crate::real::open(m.as_ptr().cast(), libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC, 0o600) };
        if fd >= 0 {
            // SAFETY: getpid has no preconditions.
            let pid = format!("{}\n", unsafe { libc::getpid() });
            // SAFETY: writing our pid into the marker we just created.
            unsafe { crate::real::write(fd, pid.as_ptr().cast(), pid.len()) };
            // SAFETY: closing the fd we opened.
            unsafe { crate::real::close(fd) };
            return Ok(());
        }
        match errno() {
            libc::ENOENT => {
                let dir = &m[..m.iter().rposition(|&b| b == b'/').unwrap_or(0)];
                let dir = [dir, b"\0"].concat();
                // SAFETY: dir is NUL-terminated.
                unsafe { crate::real::mkdir(dir.as_ptr().cast(), 0o700) };
            }
            // SAFETY: kill with signal 0 only checks that the process exists.
            libc::EEXIST => match holder(&m) {
                Some(pid) if pid > 0 && (unsafe { libc::kill(pid, 0) } == 0 || errno() == libc::EPERM) => return Err(libc::EEXIST),
                // A dead creator's marker (or one being written): take it over.
                _ => {
                    // SAFETY: m is NUL-terminated.
                    unsafe { crate::real::unlink(m.as_ptr().cast()) };
                }
            },
            e => return Err(e),
        }
    }
    Err(libc::EEXIST)
}

/// The exclusive create of `rel` is over (committed, renamed, unlinked or failed).
pub fn release(st: &State, rel: &[u8]) {
    let m = marker(st, rel);
    // SAFETY: m is NUL-terminated.
    unsafe { crate::real::unlink(m.as_ptr().cast()) };
}
