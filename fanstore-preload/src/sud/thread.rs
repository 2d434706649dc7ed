//! New threads: the kernel does not arm them, so `pthread_create`'s start
//! routine is wrapped: the new thread arms itself, then runs the program's
//! routine. A thread created some other way (a raw clone, Go's runtime
//! without cgo) is not armed: its raw syscalls are not caught.

use libc::c_void;

struct Start {
    routine: *mut c_void,
    arg: *mut c_void,
}

/// The start routine and argument to hand to the real pthread_create:
/// the wrapper when raw syscalls are caught, the program's own otherwise
/// (also when the small allocation fails).
pub fn wrap(routine: *mut c_void, arg: *mut c_void) -> (*mut c_void, *mut c_void, bool) {
    if !super::on() || routine.is_null() {
        return (routine, arg, false);
    }
    // SAFETY: malloc of a small struct; checked for null below.
    let s = unsafe { libc::malloc(std::mem::size_of::<Start>()) } as *mut Start;
    if s.is_null() {
        return (routine, arg, false);
    }
    // SAFETY: s is a fresh allocation of the right size and alignment (malloc's).
    unsafe { s.write(Start { routine, arg }) };
    (start as *mut c_void, s as *mut c_void, true)
}

/// pthread_create failed: the wrapper will never run, free its argument.
pub fn unwrap_failed(arg: *mut c_void, wrapped: bool) {
    if wrapped {
        // SAFETY: arg is the Start allocated by `wrap`, never handed to a thread.
        unsafe { libc::free(arg) };
    }
}

/// "C-unwind": a thread ended by pthread_exit or cancellation is unwound
/// (forced) through this frame, which holds nothing to drop when it calls
/// the routine.
extern "C-unwind" fn start(p: *mut c_void) -> *mut c_void {
    // SAFETY: p is the Start that `wrap` allocated for this thread only.
    let Start { routine, arg } = unsafe { (p as *mut Start).read() };
    // SAFETY: p came from malloc and is read above.
    unsafe { libc::free(p) };
    super::arm_thread();
    // SAFETY: routine is the program's start routine with the C prototype
    // void *(*)(void *) (pthread_create's contract).
    let f: extern "C-unwind" fn(*mut c_void) -> *mut c_void = unsafe { std::mem::transmute(routine) };
    f(arg)
}
