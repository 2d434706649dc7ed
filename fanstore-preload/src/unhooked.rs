//! System calls that no hook sees: neither a libc symbol (hooked) nor a
//! trap of syscall user dispatch (`crate::sud`), for library code that must
//! not re-enter itself and for the SIGSYS handler re-issuing a trapped
//! call. This thread's selector byte, which the kernel reads on every
//! syscall made outside libc once the thread is armed, is kept here: at
//! ALLOW around [`syscall6`] its `syscall` instruction (outside libc's
//! range) runs natively instead of trapping.

use std::arch::asm;
use std::cell::Cell;

/// Selector values (`SYSCALL_DISPATCH_FILTER_*`).
pub const ALLOW: u8 = 0;
pub const BLOCK: u8 = 1;

thread_local! {
    /// This thread's selector byte (the kernel reads it on every syscall
    /// made outside libc). A const-initialised Cell<u8>: a bare TLS slot,
    /// valid from thread start to thread exit, never lazily registered.
    static SELECTOR: Cell<u8> = const { Cell::new(ALLOW) };
}

/// This thread's selector byte.
#[inline]
pub fn selector() -> *mut u8 {
    SELECTOR.with(|c| c.as_ptr())
}

#[inline]
pub fn set_selector(v: u8) {
    // SAFETY: the pointer is this thread's live TLS slot; a volatile write so
    // that the store is not moved across the syscalls it governs.
    unsafe { std::ptr::write_volatile(selector(), v) }
}

#[inline]
pub fn get_selector() -> u8 {
    // SAFETY: as in set_selector.
    unsafe { std::ptr::read_volatile(selector()) }
}

/// A system call that no hook sees (neither a libc symbol nor a dispatch
/// trap: the selector is ALLOW around it), for library code that must not
/// re-enter itself (the fork child closing the parent's sockets). Returns
/// the kernel's value or -errno. `libc::syscall` is hooked (hooks/syscall.rs)
/// and must not be called from inside the library.
pub fn syscall_unhooked(nr: i64, a: [u64; 6]) -> i64 {
    let prev = get_selector();
    set_selector(ALLOW);
    // SAFETY: the caller's own system call; with the selector at ALLOW this
    // `syscall` instruction runs natively.
    let r = unsafe { syscall6(nr, a) };
    set_selector(prev);
    r
}

/// close(2) of a descriptor the library owns, from a fork child handler:
/// nothing there may be hooked or resolved lazily (dlsym takes locks a
/// thread of the parent may have held at the fork).
pub fn close_unhooked(fd: i32) {
    syscall_unhooked(libc::SYS_close, [fd as u64, 0, 0, 0, 0, 0]);
}

/// The kernel's result: a value, or -errno.
///
/// # Safety
/// The caller passes a system call and arguments that the program itself
/// asked for (the trapped call, or the library's own call through
/// [`syscall_unhooked`]), with the selector at ALLOW.
#[inline]
pub unsafe fn syscall6(nr: i64, a: [u64; 6]) -> i64 {
    let ret: i64;
    // SAFETY: the x86_64 syscall ABI: number in rax, arguments in rdi, rsi,
    // rdx, r10, r8, r9; the kernel clobbers rcx and r11 and the result lands
    // in rax. Memory may be read or written by the kernel (no `nomem`).
    unsafe {
        asm!(
            "syscall",
            inlateout("rax") nr => ret,
            in("rdi") a[0],
            in("rsi") a[1],
            in("rdx") a[2],
            in("r10") a[3],
            in("r8") a[4],
            in("r9") a[5],
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
    }
    ret
}
