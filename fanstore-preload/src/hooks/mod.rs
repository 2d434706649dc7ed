//! The exported libc symbols. Each family file declares its hooks with
//! `hooks!`, which also declares the original of each one (`orig::name`,
//! resolved lazily with `dlsym(RTLD_NEXT)`). Hook bodies only convert
//! pointers and dispatch through `path_hook` / `fd_hook` to safe
//! functions in `crate::ops`.
//!
//! Contract shared by every hook (the reason hook bodies are `unsafe`): the
//! caller passes pointers that satisfy the C prototype of the libc function
//! of the same name; a hook forwards them unchanged to the original, or reads
//! and writes them exactly as that function's contract allows.

use crate::debug::{B, E};
use crate::fd_table::{self, Tracked};
use crate::errno::set_errno;
use crate::guard::{catch, Guard};
use crate::ops::{self, Outcome, TwoPaths};
use crate::paths::{self, Class, Scratch, VPath};
use libc::{c_char, c_int};
use std::ffi::CStr;
use std::sync::atomic::{AtomicUsize, Ordering};

pub mod attr;
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
pub mod stat;
pub mod stdio;
pub mod syscall;
pub mod tempname;
pub mod thread;
pub mod unlink;
pub mod walk;
pub mod xattr;
pub mod zerocopy;

/// The lazily resolved address of one original libc function.
pub struct Slot {
    name: &'static str,
    ptr: AtomicUsize,
}

const MISSING: usize = 1;

impl Slot {
    pub const fn new(name_nul: &'static str) -> Slot {
        Slot { name: name_nul, ptr: AtomicUsize::new(0) }
    }

    pub fn name(&self) -> &'static str {
        self.name.trim_end_matches('\0')
    }

    #[inline]
    pub fn get(&self) -> Option<usize> {
        match self.ptr.load(Ordering::Relaxed) {
            0 => self.resolve(),
            MISSING => None,
            p => Some(p),
        }
    }

    #[cold]
    fn resolve(&self) -> Option<usize> {
        // SAFETY: name is NUL-terminated; dlsym/dlvsym only read it.
        let mut p = unsafe { libc::dlsym(libc::RTLD_NEXT, self.name.as_ptr().cast()) } as usize;
        if p == 0 {
            // Compat-only symbols (no default version) are invisible to dlsym.
            // SAFETY: as above, both strings are NUL-terminated.
            p = unsafe { libc::dlvsym(libc::RTLD_NEXT, self.name.as_ptr().cast(), c"GLIBC_2.2.5".as_ptr()) } as usize;
        }
        if p == 0 {
            self.ptr.store(MISSING, Ordering::Relaxed);
            crate::debug::emit(format_args!("libc has no symbol {}: calls to it fail with ENOSYS", self.name()));
            None
        } else {
            self.ptr.store(p, Ordering::Relaxed);
            Some(p)
        }
    }

    /// Resolved (or known missing) without logging: for the debug report.
    fn probe(&self) -> bool {
        if self.ptr.load(Ordering::Relaxed) == 0 {
            // SAFETY: as in resolve.
            let mut p = unsafe { libc::dlsym(libc::RTLD_NEXT, self.name.as_ptr().cast()) } as usize;
            if p == 0 {
                // SAFETY: as in resolve.
                p = unsafe { libc::dlvsym(libc::RTLD_NEXT, self.name.as_ptr().cast(), c"GLIBC_2.2.5".as_ptr()) } as usize;
            }
            self.ptr.store(if p == 0 { MISSING } else { p }, Ordering::Relaxed);
        }
        self.ptr.load(Ordering::Relaxed) != MISSING
    }
}

/// What an original returns when libc lacks it: failure with ENOSYS.
pub trait Missing {
    fn missing() -> Self;
}

fn enosys() {
    set_errno(libc::ENOSYS);
}

macro_rules! missing_int {
    ($($t:ty),*) => {$(
        impl Missing for $t {
            fn missing() -> $t {
                enosys();
                -1
            }
        }
    )*};
}
missing_int!(i32, i64, isize);

/// `sighandler_t`: SIG_ERR.
impl Missing for usize {
    fn missing() -> usize {
        enosys();
        libc::SIG_ERR
    }
}

impl<T> Missing for *mut T {
    fn missing() -> *mut T {
        enosys();
        std::ptr::null_mut()
    }
}
impl Missing for () {
    fn missing() {
        enosys();
    }
}

