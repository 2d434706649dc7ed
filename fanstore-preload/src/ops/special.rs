//! FIFOs and unix sockets among outputs, client side: `mknod`/`mkfifo`
//! (the daemon makes the object, MKNOD), `bind` of a unix socket (the
//! daemon registers the name, this process binds at the real path),
//! `connect`/`sendto`/`sendmsg` to a socket's name, and `open` of a FIFO.
//!
//! The real object of a special output is `<local dir>/out/<id>` on the
//! node of the rank that holds it (`holder` in its record; the client's
//! `State` has its daemon's rank and local directory). On that node it
//! works natively. On another node:
//!
//! - a FIFO is a meeting point of that node's processes, as a FIFO on NFS
//!   is one per client machine: they meet in a node-local FIFO,
//!   `<local dir>/.client/fifo/<holder>-<id>`, made at the first open (no
//!   byte crosses nodes; it stays until the job's local directory goes);
//! - a socket cannot be reached: `connect` and `sendto` give
//!   ECONNREFUSED, as natively for a socket file whose server runs on
//!   another machine; `open` of a socket is ENXIO anywhere, as natively.

use super::namespace::{lookup, Found};
use super::{resolve, Outcome, VPath};
use crate::client;
use crate::errno::{errno, set_errno};
use crate::state::State;
use fanstore_core::wire::{self, op, OutRecord};
use libc::{c_int, sockaddr, socklen_t};

/// `sun_path`'s size.
const SUN_PATH: usize = 108;

/// The real object of special output `r` if this node holds it.
pub fn real_path(st: &State, r: &OutRecord) -> Option<Vec<u8>> {
    if r.holder != st.rank {
        return None;
    }
    let mut p = st.local_dir.clone();
    p.extend_from_slice(format!("/out/{}", r.id).as_bytes());
    Some(p)
}

/// Is `mode`'s type one mknod(2) takes (0, a file, a FIFO, a socket, a device)?
pub fn valid_type(mode: u32) -> bool {
    matches!(mode & libc::S_IFMT, 0 | libc::S_IFREG | libc::S_IFIFO | libc::S_IFSOCK | libc::S_IFCHR | libc::S_IFBLK)
}

/// mknod of a new output name `vp` (the caller checked the name can be
/// made, and the type: [`super::write::mknod`]). A FIFO, a socket inode
/// (S_IFSOCK: nothing listens on it) or an empty regular file (type 0 or
/// S_IFREG), its permission bits less the umask. Character and block
/// devices (root only, EPERM otherwise, as the kernel says without
/// CAP_MKNOD): a record with the device number, no device to open.
pub fn mknod(vp: &VPath, mode: u32, dev: libc::dev_t) -> Outcome<c_int> {
    let kind = match mode & libc::S_IFMT {
        0 => libc::S_IFREG,
        k => k,
    };
    if crate::outputs::open_slot_of(vp.rel).is_some() {
        return Outcome::Errno(libc::EEXIST);
    }
    // (A device by a caller that is not root: EPERM from the daemon, after
    // the directory's EACCES, in the kernel's order.)
    let device = kind == libc::S_IFCHR || kind == libc::S_IFBLK;
    let mode = kind | (mode & 0o7777 & !super::attr::umask());
    let arg0 = if device { dev << fanstore_core::wire::MKNOD_RDEV_SHIFT } else { 0 };
    match client::call(vp.st, &client::request(op::MKNOD, arg0, u64::from(mode), vp.rel), None) {
        Ok(_) => Outcome::Handled(0),
        Err(e) => Outcome::Errno(e),
    }
}

/// open(2) of special output `r` (symlinks resolved, O_DIRECTORY checked):
/// its FIFO with the caller's flags (blocking as natively: a reader waits
/// for a writer; O_WRONLY|O_NONBLOCK without a reader is ENXIO); a socket
/// is ENXIO, as natively.
pub fn open(st: &State, r: &OutRecord, flags: c_int) -> Outcome<c_int> {
    if r.mode & libc::S_IFMT != libc::S_IFIFO {
        return Outcome::Errno(libc::ENXIO);
    }
    let path = match real_path(st, r) {
        Some(p) => p,
        None => match node_fifo(st, r) {
            Ok(p) => p,
            Err(e) => return Outcome::Errno(e),
        },
    };
    let Ok(c) = std::ffi::CString::new(path) else { return Outcome::Errno(libc::EIO) };
    // O_CREAT on an existing FIFO opens it; O_TRUNC does nothing to one.
    let f = flags & !(libc::O_CREAT | libc::O_EXCL | libc::O_TRUNC | libc::O_DIRECTORY);
    // The open may wait for the other end: the hooks stay on for this
    // thread's signal handlers meanwhile.
    // SAFETY: c is NUL-terminated; a plain open of our own FIFO.
    let fd = crate::guard::outside(|| unsafe { crate::real::open(c.as_ptr(), f, 0) });
    if fd < 0 {
        Outcome::Errno(errno())
    } else {
        Outcome::Handled(fd)
    }
}

/// The node-local FIFO standing for FIFO output `r`, held by another rank:
/// `<local dir>/.client/fifo/<holder>-<id>`, made if missing.
fn node_fifo(st: &State, r: &OutRecord) -> Result<Vec<u8>, c_int> {
    let mut dir = st.local_dir.clone();
    dir.push(b'/');
    dir.extend_from_slice(crate::state::CLIENT_DIR.as_bytes());
    let parent = std::ffi::CString::new(dir.clone()).map_err(|_| libc::EIO)?;
    dir.extend_from_slice(b"/fifo");
    let d = std::ffi::CString::new(dir.clone()).map_err(|_| libc::EIO)?;
    let mut p = dir;
    p.extend_from_slice(format!("/{}-{}", r.holder, r.id).as_bytes());
    let c = std::ffi::CString::new(p.clone()).map_err(|_| libc::EIO)?;
    // SAFETY: NUL-terminated paths; EEXIST is fine for each.
    unsafe {
        crate::real::mkdir(parent.as_ptr(), 0o700);
        crate::real::mkdir(d.as_ptr(), 0o700);
        if crate::real::mkfifo(c.as_ptr(), 0o600) != 0 && errno() != libc::EEXIST {
            return Err(errno());
        }
    }
    Ok(p)
}

