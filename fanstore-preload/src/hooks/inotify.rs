//! inotify_init, inotify_init1, inotify_add_watch, inotify_rm_watch: one
//! instance watches paths under the mount (events from the daemons) and
//! outside it (the kernel's), merged into one real fd ([`crate::ops::inotify`]).

use super::cbytes;
use crate::errno::set_errno;
use crate::guard::{catch, Guard};
use crate::ops::inotify as ino;
use crate::paths::{classify, maybe_ours, Class, Scratch};
use crate::real;
use libc::{c_char, c_int};

/// A merged instance, or the kernel's when there is no daemon.
fn init(flags: c_int, real: impl FnOnce() -> c_int) -> c_int {
    let Some(g) = Guard::enter() else { return real() };
    let fd = catch(|| ino::init1(flags), None);
    drop(g);
    fd.unwrap_or_else(real)
}

/// Where a watch goes.
enum Add {
    Kernel,
    /// The kernel's, with the normalised path in the scratch buffer.
    Redirect,
    Ours(c_int),
}

fn done(r: Result<c_int, c_int>) -> c_int {
    match r {
        Ok(v) => v,
        Err(e) => {
            set_errno(e);
            -1
        }
    }
}

crate::hooks! {
    fn inotify_init() -> c_int {
        init(0, || real::inotify_init())
    }
    fn inotify_init1(flags: c_int) -> c_int {
        init(flags, || real::inotify_init1(flags))
    }
    fn inotify_add_watch(fd: c_int, path: *const c_char, mask: u32) -> c_int {
        let Some(kfd) = ino::kernel_fd(fd) else { return real::inotify_add_watch(fd, path, mask) };
        // SAFETY: path is a readable C string (probed first; a bad one is the kernel's EFAULT).
        if !crate::user_mem::cstr(path) || !unsafe { maybe_ours(libc::AT_FDCWD, path) } {
            return real::inotify_add_watch(kfd, path, mask);
        }
        let Some(g) = Guard::enter() else { return real::inotify_add_watch(kfd, path, mask) };
        let mut scratch = Scratch::new();
        // SAFETY: maybe_ours returned true: path is a non-null C string.
        let bytes = unsafe { cbytes(path) }.unwrap_or(b"");
        let r = catch(
            || match classify(libc::AT_FDCWD, bytes, &mut scratch) {
                Class::Real => Ok(Add::Kernel),
                Class::Redirect => Ok(Add::Redirect),
                Class::Err(e) => Err(e),
                Class::Virtual(vp) => ino::add_watch(fd, &vp, mask).map(Add::Ours),
            },
            Err(libc::EIO),
        );
        drop(g);
        match r {
            Ok(Add::Kernel) => real::inotify_add_watch(kfd, path, mask),
            Ok(Add::Redirect) => real::inotify_add_watch(kfd, scratch.ptr(), mask),
            Ok(Add::Ours(wd)) => {
                crate::dlog!("inotify_add_watch({fd}, {}) = {wd}", crate::debug::B(bytes));
                wd
            }
            Err(e) => done(Err(e)),
        }
    }
    fn inotify_rm_watch(fd: c_int, wd: c_int) -> c_int {
        let Some(kfd) = ino::kernel_fd(fd) else { return real::inotify_rm_watch(fd, wd) };
        if wd < ino::WD_BASE {
            return real::inotify_rm_watch(kfd, wd);
        }
        let Some(g) = Guard::enter() else { return real::inotify_rm_watch(kfd, wd) };
        let r = catch(|| ino::rm_watch(fd, wd), Err(libc::EIO));
        drop(g);
        done(r)
    }
}
