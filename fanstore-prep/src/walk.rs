//! Walks an input tree without following symlinks and lists what will be
//! packed, in the manifest's depth-first order.
//!
//! Paths are bytes relative to the input root (`b""` is the root itself).
//! Each directory is opened beneath the root's descriptor, so absolute paths
//! longer than `PATH_MAX` work. Special files, unreadable directories and
//! symlinks that leave the tree are refused (or skipped, as the options say)
//! with the path named.
//!
//! Symlink targets are checked lexically, relative to the link's directory:
//! a relative target that climbs above the root with `..` is outside; an
//! absolute target inside the input directory is rewritten to the relative
//! path from the link's directory (so that the dataset can live anywhere);
//! any other absolute target is outside.
//!
//! Hard links are not detected: each name is packed as its own file.

use crate::sys::{self, InodeKind};
use std::cmp::Ordering;
use std::ffi::OsStr;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering as AtomicOrdering};
use std::sync::{Condvar, Mutex};

/// Longest name (one component) FanStore packs.
pub const NAME_MAX: usize = fanstore_core::manifest::NAME_MAX;
/// Longest path relative to the input root FanStore packs.
pub const PATH_MAX: usize = fanstore_core::manifest::PATH_MAX;

/// What an entry of the tree is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EntryKind {
    Dir,
    File { size: u64 },
    Symlink { target: Vec<u8> },
}

/// One entry of the input tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeEntry {
    /// Path relative to the input root, `/`-separated; empty for the root.
    pub path: Vec<u8>,
    pub kind: EntryKind,
    /// Permission bits.
    pub perm: u32,
    pub mtime_ns: i64,
    pub atime_ns: i64,
    pub ctime_ns: i64,
}

impl TreeEntry {
    fn new(path: Vec<u8>, kind: EntryKind, st: &sys::Stat) -> TreeEntry {
        TreeEntry { path, kind, perm: st.perm, mtime_ns: st.mtime_ns, atime_ns: st.atime_ns, ctime_ns: st.ctime_ns }
    }
}

/// What to do with input the packer cannot take.
#[derive(Debug, Clone, Copy, Default)]
pub struct WalkOptions {
    /// Warn about and leave out directories that cannot be read.
    pub skip_unreadable: bool,
    /// Warn about and leave out fifos, sockets and devices.
    pub skip_special: bool,
    /// Threads that list directories (0 means 1).
    pub threads: usize,
}

/// The walked tree: the open root and its entries in depth-first order.
pub struct Tree {
    /// The input directory as given.
    pub root: PathBuf,
    /// The input directory, open: files are later opened beneath it.
    pub root_fd: OwnedFd,
    /// Entries sorted like the manifest sorts them (root first).
    pub entries: Vec<TreeEntry>,
    /// One line per entry left out (already logged as a warning).
    pub skipped: Vec<String>,
}

