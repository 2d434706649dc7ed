//! Virtual directory streams. A `DIR *` we hand out points at a [`VDir`],
//! recognised by its magic (a glibc DIR starts with its fd, a non-negative
//! int, so the magic's low half, negative as an int, can never match).
//! Entries: ".", "..", then the children in index order (sorted by name).

use crate::ops::stat::ino;
use crate::ops::Node;
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
    ent: libc::dirent64,
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
    }

    /// The next entry, written into the stream's own dirent (valid until the next call).
    pub fn next(&mut self, st: &State) -> Option<&mut libc::dirent64> {
        let dir = st.view.node(self.node)?;
        let e = if self.pos < 2 {
            entry_at(st, &dir, self.pos)?
        } else {
            let skip = (self.pos - 2) as usize;
            let it = self.iter.get_or_insert_with(|| Box::new(st.view.children(dir).skip(skip)));
            let c = it.next()?;
            DirEnt { ino: ino(c.id()), dtype: dtype(&c), name: c.name() }
        };
        self.pos += 1;
        fill_dirent(&mut self.ent, &e, self.pos);
        Some(&mut self.ent)
    }
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
