//! Namespace events of outputs: what `fanstore watch` prints and what
//! inotify instances on `/fanstore` paths read.
//!
//! A daemon that completes a namespace change of an output (a commit, an
//! unlink, a mkdir, an rmdir, a rename) describes it as one [`NsEvent`] and
//! publishes it to the metadata owner of the event's directory (the
//! destination directory for a rename), which numbers it and forwards it to
//! every node with a watcher concerned. Each node turns it into records for
//! its own watchers: [`NsEvent`] itself for `fanstore watch` (op
//! `WATCH_EVENT`), or `struct inotify_event` records ([`inotify_records`]).
//!
//! ```text
//! NsEvent   0 version (1) | 1 kind | 2 flags (bit 0 directory, bit 1 replaced
//!           an existing file) | 3 zero | 4..8 node (rank that made the change)
//!           | 8..12 cookie | 12..16 holder rank of the file's bytes (u32::MAX:
//!           none) | 16..24 size | 24..32 time ns (i64) | 32..40 sequence number
//!           at the owner | 40..48 output id | 48..56 xxh3 of the bytes
//!           | 56..58 path length u16 | 58..60 new path length u16 (rename,
//!           else 0) | path | new path
//! ```
//! (holder, output id, xxh3) name the committed file (close, rename of a
//! file), so a watching node can start fetching it when the event arrives.
//! ```text
//! ```
//! Paths are relative to the mount, as everywhere on the wire.
//!
//! Client ops (a connection that sends one of them becomes a watcher
//! session until it closes):
//!
//! ```text
//! WATCH_ADD    payload path, arg0 watch descriptor (chosen by the client),
//!              arg1 low 32 bits: inotify mask, bit 32: recursive; the same
//!              descriptor again replaces the watch. ENOENT (missing path),
//!              ENOTDIR (IN_ONLYDIR on a file), EINVAL (no event in mask)
//! WATCH_RM     arg0 watch descriptor; IN_IGNORED follows; EINVAL if unknown
//! WATCH_SINK   fd attached: where to write one `struct inotify_event` per
//!              write (the write end of a packet-mode pipe, O_NONBLOCK);
//!              without a sink, events come on the connection as WATCH_EVENT
//!              replies (payload NsEvent)
//! WATCH_KERNEL fd attached: a kernel inotify instance whose events the
//!              daemon forwards into the sink (paths outside the mount)
//! WATCH_INFO   reply value = watcher sessions on this rank, payload text
//!              `sessions=N watches=W interests=I` (I: node/directory pairs
//!              this rank routes events to)
//! ```

use crate::le::*;

pub const IN_ACCESS: u32 = 0x1;
pub const IN_MODIFY: u32 = 0x2;
pub const IN_ATTRIB: u32 = 0x4;
pub const IN_CLOSE_WRITE: u32 = 0x8;
pub const IN_CLOSE_NOWRITE: u32 = 0x10;
pub const IN_OPEN: u32 = 0x20;
pub const IN_MOVED_FROM: u32 = 0x40;
pub const IN_MOVED_TO: u32 = 0x80;
pub const IN_CREATE: u32 = 0x100;
pub const IN_DELETE: u32 = 0x200;
pub const IN_DELETE_SELF: u32 = 0x400;
pub const IN_MOVE_SELF: u32 = 0x800;
pub const IN_ALL_EVENTS: u32 = 0xfff;
pub const IN_UNMOUNT: u32 = 0x2000;
pub const IN_Q_OVERFLOW: u32 = 0x4000;
pub const IN_IGNORED: u32 = 0x8000;
pub const IN_ONLYDIR: u32 = 0x0100_0000;
pub const IN_DONT_FOLLOW: u32 = 0x0200_0000;
pub const IN_EXCL_UNLINK: u32 = 0x0400_0000;
pub const IN_MASK_CREATE: u32 = 0x1000_0000;
pub const IN_MASK_ADD: u32 = 0x2000_0000;
pub const IN_ISDIR: u32 = 0x4000_0000;
pub const IN_ONESHOT: u32 = 0x8000_0000;

