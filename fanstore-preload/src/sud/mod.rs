//! Raw system calls: Syscall User Dispatch (Linux >= 5.11, x86_64).
//!
//! LD_PRELOAD sees only calls made through libc's symbols. A program (or a
//! library such as rustix, which safetensors uses through tempfile) that
//! executes its own `syscall` instruction bypasses every hook. With
//! `prctl(PR_SET_SYSCALL_USER_DISPATCH, PR_SYS_DISPATCH_ON, off, len, &sel)`
//! the kernel lets syscalls whose instruction lies in `[off, off+len)` run
//! as usual and raises SIGSYS for any other one while this thread's selector
//! byte says BLOCK. The range is libc's executable segment: libc's own
//! syscalls (already hooked by symbol) never trap, so a program that only
//! uses libc pays nothing; code with its own `syscall` instructions traps,
//! and [`handler`] serves the call through the same hooks as the symbols.
//!
//! The kernel does not carry the setting over to new threads, fork children
//! or exec'd images, so it is armed again: in the constructor (main thread of
//! every image, exec included), in the start wrapper of `pthread_create`
//! (hooks/thread.rs), in the fork child handler and in the child of a trapped
//! raw fork.
//!
//! Why the constructor arms (DESIGN: a constructor only registers
//! pthread_atfork): a raw syscall can come before any hooked libc call (a
//! Rust program's first file call may be rustix's), so waiting for the lazy
//! initialisation would miss it. Arming reads no configuration, opens no
//! file, allocates nothing and calls no hooked function: one `getenv`, one
//! `dl_iterate_phdr`, one `sigaction` and one `prctl`.

pub mod handler;
pub mod dispatch;
pub mod signals;
pub mod thread;

pub use crate::unhooked::{get_selector, selector, set_selector, ALLOW, BLOCK};
use crate::unhooked as raw;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};

const PR_SET_SYSCALL_USER_DISPATCH: libc::c_int = 59;
const PR_SYS_DISPATCH_ON: libc::c_ulong = 1;
const PR_SYS_DISPATCH_OFF: libc::c_ulong = 0;

/// Why raw syscalls are or are not caught.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(u8)]
pub enum Status {
    NotTried = 0,
    On = 1,
    OffByEnv = 2,
    /// prctl refused (kernel < 5.11, or built without CONFIG_GENERIC_ENTRY).
    Unsupported = 3,
    NoLibcRange = 4,
    NoHandler = 5,
}

static STATUS: AtomicU8 = AtomicU8::new(Status::NotTried as u8);
/// errno of the failed prctl, for the report.
static PRCTL_ERRNO: AtomicUsize = AtomicUsize::new(0);
static LIBC_LO: AtomicUsize = AtomicUsize::new(0);
static LIBC_HI: AtomicUsize = AtomicUsize::new(0);
static LDSO_LO: AtomicUsize = AtomicUsize::new(0);
static LDSO_HI: AtomicUsize = AtomicUsize::new(0);

pub fn status() -> Status {
    match STATUS.load(Ordering::Relaxed) {
        1 => Status::On,
        2 => Status::OffByEnv,
        3 => Status::Unsupported,
        4 => Status::NoLibcRange,
        5 => Status::NoHandler,
        _ => Status::NotTried,
    }
}

/// Raw syscalls are being caught.
#[inline]
pub fn on() -> bool {
    STATUS.load(Ordering::Relaxed) == Status::On as u8
}

/// Is `ip` inside the dynamic loader's text (dlopen's own mmap/openat)?
#[inline]
pub fn in_ldso(ip: usize) -> bool {
    ip >= LDSO_LO.load(Ordering::Relaxed) && ip < LDSO_HI.load(Ordering::Relaxed)
}

pub fn libc_range() -> (usize, usize) {
    (LIBC_LO.load(Ordering::Relaxed), LIBC_HI.load(Ordering::Relaxed))
}

/// The constructor's part: decide, find libc's text, install the SIGSYS
/// handler, arm the main thread; with FANSTORE_DEBUG, say what happens to
/// raw syscalls (here, not at the lazy initialisation: a program that only
/// makes raw calls never initialises).
pub fn init() {
    init_inner();
    // SAFETY: getenv with a NUL-terminated name; the result is read at once.
    let debug = unsafe {
        let p = libc::getenv(c"FANSTORE_DEBUG".as_ptr());
        !p.is_null() && *p != 0 && !(*p == b'0' as libc::c_char && *p.add(1) == 0)
    };
    if debug {
        report();
    }
}

