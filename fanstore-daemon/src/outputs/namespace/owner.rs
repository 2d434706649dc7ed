//! The owner side of output metadata: rank hash(path) mod N keeps the
//! record of every output path that hashes to it, and the listing (children)
//! of every directory path that hashes to it, so a readdir costs one message
//! and O(entries of that directory).
//!
//! Requests are wire [`Request`]s with the ops of [`mop`] (payloads:
//! `OutRecord` (56 bytes) then a path, or a path, or `dir NUL name`); the
//! answer is a wire [`Reply`]. Every operation is one step under the store's
//! lock, so O_EXCL and "last close wins" are atomic at the owner.
//!
//! ## Directory rename: a two-phase move with fences
//!
//! Records are placed by the hash of their path, so renaming a directory
//! moves every record and listing below it to new owners. The coordinator
//! (the daemon a client asked) sends [`mop::MOVE_PREP`] to every rank: each
//! one fences `from` and `to` (any request that touches a path at or below
//! them answers EBUSY, which the asking daemon retries), takes out its
//! records and listings at or below `from`, and returns them. The
//! coordinator then updates the two parent listings, rewrites the paths and
//! sends every rank [`mop::MOVE_COMMIT`] with the entries it owns under the
//! new names; the rank installs them and lifts its fence. Every request
//! is answered from before the first fence or after the last commit that
//! concerns it, so no node sees half a tree. If a rank fails to prepare, the
//! coordinator commits the entries back under their old names (an abort).
//!
//! ## Symlinks
//!
//! A symlink is a record with `S_IFLNK`; the owner keeps its target beside
//! the record (PUT payload `record | path NUL target`; GET and DEL answer
//! `record | target`), so following a link costs no message to its holder.
//! A PUT never silently replaces a symlink: it answers ELOOP (the asking
//! daemon follows the link and commits to its target) unless arg0 has
//! [`PUT_OVER_LINK`] (rename over a link replaces the link itself).
//!
//! ```text
//! moved entries (MOVE_PREP reply, MOVE_COMMIT payload), repeated:
//!   0      kind (1 record, 2 listing, 3 symlink)
//!   1..5   path length u32 LE, then the path
//!   record:  OutRecord (56 bytes)
//!   symlink: OutRecord (56 bytes), target length u32 LE, target
//!   listing: child count u32 LE, then per child: kind u8 | name length u16 LE | name
//! MOVE_PREP payload: from NUL to, arg0 transaction id
//! ```

use fanstore_core::wire::{self, OutRecord, Reply, Request};
use std::collections::{BTreeMap, HashMap};

/// Metadata ops between ranks (never sent by clients).
pub mod mop {
    /// rec + path, arg0 bit 0 excl -> replaced record in the payload, if any.
    pub const PUT: u16 = 101;
    /// path -> value size, payload record.
    pub const GET: u16 = 102;
    /// path, arg0 expected output id (0: any) -> removed record.
    pub const DEL: u16 = 103;
    /// rec + path (a directory) -> EEXIST if the path exists.
    pub const MKDIR: u16 = 104;
    /// path -> ENOENT, ENOTDIR, ENOTEMPTY.
    pub const RMDIR: u16 = 105;
    /// dir NUL name, arg0 kind: adds a child to a listing.
    pub const ADD: u16 = 106;
    /// dir NUL name: removes a child from a listing.
    pub const REMOVE: u16 = 107;
    /// dir, arg0 skip -> OUT_LIST entries.
    pub const LIST: u16 = 108;
    /// To the holder of output arg0: delete its bytes (unlinked or replaced).
    pub const HOLDER_DROP: u16 = 109;
    /// To the holder of output arg0: it is now named by the payload path.
    pub const HOLDER_RENAME: u16 = 110;
    /// from NUL to, arg0 transaction id: fence both, take out and return
    /// every record and listing at or below `from` (module doc).
    pub const MOVE_PREP: u16 = 112;
    /// moved entries, arg0 transaction id: install them, lift the fence.
    pub const MOVE_COMMIT: u16 = 113;
    /// value (u64 LE) + path, arg0 `wire::SETATTR_*`: sets the record's
    /// permission bits or mtime -> ENOENT if there is no record.
    pub const SETATTR: u16 = 111;
    /// To every rank, arg0 the node id of an input directory: mark it in
    /// this rank's tier map as one in which outputs may be listed (sent
    /// before the first output name is added to its listing:
    /// `crate::outputs::Outputs::mark_input_dir`). Not a store operation.
    pub const MARK_DIR: u16 = 114;
    /// key, arg0 = delta (i64): changes the link count of the shared record
    /// of a hard-linked file at `key` (and its ctime); at 0 the record goes.
    /// Reply: the record after the change, value 1 if it went.
    pub const LINK_ADJ: u16 = 115;
    /// sum (u64 LE) + id (u64 LE) + path: the holder hashed output `id`
    /// after its close ([`wire::SUM_PENDING`]); sets the record's `sum` if
    /// it is still that output with its sum pending -> ENOENT, ESTALE (a
    /// newer version), EMLINK with the record (a hard-linked name).
    pub const SET_SUM: u16 = 116;
    /// dir NUL new name NUL old name, arg0 kind: a rename within one
    /// directory's listing, in one step (ADD of the new name, REMOVE of
    /// the old one).
    pub const RELINK: u16 = 117;
}

/// PUT arg0 bit: replace a symlink at the path (rename); without it a
/// symlink there answers ELOOP.
pub const PUT_OVER_LINK: u64 = 2;

