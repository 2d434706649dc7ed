//! This thread's errno, read and set by library code of every layer (a
//! hook's failure, an errno saved around internal calls and restored).

use libc::c_int;

/// This thread's errno.
#[inline]
pub fn errno() -> c_int {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() }
}

/// Sets this thread's errno.
#[inline]
pub fn set_errno(e: c_int) {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() = e };
}