/// WATCH_ADD arg1 bit: the watch covers every directory below its path too.
pub const WATCH_RECURSIVE: u64 = 1 << 32;

crate::format::coded_enum! {
    /// What happened.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Kind: u8, from_u8 {
        /// A file was committed (its last close returned): new, or a new version.
        Close = 1 => "close",
        Delete = 2 => "delete",
        Mkdir = 3 => "mkdir",
        Rmdir = 4 => "rmdir",
        /// `path` was renamed to `to` (a file or a directory).
        Rename = 5 => "rename",
    }
}

/// One namespace change of an output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NsEvent {
    pub kind: Kind,
    pub is_dir: bool,
    /// Close: the path held a file before (a new version); Rename: the new
    /// name replaced a file.
    pub replaced: bool,
    pub node: u32,
    pub cookie: u32,
    pub size: u64,
    pub time_ns: i64,
    pub seq: u64,
    /// Where the file's bytes are (close, rename of a file), else u32::MAX.
    pub holder: u32,
    pub id: u64,
    pub sum: u64,
    pub path: Vec<u8>,
    /// Rename: the new path (else empty).
    pub to: Vec<u8>,
}

const HEAD: usize = 60;

impl NsEvent {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; HEAD];
        b[0] = 1;
        b[1] = self.kind as u8;
        b[2] = u8::from(self.is_dir) | (u8::from(self.replaced) << 1);
        put_u32(&mut b, 4, self.node);
        put_u32(&mut b, 8, self.cookie);
        put_u64(&mut b, 16, self.size);
        put_u64(&mut b, 24, self.time_ns as u64);
        put_u64(&mut b, 32, self.seq);
        put_u32(&mut b, 12, self.holder);
        put_u64(&mut b, 40, self.id);
        put_u64(&mut b, 48, self.sum);
        put_u16(&mut b, 56, self.path.len().min(u16::MAX as usize) as u16);
        put_u16(&mut b, 58, self.to.len().min(u16::MAX as usize) as u16);
        b.extend_from_slice(&self.path[..self.path.len().min(u16::MAX as usize)]);
        b.extend_from_slice(&self.to[..self.to.len().min(u16::MAX as usize)]);
        b
    }

    /// None if `b` is not a whole, known event.
    pub fn decode(b: &[u8]) -> Option<NsEvent> {
        if b.len() < HEAD || b[0] != 1 {
            return None;
        }
        let kind = Kind::from_u8(b[1])?;
        let (pl, tl) = (u16_at(b, 56) as usize, u16_at(b, 58) as usize);
        if b.len() != HEAD + pl + tl {
            return None;
        }
        Some(NsEvent {
            kind,
            is_dir: b[2] & 1 != 0,
            replaced: b[2] & 2 != 0,
            node: u32_at(b, 4),
            cookie: u32_at(b, 8),
            size: u64_at(b, 16),
            time_ns: u64_at(b, 24) as i64,
            seq: u64_at(b, 32),
            holder: u32_at(b, 12),
            id: u64_at(b, 40),
            sum: u64_at(b, 48),
            path: b[HEAD..HEAD + pl].to_vec(),
            to: b[HEAD + pl..].to_vec(),
        })
    }

    /// The directories whose listings the event changes (one, or two for a
    /// rename across directories).
    pub fn dirs(&self) -> (&[u8], Option<&[u8]>) {
        let d1 = parent(&self.path).0;
        match self.kind {
            Kind::Rename => {
                let d2 = parent(&self.to).0;
                (d1, (d2 != d1).then_some(d2))
            }
            _ => (d1, None),
        }
    }

    /// Does a watch on `w` (recursive or not) see this event at all? (Its
    /// directory, one of its directories' ancestors when recursive, or the
    /// object itself.)
    pub fn concerns(&self, w: &[u8], recursive: bool) -> bool {
        let (d1, d2) = self.dirs();
        let covers = |d: &[u8]| d == w || (recursive && below(d, w));
        covers(d1) || d2.is_some_and(covers) || self.path == w || (!self.to.is_empty() && self.to == w)
    }
}

