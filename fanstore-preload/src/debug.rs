//! `FANSTORE_DEBUG=1`: report resolved symbols and every virtual call on
//! stderr. Off by default, and then one relaxed atomic load per call site.
//! Messages are formatted into a stack buffer and written with one write(2):
//! no allocation, no stdio, no hooked function.

use std::fmt::{self, Write};
use std::sync::atomic::{AtomicBool, Ordering};

static ON: AtomicBool = AtomicBool::new(false);

#[inline]
pub fn enabled() -> bool {
    ON.load(Ordering::Relaxed)
}

pub fn set_enabled(on: bool) {
    ON.store(on, Ordering::Relaxed);
}

struct StackBuf {
    buf: [u8; 1024],
    len: usize,
}

impl Write for StackBuf {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let room = self.buf.len() - 1 - self.len;
        let n = s.len().min(room);
        self.buf[self.len..self.len + n].copy_from_slice(&s.as_bytes()[..n]);
        self.len += n;
        Ok(())
    }
}

/// Writes one line to stderr, whatever the debug setting.
pub fn emit(args: fmt::Arguments) {
    let mut w = StackBuf { buf: [0; 1024], len: 0 };
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    let _ = write!(w, "fanstore[{pid}]: ");
    let _ = w.write_fmt(args);
    w.buf[w.len] = b'\n';
    w.len += 1;
    // Straight to the kernel: no hook, no lazy symbol lookup (this runs in
    // signal handlers and fork children too).
    crate::unhooked::syscall_unhooked(libc::SYS_write, [2, w.buf.as_ptr() as u64, w.len as u64, 0, 0, 0]);
}

/// Logs when FANSTORE_DEBUG is on.
#[macro_export]
macro_rules! dlog {
    ($($t:tt)*) => {
        if $crate::debug::enabled() {
            $crate::debug::emit(format_args!($($t)*))
        }
    };
}

/// Raw bytes shown as text (invalid UTF-8 as U+FFFD), without allocating.
pub struct B<'a>(pub &'a [u8]);

impl fmt::Display for B<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for chunk in self.0.utf8_chunks() {
            f.write_str(chunk.valid())?;
            if !chunk.invalid().is_empty() {
                f.write_char('\u{fffd}')?;
            }
        }
        Ok(())
    }
}

/// An errno as its symbolic name where we know it.
pub struct E(pub i32);

impl fmt::Display for E {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self.0 {
            libc::ENOENT => "ENOENT",
            libc::ENOTDIR => "ENOTDIR",
            libc::EISDIR => "EISDIR",
            libc::EROFS => "EROFS",
            libc::EIO => "EIO",
            libc::ELOOP => "ELOOP",
            libc::EEXIST => "EEXIST",
            libc::EINVAL => "EINVAL",
            libc::EACCES => "EACCES",
            libc::ERANGE => "ERANGE",
            libc::ENODATA => "ENODATA",
            libc::EXDEV => "EXDEV",
            libc::EBADF => "EBADF",
            libc::ENAMETOOLONG => "ENAMETOOLONG",
            libc::EMFILE => "EMFILE",
            _ => return write!(f, "errno {}", self.0),
        };
        f.write_str(s)
    }
}
