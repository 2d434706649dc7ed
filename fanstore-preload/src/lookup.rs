//! Looking a path up, for every layer: an input in the index
//! ([`resolve`], symlinks inside the tree followed), a name that is not an
//! input by asking the local daemon ([`lookup`], [`real_dir`]: outputs,
//! and symlinks among them that lead into the dataset or out of the mount).
//! `ops` builds every answer on these; the classification of paths
//! (`paths.rs`) and the virtual cwd (`vcwd.rs`) need them too.

use crate::client;
use crate::state::State;
use fanstore_core::manifest::{NodeKind, NodeRef};
use fanstore_core::path::{normalize_into, under_mount, MAX_PATH};
use fanstore_core::record_table::Found as Table;
use fanstore_core::wire::{self, op, OutRecord};
use libc::c_int;

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
            let Some(n) = st.view.lookup(prefix) else {
                let name = &prefix[prefix.iter().rposition(|&b| b == b'/').map_or(0, |k| k + 1)..];
                return Err(if name.len() > fanstore_core::manifest::NAME_MAX { libc::ENAMETOOLONG } else { libc::ENOENT });
            };
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

/// Where an output path leads, as the daemon resolved it.
#[derive(Debug)]
pub enum Found {
    /// A record: of `rel` itself, or of `real` (relative to the mount) that
    /// symlinks led to; an input there has a record the daemon made up
    /// ([`INPUT_HOLDER`]). `target`: a symlink's, when not followed.
    Here { rec: OutRecord, real: Vec<u8>, target: Vec<u8> },
    /// A symlink led out of the mount, to this absolute path.
    Outside(Vec<u8>),
}

/// The holder of a record the daemon made for an input reached through an
/// output symlink (its `id` is the input's node id).
pub const INPUT_HOLDER: u32 = u32::MAX - 1;

/// Can an output be listed in input directory node `dir`? No while the
/// daemons have not marked it in the tier map
/// ([`fanstore_core::tiers::DIR_HAS_OUTPUTS`], set on every node before the
/// first output name is listed in it): then its listing holds no output.
/// Without a tier map: yes (ask).
pub fn may_list_outputs(st: &State, dir: u32) -> bool {
    st.tiers.map_or(true, |t| t.get(dir) == fanstore_core::tiers::DIR_HAS_OUTPUTS)
}

/// Is `rel` (not an input) surely no output either: its parent is an input
/// directory, reached with no symlink, in which no output was ever listed?
fn surely_absent(st: &State, rel: &[u8]) -> bool {
    match st.view.lookup(parent_of(rel)) {
        Some(d) if d.is_dir() => !may_list_outputs(st, d.id()) && st.view.lookup(rel).is_none(),
        _ => false,
    }
}

/// Whether this process (its effective ids and groups) may `want`
/// (`R_OK`/`W_OK`/`X_OK` bits) output record `r`, as the kernel's
/// `generic_permission` says: root may read and write anything and search
/// a directory or run a file with an x bit; anyone else gets the class
/// bits of the owner, the group or the others. Inputs' records
/// ([`fanstore_core::wire::INPUT_OWNER`]) belong to this process's user.
pub fn may_access(r: &fanstore_core::wire::OutRecord, want: u32) -> bool {
    // SAFETY: geteuid and getegid have no preconditions and cannot fail.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    may_access_as(r, want, uid, gid, |g| {
        let mut groups = [0 as libc::gid_t; 256];
        // SAFETY: groups has room for the 256 entries we say.
        let n = unsafe { libc::getgroups(groups.len() as libc::c_int, groups.as_mut_ptr()) };
        n > 0 && groups[..n as usize].contains(&g)
    })
}

pub(crate) fn may_access_as(r: &fanstore_core::wire::OutRecord, want: u32, uid: u32, gid: u32, in_groups: impl Fn(u32) -> bool) -> bool {
    r.allows(uid, |g| g == gid || in_groups(g), want)
}

