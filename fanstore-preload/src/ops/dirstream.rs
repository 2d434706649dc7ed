//! Virtual directory streams. A `DIR *` we hand out points at a [`VDir`],
//! recognised by its magic (a glibc DIR starts with its fd, a non-negative
//! int, so the magic's low half, negative as an int, can never match).
//! Entries: ".", "..", then the children in index order (sorted by name),
//! then the outputs listed in that directory (asked of the daemon once per
//! stream, when the input children are exhausted). An output directory's
//! stream (node id with [`crate::outputs::OUT_DIR`]) has only outputs.

use super::stat::ino;
use super::{namespace, resolve, Node};
use crate::state::State;
use fanstore_core::manifest::NodeKind;

const MAGIC: u64 = 0xf5f5_f5f5_8bad_f00d;

type Children = Box<dyn Iterator<Item = Node>>;

#[repr(C)]
pub struct VDir {
    magic: u64,
    pub fd: libc::c_int,
    pub node: u32,
    /// Index of the next entry: 0 ".", 1 "..", 2.. children.
    pub pos: u64,
    iter: Option<Children>,
    /// Input children count, once the input entries are exhausted.
    nkids: Option<u64>,
    /// Output entries (inode, d_type, name), loaded on first need.
    outs: Option<Vec<(u64, u8, Vec<u8>)>>,
    ent: libc::dirent64,
}

/// The output entries of directory `node` (input node or output dir slot).
/// None, with no message, for an input directory in which no output was
/// ever listed ([`namespace::may_list_outputs`]).
fn load_outs(st: &State, node: u32) -> Vec<(u64, u8, Vec<u8>)> {
    if node & crate::outputs::OUT_DIR == 0 && !namespace::may_list_outputs(st, node) {
        return Vec::new();
    }
    let mut buf = [0u8; fanstore_core::path::MAX_PATH];
    let rel: &[u8] = if node & crate::outputs::OUT_DIR != 0 {
        match crate::outputs::path_into(node, &mut buf) {
            Some(n) => &buf[..n],
            None => return Vec::new(),
        }
    } else {
        match st.view.node(node) {
            Some(n) => n.path(),
            None => return Vec::new(),
        }
    };
    let list = namespace::list(st, rel).unwrap_or_default();
    list.into_iter()
        .filter(|(_, name)| node & crate::outputs::OUT_DIR != 0 || st.view.lookup(&join(rel, name)).is_none())
        .map(|(k, name)| {
            let ino = namespace::ino(&join(rel, &name));
            let t = match k {
                fanstore_core::wire::KIND_DIR => libc::DT_DIR,
                fanstore_core::wire::KIND_LINK => libc::DT_LNK,
                fanstore_core::wire::KIND_FIFO => libc::DT_FIFO,
                fanstore_core::wire::KIND_SOCK => libc::DT_SOCK,
                fanstore_core::wire::KIND_CHR => libc::DT_CHR,
                fanstore_core::wire::KIND_BLK => libc::DT_BLK,
                _ => libc::DT_REG,
            };
            (ino, t, name)
        })
        .collect()
}

fn join(dir: &[u8], name: &[u8]) -> Vec<u8> {
    let mut p = Vec::with_capacity(dir.len() + 1 + name.len());
    if !dir.is_empty() {
        p.extend_from_slice(dir);
        p.push(b'/');
    }
    p.extend_from_slice(name);
    p
}

/// One directory entry as readdir/getdents64 report it.
pub struct DirEnt<'a> {
    pub ino: u64,
    pub dtype: u8,
    pub name: &'a [u8],
}

pub fn dtype(n: &Node) -> u8 {
    match n.kind() {
        Some(NodeKind::Dir) => libc::DT_DIR,
        Some(NodeKind::File) => libc::DT_REG,
        Some(NodeKind::Symlink) => libc::DT_LNK,
        None => libc::DT_UNKNOWN,
    }
}

/// Entry `pos` of directory `dir` without an iterator (O(pos)): for getdents64 and seekdir.
pub fn entry_at(st: &State, dir: &Node, pos: u64) -> Option<DirEnt<'static>> {
    match pos {
        0 => Some(DirEnt { ino: ino(dir.id()), dtype: libc::DT_DIR, name: b"." }),
        1 => Some(DirEnt { ino: ino(dir.parent()), dtype: libc::DT_DIR, name: b".." }),
        p => st.view.children(*dir).nth((p - 2) as usize).map(|c| DirEnt { ino: ino(c.id()), dtype: dtype(&c), name: c.name() }),
    }
}

