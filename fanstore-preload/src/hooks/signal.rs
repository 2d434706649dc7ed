//! sigaction, signal and the mask calls:
//! - while raw syscalls are caught, the program's SIGSYS disposition is
//!   recorded (ours stays installed and chains to it) and SIGSYS is never
//!   blocked (see sud/signals.rs);
//! - the program's SIGSEGV and SIGBUS dispositions are recorded likewise:
//!   the handler that makes the library's pointer probes safe stays first
//!   and chains to the program's (see user_mem.rs).

use crate::real;
use crate::sud::{self, signals};
use crate::user_mem;
use libc::{c_int, sighandler_t, sigset_t};

unsafe fn signal_common(sig: c_int, handler: sighandler_t, flags: c_int, real: impl FnOnce() -> sighandler_t) -> sighandler_t {
    if sig == libc::SIGSYS && sud::on() {
        return signals::signal_sys(handler, flags);
    }
    if user_mem::is_ours(sig) {
        return user_mem::signal(sig, handler, flags);
    }
    real()
}

crate::hooks! {
    fn sigaction(sig: c_int, act: *const libc::sigaction, oact: *mut libc::sigaction) -> c_int {
        // Bad pointers are libc's (which reads and writes them itself), untouched.
        if !user_mem::readable_or_null(act) || !(oact.is_null() || user_mem::writable_one(oact)) {
            return real::sigaction(sig, act, oact);
        }
        if sig == libc::SIGSYS && sud::on() {
            // A copy: act and oact may be the same struct.
            let new = act.as_ref().copied();
            signals::sigaction_sys(new.as_ref(), oact.as_mut());
            return 0;
        }
        // The action as installed: SIGSYS never in its mask.
        let stripped = act.as_ref().map(|a| match signals::strip(Some(&a.sa_mask)) {
            Some(m) => {
                let mut copy = *a;
                copy.sa_mask = m;
                copy
            }
            None => *a,
        });
        if user_mem::is_ours(sig) {
            return user_mem::sigaction(sig, stripped, oact.as_mut());
        }
        match stripped {
            Some(copy) => real::sigaction(sig, &copy, oact),
            None => real::sigaction(sig, act, oact),
        }
    }
    fn signal(sig: c_int, handler: sighandler_t) -> sighandler_t {
        signal_common(sig, handler, libc::SA_RESTART, || real::signal(sig, handler))
    }
    fn bsd_signal(sig: c_int, handler: sighandler_t) -> sighandler_t {
        signal_common(sig, handler, libc::SA_RESTART, || real::bsd_signal(sig, handler))
    }
    fn sysv_signal(sig: c_int, handler: sighandler_t) -> sighandler_t {
        signal_common(sig, handler, libc::SA_RESETHAND | libc::SA_NODEFER, || real::sysv_signal(sig, handler))
    }
    fn __sysv_signal(sig: c_int, handler: sighandler_t) -> sighandler_t {
        signal_common(sig, handler, libc::SA_RESETHAND | libc::SA_NODEFER, || real::__sysv_signal(sig, handler))
    }
    fn sigprocmask(how: c_int, set: *const sigset_t, oset: *mut sigset_t) -> c_int {
        if !user_mem::readable_or_null(set) {
            return real::sigprocmask(how, set, oset);
        }
        let stripped = if how == libc::SIG_UNBLOCK { None } else { signals::strip(set.as_ref()) };
        match stripped {
            Some(m) => real::sigprocmask(how, &m, oset),
            None => real::sigprocmask(how, set, oset),
        }
    }
    fn pthread_sigmask(how: c_int, set: *const sigset_t, oset: *mut sigset_t) -> c_int {
        if !user_mem::readable_or_null(set) {
            return real::pthread_sigmask(how, set, oset);
        }
        let stripped = if how == libc::SIG_UNBLOCK { None } else { signals::strip(set.as_ref()) };
        match stripped {
            Some(m) => real::pthread_sigmask(how, &m, oset),
            None => real::pthread_sigmask(how, set, oset),
        }
    }
}
