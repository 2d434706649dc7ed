//! The program's memory, as the library reads and writes it on the
//! program's behalf: a bad pointer (NULL, 0xDEADC0DE, an unmapped page)
//! must give what the kernel gives (EFAULT), never a crash in the library.
//!
//! The kernel's own approach (its exception table): every first touch of a
//! page of user memory is one load (or locked no-op store) at a known
//! instruction address ([`probe_read`], [`probe_write`]); when that load
//! faults, the SIGSEGV/SIGBUS handler installed here moves the interrupted
//! instruction pointer to a recovery label that returns "bad". A good
//! pointer costs one call and one load: no system call. The rest of a page
//! whose first probed byte is readable is readable (protections are per
//! page), so a C string costs one probe per page it spans plus a scan for
//! its NUL, a word at a time, bounded to the page.
//!
//! Addresses below [`MIN_ADDR`] (NULL, and the page the kernel never maps
//! while `vm.mmap_min_addr` >= 4096, which every distribution's default is)
//! are bad without any probe.
//!
//! The handler comes first and stays first: `sigaction`/`signal` of SIGSEGV
//! or SIGBUS through libc (hooks/signal.rs) are recorded here, not
//! installed; our handler is reinstalled with the program's `sa_mask` and
//! its SA_NODEFER/SA_RESTART, the program gets its recorded action back as
//! the old one (Rust's std installs its stack-overflow handler only over
//! SIG_DFL), and every fault that is not a probe goes to the program's
//! handler ([`chain`]), or to the default action.
//!
//! Not covered (documented limits): x86_64 only (elsewhere only the
//! [`MIN_ADDR`] test applies); a thread that blocks SIGSEGV/SIGBUS when it
//! passes a bad pointer is killed by the kernel (a fault on a blocked
//! SIGSEGV is fatal), as is one whose handler was replaced by a raw
//! `rt_sigaction` system call the library does not see.

use libc::{c_char, c_int, c_void, siginfo_t};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

/// Below this address nothing is ever mapped: bad without a probe.
pub const MIN_ADDR: usize = 4096;

/// The probing granularity: x86_64's smallest page.
const PAGE: usize = 4096;

#[cfg(target_arch = "x86_64")]
core::arch::global_asm!(
    ".pushsection .text.fanstore_user_mem,\"ax\",@progbits",
    ".p2align 4",
    ".globl fanstore_probe_read",
    ".hidden fanstore_probe_read",
    ".type fanstore_probe_read,@function",
    "fanstore_probe_read:",
    // The probe: the fault handler knows this instruction's address.
    "movzx eax, byte ptr [rdi]",
    "xor eax, eax",
    "ret",
    ".size fanstore_probe_read, .-fanstore_probe_read",
    ".p2align 4",
    ".globl fanstore_probe_write",
    ".hidden fanstore_probe_write",
    ".type fanstore_probe_write,@function",
    "fanstore_probe_write:",
    // An atomic read-modify-write that changes nothing: faults unless writable.
    "lock or byte ptr [rdi], 0",
    "xor eax, eax",
    "ret",
    ".size fanstore_probe_write, .-fanstore_probe_write",
    ".p2align 4",
    ".globl fanstore_probe_failed",
    ".hidden fanstore_probe_failed",
    ".type fanstore_probe_failed,@function",
    "fanstore_probe_failed:",
    // Where a faulting probe resumes (same stack: it returns to the probe's caller).
    "mov eax, 1",
    "ret",
    ".size fanstore_probe_failed, .-fanstore_probe_failed",
    ".popsection",
);

#[cfg(target_arch = "x86_64")]
extern "C" {
    /// 0 when the byte at the address could be read, 1 when it faulted.
    fn fanstore_probe_read(p: *const u8) -> u32;
    /// 0 when the byte at the address is writable, 1 when it faulted.
    fn fanstore_probe_write(p: *mut u8) -> u32;
    fn fanstore_probe_failed() -> u32;
}

/// The fault handler is installed: probes are safe.
static ARMED: AtomicBool = AtomicBool::new(false);

#[inline]
fn armed() -> bool {
    ARMED.load(Ordering::Relaxed)
}

/// Can the byte at `a` (>= MIN_ADDR) be read? Without the handler: assumed.
#[inline]
fn probe_read(a: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    if armed() {
        // SAFETY: a faulting load is recovered by `on_fault` (armed), which
        // resumes at fanstore_probe_failed on the same stack.
        return unsafe { fanstore_probe_read(a as *const u8) } == 0;
    }
    let _ = a;
    true
}

