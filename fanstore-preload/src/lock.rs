//! A plain pthread mutex around data, so that the fork handlers can take and
//! release it explicitly (prepare / parent / child) without guard objects.

use std::cell::UnsafeCell;

pub struct Locked<T> {
    mutex: UnsafeCell<libc::pthread_mutex_t>,
    data: UnsafeCell<T>,
}

// SAFETY: `data` is only reached through `with`, which holds the mutex, or
// through `force`, whose callers guarantee exclusive access (fork child).
unsafe impl<T: Send> Sync for Locked<T> {}

impl<T> Locked<T> {
    pub const fn new(v: T) -> Locked<T> {
        Locked { mutex: UnsafeCell::new(libc::PTHREAD_MUTEX_INITIALIZER), data: UnsafeCell::new(v) }
    }

    pub fn lock(&self) {
        // SAFETY: the mutex is statically initialised and never moved (it lives in a static).
        unsafe { libc::pthread_mutex_lock(self.mutex.get()) };
    }

    pub fn unlock(&self) {
        // SAFETY: called only by the thread that took the lock (or by the
        // single thread of a fork child, which inherited it locked).
        unsafe { libc::pthread_mutex_unlock(self.mutex.get()) };
    }

    /// Runs `f` with the lock held. `f` must not allocate, log or call hooked functions.
    pub fn with<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        self.lock();
        // SAFETY: the mutex is held, so this is the only live reference.
        let r = f(unsafe { &mut *self.data.get() });
        self.unlock();
        r
    }

    /// Access without locking.
    ///
    /// # Safety
    /// The caller must already hold the lock (fork handlers do).
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn force(&self) -> &mut T {
        // SAFETY: per this function's contract the caller holds the lock.
        unsafe { &mut *self.data.get() }
    }
}
