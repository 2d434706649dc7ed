//! Path resolution through output symlinks, on the daemon a client asked.
//!
//! Records are keyed by their path, so a record found under the path a
//! client asked needs no resolution: every directory above it was a real
//! directory when it was created, and stays one (a non-empty directory can
//! only be renamed, which moves its records). A symlink can therefore only
//! matter when a lookup misses, or when it finds a symlink in the last
//! component. [`crate::outputs::Outputs::lookup`] costs exactly what it cost before symlinks
//! existed on the hit path (one GET at the owner); on a miss it walks the
//! ancestors (as the errno of a miss always needed), and an ancestor that
//! is a symlink is spliced in and the walk restarts, at most
//! [`MAX_SYMLINKS`] times (then ELOOP).
//!
//! Targets are resolved as the kernel does: relative to the link's
//! directory, `..` lexically on the already-resolved directory. An absolute
//! target under the mount is a path of this tree; one elsewhere leaves the
//! tree ([`Looked::Outside`]: the client re-runs the call on the kernel).

use super::owner::mop;
use crate::outputs::Outputs;
use crate::outputs::names::{now_ns, parent, Looked};
use fanstore_core::checksum::xxh3;
use fanstore_core::manifest::{NodeKind, NAME_MAX};
use fanstore_core::wire::{self, OutRecord};
use std::sync::atomic::Ordering::Relaxed;

/// Linux's limit on symlinks followed in one lookup.
pub const MAX_SYMLINKS: u32 = 40;

/// Why `path` is missing when its first `dir_len` bytes name an existing
/// directory: the next component is not in it (ENOENT), or is a name
/// longer than NAME_MAX, which the kernel's lookup refuses (ENAMETOOLONG).
fn missing_in(path: &[u8], dir_len: usize) -> i32 {
    let rest = path.get(dir_len..).unwrap_or_default();
    let rest = rest.strip_prefix(b"/").unwrap_or(rest);
    let name = rest.split(|&b| b == b'/').next().unwrap_or_default();
    if name.len() > NAME_MAX {
        libc::ENAMETOOLONG
    } else {
        libc::ENOENT
    }
}

/// Does `path` have a component longer than NAME_MAX? No name can be
/// made so (mkdir, symlink, rename: ENAMETOOLONG, as natively; clients
/// refuse such paths before asking, commits included). Outputs recovered
/// or loaded under such a name by an earlier build keep it.
pub(crate) fn name_too_long(path: &[u8]) -> bool {
    path.len() > NAME_MAX && path.split(|&b| b == b'/').any(|c| c.len() > NAME_MAX)
}

enum Spliced {
    Inside(Vec<u8>),
    Outside(Vec<u8>),
}

impl Outputs {
    /// GET at the owner: the record of `path` and a symlink's target.
    ///
    /// A name of a hard-linked file answers with the file's shared record
    /// (one more lookup, for linked files only).
    pub(crate) fn get_record(&self, path: &[u8]) -> Result<(OutRecord, Vec<u8>), i32> {
        let r = self.meta_at(path, mop::GET, 0, path.to_vec())?;
        let rec = OutRecord::decode(&r.payload).ok_or(libc::EIO)?;
        if rec.is_linked_name() {
            let key = rec.linked_key();
            let shared = self.meta_at(&key, mop::GET, 0, key.clone()).map_err(|e| if e == libc::ENOENT { libc::EIO } else { e })?;
            return Ok((OutRecord::decode(&shared.payload).ok_or(libc::EIO)?, Vec::new()));
        }
        Ok((rec, r.payload[OutRecord::LEN..].to_vec()))
    }