/// The record of output `rel` from the node's record table, when the
/// daemon owns it and it is a plain one: not a symlink (resolving it needs
/// the daemon), not a hard-linked name (its record is elsewhere). For a
/// caller that is not root, only if the table also shows that it may
/// search the directory that holds the name (as the daemon checks). None:
/// ask the daemon.
fn table_record(st: &State, rel: &[u8]) -> Option<OutRecord> {
    let Table::Live(rec) = st.records.as_ref()?.get(rel) else { return None };
    if rec.is_link() || rec.is_linked_name() {
        return None;
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        let dir = parent_of(rel);
        if !dir.is_empty() && st.view.lookup(dir).is_none() {
            match st.records.as_ref()?.get(dir) {
                Table::Live(d) if d.is_dir() && may_access(&d, libc::X_OK as u32) => {}
                _ => return None,
            }
        }
    }
    Some(rec)
}

/// A record from the table as the daemon's answer gives it: the path's own.
fn here(rec: OutRecord) -> crate::lookup::Found {
    crate::lookup::Found::Here { rec, real: Vec::new(), target: Vec::new() }
}

/// The bytes of output `rec` when this node holds them as a plain file
/// (`<local dir>/out/<id>`), opened read-only with no message; None when
/// they are elsewhere, in the checkpoint store, or the file does not
/// match the record (the daemon then stamps it or serves it).
fn open_held_here(st: &State, rec: &OutRecord) -> Option<c_int> {
    if rec.mode & libc::S_IFMT != libc::S_IFREG || rec.holder != st.rank {
        return None;
    }
    let mut path = [0u8; fanstore_core::path::MAX_PATH];
    let mut digits = [0u8; 20];
    let num = fanstore_core::runtime::decimal_u64(rec.id, &mut digits);
    let len = st.out_dir.len() + num.len();
    if len + 1 > path.len() {
        return None;
    }
    path[..st.out_dir.len()].copy_from_slice(&st.out_dir);
    path[st.out_dir.len()..len].copy_from_slice(num);
    // SAFETY: path is NUL-terminated (zeroed past `len`).
    let fd = unsafe { crate::real::open(path.as_ptr().cast(), libc::O_RDONLY | libc::O_CLOEXEC, 0) };
    if fd < 0 {
        return None;
    }
    // SAFETY: plain data, zero is valid.
    let mut s: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: s is a valid out-pointer; fd is the file we just opened.
    let ok = unsafe { crate::real::fstat(fd, &mut s) } == 0
        && s.st_size as u64 == rec.size
        && s.st_mtime * 1_000_000_000 + s.st_mtime_nsec == rec.mtime_ns;
    if !ok {
        // SAFETY: closing the fd we just opened.
        unsafe { crate::real::close(fd) };
        return None;
    }
    Some(fd)
}

/// OUT_STAT: `rel` through symlinks (the last one too when `follow`).
/// A name in an input directory that holds no output is ENOENT at once.
pub fn lookup(st: &State, rel: &[u8], follow: bool) -> Result<Found, c_int> {
    if surely_absent(st, rel) {
        return Err(libc::ENOENT);
    }
    if let Some(rec) = table_record(st, rel) {
        return Ok(here(rec));
    }
    call_out_stat(st, rel, if follow { 0 } else { wire::STAT_NOFOLLOW }).map_err(|(e, _)| e)
}

/// A name [`lookup_creatable`] did not find: the errno; for ENOENT,
/// whether its directory can hold it (`Some(0)` yes, `Some(errno)` why
/// not, `None` not known: ask [`dir_exists`]); and a file the daemon made
/// ahead for the new output's bytes, if it sent one (the caller's to close).
pub struct Missing {
    pub errno: c_int,
    pub dir: Option<c_int>,
    pub new_file: Option<c_int>,
}

