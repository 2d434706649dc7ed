//! FIFOs and unix sockets among outputs (MKNOD), and `mknod` of an empty
//! regular file.
//!
//! A special file is a real object on the node that made it, at
//! `<local dir>/out/<id>` beside the bytes of held outputs, with a sidecar
//! `out/<id>.rec` like any held output; its record (S_IFIFO or S_IFSOCK,
//! size 0, held by this rank) is kept at its owner like a file's. Naming
//! it by its output id means a rename moves only the record (and rewrites
//! the sidecar), while the FIFO a reader has open, or the socket a server
//! listens on, stays where it is. Unlink drops it as any held output
//! (`held_files::drop_held` removes `out/<id>`); kill -9 recovery moves
//! `out/` aside and registers every sidecar again, so the object and its
//! name come back (a socket's listener, a process of its own, keeps
//! listening: the kernel finds it by inode, and the rename keeps the inode).
//!
//! Processes open or connect to the real object only on the holder's node
//! (the client builds its path from the record: holder rank and id). What
//! the daemon must never do is open one for its bytes (an open of a FIFO
//! blocks until a writer comes): `open_held`, the drain and the peer
//! reads skip them.

use crate::caller::Caller;
use crate::outputs::names::now_ns;
use crate::outputs::Outputs;
use fanstore_core::checksum::xxh3;
use fanstore_core::wire::OutRecord;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::Ordering::Relaxed;

impl Outputs {
    /// MKNOD: output `path` becomes a FIFO, a unix socket (an unbound
    /// socket inode, or with `bind` nothing: the client binds at the
    /// returned path) or an empty file, per `mode`'s type bits; its
    /// permission bits are the record's. Returns (output id, real path).
    ///
    /// A character or block device (`rdev` its number; root only, EPERM
    /// otherwise) is a record alone: its `sum` holds the number, and no
    /// object is made (no device is opened through the mount).
    pub fn out_mknod(&self, path: &[u8], mode: u32, bind: bool, rdev: u64, caller: &Caller) -> Result<(u64, Vec<u8>), i32> {
        let kind = mode & libc::S_IFMT;
        let device = matches!(kind, libc::S_IFCHR | libc::S_IFBLK);
        if !(device || matches!(kind, libc::S_IFIFO | libc::S_IFSOCK | libc::S_IFREG)) || (bind && kind != libc::S_IFSOCK) {
            return Err(libc::EINVAL);
        }
        let (path, in_dir) = self.new_name(path)?;
        crate::outputs::namespace::may_add_in(caller, in_dir.as_ref())?;
        if device && !caller.is_root() {
            return Err(libc::EPERM);
        }
        let id = self.out_seq.fetch_add(1, Relaxed);
        if id >= crate::ids::OUT_BIT as u64 {
            return Err(libc::ENOSPC);
        }
        let dir = self.out_dir();
        std::fs::create_dir_all(&dir).map_err(|e| crate::fdio::io_errno(&e))?;
        let file = dir.join(id.to_string());
        if !bind && !device {
            make_object(&file, kind)?;
        }
        let now = now_ns();
        let sum = match kind {
            libc::S_IFREG => xxh3(b""),
            libc::S_IFCHR | libc::S_IFBLK => rdev,
            _ => 0,
        };
        let (gid, mode) = crate::outputs::namespace::inherited(caller, in_dir.as_ref(), kind | (mode & 0o7777));
        let (uid, ino) = (caller.uid, fanstore_core::wire::ino_of_path(&path));
        let rec = OutRecord { size: 0, mode, holder: self.rank.id.rank, id, sum, uid, gid, ino, ..Default::default() }.with_times(now, now);
        let registered = self.write_sidecar(&path, &rec).and_then(|()| self.put(&path, rec, true));
        if let Err(e) = registered {
            self.drop_held_here(id);
            return Err(e);
        }
        self.rank.counters.outputs.fetch_add(1, Relaxed);
        self.link(&path, rec.kind(), true)?;
        Ok((id, file.as_os_str().as_bytes().to_vec()))
    }
}

/// Makes the real object of a special output at `file`: readable and
/// writable by everyone, so that the record's mode alone says who may use
/// it (the daemon and its clients are one user; a root daemon serves all).
fn make_object(file: &std::path::Path, kind: u32) -> Result<(), i32> {
    let c = std::ffi::CString::new(file.as_os_str().as_bytes()).map_err(|_| libc::EINVAL)?;
    let perm = if kind == libc::S_IFSOCK { 0o777 } else { 0o666 };
    // SAFETY: c is a NUL-terminated path; mknod of a FIFO, a socket inode or
    // a regular file needs no privilege.
    let r = unsafe { libc::mknod(c.as_ptr(), kind | perm, 0) };
    if r != 0 {
        let e = std::io::Error::last_os_error();
        log::warn!("making {}: {e}", file.display());
        return Err(crate::fdio::io_errno(&e));
    }
    // SAFETY: as above (the umask took bits off).
    unsafe { libc::chmod(c.as_ptr(), perm) };
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use fanstore_core::wire;

    #[test]
    fn objects_are_made_with_open_permissions() {
        let d = tempfile::tempdir().unwrap();
        use std::os::unix::fs::{FileTypeExt, PermissionsExt};
        make_object(&d.path().join("f"), libc::S_IFIFO).unwrap();
        let m = std::fs::symlink_metadata(d.path().join("f")).unwrap();
        assert!(m.file_type().is_fifo());
        assert_eq!(m.permissions().mode() & 0o777, 0o666);
        make_object(&d.path().join("s"), libc::S_IFSOCK).unwrap();
        assert!(std::fs::symlink_metadata(d.path().join("s")).unwrap().file_type().is_socket());
        assert_eq!(make_object(&d.path().join("f"), libc::S_IFIFO), Err(libc::EIO));
        let fifo = OutRecord { mode: libc::S_IFIFO | 0o644, ..Default::default() };
        assert!(fifo.is_special() && fifo.kind() == wire::KIND_FIFO);
        let sock = OutRecord { mode: libc::S_IFSOCK | 0o755, ..Default::default() };
        assert!(sock.is_special() && sock.kind() == wire::KIND_SOCK);
        assert!(!OutRecord { mode: libc::S_IFREG | 0o644, ..Default::default() }.is_special());
    }
}
