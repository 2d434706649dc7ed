//! sigaction, signal and the mask calls, while raw syscalls are caught:
//! the program's SIGSYS disposition is recorded (ours stays installed and
//! chains to it) and SIGSYS is never blocked (see sud/signals.rs).

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
                orig::sigaction(sig, &copy, oact)
            }
            None => orig::sigaction(sig, act, oact),
        }
    }
    fn signal(sig: c_int, handler: sighandler_t) -> sighandler_t {
        signal_common(sig, handler, libc::SA_RESTART, || orig::signal(sig, handler))
    }
    fn bsd_signal(sig: c_int, handler: sighandler_t) -> sighandler_t {
        signal_common(sig, handler, libc::SA_RESTART, || orig::bsd_signal(sig, handler))
    }
    fn sysv_signal(sig: c_int, handler: sighandler_t) -> sighandler_t {
        signal_common(sig, handler, libc::SA_RESETHAND | libc::SA_NODEFER, || orig::sysv_signal(sig, handler))
    }
    fn __sysv_signal(sig: c_int, handler: sighandler_t) -> sighandler_t {
        signal_common(sig, handler, libc::SA_RESETHAND | libc::SA_NODEFER, || orig::__sysv_signal(sig, handler))
    }
    fn sigprocmask(how: c_int, set: *const sigset_t, oset: *mut sigset_t) -> c_int {
        let stripped = if how == libc::SIG_UNBLOCK { None } else { signals::strip(set.as_ref()) };
        match stripped {
            Some(m) => orig::sigprocmask(how, &m, oset),
            None => orig::sigprocmask(how, set, oset),
        }
    }
    fn pthread_sigmask(how: c_int, set: *const sigset_t, oset: *mut sigset_t) -> c_int {
        let stripped = if how == libc::SIG_UNBLOCK { None } else { signals::strip(set.as_ref()) };
        match stripped {
            Some(m) => orig::pthread_sigmask(how, &m, oset),
            None => orig::pthread_sigmask(how, set, oset),
        }
    }
}
