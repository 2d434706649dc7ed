//! The owner side of output metadata: rank hash(path) mod N keeps the
//! record of every output path that hashes to it, and the listing (children)
//! of every directory path that hashes to it, so a readdir costs one message
//! and O(entries of that directory).
//!
//! Requests are wire [`Request`]s with the ops of [`mop`] (payloads:
//! `OutRecord` (40 bytes) then a path, or a path, or `dir NUL name`); the
//! answer is a wire [`Reply`]. Every operation is one step under the store's
//! lock, so O_EXCL and "last close wins" are atomic at the owner.

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
    /// value (u64 LE) + path, arg0 `wire::SETATTR_*`: sets the record's
    /// permission bits or mtime -> ENOENT if there is no record.
    pub const SETATTR: u16 = 111;
}

/// Largest OUT_LIST payload (fits a client message with its header).
pub const LIST_LIMIT: usize = wire::MAX_MESSAGE - wire::HEADER_LEN - 64;

#[derive(Default)]
pub struct MetaStore {
    recs: HashMap<Vec<u8>, OutRecord>,
    children: HashMap<Vec<u8>, BTreeMap<Vec<u8>, u8>>,
}

fn split_nul(b: &[u8]) -> Option<(&[u8], &[u8])> {
    let i = b.iter().position(|&c| c == 0)?;
    Some((&b[..i], &b[i + 1..]))
}

fn with_record(req: &Request, rec: &OutRecord) -> Reply {
    let mut r = Reply::ok(req, rec.size);
    rec.encode_into(&mut r.payload);
    r
}

impl MetaStore {
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

    /// Adds `name` (of `kind`) to the listing of `dir`.
    pub fn add_child(&mut self, dir: &[u8], name: &[u8], kind: u8) {
        self.children.entry(dir.to_vec()).or_default().insert(name.to_vec(), kind);
    }

    pub fn handle(&mut self, req: &Request) -> Reply {
        let p = &req.payload[..];
        match req.op {
            mop::PUT | mop::MKDIR => {
                let (Some(rec), Some(path)) = (OutRecord::decode(p), p.get(OutRecord::LEN..)) else {
                    return Reply::err(req, libc::EINVAL);
                };
                match self.recs.get(path) {
                    Some(_) if req.op == mop::MKDIR => Reply::err(req, libc::EEXIST),
                    Some(_) if req.arg0 & wire::COMMIT_EXCL != 0 => Reply::err(req, libc::EEXIST),
                    Some(old) if old.is_dir() => Reply::err(req, libc::EISDIR),
                    old => {
                        let reply = match old {
                            Some(o) => with_record(req, o),
                            None => Reply::ok(req, 0),
                        };
                        self.recs.insert(path.to_vec(), rec);
                        reply
                    }
                }
            }
            mop::SETATTR => {
                let (Some(v), Some(path)) = (p.get(..8), p.get(8..)) else {
                    return Reply::err(req, libc::EINVAL);
                };
                let value = u64::from_le_bytes(v.try_into().unwrap_or([0; 8]));
                match self.recs.get_mut(path) {
                    None => Reply::err(req, libc::ENOENT),
                    Some(r) => {
                        match req.arg0 {
                            wire::SETATTR_MODE => r.mode = (r.mode & libc::S_IFMT) | (value as u32 & 0o7777),
                            wire::SETATTR_MTIME => r.mtime_ns = value as i64,
                            _ => return Reply::err(req, libc::EINVAL),
                        }
                        with_record(req, r)
                    }
                }
            }
            mop::GET => match self.recs.get(p) {
                Some(r) => with_record(req, r),
                None => Reply::err(req, libc::ENOENT),
            },
            mop::DEL => match self.recs.get(p) {
                None => Reply::err(req, libc::ENOENT),
                Some(r) if r.is_dir() => Reply::err(req, libc::EISDIR),
                Some(r) if req.arg0 != 0 && r.id != req.arg0 => Reply::err(req, libc::ENOENT),
                Some(_) => match self.recs.remove(p) {
                    Some(r) => with_record(req, &r),
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
                    self.children.entry(dir.to_vec()).or_default().insert(name.to_vec(), req.arg0 as u8);
                } else if let Some(c) = self.children.get_mut(dir) {
                    c.remove(name);
                    if c.is_empty() {
                        self.children.remove(dir);
                    }
                }
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
