//! The connection to the node's daemon: a small pool of SOCK_SEQPACKET
//! connections (one request in flight per connection, so threads do not
//! serialise behind each other), every exchange bounded by socket timeouts.
//!
//! Fork: the prepare handler takes the pool lock; the child drops the
//! inherited connections (they are the parent's) and reconnects lazily.

use crate::lock::Locked;
use crate::state::{self, State};
use fanstore_core::wire::{self, op, Reply, Request};
use libc::c_int;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

const POOL_MAX: usize = 8;

/// Idle connections: (fd, socket inode, credentials). The inode is checked
/// before reuse, in case the program closed or replaced the fd behind our
/// back; the credentials ([`creds`]) too: the daemon acts for the ids a
/// connection was made with, so a program that changed its effective uid
/// or gid (pjdfstest's `-u`, a container's entry point dropping root)
/// gets a new connection.
struct Pool {
    fds: [(c_int, u64, u64); POOL_MAX],
    n: usize,
}

static POOL: Locked<Pool> = Locked::new(Pool { fds: [(-1, 0, 0); POOL_MAX], n: 0 });

/// This thread's effective uid and gid as one number: what the daemon
/// takes from a connection made now (SO_PEERCRED).
fn creds() -> u64 {
    // SAFETY: geteuid and getegid have no preconditions and cannot fail.
    let (u, g) = unsafe { (libc::geteuid(), libc::getegid()) };
    u64::from(u) << 32 | u64::from(g)
}
static NEXT_ID: AtomicU64 = AtomicU64::new(1);
/// Set once this process has opened a connection (cheap gate for close hooks).
static EVER: AtomicBool = AtomicBool::new(false);

pub fn fork_prepare() {
    POOL.lock();
}
pub fn fork_parent() {
    POOL.unlock();
}
/// In the child: forget the parent's connections without touching them
/// beyond closing our copies (raw syscalls: nothing here may be hooked or lazily resolved).
pub fn fork_child() {
    // SAFETY: the prepare handler took the lock in this (now the only) thread.
    let p = unsafe { POOL.force() };
    for &(fd, _, _) in &p.fds[..p.n] {
        // Our inherited copy of a socket we created.
        crate::unhooked::close_unhooked(fd);
    }
    p.n = 0;
    POOL.unlock();
}

/// The program is closing or replacing fds `lo..=hi`: drop pooled
/// connections among them (the program owns those numbers now).
///
/// Skipped while this thread is already inside the library (a signal
/// handler interrupting us while we hold the pool lock must not wait for it;
/// our own closes of pooled sockets keep the pool right themselves).
#[inline]
pub fn forget_range(lo: c_int, hi: c_int) {
    if !EVER.load(Ordering::Relaxed) {
        return;
    }
    let Some(_g) = crate::guard::Guard::enter() else { return };
    POOL.with(|p| {
        let mut i = 0;
        while i < p.n {
            if (lo..=hi).contains(&p.fds[i].0) {
                p.n -= 1;
                p.fds[i] = p.fds[p.n];
            } else {
                i += 1;
            }
        }
    });
}

fn inode(fd: c_int) -> u64 {
    // SAFETY: plain data, zero is valid; fstat on any int is safe.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: st is a valid out-pointer.
    if unsafe { crate::real::fstat(fd, &mut st) } != 0 || st.st_mode & libc::S_IFMT != libc::S_IFSOCK {
        return 0;
    }
    st.st_ino
}

/// Moves a library-internal fd far above the numbers programs use (shells
/// assume fds 3..9 are theirs: `exec 3< file`).
pub(crate) fn move_high(fd: c_int) -> c_int {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: lim is a valid out-pointer.
    unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) };
    let base = (lim.rlim_cur.min(1 << 20) as c_int - 64).max(100);
    // SAFETY: duplicating our own fd.
    let hi = unsafe { crate::real::fcntl(fd, libc::F_DUPFD_CLOEXEC, base as libc::c_ulong) };
    if hi < 0 {
        return fd;
    }
    close_fd(fd);
    hi
}

fn close_fd(fd: c_int) {
    // SAFETY: fd is a socket this module owns.
    unsafe { crate::real::close(fd) };
}

