//! Which calls are ours: the cheap prefix test, full classification against
//! the mount, the virtual cwd and virtual directory fds.
//!
//! The hot path (an absolute path outside the mount, or a relative path with
//! no virtual cwd) costs one scan of the path's first bytes and never
//! normalises: [`maybe_ours`] says no and the hook calls libc untouched.

use crate::fd_table::{self, Tracked};
use crate::lookup::{self, RealDir};
use crate::state::{self, State};
use crate::vcwd::vcwd;
use fanstore_core::manifest::NAME_MAX;
use fanstore_core::path::{normalize_into, under_mount, MAX_PATH};
use libc::{c_char, c_int};

/// Working space for one hooked call: a normalised path, NUL-terminated
/// when it is handed back to libc.
pub struct Scratch {
    pub buf: [u8; MAX_PATH + 1],
}

impl Scratch {
    pub fn new() -> Scratch {
        Scratch { buf: [0; MAX_PATH + 1] }
    }
    /// The redirected path left by [`classify`] returning [`Class::Redirect`].
    pub fn ptr(&self) -> *const c_char {
        self.buf.as_ptr().cast()
    }
}

/// A path under the mount, relative to the dataset root.
pub struct VPath<'a> {
    pub st: &'static State,
    pub rel: &'a [u8],
    /// Written with a trailing '/', '.' or '..': must name a directory.
    pub must_be_dir: bool,
    /// The last component as written (`rel` has it folded): calls that
    /// make or remove a name refuse "." and ".." as the kernel does.
    pub last: Last,
}

/// The kind of a path's last component as written (trailing slashes
/// aside), the kernel's LAST_NORM, LAST_DOT and LAST_DOTDOT.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Last {
    Name,
    Dot,
    DotDot,
}

impl Last {
    /// The last component of `path`, as the kernel's walk names it.
    pub fn of(path: &[u8]) -> Last {
        let end = path.iter().rposition(|&b| b != b'/').map_or(0, |i| i + 1);
        let t = &path[..end];
        match &t[t.iter().rposition(|&b| b == b'/').map_or(0, |i| i + 1)..] {
            b"." => Last::Dot,
            b".." => Last::DotDot,
            _ => Last::Name,
        }
    }
}

pub enum Class<'a> {
    /// Not ours: call libc with the caller's own path.
    Real,
    /// Not ours, but relative to a virtual directory: call libc with the
    /// normalised absolute path now in the scratch buffer.
    Redirect,
    Virtual(VPath<'a>),
    Err(c_int),
}

/// Cheap test: can `path` (relative to `dirfd`) possibly be under the mount?
///
/// # Safety
/// `path` is null or a NUL-terminated string.
#[inline]
pub unsafe fn maybe_ours(dirfd: c_int, path: *const c_char) -> bool {
    if path.is_null() {
        return false;
    }
    // SAFETY: non-null and NUL-terminated per the contract: byte 0 exists.
    let first = unsafe { *path } as u8;
    if first == b'/' {
        // SAFETY: as above.
        unsafe { abs_maybe(path as *const u8) }
    } else if first == 0 {
        false
    } else if dirfd == libc::AT_FDCWD {
        // Initialisation loads the state, after which the first look at the
        // virtual cwd restores one inherited through exec.
        state::ensure_init();
        vcwd().is_some()
    } else {
        fd_table::get(dirfd).is_some()
    }
}

/// An absolute path can be under the mount only if, after its leading
/// slashes, it starts with the mount's own components, or if it contains a
/// `.`/`..` component or a `//` that normalisation could fold.
///
/// # Safety
/// `p` is a NUL-terminated string.
unsafe fn abs_maybe(p: *const u8) -> bool {
    let tail = state::mount().tail();
    if tail.is_empty() {
        return true;
    }
    // SAFETY (whole block): every read stops at the first NUL, and the
    // comparison with `tail` (which has no NUL) stops at a mismatch, so no
    // byte past the terminator is read.
    unsafe {
        let mut q = p;
        while *q == b'/' {
            q = q.add(1);
        }
        let mut i = 0;
        while i < tail.len() && *q.add(i) == tail[i] {
            i += 1;
        }
        if i == tail.len() && (*q.add(i) == 0 || *q.add(i) == b'/') {
            return true;
        }
        let mut prev = 0u8;
        let mut q = p;
        loop {
            let c = *q;
            if c == 0 {
                return false;
            }
            if prev == b'/' && (c == b'.' || c == b'/') {
                return true;
            }
            prev = c;
            q = q.add(1);
        }
    }
}

