//! inotify on `/fanstore` paths, and on other paths through the same fd.
//!
//! ## One fd, two streams
//!
//! `inotify_init1` (with a daemon to talk to) makes:
//! - a pipe in packet mode (`O_DIRECT`): the program gets the read end (its
//!   "inotify fd": real, so `read`, `poll`, `select`, `epoll`, `FIONREAD`,
//!   O_NONBLOCK and close-on-exec behave natively, and like an inotify fd it
//!   is never writable: programs that poll it with POLLOUT in the mask, as
//!   inotify_simple does, do not wake up for nothing, which a socket would
//!   make them do), the node's daemon the write end (SCM_RIGHTS, op
//!   WATCH_SINK, 1 MiB of pipe when the system allows it); every packet is
//!   one `struct inotify_event`, so a read never returns part of a record;
//! - a kernel inotify instance, kept by the library (moved high, close-on-exec)
//!   and handed to the daemon too (op WATCH_KERNEL): watches on paths outside
//!   the mount are added to it here with the kernel's own `inotify_add_watch`
//!   (its watch descriptors are returned as they are), and the daemon reads
//!   its records and forwards them into the same socket;
//! - a connection to the daemon (moved high) for `inotify_add_watch` /
//!   `inotify_rm_watch` of mount paths: watch descriptors from [`WD_BASE`] up,
//!   which never meet the kernel's (small, counting up from 1).
//!
//! The daemon writes both streams into the socket from one thread, in the
//! order it took them, so the program reads one stream. Without a daemon,
//! `inotify_init1` is the kernel's and nothing here is involved.
//! The instance ends when the program closes its fd (the daemon sees the
//! socket's hang-up, and `close` drops the library's two fds).

use crate::lock::Locked;
use crate::paths::VPath;
use fanstore_core::watchev::{IN_ALL_EVENTS, IN_MASK_ADD, IN_MASK_CREATE, IN_ONLYDIR};
use fanstore_core::wire::{self, op, Reply, Request};
use libc::c_int;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// First watch descriptor of mount paths.
pub const WD_BASE: c_int = 1 << 30;

struct Watch {
    wd: c_int,
    path: Vec<u8>,
    mask: u32,
}

struct Inst {
    /// The program's end of the pipe (the read end).
    fd: c_int,
    /// The connection to the daemon.
    ctl: c_int,
    /// The kernel inotify instance (paths outside the mount).
    kfd: c_int,
    next_wd: c_int,
    watches: Vec<Watch>,
}

static INSTS: Locked<Vec<Inst>> = Locked::new(Vec::new());
/// Set once an instance exists (a cheap gate for close and add_watch).
static ANY: AtomicBool = AtomicBool::new(false);
static IDS: AtomicU64 = AtomicU64::new(1);

pub fn fork_prepare() {
    INSTS.lock();
}
pub fn fork_release() {
    INSTS.unlock();
}

#[inline]
pub fn any() -> bool {
    ANY.load(Ordering::Relaxed)
}

fn close(fd: c_int) {
    if fd >= 0 {
        // SAFETY: closing an fd this module created.
        unsafe { crate::real::close(fd) };
    }
}

/// One request on an instance's connection; the reply's errno.
fn exchange(ctl: c_int, mut req: Request, fd: Option<c_int>) -> Result<Reply, c_int> {
    req.id = IDS.fetch_add(1, Ordering::Relaxed);
    wire::send_msg(ctl, &req.encode(), fd).map_err(|_| libc::EIO)?;
    let mut buf = vec![0u8; 512];
    let (n, _) = wire::recv_msg(ctl, &mut buf).map_err(|_| libc::EIO)?;
    let rep = Reply::decode(&buf[..n]).map_err(|_| libc::EIO)?;
    if rep.id != req.id {
        return Err(libc::EIO);
    }
    if rep.errno != 0 {
        return Err(rep.errno);
    }
    Ok(rep)
}