    /// Resolves `path` (relative to the mount) through output symlinks; the
    /// last component is followed when `follow`. Errors: ENOENT, ENOTDIR,
    /// ELOOP, or the owner's errno.
    pub fn lookup(&self, path: &[u8], follow: bool) -> Result<Looked, i32> {
        let mut cur = path.to_vec();
        let mut hops = 0;
        let hop = |hops: &mut u32| {
            *hops += 1;
            if *hops > MAX_SYMLINKS {
                Err(libc::ELOOP)
            } else {
                Ok(())
            }
        };
        'walk: loop {
            if let Some(n) = self.rank.view.lookup(&cur) {
                return Ok(Looked::Input { path: cur, node: n.id() });
            }
            match self.get_record(&cur) {
                Ok((rec, target)) if rec.is_link() && follow => {
                    hop(&mut hops)?;
                    match self.splice(parent(&cur).0, &target, b"") {
                        Spliced::Inside(p) => cur = p,
                        Spliced::Outside(p) => return Ok(Looked::Outside(p)),
                    }
                }
                Ok((rec, target)) => return Ok(Looked::Output { path: cur, rec, target }),
                Err(libc::ENOENT) => {
                    // Why is it missing? The deepest existing ancestor says:
                    // a directory (ENOENT, or ENAMETOOLONG for a name no
                    // directory can hold), a file (ENOTDIR), or a symlink
                    // (follow it and look again).
                    let mut p = parent(&cur).0;
                    while !p.is_empty() {
                        if let Some(n) = self.rank.view.lookup(p) {
                            return Err(if n.is_dir() { missing_in(&cur, p.len()) } else { libc::ENOTDIR });
                        }
                        match self.get_record(p) {
                            Ok((rec, target)) if rec.is_link() => {
                                hop(&mut hops)?;
                                let rest = cur[p.len()..].to_vec();
                                match self.splice(parent(p).0, &target, &rest) {
                                    Spliced::Inside(next) => cur = next,
                                    Spliced::Outside(next) => return Ok(Looked::Outside(next)),
                                }
                                continue 'walk;
                            }
                            Ok((rec, _)) => return Err(if rec.is_dir() { missing_in(&cur, p.len()) } else { libc::ENOTDIR }),
                            Err(libc::ENOENT) => p = parent(p).0,
                            Err(e) => return Err(e),
                        }
                    }
                    return Err(missing_in(&cur, 0));
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// The real path of directory `dir` (an input or output directory,
    /// through symlinks). A directory outside the mount is EXDEV.
    pub fn real_dir(&self, dir: &[u8]) -> Result<Vec<u8>, i32> {
        self.real_dir_rec(dir).map(|(p, _)| p)
    }

    /// [`Self::real_dir`] with the directory's record (None for the
    /// mount's root and the dataset's directories).
    fn real_dir_rec(&self, dir: &[u8]) -> Result<(Vec<u8>, Option<OutRecord>), i32> {
        if dir.is_empty() {
            return Ok((Vec::new(), None));
        }
        match self.lookup(dir, true)? {
            Looked::Input { path, node } => match self.rank.view.node(node) {
                Some(n) if n.is_dir() => Ok((path, None)),
                _ => Err(libc::ENOTDIR),
            },
            Looked::Output { path, rec, .. } if rec.is_dir() => Ok((path, Some(rec))),
            Looked::Output { .. } => Err(libc::ENOTDIR),
            Looked::Outside(_) => Err(libc::EXDEV),
        }
    }

    /// `path` with its directory resolved through symlinks (the entry
    /// itself is not followed: what unlink, rename, mkdir act on).
    pub fn real_entry(&self, path: &[u8]) -> Result<Vec<u8>, i32> {
        self.real_entry_in(path).map(|(p, _)| p)
    }

    /// [`Self::real_entry`] with the record of the directory it is in
    /// (None for the mount's root and the dataset's directories): what a
    /// creation's permission check and set-group-ID inheritance read, at
    /// no extra lookup.
    pub fn real_entry_in(&self, path: &[u8]) -> Result<(Vec<u8>, Option<OutRecord>), i32> {
        let (dir, name) = parent(path);
        if dir.is_empty() {
            return Ok((path.to_vec(), None));
        }
        let (p, rec) = self.real_dir_rec(dir)?;
        Ok((join(&p, name), rec))
    }

    /// A name to be made at `path` (mkdir, symlink, mknod, link): its real
    /// path ([`Self::real_entry_in`]) and its directory's record. EEXIST for
    /// the mount's root or a name of the dataset, ENAMETOOLONG for a name
    /// of more than NAME_MAX bytes.
    pub(crate) fn new_name(&self, path: &[u8]) -> Result<(Vec<u8>, Option<OutRecord>), i32> {
        if path.is_empty() || self.rank.view.lookup(path).is_some() {
            return Err(libc::EEXIST);
        }
        let (path, dir) = self.real_entry_in(path)?;
        if self.rank.view.lookup(&path).is_some() {
            return Err(libc::EEXIST);
        }
        if name_too_long(&path) {
            return Err(libc::ENAMETOOLONG);
        }
        Ok((path, dir))
    }

    /// The path a create through dangling symlink `path` makes (open(2)
    /// with O_CREAT creates the last link's missing target).
    pub fn real_dangling(&self, path: &[u8]) -> Result<Vec<u8>, i32> {
        let mut cur = path.to_vec();
        for _ in 0..MAX_SYMLINKS {
            match self.get_record(&cur) {
                Ok((rec, target)) if rec.is_link() => match self.splice(parent(&cur).0, &target, b"") {
                    Spliced::Inside(p) => cur = self.real_entry(&p)?,
                    Spliced::Outside(_) => return Err(libc::EXDEV),
                },
                Ok(_) => return Ok(cur),
                Err(libc::ENOENT) => return if self.rank.view.lookup(&cur).is_some() { Err(libc::EROFS) } else { Ok(cur) },
                Err(e) => return Err(e),
            }
        }
        Err(libc::ELOOP)
    }

    /// Symlink `target` placed in directory `dir`, followed by `rest`
    /// (empty or starting with '/'), relative to the mount.
    fn splice(&self, dir: &[u8], target: &[u8], rest: &[u8]) -> Spliced {
        let mount = self.rank.id.mount.as_bytes();
        let mut buf = vec![0u8; fanstore_core::path::MAX_PATH];
        let mut cwd = mount.to_vec();
        if !dir.is_empty() {
            cwd.push(b'/');
            cwd.extend_from_slice(dir);
        }
        let joined = [target, rest].concat();
        let Some(n) = fanstore_core::path::normalize_into(&cwd, &joined, &mut buf) else {
            return Spliced::Outside(joined);
        };
        let abs = &buf[..n.len];
        match fanstore_core::path::under_mount(abs, mount) {
            Some(rel) => Spliced::Inside(rel.to_vec()),
            None => Spliced::Outside(abs.to_vec()),
        }
    }

    /// SYMLINK: output `path` becomes a symlink to `target` (stored as
    /// given). Its holder (this rank) keeps the target as the output's
    /// bytes with a sidecar, so drain, export and kill -9 recovery treat it
    /// as any output; its owner keeps the target beside the record.
    pub fn out_symlink(&self, path: &[u8], target: &[u8], caller: &crate::caller::Caller) -> Result<(), i32> {
        if target.is_empty() {
            return Err(libc::ENOENT);
        }
        // As symlink(2): PATH_MAX bytes or more, its NUL included, is too long.
        if target.contains(&0) || target.len() >= libc::PATH_MAX as usize {
            return Err(libc::ENAMETOOLONG);
        }
        let (path, dir) = self.new_name(path)?;
        crate::outputs::namespace::access::may_add_in(caller, dir.as_ref())?;
        let id = self.out_seq.fetch_add(1, Relaxed);
        if id >= crate::ids::OUT_BIT as u64 {
            return Err(libc::ENOSPC);
        }
        let now = now_ns();
        let (gid, _) = crate::outputs::namespace::access::inherited(caller, dir.as_ref(), libc::S_IFLNK | 0o777);
        let uid = caller.uid;
        let rec = OutRecord { size: target.len() as u64, mode: libc::S_IFLNK | 0o777, holder: self.rank.id.rank, id, sum: xxh3(target), uid, gid, ino: wire::ino_of_path(&path), ..Default::default() }
            .with_times(now, now);
        self.hold_link(&path, &rec, target)?;
        if let Err(e) = self.put_link(&path, rec, target, wire::COMMIT_EXCL) {
            self.drop_held_here(id);
            return Err(e);
        }
        self.rank.counters.outputs.fetch_add(1, Relaxed);
        self.link(&path, wire::KIND_LINK, true)
    }

    /// Writes a symlink's target as held output `rec.id`, with its sidecar.
    pub(crate) fn hold_link(&self, path: &[u8], rec: &OutRecord, target: &[u8]) -> Result<(), i32> {
        let dir = self.out_dir();
        std::fs::create_dir_all(&dir).map_err(|_| libc::EIO)?;
        let file = dir.join(rec.id.to_string());
        if let Err(e) = std::fs::write(&file, target) {
            let _ = std::fs::remove_file(&file);
            return Err(if e.raw_os_error() == Some(libc::ENOSPC) { libc::ENOSPC } else { libc::EIO });
        }
        if let Err(e) = self.write_sidecar(path, rec) {
            let _ = std::fs::remove_file(&file);
            return Err(e);
        }
        Ok(())
    }

    /// PUT of a symlink record (payload `record | path NUL target`).
    pub(crate) fn put_link(&self, path: &[u8], rec: OutRecord, target: &[u8], arg0: u64) -> Result<bool, i32> {
        self.put_payload(path, rec, &[b"\0", target], arg0)
    }

    /// A synthetic record for input node `node` (an OUT_STAT through a
    /// symlink that leads into the dataset).
    pub fn input_record(&self, node: u32) -> OutRecord {
        match self.rank.view.node(node) {
            Some(n) => OutRecord {
                size: if n.kind() == Some(NodeKind::File) { n.size() } else { 0 },
                mode: n.mode(),
                holder: u32::MAX - 1,
                mtime_ns: n.mtime_ns(),
                id: u64::from(node),
                sum: 0,
                atime_ns: n.atime_ns(),
                ctime_ns: n.ctime_ns(),
                // The library shows an input's owner as its own user.
                uid: wire::INPUT_OWNER,
                gid: wire::INPUT_OWNER,
                ino: 0,
                nlink: 0,
            },
            None => OutRecord::default(),
        }
    }
}

/// `name` in directory `dir` ("" is the mount's root).
pub(crate) fn join(dir: &[u8], name: &[u8]) -> Vec<u8> {
    let mut p = Vec::with_capacity(dir.len() + 1 + name.len());
    p.extend_from_slice(dir);
    if !dir.is_empty() {
        p.push(b'/');
    }
    p.extend_from_slice(name);
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_longer_than_name_max() {
        let n256 = "n".repeat(256);
        let n255 = "n".repeat(255);
        assert!(name_too_long(format!("a/{n256}").as_bytes()));
        assert!(name_too_long(format!("{n256}/b").as_bytes()));
        assert!(!name_too_long(format!("a/{n255}/{n255}").as_bytes()));
        // The component after the existing directory decides.
        assert_eq!(missing_in(format!("a/{n256}/x").as_bytes(), 1), libc::ENAMETOOLONG);
        assert_eq!(missing_in(format!("a/b/{n256}").as_bytes(), 1), libc::ENOENT);
        assert_eq!(missing_in(format!("{n256}").as_bytes(), 0), libc::ENAMETOOLONG);
        assert_eq!(missing_in(b"x/y", 0), libc::ENOENT);
    }
}

