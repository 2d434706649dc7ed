//! `syscall()`: libc's generic wrapper runs inside libc's text, so syscall
//! user dispatch never sees it; file calls made through it
//! (`syscall(SYS_getdents64, ...)`, `syscall(SYS_renameat2, ...)`) are
//! served like the trapped ones (sud/dispatch.rs), everything else goes to
//! libc's. Variadic in C: on x86_64 the six integer arguments travel in
//! registers and the stack slot like named ones, and glibc's own
//! implementation reads all six the same way.

use crate::real;
use libc::c_long;

crate::hooks! {
    fn syscall(nr: c_long, a1: c_long, a2: c_long, a3: c_long, a4: c_long, a5: c_long, a6: c_long) -> c_long {
        let a = [a1 as u64, a2 as u64, a3 as u64, a4 as u64, a5 as u64, a6 as u64];
        match crate::sud::dispatch::file_call(nr, a) {
            Some(r) if r < 0 => {
                crate::errno::set_errno(-r as i32);
                -1
            }
            Some(r) => r,
            None => real::syscall(nr, a1, a2, a3, a4, a5, a6),
        }
    }
}