/// Why the input tree cannot be packed.
#[derive(Debug, thiserror::Error)]
pub enum WalkError {
    #[error("input {}: {source}", .path.display())]
    Root { path: PathBuf, source: std::io::Error },
    #[error("input {} is not a directory", .0.display())]
    RootNotDir(PathBuf),
    #[error("{}: unreadable directory: {source} (use --skip-unreadable to leave it out)", .path.display())]
    UnreadableDir { path: PathBuf, source: std::io::Error },
    #[error("{}: cannot stat: {source}", .path.display())]
    Stat { path: PathBuf, source: std::io::Error },
    #[error("{}: cannot read symlink: {source}", .path.display())]
    ReadLink { path: PathBuf, source: std::io::Error },
    #[error("{}: special file ({kind}): FanStore packs regular files, directories and symlinks (use --skip-special to leave it out)", .path.display())]
    Special { path: PathBuf, kind: &'static str },
    #[error("{}: symlink points outside the input tree (target '{}'); only links that stay inside the tree can be kept", .path.display(), String::from_utf8_lossy(.target))]
    SymlinkOutside { path: PathBuf, target: Vec<u8> },
    #[error("{}: {problem}", .path.display())]
    TooLong { path: PathBuf, problem: String },
}

/// `root` joined with the relative byte path `rel`, for messages.
pub fn display_path(root: &Path, rel: &[u8]) -> PathBuf {
    if rel.is_empty() {
        root.to_path_buf()
    } else {
        root.join(OsStr::from_bytes(rel))
    }
}

/// The components of a relative byte path.
pub fn components(p: &[u8]) -> impl Iterator<Item = &[u8]> {
    p.split(|&b| b == b'/').filter(|c| !c.is_empty())
}

/// The manifest's order: depth-first, entries of a directory by name bytes.
pub fn tree_order(a: &[u8], b: &[u8]) -> Ordering {
    components(a).cmp(components(b))
}

fn join(dir: &[u8], name: &[u8]) -> Vec<u8> {
    let mut p = Vec::with_capacity(dir.len() + 1 + name.len());
    p.extend_from_slice(dir);
    if !dir.is_empty() {
        p.push(b'/');
    }
    p.extend_from_slice(name);
    p
}

/// Walks `root` and returns its entries, depth-first and sorted.
///
/// `opts.threads` threads list directories in parallel (the calling thread
/// is one of them and reports progress). Each directory's listing is sorted
/// by name on its own; the manifest's order is then a depth-first walk over
/// the listings, in linear time, so neither the result nor its order
/// depends on the thread count or on timing. If several entries are bad,
/// which one is reported may depend on timing; each error names its path.
pub fn walk(root: &Path, opts: WalkOptions, mut on_progress: impl FnMut(usize)) -> Result<Tree, WalkError> {
    let root_file = std::fs::File::open(root).map_err(|e| WalkError::Root { path: root.into(), source: e })?;
    let root_fd: OwnedFd = root_file.into();
    let root_stat = sys::fstat(root_fd.as_fd()).map_err(|e| WalkError::Root { path: root.into(), source: e })?;
    if root_stat.kind != InodeKind::Dir {
        return Err(WalkError::RootNotDir(root.into()));
    }
    let ctx = WalkContext { root, root_fd: root_fd.as_fd(), opts, anchors: RootAnchors::new(root) };
    let shared = WalkQueue {
        state: Mutex::new(QueueState { pending: vec![(0, Vec::new())], listings: vec![None], busy: 0, error: None }),
        changed: Condvar::new(),
        listed: AtomicUsize::new(1),
    };
    let threads = opts.threads.max(1);
    std::thread::scope(|s| {
        for _ in 1..threads {
            s.spawn(|| shared.work(&ctx, &mut |_| {}));
        }
        shared.work(&ctx, &mut on_progress);
    });
    let state = shared.state.into_inner().unwrap_or_else(|p| p.into_inner());
    if let Some(e) = state.error {
        return Err(e);
    }
    let (entries, skipped) = depth_first(TreeEntry::new(Vec::new(), EntryKind::Dir, &root_stat), state.listings);
    debug_assert!(entries.windows(2).all(|w| tree_order(&w[0].path, &w[1].path).is_lt()));
    Ok(Tree { root: root.into(), root_fd, entries, skipped })
}

/// What every walking thread reads.
struct WalkContext<'a> {
    root: &'a Path,
    root_fd: std::os::fd::BorrowedFd<'a>,
    opts: WalkOptions,
    anchors: RootAnchors,
}

/// One directory, listed: its own times (taken after listing it) and its
/// entries sorted by name, each subdirectory with the id of its listing.
/// `None` entries: an unreadable directory left out.
struct Listing {
    stat: Option<sys::Stat>,
    entries: Option<Vec<(TreeEntry, Option<usize>)>>,
    skipped: Vec<String>,
}

/// Directories still to list, by listing id, and the listings done.
struct WalkQueue {
    state: Mutex<QueueState>,
    changed: Condvar,
    /// Entries listed so far (for progress).
    listed: AtomicUsize,
}

struct QueueState {
    /// (listing id, relative path) of directories to list.
    pending: Vec<(usize, Vec<u8>)>,
    /// One slot per directory found, filled when it is listed.
    listings: Vec<Option<Listing>>,
    /// Threads listing a directory now (more may be found while any is).
    busy: usize,
    error: Option<WalkError>,
}

