//! The SIGSYS handler. A trapped raw syscall (si_code SYS_USER_DISPATCH)
//! is served by [`dispatch`] and its result (a value or -errno) is written
//! into the interrupted context's rax; any other SIGSYS (a seccomp filter's
//! SECCOMP_RET_TRAP, a kill) goes to the program's own SIGSYS handler
//! (see signals.rs).
//!
//! The selector is ALLOW while a trap is served, so every syscall the
//! handler makes (ours, libc's, the re-issued one) runs natively; it is put
//! back before returning. A chained program handler runs with the selector
//! untouched, so its raw syscalls are caught too.

use super::{dispatch, get_selector, set_selector, signals, ALLOW};
use crate::errno::{errno, set_errno};
use libc::{c_int, c_void, siginfo_t};
use std::sync::atomic::{AtomicU64, Ordering};

/// `si_code` of a syscall user dispatch SIGSYS.
const SYS_USER_DISPATCH: c_int = 2;

/// Trapped syscalls served so far in this process (tests, debugging).
static TRAPS: AtomicU64 = AtomicU64::new(0);

#[cfg_attr(not(test), allow(dead_code))]
pub fn traps() -> u64 {
    TRAPS.load(Ordering::Relaxed)
}

/// Installs the handler, recording what it replaces as the program's.
pub fn install() -> bool {
    // SAFETY: a zeroed sigaction is a valid value (SIG_DFL, empty mask).
    let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
    sa.sa_sigaction = on_sigsys as *const () as usize;
    // SA_NODEFER: a SIGSYS raised while this handler runs (a seccomp trap of
    // a re-issued call) must not find SIGSYS blocked, or the kernel would
    // kill the process. SA_ONSTACK: runtimes with small stacks (Go) run
    // signal handlers on their sigaltstack.
    sa.sa_flags = libc::SA_SIGINFO | libc::SA_NODEFER | libc::SA_ONSTACK;
    // SAFETY: a zeroed sigaction is a valid out-value.
    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: valid in/out pointers; the real sigaction (ours records instead).
    if unsafe { crate::real::sigaction(libc::SIGSYS, &sa, &mut old) } != 0 {
        return false;
    }
    signals::record_from(&old);
    true
}

extern "C" fn on_sigsys(sig: c_int, info: *mut siginfo_t, ctx: *mut c_void) {
    // SAFETY: the kernel passes a valid siginfo (SA_SIGINFO).
    let code = unsafe { info.as_ref() }.map_or(0, |i| i.si_code);
    if code != SYS_USER_DISPATCH || ctx.is_null() {
        // Not a trap: the program's handler runs with the selector as it
        // is (BLOCK on an armed thread), so its raw syscalls are caught.
        // SAFETY: the kernel's arguments, handed on unchanged.
        unsafe { signals::chain(sig, info, ctx) };
        return;
    }
    let prev = get_selector();
    set_selector(ALLOW);
    TRAPS.fetch_add(1, Ordering::Relaxed);
    let saved = errno();
    // SAFETY: with SA_SIGINFO the third argument is the interrupted
    // context, which this handler owns until it returns.
    let uc = unsafe { &mut *(ctx as *mut libc::ucontext_t) };
    let g = &uc.uc_mcontext.gregs;
    let nr = g[libc::REG_RAX as usize];
    let a = [
        g[libc::REG_RDI as usize] as u64,
        g[libc::REG_RSI as usize] as u64,
        g[libc::REG_RDX as usize] as u64,
        g[libc::REG_R10 as usize] as u64,
        g[libc::REG_R8 as usize] as u64,
        g[libc::REG_R9 as usize] as u64,
    ];
    let ip = g[libc::REG_RIP as usize] as usize;
    // SAFETY: the program's own system call, with its own arguments.
    let r = crate::guard::catch(|| unsafe { dispatch::call(nr, a, ip, uc) }, Some(-(libc::EIO as i64)));
    if let Some(r) = r {
        uc.uc_mcontext.gregs[libc::REG_RAX as usize] = r;
    }
    crate::dlog!("raw syscall {nr} at {ip:#x} = {}", r.unwrap_or(0));
    set_errno(saved);
    set_selector(prev);
}