/// Is the byte at `a` (>= MIN_ADDR) writable? Its value is left unchanged
/// (an atomic or with 0). Without the handler: assumed.
#[inline]
fn probe_write(a: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    if armed() {
        // SAFETY: as in probe_read; the locked `or 0` stores the byte's own value atomically.
        return unsafe { fanstore_probe_write(a as *mut u8) } == 0;
    }
    let _ = a;
    true
}

/// Is `p` a C string readable through its NUL? NULL and low addresses are
/// not; otherwise the first byte of every page up to the NUL is probed.
#[inline]
pub fn cstr(p: *const c_char) -> bool {
    let mut at = p as usize;
    if at < MIN_ADDR {
        return false;
    }
    loop {
        if !probe_read(at) {
            return false;
        }
        let Some(end) = (at | (PAGE - 1)).checked_add(1) else { return false };
        // SAFETY: [at, end) lies in one page whose byte `at` is readable
        // (probed above, or assumed without the handler as before this
        // check existed), so all of it is.
        if unsafe { nul_in_page(at, end) } {
            return true;
        }
        at = end;
    }
}

/// Is there a NUL in `[at, end)`? A word at a time (no SIMD, no call: the
/// paths are short), in aligned reads that stay inside the page.
///
/// # Safety
/// `end` is the end of the page holding `at`, and that page is readable.
#[inline]
unsafe fn nul_in_page(at: usize, end: usize) -> bool {
    const LO: u64 = 0x0101_0101_0101_0101;
    const HI: u64 = 0x8080_8080_8080_8080;
    let mut q = at & !7;
    // The bytes of the first word before `at` count as non-zero (little-endian: the low ones).
    let before = (1u64 << ((at - q) * 8)) - 1;
    // SAFETY: q is 8-aligned and q + 8 <= end (end is page-aligned): inside the readable page.
    let mut w = u64::from_le(unsafe { std::ptr::read_volatile(q as *const u64) }) | before;
    loop {
        if w.wrapping_sub(LO) & !w & HI != 0 {
            return true;
        }
        q += 8;
        if q >= end {
            return false;
        }
        // SAFETY: as above.
        w = u64::from_le(unsafe { std::ptr::read_volatile(q as *const u64) });
    }
}

/// Does `probe` pass for the first byte of every page of `[p, p + len)`?
/// (Empty: yes; starting below [`MIN_ADDR`] or wrapping: no.)
fn all_pages(p: usize, len: usize, probe: fn(usize) -> bool) -> bool {
    if len == 0 {
        return true;
    }
    if p < MIN_ADDR {
        return false;
    }
    let Some(last) = p.checked_add(len - 1) else { return false };
    let mut at = p;
    loop {
        if !probe(at) {
            return false;
        }
        match (at | (PAGE - 1)).checked_add(1) {
            Some(next) if next <= last => at = next,
            _ => return true,
        }
    }
}

/// Can `len` bytes at `p` be read? (Empty: yes.)
#[inline]
pub fn readable<T>(p: *const T, len: usize) -> bool {
    all_pages(p as usize, len, probe_read)
}

/// Can `len` bytes at `p` be written? (Empty: yes.) Nothing is changed.
#[inline]
pub fn writable<T>(p: *mut T, len: usize) -> bool {
    all_pages(p as usize, len, probe_write)
}

/// How many of the `len` bytes at `p` can be written, from the start
/// (whole pages probed: the kernel writes a buffer until its first fault).
pub fn writable_prefix<T>(p: *mut T, len: usize) -> usize {
    let a = p as usize;
    if len == 0 || a < MIN_ADDR {
        return 0;
    }
    let mut at = a;
    loop {
        if !probe_write(at) {
            return at - a;
        }
        match (at | (PAGE - 1)).checked_add(1) {
            Some(next) if next - a < len => at = next,
            _ => return len,
        }
    }
}

/// Can a `T` be read at `p`?
#[inline]
pub fn readable_one<T>(p: *const T) -> bool {
    readable(p, std::mem::size_of::<T>())
}

/// Can a `T` be written at `p`?
#[inline]
pub fn writable_one<T>(p: *mut T) -> bool {
    writable(p, std::mem::size_of::<T>())
}