/// PUT arg0 bit: a new version of a file (a COMMIT) keeps the owner and
/// group of the file it replaces, as writing into a file does natively.
pub const PUT_KEEP_OWNER: u64 = 4;

/// MOVE_COMMIT arg0 bit: the move happened (not an abort). Every rank then
/// remembers it ([`MetaStore::moved`]), so an output still open under the
/// old name when the move ran is committed under the new one.
pub const MOVE_DONE: u64 = 1 << 63;

/// Directory moves remembered per rank (newest last).
const MOVES_KEPT: usize = 256;

/// Largest OUT_LIST payload (fits a client message with its header).
pub const LIST_LIMIT: usize = wire::MAX_MESSAGE - wire::HEADER_LEN - 64;

#[derive(Default)]
pub struct MetaStore {
    /// Every record this rank owns (mirrored into the node's record table).
    recs: super::records::Records,
    /// The target of every symlink record.
    targets: HashMap<Vec<u8>, Vec<u8>>,
    children: HashMap<Vec<u8>, BTreeMap<Vec<u8>, u8>>,
    /// Directory moves in flight: (transaction id, from, to).
    fences: Vec<(u64, Vec<u8>, Vec<u8>)>,
    /// The last [`MOVES_KEPT`] directory moves that happened: (from, to).
    moves: std::collections::VecDeque<(Vec<u8>, Vec<u8>)>,
}

/// Is `path` `dir` itself or below it?
pub fn at_or_below(path: &[u8], dir: &[u8]) -> bool {
    path.starts_with(dir) && (path.len() == dir.len() || path[dir.len()] == b'/')
}

/// An entry taken out by MOVE_PREP: a record or a directory listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Moved {
    Record(Vec<u8>, OutRecord),
    Link(Vec<u8>, OutRecord, Vec<u8>),
    Listing(Vec<u8>, Vec<(Vec<u8>, u8)>),
}

impl Moved {
    pub fn path(&self) -> &[u8] {
        match self {
            Moved::Record(p, _) | Moved::Link(p, _, _) | Moved::Listing(p, _) => p,
        }
    }

    /// The same entry with its path's `from` prefix replaced by `to`.
    pub fn renamed(self, from: &[u8], to: &[u8]) -> Moved {
        let re = |p: Vec<u8>| if at_or_below(&p, from) { [to, &p[from.len()..]].concat() } else { p };
        match self {
            Moved::Record(p, r) => Moved::Record(re(p), r),
            Moved::Link(p, r, t) => Moved::Link(re(p), r, t),
            Moved::Listing(p, c) => Moved::Listing(re(p), c),
        }
    }

    pub fn encode_into(&self, b: &mut Vec<u8>) {
        let (kind, path) = match self {
            Moved::Record(p, _) => (1u8, p),
            Moved::Listing(p, _) => (2u8, p),
            Moved::Link(p, _, _) => (3u8, p),
        };
        b.push(kind);
        b.extend_from_slice(&(path.len() as u32).to_le_bytes());
        b.extend_from_slice(path);
        match self {
            Moved::Record(_, r) => r.encode_into(b),
            Moved::Link(_, r, t) => {
                r.encode_into(b);
                b.extend_from_slice(&(t.len() as u32).to_le_bytes());
                b.extend_from_slice(t);
            }
            Moved::Listing(_, c) => {
                b.extend_from_slice(&(c.len() as u32).to_le_bytes());
                for (name, k) in c {
                    b.push(*k);
                    b.extend_from_slice(&(name.len() as u16).to_le_bytes());
                    b.extend_from_slice(name);
                }
            }
        }
    }

    /// Decodes a sequence of entries; None if any is malformed.
    pub fn decode_all(mut b: &[u8]) -> Option<Vec<Moved>> {
        fn take<'a>(b: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
            let (h, t) = (b.get(..n)?, b.get(n..)?);
            *b = t;
            Some(h)
        }
        fn u32_of(b: &mut &[u8]) -> Option<usize> {
            Some(u32::from_le_bytes(take(b, 4)?.try_into().ok()?) as usize)
        }
        let mut out = Vec::new();
        while !b.is_empty() {
            let kind = take(&mut b, 1)?[0];
            let n = u32_of(&mut b)?;
            let path = take(&mut b, n)?.to_vec();
            match kind {
                1 => {
                    let r = OutRecord::decode(take(&mut b, OutRecord::LEN)?)?;
                    out.push(Moved::Record(path, r));
                }
                3 => {
                    let r = OutRecord::decode(take(&mut b, OutRecord::LEN)?)?;
                    let n = u32_of(&mut b)?;
                    out.push(Moved::Link(path, r, take(&mut b, n)?.to_vec()));
                }
                2 => {
                    let count = u32_of(&mut b)?;
                    let mut c = Vec::with_capacity(count.min(1 << 16));
                    for _ in 0..count {
                        let k = take(&mut b, 1)?[0];
                        let len = u16::from_le_bytes(take(&mut b, 2)?.try_into().ok()?) as usize;
                        c.push((take(&mut b, len)?.to_vec(), k));
                    }
                    out.push(Moved::Listing(path, c));
                }
                _ => return None,
            }
        }
        Some(out)
    }
}

