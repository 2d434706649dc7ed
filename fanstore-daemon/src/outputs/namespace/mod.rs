//! The output namespace: one home for the names of outputs (records,
//! directories, symlinks, listings, renames) and the MPI operations that
//! keep them, on every rank. [`crate::outputs::held`] (the bytes: COMMIT, OUT_OPEN,
//! held files, drain, recovery), [`crate::outputs::dedup`] (checkpoints) and
//! [`crate::outputs::persist`] use it through [`crate::outputs::Outputs::lookup`], `crate::outputs::Outputs::put_record`
//! and the calls below; nothing else talks to an owner rank.
//!
//! ```text
//!  client call ──> daemon it asked (coordinator) ──MPI──> owner rank of the path
//!                  namespace::{tree, links}               namespace::owner::MetaStore
//!                  resolve symlinks on a miss             records + listings + symlink targets
//!                  rename: two-phase fenced move          fences during a directory move
//! ```
//!
//! - Placement: the record of path P lives at rank xxh3(P) mod N
//!   ([`crate::outputs::Outputs::owner`]); the listing of directory D at D's owner, so a
//!   readdir costs one message and O(entries).
//! - Identity is the path: renaming a directory moves its records and
//!   listings to their new owners ([`owner`] module doc: MOVE_PREP /
//!   MOVE_COMMIT), atomically as any node sees it.
//! - Symlinks ([`links`]): a record with S_IFLNK whose target the owner keeps;
//!   resolved by the coordinator only when a lookup misses or finds one.
//! - Holders: the bytes of a file (or a symlink's target) stay on the rank
//!   that committed it (`holder` in the record); the owner asks it to drop
//!   or rename them (HOLDER_DROP, HOLDER_RENAME), served here on the
//!   communication thread's behalf.
//!
//! Submodules: [`owner`] (the owner side), [`links`] (resolution and
//! SYMLINK), `tree` (MKDIR, RMDIR, UNLINK, SETATTR, OUT_LIST, RENAME).

mod access;
mod hardlinks;
pub(crate) use access::{inherited, may_add_in};
pub mod links;
pub mod owner;
mod records;
mod tree;

use crate::comm::{Command, MetaCall, MetaServer};
use crate::outputs::Outputs;
use crate::outputs::held_files::{drop_held, rename_held};
use crate::outputs::names::{parent, Looked};
use fanstore_core::checksum::xxh3;
use fanstore_core::tiers::DIR_HAS_OUTPUTS;
use fanstore_core::wire::{self, OutRecord, Reply, Request};
use owner::mop;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// How long a metadata request to another rank may take.
const META_TIMEOUT: Duration = Duration::from_secs(10);

pub(super) static META_IDS: AtomicU64 = AtomicU64::new(1);


impl MetaServer for Outputs {
    fn handle_meta(&self, src: u32, msg: &[u8]) -> Option<Vec<u8>> {
        match Request::decode(msg) {
            Ok(req) if crate::outputs::watch::is_mop(req.op) => {
                let answer = self.watch_meta(&req);
                if answer.acks.is_empty() {
                    return Some(answer.reply.encode());
                }
                // Answered once the watching nodes have the event, on a
                // thread of its own: their replies come through this one.
                let comm = self.rank.comm.clone();
                let spawned = std::thread::Builder::new().name("fanstore-watch-ack".into()).spawn(move || {
                    let msg = answer.wait().encode();
                    let _ = comm.send(Command::MetaReply { dest: src, msg });
                });
                match spawned {
                    Ok(_) => None,
                    Err(e) => {
                        log::warn!("rank {}: spawning a thread to answer an event's publisher: {e}", self.rank.id.rank);
                        Some(Reply::err(&req, libc::EAGAIN).encode())
                    }
                }
            }
            other => Some(self.answer_meta(other)),
        }
    }
}

