//! pthread_create: the new thread arms raw-syscall catching before the
//! program's start routine runs (see sud/thread.rs).

use crate::real;
use crate::sud::thread::{unwrap_failed, wrap};
use libc::{c_int, c_void, pthread_attr_t, pthread_t};

crate::hooks! {
    fn pthread_create(thread: *mut pthread_t, attr: *const pthread_attr_t, routine: *mut c_void, arg: *mut c_void) -> c_int {
        let (r2, a2, wrapped) = wrap(routine, arg);
        let r = real::pthread_create(thread, attr, r2, a2);
        if r != 0 {
            unwrap_failed(a2, wrapped);
        }
        r
    }
}