/// The path a request touches (for the fence check): the record's path, or
/// the directory of a listing change.
fn touched(req: &Request) -> Option<&[u8]> {
    let p = &req.payload[..];
    match req.op {
        mop::PUT | mop::MKDIR => p.get(OutRecord::LEN..).map(|r| split_nul(r).map_or(r, |(path, _)| path)),
        mop::GET | mop::DEL | mop::RMDIR | mop::LIST => Some(p),
        mop::SETATTR => p.get(8..),
        mop::SET_SUM => p.get(16..),
        mop::ADD | mop::REMOVE | mop::RELINK => split_nul(p).map(|(dir, _)| dir),
        _ => None,
    }
}

fn split_nul(b: &[u8]) -> Option<(&[u8], &[u8])> {
    let i = b.iter().position(|&c| c == 0)?;
    Some((&b[..i], &b[i + 1..]))
}

/// A reply carrying `rec` (and a symlink's target after it).
fn with_record(req: &Request, rec: &OutRecord, target: Option<&Vec<u8>>) -> Reply {
    let mut r = Reply::ok(req, rec.size);
    rec.encode_into(&mut r.payload);
    if let Some(t) = target.filter(|_| rec.is_link()) {
        r.payload.extend_from_slice(t);
    }
    r
}

impl MetaStore {
    /// Adds `name` (of `kind`) to the listing of `dir`.
    fn list_add(&mut self, dir: &[u8], name: &[u8], kind: u8) {
        if self.children.entry(dir.to_vec()).or_default().insert(name.to_vec(), kind).is_none() {
            self.entry_changed(dir, kind, 1);
        }
    }

    /// Removes `name` from the listing of `dir` (if there).
    fn list_remove(&mut self, dir: &[u8], name: &[u8]) {
        if let Some(c) = self.children.get_mut(dir) {
            let gone = c.remove(name);
            if c.is_empty() {
                self.children.remove(dir);
            }
            if let Some(kind) = gone {
                self.entry_changed(dir, kind, -1);
            }
        }
    }

    /// A name of `kind` was added to (`delta` 1) or removed from (-1)
    /// directory `dir`'s listing: the directory's record (kept here with
    /// its listing) changes as natively: mtime and ctime now, and its
    /// count of subdirectories (a directory record's `size`: its
    /// `st_nlink` is 2 more) when the name is a directory.
    fn entry_changed(&mut self, dir: &[u8], kind: u8, delta: i64) {
        let now = crate::outputs::names::now_ns();
        self.recs.update(dir, |r| {
            if r.is_dir() {
                (r.mtime_ns, r.ctime_ns) = (now, now);
                if kind == wire::KIND_DIR {
                    r.size = r.size.saturating_add_signed(delta);
                }
            }
        });
    }

    /// From now on, publish every record in the node's record table.
    pub fn publish_to(&mut self, table: std::sync::Arc<fanstore_core::record_table::RecordTable>) {
        self.recs.publish_to(table);
    }

    pub fn len(&self) -> usize {
        self.recs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.recs.is_empty()
    }

    /// Every file record (for draining and tests).
    pub fn files(&self) -> Vec<(Vec<u8>, OutRecord)> {
        self.recs.iter().filter(|(_, r)| !r.is_dir()).map(|(p, r)| (p.clone(), *r)).collect()
    }

    /// Every record (files and directories), for draining.
    pub fn all(&self) -> Vec<(Vec<u8>, OutRecord)> {
        self.recs.iter().map(|(p, r)| (p.clone(), *r)).collect()
    }

    /// Adds a record (loading persisted outputs).
    pub fn insert(&mut self, path: &[u8], rec: OutRecord) {
        self.recs.insert(path.to_vec(), rec);
    }

    /// Adds a symlink record with its target (loading persisted outputs).
    pub fn insert_link(&mut self, path: &[u8], rec: OutRecord, target: &[u8]) {
        self.recs.insert(path.to_vec(), rec);
        self.targets.insert(path.to_vec(), target.to_vec());
    }

    /// Adds `name` (of `kind`) to the listing of `dir`.
    pub fn add_child(&mut self, dir: &[u8], name: &[u8], kind: u8) {
        self.children.entry(dir.to_vec()).or_default().insert(name.to_vec(), kind);
    }

    fn fenced(&self, path: &[u8]) -> bool {
        self.fences.iter().any(|(_, from, to)| at_or_below(path, from) || at_or_below(path, to))
    }

    /// MOVE_PREP: fence, then take out everything at or below `from`.
    fn move_prep(&mut self, req: &Request) -> Reply {
        let Some((from, to)) = split_nul(&req.payload) else { return Reply::err(req, libc::EINVAL) };
        if from.is_empty() || to.is_empty() || self.fenced(from) || self.fenced(to) {
            return Reply::err(req, if from.is_empty() || to.is_empty() { libc::EINVAL } else { libc::EBUSY });
        }
        self.fences.push((req.arg0, from.to_vec(), to.to_vec()));
        let mut r = Reply::ok(req, 0);
        let paths: Vec<Vec<u8>> = self.recs.keys().filter(|k| at_or_below(k, from)).cloned().collect();
        for k in paths {
            if let Some(rec) = self.recs.remove(&k) {
                match self.targets.remove(&k) {
                    Some(t) => Moved::Link(k, rec, t),
                    None => Moved::Record(k, rec),
                }
                .encode_into(&mut r.payload);
            }
        }
        let dirs: Vec<Vec<u8>> = self.children.keys().filter(|k| at_or_below(k, from)).cloned().collect();
        for k in dirs {
            if let Some(c) = self.children.remove(&k) {
                Moved::Listing(k, c.into_iter().collect()).encode_into(&mut r.payload);
            }
        }
        r
    }

