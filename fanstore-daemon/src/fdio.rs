//! File-descriptor helpers every service uses: reopening an fd through
//! `/proc/self/fd` (a new open file description, so each OPEN has its own
//! offset over the same pages), naming an unnamed (`O_TMPFILE`) file with
//! `linkat`, and the plain read-only open and positional write the copies and
//! outputs share. Errors are errnos, ready for a client's reply.

use crate::fdlimit::errno_of;
use std::ffi::{CString, OsStr};
use std::fs::File;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// `/proc/self/fd/<fd>`: the path the kernel resolves to the file `fd` names.
pub fn proc_fd(fd: RawFd) -> PathBuf {
    let path = fanstore_core::runtime::proc_fd_path(fd as u32);
    let len = path.iter().position(|&b| b == 0).unwrap_or(path.len());
    PathBuf::from(OsStr::from_bytes(&path[..len]))
}

/// Opens a new read-only description of a cached memfd or file (through
/// /proc/self/fd), so every OPEN gets its own file offset while sharing the
/// same pages.
pub fn reopen(fd: &OwnedFd) -> Result<OwnedFd, i32> {
    reopen_raw(fd.as_raw_fd())
}

/// [`reopen`] of an fd the caller keeps open for the call.
pub fn reopen_raw(fd: RawFd) -> Result<OwnedFd, i32> {
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(proc_fd(fd))
        .map(OwnedFd::from)
        .map_err(|e| {
            log::error!("reopening a cached memfd: {e}");
            libc::EIO
        })
}

/// Gives the unnamed file `f` (`O_TMPFILE`) the name `name`: linkat of its
/// /proc/self/fd link with AT_SYMLINK_FOLLOW (open(2)). No copy.
pub fn link_unnamed(f: &File, name: &Path) -> std::io::Result<()> {
    let src = CString::new(proc_fd(f.as_raw_fd()).into_os_string().into_vec()).map_err(|_| einval())?;
    let dst = CString::new(name.as_os_str().as_bytes()).map_err(|_| einval())?;
    // SAFETY: both paths are NUL-terminated; AT_SYMLINK_FOLLOW links the file
    // the /proc link points to (our unnamed file).
    let r = unsafe { libc::linkat(libc::AT_FDCWD, src.as_ptr(), libc::AT_FDCWD, dst.as_ptr(), libc::AT_SYMLINK_FOLLOW) };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

fn einval() -> std::io::Error {
    std::io::Error::from_raw_os_error(libc::EINVAL)
}

/// Opens `path` read-only (O_NOATIME where allowed); the errno on failure.
pub fn open_ro(path: &Path) -> Result<OwnedFd, i32> {
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_CLOEXEC | libc::O_NOATIME)
        .open(path)
        .or_else(|e| match e.raw_os_error() {
            Some(libc::EPERM) => std::fs::OpenOptions::new().read(true).custom_flags(libc::O_CLOEXEC).open(path),
            _ => Err(e),
        })
        .map(OwnedFd::from)
        .map_err(|e| errno_of(&e))
}

/// Writes all of `bytes` at `offset`; the errno on failure.
pub fn write_all_at(f: &File, bytes: &[u8], offset: u64) -> Result<(), i32> {
    use std::os::unix::fs::FileExt;
    f.write_all_at(bytes, offset).map_err(|e| errno_of(&e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Seek, SeekFrom, Write};

    #[test]
    fn proc_fd_names_the_fd() {
        assert_eq!(proc_fd(7), PathBuf::from("/proc/self/fd/7"));
        assert_eq!(proc_fd(1234567), PathBuf::from("/proc/self/fd/1234567"));
    }

    #[test]
    fn a_reopened_fd_has_its_own_offset() {
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(b"hello").unwrap();
        f.seek(SeekFrom::Start(3)).unwrap();
        let mut again = File::from(reopen(&OwnedFd::from(f.try_clone().unwrap())).unwrap());
        let mut s = String::new();
        again.read_to_string(&mut s).unwrap();
        assert_eq!(s, "hello");
    }

    #[test]
    fn an_unnamed_file_gets_its_name() {
        let dir = tempfile::tempdir().unwrap();
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_TMPFILE)
            .open(dir.path())
            .unwrap();
        f.write_all(b"bytes").unwrap();
        link_unnamed(&f, &dir.path().join("named")).unwrap();
        assert_eq!(std::fs::read(dir.path().join("named")).unwrap(), b"bytes");
        let e = link_unnamed(&f, &dir.path().join("named")).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EEXIST));
    }
}

/// The errno for a failed write of an output's file: ENOSPC and EDQUOT as
/// they are, anything else EIO.
pub(crate) fn io_errno(e: &std::io::Error) -> i32 {
    match e.raw_os_error() {
        Some(libc::ENOSPC) => libc::ENOSPC,
        Some(libc::EDQUOT) => libc::EDQUOT,
        _ => libc::EIO,
    }
}
