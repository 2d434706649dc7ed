//! fopen, freopen, fclose and fdopen: streams on virtual files are libc's
//! own, on the real fd [`crate::ops::stdio`] opens. A stream writes
//! through glibc's internal write, which no hook sees: fdopen for writing
//! of an output fd waiting for its copy makes the copy first
//! ([`crate::ops::lazy_copy`]).

use super::{cstr, path_hook};
use crate::fd_table;
use crate::ops::stdio;
use crate::real;
use crate::user_mem;
use libc::{c_char, c_int, FILE};

unsafe fn fopen_common(
    name: &'static str,
    path: *const c_char,
    mode: *const c_char,
    real: impl FnOnce(*const c_char) -> *mut FILE,
) -> *mut FILE {
    // A bad mode is libc's (it parses the mode before opening).
    if !user_mem::cstr(mode) {
        return real(path);
    }
    // SAFETY: path is the caller's C string; mode likewise (probed, read only when ours).
    unsafe { path_hook(name, libc::AT_FDCWD, path, std::ptr::null_mut(), |vp| stdio::fopen(vp, cstr(mode)), real) }
}

unsafe fn freopen_common(
    name: &'static str,
    path: *const c_char,
    mode: *const c_char,
    stream: *mut FILE,
    real: impl Fn(*const c_char) -> *mut FILE,
) -> *mut FILE {
    if !user_mem::cstr(path) || !user_mem::cstr(mode) {
        return real(path);
    }
    // SAFETY: stream is the caller's live FILE.
    stdio::replacing(unsafe { libc::fileno(stream) });
    let mut node = None;
    // SAFETY: path and mode are the caller's C strings, stream its live FILE.
    let r = unsafe {
        path_hook(name, libc::AT_FDCWD, path, std::ptr::null_mut(), |vp| stdio::freopen(vp, cstr(mode), stream, &mut node), &real)
    };
    if let (Some(t), false) = (node, r.is_null()) {
        // SAFETY: r is the live stream freopen returned.
        stdio::reopened(unsafe { libc::fileno(r) }, t);
    }
    r
}

crate::hooks! {
    fn fopen(path: *const c_char, mode: *const c_char) -> *mut FILE {
        fopen_common("fopen", path, mode, |p| real::fopen(p, mode))
    }
    fn fopen64(path: *const c_char, mode: *const c_char) -> *mut FILE {
        fopen_common("fopen64", path, mode, |p| real::fopen64(p, mode))
    }
    fn freopen(path: *const c_char, mode: *const c_char, stream: *mut FILE) -> *mut FILE {
        freopen_common("freopen", path, mode, stream, |p| real::freopen(p, mode, stream))
    }
    fn freopen64(path: *const c_char, mode: *const c_char, stream: *mut FILE) -> *mut FILE {
        freopen_common("freopen64", path, mode, stream, |p| real::freopen64(p, mode, stream))
    }
    fn fdopen(fd: c_int, mode: *const c_char) -> *mut FILE {
        if fd_table::is_lazy(fd) && user_mem::cstr(mode) && stdio::writes(cstr(mode)) {
            if let Err(e) = crate::ops::lazy_copy::make_writable(fd) {
                crate::errno::set_errno(e);
                return std::ptr::null_mut();
            }
        }
        real::fdopen(fd, mode)
    }
    fn fclose(stream: *mut FILE) -> c_int {
        let mut err = None;
        if fd_table::any() && !stream.is_null() {
            err = stdio::before_fclose(libc::fileno(stream), || {
                libc::fflush(stream);
            });
        }
        let r = real::fclose(stream);
        match err {
            Some(e) => {
                crate::errno::set_errno(e);
                -1
            }
            None => r,
        }
    }
}