/// Is `p` null or readable for a `T`? (An optional in-pointer.)
#[inline]
pub fn readable_or_null<T>(p: *const T) -> bool {
    p.is_null() || readable_one(p)
}

// ---------------------------------------------------------------------------
// The fault handler and the program's own SIGSEGV/SIGBUS dispositions.
// ---------------------------------------------------------------------------

/// The program's disposition of one signal (index 0: SIGSEGV, 1: SIGBUS).
struct Recorded {
    handler: AtomicUsize,
    flags: AtomicU64,
    /// The kernel's 64-bit mask (the first word of glibc's sigset_t).
    mask: AtomicU64,
}

static PROGRAM: [Recorded; 2] = [
    Recorded { handler: AtomicUsize::new(libc::SIG_DFL), flags: AtomicU64::new(0), mask: AtomicU64::new(0) },
    Recorded { handler: AtomicUsize::new(libc::SIG_DFL), flags: AtomicU64::new(0), mask: AtomicU64::new(0) },
];

fn index(sig: c_int) -> Option<usize> {
    match sig {
        libc::SIGSEGV => Some(0),
        libc::SIGBUS => Some(1),
        _ => None,
    }
}

/// Is `sig` one whose disposition the library records instead of installing?
#[inline]
pub fn is_ours(sig: c_int) -> bool {
    armed() && index(sig).is_some()
}

fn mask_word(s: &libc::sigset_t) -> u64 {
    // SAFETY: glibc's sigset_t is 128 bytes; its first 8 are the kernel's mask.
    unsafe { (s as *const libc::sigset_t as *const u64).read() }
}

fn set_mask_word(s: &mut libc::sigset_t, w: u64) {
    // SAFETY: as in mask_word; the struct is ours to write.
    unsafe { (s as *mut libc::sigset_t as *mut u64).write(w) };
}

fn record(k: usize, handler: usize, flags: u64, mask: u64) {
    let r = &PROGRAM[k];
    r.flags.store(flags, Ordering::Relaxed);
    r.mask.store(mask, Ordering::Relaxed);
    r.handler.store(handler, Ordering::Release);
}

fn recorded(k: usize) -> libc::sigaction {
    let r = &PROGRAM[k];
    // SAFETY: a zeroed sigaction is a valid value (SIG_DFL, empty mask).
    let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
    sa.sa_sigaction = r.handler.load(Ordering::Acquire);
    sa.sa_flags = r.flags.load(Ordering::Relaxed) as c_int;
    set_mask_word(&mut sa.sa_mask, r.mask.load(Ordering::Relaxed));
    sa
}

/// Installs our handler for `sig` with the program's mask and its
/// SA_NODEFER / SA_RESTART (the kernel applies them around the program's
/// handler, which runs inside ours). Async-signal-safe (sigaction only).
fn install_ours(sig: c_int, program_flags: u64, mask: u64) -> bool {
    // SAFETY: a zeroed sigaction is a valid value.
    let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
    sa.sa_sigaction = on_fault as *const () as usize;
    let keep = (libc::SA_NODEFER | libc::SA_RESTART) as u64;
    sa.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK | (program_flags & keep) as c_int;
    set_mask_word(&mut sa.sa_mask, mask);
    // SAFETY: a valid action; the real sigaction (resolved by `install`,
    // before any fault can reach the handler), never our hook.
    unsafe { crate::real::sigaction(sig, &sa, std::ptr::null_mut()) == 0 }
}

/// The constructor's part: our handler for SIGSEGV and SIGBUS, what it
/// replaces recorded as the program's. Allocates nothing.
pub fn install() {
    #[cfg(target_arch = "x86_64")]
    for sig in [libc::SIGSEGV, libc::SIGBUS] {
        let Some(k) = index(sig) else { continue };
        // SAFETY: a zeroed sigaction is a valid out-value.
        let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: a query (null action) into a valid out-pointer.
        if unsafe { crate::real::sigaction(sig, std::ptr::null(), &mut old) } != 0 {
            return;
        }
        record(k, old.sa_sigaction, old.sa_flags as u64, mask_word(&old.sa_mask));
        if !install_ours(sig, old.sa_flags as u64, mask_word(&old.sa_mask)) {
            return;
        }
    }
    #[cfg(target_arch = "x86_64")]
    ARMED.store(true, Ordering::Relaxed);
}