/// (directory, name) of a relative path; the directory of a top-level name is "".
pub fn parent(path: &[u8]) -> (&[u8], &[u8]) {
    match path.iter().rposition(|&b| b == b'/') {
        Some(i) => (&path[..i], &path[i + 1..]),
        None => (&[], path),
    }
}

/// Is `path` strictly below directory `dir` ("" is the root)?
pub fn below(path: &[u8], dir: &[u8]) -> bool {
    if dir.is_empty() {
        return !path.is_empty();
    }
    path.len() > dir.len() && path.starts_with(dir) && path[dir.len()] == b'/'
}

/// The name of `path` as seen from watched directory `w`: relative to it.
fn name_in(path: &[u8], w: &[u8]) -> Vec<u8> {
    if w.is_empty() {
        path.to_vec()
    } else {
        path[w.len() + 1..].to_vec()
    }
}

/// One inotify record for a watch: mask, cookie, name ("" for the watched
/// object itself).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rec {
    pub mask: u32,
    pub cookie: u32,
    pub name: Vec<u8>,
}

/// The inotify records a watch on `w` with `mask` gets for `ev`, in order,
/// as inotify(7) describes them for the same change on a local file system
/// (a commit is a create (when new), a modification (when not empty) and a
/// close-for-writing; a new version of a watched file is a new inode:
/// IN_ATTRIB on the file itself first, then IN_MODIFY). Returns
/// true when the watch ends (the watched object was deleted: IN_IGNORED is
/// the last record, whatever the mask).
pub fn inotify_records(ev: &NsEvent, w: &[u8], mask: u32, recursive: bool, out: &mut Vec<Rec>) -> bool {
    let dirbit = if ev.is_dir { IN_ISDIR } else { 0 };
    let start = out.len();
    let mut push = |m: u32, cookie: u32, name: Vec<u8>| {
        if m & mask & IN_ALL_EVENTS != 0 {
            out.push(Rec { mask: m | dirbit, cookie, name });
        }
    };
    let (d1, _) = parent(&ev.path);
    let covers = |d: &[u8]| d == w || (recursive && below(d, w));
    let mut ends = false;
    // The object itself.
    if ev.path == w {
        match ev.kind {
            Kind::Close => {
                if ev.replaced {
                    push(IN_ATTRIB, 0, Vec::new());
                }
                if ev.size > 0 {
                    push(IN_MODIFY, 0, Vec::new());
                }
                push(IN_CLOSE_WRITE, 0, Vec::new());
            }
            Kind::Delete => {
                push(IN_ATTRIB, 0, Vec::new());
                push(IN_DELETE_SELF, 0, Vec::new());
                ends = true;
            }
            Kind::Rmdir => {
                push(IN_DELETE_SELF, 0, Vec::new());
                ends = true;
            }
            Kind::Rename => push(IN_MOVE_SELF, 0, Vec::new()),
            Kind::Mkdir => {}
        }
    }
    if ev.kind == Kind::Rename && ev.to == w && ev.replaced {
        // The file watched by this name was replaced by the one moved here.
        push(IN_ATTRIB, 0, Vec::new());
    }
    // Its directory (or, recursively, an ancestor).
    if covers(d1) {
        let name = name_in(&ev.path, w);
        match ev.kind {
            Kind::Close => {
                if !ev.replaced {
                    push(IN_CREATE, 0, name.clone());
                }
                if ev.size > 0 {
                    push(IN_MODIFY, 0, name.clone());
                }
                push(IN_CLOSE_WRITE, 0, name);
            }
            Kind::Delete | Kind::Rmdir => push(IN_DELETE, 0, name),
            Kind::Mkdir => push(IN_CREATE, 0, name),
            Kind::Rename => push(IN_MOVED_FROM, ev.cookie, name),
        }
    }
    if ev.kind == Kind::Rename && covers(parent(&ev.to).0) {
        push(IN_MOVED_TO, ev.cookie, name_in(&ev.to, w));
    }
    if ends {
        out.push(Rec { mask: IN_IGNORED, cookie: 0, name: Vec::new() });
    }
    // IN_ONESHOT: the first event ends the watch.
    if !ends && mask & IN_ONESHOT != 0 && out.len() > start {
        out.push(Rec { mask: IN_IGNORED, cookie: 0, name: Vec::new() });
        ends = true;
    }
    ends
}