    /// MOVE_COMMIT: install the entries, lift the transaction's fence.
    fn move_commit(&mut self, req: &Request) -> Reply {
        let Some(entries) = Moved::decode_all(&req.payload) else { return Reply::err(req, libc::EINVAL) };
        for e in entries {
            match e {
                Moved::Record(p, r) => {
                    self.recs.insert(p, r);
                }
                Moved::Link(p, r, t) => self.insert_link(&p, r, &t),
                Moved::Listing(p, c) => self.children.entry(p).or_default().extend(c),
            }
        }
        let tx = req.arg0 & !MOVE_DONE;
        if req.arg0 & MOVE_DONE != 0 {
            if let Some((_, from, to)) = self.fences.iter().find(|(t, _, _)| *t == tx) {
                if self.moves.len() == MOVES_KEPT {
                    self.moves.pop_front();
                }
                self.moves.push_back((from.clone(), to.clone()));
            }
        }
        self.fences.retain(|(t, _, _)| *t != tx);
        Reply::ok(req, 0)
    }

    /// Where `path` is now if a remembered directory move took a directory
    /// above it: the newest move that did, then every later move of the new
    /// name, in order (a name reused after an older move is not confused
    /// with it).
    pub fn moved(&self, path: &[u8]) -> Option<Vec<u8>> {
        let below = |p: &[u8], from: &[u8]| at_or_below(p, from) && p != from;
        let i = self.moves.iter().rposition(|(from, _)| below(path, from))?;
        let (from, to) = &self.moves[i];
        let mut cur = [to.as_slice(), &path[from.len()..]].concat();
        for (from, to) in self.moves.iter().skip(i + 1) {
            if below(&cur, from) {
                cur = [to.as_slice(), &cur[from.len()..]].concat();
            }
        }
        Some(cur)
    }