/// `sigaction(sig, act, oact)` for SIGSEGV/SIGBUS ([`is_ours`]): `act`
/// recorded as the program's (our handler reinstalled with its mask and
/// flags), `oact` given the program's previous one. `act` is taken by
/// value (the caller copies it: act and oact may alias).
pub fn sigaction(sig: c_int, act: Option<libc::sigaction>, oact: Option<&mut libc::sigaction>) -> c_int {
    let Some(k) = index(sig) else { return -1 };
    let old = recorded(k);
    if let Some(a) = act {
        let mask = mask_word(&a.sa_mask);
        record(k, a.sa_sigaction, a.sa_flags as u64, mask);
        install_ours(sig, a.sa_flags as u64, mask);
    }
    if let Some(o) = oact {
        *o = old;
    }
    0
}

/// `signal(sig, handler)` for SIGSEGV/SIGBUS (`flags`: the semantics of
/// the variant called): the previous handler.
pub fn signal(sig: c_int, handler: libc::sighandler_t, flags: c_int) -> libc::sighandler_t {
    let Some(k) = index(sig) else { return libc::SIG_ERR };
    let old = PROGRAM[k].handler.load(Ordering::Acquire);
    record(k, handler, flags as u64, 0);
    install_ours(sig, flags as u64, 0);
    old
}

/// The handler. A fault (si_code > 0: raised by the kernel for this very
/// instruction) at a probe resumes at the recovery label; anything else is
/// the program's. Async-signal-safe: atomics, sigaction, raise.
extern "C" fn on_fault(sig: c_int, info: *mut siginfo_t, ctx: *mut c_void) {
    // SAFETY: with SA_SIGINFO the kernel passes a valid siginfo.
    let code = unsafe { info.as_ref() }.map_or(0, |i| i.si_code);
    #[cfg(target_arch = "x86_64")]
    if code > 0 && !ctx.is_null() {
        // SAFETY: with SA_SIGINFO the third argument is the interrupted
        // context, which this handler owns until it returns.
        let uc = unsafe { &mut *(ctx as *mut libc::ucontext_t) };
        let ip = uc.uc_mcontext.gregs[libc::REG_RIP as usize] as usize;
        if ip == fanstore_probe_read as *const () as usize || ip == fanstore_probe_write as *const () as usize {
            uc.uc_mcontext.gregs[libc::REG_RIP as usize] = fanstore_probe_failed as *const () as usize as i64;
            return;
        }
    }
    // SAFETY: errno is this thread's; kept across what chain calls.
    let saved = unsafe { *libc::__errno_location() };
    // SAFETY: the kernel's arguments, handed on unchanged.
    unsafe { chain(sig, code, info, ctx) };
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = saved };
}

