//! execve, execv, execvp, execvpe, fexecve, posix_spawn, posix_spawnp: the
//! outputs this process is writing reach the new image through its
//! environment ([`crate::exec_outputs`]). With no output open, each passes
//! the caller's arguments to libc untouched.
//!
//! `_exit` and `_Exit` commit the outputs still open first, and send the
//! hints still queued ([`crate::warm`]), as `exit` does through its
//! handlers (glibc's `exit` calls its internal `_exit`, not this one, so
//! nothing is committed or sent twice).
//!
//! Not hooked: the variadic execl, execle and execlp (stable Rust cannot
//! define a C variadic function), and system/popen (glibc spawns their shell
//! internally, with the process's environment): an output open in a
//! process that calls those is still committed by that process, but one
//! that a child opens and then execs through them is not.

use crate::real;
use libc::{c_char, c_int, pid_t};

extern "C" {
    static environ: *const *const c_char;
}

/// Resolves the originals of `_exit` and `_Exit` now (the constructor):
/// a program may call `_exit` from a signal handler, where a first `dlsym`
/// could wait for the dynamic loader's lock held by the thread it
/// interrupted.
pub fn resolve_exits() {
    let _ = crate::real::slot::_exit.get();
    let _ = crate::real::slot::_Exit.get();
}

/// Calls `exec` with `envp`, or with a copy of it that also carries the
/// outputs the new image inherits (`replaces`: an exec, which ends this
/// image; false for a spawn).
///
/// # Safety
/// `envp` is null or a null-terminated array of NUL-terminated strings
/// (or holds bad pointers: probed).
unsafe fn with_outputs<T>(envp: *const *const c_char, replaces: bool, exec: impl FnOnce(*const *const c_char) -> T) -> T {
    if crate::outputs::max_fd() < 0 {
        return exec(envp);
    }
    // The new image gets writable copies: it cannot know a lazy fd.
    crate::ops::lazy_copy::make_all_writable();
    let Some(var) = crate::guard::catch(|| crate::exec_outputs::entries(replaces), None) else { return exec(envp) };
    let mut env: Vec<*const c_char> = Vec::new();
    let mut p = envp;
    // SAFETY: envp is walked up to its null entry, each slot and each
    // entry probed before it is read: a bad environment is the kernel's
    // (EFAULT), passed on untouched.
    unsafe {
        while !p.is_null() {
            if !crate::user_mem::readable_one(p) {
                return exec(envp);
            }
            if (*p).is_null() {
                break;
            }
            if !crate::user_mem::cstr(*p) {
                return exec(envp);
            }
            if !std::ffi::CStr::from_ptr(*p).to_bytes().starts_with(crate::exec_outputs::VAR) {
                env.push(*p);
            }
            p = p.add(1);
        }
    }
    env.push(var.as_ptr().cast());
    env.push(std::ptr::null());
    let r = exec(env.as_ptr());
    drop(env);
    drop(var);
    r
}

crate::hooks! {
    fn execve(path: *const c_char, argv: *const *const c_char, envp: *const *const c_char) -> c_int {
        with_outputs(envp, true, |e| real::execve(path, argv, e))
    }
    fn execv(path: *const c_char, argv: *const *const c_char) -> c_int {
        with_outputs(environ, true, |e| real::execve(path, argv, e))
    }
    fn execvp(file: *const c_char, argv: *const *const c_char) -> c_int {
        with_outputs(environ, true, |e| real::execvpe(file, argv, e))
    }
    fn execvpe(file: *const c_char, argv: *const *const c_char, envp: *const *const c_char) -> c_int {
        with_outputs(envp, true, |e| real::execvpe(file, argv, e))
    }
    fn fexecve(fd: c_int, argv: *const *const c_char, envp: *const *const c_char) -> c_int {
        with_outputs(envp, true, |e| real::fexecve(fd, argv, e))
    }
    fn posix_spawn(
        pid: *mut pid_t,
        path: *const c_char,
        actions: *const libc::posix_spawn_file_actions_t,
        attr: *const libc::posix_spawnattr_t,
        argv: *const *mut c_char,
        envp: *const *mut c_char,
    ) -> c_int {
        with_outputs(envp.cast(), false, |e| real::posix_spawn(pid, path, actions, attr, argv, e.cast()))
    }
    fn posix_spawnp(
        pid: *mut pid_t,
        file: *const c_char,
        actions: *const libc::posix_spawn_file_actions_t,
        attr: *const libc::posix_spawnattr_t,
        argv: *const *mut c_char,
        envp: *const *mut c_char,
    ) -> c_int {
        with_outputs(envp.cast(), false, |e| real::posix_spawnp(pid, file, actions, attr, argv, e.cast()))
    }
    fn _exit(status: c_int) -> () {
        crate::guard::catch(crate::outputs::commit_all, ());
        crate::guard::catch(crate::warm::flush, ());
        real::_exit(status)
    }
    fn _Exit(status: c_int) -> () {
        crate::guard::catch(crate::outputs::commit_all, ());
        crate::guard::catch(crate::warm::flush, ());
        real::_Exit(status)
    }
}
