//! Namespace calls that change or list the tree: OUT_LIST, MKDIR, RMDIR,
//! UNLINK, SETATTR and RENAME (of a file: put at the new name's owner, then
//! removed at the old one's, so a reader never sees a missing or partial
//! destination; of a directory: the two-phase fenced move of [`super::owner`]).

use super::owner::mop;
use fanstore_core::watchev::Kind;
use super::META_IDS;
use crate::caller::Caller;
use crate::outputs::names::{now_ns, Looked};
use crate::outputs::Outputs;
use fanstore_core::wire::{self, OutRecord, Reply};
use std::sync::atomic::Ordering::Relaxed;

impl Outputs {
    /// OUT_LIST: entries of output listing `dir` after `skip`.
    /// A directory reached through a symlink is listed under its real
    /// path (clients list the path they resolved at opendir; this is for
    /// one that lists the link's path).
    pub fn out_list(&self, dir: &[u8], skip: u64) -> Result<Reply, i32> {
        if !self.may_list_outputs(dir) {
            return Ok(Reply { op: mop::LIST, id: 0, errno: 0, flags: 0, value: 0, payload: Vec::new() });
        }
        let r = self.meta_at(dir, mop::LIST, skip, dir.to_vec())?;
        if r.value > 0 || skip > 0 {
            return Ok(r);
        }
        match self.real_dir(dir) {
            Ok(real) if real != dir => self.meta_at(&real, mop::LIST, skip, real.clone()),
            _ => Ok(r),
        }
    }

    pub fn out_mkdir(&self, path: &[u8], mode: u32, caller: &Caller) -> Result<(), i32> {
        let (path, dir) = self.new_name(path)?;
        let path = &path;
        super::access::may_add_in(caller, dir.as_ref())?;
        let now = now_ns();
        let (gid, mode) = super::access::inherited(caller, dir.as_ref(), libc::S_IFDIR | (mode & 0o7777));
        let uid = caller.uid;
        let rec = OutRecord { mode, holder: self.rank.id.rank, uid, gid, ino: wire::ino_of_path(path), ..Default::default() }.with_times(now, now);
        let mut p = Vec::new();
        rec.encode_into(&mut p);
        p.extend_from_slice(path);
        // Every rank marks an input parent before the record exists: a
        // racing mkdir on another node that gets EEXIST from the owner must
        // then find the directory by stat (Python's makedirs(exist_ok=True)
        // does exactly that; its stat was answered ENOENT from an unmarked
        // tier map in CI: test_an_exported_dcp_checkpoint_loads_with_filesystemreader).
        self.mark_input_dir(crate::outputs::names::parent(path).0)?;
        self.meta_at(path, mop::MKDIR, 0, p)?;
        self.link(path, wire::KIND_DIR, true)?;
        self.publish(Kind::Mkdir, path, b"", true, false, None);
        Ok(())
    }

    /// The entry `path` names, its parents' symlinks resolved
    /// ([`Outputs::real_entry`]); refused with `on_input(is_dir)` when the
    /// path or the entry is an input of the dataset.
    fn output_entry(&self, path: &[u8], on_input: fn(bool) -> i32) -> Result<Vec<u8>, i32> {
        let refuse = |p: &[u8]| self.rank.view.lookup(p).map_or(Ok(()), |n| Err(on_input(n.is_dir())));
        refuse(path)?;
        let real = self.real_entry(path)?;
        refuse(&real)?;
        Ok(real)
    }

    pub fn out_rmdir(&self, path: &[u8], caller: &Caller) -> Result<(), i32> {
        let path = &self.output_entry(path, |dir| if dir { libc::EROFS } else { libc::ENOTDIR })?;
        self.check_removal(caller, path)?;
        self.on_record(path, mop::RMDIR, 0, path.to_vec())?;
        self.link(path, wire::KIND_DIR, false)?;
        self.publish(Kind::Rmdir, path, b"", true, false, None);
        Ok(())
    }