    pub fn handle(&mut self, req: &Request) -> Reply {
        if touched(req).is_some_and(|t| self.fenced(t)) {
            return Reply::err(req, libc::EBUSY);
        }
        let p = &req.payload[..];
        match req.op {
            mop::MOVE_PREP => self.move_prep(req),
            mop::MOVE_COMMIT => self.move_commit(req),
            mop::PUT | mop::MKDIR => {
                let (Some(rec), Some(rest)) = (OutRecord::decode(p), p.get(OutRecord::LEN..)) else {
                    return Reply::err(req, libc::EINVAL);
                };
                let (path, target) = match split_nul(rest) {
                    Some((path, t)) if rec.is_link() => (path, Some(t)),
                    None if !rec.is_link() => (rest, None),
                    _ => return Reply::err(req, libc::EINVAL),
                };
                match self.recs.get(path) {
                    Some(_) if req.op == mop::MKDIR => Reply::err(req, libc::EEXIST),
                    Some(_) if req.arg0 & wire::COMMIT_EXCL != 0 => Reply::err(req, libc::EEXIST),
                    Some(old) if old.is_dir() => Reply::err(req, libc::EISDIR),
                    // A new version of a hard-linked file goes to its shared record.
                    Some(old) if old.is_linked_name() && req.arg0 & PUT_KEEP_OWNER != 0 => {
                        let mut r = with_record(req, old, None);
                        r.errno = libc::EMLINK;
                        r
                    }
                    Some(old) if old.is_link() && req.arg0 & PUT_OVER_LINK == 0 => {
                        let t = self.targets.get(path);
                        let mut r = with_record(req, old, t);
                        r.errno = libc::ELOOP;
                        r
                    }
                    old => {
                        let rec = match old {
                            // (and its inode number's base: rewritten, it stays the same file)
                            Some(o) if req.arg0 & PUT_KEEP_OWNER != 0 && !o.is_link() => OutRecord { uid: o.uid, gid: o.gid, ino: o.ino, nlink: o.nlink, ..rec },
                            _ => rec,
                        };
                        let reply = match old {
                            Some(o) => with_record(req, o, self.targets.get(path)),
                            None => Reply::ok(req, 0),
                        };
                        self.recs.insert(path.to_vec(), rec);
                        match target {
                            Some(t) => self.targets.insert(path.to_vec(), t.to_vec()),
                            None => self.targets.remove(path),
                        };
                        reply
                    }
                }
            }
            mop::SETATTR => {
                let (Some(v), Some(path)) = (p.get(..8), p.get(8..)) else {
                    return Reply::err(req, libc::EINVAL);
                };
                let value = u64::from_le_bytes(v.try_into().unwrap_or([0; 8]));
                let keep_mode = req.arg0 & wire::SETATTR_KEEP_MODE != 0;
                let what = req.arg0 & !wire::SETATTR_KEEP_MODE;
                if ![wire::SETATTR_MODE, wire::SETATTR_MTIME, wire::SETATTR_ATIME, wire::SETATTR_OWNER].contains(&what) {
                    return match self.recs.get(path) {
                        None => Reply::err(req, libc::ENOENT),
                        Some(r) if r.is_linked_name() => {
                            let mut rep = with_record(req, r, None);
                            rep.errno = libc::EMLINK;
                            rep
                        }
                        Some(_) => Reply::err(req, libc::EINVAL),
                    };
                }
                match self.recs.get(path) {
                    None => return Reply::err(req, libc::ENOENT),
                    // A hard-linked file's attributes are in its shared record.
                    Some(r) if r.is_linked_name() => {
                        let mut rep = with_record(req, r, None);
                        rep.errno = libc::EMLINK;
                        return rep;
                    }
                    Some(_) => {}
                }
                self.recs
                    .update(path, |r| {
                        match what {
                            wire::SETATTR_MODE => r.mode = (r.mode & libc::S_IFMT) | (value as u32 & 0o7777),
                            wire::SETATTR_MTIME => r.mtime_ns = value as i64,
                            wire::SETATTR_ATIME => r.atime_ns = value as i64,
                            _ => {
                                let (uid, gid) = (value as u32, (value >> 32) as u32);
                                if uid != u32::MAX {
                                    r.uid = uid;
                                }
                                if gid != u32::MAX {
                                    r.gid = gid;
                                }
                                // As chown(2) on Linux: a file that is not a directory
                                // loses set-user-ID, and set-group-ID when group-executable.
                                if !keep_mode && !r.is_dir() && !r.is_link() && (uid != u32::MAX || gid != u32::MAX) {
                                    r.mode = wire::mode_without_privs(r.mode);
                                }
                            }
                        }
                        r.ctime_ns = crate::outputs::names::now_ns();
                        with_record(req, r, None)
                    })
                    .unwrap_or_else(|| Reply::err(req, libc::ENOENT))
            }
            mop::SET_SUM => {
                let (Some(sum), Some(id), Some(path)) = (p.get(..8), p.get(8..16), p.get(16..)) else {
                    return Reply::err(req, libc::EINVAL);
                };
                let (sum, id) = (u64::from_le_bytes(sum.try_into().unwrap_or([0; 8])), u64::from_le_bytes(id.try_into().unwrap_or([0; 8])));
                match self.recs.get(path) {
                    None => Reply::err(req, libc::ENOENT),
                    Some(r) if r.is_linked_name() => {
                        let mut rep = with_record(req, r, None);
                        rep.errno = libc::EMLINK;
                        rep
                    }
                    Some(r) if r.id != id || r.sum != wire::SUM_PENDING || r.is_dir() || r.is_link() => Reply::err(req, libc::ESTALE),
                    Some(_) => self
                        .recs
                        .update(path, |r| {
                            r.sum = sum;
                            with_record(req, r, None)
                        })
                        .unwrap_or_else(|| Reply::err(req, libc::ENOENT)),
                }
            }
            mop::LINK_ADJ => {
                let now = crate::outputs::names::now_ns();
                let adjusted = self.recs.update(p, |r| {
                    r.nlink = (i64::from(r.nlink.max(1)) + req.arg0 as i64).clamp(0, i64::from(u32::MAX)) as u32;
                    r.ctime_ns = now;
                    let gone = r.nlink == 0;
                    let mut rep = with_record(req, r, None);
                    rep.value = u64::from(gone);
                    (rep, gone)
                });
                match adjusted {
                    None => Reply::err(req, libc::ENOENT),
                    Some((rep, gone)) => {
                        if gone {
                            self.recs.remove(p);
                        }
                        rep
                    }
                }
            }
            mop::GET => match self.recs.get(p) {
                Some(r) => with_record(req, r, self.targets.get(p)),
                None => Reply::err(req, libc::ENOENT),
            },
            mop::DEL => match self.recs.get(p) {
                None => Reply::err(req, libc::ENOENT),
                Some(r) if r.is_dir() => Reply::err(req, libc::EISDIR),
                Some(r) if req.arg0 != 0 && r.id != req.arg0 => Reply::err(req, libc::ENOENT),
                Some(_) => match self.recs.remove(p) {
                    Some(r) => with_record(req, &r, self.targets.remove(p).as_ref()),
                    None => Reply::err(req, libc::ENOENT),
                },
            },
            mop::RMDIR => match self.recs.get(p) {
                None => Reply::err(req, libc::ENOENT),
                Some(r) if !r.is_dir() => Reply::err(req, libc::ENOTDIR),
                Some(_) if self.children.get(p).is_some_and(|c| !c.is_empty()) => Reply::err(req, libc::ENOTEMPTY),
                Some(_) => {
                    self.recs.remove(p);
                    self.children.remove(p);
                    Reply::ok(req, 0)
                }
            },
            mop::ADD | mop::REMOVE => {
                let Some((dir, name)) = split_nul(p) else { return Reply::err(req, libc::EINVAL) };
                if req.op == mop::ADD {
                    self.list_add(dir, name, req.arg0 as u8);
                } else {
                    self.list_remove(dir, name);
                }
                Reply::ok(req, 0)
            }
            mop::RELINK => {
                let Some((dir, names)) = split_nul(p) else { return Reply::err(req, libc::EINVAL) };
                let Some((new, old)) = split_nul(names) else { return Reply::err(req, libc::EINVAL) };
                self.list_add(dir, new, req.arg0 as u8);
                self.list_remove(dir, old);
                Reply::ok(req, 0)
            }
            mop::LIST => {
                let mut r = Reply::ok(req, 0);
                if let Some(c) = self.children.get(p) {
                    let mut n = 0;
                    for (name, kind) in c.iter().skip(req.arg0 as usize) {
                        if !wire::push_entry(&mut r.payload, *kind, name, LIST_LIMIT) {
                            break;
                        }
                        n += 1;
                    }
                    r.value = n;
                }
                r
            }
            _ => Reply::err(req, libc::EINVAL),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(op: u16, arg0: u64, payload: &[u8]) -> Request {
        let mut r = Request::new(op, 1, arg0, 0);
        r.payload = payload.to_vec();
        r
    }

    fn rec_path(rec: OutRecord, path: &[u8]) -> Vec<u8> {
        let mut b = Vec::new();
        rec.encode_into(&mut b);
        b.extend_from_slice(path);
        b
    }

    #[test]
    fn put_get_excl_replace_del() {
        let mut m = MetaStore::default();
        let a = OutRecord { size: 3, mode: libc::S_IFREG | 0o644, id: 1, ..Default::default() };
        let b = OutRecord { size: 4, id: 2, ..a };
        assert_eq!(m.handle(&req(mop::PUT, 1, &rec_path(a, b"x/f"))).errno, 0);
        assert_eq!(m.handle(&req(mop::PUT, 1, &rec_path(b, b"x/f"))).errno, libc::EEXIST);
        let r = m.handle(&req(mop::PUT, 0, &rec_path(b, b"x/f")));
        assert_eq!(OutRecord::decode(&r.payload), Some(a));
        let g = m.handle(&req(mop::GET, 0, b"x/f"));
        assert_eq!((g.value, OutRecord::decode(&g.payload)), (4, Some(b)));
        assert_eq!(m.handle(&req(mop::DEL, 1, b"x/f")).errno, libc::ENOENT);
        assert_eq!(m.handle(&req(mop::DEL, 2, b"x/f")).errno, 0);
        assert_eq!(m.handle(&req(mop::GET, 0, b"x/f")).errno, libc::ENOENT);
    }

    #[test]
    fn listing_changes_touch_the_directory_and_count_subdirectories() {
        let mut m = MetaStore::default();
        let d = OutRecord { mode: libc::S_IFDIR | 0o755, mtime_ns: 1, ctime_ns: 1, ..Default::default() };
        m.handle(&req(mop::MKDIR, 0, &rec_path(d, b"d")));
        let get = |m: &mut MetaStore| OutRecord::decode(&m.handle(&req(mop::GET, 0, b"d")).payload).unwrap();
        m.handle(&req(mop::ADD, wire::KIND_DIR as u64, b"d\0sub"));
        m.handle(&req(mop::ADD, wire::KIND_FILE as u64, b"d\0f"));
        let g = get(&mut m);
        assert_eq!(g.size, 1, "one subdirectory");
        assert!(g.mtime_ns > 1 && g.ctime_ns == g.mtime_ns, "times set to now");
        // A name added again (a new version of a file) changes nothing.
        let mut before = g;
        before.mtime_ns = -5;
        m.recs.insert(b"d".to_vec(), before);
        m.handle(&req(mop::ADD, wire::KIND_FILE as u64, b"d\0f"));
        assert_eq!(get(&mut m).mtime_ns, -5);
        m.handle(&req(mop::REMOVE, 0, b"d\0sub"));
        let g = get(&mut m);
        assert_eq!(g.size, 0);
        assert!(g.mtime_ns > 1);
    }

    #[test]
    fn a_relink_renames_within_a_listing_in_one_step() {
        let mut m = MetaStore::default();
        m.handle(&req(mop::ADD, wire::KIND_FILE as u64, b"ck\0a.tmp"));
        m.handle(&req(mop::ADD, wire::KIND_FILE as u64, b"ck\0b"));
        let names = |m: &mut MetaStore| {
            let r = m.handle(&req(mop::LIST, 0, b"ck"));
            wire::entries(&r.payload).map(|(_, n)| String::from_utf8_lossy(n).into_owned()).collect::<Vec<_>>()
        };
        // Onto a new name, then over an existing one: one entry each time.
        assert_eq!(m.handle(&req(mop::RELINK, wire::KIND_FILE as u64, b"ck\0a\0a.tmp")).errno, 0);
        assert_eq!(names(&mut m), ["a", "b"]);
        assert_eq!(m.handle(&req(mop::RELINK, wire::KIND_FILE as u64, b"ck\0b\0a")).errno, 0);
        assert_eq!(names(&mut m), ["b"]);
        assert_eq!(m.handle(&req(mop::RELINK, 0, b"ck\0b")).errno, libc::EINVAL);
    }

    #[test]
    fn setattr_changes_mode_bits_and_mtime_only() {
        let mut m = MetaStore::default();
        let a = OutRecord { size: 3, mode: libc::S_IFREG | 0o644, id: 1, mtime_ns: 5, ..Default::default() };
        m.handle(&req(mop::PUT, 0, &rec_path(a, b"f")));
        let set = |m: &mut MetaStore, what, v: u64, path: &[u8]| {
            let mut p = v.to_le_bytes().to_vec();
            p.extend_from_slice(path);
            m.handle(&req(mop::SETATTR, what, &p)).errno
        };
        assert_eq!(set(&mut m, wire::SETATTR_MODE, (libc::S_IFDIR | 0o4755) as u64, b"f"), 0);
        assert_eq!(set(&mut m, wire::SETATTR_MTIME, (-7i64) as u64, b"f"), 0);
        let g = OutRecord::decode(&m.handle(&req(mop::GET, 0, b"f")).payload).unwrap();
        assert_eq!((g.mode, g.mtime_ns, g.size, g.id), (libc::S_IFREG | 0o4755, -7, 3, 1), "type bits kept");
        assert_eq!(set(&mut m, wire::SETATTR_MODE, 0o600, b"nope"), libc::ENOENT);
        assert_eq!(set(&mut m, 9, 0, b"f"), libc::EINVAL);
        assert_eq!(m.handle(&req(mop::SETATTR, wire::SETATTR_MODE, b"short")).errno, libc::EINVAL);
    }

    #[test]
    fn a_pending_sum_is_set_once_and_only_for_its_own_output() {
        let mut m = MetaStore::default();
        let a = OutRecord { size: 3, mode: libc::S_IFREG | 0o644, id: 1, sum: wire::SUM_PENDING, mtime_ns: 5, ..Default::default() };
        m.handle(&req(mop::PUT, 0, &rec_path(a, b"f")));
        let set = |m: &mut MetaStore, sum: u64, id: u64, path: &[u8]| {
            let mut p = sum.to_le_bytes().to_vec();
            p.extend_from_slice(&id.to_le_bytes());
            p.extend_from_slice(path);
            m.handle(&req(mop::SET_SUM, 0, &p)).errno
        };
        let get = |m: &mut MetaStore| OutRecord::decode(&m.handle(&req(mop::GET, 0, b"f")).payload).unwrap();
        assert_eq!(set(&mut m, 42, 2, b"f"), libc::ESTALE, "another output's sum");
        assert_eq!(get(&mut m).sum, wire::SUM_PENDING);
        assert_eq!(set(&mut m, 42, 1, b"nope"), libc::ENOENT);
        assert_eq!(set(&mut m, 42, 1, b"f"), 0);
        assert_eq!(get(&mut m), OutRecord { sum: 42, ..a }, "only the sum changes");
        assert_eq!(set(&mut m, 43, 1, b"f"), libc::ESTALE, "a sum is set once");
        assert_eq!(get(&mut m).sum, 42);
        assert_eq!(m.handle(&req(mop::SET_SUM, 0, b"short")).errno, libc::EINVAL);
    }

    #[test]
    fn a_directory_move_fences_takes_out_and_installs() {
        let mut m = MetaStore::default();
        let d = OutRecord { mode: libc::S_IFDIR | 0o755, ..Default::default() };
        let f = OutRecord { size: 3, mode: libc::S_IFREG | 0o644, id: 1, ..Default::default() };
        m.handle(&req(mop::MKDIR, 0, &rec_path(d, b"tmp")));
        m.handle(&req(mop::PUT, 0, &rec_path(f, b"tmp/a")));
        m.handle(&req(mop::PUT, 0, &rec_path(f, b"tmpx"))); // a sibling with the same prefix: stays
        m.handle(&req(mop::ADD, wire::KIND_FILE as u64, b"tmp\0a"));
        let mut prep = req(mop::MOVE_PREP, 77, b"tmp\0ck");
        prep.arg0 = 77;
        let r = m.handle(&prep);
        assert_eq!(r.errno, 0);
        let moved = Moved::decode_all(&r.payload).unwrap();
        assert_eq!(moved.len(), 3, "{moved:?}");
        assert!(moved.contains(&Moved::Listing(b"tmp".to_vec(), vec![(b"a".to_vec(), wire::KIND_FILE)])));
        assert!(moved.contains(&Moved::Record(b"tmp/a".to_vec(), f)));
        // Fenced: both names and everything below them; not the sibling.
        for (op, payload) in [(mop::GET, &b"tmp/a"[..]), (mop::GET, b"ck"), (mop::LIST, b"ck/sub"), (mop::ADD, b"tmp\0b")] {
            assert_eq!(m.handle(&req(op, 0, payload)).errno, libc::EBUSY, "{}", String::from_utf8_lossy(payload));
        }
        assert_eq!(m.handle(&req(mop::GET, 0, b"tmpx")).errno, 0);
        assert_eq!(m.handle(&req(mop::MOVE_PREP, 78, b"ck/x\0y")).errno, libc::EBUSY, "no second move over a fenced name");
        let mut payload = Vec::new();
        for e in moved {
            e.renamed(b"tmp", b"ck").encode_into(&mut payload);
        }
        let mut commit = req(mop::MOVE_COMMIT, 0, &payload);
        commit.arg0 = 77;
        assert_eq!(m.handle(&commit).errno, 0);
        assert_eq!(m.handle(&req(mop::GET, 0, b"ck/a")).value, 3);
        assert!(OutRecord::decode(&m.handle(&req(mop::GET, 0, b"ck")).payload).unwrap().is_dir());
        assert_eq!(m.handle(&req(mop::GET, 0, b"tmp/a")).errno, libc::ENOENT);
        assert_eq!(m.handle(&req(mop::LIST, 0, b"ck")).value, 1);
        assert_eq!(Moved::decode_all(&[1, 9, 0, 0, 0, b'x']), None, "truncated entry");
    }

    #[test]
    fn symlinks_keep_their_target_refuse_a_silent_replace_and_move() {
        let mut m = MetaStore::default();
        let l = OutRecord { size: 4, mode: libc::S_IFLNK | 0o777, id: 5, ..Default::default() };
        let f = OutRecord { size: 1, mode: libc::S_IFREG | 0o644, id: 6, ..Default::default() };
        assert_eq!(m.handle(&req(mop::PUT, 0, &rec_path(l, b"d/latest"))).errno, libc::EINVAL, "a link needs its target");
        assert_eq!(m.handle(&req(mop::PUT, 0, &rec_path(f, b"d/x\0t"))).errno, libc::EINVAL, "a file has none");
        assert_eq!(m.handle(&req(mop::PUT, wire::COMMIT_EXCL, &rec_path(l, b"d/latest\0ck-9"))).errno, 0);
        let g = m.handle(&req(mop::GET, 0, b"d/latest"));
        assert_eq!((OutRecord::decode(&g.payload), &g.payload[OutRecord::LEN..]), (Some(l), &b"ck-9"[..]));
        // A commit over a link is ELOOP (the daemon follows it); excl is EEXIST; rename replaces it.
        assert_eq!(m.handle(&req(mop::PUT, 0, &rec_path(f, b"d/latest"))).errno, libc::ELOOP);
        assert_eq!(m.handle(&req(mop::PUT, wire::COMMIT_EXCL, &rec_path(f, b"d/latest"))).errno, libc::EEXIST);
        // The target moves with its record.
        let mut prep = req(mop::MOVE_PREP, 0, b"d\0e");
        prep.arg0 = 9;
        let moved = Moved::decode_all(&m.handle(&prep).payload).unwrap();
        assert_eq!(moved, vec![Moved::Link(b"d/latest".to_vec(), l, b"ck-9".to_vec())]);
        let mut payload = Vec::new();
        moved.into_iter().for_each(|e| e.renamed(b"d", b"e").encode_into(&mut payload));
        let mut commit = req(mop::MOVE_COMMIT, 0, &payload);
        commit.arg0 = 9;
        assert_eq!(m.handle(&commit).errno, 0);
        assert_eq!(&m.handle(&req(mop::GET, 0, b"e/latest")).payload[OutRecord::LEN..], b"ck-9");
        let r = m.handle(&req(mop::PUT, PUT_OVER_LINK, &rec_path(f, b"e/latest")));
        assert_eq!((r.errno, OutRecord::decode(&r.payload)), (0, Some(l)), "the replaced link is answered");
        assert_eq!(m.handle(&req(mop::GET, 0, b"e/latest")).payload.len(), OutRecord::LEN, "its target is gone");
        // DEL answers a link's target, and forgets it.
        m.handle(&req(mop::PUT, 0, &rec_path(l, b"k\0t1")));
        assert_eq!(&m.handle(&req(mop::DEL, 0, b"k")).payload[OutRecord::LEN..], b"t1");
        assert!(m.targets.is_empty());
    }

    #[test]
    fn completed_moves_are_remembered_and_aborted_ones_are_not() {
        let mut m = MetaStore::default();
        let d = OutRecord { mode: libc::S_IFDIR | 0o755, ..Default::default() };
        m.handle(&req(mop::MKDIR, 0, &rec_path(d, b"a")));
        let mut prep = req(mop::MOVE_PREP, 0, b"a\0b");
        prep.arg0 = 5;
        let moved = Moved::decode_all(&m.handle(&prep).payload).unwrap();
        let mut payload = Vec::new();
        moved.into_iter().for_each(|e| e.renamed(b"a", b"b").encode_into(&mut payload));
        let mut commit = req(mop::MOVE_COMMIT, 0, &payload);
        commit.arg0 = 5 | MOVE_DONE;
        assert_eq!(m.handle(&commit).errno, 0);
        assert!(m.fences.is_empty(), "the fence is lifted whatever the flag");
        assert_eq!(m.moved(b"a/x/y"), Some(b"b/x/y".to_vec()));
        assert_eq!(m.moved(b"ab/x"), None, "a sibling with the same prefix");
        assert_eq!(m.moved(b"a"), None, "the directory itself is not an entry below it");
        // A later move of the new name chains; an aborted one is not remembered.
        let mut prep = req(mop::MOVE_PREP, 0, b"b\0c");
        prep.arg0 = 6;
        m.handle(&prep);
        let mut commit = req(mop::MOVE_COMMIT, 0, b"");
        commit.arg0 = 6 | MOVE_DONE;
        m.handle(&commit);
        assert_eq!(m.moved(b"a/x"), Some(b"c/x".to_vec()));
        let mut prep = req(mop::MOVE_PREP, 0, b"c\0d");
        prep.arg0 = 7;
        m.handle(&prep);
        let mut abort = req(mop::MOVE_COMMIT, 0, b"");
        abort.arg0 = 7;
        m.handle(&abort);
        assert_eq!(m.moved(b"a/x"), Some(b"c/x".to_vec()));
    }

    #[test]
    fn dirs_and_listings() {
        let mut m = MetaStore::default();
        let d = OutRecord { mode: libc::S_IFDIR | 0o755, ..Default::default() };
        assert_eq!(m.handle(&req(mop::MKDIR, 0, &rec_path(d, b"ck"))).errno, 0);
        assert_eq!(m.handle(&req(mop::MKDIR, 0, &rec_path(d, b"ck"))).errno, libc::EEXIST);
        m.handle(&req(mop::ADD, wire::KIND_FILE as u64, b"ck\0a"));
        m.handle(&req(mop::ADD, wire::KIND_DIR as u64, b"ck\0b"));
        assert_eq!(m.handle(&req(mop::RMDIR, 0, b"ck")).errno, libc::ENOTEMPTY);
        let l = m.handle(&req(mop::LIST, 0, b"ck"));
        assert_eq!(l.value, 2);
        let names: Vec<_> = wire::entries(&l.payload).collect();
        assert_eq!(names, vec![(wire::KIND_FILE, &b"a"[..]), (wire::KIND_DIR, &b"b"[..])]);
        assert_eq!(m.handle(&req(mop::LIST, 2, b"ck")).value, 0);
        m.handle(&req(mop::REMOVE, 0, b"ck\0a"));
        m.handle(&req(mop::REMOVE, 0, b"ck\0b"));
        assert_eq!(m.handle(&req(mop::DEL, 0, b"ck")).errno, libc::EISDIR);
        assert_eq!(m.handle(&req(mop::RMDIR, 0, b"ck")).errno, 0);
        assert_eq!(m.handle(&req(mop::RMDIR, 0, b"ck")).errno, libc::ENOENT);
    }
}
