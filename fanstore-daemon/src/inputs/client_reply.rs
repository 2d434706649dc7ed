//! Answering a client's remote OPEN from the communication thread.
//!
//! A remote OPEN crosses threads: the client's connection thread hands the
//! fetch to the communication thread, waits for the verified payload, writes
//! it into the copy, then answers the client. When the payload of an
//! uncompressed file lands in the very file the client will read (a spare
//! received into in place, or a copy file the communication thread writes
//! with one pwrite), and its checksum is the manifest's, the communication
//! thread answers the client itself: the connection thread's wake-up is off
//! the client's path. The connection thread still finishes the copy (links
//! it, keeps the spare) but sends nothing.
//!
//! Exactly one of the two threads answers; [`ClientReply`]'s state decides:
//!
//! ```text
//! PENDING --communication thread claims--> SENDING --sent--> SENT (the connection thread stays silent)
//!    |                                         \--failed--> PENDING (the connection thread answers)
//!    \--connection thread claims--> CONN (the communication thread stays silent)
//! ```
//!
//! The connection thread claims before it answers or gives the request up,
//! and as soon as it stops waiting for a fetch that may be answered (its
//! wait outlasts the communication thread's deadline by 2 s, past which the
//! communication thread answers nothing either); it waits out a SENDING. So
//! the communication thread touches the client's socket and the copy's file
//! (both the connection thread's own fds, not dups) only while the
//! connection thread still waits for it.
//!
//! ```
//! use fanstore_daemon::inputs::client_reply::ClientReply;
//! let r = ClientReply::new(-1, fanstore_core::wire::Reply::ok(&fanstore_core::wire::Request::new(2, 1, 0, 0), 0));
//! assert!(r.claim_for_conn()); // nobody answered: the connection thread does
//! assert!(!r.sent());
//! ```

use fanstore_core::wire::{self, Reply};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicU8, Ordering::AcqRel, Ordering::Acquire, Ordering::Release};
use std::sync::Arc;

const PENDING: u8 = 0;
const SENDING: u8 = 1;
const SENT: u8 = 2;
const CONN: u8 = 3;

/// One client OPEN that either thread may answer, once.
pub struct ClientReply {
    /// The client's connection (the connection thread's fd).
    sock: RawFd,
    /// The encoded success reply, sent with the file's fd.
    reply: Vec<u8>,
    state: AtomicU8,
}

/// What the communication thread needs to answer a fetch's client itself.
pub struct Direct {
    pub client: Arc<ClientReply>,
    /// The manifest's checksum of the payload.
    pub expected: u64,
    /// The copy's file when the payload is received into a buffer: the
    /// communication thread writes it there (the connection thread's fd).
    /// None when the payload is received into the copy's own pages.
    pub dest: Option<RawFd>,
}

impl ClientReply {
    /// `ok`: the success reply (the fd flag is set here).
    pub fn new(sock: RawFd, mut ok: Reply) -> Arc<ClientReply> {
        ok.flags |= wire::FLAG_FD;
        Arc::new(ClientReply { sock, reply: ok.encode(), state: AtomicU8::new(PENDING) })
    }

    /// The encoded success reply (sent with the file's fd), for whichever
    /// thread answers.
    pub fn ok_reply(&self) -> &[u8] {
        &self.reply
    }

    /// Whether the communication thread answered the client.
    pub fn sent(&self) -> bool {
        self.state.load(Acquire) == SENT
    }

    /// For the communication thread: unless the connection thread took the
    /// answer over, runs `file` (which makes the copy's file whole and
    /// returns its fd, or None) and sends the client a new read-only
    /// description of that file. Never blocks on the client. True if the
    /// client has its answer; else the connection thread answers.
    pub fn send_from_comm(&self, file: impl FnOnce() -> Option<RawFd>) -> bool {
        if self.state.compare_exchange(PENDING, SENDING, AcqRel, Acquire).is_err() {
            return false;
        }
        let ok = file().and_then(|f| crate::fdio::reopen_raw(f).ok()).is_some_and(|ro| {
            wire::try_send_msg(self.sock, &self.reply, Some(ro.as_raw_fd()))
                .map_err(|e| log::debug!("answering a client from the communication thread: {e}"))
                .is_ok()
        });
        self.state.store(if ok { SENT } else { PENDING }, Release);
        ok
    }

