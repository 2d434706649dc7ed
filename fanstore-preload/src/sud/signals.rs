//! The program's own SIGSYS handler, and SIGSYS never blocked.
//!
//! While raw syscalls are caught, the SIGSYS disposition is ours. A
//! program (a seccomp sandbox) that sets its own with sigaction, signal or
//! a raw rt_sigaction has it recorded here instead, gets the recorded one
//! back as the old action, and [`chain`] calls it for every SIGSYS that is
//! not a dispatch trap.
//!
//! A dispatch trap on a thread that blocks SIGSYS makes the kernel reset
//! the handler and kill the process, so SIGSYS is taken out of every mask a
//! program installs (sigprocmask, pthread_sigmask, sa_mask, raw
//! rt_sigprocmask).

use super::raw;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

static HANDLER: AtomicUsize = AtomicUsize::new(libc::SIG_DFL);
static FLAGS: AtomicU64 = AtomicU64::new(0);
/// The kernel's 64-bit signal mask (the first word of glibc's sigset_t).
static MASK: AtomicU64 = AtomicU64::new(0);
static RESTORER: AtomicUsize = AtomicUsize::new(0);

const SYS_BIT: u64 = 1 << (libc::SIGSYS - 1);

fn mask_word(s: &libc::sigset_t) -> u64 {
    // SAFETY: glibc's sigset_t is 128 bytes; its first 8 are the kernel's mask.
    unsafe { (s as *const libc::sigset_t as *const u64).read() }
}

fn record(handler: usize, flags: u64, mask: u64, restorer: usize) {
    FLAGS.store(flags, Ordering::Relaxed);
    MASK.store(mask, Ordering::Relaxed);
    RESTORER.store(restorer, Ordering::Relaxed);
    HANDLER.store(handler, Ordering::Release);
}

pub fn record_from(sa: &libc::sigaction) {
    record(sa.sa_sigaction, sa.sa_flags as u64, mask_word(&sa.sa_mask), sa.sa_restorer.map_or(0, |f| f as usize));
}

fn recorded() -> libc::sigaction {
    // SAFETY: a zeroed sigaction is a valid value.
    let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
    sa.sa_sigaction = HANDLER.load(Ordering::Acquire);
    sa.sa_flags = FLAGS.load(Ordering::Relaxed) as libc::c_int;
    // SAFETY: sa_mask is writable; we set its first (kernel) word.
    unsafe { (&mut sa.sa_mask as *mut libc::sigset_t as *mut u64).write(MASK.load(Ordering::Relaxed)) };
    sa
}

/// `sigaction(SIGSYS, act, oact)` while raw syscalls are caught: recorded,
/// not installed.
pub fn sigaction_sys(act: Option<&libc::sigaction>, oact: Option<&mut libc::sigaction>) {
    let old = recorded();
    if let Some(a) = act {
        record_from(a);
    }
    if let Some(o) = oact {
        *o = old;
    }
}

/// `signal(SIGSYS, h)` (flags: SA_RESTART for BSD semantics, or
/// SA_RESETHAND | SA_NODEFER for System V's): returns the old handler.
pub fn signal_sys(handler: usize, flags: libc::c_int) -> usize {
    let old = HANDLER.load(Ordering::Acquire);
    record(handler, flags as u64, 0, 0);
    old
}

/// A mask the program is about to install, without SIGSYS (`None`: unchanged).
pub fn strip(set: Option<&libc::sigset_t>) -> Option<libc::sigset_t> {
    let s = set?;
    if !super::on() || mask_word(s) & SYS_BIT == 0 {
        return None;
    }
    let mut copy = *s;
    // SAFETY: copy is a valid sigset_t.
    unsafe { libc::sigdelset(&mut copy, libc::SIGSYS) };
    Some(copy)
}

