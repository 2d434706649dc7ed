//! The exported libc symbols. Each family file declares its hooks with
//! `hooks!`; the original of each one is `crate::real::name` (the ground
//! floor resolves it lazily with `dlsym(RTLD_NEXT)`). Hook bodies only
//! convert pointers and dispatch through `path_hook`, `fd_hook`,
//! `two_path_hook` or `empty_path_hook` to safe functions in `crate::ops`.
//!
//! Contract shared by every hook (the reason hook bodies are `unsafe`): the
//! caller passes pointers that satisfy the C prototype of the libc function
//! of the same name; a hook forwards them unchanged to the original, or reads
//! and writes them exactly as that function's contract allows.
//!
//! Except that a pointer may be bad (NULL, 0xDEADC0DE, an unmapped page):
//! every pointer a hook reads or writes itself is first probed
//! ([`crate::user_mem`]). A bad one goes to the original untouched (the
//! kernel's EFAULT, or whatever libc does with it, as without the library);
//! an out-pointer found bad once a virtual call has its answer gives EFAULT
//! (as the kernel's copy to user space does, after the lookup's errors).

use crate::debug::{B, E};
use crate::fd_table::{self, Tracked};
use crate::errno::set_errno;
use crate::guard::{catch, Guard};
use crate::ops::{self, Outcome, TwoPaths};
use crate::paths::{self, Class, Scratch, VPath};
use crate::user_mem;
use libc::{c_char, c_int};
use std::ffi::CStr;

pub mod attr;
pub mod bytes;
pub mod cwd;
pub mod dir;
pub mod dlsym;
pub mod exec;
pub mod fd;
pub mod inotify;
pub mod lock;
pub mod meta;
pub mod mknod;
pub mod open;
pub mod rename;
pub mod signal;
pub mod socket;
pub mod stat;
pub mod stdio;
pub mod syscall;
pub mod tempname;
pub mod thread;
pub mod umask;
pub mod unlink;
pub mod walk;
pub mod xattr;
pub mod zerocopy;