/// Calls `f` with a unix socket address for `path`: the path itself when
/// it fits `sun_path`, else `/proc/self/fd/<dir fd>/<name>` through an
/// O_PATH fd on its directory (the kernel follows that link for bind and
/// connect alike); ENAMETOOLONG when neither fits.
pub fn with_sockaddr<T>(path: &[u8], fail: T, f: impl FnOnce(*const sockaddr, socklen_t) -> T) -> T {
    // SAFETY: plain data; all-zero is a valid empty address.
    let mut a: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    a.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let fill = |a: &mut libc::sockaddr_un, p: &[u8]| {
        for (d, s) in a.sun_path.iter_mut().zip(p) {
            *d = *s as libc::c_char;
        }
        (std::mem::size_of::<libc::sa_family_t>() + p.len() + 1) as socklen_t
    };
    if path.len() < SUN_PATH {
        let len = fill(&mut a, path);
        return f((&a as *const libc::sockaddr_un).cast(), len);
    }
    let i = path.iter().rposition(|&b| b == b'/').unwrap_or(0);
    let Ok(dir) = std::ffi::CString::new(&path[..i.max(1)]) else {
        set_errno(libc::ENAMETOOLONG);
        return fail;
    };
    // SAFETY: dir is NUL-terminated; an O_PATH open of a directory.
    let dfd = unsafe { crate::real::open(dir.as_ptr(), libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC, 0) };
    if dfd < 0 {
        return fail;
    }
    let short = [format!("/proc/self/fd/{dfd}").as_bytes(), &path[i..]].concat();
    let r = if short.len() < SUN_PATH {
        let len = fill(&mut a, &short);
        f((&a as *const libc::sockaddr_un).cast(), len)
    } else {
        set_errno(libc::ENAMETOOLONG);
        fail
    };
    let e = errno();
    // SAFETY: closing the fd we opened.
    unsafe { crate::real::close(dfd) };
    set_errno(e);
    r
}

/// bind(2) of unix socket `fd` to new output name `vp` (checked by
/// [`super::write::bind`]): the name is registered (EADDRINUSE if it
/// exists, as natively), then the socket is bound at its real path on
/// this node; a failed bind removes the name again.
pub fn bind(vp: &VPath, fd: c_int) -> Outcome<c_int> {
    if crate::outputs::open_slot_of(vp.rel).is_some() {
        return Outcome::Errno(libc::EADDRINUSE);
    }
    // As the kernel makes a socket's inode: 0777 less the umask.
    let mode = libc::S_IFSOCK | (0o777 & !super::attr::umask());
    let a = match client::call(vp.st, &client::request(op::MKNOD, wire::MKNOD_BIND, u64::from(mode), vp.rel), None) {
        Ok(a) => a,
        Err(libc::EEXIST) => return Outcome::Errno(libc::EADDRINUSE),
        Err(e) => return Outcome::Errno(e),
    };
    let real = a.reply.payload;
    // SAFETY: bind of the caller's fd to an address we built.
    let r = with_sockaddr(&real, -1, |sa, len| unsafe { crate::real::bind(fd, sa, len) });
    if r != 0 {
        let e = errno();
        let _ = client::call(vp.st, &client::request(op::UNLINK, 0, 0, vp.rel), None);
        return Outcome::Errno(e);
    }
    // Anyone of the node may connect (write permission on the inode): the
    // record's mode is what stat shows.
    if let Ok(c) = std::ffi::CString::new(real) {
        // SAFETY: c is NUL-terminated.
        unsafe { crate::real::chmod(c.as_ptr(), 0o777) };
    }
    Outcome::Handled(0)
}

/// Where a datagram or a connection to output path `vp` goes: the real
/// socket on this node, or the path a symlink out of the mount names.
/// ECONNREFUSED for what is no socket (an input, a file, a directory) and
/// for a socket held by another node, as natively for a socket whose
/// server is on another machine.
pub fn target(vp: &VPath) -> Result<Vec<u8>, c_int> {
    match resolve(vp.st, vp.rel, vp.must_be_dir, true) {
        Ok(_) => return Err(libc::ECONNREFUSED),
        Err(libc::ENOENT) => {}
        Err(e) => return Err(e),
    }
    match lookup(vp.st, vp.rel, true)? {
        Found::Outside(abs) => Ok(abs),
        Found::Here { rec, .. } if rec.mode & libc::S_IFMT == libc::S_IFSOCK => real_path(vp.st, &rec).ok_or(libc::ECONNREFUSED),
        Found::Here { .. } => Err(libc::ECONNREFUSED),
    }
}

/// connect(2) of `fd` to the unix socket named by output path `vp`.
pub fn connect(vp: &VPath, fd: c_int) -> Outcome<c_int> {
    let real = match target(vp) {
        Ok(p) => p,
        Err(e) => return Outcome::Errno(e),
    };
    // A blocking connect may wait (a full backlog): hooks stay on for signal handlers.
    // SAFETY: connect of the caller's fd to an address we built.
    let r = crate::guard::outside(|| with_sockaddr(&real, -1, |sa, len| unsafe { crate::real::connect(fd, sa, len) }));
    if r != 0 {
        Outcome::Errno(errno())
    } else {
        Outcome::Handled(0)
    }
}
