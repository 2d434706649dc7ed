//! Safe implementations of the virtual calls. Hooks classify the path or fd
//! and call these with a [`VPath`] (a path under the mount) or a tracked fd;
//! each returns an [`Outcome`].

use crate::state::State;
use fanstore_core::manifest::{NodeKind, NodeRef};
use fanstore_core::path::{normalize_into, under_mount, MAX_PATH};
use libc::c_int;

pub mod cwd;
pub mod dir;
pub mod fd;
pub mod meta;
pub mod open;
pub mod stat;
pub mod walk;
pub mod write;

pub use crate::paths::VPath;

/// The three ways a hooked call ends.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome<T> {
    /// Served by the library: return this value.
    Handled(T),
    /// Not ours after all: call the original.
    Passthrough,
    /// Fail with this errno.
    Errno(c_int),
}

impl<T> From<Result<T, c_int>> for Outcome<T> {
    fn from(r: Result<T, c_int>) -> Outcome<T> {
        match r {
            Ok(v) => Outcome::Handled(v),
            Err(e) => Outcome::Errno(e),
        }
    }
}

pub type Node = NodeRef<'static>;

/// Maximum symlinks followed in one resolution (Linux's limit).
pub const MAX_SYMLINKS: u32 = 40;

#[inline]
pub fn is_symlink(n: &Node) -> bool {
    n.kind() == Some(NodeKind::Symlink)
}

/// Looks up `rel` (normalised, relative to the dataset root), following
/// symlinks inside the tree for every component but the last, and for the
/// last too when `follow` (or `must_be_dir`) is set.
/// Errors: ENOENT, ENOTDIR (a file used as a directory), ELOOP.
pub fn resolve(st: &State, rel: &[u8], must_be_dir: bool, follow: bool) -> Result<Node, c_int> {
    let follow = follow || must_be_dir;
    if let Some(n) = st.view.lookup(rel) {
        if !(follow && is_symlink(&n)) {
            if must_be_dir && !n.is_dir() {
                return Err(if is_symlink(&n) { libc::ELOOP } else { libc::ENOTDIR });
            }
            return Ok(n);
        }
    }
    resolve_slow(st, rel, must_be_dir, follow)
}

#[inline(never)]
fn resolve_slow(st: &State, rel: &[u8], must_be_dir: bool, follow: bool) -> Result<Node, c_int> {
    let mut cur = [0u8; MAX_PATH];
    if rel.len() > cur.len() {
        return Err(libc::ENAMETOOLONG);
    }
    cur[..rel.len()].copy_from_slice(rel);
    let mut len = rel.len();
    let mut hops = 0;
    'restart: loop {
        let p = &cur[..len];
        // Walk the components: each prefix must be a directory (or a symlink to follow).
        let mut i = 0;
        loop {
            let end = p[i..].iter().position(|&b| b == b'/').map_or(len, |k| i + k);
            let last = end == len;
            let prefix = &p[..end];
            let Some(n) = st.view.lookup(prefix) else { return Err(libc::ENOENT) };
            if is_symlink(&n) && (!last || follow) {
                hops += 1;
                if hops > MAX_SYMLINKS {
                    return Err(libc::ELOOP);
                }
                let mut next = [0u8; MAX_PATH];
                let nl = splice_symlink(&n, &p[end..], &mut next)?;
                cur[..nl].copy_from_slice(&next[..nl]);
                len = nl;
                continue 'restart;
            }
            if last {
                if must_be_dir && !n.is_dir() {
                    return Err(libc::ENOTDIR);
                }
                return Ok(n);
            }
            if !n.is_dir() {
                return Err(libc::ENOTDIR);
            }
            i = end + 1;
        }
    }
}

/// The path that replaces symlink `link` followed by `rest` (which is empty
/// or starts with '/'), relative to the dataset root. A target that leaves
/// the mount is not followed (ENOENT): the dataset is a closed tree.
fn splice_symlink(link: &Node, rest: &[u8], out: &mut [u8; MAX_PATH]) -> Result<usize, c_int> {
    let mount = &crate::state::mount().path;
    let lp = link.path();
    let parent = &lp[..lp.iter().rposition(|&b| b == b'/').unwrap_or(0)];
    let mut base = [0u8; MAX_PATH];
    let mut bl = 0;
    for part in [&mount[..], b"/", parent] {
        if bl + part.len() > base.len() {
            return Err(libc::ENAMETOOLONG);
        }
        base[bl..bl + part.len()].copy_from_slice(part);
        bl += part.len();
    }
    let mut joined = [0u8; MAX_PATH];
    let target = link.symlink_target();
    if target.len() + rest.len() > joined.len() {
        return Err(libc::ENAMETOOLONG);
    }
    joined[..target.len()].copy_from_slice(target);
    joined[target.len()..target.len() + rest.len()].copy_from_slice(rest);
    let n = normalize_into(&base[..bl], &joined[..target.len() + rest.len()], out).ok_or(libc::ENAMETOOLONG)?;
    let rel = under_mount(&out[..n.len], mount).ok_or(libc::ENOENT)?;
    let (start, rl) = (n.len - rel.len(), rel.len());
    out.copy_within(start..start + rl, 0);
    Ok(rl)
}

/// The parent directory of `rel` ("" for top-level names), for O_CREAT-style errors.
pub fn parent_of(rel: &[u8]) -> &[u8] {
    &rel[..rel.iter().rposition(|&b| b == b'/').unwrap_or(0)]
}

/// errno for creating `rel` (mkdir, O_CREAT, symlink, link target...):
/// EEXIST if it exists, else the parent's lookup error, else EROFS.
pub fn create_errno(vp: &VPath) -> c_int {
    match resolve(vp.st, vp.rel, false, false) {
        Ok(_) => libc::EEXIST,
        Err(libc::ENOENT) => match resolve(vp.st, parent_of(vp.rel), true, true) {
            Ok(_) if vp.rel.is_empty() => libc::EEXIST,
            Ok(_) => libc::EROFS,
            Err(e) => e,
        },
        Err(e) => e,
    }
}

#[cfg(test)]
pub mod testing;
