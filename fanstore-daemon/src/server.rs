//! The unix socket clients and the control CLI talk to: SOCK_SEQPACKET at
//! `runtime/node-<rank>.sock`, peers checked with SO_PEERCRED: a daemon run
//! by root serves every uid (socket mode 0666; each connection acts as its
//! caller, [`Caller`]), any other daemon only its own uid (mode 0600). One thread per connection; every blocking call is a
//! poll with a short timeout so the threads notice a stop. A client that
//! goes away mid-request only ends its own connection thread.

use crate::inputs::client_reply::ClientReply;
use crate::comm::Command;
use crate::caller::Caller;
use crate::node::Node;
use fanstore_core::wire::{self, op, Reply, Request};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("socket path {0} is too long for a unix socket ({1} bytes, limit 107): use a shorter --runtime-dir")]
    PathTooLong(PathBuf, usize),
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// How often blocked threads look at the stop flag.
const POLL_MS: i32 = 200;

/// A bound, listening socket.
pub struct Listener {
    fd: OwnedFd,
    path: PathBuf,
}

impl Listener {
    /// Binds `path` (replacing a stale socket of an earlier run) with mode 0600.
    pub fn bind(path: &Path) -> Result<Listener, ServerError> {
        let io = |what, source| ServerError::Io { what, path: path.to_path_buf(), source };
        let bytes = path.as_os_str().as_bytes();
        // SAFETY: sockaddr_un is plain data; zero is a valid initial value.
        let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
        if bytes.len() >= addr.sun_path.len() {
            return Err(ServerError::PathTooLong(path.to_path_buf(), bytes.len()));
        }
        addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
        for (d, s) in addr.sun_path.iter_mut().zip(bytes) {
            *d = *s as libc::c_char;
        }
        // SAFETY: plain socket creation; the result is checked.
        let raw = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) };
        if raw < 0 {
            return Err(io("creating socket", io::Error::last_os_error()));
        }
        // SAFETY: raw is a new fd that we own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        match std::fs::remove_file(path) {
            Ok(()) => log::warn!("removed a stale socket at {}", path.display()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io("removing stale socket", e)),
        }
        let len = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
        // SAFETY: addr is a valid sockaddr_un of `len` bytes.
        if unsafe { libc::bind(fd.as_raw_fd(), &addr as *const _ as *const libc::sockaddr, len) } != 0 {
            return Err(io("binding", io::Error::last_os_error()));
        }
        std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(crate::caller::shared_mode(0o666, 0o600)))
            .map_err(|e| io("chmod", e))?;
        // SAFETY: fd is a bound socket.
        if unsafe { libc::listen(fd.as_raw_fd(), 128) } != 0 {
            return Err(io("listening on", io::Error::last_os_error()));
        }
        Ok(Listener { fd, path: path.to_path_buf() })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Waits up to POLL_MS for `fd` to be readable. Ok(false) on timeout.
fn readable(fd: RawFd) -> io::Result<bool> {
    let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    // SAFETY: p is one valid pollfd.
    let r = unsafe { libc::poll(&mut p, 1, POLL_MS) };
    if r < 0 {
        let e = io::Error::last_os_error();
        return if e.kind() == io::ErrorKind::Interrupted { Ok(false) } else { Err(e) };
    }
    Ok(r > 0)
}

