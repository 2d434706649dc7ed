//! A minimal client of the daemon's socket, for the control CLI
//! (`fanstore`, crate fanstore-cli) and the benchmark client: connect, one
//! request, one reply (with an optional fd), every wait bounded by a
//! timeout. It needs no MPI: anything that talks to a running job's
//! daemons can use it.
//!
//! ```no_run
//! use fanstore_core::client::Client;
//! use fanstore_core::runtime;
//! use fanstore_core::wire::{op, Request};
//! let rt = runtime::runtime_dir();
//! let mut c = Client::connect(&runtime::socket_path(&rt, 0), std::time::Duration::from_secs(5))?;
//! let (reply, _fd) = c.call(&Request::new(op::PING, 1, 0, 0))?;
//! println!("rank {} answered", reply.value);
//! # Ok::<(), std::io::Error>(())
//! ```

use crate::wire::{self, Reply, Request};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::Duration;

/// A connection to one daemon rank.
pub struct Client {
    fd: OwnedFd,
    buf: Vec<u8>,
}

impl Client {
    /// Connects to the socket at `path`; sends and receives time out after `timeout`.
    pub fn connect(path: &Path, timeout: Duration) -> io::Result<Client> {
        let bytes = path.as_os_str().as_bytes();
        // SAFETY: sockaddr_un is plain data.
        let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
        if bytes.len() >= addr.sun_path.len() {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "socket path too long"));
        }
        addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
        for (d, s) in addr.sun_path.iter_mut().zip(bytes) {
            *d = *s as libc::c_char;
        }
        // SAFETY: plain socket creation, checked.
        let raw = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: raw is a new fd we own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let tv = libc::timeval { tv_sec: timeout.as_secs() as libc::time_t, tv_usec: timeout.subsec_micros() as libc::suseconds_t };
        for opt in [libc::SO_RCVTIMEO, libc::SO_SNDTIMEO] {
            // SAFETY: tv is a valid timeval of the size given.
            unsafe {
                libc::setsockopt(fd.as_raw_fd(), libc::SOL_SOCKET, opt, &tv as *const _ as *const libc::c_void, std::mem::size_of_val(&tv) as libc::socklen_t)
            };
        }
        let len = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
        // SAFETY: addr is a valid sockaddr_un of `len` bytes.
        if unsafe { libc::connect(fd.as_raw_fd(), &addr as *const _ as *const libc::sockaddr, len) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Client { fd, buf: vec![0u8; wire::MAX_MESSAGE] })
    }

    /// The connection itself (a watcher keeps reading events from it).
    pub fn into_fd(self) -> OwnedFd {
        self.fd
    }

    /// Sends `req` and waits for its reply.
    pub fn call(&mut self, req: &Request) -> io::Result<(Reply, Option<OwnedFd>)> {
        self.call_with(req, None)
    }

    /// Sends `req` with `attach` (an fd passed along, SCM_RIGHTS) and waits for its reply.
    pub fn call_with(&mut self, req: &Request, attach: Option<std::os::fd::RawFd>) -> io::Result<(Reply, Option<OwnedFd>)> {
        wire::send_msg(self.fd.as_raw_fd(), &req.encode(), attach)?;
        let (n, fd) = wire::recv_msg(self.fd.as_raw_fd(), &mut self.buf)?;
        if n == 0 {
            return Err(io::Error::new(io::ErrorKind::ConnectionAborted, "the daemon closed the connection"));
        }
        let rep = Reply::decode(&self.buf[..n]).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        if rep.id != req.id {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "reply to another request"));
        }
        Ok((rep, fd))
    }
}

/// `path` relative to the mount root `mount`, without leading or trailing
/// '/' (and without `.` components): how paths travel to the daemons. A
/// path outside the mount is taken as relative to it already.
pub fn relative_to_mount(path: &str, mount: &str) -> Vec<u8> {
    let m = mount.trim_end_matches('/');
    let rest = if !m.is_empty() && (path == m || path.starts_with(&format!("{m}/"))) { &path[m.len()..] } else { path };
    let parts: Vec<&str> = rest.split('/').filter(|c| !c.is_empty() && *c != ".").collect();
    parts.join("/").into_bytes()
}

/// A sealed memfd holding `bytes` (`F_SEAL_WRITE | F_SEAL_GROW |
/// F_SEAL_SHRINK | F_SEAL_SEAL`), to attach to a request whose data can
/// exceed one message ([`Client::call_with`]). Written with pwrite, so its
/// offset, which the receiver shares, stays at 0.
pub fn sealed_memfd(name: &str, bytes: &[u8]) -> io::Result<OwnedFd> {
    use std::os::unix::fs::FileExt;
    let cname = std::ffi::CString::new(name).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    // SAFETY: cname is NUL-terminated; the flags are valid.
    let raw = unsafe { libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: raw is a new fd we own.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let f = std::fs::File::from(fd);
    f.write_all_at(bytes, 0)?;
    let fd = OwnedFd::from(f);
    let seals = libc::F_SEAL_WRITE | libc::F_SEAL_GROW | libc::F_SEAL_SHRINK | libc::F_SEAL_SEAL;
    // SAFETY: fd is a valid memfd created with MFD_ALLOW_SEALING.
    if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    #[test]
    fn paths_are_relative_to_the_mount() {
        assert_eq!(relative_to_mount("/fanstore/run/ck.pt", "/fanstore"), b"run/ck.pt");
        assert_eq!(relative_to_mount("/fanstore", "/fanstore"), b"");
        assert_eq!(relative_to_mount("run//./ck.pt/", "/fanstore"), b"run/ck.pt");
        assert_eq!(relative_to_mount("/fanstorex/a", "/fanstore"), b"fanstorex/a");
        assert_eq!(relative_to_mount("/data/a", "/data/"), b"a");
    }

    #[test]
    fn a_sealed_memfd_holds_its_bytes_and_refuses_writes() {
        let fd = sealed_memfd("test", b"keys").unwrap();
        // Read from where a receiver of the fd starts: its shared offset.
        let mut f = std::fs::File::from(fd);
        let mut got = Vec::new();
        f.read_to_end(&mut got).unwrap();
        assert_eq!(got, b"keys");
        use std::io::Write;
        assert!(f.write_all(b"x").is_err(), "sealed against writes");
    }
}