pub(crate) fn connect(st: &State) -> Result<c_int, c_int> {
    // SAFETY: plain socket creation.
    let s = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) };
    if s < 0 {
        return Err(libc::EIO);
    }
    let s = move_high(s);
    EVER.store(true, Ordering::Relaxed);
    let ms = state::config().map_or(5000, |c| c.timeout_ms);
    let tv = libc::timeval { tv_sec: (ms / 1000) as _, tv_usec: ((ms % 1000) * 1000) as _ };
    for opt in [libc::SO_RCVTIMEO, libc::SO_SNDTIMEO] {
        // SAFETY: tv is a valid timeval of the size we pass.
        unsafe {
            libc::setsockopt(s, libc::SOL_SOCKET, opt, (&tv as *const libc::timeval).cast(), std::mem::size_of::<libc::timeval>() as u32)
        };
    }
    // SAFETY: sockaddr_un is plain data; zero is a valid starting value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    if st.sock_path.len() >= addr.sun_path.len() {
        close_fd(s);
        return Err(libc::EIO);
    }
    for (d, &b) in addr.sun_path.iter_mut().zip(&st.sock_path) {
        *d = b as libc::c_char;
    }
    let len = (std::mem::size_of::<libc::sa_family_t>() + st.sock_path.len() + 1) as libc::socklen_t;
    loop {
        // SAFETY: addr is a valid sockaddr_un of at least `len` bytes.
        let r = unsafe { crate::real::connect(s, (&addr as *const libc::sockaddr_un).cast(), len) };
        if r == 0 {
            return Ok(s);
        }
        // SAFETY: reading this thread's errno.
        if unsafe { *libc::__errno_location() } != libc::EINTR {
            crate::dlog!("connect {} failed: daemon gone?", crate::debug::B(&st.sock_path));
            close_fd(s);
            return Err(libc::EIO);
        }
    }
}

fn daemon_alive(st: &State) -> bool {
    if st.daemon_pid == 0 || st.daemon_pid > i32::MAX as u64 {
        return true;
    }
    // SAFETY: signal 0 only checks for existence.
    let r = unsafe { libc::kill(st.daemon_pid as libc::pid_t, 0) };
    // SAFETY: reading this thread's errno.
    r == 0 || unsafe { *libc::__errno_location() } == libc::EPERM
}

enum Fail {
    /// The connection is unusable (closed, timed out, garbled): drop it.
    Conn,
    /// The daemon answered with an error.
    /// The daemon's errno, with the reply's payload (some errors carry one)
    /// and the fd it carried (OUT_STAT's `wire::STAT_NEW_FILE`).
    Errno(c_int, Vec<u8>, Option<c_int>),
}

/// An error answer: the errno, the reply's payload, and the fd it carried.
pub type ErrorAnswer = (c_int, Vec<u8>, Option<c_int>);

fn close_carried(e: ErrorAnswer) -> (c_int, Vec<u8>) {
    if let Some(fd) = e.2 {
        close_fd(fd);
    }
    (e.0, e.1)
}

/// A successful exchange: the reply and the fd it carried, if any.
pub struct Answer {
    pub reply: Reply,
    pub fd: Option<c_int>,
}

/// How long a client asks for its reply again and again before it sleeps
/// until it comes (`wire::spin_recv_msg`): most replies (an unlink, a
/// create's lookup) come within it, and on a VM a sleeping thread's
/// wake-up costs more than the whole request.
const REPLY_SPIN: std::time::Duration = std::time::Duration::from_micros(40);

fn exchange(st: &State, s: c_int, req: &Request, send_fd: Option<c_int>) -> Result<Answer, Fail> {
    wire::send_msg(s, &req.encode(), send_fd).map_err(|_| Fail::Conn)?;
    // This thread's receive buffer, kept (zeroing 64 KiB for each request
    // cost ~2 µs, a tenth of an unlink); a fresh one if it is in use (an
    // exchange from a signal handler that interrupted one).
    // (try_with: an exchange may come from a thread's TLS destructors.)
    let mut kept = RECV_BUF.try_with(|b| b.try_borrow_mut().ok().map(|mut v| std::mem::take(&mut *v))).ok().flatten();
    let mut fresh = Vec::new();
    let buf = match kept.as_mut() {
        Some(v) if v.len() == wire::MAX_MESSAGE => v,
        _ => {
            fresh = vec![0u8; wire::MAX_MESSAGE];
            &mut fresh
        }
    };
    // The spin's EAGAINs must not show: a caller that succeeds leaves errno
    // as it was (Python's listdir takes errno set at the end of a readdir
    // for an error).
    let saved = crate::errno::errno();
    let r = receive(st, s, req, buf);
    crate::errno::set_errno(saved);
    let buf = if fresh.is_empty() { kept.take() } else { Some(fresh) };
    if let Some(b) = buf {
        let _ = RECV_BUF.try_with(|k| {
            if let Ok(mut k) = k.try_borrow_mut() {
                if k.is_empty() {
                    *k = b;
                }
            }
        });
    }
    r
}