/// `inotify_init1(flags)` as a merged instance (module doc), or None when
/// there is no daemon (the caller then uses the kernel's).
pub fn init1(flags: c_int) -> Option<c_int> {
    if flags & !(libc::IN_NONBLOCK | libc::IN_CLOEXEC) != 0 {
        return None; // the kernel's EINVAL
    }
    let st = crate::state::state()?;
    // SAFETY: plain inotify creation through the original; the result is checked.
    let k = unsafe { crate::real::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
    if k < 0 {
        return None;
    }
    let kfd = crate::client::move_high(k);
    let mut pp = [-1; 2];
    // SAFETY: pp has room for the two fds.
    if unsafe { libc::pipe2(pp.as_mut_ptr(), libc::O_CLOEXEC | libc::O_DIRECT) } != 0 {
        close(kfd);
        return None;
    }
    let (fd, theirs) = (pp[0], pp[1]);
    // SAFETY: fcntl on the pipe we just made. Room for many records (a
    // packet takes a page of the pipe); the daemon's writes never block.
    // (F_SETFL replaces the status flags: O_DIRECT, which makes each write a
    // packet, must be kept.)
    unsafe {
        crate::real::fcntl(theirs, libc::F_SETPIPE_SZ, 1 << 20);
        let fl = crate::real::fcntl(theirs, libc::F_GETFL, 0);
        crate::real::fcntl(theirs, libc::F_SETFL, (fl | libc::O_NONBLOCK) as libc::c_ulong);
    }
    let fail = |ctl: c_int| {
        for f in [kfd, fd, theirs, ctl] {
            close(f);
        }
        None
    };
    let Ok(ctl) = crate::client::connect(st) else { return fail(-1) };
    let sink = Request::new(op::WATCH_SINK, 0, 0, 0);
    let kern = Request::new(op::WATCH_KERNEL, 0, 0, 0);
    if exchange(ctl, sink, Some(theirs)).is_err() || exchange(ctl, kern, Some(kfd)).is_err() {
        return fail(ctl);
    }
    close(theirs);
    // SAFETY: fcntl on the socket we just made.
    unsafe {
        if flags & libc::IN_NONBLOCK != 0 {
            let fl = crate::real::fcntl(fd, libc::F_GETFL, 0);
            crate::real::fcntl(fd, libc::F_SETFL, (fl | libc::O_NONBLOCK) as libc::c_ulong);
        }
        if flags & libc::IN_CLOEXEC == 0 {
            crate::real::fcntl(fd, libc::F_SETFD, 0);
        }
    }
    INSTS.with(|v| v.push(Inst { fd, ctl, kfd, next_wd: WD_BASE, watches: Vec::new() }));
    ANY.store(true, Ordering::Relaxed);
    crate::dlog!("inotify_init1({flags:#x}) = {fd} (merged: kernel fd {kfd}, daemon connection {ctl})");
    Some(fd)
}

/// The kernel instance behind program fd `fd`, if it is one of ours.
pub fn kernel_fd(fd: c_int) -> Option<c_int> {
    if !any() {
        return None;
    }
    INSTS.with(|v| v.iter().find(|i| i.fd == fd).map(|i| i.kfd))
}

/// `inotify_add_watch` of a mount path on instance `fd`.
pub fn add_watch(fd: c_int, vp: &VPath, mask: u32) -> Result<c_int, c_int> {
    if mask & IN_ALL_EVENTS == 0 || mask & (IN_MASK_ADD | IN_MASK_CREATE) == (IN_MASK_ADD | IN_MASK_CREATE) {
        return Err(libc::EINVAL);
    }
    let mask = if vp.must_be_dir { mask | IN_ONLYDIR } else { mask };
    // Under the instance lock: one exchange at a time on its connection.
    INSTS.with(|v| {
        let inst = v.iter_mut().find(|i| i.fd == fd).ok_or(libc::EINVAL)?;
        let existing = inst.watches.iter().position(|w| w.path == vp.rel);
        let (wd, m) = match existing {
            Some(_) if mask & IN_MASK_CREATE != 0 => return Err(libc::EEXIST),
            Some(i) if mask & IN_MASK_ADD != 0 => (inst.watches[i].wd, inst.watches[i].mask | mask),
            Some(i) => (inst.watches[i].wd, mask),
            None => (inst.next_wd, mask),
        };
        let keep = m & !(IN_MASK_ADD | IN_MASK_CREATE);
        let mut req = Request::new(op::WATCH_ADD, 0, wd as u64, u64::from(keep));
        req.payload = vp.rel.to_vec();
        exchange(inst.ctl, req, None)?;
        match existing {
            Some(i) => inst.watches[i].mask = keep,
            None => {
                inst.next_wd += 1;
                inst.watches.push(Watch { wd, path: vp.rel.to_vec(), mask: keep });
            }
        }
        Ok(wd)
    })
}

/// `inotify_rm_watch` of a mount watch (`wd >= WD_BASE`) on instance `fd`.
pub fn rm_watch(fd: c_int, wd: c_int) -> Result<c_int, c_int> {
    INSTS.with(|v| {
        let inst = v.iter_mut().find(|i| i.fd == fd).ok_or(libc::EINVAL)?;
        let i = inst.watches.iter().position(|w| w.wd == wd).ok_or(libc::EINVAL)?;
        inst.watches.remove(i);
        exchange(inst.ctl, Request::new(op::WATCH_RM, 0, wd as u64, 0), None).map(|_| 0)
    })
}

/// Before the program's `close(fd)`: an instance's own fds go with it.
#[inline]
pub fn closing(fd: c_int) {
    if !any() {
        return;
    }
    let gone = INSTS.with(|v| v.iter().position(|i| i.fd == fd).map(|i| v.swap_remove(i)));
    if let Some(i) = gone {
        crate::dlog!("close({fd}): inotify instance ends (daemon connection {}, kernel fd {})", i.ctl, i.kfd);
        close(i.ctl);
        close(i.kfd);
    }
}
