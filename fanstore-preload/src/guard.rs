//! The thread-local re-entrancy guard. A hook entered while this thread is
//! already inside the library (our own file reads during initialisation, a
//! libc function that calls another hooked function) goes straight to libc.
//!
//! `thread_local!` with a `const` initialiser and a type without `Drop` is a
//! bare `#[thread_local]` slot: no lazy registration, usable during early
//! process start and during thread teardown.

use std::cell::Cell;

thread_local! {
    static BUSY: Cell<bool> = const { Cell::new(false) };
}

/// Held while this thread runs library code.
pub struct Guard(());

impl Guard {
    /// `None` when this thread is already inside the library.
    #[inline]
    pub fn enter() -> Option<Guard> {
        BUSY.with(|b| {
            if b.get() {
                None
            } else {
                b.set(true);
                Some(Guard(()))
            }
        })
    }
}

impl Drop for Guard {
    #[inline]
    fn drop(&mut self) {
        BUSY.with(|b| b.set(false));
    }
}

/// Runs a user callback (scandir filter, nftw function) with the guard
/// lifted, so that its own file calls are served by the hooks again.
pub fn outside<R>(f: impl FnOnce() -> R) -> R {
    let was = BUSY.with(|b| b.replace(false));
    let r = f();
    BUSY.with(|b| b.set(was));
    r
}

/// Runs `f`, containing a panic (no unwinding into C callers): `on_panic`
/// is returned instead.
pub fn catch<R>(f: impl FnOnce() -> R, on_panic: R) -> R {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or(on_panic)
}