/// Size of `struct inotify_event` without its name.
pub const INOTIFY_HEAD: usize = 16;

/// Appends one `struct inotify_event` (native endianness, as the kernel
/// writes it): the name NUL-terminated and padded to a multiple of 16 bytes,
/// no name (len 0) for the watched object itself.
pub fn push_inotify(b: &mut Vec<u8>, wd: i32, r: &Rec) {
    let len = if r.name.is_empty() { 0 } else { (r.name.len() + 1).div_ceil(INOTIFY_HEAD) * INOTIFY_HEAD };
    b.extend_from_slice(&wd.to_ne_bytes());
    b.extend_from_slice(&r.mask.to_ne_bytes());
    b.extend_from_slice(&r.cookie.to_ne_bytes());
    b.extend_from_slice(&(len as u32).to_ne_bytes());
    b.extend_from_slice(&r.name);
    b.resize(b.len() + len - r.name.len(), 0);
}

/// Splits a buffer of kernel `struct inotify_event` records into whole
/// records (a malformed tail is dropped).
pub fn split_inotify(mut b: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    while b.len() >= INOTIFY_HEAD {
        let len = u32::from_ne_bytes([b[12], b[13], b[14], b[15]]) as usize;
        let Some(end) = INOTIFY_HEAD.checked_add(len).filter(|&e| e <= b.len()) else { break };
        out.push(&b[..end]);
        b = &b[end..];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(kind: Kind, path: &str, to: &str) -> NsEvent {
        NsEvent {
            kind,
            is_dir: false,
            replaced: false,
            node: 2,
            cookie: 9,
            size: 5,
            time_ns: -3,
            seq: 7,
            holder: 1,
            id: 77,
            sum: 0xfeed,
            path: path.as_bytes().to_vec(),
            to: to.as_bytes().to_vec(),
        }
    }

    fn recs(e: &NsEvent, w: &str, mask: u32, rec: bool) -> (Vec<(u32, u32, String)>, bool) {
        let mut out = Vec::new();
        let ends = inotify_records(e, w.as_bytes(), mask, rec, &mut out);
        (out.into_iter().map(|r| (r.mask, r.cookie, String::from_utf8(r.name).unwrap())).collect(), ends)
    }

    #[test]
    fn round_trip_and_bad_input() {
        let mut e = ev(Kind::Rename, "ck/a.tmp", "ck/a");
        e.replaced = true;
        e.is_dir = true;
        let b = e.encode();
        assert_eq!(NsEvent::decode(&b), Some(e));
        assert_eq!(NsEvent::decode(&b[..b.len() - 1]), None, "truncated");
        let mut bad = b.clone();
        bad[1] = 99;
        assert_eq!(NsEvent::decode(&bad), None, "unknown kind");
        assert_eq!(NsEvent::decode(&[1u8; 10]), None);
    }

    #[test]
    fn directory_watch_sees_create_close_and_moves() {
        let all = IN_ALL_EVENTS;
        let (r, ends) = recs(&ev(Kind::Close, "ck/a", ""), "ck", all, false);
        assert_eq!(r, vec![(IN_CREATE, 0, "a".into()), (IN_MODIFY, 0, "a".into()), (IN_CLOSE_WRITE, 0, "a".into())]);
        assert!(!ends);
        let mut again = ev(Kind::Close, "ck/a", "");
        again.replaced = true;
        assert_eq!(recs(&again, "ck", all, false).0, vec![(IN_MODIFY, 0, "a".into()), (IN_CLOSE_WRITE, 0, "a".into())]);
        again.size = 0;
        assert_eq!(recs(&again, "ck", all, false).0, vec![(IN_CLOSE_WRITE, 0, "a".into())], "empty: no IN_MODIFY");
        let (r, _) = recs(&ev(Kind::Rename, "ck/a.tmp", "ck/a"), "ck", all, false);
        assert_eq!(r, vec![(IN_MOVED_FROM, 9, "a.tmp".into()), (IN_MOVED_TO, 9, "a".into())]);
        let (r, _) = recs(&ev(Kind::Rename, "tmp/a", "ck/a"), "ck", all, false);
        assert_eq!(r, vec![(IN_MOVED_TO, 9, "a".into())], "only the side this directory holds");
        assert_eq!(recs(&ev(Kind::Close, "ck/sub/a", ""), "ck", all, false).0, vec![], "not recursive");
        let (r, _) = recs(&ev(Kind::Close, "ck/sub/a", ""), "ck", all, true);
        assert_eq!(r[2], (IN_CLOSE_WRITE, 0, "sub/a".into()));
        let (r, _) = recs(&ev(Kind::Close, "a", ""), "", all, false);
        assert_eq!(r[0], (IN_CREATE, 0, "a".into()), "the mount root");
        let mut d = ev(Kind::Mkdir, "ck/d", "");
        d.is_dir = true;
        assert_eq!(recs(&d, "ck", all, false).0, vec![(IN_CREATE | IN_ISDIR, 0, "d".into())]);
        assert_eq!(recs(&d, "ck", IN_CLOSE_WRITE, false).0, vec![], "masked out");
    }

    #[test]
    fn the_watched_object_itself() {
        let all = IN_ALL_EVENTS;
        let (r, ends) = recs(&ev(Kind::Delete, "ck/a", ""), "ck/a", all, false);
        assert_eq!(r, vec![(IN_ATTRIB, 0, "".into()), (IN_DELETE_SELF, 0, "".into()), (IN_IGNORED, 0, "".into())]);
        assert!(ends);
        let (r, ends) = recs(&ev(Kind::Delete, "ck/a", ""), "ck/a", IN_MODIFY, false);
        assert_eq!(r, vec![(IN_IGNORED, 0, "".into())], "IN_IGNORED whatever the mask");
        assert!(ends);
        let mut d = ev(Kind::Rmdir, "ck", "");
        d.is_dir = true;
        let (r, ends) = recs(&d, "ck", all, false);
        assert_eq!(r, vec![(IN_DELETE_SELF | IN_ISDIR, 0, "".into()), (IN_IGNORED, 0, "".into())]);
        assert!(ends);
        let mut v = ev(Kind::Close, "log", "");
        v.replaced = true;
        assert_eq!(recs(&v, "log", all, false).0, vec![(IN_ATTRIB, 0, "".into()), (IN_MODIFY, 0, "".into()), (IN_CLOSE_WRITE, 0, "".into())]);
        let (r, ends) = recs(&ev(Kind::Close, "ck/a", ""), "ck", all | IN_ONESHOT, false);
        assert_eq!(r.last(), Some(&(IN_IGNORED, 0, "".into())));
        assert!(ends);
    }

    #[test]
    fn concerns_and_records() {
        let e = ev(Kind::Rename, "a/x", "b/c/y");
        assert!(e.concerns(b"a", false) && e.concerns(b"b/c", false) && e.concerns(b"b", true) && e.concerns(b"", true));
        assert!(!e.concerns(b"b", false) && !e.concerns(b"ab", true));
        assert!(e.concerns(b"a/x", false), "the object itself");
        let mut b = Vec::new();
        push_inotify(&mut b, 5, &Rec { mask: IN_CREATE, cookie: 0, name: b"abc".to_vec() });
        push_inotify(&mut b, 6, &Rec { mask: IN_IGNORED, cookie: 0, name: Vec::new() });
        assert_eq!(b.len(), 16 + 16 + 16);
        let parts = split_inotify(&b);
        assert_eq!(parts.len(), 2);
        assert_eq!(&parts[0][16..19], b"abc");
        assert_eq!(split_inotify(&b[..40]).len(), 1, "a cut record is dropped");
        assert!(below(b"a/b", b"a") && !below(b"a", b"a") && below(b"a", b"") && !below(b"", b""));
    }
}