thread_local! {
    static RECV_BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    /// When this thread spins for a reply ([`REPLY_SPIN`]).
    static SPIN: std::cell::Cell<wire::SpinPolicy> = const { std::cell::Cell::new(wire::SpinPolicy::new()) };
}

/// The reply to `req`, sent on `s`, received into `buf`.
fn receive(st: &State, s: c_int, req: &Request, buf: &mut Vec<u8>) -> Result<Answer, Fail> {
    // A slow remote fetch keeps us waiting while the daemon lives; a dead or
    // hung one ends the wait: at most 12 timeouts (60 s by default).
    let mut waits = 0;
    let spin = SPIN
        .try_with(|c| {
            let mut p = c.get();
            let s = p.should_spin();
            c.set(p);
            s
        })
        .unwrap_or(false);
    let mut spun = match spin.then(|| wire::spin_recv_msg(s, buf, REPLY_SPIN)) {
        Some(Ok(r)) => {
            let _ = SPIN.try_with(|c| {
                let mut p = c.get();
                p.spun(r.is_some());
                c.set(p);
            });
            r
        }
        Some(Err(_)) => return Err(Fail::Conn),
        None => None,
    };
    let (n, fd) = loop {
        if let Some(r) = spun.take() {
            break r;
        }
        match wire::recv_msg(s, buf) {
            Ok(r) => break r,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock && waits < 11 && daemon_alive(st) => waits += 1,
            Err(_) => return Err(Fail::Conn),
        }
    };
    if n == 0 {
        return Err(Fail::Conn);
    }
    let rep = Reply::decode(&buf[..n]).map_err(|_| Fail::Conn)?;
    if rep.id != req.id || rep.op != req.op {
        return Err(Fail::Conn);
    }
    use std::os::fd::IntoRawFd;
    let fd = match fd {
        Some(fd) if rep.flags & wire::FLAG_FD != 0 => Some(fd.into_raw_fd()),
        _ => None,
    };
    if rep.errno != 0 {
        return Err(Fail::Errno(rep.errno, rep.payload, fd));
    }
    Ok(Answer { reply: rep, fd })
}

/// Asks the daemon for an fd holding the bytes of `node`. The fd is the
/// daemon's (shared) description, close-on-exec.
pub fn fetch(st: &State, node: u32) -> Result<c_int, c_int> {
    let req = Request::new(op::OPEN, NEXT_ID.fetch_add(1, Ordering::Relaxed), node as u64, st.dataset_id);
    match call(st, &req, None)? {
        Answer { fd: Some(fd), .. } => Ok(fd),
        // The daemon sent an fd the kernel could not install: this process
        // is at its fd limit (recvmsg drops it, MSG_CTRUNC), as open(2) would be.
        Answer { reply, fd: None } if reply.flags & wire::FLAG_FD != 0 => Err(libc::EMFILE),
        _ => Err(libc::EIO),
    }
}

/// Tells the daemon, without waiting for an answer, that this process has
/// just decoded dataset files `nodes` itself, so the daemon makes the node's
/// copies of them in the background (see [`op::WARM`]; batched by
/// [`crate::warm`]). Best effort: a missing daemon or a full socket drops
/// the hints.
pub fn warm(st: &State, nodes: &[u32]) {
    let Some(&first) = nodes.first() else { return };
    let creds = creds();
    let (s, ino) = match take_pooled(creds) {
        Some(pooled) => pooled,
        None => match connect(st) {
            Ok(s) => (s, inode(s)),
            Err(_) => return,
        },
    };
    let mut req = Request::new(op::WARM, NEXT_ID.fetch_add(1, Ordering::Relaxed), first as u64, st.dataset_id);
    req.payload = nodes.iter().flat_map(|id| id.to_le_bytes()).collect();
    let b = req.encode();
    // SAFETY: b is a live buffer of b.len() bytes; s is our connected socket.
    let sent = unsafe { libc::send(s, b.as_ptr().cast(), b.len(), libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) };
    if sent == b.len() as isize {
        put_back(s, ino, creds);
    } else {
        close_fd(s);
    }
}