/// A fault that is not a probe's: the program's handler, else the default
/// action (a kernel fault re-executes and now terminates; a sent signal is
/// raised again), or nothing when a sent one is ignored.
///
/// # Safety
/// The kernel's handler arguments.
unsafe fn chain(sig: c_int, code: c_int, info: *mut siginfo_t, ctx: *mut c_void) {
    let Some(k) = index(sig) else { return };
    let sa = recorded(k);
    let from_kernel = code > 0;
    match sa.sa_sigaction {
        libc::SIG_IGN if !from_kernel => {}
        libc::SIG_DFL | libc::SIG_IGN => {
            // SAFETY: a zeroed sigaction is SIG_DFL with an empty mask.
            let dfl: libc::sigaction = unsafe { std::mem::zeroed() };
            // SAFETY: the real sigaction with a valid action.
            unsafe { crate::real::sigaction(sig, &dfl, std::ptr::null_mut()) };
            if !from_kernel {
                // SAFETY: raise is async-signal-safe; the signal is delivered
                // (default action) once this handler's mask is lifted.
                unsafe { libc::raise(sig) };
            }
        }
        h => {
            if sa.sa_flags & libc::SA_RESETHAND != 0 {
                record(k, libc::SIG_DFL, 0, 0);
                install_ours(sig, 0, 0);
            }
            if sa.sa_flags & libc::SA_SIGINFO != 0 {
                // SAFETY: the program installed a three-argument handler.
                let f: extern "C" fn(c_int, *mut siginfo_t, *mut c_void) = unsafe { std::mem::transmute(h) };
                f(sig, info, ctx);
            } else {
                // SAFETY: the program installed a one-argument handler.
                let f: extern "C" fn(c_int) = unsafe { std::mem::transmute(h) };
                f(sig);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unmapped_page() -> *mut u8 {
        // SAFETY: a fresh anonymous mapping, unmapped at once: its address is
        // then (very likely) unmapped, which is all the test needs.
        unsafe {
            let p = crate::real::mmap(std::ptr::null_mut(), 2 * PAGE, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0);
            assert_ne!(p, libc::MAP_FAILED);
            libc::munmap(p, 2 * PAGE);
            p as *mut u8
        }
    }

    #[test]
    fn probes_tell_good_from_bad() {
        install();
        assert!(cfg!(not(target_arch = "x86_64")) || armed());
        let s = c"/fanstore/x";
        assert!(cstr(s.as_ptr()));
        assert!(!cstr(std::ptr::null()));
        assert!(!cstr(0xDEAD as *const c_char));
        let mut v = [1u8; 200];
        assert!(readable(v.as_ptr(), v.len()) && writable(v.as_mut_ptr(), v.len()));
        assert_eq!(v, [1u8; 200]);
        assert!(readable(std::ptr::null::<u8>(), 0));
        assert!(!readable(usize::MAX as *const u8, 2));
        if cfg!(target_arch = "x86_64") {
            assert!(!cstr(0xDEADC0DE as *const c_char));
            let bad = unmapped_page();
            assert!(!cstr(bad as *const c_char));
            assert!(!readable(bad, 1) && !writable(bad, 1));
            // Read-only memory: readable, not writable (and unchanged).
            assert!(readable(s.as_ptr(), 4) && !writable(s.as_ptr() as *mut u8, 1));
            assert_eq!(s.to_bytes(), b"/fanstore/x");
        }
    }

    /// The word scan finds a NUL wherever it lies in its word, and none
    /// when the page has none from the start on.
    #[test]
    fn nul_scan_at_every_offset() {
        // SAFETY: a fresh one-page mapping, written and read only inside it, then unmapped.
        unsafe {
            let p = crate::real::mmap(std::ptr::null_mut(), PAGE, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0) as *mut u8;
            assert_ne!(p as *mut c_void, libc::MAP_FAILED);
            std::ptr::write_bytes(p, b'x', PAGE);
            let (a, end) = (p as usize, p as usize + PAGE);
            for start in 0..16 {
                assert!(!nul_in_page(a + start, end), "start {start}");
                for nul in start..start + 24 {
                    *p.add(nul) = 0;
                    assert!(nul_in_page(a + start, end), "start {start} nul {nul}");
                    *p.add(nul) = b'x';
                }
                // A NUL before the start does not count.
                if start > 0 {
                    *p.add(start - 1) = 0;
                    assert!(!nul_in_page(a + start, end), "start {start}, NUL before it");
                    *p.add(start - 1) = b'x';
                }
            }
            *p.add(PAGE - 1) = 0;
            assert!(nul_in_page(a + PAGE - 1, end) && nul_in_page(a + 3, end));
            libc::munmap(p.cast(), PAGE);
        }
        assert!(cstr(c"".as_ptr()) && cstr(c"a".as_ptr()) && cstr(c"abcdefgh".as_ptr()) && cstr(c"abcdefghijklmnopq".as_ptr()));
    }

    /// A string that runs from a good page into an unmapped one is bad; one
    /// whose NUL is the last byte of its page is good.
    #[test]
    fn strings_across_pages() {
        install();
        // SAFETY: a fresh two-page mapping, its second page then unmapped.
        unsafe {
            let p = crate::real::mmap(std::ptr::null_mut(), 2 * PAGE, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0) as *mut u8;
            assert_ne!(p as *mut c_void, libc::MAP_FAILED);
            libc::munmap(p.add(PAGE).cast(), PAGE);
            std::ptr::write_bytes(p, b'a', PAGE);
            let tail = p.add(PAGE - 8) as *const c_char;
            if cfg!(target_arch = "x86_64") {
                assert!(!cstr(tail));
                assert!(!readable(p, PAGE + 1));
            }
            *p.add(PAGE - 1) = 0;
            assert!(cstr(tail));
            assert!(readable(p, PAGE) && writable(p, PAGE));
            if cfg!(target_arch = "x86_64") {
                assert_eq!(writable_prefix(p.add(PAGE - 10), 100), 10);
            }
            assert_eq!(writable_prefix(p, PAGE), PAGE);
            assert_eq!(writable_prefix(p, 0), 0);
            libc::munmap(p.cast(), PAGE);
        }
    }
}
