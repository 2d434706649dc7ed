//! The mkstemp family (mkstemp, mkostemp, mkstemps, mkostemps and their
//! 64 variants) and mkdtemp: glibc creates these names with its internal
//! open and mkdir, out of every other hook's sight ([`crate::ops::tempname`]).
//!
//! The caller's template gets the chosen name in place, as with libc. A
//! template outside the mount goes to libc unchanged; one that the library
//! redirects (a relative name in a virtual working directory that names a
//! real file) goes to libc as the redirected path, whose chosen characters
//! are copied back into the caller's template.

use super::{cbytes, path_hook};
use crate::ops::tempname::{self, Kind, X_LEN};
use crate::ops::Outcome;
use crate::real;
use libc::{c_char, c_int};

/// The six characters libc chose in `p`, a redirected copy of the template
/// (`suffix` bytes after them), to copy back into the caller's template.
///
/// # Safety
/// `p` is NUL-terminated.
unsafe fn chosen(p: *const c_char, suffix: usize) -> Option<[u8; X_LEN]> {
    // SAFETY: per the contract.
    let b = unsafe { cbytes(p) }?;
    let at = b.len().checked_sub(suffix + X_LEN)?;
    b.get(at..at + X_LEN)?.try_into().ok()
}

/// Creates the file or directory of `template`: the fd (0 for a directory,
/// -1 with errno on failure). `real` is libc's call on a template.
///
/// # Safety
/// `template` is null or a writable NUL-terminated string (the C
/// contract), or a bad pointer (probed: libc's, untouched).
unsafe fn create(name: &'static str, template: *mut c_char, suffix: c_int, kind: Kind, real: impl FnOnce(*mut c_char) -> c_int) -> c_int {
    if !crate::user_mem::cstr(template) {
        return real(template);
    }
    // SAFETY: a readable C string (probed).
    let Some(bytes) = (unsafe { cbytes(template) }) else { return real(template) };
    // A template libc could not write its name into (a string literal) is libc's.
    if !crate::user_mem::writable(template, bytes.len()) {
        return real(template);
    }
    // A malformed template is libc's to refuse (EINVAL), as without us.
    let Ok(range) = tempname::x_range(bytes, suffix) else { return real(template) };
    let suffix = suffix as usize;
    let own: *const c_char = template;
    let virt = |vp: &crate::ops::VPath| match tempname::create(vp, suffix, kind) {
        Outcome::Handled((fd, x)) => Outcome::Handled((fd, Some(x))),
        Outcome::Passthrough => Outcome::Passthrough,
        Outcome::Errno(e) => Outcome::Errno(e),
    };
    let libc_call = |p: *const c_char| {
        // `p` is the caller's template or the library's redirected copy of
        // it: NUL-terminated and writable either way.
        let r = real(p as *mut c_char);
        // SAFETY: `p` is NUL-terminated (above).
        (r, if r >= 0 && p != own { unsafe { chosen(p, suffix) } } else { None })
    };
    // SAFETY: template is NUL-terminated (checked above).
    let (r, x) = unsafe { path_hook(name, libc::AT_FDCWD, template, (-1, None), virt, libc_call) };
    if let Some(x) = x {
        // SAFETY: `range` lies inside the caller's template (x_range checked
        // it against the template's length), which the C contract makes writable.
        unsafe { std::ptr::copy_nonoverlapping(x.as_ptr(), template.add(range.start).cast::<u8>(), X_LEN) };
    }
    r
}

crate::hooks! {
    fn mkstemp(template: *mut c_char) -> c_int {
        create("mkstemp", template, 0, Kind::File { flags: 0 }, |p| real::mkstemp(p))
    }
    fn mkstemp64(template: *mut c_char) -> c_int {
        create("mkstemp64", template, 0, Kind::File { flags: 0 }, |p| real::mkstemp64(p))
    }
    fn mkostemp(template: *mut c_char, flags: c_int) -> c_int {
        create("mkostemp", template, 0, Kind::File { flags }, |p| real::mkostemp(p, flags))
    }
    fn mkostemp64(template: *mut c_char, flags: c_int) -> c_int {
        create("mkostemp64", template, 0, Kind::File { flags }, |p| real::mkostemp64(p, flags))
    }
    fn mkstemps(template: *mut c_char, suffixlen: c_int) -> c_int {
        create("mkstemps", template, suffixlen, Kind::File { flags: 0 }, |p| real::mkstemps(p, suffixlen))
    }
    fn mkstemps64(template: *mut c_char, suffixlen: c_int) -> c_int {
        create("mkstemps64", template, suffixlen, Kind::File { flags: 0 }, |p| real::mkstemps64(p, suffixlen))
    }
    fn mkostemps(template: *mut c_char, suffixlen: c_int, flags: c_int) -> c_int {
        create("mkostemps", template, suffixlen, Kind::File { flags }, |p| real::mkostemps(p, suffixlen, flags))
    }
    fn mkostemps64(template: *mut c_char, suffixlen: c_int, flags: c_int) -> c_int {
        create("mkostemps64", template, suffixlen, Kind::File { flags }, |p| real::mkostemps64(p, suffixlen, flags))
    }
    fn mkdtemp(template: *mut c_char) -> *mut c_char {
        // libc's mkdtemp returns the template it was given: success is non-null.
        let r = create("mkdtemp", template, 0, Kind::Dir, |p| if real::mkdtemp(p).is_null() { -1 } else { 0 });
        if r == 0 { template } else { std::ptr::null_mut() }
    }
}
