//! mkstemp and mkdtemp under the mount.
//!
//! glibc builds the mkstemp family and mkdtemp on its internal open and
//! mkdir, which no symbol hook sees (and Syscall User Dispatch leaves libc's
//! own syscalls alone), so `sed -i` or `git init` on an output directory
//! got ENOENT from the kernel. Here the library makes the names itself, as
//! glibc does (six letters or digits in place of the template's `XXXXXX`),
//! and creates each candidate through the output calls: open with
//! `O_RDWR | O_CREAT | O_EXCL` and mode 0600, or mkdir with mode 0700, again
//! with a new name on EEXIST.

use super::{Outcome, VPath};
use libc::c_int;

/// Length of the run of `X`s a template must have (before its suffix).
pub const X_LEN: usize = 6;

const LETTERS: &[u8; 62] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";

/// Names tried before giving up with EEXIST (glibc tries 62^3).
const ATTEMPTS: usize = 62 * 62 * 62;

/// What to create.
#[derive(Clone, Copy)]
pub enum Kind {
    /// mkostemps: `flags` are the caller's extra open flags (O_CLOEXEC, O_APPEND, O_SYNC...).
    File { flags: c_int },
    /// mkdtemp.
    Dir,
}

/// Where the `XXXXXX` of `template` lies when `suffix` bytes follow it;
/// EINVAL (as glibc) when they are not there.
pub fn x_range(template: &[u8], suffix: c_int) -> Result<std::ops::Range<usize>, c_int> {
    let suffix = usize::try_from(suffix).map_err(|_| libc::EINVAL)?;
    let end = template.len().checked_sub(suffix).ok_or(libc::EINVAL)?;
    let start = end.checked_sub(X_LEN).ok_or(libc::EINVAL)?;
    if template[start..end].iter().all(|&c| c == b'X') {
        Ok(start..end)
    } else {
        Err(libc::EINVAL)
    }
}

/// Six random letters or digits.
fn letters() -> [u8; X_LEN] {
    let mut raw = [0u8; 8];
    // SAFETY: getrandom writes at most raw.len() bytes into raw.
    let n = unsafe { libc::getrandom(raw.as_mut_ptr().cast(), raw.len(), libc::GRND_NONBLOCK) };
    let mut v = u64::from_le_bytes(raw);
    if n != raw.len() as isize {
        // No entropy yet (early boot): time and a counter, mixed.
        static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
        v = (t ^ SEQ.fetch_add(0x9e37_79b9_7f4a_7c15, std::sync::atomic::Ordering::Relaxed)).wrapping_mul(0xff51_afd7_ed55_8ccd);
    }
    let mut out = [0u8; X_LEN];
    for c in out.iter_mut() {
        *c = LETTERS[(v % 62) as usize];
        v /= 62;
    }
    out
}

/// Creates a fresh file or directory named after `vp` (a template whose
/// `XXXXXX` is followed by `suffix` bytes): the fd (0 for a directory) and
/// the six characters chosen, for the caller's template.
pub fn create(vp: &VPath, suffix: usize, kind: Kind) -> Outcome<(c_int, [u8; X_LEN])> {
    let mut name = vp.rel.to_vec();
    let Some(at) = name.len().checked_sub(suffix + X_LEN) else { return Outcome::Errno(libc::EINVAL) };
    if !name[at..at + X_LEN].iter().all(|&c| c == b'X') {
        return Outcome::Errno(libc::EINVAL);
    }
    for _ in 0..ATTEMPTS {
        let x = letters();
        name[at..at + X_LEN].copy_from_slice(&x);
        let candidate = VPath { st: vp.st, rel: &name, must_be_dir: false, last: crate::paths::Last::Name };
        let made = match kind {
            Kind::File { flags } => {
                let flags = (flags & !libc::O_ACCMODE) | libc::O_RDWR | libc::O_CREAT | libc::O_EXCL;
                super::open::open(&candidate, flags, 0o600)
            }
            Kind::Dir => super::write::mkdir(&candidate, 0o700),
        };
        match made {
            Outcome::Errno(libc::EEXIST) => continue,
            Outcome::Handled(fd) => return Outcome::Handled((fd, x)),
            Outcome::Passthrough => return Outcome::Passthrough,
            Outcome::Errno(e) => return Outcome::Errno(e),
        }
    }
    Outcome::Errno(libc::EEXIST)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_xs_are_found_before_the_suffix_or_the_template_is_refused() {
        assert_eq!(x_range(b"/fanstore/out/tmpXXXXXX", 0), Ok(17..23));
        assert_eq!(x_range(b"/fanstore/out/tmpXXXXXX.json", 5), Ok(17..23));
        assert_eq!(x_range(b"/fanstore/out/tmpXXXXX", 0), Err(libc::EINVAL));
        assert_eq!(x_range(b"/fanstore/out/tmpXXXXXX.json", 0), Err(libc::EINVAL));
        assert_eq!(x_range(b"XXXXXX", 1), Err(libc::EINVAL));
        assert_eq!(x_range(b"XXXXXX", -1), Err(libc::EINVAL));
        assert_eq!(x_range(b"XXXXXX", 0), Ok(0..6));
    }

    #[test]
    fn names_are_letters_and_digits_and_differ() {
        let a = letters();
        assert!(a.iter().all(|c| c.is_ascii_alphanumeric()));
        let distinct: std::collections::HashSet<_> = (0..64).map(|_| letters()).collect();
        assert!(distinct.len() > 60, "{} distinct names of 64", distinct.len());
    }
}
