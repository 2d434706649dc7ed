//! chdir, fchdir, getcwd, get_current_dir_name with a virtual cwd.

use super::{fd_hook, path_hook};
use crate::ops::cwd;
use crate::real;
use fanstore_core::path::MAX_PATH;
use libc::{c_char, c_int, size_t};

/// getcwd's answer for the virtual cwd, with glibc's buffer rules.
unsafe fn put_cwd(buf: *mut c_char, size: size_t, path: &[u8]) -> *mut c_char {
    let need = path.len() + 1;
    // SAFETY (whole block): we write at most `need` bytes, into the caller's
    // buffer only when size >= need and it is writable (probed), else into
    // a malloc'd one as glibc does for a null buffer.
    unsafe {
        let dst = if buf.is_null() {
            let p = libc::malloc(need.max(size)) as *mut c_char;
            if p.is_null() {
                crate::errno::set_errno(libc::ENOMEM);
                return p;
            }
            if size != 0 && size < need {
                libc::free(p.cast());
                crate::errno::set_errno(libc::ERANGE);
                return std::ptr::null_mut();
            }
            p
        } else {
            if size == 0 {
                crate::errno::set_errno(libc::EINVAL);
                return std::ptr::null_mut();
            }
            if size < need {
                crate::errno::set_errno(libc::ERANGE);
                return std::ptr::null_mut();
            }
            if !crate::user_mem::writable(buf, need) {
                crate::errno::set_errno(libc::EFAULT);
                return std::ptr::null_mut();
            }
            buf
        };
        std::ptr::copy_nonoverlapping(path.as_ptr(), dst as *mut u8, path.len());
        *dst.add(path.len()) = 0;
        dst
    }
}

/// Loads the state, so that the look at the virtual cwd that follows
/// restores one inherited through exec.
fn init_for_cwd() {
    if let Some(g) = crate::guard::Guard::enter() {
        crate::state::ensure_init();
        drop(g);
    }
}

crate::hooks! {
    fn chdir(path: *const c_char) -> c_int {
        path_hook("chdir", libc::AT_FDCWD, path, -1, cwd::chdir, |p| {
            let r = real::chdir(p);
            if r == 0 {
                cwd::left_virtual();
            }
            r
        })
    }
    fn fchdir(fd: c_int) -> c_int {
        fd_hook("fchdir", fd, -1, |t| cwd::fchdir(fd, t), || {
            let r = real::fchdir(fd);
            if r == 0 {
                cwd::left_virtual();
            }
            r
        })
    }
    fn getcwd(buf: *mut c_char, size: size_t) -> *mut c_char {
        init_for_cwd();
        if crate::vcwd::vcwd().is_some() {
            let mut out = [0u8; MAX_PATH];
            if let Some(len) = cwd::current(&mut out) {
                return put_cwd(buf, size, &out[..len]);
            }
        }
        real::getcwd(buf, size)
    }
    fn get_current_dir_name() -> *mut c_char {
        init_for_cwd();
        if crate::vcwd::vcwd().is_some() {
            let mut out = [0u8; MAX_PATH];
            if let Some(len) = cwd::current(&mut out) {
                return put_cwd(std::ptr::null_mut(), 0, &out[..len]);
            }
        }
        real::get_current_dir_name()
    }
}
