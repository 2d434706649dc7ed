//! opendir/fdopendir/readdir/closedir/scandir/getdents64 on virtual directories.

use super::{resolve, Outcome, VPath};
use super::dirstream::{reclen, VDir};
use super::open_base::open_dir;
use crate::fd_table::{self, Tracked};
use crate::state;
use libc::c_int;

/// opendir of a path under the mount: a VDir on a fresh real directory fd.
pub fn opendir(vp: &VPath) -> Outcome<Box<VDir>> {
    let n = match resolve(vp.st, vp.rel, true, true) {
        Ok(n) => n,
        Err(libc::ENOENT) => {
            return match super::out::open_dir(vp, libc::O_CLOEXEC) {
                Ok((fd, node)) => Outcome::Handled(VDir::new(fd, node)),
                Err(e) => Outcome::Errno(e),
            }
        }
        Err(e) => return Outcome::Errno(e),
    };
    match open_dir(vp.st, &n, libc::O_CLOEXEC) {
        Ok(fd) => Outcome::Handled(VDir::new(fd, n.id())),
        Err(e) => Outcome::Errno(e),
    }
}

/// fdopendir of a tracked fd: the stream takes ownership of the fd.
pub fn fdopendir(fd: c_int, t: Tracked) -> Outcome<Box<VDir>> {
    match t {
        Tracked::Dir { node, .. } => Outcome::Handled(VDir::new(fd, node)),
        Tracked::File(_) | Tracked::Output(_) | Tracked::Committed { .. } => Outcome::Errno(libc::ENOTDIR),
    }
}

/// closedir of one of our streams.
pub fn closedir(d: Box<VDir>) -> c_int {
    if let Some(Tracked::Dir { node, .. }) = fd_table::get(d.fd) {
        if node & crate::outputs::OUT_DIR != 0 {
            crate::outputs::release_dir(node);
        }
    }
    fd_table::clear(d.fd);
    // SAFETY: the stream owns its fd.
    unsafe { crate::real::close(d.fd) }
}

/// getdents64 on a tracked directory fd: linux_dirent64 records from the
/// fd's position, in readdir's order (".", "..", the inputs, then the
/// outputs listed in that directory; an output directory has only
/// outputs). Returns the bytes written (0 at the end). Raw getdents64
/// callers (rustix's `Dir`, caught by syscall user dispatch) see what
/// readdir sees.
pub fn getdents64(fd: c_int, t: Tracked, buf: &mut [u8]) -> Outcome<isize> {
    let Tracked::Dir { node, pos } = t else { return Outcome::Errno(libc::ENOTDIR) };
    let Some(st) = state::current() else { return Outcome::Errno(libc::EBADF) };
    if node & crate::outputs::OUT_DIR == 0 && st.view.node(node).is_none() {
        return Outcome::Errno(libc::EBADF);
    }
    let mut d = VDir::new(-1, node);
    d.seek(pos as u64);
    let mut off = 0usize;
    let mut p = pos as u64;
    while let Some(e) = d.next(st) {
        let name_len = e.d_name.iter().position(|&c| c == 0).unwrap_or(e.d_name.len());
        let rl = reclen(name_len);
        if off + rl > buf.len() {
            if off == 0 {
                return Outcome::Errno(libc::EINVAL);
            }
            break;
        }
        let r = &mut buf[off..off + rl];
        r.fill(0);
        r[0..8].copy_from_slice(&e.d_ino.to_ne_bytes());
        r[8..16].copy_from_slice(&e.d_off.to_ne_bytes());
        r[16..18].copy_from_slice(&(rl as u16).to_ne_bytes());
        r[18] = e.d_type;
        for (dst, &c) in r[19..19 + name_len].iter_mut().zip(&e.d_name[..name_len]) {
            *dst = c as u8;
        }
        off += rl;
        p = e.d_off as u64;
    }
    fd_table::set_pos(fd, node, p.min(u32::MAX as u64) as u32);
    Outcome::Handled(off as isize)
}

/// Entries of a directory as scandir sees them: ".", "..", then children.
pub fn for_each_entry(st: &state::State, node: u32, mut f: impl FnMut(&libc::dirent64)) {
    let Some(dir) = st.view.node(node) else { return };
    let mut d = VDir::new(-1, node);
    let _ = dir;
    while let Some(e) = d.next(st) {
        f(e);
    }
}
