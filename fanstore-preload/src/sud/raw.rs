//! Re-issuing a trapped system call unchanged. Only ever called from the
//! SIGSYS handler with this thread's selector at ALLOW, so this `syscall`
//! instruction (outside libc's range) runs natively instead of trapping.

use std::arch::asm;

/// The kernel's result: a value, or -errno.
///
/// # Safety
/// The caller passes a system call and arguments that the program itself
/// asked for (the trapped call), with the selector at ALLOW.
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