/// Does absolute `path` begin with the mount's components (after any leading slashes)?
fn starts_in_mount(path: &[u8], tail: &[u8]) -> bool {
    let p = &path[path.iter().position(|&b| b != b'/').unwrap_or(path.len())..];
    match p.strip_prefix(tail) {
        Some(rest) => tail.is_empty() || rest.is_empty() || rest[0] == b'/',
        None => false,
    }
}

/// Writes the absolute path of `node` (mount + '/' + relative path) to `out`.
pub fn node_abs_path(st: &State, node: u32, out: &mut [u8]) -> Option<usize> {
    let mut tmp = [0u8; MAX_PATH];
    let rel = if node & crate::outputs::OUT_DIR != 0 {
        let n = crate::outputs::path_into(node, &mut tmp)?;
        &tmp[..n]
    } else {
        st.view.node(node)?.path()
    };
    rel_abs_path(rel, out)
}

/// The absolute path of `rel` (relative to the dataset root) under the mount.
pub fn rel_abs_path(rel: &[u8], out: &mut [u8]) -> Option<usize> {
    let m = &state::mount().path;
    let mut len = 0;
    if m.as_slice() != b"/" || rel.is_empty() {
        out.get_mut(..m.len())?.copy_from_slice(m);
        len = m.len();
    }
    if !rel.is_empty() {
        *out.get_mut(len)? = b'/';
        out.get_mut(len + 1..len + 1 + rel.len())?.copy_from_slice(rel);
        len += 1 + rel.len();
    }
    Some(len)
}

/// Would an over-long `path` have been ours? (Then it fails like the kernel would.)
#[cold]
fn classify_long(dirfd: c_int, path: &[u8]) -> bool {
    if path[0] == b'/' {
        return starts_in_mount(path, state::mount().tail());
    }
    if dirfd == libc::AT_FDCWD {
        vcwd().is_some()
    } else {
        fd_table::get(dirfd).is_some()
    }
}

/// Full classification of `path` relative to `dirfd` (AT_FDCWD or an fd).
pub fn classify<'s>(dirfd: c_int, path: &[u8], scratch: &'s mut Scratch) -> Class<'s> {
    if path.is_empty() {
        return Class::Real;
    }
    // The kernel refuses path strings of PATH_MAX bytes or more (NUL
    // included), whatever they resolve to; so do we under the mount.
    if path.len() >= libc::PATH_MAX as usize {
        return match classify_long(dirfd, path) {
            true => Class::Err(libc::ENAMETOOLONG),
            false => Class::Real,
        };
    }
    let mount = state::mount();
    if has_dotdot(path) {
        return classify_dotdot(dirfd, path, scratch);
    }
    let out = &mut scratch.buf[..MAX_PATH];
    if path[0] == b'/' {
        let Some(n) = normalize_into(b"/", path, out) else { return Class::Real };
        return match under_mount(&out[..n.len], &mount.path) {
            // "/fanstore/..": the kernel cannot walk through the virtual
            // mount, so hand libc the normalised path. Other paths go untouched.
            None if starts_in_mount(path, mount.tail()) => {
                scratch.buf[n.len] = 0;
                Class::Redirect
            }
            None => Class::Real,
            Some(_) => match state::state() {
                None => Class::Err(libc::ENOENT),
                Some(st) => {
                    let rel = under_mount(&scratch.buf[..n.len], &mount.path).unwrap_or(b"");
                    virtual_path(st, rel, n.must_be_dir, path)
                }
            },
        };
    }
    let base = if dirfd == libc::AT_FDCWD {
        match vcwd() {
            Some(n) => n,
            None => return Class::Real,
        }
    } else {
        match fd_table::get(dirfd) {
            Some(Tracked::Dir { node, .. }) => node,
            Some(Tracked::File(_) | Tracked::Output(_) | Tracked::Committed { .. }) => return Class::Err(libc::ENOTDIR),
            None => return Class::Real,
        }
    };
    let Some(st) = state::current() else { return Class::Real };
    let mut cwd = [0u8; MAX_PATH];
    let Some(cl) = node_abs_path(st, base, &mut cwd) else { return Class::Err(libc::ENAMETOOLONG) };
    let Some(n) = normalize_into(&cwd[..cl], path, out) else { return Class::Err(libc::ENAMETOOLONG) };
    if under_mount(&out[..n.len], &mount.path).is_none() {
        scratch.buf[n.len] = 0;
        return Class::Redirect;
    }
    let rel = under_mount(&scratch.buf[..n.len], &mount.path).unwrap_or(b"");
    virtual_path(st, rel, n.must_be_dir, path)
}