    pub fn out_unlink(&self, path: &[u8], caller: &Caller) -> Result<(), i32> {
        // A record at the very path names a real entry (records are kept
        // only under real directories, never under a symlink): for root
        // (no permission to check first) the DEL goes there at once, and
        // the parent is resolved only when it misses. One lookup less per
        // unlink of a name whose directory another rank owns.
        let on_input = |dir: bool| if dir { libc::EISDIR } else { libc::EROFS };
        let direct = match self.rank.view.lookup(path) {
            Some(n) => return Err(on_input(n.is_dir())),
            None if caller.is_root() => match self.meta_at(path, mop::DEL, 0, path.to_vec()) {
                Err(libc::ENOENT) => None,
                other => Some(other?),
            },
            None => None,
        };
        let (path, r) = match direct {
            Some(r) => (path.to_vec(), r),
            None => {
                let path = self.output_entry(path, on_input)?;
                self.check_removal(caller, &path)?;
                let r = self.on_record(&path, mop::DEL, 0, path.clone())?;
                (path, r)
            }
        };
        let path = &path;
        let old = OutRecord::decode(&r.payload);
        if let Some(old) = &old {
            self.drop_data(old);
        }
        self.link(path, wire::KIND_FILE, false)?;
        // (A symlink's removal is announced as a file's; its creation is not announced.)
        self.publish(Kind::Delete, path, b"", false, false, old.as_ref());
        Ok(())
    }

    /// For a caller that is not root, whether it may remove the name
    /// `path` ([`Outputs::check_remove`]; its record is looked up for the
    /// sticky rule). A missing name passes: the removal reports it.
    fn check_removal(&self, caller: &Caller, path: &[u8]) -> Result<(), i32> {
        if caller.is_root() {
            return Ok(());
        }
        match self.lookup(path, false) {
            Ok(Looked::Output { rec, .. }) => self.check_remove(caller, path, &rec),
            _ => Ok(()),
        }
    }

    /// For a caller that is not root, whether it may rename `from` (record
    /// `rec`) to `to`: remove the old name, add the new one (and remove the
    /// name it replaces), and, for a directory that changes parent, write
    /// its `..` (write permission on it), as the kernel asks.
    fn check_rename(&self, caller: &Caller, from: &[u8], to: &[u8], rec: &OutRecord) -> Result<(), i32> {
        if caller.is_root() {
            return Ok(());
        }
        self.check_remove(caller, from, rec)?;
        match self.lookup(to, false) {
            Ok(Looked::Output { rec: old, .. }) => self.check_remove(caller, to, &old)?,
            _ => self.check_add(caller, to)?,
        }
        let moves = crate::outputs::names::parent(from).0 != crate::outputs::names::parent(to).0;
        if rec.is_dir() && moves && !caller.may(rec, crate::caller::Access::WRITE) {
            return Err(libc::EACCES);
        }
        Ok(())
    }

    /// Renames output directory `from` (and everything below it) to `to`:
    /// the two-phase move of [`crate::outputs::namespace::owner`] (module doc). `to` may be an
    /// empty directory (replaced); a non-empty one is ENOTEMPTY, a file
    /// ENOTDIR. Called by [`Self::out_rename`] after the parent and ancestor checks.
    fn rename_dir(&self, from: &[u8], to: &[u8], noreplace: bool) -> Result<(), i32> {
        use crate::outputs::namespace::owner::Moved;
        // (Both parents and the ancestor relation were checked by out_rename.)
        match self.out_stat(to) {
            Ok(_) if noreplace => return Err(libc::EEXIST),
            Ok(r) if !r.is_dir() => return Err(libc::ENOTDIR),
            Ok(_) => {
                self.meta_at(to, mop::RMDIR, 0, to.to_vec())?; // ENOTEMPTY unless empty
                self.link(to, wire::KIND_DIR, false)?;
            }
            Err(libc::ENOENT) => {}
            Err(e) => return Err(e),
        }
        let tx = META_IDS.fetch_add(1, Relaxed) | (u64::from(self.rank.id.rank) << 48);
        let mut names = from.to_vec();
        names.push(0);
        names.extend_from_slice(to);
        let mut moved = Vec::new();
        let mut prepared = Vec::new();
        let mut failed = None;
        for r in 0..self.rank.id.nranks {
            match self.meta_once(r, mop::MOVE_PREP, tx, names.clone()) {
                Ok(rep) => {
                    prepared.push(r);
                    match Moved::decode_all(&rep.payload) {
                        Some(m) => moved.extend(m),
                        None => failed = Some(libc::EIO),
                    }
                }
                Err(e) => failed = Some(e),
            }
            if failed.is_some() {
                break;
            }
        }
        let (entries, result) = match failed {
            // Abort: everything goes back under its old name.
            Some(e) => (moved, Err(e)),
            None => {
                // Never return before the commit: the fences must be lifted.
                for (path, add) in [(from, false), (to, true)] {
                    if let Err(e) = self.link(path, wire::KIND_DIR, add) {
                        log::error!("rank {}: listing of the parent of '{}': errno {e}", self.rank.id.rank, String::from_utf8_lossy(path));
                    }
                }
                (moved.into_iter().map(|m| m.renamed(from, to)).collect::<Vec<_>>(), Ok(()))
            }
        };
        let mut per_rank = vec![Vec::new(); self.rank.id.nranks as usize];
        let mut files = Vec::new();
        for e in &entries {
            match e {
                Moved::Record(p, r) | Moved::Link(p, r, _) if !r.is_dir() => files.push((p.clone(), *r)),
                _ => {}
            }
            e.encode_into(&mut per_rank[self.owner(e.path()) as usize]);
        }
        for (r, payload) in per_rank.into_iter().enumerate() {
            let r = r as u32;
            if !prepared.contains(&r) && payload.is_empty() {
                continue;
            }
            let arg0 = if result.is_ok() { tx | crate::outputs::namespace::owner::MOVE_DONE } else { tx };
            if let Err(e) = self.meta_once(r, mop::MOVE_COMMIT, arg0, payload) {
                log::error!("rank {}: moving '{}': rank {r} did not commit: errno {e}", self.rank.id.rank, String::from_utf8_lossy(from));
            }
        }
        if result.is_ok() {
            for (path, rec) in files {
                self.renamed_at_holder(&path, &rec);
            }
        }
        result
    }

