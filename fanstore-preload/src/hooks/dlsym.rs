//! `dlsym`: programs that look the inotify functions up in libc's own handle
//! (Python's `ctypes.CDLL("libc.so.6")`, as inotify_simple does) get this
//! library's. Everything else is libc's `dlsym`, entered by a tail jump so
//! that it sees its caller's return address (RTLD_NEXT depends on it).
//!
//! Only a lookup in an explicit handle (not RTLD_DEFAULT, not RTLD_NEXT) of
//! one of the four inotify names is answered here; x86_64 only (the other
//! architectures keep libc's `dlsym`, and ctypes-through-libc-handle
//! inotify users there see the kernel's inotify only).

use libc::{c_char, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};

/// libc's dlsym, resolved with dlvsym (never through dlsym itself).
static REAL: AtomicUsize = AtomicUsize::new(0);

fn resolve_real() {
    if REAL.load(Ordering::Relaxed) != 0 {
        return;
    }
    for ver in [c"GLIBC_2.34", c"GLIBC_2.2.5"] {
        // SAFETY: both strings are NUL-terminated; dlvsym only reads them.
        let p = unsafe { libc::dlvsym(libc::RTLD_NEXT, c"dlsym".as_ptr(), ver.as_ptr()) } as usize;
        if p != 0 {
            REAL.store(p, Ordering::Relaxed);
            return;
        }
    }
}

/// The address to return instead of libc's answer, or 0 (ask libc).
extern "C" fn replacement(handle: *mut c_void, name: *const c_char) -> usize {
    resolve_real();
    if handle.is_null() || handle == libc::RTLD_NEXT || name.is_null() {
        return 0;
    }
    // SAFETY: dlsym's contract: name is a NUL-terminated string.
    let n = unsafe { std::ffi::CStr::from_ptr(name) }.to_bytes();
    use super::inotify as i;
    match n {
        b"inotify_init" => i::inotify_init as *const () as usize,
        b"inotify_init1" => i::inotify_init1 as *const () as usize,
        b"inotify_add_watch" => i::inotify_add_watch as *const () as usize,
        b"inotify_rm_watch" => i::inotify_rm_watch as *const () as usize,
        _ => 0,
    }
}

/// `dlsym(handle, name)`: `replacement`, else a tail jump to libc's.
///
/// # Safety
/// dlsym's C contract.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    // Entry: rsp = 8 mod 16. Two pushes and 8 bytes align the call.
    std::arch::naked_asm!(
        "push rdi",
        "push rsi",
        "sub rsp, 8",
        "call {rep}",
        "add rsp, 8",
        "pop rsi",
        "pop rdi",
        "test rax, rax",
        "jz 2f",
        "ret",
        "2:",
        "jmp qword ptr [rip + {real}]",
        rep = sym replacement,
        real = sym REAL,
    )
}