/// The virtual path `rel` (normalised, relative to the dataset root) that
/// `path` names; ENAMETOOLONG where the kernel's walk would meet a
/// component longer than NAME_MAX ([`long_name_errno`]).
fn virtual_path<'s>(st: &'static State, rel: &'s [u8], must_be_dir: bool, path: &[u8]) -> Class<'s> {
    if rel.len() > NAME_MAX && rel.split(|&b| b == b'/').any(|c| c.len() > NAME_MAX) {
        return Class::Err(long_name_errno(st, rel));
    }
    Class::Virtual(VPath { st, rel, must_be_dir, last: Last::of(path) })
}

/// The errno of a path with a component longer than NAME_MAX, which no
/// file of the tree has: the walk up to that component decides (ENOENT,
/// ENOTDIR, ELOOP from the components before it), else the kernel's
/// lookup of that name refuses it: ENAMETOOLONG. (A ".." after it was
/// already resolved through it, see [`classify_dotdot`]: ENAMETOOLONG.)
#[cold]
fn long_name_errno(st: &State, rel: &[u8]) -> c_int {
    let mut end = 0;
    for c in rel.split(|&b| b == b'/') {
        if c.len() > NAME_MAX {
            break;
        }
        end += c.len() + 1;
    }
    let dir = &rel[..end.saturating_sub(1)];
    match lookup::resolve(st, dir, true, true) {
        Ok(_) => libc::ENAMETOOLONG,
        Err(libc::ENOENT) => match lookup::real_dir(st, dir) {
            // A directory (or one outside the mount, whose file system
            // refuses the name all the same).
            Ok(_) | Err(libc::EXDEV) => libc::ENAMETOOLONG,
            Err(e) => e,
        },
        Err(e) => e,
    }
}

/// Does `path` have a ".." component?
fn has_dotdot(path: &[u8]) -> bool {
    path.split(|&b| b == b'/').any(|c| c == b"..")
}