    /// Tells the holder of output `rec` that it is now named `path` (its
    /// sidecar here, or its checkpoint store's name there).
    fn renamed_at_holder(&self, path: &[u8], rec: &OutRecord) {
        if rec.holder == self.rank.id.rank {
            let _ = self.write_sidecar(path, rec);
            if let Some(d) = self.dedup.get() {
                d.rename_output(rec.id, path);
            }
        } else if rec.holder < self.rank.id.nranks {
            if let Err(e) = self.meta_to(rec.holder, mop::HOLDER_RENAME, rec.id, path.to_vec()) {
                log::warn!("rank {}: rank {} did not rename output {}: errno {e}", self.rank.id.rank, rec.holder, rec.id);
            }
        }
    }

    /// chmod / utime / chown of an output: the record at its owner changes
    /// (EROFS on an input), if `caller` may: chmod and explicit times only
    /// by the owner or root (EPERM), times set to now also by a caller with
    /// write permission (EACCES), chown as [`Caller::may_chown`] says.
    /// chmod by a caller outside the file's group drops S_ISGID; chown
    /// of a non-directory drops S_ISUID, and S_ISGID with a group x bit.
    pub fn out_setattr(&self, path: &[u8], what: u64, value: u64, caller: &Caller) -> Result<(), i32> {
        if self.rank.view.lookup(path).is_some() {
            return Err(libc::EROFS);
        }
        // chmod and utime follow a symlink unless told not to; a symlink's
        // own mode cannot change (Linux: EOPNOTSUPP), its time can.
        let follow = what & wire::SETATTR_NOFOLLOW == 0;
        let now = what & wire::SETATTR_NOW != 0;
        let keep_mode = what & wire::SETATTR_KEEP_MODE;
        let what = what & !(wire::SETATTR_NOFOLLOW | wire::SETATTR_NOW | wire::SETATTR_KEEP_MODE);
        self.check_search(caller, path)?;
        let (path, rec) = match self.lookup(path, follow)? {
            Looked::Output { rec, .. } if rec.is_link() && what == wire::SETATTR_MODE => return Err(libc::EOPNOTSUPP),
            Looked::Output { path, rec, .. } => (path, rec),
            Looked::Input { .. } => return Err(libc::EROFS),
            Looked::Outside(_) => return Err(libc::EXDEV),
        };
        let path = &path;
        let value = match what {
            wire::SETATTR_MODE if !caller.owns(&rec) => return Err(libc::EPERM),
            // Not in the file's group: the set-group-ID bit is dropped, as the kernel drops it.
            wire::SETATTR_MODE if !caller.is_root() && !rec.is_dir() && !caller.in_group(rec.gid) => value & !u64::from(libc::S_ISGID),
            wire::SETATTR_ATIME | wire::SETATTR_MTIME if !caller.owns(&rec) => {
                if !now {
                    return Err(libc::EPERM);
                }
                if !caller.may(&rec, crate::caller::Access::WRITE) {
                    return Err(libc::EACCES);
                }
                value
            }
            wire::SETATTR_OWNER if !caller.may_chown(&rec, value as u32, (value >> 32) as u32) => return Err(libc::EPERM),
            _ => value,
        };
        let set = |key: &[u8]| {
            let mut payload = value.to_le_bytes().to_vec();
            payload.extend_from_slice(key);
            self.on_record(key, mop::SETATTR, what | keep_mode, payload).map(|_| ())
        };
        match set(path) {
            // A hard-linked file: its attributes are in its shared record.
            Err(libc::EMLINK) => set(&self.linked_key_of(path)?),
            other => other,
        }
    }