/// A trapped raw rt_sigaction(sig, act, oact, sigsetsize).
///
/// # Safety
/// `a` are the program's arguments: kernel `struct sigaction` pointers.
pub unsafe fn raw_sigaction(a: [u64; 6]) -> i64 {
    if a[0] as libc::c_int != libc::SIGSYS || a[3] != 8 {
        let mut b = a;
        let copy: [u64; 4];
        if a[1] != 0 && a[3] == 8 {
            // SAFETY: kernel struct sigaction: handler, flags, restorer, mask.
            let k = unsafe { (a[1] as *const [u64; 4]).read_unaligned() };
            copy = [k[0], k[1], k[2], k[3] & !SYS_BIT];
            b[1] = copy.as_ptr() as u64;
        }
        // SAFETY: the program's call (with SIGSYS taken out of the mask).
        return unsafe { raw::syscall6(libc::SYS_rt_sigaction, b) };
    }
    let old = [HANDLER.load(Ordering::Acquire) as u64, FLAGS.load(Ordering::Relaxed), RESTORER.load(Ordering::Relaxed) as u64, MASK.load(Ordering::Relaxed)];
    if a[1] != 0 {
        // SAFETY: as above (read before oact is written: they may alias).
        let k = unsafe { (a[1] as *const [u64; 4]).read_unaligned() };
        record(k[0] as usize, k[1], k[3], k[2] as usize);
    }
    if a[2] != 0 {
        // SAFETY: the program's out-pointer to a kernel struct sigaction.
        unsafe { (a[2] as *mut [u64; 4]).write_unaligned(old) };
    }
    0
}

/// A trapped raw rt_sigprocmask(how, set, oset, sigsetsize).
///
/// # Safety
/// `a` are the program's arguments.
pub unsafe fn raw_sigprocmask(a: [u64; 6]) -> i64 {
    let mut b = a;
    let m: u64;
    if a[1] != 0 && a[0] as libc::c_int != libc::SIG_UNBLOCK && a[3] == 8 {
        // SAFETY: the program's 8-byte kernel sigset.
        m = unsafe { (a[1] as *const u64).read_unaligned() } & !SYS_BIT;
        b[1] = &m as *const u64 as u64;
    }
    // SAFETY: the program's call (with SIGSYS taken out of the new mask).
    unsafe { raw::syscall6(libc::SYS_rt_sigprocmask, b) }
}

/// A SIGSYS that is not a dispatch trap: the program's handler, or the
/// default action (terminate with a core), or nothing when ignored.
///
/// # Safety
/// The kernel's handler arguments.
pub unsafe fn chain(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    let sa = recorded();
    match sa.sa_sigaction {
        libc::SIG_IGN => {}
        libc::SIG_DFL => {
            // SAFETY: a zeroed sigaction is SIG_DFL with an empty mask.
            let dfl: libc::sigaction = unsafe { std::mem::zeroed() };
            // SAFETY: the real sigaction and raise; SIGSYS is not blocked in
            // this handler (SA_NODEFER), so the default action happens now.
            unsafe {
                crate::real::sigaction(libc::SIGSYS, &dfl, std::ptr::null_mut());
                libc::raise(libc::SIGSYS);
            }
        }
        h => {
            if sa.sa_flags & libc::SA_RESETHAND != 0 {
                record(libc::SIG_DFL, 0, 0, 0);
            }
            // The program's sa_mask applies while its handler runs (never SIGSYS).
            // SAFETY: zeroed sigsets are valid; real pthread_sigmask with valid pointers.
            let mut old: libc::sigset_t = unsafe { std::mem::zeroed() };
            let mut add = sa.sa_mask;
            // SAFETY: add is a valid sigset_t.
            unsafe { libc::sigdelset(&mut add, libc::SIGSYS) };
            // SAFETY: valid pointers; the real function (ours would strip again).
            unsafe { crate::real::pthread_sigmask(libc::SIG_BLOCK, &add, &mut old) };
            if sa.sa_flags & libc::SA_SIGINFO != 0 {
                // SAFETY: the program installed a three-argument handler.
                let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) = unsafe { std::mem::transmute(h) };
                f(sig, info, ctx);
            } else {
                // SAFETY: the program installed a one-argument handler.
                let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(h) };
                f(sig);
            }
            // SAFETY: restores the mask saved above.
            unsafe { crate::real::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
        }
    }
}