/// [`lookup`] (the last symlink followed when `follow`: not for
/// O_NOFOLLOW) for an open that may create `rel`: when `rel` has no
/// record, the answer also says whether its directory can hold it, and
/// may bring a file made ahead for it (`wire::STAT_NEW_FILE`), from the
/// same answer of the daemon. One round trip where lookup + dir_exists
/// took two, and no inode made on the program's path.
pub fn lookup_creatable(st: &State, rel: &[u8], follow: bool) -> Result<Found, Missing> {
    if surely_absent(st, rel) {
        // its directory is an input one: dir_exists asks no one
        return Err(Missing { errno: libc::ENOENT, dir: None, new_file: None });
    }
    if let Some(rec) = table_record(st, rel) {
        return Ok(here(rec));
    }
    let flags = wire::STAT_PARENT | wire::STAT_NEW_FILE | if follow { 0 } else { wire::STAT_NOFOLLOW };
    match client::call_answer_fd(st, &client::request(op::OUT_STAT, flags, 0, rel)) {
        Ok(a) => {
            if let Some(fd) = a.fd {
                // SAFETY: closing an fd the daemon sent us that nothing else holds.
                unsafe { crate::real::close(fd) };
            }
            let s = wire::StatAnswer::decode(&a.reply.payload).ok_or(Missing { errno: libc::EIO, dir: None, new_file: None })?;
            Ok(Found::Here { rec: s.rec, real: s.resolved.to_vec(), target: s.target.to_vec() })
        }
        Err((libc::EXDEV, payload, fd)) if !payload.is_empty() => {
            if let Some(fd) = fd {
                // SAFETY: as above.
                unsafe { crate::real::close(fd) };
            }
            Ok(Found::Outside(payload))
        }
        Err((errno, payload, new_file)) => {
            let dir = (errno == libc::ENOENT).then(|| <[u8; 4]>::try_from(payload.as_slice()).ok()).flatten();
            Err(Missing { errno, dir: dir.map(|b| u32::from_le_bytes(b) as c_int), new_file })
        }
    }
}

/// [`lookup`] for an open for reading: also, when the name is a committed
/// regular output this process may read, an fd with its bytes, from the
/// same round trip (`wire::STAT_OPEN`). The fd is the caller's to close.
pub fn lookup_open(st: &State, rel: &[u8], follow: bool) -> Result<(Found, Option<c_int>), c_int> {
    if surely_absent(st, rel) {
        return Err(libc::ENOENT);
    }
    if let Some(rec) = table_record(st, rel) {
        if rec.mode & libc::S_IFMT != libc::S_IFREG {
            return Ok((here(rec), None));
        }
        if let Some(fd) = open_held_here(st, &rec) {
            return Ok((here(rec), Some(fd)));
        }
    }
    let flags = wire::STAT_OPEN | if follow { 0 } else { wire::STAT_NOFOLLOW };
    match client::call_answer(st, &client::request(op::OUT_STAT, flags, 0, rel)) {
        Ok(a) => match wire::StatAnswer::decode(&a.reply.payload) {
            Some(s) => Ok((Found::Here { rec: s.rec, real: s.resolved.to_vec(), target: s.target.to_vec() }, a.fd)),
            None => {
                if let Some(fd) = a.fd {
                    // SAFETY: closing the fd the daemon just sent us.
                    unsafe { crate::real::close(fd) };
                }
                Err(libc::EIO)
            }
        },
        Err((libc::EXDEV, payload)) if !payload.is_empty() => Ok((Found::Outside(payload), None)),
        Err((e, _)) => Err(e),
    }
}

/// One OUT_STAT call with `flags`: the record found, or (errno, the error
/// reply's payload).
fn call_out_stat(st: &State, rel: &[u8], flags: u64) -> Result<Found, (c_int, Vec<u8>)> {
    match client::call_reply(st, &client::request(op::OUT_STAT, flags, 0, rel)) {
        Ok(a) => {
            let s = wire::StatAnswer::decode(&a.payload).ok_or((libc::EIO, Vec::new()))?;
            Ok(Found::Here { rec: s.rec, real: s.resolved.to_vec(), target: s.target.to_vec() })
        }
        Err((libc::EXDEV, payload)) if !payload.is_empty() => Ok(Found::Outside(payload)),
        Err(e) => Err(e),
    }
}

/// A directory reached by an output path.
pub enum RealDir {
    /// An output directory at this path (relative to the mount).
    Output(Vec<u8>),
    /// An input directory (a symlink among outputs led into the dataset).
    Input(Node),
}

/// The directory `rel` names, through symlinks: ENOTDIR for anything
/// else; a directory outside the mount is EXDEV (not followed).
pub fn real_dir(st: &State, rel: &[u8]) -> Result<RealDir, c_int> {
    match lookup(st, rel, true)? {
        Found::Here { rec, .. } if !rec.is_dir() => Err(libc::ENOTDIR),
        Found::Here { rec, real, .. } if rec.holder == INPUT_HOLDER => {
            resolve(st, &real, true, true).map(RealDir::Input)
        }
        Found::Here { real, .. } if real.is_empty() => Ok(RealDir::Output(rel.to_vec())),
        Found::Here { real, .. } => Ok(RealDir::Output(real)),
        Found::Outside(_) => Err(libc::EXDEV),
    }
}