/// Classification of a path with ".." components. The kernel resolves ".."
/// physically: "file/.." is ENOTDIR, "missing/.." ENOENT, and "link/.."
/// is the parent of the link's target. Under the mount we do the same,
/// walking the components against the index; outside it, lexically (libc
/// gets the original path then, unless it passed through the mount).
#[cold]
fn classify_dotdot<'s>(dirfd: c_int, path: &[u8], scratch: &'s mut Scratch) -> Class<'s> {
    let mount = state::mount();
    let mut base = [0u8; MAX_PATH];
    let mut bl = 1;
    base[0] = b'/';
    let mut st = None;
    if path[0] != b'/' {
        let node = if dirfd == libc::AT_FDCWD {
            vcwd()
        } else {
            match fd_table::get(dirfd) {
                Some(Tracked::Dir { node, .. }) => Some(node),
                Some(Tracked::File(_) | Tracked::Output(_) | Tracked::Committed { .. }) => return Class::Err(libc::ENOTDIR),
                None => None,
            }
        };
        let Some(node) = node else { return Class::Real };
        let Some(s) = state::current() else { return Class::Real };
        st = Some(s);
        match node_abs_path(s, node, &mut base) {
            Some(l) => bl = l,
            None => return Class::Err(libc::ENAMETOOLONG),
        }
    }
    let out = &mut scratch.buf[..MAX_PATH];
    let mut len = 0usize;
    for c in base[..bl].split(|&b| b == b'/').filter(|c| !c.is_empty()) {
        out[len] = b'/';
        out[len + 1..len + 1 + c.len()].copy_from_slice(c);
        len += 1 + c.len();
    }
    let mut touched = path[0] != b'/';
    for c in path.split(|&b| b == b'/') {
        match c {
            b"" | b"." => {}
            b".." => {
                let cur: &[u8] = if len == 0 { b"/" } else { &out[..len] };
                if let Some(rel) = under_mount(cur, &mount.path) {
                    touched = true;
                    let Some(s) = st.or_else(state::state) else { return Class::Err(libc::ENOENT) };
                    st = Some(s);
                    if rel.len() > NAME_MAX && rel.split(|&b| b == b'/').any(|c| c.len() > NAME_MAX) {
                        return Class::Err(long_name_errno(s, rel));
                    }
                    match lookup::resolve(s, rel, true, true) {
                        Ok(n) => match node_abs_path(s, n.id(), out) {
                            Some(l) => len = l,
                            None => return Class::Err(libc::ENAMETOOLONG),
                        },
                        // Not an input: an output directory, whose parent is
                        // the one of its real path (symlinks followed).
                        Err(libc::ENOENT) => match lookup::real_dir(s, rel) {
                            Ok(RealDir::Output(real)) => {
                                if real != rel {
                                    let m = &crate::state::mount().path;
                                    if m.len() + 1 + real.len() > out.len() {
                                        return Class::Err(libc::ENAMETOOLONG);
                                    }
                                    out[..m.len()].copy_from_slice(m);
                                    out[m.len()] = b'/';
                                    out[m.len() + 1..m.len() + 1 + real.len()].copy_from_slice(&real);
                                    len = m.len() + 1 + real.len();
                                }
                            }
                            Ok(RealDir::Input(n)) => match node_abs_path(s, n.id(), out) {
                                Some(l) => len = l,
                                None => return Class::Err(libc::ENAMETOOLONG),
                            },
                            Err(libc::ENOTDIR) => return Class::Err(libc::ENOTDIR),
                            // No such output (or no daemon to ask): the index's answer.
                            Err(_) => return Class::Err(libc::ENOENT),
                        },
                        Err(e) => return Class::Err(e),
                    }
                }
                while len > 0 && out[len - 1] != b'/' {
                    len -= 1;
                }
                len = len.saturating_sub(1);
            }
            name => {
                if len + 1 + name.len() > out.len() {
                    return Class::Err(libc::ENAMETOOLONG);
                }
                out[len] = b'/';
                out[len + 1..len + 1 + name.len()].copy_from_slice(name);
                len += 1 + name.len();
            }
        }
    }
    if len == 0 {
        out[0] = b'/';
        len = 1;
    }
    let must_be_dir = path.ends_with(b"/") || path.ends_with(b"/.") || path.ends_with(b"/..") || path == b"..";
    if under_mount(&out[..len], &mount.path).is_none() {
        if !touched {
            return Class::Real;
        }
        scratch.buf[len] = 0;
        return Class::Redirect;
    }
    let Some(s) = st.or_else(state::state) else { return Class::Err(libc::ENOENT) };
    let rel = under_mount(&scratch.buf[..len], &mount.path).unwrap_or(b"");
    virtual_path(s, rel, must_be_dir, path)
}