    /// For the connection thread, before it answers or gives the request
    /// up: takes the answer over. False if the communication thread sent it
    /// (waits out a send in progress).
    pub fn claim_for_conn(&self) -> bool {
        loop {
            match self.state.compare_exchange(PENDING, CONN, AcqRel, Acquire) {
                Ok(_) | Err(CONN) => return true,
                Err(SENT) => return false,
                Err(_) => std::thread::yield_now(),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fanstore_core::wire::{op, Request};
    use std::os::fd::{FromRawFd, OwnedFd};

    fn pair() -> (OwnedFd, OwnedFd) {
        let mut fds = [0; 2];
        // SAFETY: fds is a valid out-array of two ints.
        assert_eq!(unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0, fds.as_mut_ptr()) }, 0);
        // SAFETY: two fresh fds we own.
        unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
    }

    fn memfd(bytes: &[u8]) -> std::fs::File {
        use std::io::Write;
        // SAFETY: a NUL-terminated name; the fd returned is ours.
        let fd = unsafe { libc::memfd_create(c"t".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0);
        // SAFETY: fd is fresh.
        let mut f = unsafe { std::fs::File::from_raw_fd(fd) };
        f.write_all(bytes).unwrap();
        f
    }

    #[test]
    fn the_communication_thread_answers_once_and_the_connection_thread_stays_silent() {
        let (daemon, client) = pair();
        let req = Request::new(op::OPEN, 7, 1, 2);
        let r = ClientReply::new(daemon.as_raw_fd(), Reply::ok(&req, 0));
        let f = memfd(b"payload");
        assert!(r.send_from_comm(|| Some(f.as_raw_fd())));
        assert!(r.sent());
        // A second answer is refused, and the connection thread must not send.
        assert!(!r.send_from_comm(|| Some(f.as_raw_fd())));
        assert!(!r.claim_for_conn());
        let mut buf = vec![0u8; wire::MAX_MESSAGE];
        let (n, fd) = wire::recv_msg(client.as_raw_fd(), &mut buf).unwrap();
        let rep = Reply::decode(&buf[..n]).unwrap();
        assert_eq!((rep.id, rep.errno, rep.flags & wire::FLAG_FD), (7, 0, wire::FLAG_FD));
        let mut got = String::new();
        std::io::Read::read_to_string(&mut std::fs::File::from(fd.unwrap()), &mut got).unwrap();
        assert_eq!(got, "payload");
    }

    #[test]
    fn a_claim_by_the_connection_thread_keeps_the_communication_thread_out() {
        let (daemon, _client) = pair();
        let r = ClientReply::new(daemon.as_raw_fd(), Reply::ok(&Request::new(op::OPEN, 1, 0, 0), 0));
        assert!(r.claim_for_conn());
        let mut ran = false;
        assert!(!r.send_from_comm(|| {
            ran = true;
            None
        }));
        assert!(!ran, "the file was touched after the connection thread claimed the answer");
        assert!(r.claim_for_conn());
    }

    #[test]
    fn a_failed_answer_is_left_to_the_connection_thread() {
        let (daemon, client) = pair();
        let r = ClientReply::new(daemon.as_raw_fd(), Reply::ok(&Request::new(op::OPEN, 1, 0, 0), 0));
        // The file could not be made whole.
        assert!(!r.send_from_comm(|| None));
        assert!(!r.sent());
        // The client went away.
        drop(client);
        let f = memfd(b"x");
        assert!(!r.send_from_comm(|| Some(f.as_raw_fd())));
        assert!(r.claim_for_conn());
    }
}
