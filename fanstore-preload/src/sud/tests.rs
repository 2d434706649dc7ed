//! Unit tests of syscall user dispatch, run in the test binary (whose
//! constructor armed it like any program's).

use super::*;
use crate::unhooked::syscall_unhooked;

fn raw_getppid() -> i64 {
    let r: i64;
    // SAFETY: getppid takes no arguments; rcx/r11 are clobbered by syscall.
    unsafe {
        std::arch::asm!("syscall", inlateout("rax") libc::SYS_getppid => r, lateout("rcx") _, lateout("r11") _,
                        options(nostack))
    };
    r
}

/// The kernel's answer, asked independently of the library: turning
/// dispatch off is accepted exactly where it exists.
fn kernel_has_sud() -> bool {
    // SAFETY: PR_SYS_DISPATCH_OFF on this thread takes no pointer; the
    // test thread is armed again right after.
    let r = unsafe { libc::prctl(PR_SET_SYSCALL_USER_DISPATCH, PR_SYS_DISPATCH_OFF, 0usize, 0usize, 0usize) };
    arm_thread();
    r == 0
}

/// The constructor ran in this test binary too: where the kernel has
/// syscall user dispatch (>= 5.11) raw syscalls are caught with libc's
/// text as the allowed range; elsewhere the library says so and runs as
/// before.
#[test]
fn armed_with_libc_text() {
    if !kernel_has_sud() {
        assert_eq!(status(), Status::Unsupported);
        return;
    }
    assert_eq!(status(), Status::On, "syscall user dispatch not armed");
    let (lo, hi) = libc_range();
    let getpid = libc::getpid as *const () as usize;
    assert!(lo < hi && (lo..hi).contains(&getpid), "{lo:#x}-{hi:#x} lacks getpid {getpid:#x}");
    let ours = raw_getppid as *const () as usize;
    assert!(!(lo..hi).contains(&ours));
}

/// A raw syscall from this crate's text traps and is re-issued, in the
/// main thread and in a new thread (armed by the pthread_create wrapper).
#[test]
fn raw_syscall_trapped_and_reissued() {
    if !on() {
        return; // armed_with_libc_text checks why
    }
    // SAFETY: getppid has no preconditions.
    let want = unsafe { libc::getppid() } as i64;
    let t0 = handler::traps();
    assert_eq!(raw_getppid(), want);
    let t1 = handler::traps();
    assert!(t1 > t0, "the raw call did not trap");
    let (got, traps_in_thread) = std::thread::spawn(|| {
        let before = handler::traps();
        let r = raw_getppid();
        (r, handler::traps() - before)
    })
    .join()
    .unwrap_or((0, 0));
    assert_eq!(got, want);
    assert!(traps_in_thread >= 1, "a thread from pthread_create is not armed");
    // libc's own calls and the library's unhooked raw call do not trap (the
    // count may grow meanwhile from other test threads: compare a batch).
    let t2 = handler::traps();
    for _ in 0..1000 {
        // SAFETY: as above.
        assert_eq!(unsafe { libc::getppid() } as i64, want);
        assert_eq!(syscall_unhooked(libc::SYS_getppid, [0; 6]), want);
    }
    assert!(handler::traps() - t2 < 100, "libc's calls trap");
    assert_eq!(get_selector(), BLOCK);
}

/// Library code must not call `libc::syscall` (it is our own hook now):
/// the fork child deadlocked on the client pool that way.
#[test]
fn library_never_calls_libc_syscall() {
    fn walk(d: &std::path::Path, bad: &mut Vec<String>) {
        for e in std::fs::read_dir(d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, bad);
            } else if p.extension().is_some_and(|x| x == "rs") {
                let text = std::fs::read_to_string(&p).unwrap_or_default();
                let needle = ["libc", "::syscall("].concat();
                if text.contains(&needle) {
                    bad.push(p.display().to_string());
                }
            }
        }
    }
    let mut bad = Vec::new();
    walk(&std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src"), &mut bad);
    assert!(bad.is_empty(), "libc::syscall called in {bad:?}: use crate::unhooked::syscall_unhooked");
}