/// A new request of `op` with a fresh id and `path` as its payload.
pub fn request(op: u16, arg0: u64, arg1: u64, path: &[u8]) -> Request {
    let mut r = Request::new(op, NEXT_ID.fetch_add(1, Ordering::Relaxed), arg0, arg1);
    r.payload = path.to_vec();
    r
}

/// One request to the daemon (with `send_fd` attached, if given).
pub fn call(st: &State, req: &Request, send_fd: Option<c_int>) -> Result<Answer, c_int> {
    call_full(st, req, send_fd).map_err(|e| close_carried(e).0)
}

/// One request with no fd either way: the reply, or the errno with the
/// payload the daemon sent with it.
/// [`call`] keeping the error reply's payload.
pub fn call_answer(st: &State, req: &Request) -> Result<Answer, (c_int, Vec<u8>)> {
    call_full(st, req, None).map_err(close_carried)
}

/// [`call_answer`] keeping the fd an error reply carried (the caller's to close).
pub fn call_answer_fd(st: &State, req: &Request) -> Result<Answer, ErrorAnswer> {
    call_full(st, req, None)
}

pub fn call_reply(st: &State, req: &Request) -> Result<Reply, (c_int, Vec<u8>)> {
    call_full(st, req, None).map(|a| a.reply).map_err(close_carried)
}

fn call_full(st: &State, req: &Request, send_fd: Option<c_int>) -> Result<Answer, ErrorAnswer> {
    // A pooled connection may have died with a restarted daemon: one retry on a fresh one.
    let creds = creds();
    for attempt in 0..2 {
        let pooled = if attempt == 0 { take_pooled(creds) } else { None };
        let fresh = pooled.is_none();
        let (s, ino) = match pooled {
            Some(pooled) => pooled,
            None => connect(st).map(|s| (s, inode(s))).map_err(|e| (e, Vec::new(), None))?,
        };
        match exchange(st, s, req, send_fd) {
            Ok(a) => {
                put_back(s, ino, creds);
                return Ok(a);
            }
            Err(Fail::Errno(e, payload, fd)) => {
                put_back(s, ino, creds);
                return Err((e, payload, fd));
            }
            Err(Fail::Conn) => {
                close_fd(s);
                if fresh {
                    crate::dlog!("daemon exchange (op {}) failed: EIO", req.op);
                    return Err((libc::EIO, Vec::new(), None));
                }
            }
        }
    }
    Err((libc::EIO, Vec::new(), None))
}

/// A pooled connection that is still ours (the program may have closed and
/// reused its number: the inode tells), if the pool holds one, made with
/// credentials `creds` (one made with others is closed).
/// A pooled connection made with `creds`, with its socket inode (checked
/// against the fd now: the program may have closed or replaced it).
fn take_pooled(creds: u64) -> Option<(c_int, u64)> {
    let (fd, ino, made_with) = POOL.with(|p| {
        if p.n > 0 {
            p.n -= 1;
            Some(p.fds[p.n])
        } else {
            None
        }
    })?;
    if inode(fd) != ino {
        return None; // no longer ours: not ours to close either
    }
    if made_with != creds {
        close_fd(fd);
        return None;
    }
    Some((fd, ino))
}

/// Pools connection `s`, whose socket inode `ino` was checked when it was
/// taken (or made) for this exchange: not looked up again after it (a
/// program that closes or replaces the fd meanwhile is seen by
/// [`forget_range`], or by the check at its next use).
fn put_back(s: c_int, ino: u64, creds: u64) {
    let kept = ino != 0
        && POOL.with(|p| {
        if p.n < POOL_MAX {
            p.fds[p.n] = (s, ino, creds);
            p.n += 1;
            true
        } else {
            false
        }
    });
    if !kept {
        close_fd(s);
    }
}
