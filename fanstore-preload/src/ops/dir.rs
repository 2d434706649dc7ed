//! opendir/fdopendir/readdir/closedir/scandir/getdents64 on virtual directories.

use super::{resolve, Outcome, VPath};
use crate::dirstream::{entry_at, reclen, VDir};
use crate::fd_table::{self, Tracked};
use crate::ops::open::open_dir;
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
        Tracked::File(_) | Tracked::Output(_) => Outcome::Errno(libc::ENOTDIR),
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
/// fd's position. Returns the bytes written (0 at the end).
pub fn getdents64(fd: c_int, t: Tracked, buf: &mut [u8]) -> Outcome<isize> {
    let Tracked::Dir { node, pos } = t else { return Outcome::Errno(libc::ENOTDIR) };
    let Some(st) = state::current() else { return Outcome::Errno(libc::EBADF) };
    let Some(dir) = st.view.node(node) else { return Outcome::Errno(libc::EBADF) };
    let mut off = 0usize;
    let mut p = pos as u64;
    // Positions 0 and 1 are "." and ".."; from 2 on, walk the children once.
    let children = st.view.children(dir).skip((p.max(2) - 2) as usize);
    let mut children = children.peekable();
    loop {
        let e = if p < 2 {
            entry_at(st, &dir, p)
        } else {
            children.peek().map(|c| crate::dirstream::DirEnt {
                ino: super::stat::ino(c.id()),
                dtype: crate::dirstream::dtype(c),
                name: c.name(),
            })
        };
        let Some(e) = e else { break };
        let name = &e.name[..e.name.len().min(255)];
        let rl = reclen(name.len());
        if off + rl > buf.len() {
            if off == 0 {
                return Outcome::Errno(libc::EINVAL);
            }
            break;
        }
        let r = &mut buf[off..off + rl];
        r.fill(0);
        r[0..8].copy_from_slice(&e.ino.to_ne_bytes());
        r[8..16].copy_from_slice(&((p + 1) as i64).to_ne_bytes());
        r[16..18].copy_from_slice(&(rl as u16).to_ne_bytes());
        r[18] = e.dtype;
        r[19..19 + name.len()].copy_from_slice(name);
        off += rl;
        if p >= 2 {
            children.next();
        }
        p += 1;
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