impl WalkQueue {
    fn lock(&self) -> std::sync::MutexGuard<'_, QueueState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Lists directories until none is left (or one failed).
    fn work(&self, ctx: &WalkContext<'_>, on_progress: &mut dyn FnMut(usize)) {
        let mut st = self.lock();
        loop {
            if st.error.is_some() {
                break;
            }
            let Some((id, rel)) = st.pending.pop() else {
                if st.busy == 0 {
                    break;
                }
                st = self.changed.wait(st).unwrap_or_else(|p| p.into_inner());
                continue;
            };
            st.busy += 1;
            drop(st);
            let result = list_dir(ctx, &rel);
            st = self.lock();
            st.busy -= 1;
            match result {
                Ok((mut listing, subdirs)) => {
                    let n = listing.entries.as_ref().map_or(0, Vec::len);
                    if let Some(entries) = listing.entries.as_mut() {
                        for k in subdirs {
                            let child = st.listings.len();
                            st.listings.push(None);
                            entries[k].1 = Some(child);
                            let path = entries[k].0.path.clone();
                            st.pending.push((child, path));
                        }
                    }
                    st.listings[id] = Some(listing);
                    let total = self.listed.fetch_add(n, AtomicOrdering::Relaxed) + n;
                    self.changed.notify_all();
                    drop(st);
                    on_progress(total);
                    st = self.lock();
                }
                Err(e) => {
                    st.error.get_or_insert(e);
                    self.changed.notify_all();
                }
            }
        }
        drop(st);
        self.changed.notify_all();
    }
}

/// Lists the directory `dir_rel`: its entries sorted by name, and the
/// positions of its subdirectories among them.
fn list_dir(ctx: &WalkContext<'_>, dir_rel: &[u8]) -> Result<(Listing, Vec<usize>), WalkError> {
    let (root, opts) = (ctx.root, ctx.opts);
    let listing = sys::open_dir_beneath(ctx.root_fd, dir_rel).and_then(|fd| sys::read_dir_names(fd.as_fd()).map(|names| (fd, names)));
    let (dir_fd, mut names) = match listing {
        Ok(x) => x,
        Err(e) => {
            let path = display_path(root, dir_rel);
            if opts.skip_unreadable && !dir_rel.is_empty() {
                log::warn!("skipping unreadable directory {}: {e}", path.display());
                let skipped = vec![format!("{} (unreadable directory)", path.display())];
                return Ok((Listing { stat: None, entries: None, skipped }, Vec::new()));
            }
            return Err(WalkError::UnreadableDir { path, source: e });
        }
    };
    // Record the directory's times after listing it: reading a directory
    // may update its atime once, and a later pack then sees the same value.
    let stat = sys::fstat(dir_fd.as_fd()).ok();
    names.sort_unstable();
    let mut entries = Vec::with_capacity(names.len());
    let mut subdirs = Vec::new();
    let mut skipped = Vec::new();
    for name in names {
        let rel = join(dir_rel, &name);
        let path = || display_path(root, &rel);
        if name.len() > NAME_MAX {
            return Err(WalkError::TooLong { path: path(), problem: format!("name is {} bytes, the limit is {NAME_MAX}", name.len()) });
        }
        if rel.len() > PATH_MAX {
            return Err(WalkError::TooLong {
                path: path(),
                problem: format!("path is {} bytes below the input, the limit is {PATH_MAX}", rel.len()),
            });
        }
        let st = match sys::lstat_at(dir_fd.as_fd(), &name) {
            Ok(st) => st,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                log::warn!("{} vanished while the tree was walked; leaving it out", path().display());
                continue;
            }
            Err(e) => return Err(WalkError::Stat { path: path(), source: e }),
        };
        match st.kind {
            InodeKind::Dir => {
                subdirs.push(entries.len());
                entries.push((TreeEntry::new(rel, EntryKind::Dir, &st), None));
            }
            InodeKind::File => entries.push((TreeEntry::new(rel, EntryKind::File { size: st.size }, &st), None)),
            InodeKind::Symlink => {
                let target = sys::readlink_at(dir_fd.as_fd(), &name).map_err(|e| WalkError::ReadLink { path: path(), source: e })?;
                // readlink may have updated the link's atime: record the
                // stat taken after it, which the next pack sees again.
                let st = sys::lstat_at(dir_fd.as_fd(), &name).unwrap_or(st);
                let kept = ctx
                    .anchors
                    .check_symlink(&rel, &target)
                    .ok_or_else(|| WalkError::SymlinkOutside { path: path(), target: target.clone() })?;
                if kept != target {
                    log::info!(
                        "{}: absolute target '{}' is inside the tree: stored as '{}'",
                        path().display(),
                        String::from_utf8_lossy(&target),
                        String::from_utf8_lossy(&kept)
                    );
                }
                entries.push((TreeEntry::new(rel, EntryKind::Symlink { target: kept }, &st), None));
            }
            InodeKind::Special(kind) => {
                if opts.skip_special {
                    log::warn!("skipping special file ({kind}) {}", path().display());
                    skipped.push(format!("{} ({kind})", path().display()));
                } else {
                    return Err(WalkError::Special { path: path(), kind });
                }
            }
        }
    }
    Ok((Listing { stat, entries: Some(entries), skipped }, subdirs))
}

