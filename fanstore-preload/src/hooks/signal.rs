//! sigaction, signal and the mask calls, while raw syscalls are caught:
//! the program's SIGSYS disposition is recorded (ours stays installed and
//! chains to it) and SIGSYS is never blocked (see sud/signals.rs).

use crate::real;
use crate::sud::{self, signals};
use libc::{c_int, sighandler_t, sigset_t};

unsafe fn signal_common(sig: c_int, handler: sighandler_t, flags: c_int, real: impl FnOnce() -> sighandler_t) -> sighandler_t {
    if sig == libc::SIGSYS && sud::on() {
        return signals::signal_sys(handler, flags);
    }
    real()
}

crate::hooks! {
    fn sigaction(sig: c_int, act: *const libc::sigaction, oact: *mut libc::sigaction) -> c_int {
        if sig == libc::SIGSYS && sud::on() {
            // A copy: act and oact may be the same struct.
            let new = act.as_ref().copied();
            signals::sigaction_sys(new.as_ref(), oact.as_mut());
            return 0;
        }
        match act.as_ref().and_then(|a| signals::strip(Some(&a.sa_mask)).map(|m| (a, m))) {
            Some((a, m)) => {
                let mut copy = *a;
                copy.sa_mask = m;
                real::sigaction(sig, &copy, oact)
            }
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
        let stripped = if how == libc::SIG_UNBLOCK { None } else { signals::strip(set.as_ref()) };
        match stripped {
            Some(m) => real::sigprocmask(how, &m, oset),
            None => real::sigprocmask(how, set, oset),
        }
    }
    fn pthread_sigmask(how: c_int, set: *const sigset_t, oset: *mut sigset_t) -> c_int {
        let stripped = if how == libc::SIG_UNBLOCK { None } else { signals::strip(set.as_ref()) };
        match stripped {
            Some(m) => real::pthread_sigmask(how, &m, oset),
            None => real::pthread_sigmask(how, set, oset),
        }
    }
}
