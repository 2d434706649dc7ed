//! A minimal client of the daemon's socket, for the control CLI and the
//! benchmark client: connect, one request, one reply (with an optional fd),
//! every wait bounded by a timeout.

use fanstore_core::wire::{self, Reply, Request};
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
