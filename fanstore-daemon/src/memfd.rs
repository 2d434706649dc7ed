//! Sealed memfds: the fd a client receives for a compressed or remote file.
//!
//! A [`MemfdBuilder`] creates a memfd of the file's exact size
//! (`MFD_CLOEXEC | MFD_ALLOW_SEALING`), maps it writable so the bytes can be
//! received or decompressed straight into it, and [`MemfdBuilder::seal`]
//! unmaps it and adds `F_SEAL_WRITE | F_SEAL_GROW | F_SEAL_SHRINK |
//! F_SEAL_SEAL`: from then on nobody, the daemon included, can change it.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// A failed memfd operation, with the step that failed.
#[derive(Debug, thiserror::Error)]
pub enum MemfdError {
    #[error("memfd_create: {0}")]
    Create(io::Error),
    #[error("sizing a memfd to {size} bytes: {source}")]
    Size { size: u64, source: io::Error },
    #[error("mapping a memfd of {size} bytes: {source}")]
    Map { size: u64, source: io::Error },
    #[error("sealing a memfd: {0}")]
    Seal(io::Error),
}

/// A memfd being filled. Dropping it without sealing discards it.
pub struct MemfdBuilder {
    fd: OwnedFd,
    map: Option<memmap2::MmapMut>,
    size: u64,
}

impl MemfdBuilder {
    /// A memfd of exactly `size` bytes, mapped for writing, its pages
    /// allocated up front (one fault-free pass when the bytes are written).
    pub fn new(name: &str, size: u64) -> Result<MemfdBuilder, MemfdError> {
        Self::create(name, size, true)
    }

    /// A memfd of exactly `size` bytes with no mapping: fill it with
    /// [`write_at`](Self::write_at), after allocating its pages with a
    /// [`Preallocator`] (possibly from another thread, ahead of the bytes).
    pub fn unmapped(name: &str, size: u64) -> Result<MemfdBuilder, MemfdError> {
        let mut b = Self::create(name, 0, false)?;
        b.resize(size)?;
        Ok(b)
    }

    fn resize(&mut self, size: u64) -> Result<(), MemfdError> {
        let len = libc::off_t::try_from(size)
            .map_err(|_| MemfdError::Size { size, source: io::Error::from(io::ErrorKind::InvalidInput) })?;
        // SAFETY: fd is a valid memfd we own; it has no mapping.
        if unsafe { libc::ftruncate(self.fd.as_raw_fd(), len) } != 0 {
            return Err(MemfdError::Size { size, source: io::Error::last_os_error() });
        }
        self.size = size;
        Ok(())
    }

    /// Writes `bytes` at `offset` through the fd (the memfd keeps its size).
    pub fn write_at(&self, bytes: &[u8], offset: u64) -> io::Result<()> {
        if offset.checked_add(bytes.len() as u64).is_none_or(|e| e > self.size) {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "write past the end of the memfd"));
        }
        let mut done = 0usize;
        while done < bytes.len() {
            let rest = &bytes[done..];
            // SAFETY: rest is a live buffer of rest.len() bytes; fd is our memfd.
            let n = unsafe {
                libc::pwrite(self.fd.as_raw_fd(), rest.as_ptr().cast(), rest.len(), (offset + done as u64) as libc::off_t)
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            if n == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            done += n as usize;
        }
        Ok(())
    }

    /// Like [`new`](Self::new) but without allocating the pages: a
    /// [`Preallocator`] can allocate them from another thread while the
    /// bytes arrive (page allocation is as costly as the transfer on some
    /// machines, so it should not be on the critical path).
    pub fn new_lazy(name: &str, size: u64) -> Result<MemfdBuilder, MemfdError> {
        Self::create(name, size, false)
    }

    fn create(name: &str, size: u64, populate: bool) -> Result<MemfdBuilder, MemfdError> {
        let cname = CString::new(name.replace('\0', "_")).unwrap_or_default();
        // SAFETY: cname is a valid NUL-terminated string; the flags are valid
        // memfd_create flags. The returned fd (if >= 0) is new and ours.
        let raw = unsafe { libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
        if raw < 0 {
            return Err(MemfdError::Create(io::Error::last_os_error()));
        }
        // SAFETY: raw is a fresh fd that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let len = libc::off_t::try_from(size)
            .map_err(|_| MemfdError::Size { size, source: io::Error::from(io::ErrorKind::InvalidInput) })?;
        // SAFETY: fd is a valid memfd we own.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), len) } != 0 {
            return Err(MemfdError::Size { size, source: io::Error::last_os_error() });
        }
        let map = if size == 0 {
            None
        } else {
            let len = usize::try_from(size)
                .map_err(|_| MemfdError::Map { size, source: io::Error::from(io::ErrorKind::InvalidInput) })?;
            let mut opts = memmap2::MmapOptions::new();
            opts.len(len);
            if populate {
                opts.populate();
            }
            // SAFETY: the memfd is private to this builder until sealed, so no
            // other process or thread can resize it under the mapping.
            let m = unsafe { opts.map_mut(fd.as_raw_fd()) }
                .map_err(|source| MemfdError::Map { size, source })?;
            Some(m)
        };
        Ok(MemfdBuilder { fd, map, size })
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    /// A handle that allocates this memfd's pages through its own fd.
    pub fn preallocator(&self) -> Option<Preallocator> {
        self.fd.try_clone().ok().map(|fd| Preallocator { fd, size: self.size })
    }

    /// The file's bytes, writable until [`seal`](Self::seal).
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        self.map.as_deref_mut().unwrap_or(&mut [])
    }

    pub fn bytes(&self) -> &[u8] {
        self.map.as_deref().unwrap_or(&[])
    }

    /// Unmaps and seals the memfd; returns the read-only fd.
    pub fn seal(mut self) -> Result<OwnedFd, MemfdError> {
        // F_SEAL_WRITE is refused (EBUSY) while a writable shared mapping exists.
        drop(self.map.take());
        let seals = libc::F_SEAL_WRITE | libc::F_SEAL_GROW | libc::F_SEAL_SHRINK | libc::F_SEAL_SEAL;
        // SAFETY: fd is a valid memfd created with MFD_ALLOW_SEALING.
        if unsafe { libc::fcntl(self.fd.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
            return Err(MemfdError::Seal(io::Error::last_os_error()));
        }
        Ok(self.fd)
    }
}

