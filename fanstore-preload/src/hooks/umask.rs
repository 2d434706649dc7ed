//! umask: the kernel's call, and the library keeps the new mask, which it
//! applies to the outputs created after it ([`crate::ops::attr::umask`]).
//! No lock and no allocation: one store to an atomic after the call.

use crate::ops::attr;
use crate::real;
use libc::mode_t;

crate::hooks! {
    fn umask(mask: mode_t) -> mode_t {
        let old = real::umask(mask);
        attr::umask_set(mask);
        old
    }
}
