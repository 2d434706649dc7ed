//! Lexical path normalisation into a caller's buffer, with no allocation:
//! the preload library runs it on every hooked call under the prefix.
//!
//! ```
//! use fanstore_core::path::{normalize_into, under_mount, MAX_PATH};
//! let mut buf = [0u8; MAX_PATH];
//! let n = normalize_into(b"/fanstore/train", b"../val//./x.png", &mut buf).unwrap();
//! assert_eq!(&buf[..n.len], b"/fanstore/val/x.png");
//! assert_eq!(under_mount(&buf[..n.len], b"/fanstore"), Some(&b"val/x.png"[..]));
//! ```

/// Size of a normalisation buffer: Linux's PATH_MAX plus room for a cwd.
pub const MAX_PATH: usize = 8192;

/// The result of [`normalize_into`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Normalized {
    /// Bytes written to the buffer: an absolute path, no '.', '..', '//' or trailing '/'.
    pub len: usize,
    /// The input ended in '/' or '/.' or '/..': the target must be a directory.
    pub must_be_dir: bool,
}

/// Resolves `path` against `cwd` (absolute, already normalised) when it is
/// relative, and removes `.`, `..` and repeated slashes. `..` of the root is
/// the root. Returns `None` if the result does not fit `out`.
pub fn normalize_into(cwd: &[u8], path: &[u8], out: &mut [u8]) -> Option<Normalized> {
    let mut len = 0usize;
    let push = |out: &mut [u8], len: &mut usize, comp: &[u8]| -> Option<()> {
        if comp.is_empty() || comp == b"." {
            return Some(());
        }
        if comp == b".." {
            while *len > 0 && out[*len - 1] != b'/' {
                *len -= 1;
            }
            *len = len.saturating_sub(1);
            return Some(());
        }
        let end = *len + 1 + comp.len();
        if end > out.len() {
            return None;
        }
        out[*len] = b'/';
        out[*len + 1..end].copy_from_slice(comp);
        *len = end;
        Some(())
    };
    if path.first() != Some(&b'/') {
        for c in cwd.split(|&b| b == b'/') {
            push(out, &mut len, c)?;
        }
    }
    for c in path.split(|&b| b == b'/') {
        push(out, &mut len, c)?;
    }
    let must_be_dir = path.last() == Some(&b'/') || path.ends_with(b"/.") || path.ends_with(b"/..") || path == b"." || path == b"..";
    if len == 0 {
        if out.is_empty() {
            return None;
        }
        out[0] = b'/';
        len = 1;
    }
    Some(Normalized { len, must_be_dir })
}

/// `path` split at its last `/`: (directory, name). A path with no `/` is
/// a name in the root: (`""`, path).
pub fn split_parent(path: &[u8]) -> (&[u8], &[u8]) {
    match path.iter().rposition(|&b| b == b'/') {
        Some(i) => (&path[..i], &path[i + 1..]),
        None => (&[], path),
    }
}

/// If normalised `abs` is `mount` or lies below it, the part below it
/// (`b""` for the mount point itself). `mount` is normalised, without trailing '/'.
#[inline]
pub fn under_mount<'a>(abs: &'a [u8], mount: &[u8]) -> Option<&'a [u8]> {
    let rest = abs.strip_prefix(mount)?;
    if rest.is_empty() {
        Some(rest)
    } else if rest[0] == b'/' {
        Some(&rest[1..])
    } else if mount == b"/" {
        Some(rest)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn split_parent_cuts_at_the_last_slash() {
        assert_eq!(split_parent(b"a/b/c"), (&b"a/b"[..], &b"c"[..]));
        assert_eq!(split_parent(b"c"), (&b""[..], &b"c"[..]));
        assert_eq!(split_parent(b"a/"), (&b"a"[..], &b""[..]));
    }

    use super::*;

    fn norm(cwd: &str, p: &str) -> (String, bool) {
        let mut b = [0u8; MAX_PATH];
        let n = normalize_into(cwd.as_bytes(), p.as_bytes(), &mut b).unwrap();
        (String::from_utf8(b[..n.len].to_vec()).unwrap(), n.must_be_dir)
    }

    #[test]
    fn normalises() {
        assert_eq!(norm("/", "/fanstore//a/./b/"), ("/fanstore/a/b".into(), true));
        assert_eq!(norm("/fanstore/a", "b/../c"), ("/fanstore/a/c".into(), false));
        assert_eq!(norm("/fanstore", ".."), ("/".into(), true));
        assert_eq!(norm("/", "../../.."), ("/".into(), true));
        assert_eq!(norm("/x", "."), ("/x".into(), true));
        assert_eq!(norm("/x", "/"), ("/".into(), true));
        assert_eq!(norm("/x", ""), ("/x".into(), false));
    }

    #[test]
    fn too_long_is_none() {
        let mut b = [0u8; 16];
        assert!(normalize_into(b"/", b"/aaaaaaaaaaaaaaaaaaaaaaaaaaaa", &mut b).is_none());
    }

    #[test]
    fn mount_prefix() {
        assert_eq!(under_mount(b"/fanstore", b"/fanstore"), Some(&b""[..]));
        assert_eq!(under_mount(b"/fanstore/a", b"/fanstore"), Some(&b"a"[..]));
        assert_eq!(under_mount(b"/fanstorex/a", b"/fanstore"), None);
        assert_eq!(under_mount(b"/tmp", b"/fanstore"), None);
    }
}