/// The entries in the manifest's order (depth-first from listing 0, the
/// root, whose entry is `root`), unreadable directories left out, and the
/// skipped entries in the same order.
fn depth_first(root: TreeEntry, mut listings: Vec<Option<Listing>>) -> (Vec<TreeEntry>, Vec<String>) {
    let mut out = Vec::new();
    let mut skipped = Vec::new();
    // The listings being emitted, each with the entries it has left.
    let mut stack: Vec<std::vec::IntoIter<(TreeEntry, Option<usize>)>> = Vec::new();
    let mut visit = |mut dir: TreeEntry, id: usize, out: &mut Vec<TreeEntry>, stack: &mut Vec<_>| {
        let Some(listing) = listings.get_mut(id).and_then(Option::take) else {
            out.push(dir);
            return;
        };
        skipped.extend(listing.skipped);
        let Some(entries) = listing.entries else { return }; // unreadable: left out
        if let Some(st) = listing.stat {
            (dir.perm, dir.mtime_ns, dir.atime_ns, dir.ctime_ns) = (st.perm, st.mtime_ns, st.atime_ns, st.ctime_ns);
        }
        out.push(dir);
        stack.push(entries.into_iter());
    };
    visit(root, 0, &mut out, &mut stack);
    while let Some(top) = stack.last_mut() {
        match top.next() {
            None => {
                stack.pop();
            }
            Some((entry, None)) => out.push(entry),
            Some((entry, Some(id))) => visit(entry, id, &mut out, &mut stack),
        }
    }
    (out, skipped)
}

/// The absolute spellings of the input root, for absolute symlink targets.
struct RootAnchors {
    spellings: Vec<Vec<u8>>,
}

impl RootAnchors {
    fn new(root: &Path) -> RootAnchors {
        let mut spellings = Vec::new();
        if let Ok(abs) = std::path::absolute(root) {
            if let Some(n) = normalize_absolute(abs.as_os_str().as_bytes()) {
                spellings.push(n);
            }
        }
        if let Ok(real) = std::fs::canonicalize(root) {
            let r = real.as_os_str().as_bytes().to_vec();
            if !spellings.contains(&r) {
                spellings.push(r);
            }
        }
        RootAnchors { spellings }
    }

    /// The target to store for the symlink at `link` (relative path) whose
    /// target is `target`, or `None` if it points outside the tree.
    fn check_symlink(&self, link: &[u8], target: &[u8]) -> Option<Vec<u8>> {
        let link_dir: Vec<&[u8]> = {
            let mut c: Vec<&[u8]> = components(link).collect();
            c.pop();
            c
        };
        if target.first() == Some(&b'/') {
            let norm = normalize_absolute(target)?;
            for root in &self.spellings {
                let inside: Option<&[u8]> = if root.as_slice() == b"/" {
                    Some(&norm[1..])
                } else if norm == *root {
                    Some(b"")
                } else if norm.starts_with(root) && norm.get(root.len()) == Some(&b'/') {
                    Some(&norm[root.len() + 1..])
                } else {
                    None
                };
                if let Some(rel) = inside {
                    let to: Vec<&[u8]> = components(rel).collect();
                    return Some(relative_path(&link_dir, &to));
                }
            }
            return None;
        }
        resolve_relative(&link_dir, target).map(|_| target.to_vec())
    }
}

