//! fopen/freopen of virtual files: the real fd from ops::open, then libc's
//! own fdopen, so stdio (and C++ streams on top of it) work natively.
//! fclose must be seen: glibc closes the fd internally, not through close().

use super::{cbytes, path_hook};
use crate::fd_table;
use crate::ops::{self, Outcome};
use libc::{c_char, c_int, FILE};

unsafe fn fopen_common(
    name: &'static str,
    path: *const c_char,
    mode: *const c_char,
    real: impl FnOnce(*const c_char) -> *mut FILE,
) -> *mut FILE {
    // SAFETY: path is the caller's C string; mode likewise (read only when ours).
    unsafe {
        path_hook(
            name,
            libc::AT_FDCWD,
            path,
            std::ptr::null_mut(),
            |vp| {
                let Some(flags) = cbytes(mode).and_then(ops::open::fopen_flags) else {
                    return Outcome::Errno(libc::EINVAL);
                };
                let fd = match ops::open::open(vp, flags, 0o666) {
                    Outcome::Handled(fd) => fd,
                    Outcome::Errno(e) => return Outcome::Errno(e),
                    Outcome::Passthrough => return Outcome::Passthrough,
                };
                let m = if matches!(fd_table::get(fd), Some(fd_table::Tracked::Output(_))) { mode } else { c"r".as_ptr() };
                let f = libc::fdopen(fd, m);
                if f.is_null() {
                    let e = *libc::__errno_location();
                    fd_table::clear(fd);
                    crate::real::close(fd);
                    return Outcome::Errno(e);
                }
                Outcome::Handled(f)
            },
            real,
        )
    }
}

unsafe fn freopen_common(
    name: &'static str,
    path: *const c_char,
    mode: *const c_char,
    stream: *mut FILE,
    real: impl Fn(*const c_char) -> *mut FILE,
) -> *mut FILE {
    if path.is_null() {
        return real(path);
    }
    // The old fd is closed inside glibc: forget it first.
    // SAFETY: stream is the caller's live FILE.
    let old = unsafe { libc::fileno(stream) };
    if old >= 0 {
        ops::fd::before_close(old);
    }
    let mut node = None;
    // SAFETY: path and mode are the caller's C strings.
    let r = unsafe {
        path_hook(
            name,
            libc::AT_FDCWD,
            path,
            std::ptr::null_mut(),
            |vp| {
                let Some(flags) = cbytes(mode).and_then(ops::open::fopen_flags) else {
                    return Outcome::Errno(libc::EINVAL);
                };
                let fd = match ops::open::open(vp, flags, 0o666) {
                    Outcome::Handled(fd) => fd,
                    Outcome::Errno(e) => return Outcome::Errno(e),
                    Outcome::Passthrough => return Outcome::Passthrough,
                };
                node = fd_table::get(fd);
                // Reopen through /proc so the stream gets its own description
                // of the same bytes, then drop ours.
                let mut p = *b"/proc/self/fd/\0\0\0\0\0\0\0\0\0\0\0\0";
                let s = fd.to_string();
                p[14..14 + s.len()].copy_from_slice(s.as_bytes());
                let f = crate::real::freopen(p.as_ptr().cast(), c"r".as_ptr(), stream);
                fd_table::clear(fd);
                crate::real::close(fd);
                if f.is_null() {
                    return Outcome::Errno(*libc::__errno_location());
                }
                Outcome::Handled(f)
            },
            &real,
        )
    };
    if let (Some(t), false) = (node, r.is_null()) {
        // SAFETY: r is the live stream freopen returned.
        fd_table::set(unsafe { libc::fileno(r) }, t);
    }
    r
}

crate::hooks! {
    fn fopen(path: *const c_char, mode: *const c_char) -> *mut FILE {
        fopen_common("fopen", path, mode, |p| orig::fopen(p, mode))
    }
    fn fopen64(path: *const c_char, mode: *const c_char) -> *mut FILE {
        fopen_common("fopen64", path, mode, |p| orig::fopen64(p, mode))
    }
    fn freopen(path: *const c_char, mode: *const c_char, stream: *mut FILE) -> *mut FILE {
        freopen_common("freopen", path, mode, stream, |p| orig::freopen(p, mode, stream))
    }
    fn freopen64(path: *const c_char, mode: *const c_char, stream: *mut FILE) -> *mut FILE {
        freopen_common("freopen64", path, mode, stream, |p| orig::freopen64(p, mode, stream))
    }
    fn fclose(stream: *mut FILE) -> c_int {
        let mut err = None;
        if fd_table::any() && !stream.is_null() {
            let fd = libc::fileno(stream);
            if matches!(fd_table::get(fd), Some(fd_table::Tracked::Output(_))) {
                // The stream's buffer must reach the output file before the commit.
                libc::fflush(stream);
            }
            err = ops::fd::before_close(fd);
        }
        let r = orig::fclose(stream);
        match err {
            Some(e) => {
                crate::errno::set_errno(e);
                -1
            }
            None => r,
        }
    }
}
