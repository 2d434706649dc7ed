//! bind, connect, sendto and sendmsg with a unix socket address that names
//! a path under the mount (absolute, or relative to a virtual cwd): the
//! socket's name is an output and the socket itself a real one on this
//! node ([`crate::ops::special`]). Any other address (another family, an
//! abstract name, a path outside the mount, none) goes to libc untouched.

use super::path_hook;
use crate::ops::{special, write, Outcome};
use crate::real;
use crate::user_mem;
use libc::{c_char, c_int, c_void, size_t, sockaddr, socklen_t, ssize_t};

/// `sun_path`'s size.
const SUN_PATH: usize = 108;
/// `sun_family`'s size.
const FAMILY: usize = std::mem::size_of::<libc::sa_family_t>();

/// The path of unix socket address `addr` (`len` bytes), NUL-terminated in
/// a buffer of its own; None for anything else (or a bad pointer: libc
/// gives the kernel's EFAULT).
fn unix_path(addr: *const sockaddr, len: socklen_t) -> Option<[u8; SUN_PATH + 1]> {
    let len = len as usize;
    if addr.is_null() || len <= FAMILY || len > std::mem::size_of::<libc::sockaddr_un>() || !user_mem::readable(addr.cast::<u8>(), len) {
        return None;
    }
    // SAFETY: `len` bytes at addr are readable (probed), len > FAMILY.
    let b = unsafe { std::slice::from_raw_parts(addr.cast::<u8>(), len) };
    if u16::from_ne_bytes([b[0], b[1]]) != libc::AF_UNIX as u16 || b[FAMILY] == 0 {
        return None; // another family, or an abstract name
    }
    let p = &b[FAMILY..];
    let p = &p[..p.iter().position(|&c| c == 0).unwrap_or(p.len())];
    let mut out = [0u8; SUN_PATH + 1];
    out[..p.len()].copy_from_slice(p);
    Some(out)
}

/// Dispatches a call whose unix socket address may name a path under the
/// mount: `virt` with the virtual path, else `real` with the caller's
/// address (or, for a path redirected out of the mount, with an address
/// for the redirected path).
///
/// # Safety
/// `addr` is null, a bad pointer (probed), or points at `len` readable bytes.
unsafe fn unix_hook<T: Copy>(
    name: &'static str,
    addr: *const sockaddr,
    len: socklen_t,
    fail: T,
    virt: impl FnOnce(&crate::paths::VPath) -> Outcome<T>,
    real: impl Fn(*const sockaddr, socklen_t) -> T,
) -> T {
    let Some(path) = unix_path(addr, len) else { return real(addr, len) };
    let own: *const c_char = path.as_ptr().cast();
    // SAFETY: `path` is a NUL-terminated buffer that outlives the call.
    unsafe {
        path_hook(name, libc::AT_FDCWD, own, fail, virt, |p| {
            if p == own {
                real(addr, len)
            } else {
                let redirected = std::ffi::CStr::from_ptr(p).to_bytes();
                special::with_sockaddr(redirected, fail, |a, l| real(a, l))
            }
        })
    }
}

/// The result of a real call as an outcome (its errno on failure).
fn outcome<T: Copy + PartialOrd + Default>(r: T) -> Outcome<T> {
    if r < T::default() {
        Outcome::Errno(crate::errno::errno())
    } else {
        Outcome::Handled(r)
    }
}

crate::hooks! {
    fn bind(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
        unix_hook("bind", addr, len, -1, |vp| write::bind(vp, fd), |a, l| real::bind(fd, a, l))
    }
    fn connect(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
        unix_hook("connect", addr, len, -1, |vp| special::connect(vp, fd), |a, l| real::connect(fd, a, l))
    }
    fn sendto(fd: c_int, buf: *const c_void, n: size_t, flags: c_int, addr: *const sockaddr, len: socklen_t) -> ssize_t {
        unix_hook(
            "sendto",
            addr,
            len,
            -1,
            |vp| match special::target(vp) {
                Ok(p) => outcome(special::with_sockaddr(&p, -1, |a, l| real::sendto(fd, buf, n, flags, a, l))),
                Err(e) => Outcome::Errno(e),
            },
            |a, l| real::sendto(fd, buf, n, flags, a, l),
        )
    }
    fn sendmsg(fd: c_int, msg: *const libc::msghdr, flags: c_int) -> ssize_t {
        if !user_mem::readable_one(msg) {
            return real::sendmsg(fd, msg, flags);
        }
        // SAFETY: msg points at a readable msghdr (probed).
        let m = unsafe { *msg };
        let with_name = |a: *const sockaddr, l: socklen_t| {
            let mut m2 = m;
            m2.msg_name = a as *mut c_void;
            m2.msg_namelen = l;
            real::sendmsg(fd, &m2, flags)
        };
        unix_hook(
            "sendmsg",
            m.msg_name as *const sockaddr,
            m.msg_namelen,
            -1,
            |vp| match special::target(vp) {
                Ok(p) => outcome(special::with_sockaddr(&p, -1, with_name)),
                Err(e) => Outcome::Errno(e),
            },
            |a, l| if a == m.msg_name as *const sockaddr { real::sendmsg(fd, msg, flags) } else { with_name(a, l) },
        )
    }
}