/// Declares hooks and their originals. Inside a body, `orig::name(..)` is
/// the next definition of the symbol (libc's).
#[macro_export]
macro_rules! hooks {
    ($(
        $(#[$meta:meta])*
        fn $name:ident($($arg:ident : $ty:ty),* $(,)?) -> $ret:ty $body:block
    )*) => {
        #[allow(non_upper_case_globals)]
        mod slot {
            $( pub static $name: $crate::hooks::Slot = $crate::hooks::Slot::new(concat!(stringify!($name), "\0")); )*
        }

        /// The originals of this family's hooks.
        pub mod orig {
            #[allow(unused_imports)]
            use super::*;
            $(
                #[allow(non_snake_case, clippy::missing_safety_doc, clippy::too_many_arguments)]
                #[inline]
                pub unsafe fn $name($($arg: $ty),*) -> $ret {
                    match super::slot::$name.get() {
                        Some(p) => {
                            // SAFETY: p is the address dlsym returned for the libc
                            // symbol of this name, whose C prototype is this signature.
                            let f: unsafe extern "C" fn($($ty),*) -> $ret = unsafe { std::mem::transmute(p) };
                            // SAFETY: arguments forwarded under the caller's contract.
                            unsafe { f($($arg),*) }
                        }
                        None => <$ret as $crate::hooks::Missing>::missing(),
                    }
                }
            )*
        }

        /// This family's symbols, for the FANSTORE_DEBUG report.
        pub fn symbols() -> &'static [&'static $crate::hooks::Slot] {
            static ALL: &[&$crate::hooks::Slot] = &[$(&slot::$name),*];
            ALL
        }

        $(
            $(#[$meta])*
            #[no_mangle]
            #[allow(clippy::missing_safety_doc, clippy::too_many_arguments)]
            pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret $body
        )*
    };
}

/// FANSTORE_DEBUG=1: which symbols this library hooks and whether each original resolved.
pub fn report_symbols() {
    let families: [(&str, &[&Slot]); 20] = [
        ("open", open::symbols()),
        ("stdio", stdio::symbols()),
        ("stat", stat::symbols()),
        ("meta", meta::symbols()),
        ("dir", dir::symbols()),
        ("cwd", cwd::symbols()),
        ("fd", fd::symbols()),
        ("lock", lock::symbols()),
        ("attr", attr::symbols()),
        ("xattr", xattr::symbols()),
        ("unlink", unlink::symbols()),
        ("mknod", mknod::symbols()),
        ("rename", rename::symbols()),
        ("tempname", tempname::symbols()),
        ("exec", exec::symbols()),
        ("walk", walk::symbols()),
        ("thread", thread::symbols()),
        ("signal", signal::symbols()),
        ("syscall", syscall::symbols()),
        ("inotify", inotify::symbols()),
    ];
    for (fam, slots) in families {
        let mut line = [0u8; 900];
        let mut len = 0;
        let mut missing = 0;
        for s in slots {
            let ok = s.probe();
            if !ok {
                missing += 1;
            }
            for part in [s.name().as_bytes(), if ok { b" " } else { b"(MISSING) " }] {
                let n = part.len().min(line.len() - len);
                line[len..len + n].copy_from_slice(&part[..n]);
                len += n;
            }
        }
        crate::debug::emit(format_args!("hooked {fam} [{} symbols, {missing} missing]: {}", slots.len(), B(&line[..len])));
    }
}

enum Step<T> {
    Real,
    Redirect,
    Done(T),
    Err(c_int),
}

/// Dispatches a call that names a path relative to `dirfd`: libc for paths
/// outside the mount (the caller's own path, untouched), `virt` for paths under it.
///
/// # Safety
/// `path` is null or a NUL-terminated string.
#[inline]
pub(crate) unsafe fn path_hook<T>(
    name: &'static str,
    dirfd: c_int,
    path: *const c_char,
    fail: T,
    virt: impl FnOnce(&VPath) -> Outcome<T>,
    real: impl FnOnce(*const c_char) -> T,
) -> T {
    let Some(g) = Guard::enter() else { return real(path) };
    // SAFETY: path is null or NUL-terminated per this function's contract.
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
    let ours = if dirfd == libc::AT_FDCWD { paths::vcwd().is_some() } else { fd_table::get(dirfd).is_some() };
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
/// caller's own paths, untouched); [`ops::two_paths`] decides the others.
///
/// # Safety
/// `p1` and `p2` are null or NUL-terminated strings.
pub(crate) unsafe fn two_path_hook(
    name: &'static str,
    d1: c_int,
    p1: *const c_char,
    d2: c_int,
    p2: *const c_char,
    virt: impl FnOnce(Option<&VPath>, Option<&VPath>) -> Outcome<c_int>,
    real: impl FnOnce(*const c_char, *const c_char) -> c_int,
) -> c_int {
    let Some(g) = Guard::enter() else { return real(p1, p2) };
    // SAFETY: p1/p2 are the caller's C strings (or null).
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