/// Declares hooks. Each must have an original of the same name and
/// prototype in `crate::real` (checked here at compile time); a body calls
/// it as `real::name(..)`.
#[macro_export]
macro_rules! hooks {
    ($(
        $(#[$meta:meta])*
        fn $name:ident($($arg:ident : $ty:ty),* $(,)?) -> $ret:ty $body:block
    )*) => {
        /// This family's hooked names (tested against `crate::real::FAMILIES`).
        #[cfg(test)]
        pub const NAMES: &[&str] = &[$(stringify!($name)),*];

        $(
            // The original has the hook's very prototype.
            const _: unsafe fn($($ty),*) -> $ret = $crate::real::$name;

            $(#[$meta])*
            #[no_mangle]
            #[allow(clippy::missing_safety_doc, clippy::too_many_arguments)]
            pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret $body
        )*
    };
}

enum Step<T> {
    Real,
    Redirect,
    Done(T),
    Err(c_int),
}

/// Dispatches a call that names a path relative to `dirfd`: libc for paths
/// outside the mount (the caller's own path, untouched) and for a bad
/// pointer (the kernel's EFAULT), `virt` for paths under it.
///
/// # Safety
/// `path` is null, a NUL-terminated string, or a bad pointer (probed).
#[inline]
pub(crate) unsafe fn path_hook<T>(
    name: &'static str,
    dirfd: c_int,
    path: *const c_char,
    fail: T,
    virt: impl FnOnce(&VPath) -> Outcome<T>,
    real: impl FnOnce(*const c_char) -> T,
) -> T {
    if !user_mem::cstr(path) {
        return real(path);
    }
    let Some(g) = Guard::enter() else { return real(path) };
    // SAFETY: path is a readable NUL-terminated string (probed above).
    if !unsafe { paths::maybe_ours(dirfd, path) } {
        drop(g);
        return real(path);
    }
    // SAFETY: as above; maybe_ours returned true, so path is non-null.
    unsafe { path_slow(name, dirfd, path, fail, virt, real, g) }
}

#[inline(never)]
unsafe fn path_slow<T>(
    name: &'static str,
    dirfd: c_int,
    path: *const c_char,
    fail: T,
    virt: impl FnOnce(&VPath) -> Outcome<T>,
    real: impl FnOnce(*const c_char) -> T,
    g: Guard,
) -> T {
    let mut scratch = Scratch::new();
    // SAFETY: non-null and NUL-terminated (caller's contract).
    let bytes = unsafe { CStr::from_ptr(path) }.to_bytes();
    let step = catch(
        || match paths::classify(dirfd, bytes, &mut scratch) {
            Class::Real => Step::Real,
            Class::Redirect => Step::Redirect,
            Class::Err(e) => Step::Err(e),
            Class::Virtual(vp) => match virt(&vp) {
                Outcome::Handled(v) => Step::Done(v),
                Outcome::Errno(e) => Step::Err(e),
                Outcome::Passthrough => Step::Real,
            },
        },
        Step::Err(libc::EIO),
    );
    drop(g);
    match step {
        Step::Real => real(path),
        Step::Redirect => {
            crate::dlog!("{name}({}) -> libc {}", B(bytes), B(until_nul(&scratch.buf)));
            real(scratch.ptr())
        }
        Step::Done(v) => {
            crate::dlog!("{name}({}) ok", B(bytes));
            v
        }
        Step::Err(e) => {
            crate::dlog!("{name}({}) = {}", B(bytes), E(e));
            set_errno(e);
            fail
        }
    }
}

/// A hook's failure: errno `e`, and -1 (of the hook's return type).
#[inline]
pub(crate) fn fail<T: From<i8>>(e: c_int) -> T {
    set_errno(e);
    T::from(-1)
}

fn until_nul(b: &[u8]) -> &[u8] {
    &b[..b.iter().position(|&c| c == 0).unwrap_or(b.len())]
}

/// Dispatches a call on an fd: `virt` when the fd is tracked, libc otherwise.
#[inline]
pub(crate) fn fd_hook<T>(
    name: &'static str,
    fd: c_int,
    fail: T,
    virt: impl FnOnce(Tracked) -> Outcome<T>,
    real: impl FnOnce() -> T,
) -> T {
    let Some(t) = fd_table::get(fd) else { return real() };
    let Some(g) = Guard::enter() else { return real() };
    let out = catch(|| virt(t), Outcome::Errno(libc::EIO));
    drop(g);
    match out {
        Outcome::Handled(v) => {
            crate::dlog!("{name}(fd {fd}: node {}) ok", t.node());
            v
        }
        Outcome::Passthrough => real(),
        Outcome::Errno(e) => {
            crate::dlog!("{name}(fd {fd}: node {}) = {}", t.node(), E(e));
            set_errno(e);
            fail
        }
    }
}

/// Dispatches a call whose path is empty with `AT_EMPTY_PATH`, about
/// `dirfd` itself: `virt` when it is a tracked fd (or AT_FDCWD with a
/// virtual cwd), libc otherwise.
#[inline]
pub(crate) fn empty_path_hook<T>(
    name: &'static str,
    dirfd: c_int,
    fail: T,
    virt: impl FnOnce() -> Outcome<T>,
    real: impl FnOnce() -> T,
) -> T {
    let ours = if dirfd == libc::AT_FDCWD { crate::vcwd::vcwd().is_some() } else { fd_table::get(dirfd).is_some() };
    if !ours {
        return real();
    }
    let Some(g) = Guard::enter() else { return real() };
    let out = catch(virt, Outcome::Errno(libc::EIO));
    drop(g);
    match out {
        Outcome::Handled(v) => {
            crate::dlog!("{name}(fd {dirfd}, \"\") ok");
            v
        }
        Outcome::Passthrough => real(),
        Outcome::Errno(e) => {
            crate::dlog!("{name}(fd {dirfd}, \"\") = {}", E(e));
            set_errno(e);
            fail
        }
    }
}

/// Dispatches a call that names two paths (rename, link), each relative to
/// its dirfd: libc for calls with neither path under the mount (the
/// caller's own paths, untouched) and for a bad pointer on either side
/// (the kernel's EFAULT); [`ops::two_paths`] decides the others.
///
/// # Safety
/// `p1` and `p2` are null, NUL-terminated strings, or bad pointers (probed).
pub(crate) unsafe fn two_path_hook(
    name: &'static str,
    d1: c_int,
    p1: *const c_char,
    d2: c_int,
    p2: *const c_char,
    virt: impl FnOnce(Option<&VPath>, Option<&VPath>) -> Outcome<c_int>,
    real: impl FnOnce(*const c_char, *const c_char) -> c_int,
) -> c_int {
    if !user_mem::cstr(p1) {
        // The kernel reads the first path first: EFAULT.
        return real(p1, p2);
    }
    if !user_mem::cstr(p2) {
        // SAFETY: p1 is a readable C string (probed).
        return unsafe { bad_second(name, d1, p1, p2, real) };
    }
    let Some(g) = Guard::enter() else { return real(p1, p2) };
    // SAFETY: p1/p2 are readable C strings (probed above).
    let (m1, m2) = unsafe { (paths::maybe_ours(d1, p1), paths::maybe_ours(d2, p2)) };
    if !m1 && !m2 {
        drop(g);
        return real(p1, p2);
    }
    let (mut s1, mut s2) = (Scratch::new(), Scratch::new());
    // SAFETY: as above.
    let (b1, b2) = unsafe { (cbytes(p1).unwrap_or(b""), cbytes(p2).unwrap_or(b"")) };
    let step = catch(
        || {
            let c1 = if m1 { paths::classify(d1, b1, &mut s1) } else { Class::Real };
            let c2 = if m2 { paths::classify(d2, b2, &mut s2) } else { Class::Real };
            ops::two_paths(c1, c2, virt)
        },
        TwoPaths::Errno(libc::EIO),
    );
    drop(g);
    match step {
        TwoPaths::Libc(r1, r2) => real(if r1 { s1.ptr() } else { p1 }, if r2 { s2.ptr() } else { p2 }),
        TwoPaths::Done => 0,
        TwoPaths::Errno(e) => {
            crate::dlog!("{name}({}, {}) = {}", B(b1), B(b2), E(e));
            set_errno(e);
            -1
        }
    }
}

/// A two-path call whose first path is good and second bad: the kernel
/// looks the first up (its error comes first: link needs the file itself,
/// rename its directory), then fails to read the second (EFAULT). Under
/// the mount: the first path's lookup error, else EFAULT; elsewhere the
/// kernel's own call (on the normalised path when the first is relative
/// to a virtual directory).
///
/// # Safety
/// `p1` is a readable C string; `p2` is passed on untouched.
#[inline(never)]
unsafe fn bad_second(
    name: &'static str,
    d1: c_int,
    p1: *const c_char,
    p2: *const c_char,
    real: impl FnOnce(*const c_char, *const c_char) -> c_int,
) -> c_int {
    let Some(g) = Guard::enter() else { return real(p1, p2) };
    // SAFETY: p1 is a readable C string (the caller's contract).
    if !unsafe { paths::maybe_ours(d1, p1) } {
        drop(g);
        return real(p1, p2);
    }
    let mut s1 = Scratch::new();
    // SAFETY: as above.
    let b1 = unsafe { CStr::from_ptr(p1) }.to_bytes();
    // link (and linkat) looks the file itself up, rename its parent only.
    let whole = name.starts_with("link");
    let step: Step<()> = catch(
        || match paths::classify(d1, b1, &mut s1) {
            Class::Real => Step::Real,
            Class::Redirect => Step::Redirect,
            Class::Err(e) => Step::Err(e),
            Class::Virtual(vp) => match whole.then(|| ops::stat::stat_any(&vp, false)) {
                Some(Outcome::Errno(e)) => Step::Err(e),
                _ => Step::Err(libc::EFAULT),
            },
        },
        Step::Err(libc::EIO),
    );
    drop(g);
    match step {
        Step::Real | Step::Done(()) => real(p1, p2),
        Step::Redirect => real(s1.ptr(), p2),
        Step::Err(e) => {
            crate::dlog!("{name}({}, <bad pointer>) = {}", B(b1), E(e));
            set_errno(e);
            -1
        }
    }
}

/// A virtual call's answer written to the caller's out-pointer: 0, or
/// EFAULT when `buf` cannot hold a `T` (the kernel copies its answer out
/// last, after every lookup error).
///
/// # Safety
/// `buf` is the caller's out-pointer for a `T`, or a bad pointer (probed).
pub(crate) unsafe fn put<T>(out: Outcome<T>, buf: *mut T) -> Outcome<c_int> {
    match out {
        Outcome::Handled(v) if user_mem::writable_one(buf) => {
            // SAFETY: writable for a T (probed); the caller's out-pointer.
            unsafe { buf.write_unaligned(v) };
            Outcome::Handled(0)
        }
        Outcome::Handled(_) => Outcome::Errno(libc::EFAULT),
        other => other.map_none(),
    }
}

/// Reads a C string argument that may be null.
///
/// # Safety
/// `p` is null or NUL-terminated and outlives the returned slice.
pub(crate) unsafe fn cbytes<'a>(p: *const c_char) -> Option<&'a [u8]> {
    // SAFETY: per the contract.
    (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_bytes())
}

/// Reads a C string argument that may be null, as a `CStr`.
///
/// # Safety
/// `p` is null or NUL-terminated and outlives the returned reference.
pub(crate) unsafe fn cstr<'a>(p: *const c_char) -> Option<&'a CStr> {
    // SAFETY: per the contract.
    (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) })
}