/// The credentials of the process at the other end of `fd` (effective ids
/// at its `connect`), with its pid.
fn peer_cred(fd: RawFd) -> io::Result<libc::ucred> {
    // SAFETY: ucred is plain data.
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: cred and len are valid out pointers of the right size.
    let r = unsafe { libc::getsockopt(fd, libc::SOL_SOCKET, libc::SO_PEERCRED, &mut cred as *mut _ as *mut _, &mut len) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(cred)
}

/// Who a new connection acts for. A daemon run by root serves every uid
/// (its permission checks are the kernel's: [`Caller`]); any other daemon
/// only its own user's processes (None: refused).
fn caller_of(cred: &libc::ucred, me: u32) -> Option<Caller> {
    if me != 0 && cred.uid != me {
        return None;
    }
    // Root needs no groups: it passes every check that would ask.
    let groups = if cred.uid == 0 { Vec::new() } else { Caller::groups_of(cred.pid) };
    Some(Caller { uid: cred.uid, gid: cred.gid, groups })
}

/// Accepts connections until the node stops; one thread per connection.
pub fn serve(listener: Listener, node: Arc<Node>) {
    // SAFETY: geteuid cannot fail.
    let me = unsafe { libc::geteuid() };
    let mut out_of_fds = false;
    while !node.rank.stopping.load(Relaxed) {
        match readable(listener.fd.as_raw_fd()) {
            Ok(false) => continue,
            Ok(true) => {}
            Err(e) => {
                log::error!("rank {}: polling the socket: {e}", node.rank.id.rank);
                std::thread::sleep(std::time::Duration::from_millis(POLL_MS as u64));
                continue;
            }
        }
        // SAFETY: accept4 on our listening socket; null address pointers are allowed.
        let raw = unsafe { libc::accept4(listener.fd.as_raw_fd(), std::ptr::null_mut(), std::ptr::null_mut(), libc::SOCK_CLOEXEC) };
        if raw < 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error().is_some_and(crate::fdlimit::exhausted) {
                // The connection waits in the backlog: free what we can and
                // try again shortly instead of spinning on a readable socket.
                if !out_of_fds {
                    log::warn!("rank {}: accepting a connection: {e} (retrying)", node.rank.id.rank);
                    out_of_fds = true;
                }
                node.rank.relieve_fds();
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            continue; // EAGAIN/ECONNABORTED/EINTR: the next poll decides
        }
        out_of_fds = false;
        // SAFETY: raw is a new connected socket that we own.
        let conn = unsafe { OwnedFd::from_raw_fd(raw) };
        let caller = match peer_cred(conn.as_raw_fd()) {
            Ok(cred) => match caller_of(&cred, me) {
                Some(c) => c,
                None => {
                    log::warn!("rank {}: refused a connection from uid {}", node.rank.id.rank, cred.uid);
                    node.rank.counters.errors.fetch_add(1, Relaxed);
                    continue;
                }
            },
            Err(e) => {
                log::warn!("rank {}: SO_PEERCRED: {e}", node.rank.id.rank);
                continue;
            }
        };
        node.rank.counters.clients.fetch_add(1, Relaxed);
        let node = node.clone();
        let spawned = std::thread::Builder::new().name("fanstore-conn".into()).spawn(move || connection(conn, &node, &caller));
        if let Err(e) = spawned {
            log::error!("spawning a connection thread: {e}");
        }
    }
}

fn connection(conn: OwnedFd, node: &Node, caller: &Caller) {
    let fd = conn.as_raw_fd();
    let mut buf = vec![0u8; wire::MAX_MESSAGE];
    let mut spin = false;
    let mut policy = wire::SpinPolicy::default();
    while !node.rank.stopping.load(Relaxed) {
        // Right after a request, the client's next one often comes within
        // microseconds (mdtest, a tar, a checkpoint directory): asked for
        // again and again, not slept for (see NEXT_REQUEST_SPIN), while
        // that finds them.
        let spun = match (spin && policy.should_spin()).then(|| wire::spin_recv_msg(fd, &mut buf, NEXT_REQUEST_SPIN)) {
            Some(Ok(r)) => {
                policy.spun(r.is_some());
                r
            }
            Some(Err(_)) => return,
            None => None,
        };
        spin = false;
        let got = match spun {
            Some(r) => Ok(r),
            None => {
                match readable(fd) {
                    Ok(false) => continue,
                    Ok(true) => {}
                    Err(_) => return,
                }
                wire::recv_msg(fd, &mut buf)
            }
        };
        let (n, attached) = match got {
            Ok((0, _)) => return, // peer closed
            Ok(r) => r,
            Err(e) => {
                log::debug!("rank {}: client connection: {e}", node.rank.id.rank);
                return;
            }
        };
        let req = match Request::decode(&buf[..n]) {
            Ok(r) => r,
            Err(e) => {
                log::warn!("rank {}: dropping a client that sent a bad message: {e}", node.rank.id.rank);
                return;
            }
        };
        if wire::op::is_watch(req.op) {
            return crate::outputs::watch::session(&node.outputs, fd, req, attached); // until the watcher goes away
        }
        if req.op != wire::op::STATUS {
            node.rank.counters.client_requests.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        if handle(node, fd, &req, attached, caller).is_err() {
            return; // the client went away mid-request
        }
        spin = true;
    }
}

/// How long a connection thread asks for the client's next request before
/// it sleeps in poll: a wake-up on this kind of VM costs ~40 µs
/// (`crate::wake_cost`), more than most requests.
const NEXT_REQUEST_SPIN: std::time::Duration = std::time::Duration::from_micros(50);

fn done(fd: RawFd, req: &Request, r: Result<(), i32>) -> io::Result<()> {
    let rep = match r {
        Ok(()) => Reply::ok(req, 0),
        Err(e) => Reply::err(req, e),
    };
    wire::send_msg(fd, &rep.encode(), None)
}

fn handle(node: &Node, fd: RawFd, req: &Request, attached: Option<OwnedFd>, caller: &Caller) -> io::Result<()> {
    let path = &req.payload[..];
    match req.op {
        op::COMMIT => {
            let r = match attached {
                Some(file) => node.outputs.commit(path, file, req.arg0, req.arg1 as u32, caller),
                None => Err(libc::EINVAL),
            };
            done(fd, req, r)
        }
        op::CKPT_PUT => {
            let r = match attached {
                Some(file) => node.outputs.ckpt_put(path, file, req.arg0, req.arg1 as u32, caller),
                None => Err(libc::EINVAL),
            };
            let (r, commit) = match r {
                Ok((hashes, commit)) => (Ok(hashes), Some(commit)),
                Err(e) => (Err(e), None),
            };
            let sent = r.and_then(|hashes| {
                let m = crate::memfd::MemfdBuilder::unmapped("fanstore:unit-hashes", hashes.len() as u64 * 32).map_err(|_| libc::ENOMEM)?;
                m.write_at(&hashes.concat(), 0).map_err(|_| libc::EIO)?;
                Ok((m.seal().map_err(|_| libc::EIO)?, hashes.len() as u64))
            });
            let replied = match sent {
                Ok((file, n)) => {
                    let mut r = Reply::ok(req, n);
                    r.flags = wire::FLAG_FD;
                    wire::send_msg(fd, &r.encode(), Some(file.as_raw_fd()))
                }
                Err(e) => done(fd, req, Err(e)),
            };
            // The store commit runs behind the reply (its readers wait for it).
            if let Some(c) = commit {
                c.run();
            }
            replied
        }
        op::OUT_STAT => {
            node.rank.counters.names_asked.fetch_add(1, Relaxed);
            // `ahead`: the inode of a file made ahead, closed here once sent.
            let (answer, file, ahead) = if req.arg0 & wire::STAT_OPEN != 0 {
                let (answer, file) = node.outputs.out_stat_open(path, req.arg0, caller);
                (answer, file, None)
            } else {
                let answer = node.outputs.out_stat_answer(path, req.arg0, caller);
                // A name free to create, in a directory that can hold it:
                // the file for its bytes, made ahead.
                let free = matches!(&answer, Err((libc::ENOENT, dir)) if dir.as_slice() == [0, 0, 0, 0]);
                let file = if free && req.arg0 & wire::STAT_NEW_FILE != 0 {
                    node.outputs.new_files.get().and_then(|p| p.take((caller.uid, caller.gid)))
                } else {
                    None
                };
                if file.is_some() {
                    node.rank.counters.files_ahead.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                let (file, ahead) = file.map_or((None, None), |(f, ino)| (Some(f), Some(ino)));
                (answer, file, ahead)
            };
            let mut r = match answer {
                Ok(payload) => Reply { payload, ..Reply::ok(req, 0) },
                Err((errno, payload)) => Reply { payload, ..Reply::err(req, errno) },
            };
            if file.is_some() {
                r.flags = wire::FLAG_FD;
            }
            let sent = wire::send_msg(fd, &r.encode(), file.as_ref().map(|f| f.as_raw_fd()));
            if let (Some(f), Some(ino), Some(p)) = (file, ahead, node.outputs.new_files.get()) {
                p.handed_over(f, ino);
            }
            sent
        }
        op::LINK => match path.iter().position(|&b| b == 0) {
            Some(i) => done(fd, req, node.outputs.out_link(&path[..i], &path[i + 1..], caller)),
            None => done(fd, req, Err(libc::EINVAL)),
        },
        op::SYMLINK => match path.iter().position(|&b| b == 0) {
            Some(i) => done(fd, req, node.outputs.out_symlink(&path[..i], &path[i + 1..], caller)),
            None => done(fd, req, Err(libc::EINVAL)),
        },
        op::OUT_OPEN => match node.outputs.out_open(path, req.arg0 & wire::OUT_OPEN_TO_WRITE != 0, caller) {
            Ok(file) => {
                let mut r = Reply::ok(req, 0);
                r.flags = wire::FLAG_FD;
                wire::send_msg(fd, &r.encode(), Some(file.as_raw_fd()))
            }
            Err(e) => done(fd, req, Err(e)),
        },
        op::OUT_LIST => {
            node.rank.counters.names_asked.fetch_add(1, Relaxed);
            match node.outputs.out_list(path, req.arg0) {
                Ok(mut r) => {
                    r.op = req.op;
                    r.id = req.id;
                    wire::send_msg(fd, &r.encode(), None)
                }
                Err(e) => done(fd, req, Err(e)),
            }
        }
        op::MKDIR => done(fd, req, node.outputs.out_mkdir(path, req.arg1 as u32, caller)),
        op::MKNOD => match node.outputs.out_mknod(path, req.arg1 as u32, req.arg0 & wire::MKNOD_BIND != 0, req.arg0 >> wire::MKNOD_RDEV_SHIFT, caller) {
            Ok((id, real)) => wire::send_msg(fd, &Reply { payload: real, ..Reply::ok(req, id) }.encode(), None),
            Err(e) => done(fd, req, Err(e)),
        },
        op::RMDIR => done(fd, req, node.outputs.out_rmdir(path, caller)),
        op::UNLINK => done(fd, req, node.outputs.out_unlink(path, caller)),
        op::SETATTR => done(fd, req, node.outputs.out_setattr(path, req.arg0, req.arg1, caller)),
        op::SYNC => {
            let Some(dir) = node.outputs.persist.get() else { return done(fd, req, Err(libc::EINVAL)) };
            let r = match req.arg0 {
                wire::SYNC_DATA => node.outputs.drain_data(dir),
                wire::SYNC_META => node.outputs.drain_meta(dir, true),
                _ => return done(fd, req, Err(libc::EINVAL)),
            };
            match r {
                Ok(n) => wire::send_msg(fd, &Reply::ok(req, n as u64).encode(), None),
                Err(e) => {
                    log::error!("rank {}: sync to {}: {e}", node.rank.id.rank, dir.display());
                    done(fd, req, Err(libc::EIO))
                }
            }
        }
        op::RENAME => match path.iter().position(|&b| b == 0) {
            Some(i) => done(fd, req, node.outputs.out_rename(&path[..i], &path[i + 1..], req.arg0 & wire::RENAME_NOREPLACE != 0, caller)),
            None => done(fd, req, Err(libc::EINVAL)),
        },
        op::CKPT => {
            let q = crate::outputs::dedup::Query::decode(req.arg0, req.arg1, path).and_then(|q| q.with_attachment(attached));
            let answer = match (node.outputs.dedup.get(), q) {
                (_, None) => Err(libc::EINVAL),
                (None, Some(_)) => Err(libc::ENOTSUP),
                (Some(d), Some(q)) => d.query(&q),
            };
            let sent = answer.and_then(|a| {
                let m = crate::memfd::MemfdBuilder::unmapped("fanstore:report", a.text.len() as u64).map_err(|_| libc::ENOMEM)?;
                m.write_at(a.text.as_bytes(), 0).map_err(|_| libc::EIO)?;
                Ok((m.seal().map_err(|_| libc::EIO)?, a.ok))
            });
            match sent {
                Ok((file, ok)) => {
                    let mut r = Reply::ok(req, u64::from(!ok));
                    r.flags = wire::FLAG_FD;
                    wire::send_msg(fd, &r.encode(), Some(file.as_raw_fd()))
                }
                Err(e) => done(fd, req, Err(e)),
            }
        }
        op::PING => wire::send_msg(fd, &Reply::ok(req, node.rank.id.rank as u64).encode(), None),
        op::WARM => {
            // One-way: queued for the background copier, no reply; dropped when it is behind.
            if req.arg1 == node.rank.view.dataset_id() {
                if let Some(tx) = node.inputs.warm.get() {
                    for id in wire::warm_ids(&req) {
                        node.rank.counters.warm_hints.fetch_add(1, Relaxed);
                        let _ = tx.try_send(id);
                    }
                }
            }
            Ok(())
        }
        op::WATCH_INFO => wire::send_msg(fd, &node.outputs.watch_info_reply(req).encode(), None),
        op::STATUS => {
            let mut r = Reply::ok(req, 0);
            r.payload = node.snapshot().render().into_bytes();
            r.payload.truncate(wire::MAX_MESSAGE - wire::HEADER_LEN);
            wire::send_msg(fd, &r.encode(), None)
        }
        op::STOP => {
            log::info!("rank {}: STOP requested by a client", node.rank.id.rank);
            let errno = if node.rank.comm.send(Command::Stop).is_ok() { 0 } else { libc::EIO };
            let r = if errno == 0 { Reply::ok(req, 0) } else { Reply::err(req, errno) };
            wire::send_msg(fd, &r.encode(), None)
        }
        op::OPEN => {
            // The communication thread may answer a remote file itself.
            let client = ClientReply::new(fd, Reply::ok(req, 0));
            let opened = node.inputs.open(req.arg0, req.arg1, Some(&client));
            if !client.claim_for_conn() {
                return Ok(());
            }
            match opened {
                Ok(Some(file)) => wire::send_msg(fd, client.ok_reply(), Some(file.as_raw_fd())),
                // (No fd is made only for a client the communication thread answered.)
                Ok(None) => wire::send_msg(fd, &Reply::err(req, libc::EIO).encode(), None),
                Err(errno) => wire::send_msg(fd, &Reply::err(req, errno).encode(), None),
            }
        }
        _ => wire::send_msg(fd, &Reply::err(req, libc::EINVAL).encode(), None),
    }
}