/// Resolves `target` against the directory components `from` lexically;
/// `None` if it climbs above the root at any point or is empty.
pub fn resolve_relative<'a>(from: &[&'a [u8]], target: &'a [u8]) -> Option<Vec<&'a [u8]>> {
    if target.is_empty() {
        return None;
    }
    let mut stack: Vec<&[u8]> = from.to_vec();
    for c in components(target) {
        match c {
            b"." => {}
            b".." => {
                stack.pop()?;
            }
            _ => stack.push(c),
        }
    }
    Some(stack)
}

/// The relative path from directory `from` to `to` (both component lists
/// below the same root); `.` when they are the same.
pub fn relative_path(from: &[&[u8]], to: &[&[u8]]) -> Vec<u8> {
    let common = from.iter().zip(to).take_while(|(a, b)| a == b).count();
    let mut parts: Vec<&[u8]> = vec![b".."; from.len() - common];
    parts.extend_from_slice(&to[common..]);
    if parts.is_empty() {
        return b".".to_vec();
    }
    parts.join(&b'/')
}

/// Removes `.`, `..` and repeated slashes from an absolute path (`..` of `/` is `/`).
fn normalize_absolute(p: &[u8]) -> Option<Vec<u8>> {
    if p.first() != Some(&b'/') {
        return None;
    }
    let mut stack: Vec<&[u8]> = Vec::new();
    for c in components(p) {
        match c {
            b"." => {}
            b".." => {
                stack.pop();
            }
            _ => stack.push(c),
        }
    }
    let mut out = Vec::with_capacity(p.len());
    for c in &stack {
        out.push(b'/');
        out.extend_from_slice(c);
    }
    if out.is_empty() {
        out.push(b'/');
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn anchors(root: &str) -> RootAnchors {
        RootAnchors { spellings: vec![root.as_bytes().to_vec()] }
    }

    #[test]
    fn relative_targets_inside_are_kept_outside_refused() {
        let a = anchors("/data/in");
        assert_eq!(a.check_symlink(b"x/l", b"../y/f").as_deref(), Some(&b"../y/f"[..]));
        assert_eq!(a.check_symlink(b"x/l", b"f").as_deref(), Some(&b"f"[..]));
        assert_eq!(a.check_symlink(b"x/l", b"..").as_deref(), Some(&b".."[..]));
        assert_eq!(a.check_symlink(b"x/l", b"../..").as_deref(), None);
        assert_eq!(a.check_symlink(b"l", b"../in/f").as_deref(), None, "escapes, even if it comes back");
        assert_eq!(a.check_symlink(b"l", b"").as_deref(), None);
    }

    #[test]
    fn absolute_targets_inside_are_rewritten_relative() {
        let a = anchors("/data/in");
        assert_eq!(a.check_symlink(b"x/y/l", b"/data/in/x/f").as_deref(), Some(&b"../f"[..]));
        assert_eq!(a.check_symlink(b"l", b"/data/in//z/./f").as_deref(), Some(&b"z/f"[..]));
        assert_eq!(a.check_symlink(b"x/l", b"/data/in").as_deref(), Some(&b".."[..]));
        assert_eq!(a.check_symlink(b"x/l", b"/data/in/x").as_deref(), Some(&b"."[..]));
        assert_eq!(a.check_symlink(b"l", b"/data/inner/f").as_deref(), None);
        assert_eq!(a.check_symlink(b"l", b"/etc/passwd").as_deref(), None);
        assert_eq!(a.check_symlink(b"l", b"/data/in/../out").as_deref(), None);
    }

    #[test]
    fn tree_order_is_depth_first_by_name_bytes() {
        let mut v: Vec<&[u8]> = vec![b"a.b", b"a/z", b"a", b"", b"b", b"a/b/c", b"\xff"];
        v.sort_by(|a, b| tree_order(a, b));
        assert_eq!(v, vec![&b""[..], b"a", b"a/b/c", b"a/z", b"a.b", b"b", b"\xff"]);
    }

    #[test]
    fn walk_order_does_not_depend_on_the_thread_count() {
        let d = tempfile::tempdir().unwrap();
        let r = d.path();
        // Names whose byte order differs from the order of whole paths
        // ("a.b" sorts after "a/z") and from creation order.
        for (i, dir) in ["b", "a", "a/z", "a/z/y", "a.b", "c/d/e/f", "\u{e9}"].iter().enumerate() {
            std::fs::create_dir_all(r.join(dir)).unwrap();
            for k in [3, 1, 20, 2] {
                std::fs::write(r.join(dir).join(format!("f{k}")), vec![b'x'; i * k]).unwrap();
            }
        }
        std::os::unix::fs::symlink("../b/f1", r.join("a/l")).unwrap();
        // The first read of a file may move its atime (relatime: atime <=
        // mtime until then): one walk first, so the walks compared see the
        // same atimes. A symlink's atime is compared apart: overlayfs (a
        // container's /tmp) reports its readlink-updated atime in one lstat
        // and the old one in the next.
        walk(r, WalkOptions { threads: 1, ..Default::default() }, |_| {}).unwrap();
        let link_atimes_apart = |mut v: Vec<TreeEntry>| {
            for e in v.iter_mut().filter(|e| matches!(e.kind, EntryKind::Symlink { .. })) {
                e.atime_ns = 0;
            }
            v
        };
        let one = walk(r, WalkOptions { threads: 1, ..Default::default() }, |_| {}).unwrap();
        let paths: Vec<&[u8]> = one.entries.iter().map(|e| e.path.as_slice()).collect();
        let mut sorted = paths.clone();
        sorted.sort_by(|a, b| tree_order(a, b));
        sorted.dedup();
        assert_eq!(paths, sorted, "depth-first, by name, no duplicates");
        assert_eq!(paths.len(), 1 + 10 + 7 * 4 + 1);
        for threads in [2, 3, 8] {
            let many = walk(r, WalkOptions { threads, ..Default::default() }, |_| {}).unwrap();
            assert_eq!(link_atimes_apart(many.entries), link_atimes_apart(one.entries.clone()), "{threads} threads");
        }
    }

    #[test]
    fn walk_lists_kinds_and_refuses_fifos_and_outside_links() {
        let d = tempfile::tempdir().unwrap();
        let r = d.path();
        std::fs::create_dir_all(r.join("a/empty")).unwrap();
        std::fs::write(r.join("a/f"), b"12345").unwrap();
        std::os::unix::fs::symlink("f", r.join("a/l")).unwrap();
        let t = walk(r, WalkOptions::default(), |_| {}).unwrap();
        let got: Vec<(&[u8], &EntryKind)> = t.entries.iter().map(|e| (e.path.as_slice(), &e.kind)).collect();
        assert_eq!(
            got,
            vec![
                (&b""[..], &EntryKind::Dir),
                (b"a", &EntryKind::Dir),
                (b"a/empty", &EntryKind::Dir),
                (b"a/f", &EntryKind::File { size: 5 }),
                (b"a/l", &EntryKind::Symlink { target: b"f".to_vec() }),
            ]
        );
        std::os::unix::fs::symlink("/etc/passwd", r.join("out")).unwrap();
        assert!(matches!(walk(r, WalkOptions::default(), |_| {}), Err(WalkError::SymlinkOutside { .. })));
        std::fs::remove_file(r.join("out")).unwrap();
        let fifo = sys::c_string(r.join("a/fifo").as_os_str().as_bytes()).unwrap();
        // SAFETY: `fifo` is a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
        let e = walk(r, WalkOptions::default(), |_| {}).err().unwrap().to_string();
        assert!(e.contains("a/fifo") && e.contains("fifo"), "{e}");
        let t = walk(r, WalkOptions { skip_special: true, ..Default::default() }, |_| {}).unwrap();
        assert_eq!(t.entries.len(), 5);
        assert_eq!(t.skipped.len(), 1);
    }
}