    /// RENAME (`noreplace`: RENAME_NOREPLACE, EEXIST if `to` exists).
    pub fn out_rename(&self, from: &[u8], to: &[u8], noreplace: bool, caller: &Caller) -> Result<(), i32> {
        if self.rank.view.lookup(from).is_some() || self.rank.view.lookup(to).is_some() {
            return Err(libc::EROFS);
        }
        // As the kernel: both parents are resolved (old, then new) before
        // the entry; one directory (a temporary name renamed to its final
        // one) is resolved once.
        let same_dir = crate::outputs::names::parent(from).0 == crate::outputs::names::parent(to).0;
        let from = &self.real_entry(from)?;
        let to = &if same_dir {
            super::links::join(crate::outputs::names::parent(from).0, crate::outputs::names::parent(to).1)
        } else {
            self.real_entry(to)?
        };
        if self.rank.view.lookup(from).is_some() || self.rank.view.lookup(to).is_some() {
            return Err(libc::EROFS);
        }
        if super::links::name_too_long(to) {
            return Err(libc::ENAMETOOLONG);
        }
        let (rec, target) = match self.meta_at(from, mop::GET, 0, from.to_vec()) {
            Ok(r) => (OutRecord::decode(&r.payload).ok_or(libc::EIO)?, r.payload[OutRecord::LEN..].to_vec()),
            Err(libc::ENOENT) => return Err(self.missing_errno(from)),
            Err(e) => return Err(e),
        };
        if from == to {
            return Ok(());
        }
        // Two names of one hard-linked file: nothing to do, as rename(2) says.
        if rec.is_linked_name() {
            if let Ok(r) = self.meta_at(to, mop::GET, 0, to.to_vec()) {
                if OutRecord::decode(&r.payload).is_some_and(|t| t.is_linked_name() && t.linked_key() == rec.linked_key()) {
                    return Ok(());
                }
            }
        }
        // Then the ancestor checks, before any type check (as lock_rename's trap).
        if crate::outputs::namespace::owner::at_or_below(to, from) {
            return Err(libc::EINVAL);
        }
        if crate::outputs::namespace::owner::at_or_below(from, to) {
            return Err(libc::ENOTEMPTY);
        }
        self.check_rename(caller, from, to, &rec)?;
        if rec.is_dir() {
            self.rename_dir(from, to, noreplace)?;
            self.publish(Kind::Rename, from, to, true, false, None);
            return Ok(());
        }
        // A rename changes the moved file's status time, as natively.
        let rec = OutRecord { ctime_ns: now_ns(), ..rec };
        if rec.holder == self.rank.id.rank {
            // A restart with the same --local recovers it under the new name.
            self.write_sidecar(to, &rec)?;
        }
        let put = if rec.is_link() {
            let over = if noreplace { wire::COMMIT_EXCL } else { crate::outputs::namespace::owner::PUT_OVER_LINK };
            self.put_link(to, rec, &target, over)
        } else if noreplace {
            self.put(to, rec, true) // EEXIST at the owner, atomically
        } else {
            self.put_over_link(to, rec)
        };
        let replaced = match put {
            Ok(r) => r,
            Err(e) => {
                if rec.holder == self.rank.id.rank {
                    let _ = self.write_sidecar(from, &rec); // still named `from`
                }
                return Err(e);
            }
        };
        if same_dir {
            self.relink(from, to, rec.kind())?;
        } else {
            self.link(to, rec.kind(), true)?;
        }
        match self.meta_at(from, mop::DEL, rec.id, from.to_vec()) {
            Ok(_) | Err(libc::ENOENT) => {}
            Err(e) => return Err(e),
        }
        // The holder's checkpoint store shows the new name (reads go by id).
        if rec.holder == self.rank.id.rank {
            if let Some(d) = self.dedup.get() {
                d.rename_output(rec.id, to);
            }
        } else if rec.holder < self.rank.id.nranks {
            if let Err(e) = self.meta_to(rec.holder, mop::HOLDER_RENAME, rec.id, to.to_vec()) {
                log::warn!("rank {}: rank {} did not rename output {}: errno {e}", self.rank.id.rank, rec.holder, rec.id);
            }
        }
        if !same_dir {
            self.link(from, wire::KIND_FILE, false)?;
        }
        self.publish(Kind::Rename, from, to, false, replaced, Some(&rec));
        Ok(())
    }
}
