//! glob, ftw and nftw. glibc implements them with its internal opendir/stat,
//! which bypass every preload hook, so:
//! - glob of a pattern that may be under the mount runs glibc's glob with
//!   GLOB_ALTDIRFUNC pointing at our own opendir/readdir/closedir/stat/lstat;
//! - ftw/nftw from a start path under the mount walk the index (ops::walk).

use super::{cbytes, path_hook};
use crate::guard::Guard;
use crate::ops::walk::{walk, Callback, FtwFn, NftwFn};
use crate::paths::maybe_ours;
use crate::real::{self, ErrFunc, GlobT};
use libc::{c_char, c_int, c_void, dirent};

pub const GLOB_ALTDIRFUNC: c_int = 1 << 9;

/// Points glob's directory functions at our hooks when `pattern` may be ours.
unsafe fn prepare_glob(pattern: *const c_char, flags: c_int, g: *mut GlobT) -> c_int {
    // Bad pointers are glibc's glob's, untouched.
    if flags & GLOB_ALTDIRFUNC != 0 || !crate::user_mem::writable_one(g) || !crate::user_mem::cstr(pattern) {
        return flags;
    }
    let Some(guard) = Guard::enter() else { return flags };
    // SAFETY: pattern is a readable C string (probed).
    let ours = unsafe { maybe_ours(libc::AT_FDCWD, pattern) } && crate::state::state().is_some();
    drop(guard);
    if !ours {
        return flags;
    }
    // SAFETY: pattern is the caller's C string.
    crate::dlog!("glob({}) through the virtual tree", crate::debug::B(unsafe { cbytes(pattern) }.unwrap_or(b"")));
    // SAFETY: g is the caller's glob_t (writable: probed); the function pointers are our exported
    // hooks, ABI-compatible with glob's callback types (DIR * is opaque; a
    // closedir's int result is ignored by glob).
    unsafe {
        let g = &mut *g;
        g.gl_opendir = Some(std::mem::transmute::<unsafe extern "C" fn(*const c_char) -> *mut libc::DIR, unsafe extern "C" fn(*const c_char) -> *mut c_void>(super::dir::opendir));
        g.gl_readdir = Some(std::mem::transmute::<unsafe extern "C" fn(*mut libc::DIR) -> *mut dirent, unsafe extern "C" fn(*mut c_void) -> *mut dirent>(super::dir::readdir));
        g.gl_closedir = Some(std::mem::transmute::<unsafe extern "C" fn(*mut libc::DIR) -> c_int, unsafe extern "C" fn(*mut c_void)>(super::dir::closedir));
        g.gl_stat = Some(super::stat::stat);
        g.gl_lstat = Some(super::stat::lstat);
    }
    flags | GLOB_ALTDIRFUNC
}

crate::hooks! {
    fn glob(pattern: *const c_char, flags: c_int, errfunc: ErrFunc, g: *mut GlobT) -> c_int {
        let flags = prepare_glob(pattern, flags, g);
        real::glob(pattern, flags, errfunc, g)
    }
    fn glob64(pattern: *const c_char, flags: c_int, errfunc: ErrFunc, g: *mut GlobT) -> c_int {
        let flags = prepare_glob(pattern, flags, g);
        real::glob64(pattern, flags, errfunc, g)
    }
    fn nftw(path: *const c_char, f: Option<NftwFn>, nopenfd: c_int, flags: c_int) -> c_int {
        let Some(cb) = f else { return real::nftw(path, f, nopenfd, flags) };
        path_hook("nftw", libc::AT_FDCWD, path, -1,
            |vp| walk(vp, cbytes(path).unwrap_or(b""), Callback::Nftw(cb), flags),
            |p| real::nftw(p, f, nopenfd, flags))
    }
    fn nftw64(path: *const c_char, f: Option<NftwFn>, nopenfd: c_int, flags: c_int) -> c_int {
        let Some(cb) = f else { return real::nftw64(path, f, nopenfd, flags) };
        path_hook("nftw64", libc::AT_FDCWD, path, -1,
            |vp| walk(vp, cbytes(path).unwrap_or(b""), Callback::Nftw(cb), flags),
            |p| real::nftw64(p, f, nopenfd, flags))
    }
    fn ftw(path: *const c_char, f: Option<FtwFn>, nopenfd: c_int) -> c_int {
        let Some(cb) = f else { return real::ftw(path, f, nopenfd) };
        path_hook("ftw", libc::AT_FDCWD, path, -1,
            |vp| walk(vp, cbytes(path).unwrap_or(b""), Callback::Ftw(cb), 0),
            |p| real::ftw(p, f, nopenfd))
    }
    fn ftw64(path: *const c_char, f: Option<FtwFn>, nopenfd: c_int) -> c_int {
        let Some(cb) = f else { return real::ftw64(path, f, nopenfd) };
        path_hook("ftw64", libc::AT_FDCWD, path, -1,
            |vp| walk(vp, cbytes(path).unwrap_or(b""), Callback::Ftw(cb), 0),
            |p| real::ftw64(p, f, nopenfd))
    }
}