#[cfg(test)]
mod tests {
    /// The report (crate::real::report_symbols) says which symbols are
    /// hooked: each family of originals is exactly one hook file's.
    #[test]
    fn each_family_of_originals_is_one_hook_file() {
        let files: &[(&str, &[&str])] = &[
            ("open", super::open::NAMES),
            ("stdio", super::stdio::NAMES),
            ("stat", super::stat::NAMES),
            ("meta", super::meta::NAMES),
            ("dir", super::dir::NAMES),
            ("cwd", super::cwd::NAMES),
            ("fd", super::fd::NAMES),
            ("lock", super::lock::NAMES),
            ("attr", super::attr::NAMES),
            ("xattr", super::xattr::NAMES),
            ("unlink", super::unlink::NAMES),
            ("mknod", super::mknod::NAMES),
            ("rename", super::rename::NAMES),
            ("tempname", super::tempname::NAMES),
            ("exec", super::exec::NAMES),
            ("walk", super::walk::NAMES),
            ("thread", super::thread::NAMES),
            ("signal", super::signal::NAMES),
            ("syscall", super::syscall::NAMES),
            ("inotify", super::inotify::NAMES),
            ("umask", super::umask::NAMES),
            ("socket", super::socket::NAMES),
            ("zerocopy", super::zerocopy::NAMES),
            ("bytes", super::bytes::NAMES),
        ];
        let want: Vec<(&str, Vec<&str>)> = files.iter().map(|(f, n)| (*f, n.to_vec())).collect();
        let got: Vec<(&str, Vec<&str>)> =
            crate::real::FAMILIES.iter().map(|(f, slots)| (*f, slots.iter().map(|s| s.name()).collect())).collect();
        assert_eq!(got, want);
    }
}