impl VDir {
    pub fn new(fd: libc::c_int, node: u32) -> Box<VDir> {
        Box::new(VDir {
            magic: MAGIC,
            fd,
            node,
            pos: 0,
            iter: None,
            nkids: None,
            outs: None,
            // SAFETY: dirent64 is plain data; zero is valid.
            ent: unsafe { std::mem::zeroed() },
        })
    }

    /// Is `p` one of ours?
    ///
    /// # Safety
    /// `p` is null or a live `DIR *` (ours or glibc's, both at least 8 bytes).
    #[inline]
    pub unsafe fn is_ours(p: *const libc::c_void) -> bool {
        // SAFETY: per the contract at least 8 readable bytes.
        !p.is_null() && unsafe { std::ptr::read_unaligned(p as *const u64) } == MAGIC
    }

    pub fn seek(&mut self, pos: u64) {
        self.pos = pos;
        self.iter = None;
        self.nkids = None;
    }

    /// The next entry, written into the stream's own dirent (valid until the next call).
    pub fn next(&mut self, st: &State) -> Option<&mut libc::dirent64> {
        let out_dir = self.node & crate::outputs::OUT_DIR != 0;
        if out_dir {
            self.nkids = Some(0);
        }
        if self.pos < 2 {
            let e = if out_dir {
                DirEnt { ino: out_dir_ino(st, self.node, self.pos == 1), dtype: libc::DT_DIR, name: if self.pos == 0 { b"." } else { b".." } }
            } else {
                entry_at(st, &st.view.node(self.node)?, self.pos)?
            };
            self.pos += 1;
            fill_dirent(&mut self.ent, &e, self.pos);
            return Some(&mut self.ent);
        }
        if self.nkids.is_none() {
            let dir = st.view.node(self.node)?;
            let skip = (self.pos - 2) as usize;
            let it = self.iter.get_or_insert_with(|| Box::new(st.view.children(dir).skip(skip)));
            if let Some(c) = it.next() {
                let e = DirEnt { ino: ino(c.id()), dtype: dtype(&c), name: c.name() };
                self.pos += 1;
                fill_dirent(&mut self.ent, &e, self.pos);
                return Some(&mut self.ent);
            }
            self.nkids = Some(st.view.children(dir).count() as u64);
        }
        let kids = self.nkids.unwrap_or(0);
        let node = self.node;
        let outs = self.outs.get_or_insert_with(|| load_outs(st, node));
        let i = (self.pos - 2).checked_sub(kids)? as usize;
        let (ino, dtype, name) = outs.get(i)?;
        self.pos += 1;
        fill_dirent(&mut self.ent, &DirEnt { ino: *ino, dtype: *dtype, name }, self.pos);
        Some(&mut self.ent)
    }
}

/// The inode number `stat` gives output directory slot `node` (or its
/// parent, an input or output directory), for its `.` and `..` entries.
fn out_dir_ino(st: &State, node: u32, parent: bool) -> u64 {
    let mut buf = [0u8; fanstore_core::path::MAX_PATH];
    let Some(n) = crate::outputs::path_into(node, &mut buf) else { return 1 };
    let mut rel = &buf[..n];
    if parent {
        rel = &rel[..rel.iter().rposition(|&b| b == b'/').unwrap_or(0)];
        if let Ok(d) = resolve(st, rel, true, true) {
            return ino(d.id());
        }
    }
    namespace::ino(rel)
}

/// Fills a dirent64 (d_name truncated to 255 bytes, NUL-terminated).
pub fn fill_dirent(d: &mut libc::dirent64, e: &DirEnt, next_pos: u64) {
    let n = e.name.len().min(255);
    d.d_ino = e.ino;
    d.d_off = next_pos as i64;
    d.d_type = e.dtype;
    for (dst, &b) in d.d_name.iter_mut().zip(&e.name[..n]) {
        *dst = b as libc::c_char;
    }
    d.d_name[n] = 0;
    d.d_reclen = reclen(n) as u16;
}

/// Record length of a linux_dirent64 with a name of `n` bytes, 8-aligned.
pub fn reclen(n: usize) -> usize {
    (19 + n + 1 + 7) & !7
}