impl Outputs {
    /// A metadata request answered at once (see [`MetaServer::handle_meta`]).
    fn answer_meta(&self, req: Result<Request, wire::WireError>) -> Vec<u8> {
        match req {
            Ok(req) if req.op == mop::HOLDER_DROP || req.op == mop::HOLDER_RENAME => {
                // Store work does not belong on the communication thread.
                let (dedup, out, fsync) = (self.dedup.get().cloned(), self.out_dir(), self.fsync_outputs.load(Relaxed));
                let journal = self.held.clone();
                let spawned = std::thread::Builder::new().name("fanstore-held".into()).spawn(move || {
                    if req.op == mop::HOLDER_DROP {
                        drop_held(dedup.as_deref(), &journal, &out, req.arg0);
                    } else {
                        rename_held(dedup.as_deref(), &journal, req.arg0, &req.payload, fsync);
                    }
                });
                let errno = if spawned.is_ok() { 0 } else { libc::EAGAIN };
                Reply { op: req.op, id: req.id, errno, flags: 0, value: 0, payload: Vec::new() }.encode()
            }
            Ok(req) if req.op == mop::MARK_DIR => match u32::try_from(req.arg0).ok().filter(|&id| self.mark_input_dir_here(id)) {
                Some(_) => Reply::ok(&req, 0).encode(),
                None => Reply::err(&req, libc::EINVAL).encode(),
            },
            Ok(req) => self.meta.lock().unwrap_or_else(|p| p.into_inner()).handle(&req).encode(),
            Err(_) => Reply { op: 0, id: 0, errno: libc::EINVAL, flags: 0, value: 0, payload: Vec::new() }.encode(),
        }
    }

    /// The metadata owner of `path`.
    pub fn owner(&self, path: &[u8]) -> u32 {
        (xxh3(path) % self.rank.id.nranks.max(1) as u64) as u32
    }

    /// One metadata request at the owner of `key`: answered here when this
    /// rank owns it, else over MPI (bounded wait).
    pub(crate) fn meta_at(&self, key: &[u8], op: u16, arg0: u64, payload: Vec<u8>) -> Result<Reply, i32> {
        self.meta_to(self.owner(key), op, arg0, payload)
    }