/// Allocates a memfd's pages with fallocate, last MiB first, so that it meets
/// a writer going front to back in the middle. Touches no byte of the
/// file (fallocate leaves existing pages alone), so it is safe while another
/// thread or MPI writes into the memfd's mapping.
pub struct Preallocator {
    fd: OwnedFd,
    size: u64,
}

impl Preallocator {
    pub fn run(&self) {
        const STEP: u64 = 1 << 20;
        let mut end = self.size;
        while end > 0 {
            let start = end.saturating_sub(STEP);
            // SAFETY: fd is a valid memfd; fallocate within its size only
            // allocates missing pages (zeroed) and never changes data or size.
            let r = unsafe { libc::fallocate(self.fd.as_raw_fd(), 0, start as libc::off_t, (end - start) as libc::off_t) };
            if r != 0 {
                return; // best effort: faults allocate whatever is left
            }
            end = start;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Seek, Write};

    #[test]
    fn filled_sealed_and_immutable() {
        let mut b = MemfdBuilder::new("t", 5).unwrap();
        b.bytes_mut().copy_from_slice(b"hello");
        let fd = b.seal().unwrap();
        let mut f = std::fs::File::from(fd);
        let mut s = String::new();
        f.read_to_string(&mut s).unwrap();
        assert_eq!(s, "hello");
        f.rewind().unwrap();
        assert!(f.write_all(b"x").is_err(), "sealed memfd must refuse writes");
        assert!(f.set_len(1).is_err() && f.set_len(10).is_err());
        assert_eq!(f.metadata().unwrap().len(), 5);
        // SAFETY: f is a valid fd.
        let seals = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_GET_SEALS) };
        assert_ne!(seals & libc::F_SEAL_SEAL, 0);
    }

    #[test]
    fn preallocation_keeps_written_bytes() {
        let mut b = MemfdBuilder::new_lazy("lazy", 3 << 20).unwrap();
        b.bytes_mut()[..4].copy_from_slice(b"head");
        let p = b.preallocator().unwrap();
        p.run();
        let n = b.bytes().len();
        b.bytes_mut()[n - 4..].copy_from_slice(b"tail");
        assert_eq!(&b.bytes()[..4], b"head");
        assert!(b.bytes()[4..n - 4].iter().all(|&x| x == 0));
        drop(p);
        let f = std::fs::File::from(b.seal().unwrap());
        assert_eq!(f.metadata().unwrap().len(), 3 << 20);
    }

    #[test]
    fn unmapped_write_at() {
        let b = MemfdBuilder::unmapped("u", 10).unwrap();
        b.preallocator().unwrap().run();
        b.write_at(b"abc", 2).unwrap();
        assert!(b.write_at(b"abc", 8).is_err());
        let f = std::fs::File::from(b.seal().unwrap());
        let mut v = Vec::new();
        (&f).read_to_end(&mut v).unwrap();
        assert_eq!(v, b"\0\0abc\0\0\0\0\0");
    }

    #[test]
    fn empty_file() {
        let b = MemfdBuilder::new("empty", 0).unwrap();
        assert!(b.bytes().is_empty());
        let f = std::fs::File::from(b.seal().unwrap());
        assert_eq!(f.metadata().unwrap().len(), 0);
    }
}