fn init_inner() {
    // SAFETY: getenv with a NUL-terminated name; the result is read at once.
    let off = unsafe {
        let p = libc::getenv(c"FANSTORE_SUD".as_ptr());
        !p.is_null() && *p == b'0' as libc::c_char && *p.add(1) == 0
    };
    if off {
        STATUS.store(Status::OffByEnv as u8, Ordering::Relaxed);
        return;
    }
    let Some((lo, hi)) = find_ranges() else {
        STATUS.store(Status::NoLibcRange as u8, Ordering::Relaxed);
        return;
    };
    LIBC_LO.store(lo, Ordering::Relaxed);
    LIBC_HI.store(hi, Ordering::Relaxed);
    // Probe first: on a kernel without SUD nothing else is touched.
    if let Err(e) = prctl_on() {
        PRCTL_ERRNO.store(e as usize, Ordering::Relaxed);
        STATUS.store(Status::Unsupported as u8, Ordering::Relaxed);
        return;
    }
    if !handler::install() {
        prctl_off();
        STATUS.store(Status::NoHandler as u8, Ordering::Relaxed);
        return;
    }
    STATUS.store(Status::On as u8, Ordering::Relaxed);
    set_selector(BLOCK);
}

/// Arms the calling thread (a new thread's start wrapper, a fork child).
pub fn arm_thread() {
    if on() && prctl_on().is_ok() {
        set_selector(BLOCK);
    }
}

fn prctl_on() -> Result<(), libc::c_int> {
    let (lo, hi) = libc_range();
    // SAFETY: the selector is this thread's TLS byte, alive until the thread
    // exits (after which the thread makes no more syscalls of its own).
    let r = unsafe { libc::prctl(PR_SET_SYSCALL_USER_DISPATCH, PR_SYS_DISPATCH_ON, lo, hi - lo, selector()) };
    if r == 0 {
        Ok(())
    } else {
        // SAFETY: errno is this thread's.
        Err(unsafe { *libc::__errno_location() })
    }
}

fn prctl_off() {
    // SAFETY: turning dispatch off takes no pointer.
    unsafe { libc::prctl(PR_SET_SYSCALL_USER_DISPATCH, PR_SYS_DISPATCH_OFF, 0usize, 0usize, 0usize) };
}

const PT_LOAD: u32 = 1;
const PF_X: u32 = 1;

struct Ranges {
    target: usize,
    ldso_base: usize,
    libc: Option<(usize, usize)>,
    ldso: Option<(usize, usize)>,
}

unsafe extern "C" fn phdr_cb(info: *mut libc::dl_phdr_info, _size: libc::size_t, data: *mut libc::c_void) -> libc::c_int {
    // SAFETY: dl_iterate_phdr passes a valid info and our `data` (a &mut Ranges).
    let (info, r) = unsafe { (&*info, &mut *(data as *mut Ranges)) };
    for i in 0..info.dlpi_phnum as usize {
        // SAFETY: dlpi_phdr points at dlpi_phnum program headers.
        let ph = unsafe { &*info.dlpi_phdr.add(i) };
        if ph.p_type != PT_LOAD || ph.p_flags & PF_X == 0 {
            continue;
        }
        let lo = info.dlpi_addr as usize + ph.p_vaddr as usize;
        let hi = lo + ph.p_memsz as usize;
        if (lo..hi).contains(&r.target) {
            r.libc = Some((lo, hi));
        }
        if r.ldso_base != 0 && info.dlpi_addr as usize == r.ldso_base {
            r.ldso = Some((lo, hi));
        }
    }
    0
}

/// libc's executable segment (the object holding `gnu_get_libc_version`,
/// a glibc-only function this library never exports: a hooked name such as
/// `syscall` would resolve to our own definition), and ld.so's.
fn find_ranges() -> Option<(usize, usize)> {
    let target = libc::gnu_get_libc_version as *const () as usize;
    // SAFETY: getauxval has no preconditions (0 when absent).
    let ldso_base = unsafe { libc::getauxval(libc::AT_BASE) } as usize;
    let mut r = Ranges { target, ldso_base, libc: None, ldso: None };
    // SAFETY: the callback only reads the headers and writes into `r`.
    unsafe { libc::dl_iterate_phdr(Some(phdr_cb), &mut r as *mut Ranges as *mut libc::c_void) };
    if let Some((lo, hi)) = r.ldso {
        LDSO_LO.store(lo, Ordering::Relaxed);
        LDSO_HI.store(hi, Ordering::Relaxed);
    }
    r.libc
}

/// One line for FANSTORE_DEBUG: what happens to raw syscalls.
pub fn report() {
    let (lo, hi) = libc_range();
    match status() {
        Status::On => crate::debug::emit(format_args!(
            "raw syscalls caught (syscall user dispatch): libc text {lo:#x}-{hi:#x}; threads from pthread_create and fork children are armed"
        )),
        Status::OffByEnv => crate::debug::emit(format_args!("raw syscalls are not caught: FANSTORE_SUD=0")),
        Status::Unsupported => crate::debug::emit(format_args!(
            "raw syscalls are not caught: this kernel has no syscall user dispatch (prctl errno {})",
            PRCTL_ERRNO.load(Ordering::Relaxed)
        )),
        Status::NoLibcRange => crate::debug::emit(format_args!("raw syscalls are not caught: libc's text segment not found")),
        Status::NoHandler => crate::debug::emit(format_args!("raw syscalls are not caught: cannot install the SIGSYS handler")),
        Status::NotTried => crate::debug::emit(format_args!("raw syscalls are not caught: the library's constructor did not run")),
    }
}

#[cfg(test)]
mod tests;