    /// One metadata request at rank `dest`.
    /// EBUSY (a path fenced by a directory move in flight) is retried until
    /// the move ends, at most [`META_TIMEOUT`].
    pub(crate) fn meta_to(&self, dest: u32, op: u16, arg0: u64, payload: Vec<u8>) -> Result<Reply, i32> {
        let deadline = std::time::Instant::now() + META_TIMEOUT;
        let mut pause = Duration::from_millis(1);
        loop {
            match self.meta_once(dest, op, arg0, payload.clone()) {
                Err(libc::EBUSY) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(32));
                }
                other => return other,
            }
        }
    }

    pub(crate) fn meta_once(&self, dest: u32, op: u16, arg0: u64, payload: Vec<u8>) -> Result<Reply, i32> {
        let rep = if dest == self.rank.id.rank {
            self.rank.counters.meta_local.fetch_add(1, Relaxed);
            let req = Request { op, id: META_IDS.fetch_add(1, Relaxed), arg0, arg1: 0, payload };
            if crate::outputs::watch::is_mop(op) {
                self.watch_meta(&req).wait()
            } else {
                Reply::decode(&self.answer_meta(Ok(req))).map_err(|_| libc::EIO)?
            }
        } else {
            let pending = self.meta_post(dest, op, arg0, payload)?;
            self.meta_wait(dest, &pending)?
        };
        if rep.errno != 0 {
            return Err(rep.errno);
        }
        Ok(rep)
    }

    /// Sends one metadata request to another rank `dest` without waiting:
    /// [`Self::meta_wait`] takes its reply (several can be in flight).
    fn meta_post(&self, dest: u32, op: u16, arg0: u64, payload: Vec<u8>) -> Result<crossbeam::channel::Receiver<Vec<u8>>, i32> {
        let id = META_IDS.fetch_add(1, Relaxed);
        self.rank.counters.meta_sent.fetch_add(1, Relaxed);
        let msg = Request { op, id, arg0, arg1: 0, payload }.encode();
        let (tx, rx) = crossbeam::channel::bounded(1);
        self.rank.comm.send(Command::Meta(MetaCall { dest, id, msg, reply: tx, timeout: META_TIMEOUT })).map_err(|_| libc::EIO)?;
        Ok(rx)
    }

    /// The reply of a request [`Self::meta_post`] sent to `dest` (EIO if none
    /// came within the bound); its errno is the caller's to check.
    fn meta_wait(&self, dest: u32, pending: &crossbeam::channel::Receiver<Vec<u8>>) -> Result<Reply, i32> {
        let b = pending.recv_timeout(META_TIMEOUT + Duration::from_secs(1)).map_err(|_| {
            log::warn!("rank {}: metadata rank {dest} did not answer", self.rank.id.rank);
            libc::EIO
        })?;
        Reply::decode(&b).map_err(|_| libc::EIO)
    }

    /// Adds `path` to (or removes it from) its directory's listing at the
    /// directory's owner. The first name added to an input directory's
    /// listing is preceded by its mark on every rank ([`Self::mark_input_dir`]).
    pub(crate) fn link(&self, path: &[u8], kind: u8, add: bool) -> Result<(), i32> {
        let (dir, name) = parent(path);
        if add {
            self.mark_input_dir(dir)?;
        }
        let mut p = dir.to_vec();
        p.push(0);
        p.extend_from_slice(name);
        let op = if add { mop::ADD } else { mop::REMOVE };
        self.meta_at(dir, op, kind as u64, p).map(|_| ())
    }


    /// Renames `from` to `to` in the listing of the directory both are in,
    /// in one request to its owner (a rename within one directory: the
    /// listing never shows both names, nor neither).
    pub(crate) fn relink(&self, from: &[u8], to: &[u8], kind: u8) -> Result<(), i32> {
        let (dir, old) = parent(from);
        let (to_dir, new) = parent(to);
        debug_assert_eq!(dir, to_dir);
        self.mark_input_dir(dir)?;
        let mut p = Vec::with_capacity(dir.len() + new.len() + old.len() + 2);
        p.extend_from_slice(dir);
        p.push(0);
        p.extend_from_slice(new);
        p.push(0);
        p.extend_from_slice(old);
        self.meta_at(dir, mop::RELINK, kind as u64, p).map(|_| ())
    }

    /// The node id of input directory `dir`, if it is one.
    pub(crate) fn input_dir(&self, dir: &[u8]) -> Option<u32> {
        self.rank.view.lookup(dir).filter(|n| n.is_dir()).map(|n| n.id())
    }

    /// Can an output be listed in `dir`? False only for an input directory
    /// not marked ([`Self::mark_input_dir`]): no output name was ever added
    /// to its listing, so its listing is empty and no name in it that is not
    /// an input exists.
    pub(crate) fn may_list_outputs(&self, dir: &[u8]) -> bool {
        match (self.input_dir(dir), self.inputs.tiers.get()) {
            (Some(id), Some(t)) => t.get(id) == DIR_HAS_OUTPUTS,
            _ => true,
        }
    }

    /// Before an output name is first listed in input directory `dir`:
    /// every rank marks the directory in its tier map
    /// ([`fanstore_core::tiers::DIR_HAS_OUTPUTS`]), all at once, and this
    /// returns once all have. Clients answer a listing of an unmarked input
    /// directory, and a lookup of a name in it that is not an input, from
    /// shared memory with no message; so an output is never listed before
    /// every node would ask for it. A rank that does not answer is EIO (the
    /// name is not added). A directory already marked here costs nothing.
    pub(crate) fn mark_input_dir(&self, dir: &[u8]) -> Result<(), i32> {
        let Some(id) = self.input_dir(dir) else { return Ok(()) };
        if self.inputs.tiers.get().is_some_and(|t| t.get(id) == DIR_HAS_OUTPUTS) {
            return Ok(());
        }
        let others = (0..self.rank.id.nranks).filter(|&r| r != self.rank.id.rank);
        let pending = others.map(|dest| Ok((dest, self.meta_post(dest, mop::MARK_DIR, u64::from(id), Vec::new())?))).collect::<Result<Vec<_>, i32>>()?;
        self.mark_input_dir_here(id);
        for (dest, rx) in pending {
            if !self.meta_wait(dest, &rx).is_ok_and(|r| r.errno == 0) {
                log::warn!("rank {}: rank {dest} did not mark input directory '{}'", self.rank.id.rank, String::from_utf8_lossy(dir));
                return Err(libc::EIO);
            }
        }
        Ok(())
    }

    /// Marks input directory node `id` in this rank's tier map (MARK_DIR,
    /// and persisted outputs loaded at start). False if `id` is not a directory.
    pub(crate) fn mark_input_dir_here(&self, id: u32) -> bool {
        if !self.rank.view.node(id).is_some_and(|n| n.is_dir()) {
            return false;
        }
        if self.inputs.tiers.get().is_some_and(|t| t.set_if(id, 0, DIR_HAS_OUTPUTS)) {
            self.rank.counters.dirs_with_outputs.fetch_add(1, Relaxed);
        }
        true
    }

    /// The record of output `path` (file, directory or symlink itself):
    /// no symlink is followed.
    pub fn out_stat(&self, path: &[u8]) -> Result<OutRecord, i32> {
        let r = self.on_record(path, mop::GET, 0, path.to_vec())?;
        OutRecord::decode(&r.payload).ok_or(libc::EIO)
    }

    /// OUT_STAT: the [`wire::StatAnswer`] of `path`, through symlinks (the
    /// last one too unless `wire::STAT_NOFOLLOW`). A path that leads out of
    /// the mount is EXDEV with the absolute path as the payload.
    ///
    /// A caller that is not root needs search permission on the name's
    /// directory (EACCES); for STAT_PARENT, the directory's errno is EACCES
    /// if it may not add a name there.
    pub fn out_stat_answer(&self, path: &[u8], flags: u64, caller: &crate::caller::Caller) -> Result<Vec<u8>, (i32, Vec<u8>)> {
        let follow = flags & wire::STAT_NOFOLLOW == 0;
        if flags & wire::STAT_PARENT != 0 {
            if let Some(answer) = self.stat_parent_direct(path, follow, caller) {
                return answer;
            }
        }
        self.check_search(caller, path).map_err(|e| (e, Vec::new()))?;
        let resolved = |p: &[u8]| if p == path { Vec::new() } else { p.to_vec() };
        match self.lookup(path, follow) {
            Ok(Looked::Output { path: p, rec, target }) => Ok(wire::StatAnswer::encode(&rec, &resolved(&p), &target)),
            Ok(Looked::Input { path: p, node }) => Ok(wire::StatAnswer::encode(&self.input_record(node), &resolved(&p), b"")),
            Ok(Looked::Outside(abs)) => Err((libc::EXDEV, abs)),
            Err(libc::ENOENT) if flags & wire::STAT_PARENT != 0 => {
                let dir = self.dir_errno(parent(path).0).map(|e| match e {
                    0 => self.check_add(caller, path).err().unwrap_or(0),
                    e => e,
                });
                Err((libc::ENOENT, dir.map(|e| (e as u32).to_le_bytes().to_vec()).unwrap_or_default()))
            }
            Err(e) => Err((e, Vec::new())),
        }
    }

    /// OUT_STAT with `STAT_PARENT` (an open that may create the name) in
    /// two lookups, the directory's and then the name's in it, where the
    /// directory resolves and the name has a plain record or none: the
    /// general path looked the name up, then each ancestor to say why it
    /// was missing, then the directory again (and once more for a caller's
    /// permissions). None where that path must answer: a symlink to follow,
    /// an input, a name too long, a directory that does not resolve.
    fn stat_parent_direct(&self, path: &[u8], follow: bool, caller: &crate::caller::Caller) -> Option<Result<Vec<u8>, (i32, Vec<u8>)>> {
        let name = parent(path).1;
        if name.is_empty() || name.len() > fanstore_core::manifest::NAME_MAX || self.rank.view.lookup(path).is_some() {
            return None;
        }
        let (real, dir) = self.real_entry_in(path).ok()?;
        if !caller.is_root() && dir.as_ref().is_some_and(|d| !caller.may(d, crate::caller::Access::SEARCH)) {
            return Some(Err((libc::EACCES, Vec::new())));
        }
        if self.rank.view.lookup(&real).is_some() {
            return None;
        }
        match self.get_record(&real) {
            Ok((rec, _)) if rec.is_link() && follow => None,
            Ok((rec, target)) => Some(Ok(wire::StatAnswer::encode(&rec, if real == path { b"" } else { &real }, &target))),
            Err(libc::ENOENT) => {
                let e = may_add_in(caller, dir.as_ref()).err().unwrap_or(0);
                Some(Err((libc::ENOENT, (e as u32).to_le_bytes().to_vec())))
            }
            Err(_) => None,
        }
    }

    /// Whether a name can be created in `dir` (symlinks followed): 0 when it
    /// is a directory, else the errno an open with O_CREAT gives (ENOENT,
    /// ENOTDIR); None when `dir` leads out of the mount (the client looks).
    fn dir_errno(&self, dir: &[u8]) -> Option<i32> {
        if dir.is_empty() {
            return Some(0);
        }
        match self.lookup(dir, true) {
            Ok(Looked::Output { rec, .. }) => Some(if rec.is_dir() { 0 } else { libc::ENOTDIR }),
            Ok(Looked::Input { node, .. }) => Some(if self.rank.view.node(node).is_some_and(|n| n.is_dir()) { 0 } else { libc::ENOTDIR }),
            Ok(Looked::Outside(_)) => None,
            Err(e) => Some(e),
        }
    }

    /// Why `path` has no record, as the kernel's path walk says it: ENOTDIR
    /// when its deepest existing ancestor is a file, else ENOENT.
    pub(crate) fn missing_errno(&self, path: &[u8]) -> i32 {
        let mut p = parent(path).0;
        while !p.is_empty() {
            if let Some(n) = self.rank.view.lookup(p) {
                return if n.is_dir() { libc::ENOENT } else { libc::ENOTDIR };
            }
            match self.meta_at(p, mop::GET, 0, p.to_vec()) {
                Ok(r) => {
                    return match OutRecord::decode(&r.payload) {
                        Some(rec) if !rec.is_dir() => libc::ENOTDIR,
                        _ => libc::ENOENT,
                    }
                }
                Err(libc::ENOENT) => p = parent(p).0,
                Err(e) => return e,
            }
        }
        libc::ENOENT
    }


    /// Puts `rec` at the owner of `path`: Ok(true) when it replaced a record.
    pub(crate) fn put(&self, path: &[u8], rec: OutRecord, excl: bool) -> Result<bool, i32> {
        self.put_with(path, rec, if excl { wire::COMMIT_EXCL } else { 0 })
    }

    /// PUT that replaces a symlink at `path` too (rename's destination).
    pub(crate) fn put_over_link(&self, path: &[u8], rec: OutRecord) -> Result<bool, i32> {
        self.put_with(path, rec, crate::outputs::namespace::owner::PUT_OVER_LINK)
    }

    pub(crate) fn put_with(&self, path: &[u8], rec: OutRecord, arg0: u64) -> Result<bool, i32> {
        self.put_payload(path, rec, &[], arg0)
    }

    /// PUT of `rec` at `path` (payload `record | path | after...`: a
    /// symlink's `NUL target` follows its path); drops the bytes of the
    /// output the record replaced. True if it replaced one.
    pub(crate) fn put_payload(&self, path: &[u8], rec: OutRecord, after: &[&[u8]], arg0: u64) -> Result<bool, i32> {
        let mut p = Vec::with_capacity(OutRecord::LEN + path.len() + after.iter().map(|a| a.len()).sum::<usize>());
        rec.encode_into(&mut p);
        p.extend_from_slice(path);
        for a in after {
            p.extend_from_slice(a);
        }
        let r = match self.meta_at(path, mop::PUT, arg0, p) {
            // A new version of a hard-linked file: its shared record takes it.
            Err(libc::EMLINK) => return self.put_payload(&self.linked_key_of(path)?, rec, after, arg0),
            other => other?,
        };
        // A record of the same output (a rename retried after a failure
        // between its steps) is not a replaced one.
        let old = OutRecord::decode(&r.payload);
        if let Some(old) = old.filter(|o| (o.id, o.holder) != (rec.id, rec.holder)) {
            self.drop_data(&old);
        }
        Ok(old.is_some())
    }

    /// The key of the shared record that name `path` of a hard-linked file
    /// points at (EMLINK's meaning: the name's record is not the file's).
    pub(crate) fn linked_key_of(&self, path: &[u8]) -> Result<Vec<u8>, i32> {
        let r = self.meta_at(path, mop::GET, 0, path.to_vec())?;
        match OutRecord::decode(&r.payload) {
            Some(rec) if rec.is_linked_name() => Ok(rec.linked_key()),
            _ => Err(libc::EAGAIN), // no longer a linked name: the caller's retry decides
        }
    }

    /// Deletes the bytes of a replaced or unlinked output: here, or at its
    /// holder (asked over MPI; a holder that is gone keeps them until its
    /// local directory is removed). Persisted bytes stay in `--persist`.
    ///
    /// A name of a hard-linked file: one name fewer in its shared record,
    /// whose bytes go with its last name.
    pub(crate) fn drop_data(&self, old: &OutRecord) {
        if old.is_linked_name() {
            let key = old.linked_key();
            match self.meta_at(&key, mop::LINK_ADJ, -1i64 as u64, key.clone()) {
                Ok(r) if r.value == 1 => {
                    if let Some(shared) = OutRecord::decode(&r.payload) {
                        self.drop_data(&shared);
                    }
                }
                Ok(_) => {}
                Err(e) => log::warn!("rank {}: the shared record of a linked file: errno {e}", self.rank.id.rank),
            }
            return;
        }
        if old.is_dir() || old.holder >= self.rank.id.nranks {
            return;
        }
        if old.holder == self.rank.id.rank {
            self.drop_held_here(old.id);
        } else if let Err(e) = self.meta_to(old.holder, mop::HOLDER_DROP, old.id, Vec::new()) {
            log::warn!("rank {}: rank {} did not drop output {}: errno {e}", self.rank.id.rank, old.holder, old.id);
        }
    }


    /// A request about the record of `path` at its owner; a missing record
    /// is ENOENT or ENOTDIR as [`Self::missing_errno`] says.
    pub(crate) fn on_record(&self, path: &[u8], op: u16, arg0: u64, payload: Vec<u8>) -> Result<Reply, i32> {
        match self.meta_at(path, op, arg0, payload) {
            Err(libc::ENOENT) => Err(self.missing_errno(path)),
            other => other,
        }
    }

}
