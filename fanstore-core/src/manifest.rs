//! The manifest: the whole namespace in one file, laid out so that it *is*
//! the read-only index. The daemon copies it into shared memory and every
//! client maps it; lookups run on the mapped bytes with no parsing step and
//! no per-file heap objects.
//!
//! All integers are little-endian. Sections are 8-byte aligned and each has
//! its own xxh3 in the header, so a fault is named by section and offset.
//! The header's frame (magic, version, checksum) is checked by
//! [`crate::format`].
//!
//! ```text
//! header (HEADER_LEN = 184 bytes)
//!   0..8     magic "FANSTMF\0"
//!   8..12    version (1)
//!  12..16    header length (184)
//!  16..24    dataset id (also in every partition header)
//!  24..32    node count N (node 0 is the root directory)
//!  32..40    child count C (length of the children array)
//!  40..44    partition count P
//!  44..48    bucket count B (a power of two)
//!  48..56    total logical bytes of all files
//!  56..176   section table: 5 x { offset u64, length u64, xxh3 u64 }
//!            in order: nodes, children, buckets, partitions, strings
//! 176..184   xxh3 of header bytes 0..176
//!
//! nodes:      N x 96-byte node records, in depth-first order with the
//!             entries of each directory sorted by name bytes
//!   0 kind u8 (1 dir, 2 file, 3 symlink)   1 codec u8   2 flags u8 (bit 0 replicated)
//!   3 reserved u8   4 mode u32 (st_mode with type bits)   8 parent u32
//!  12 name_len u32 (the name is the last name_len bytes of the path)
//!  16 path_off u64 (into strings)   24 path_len u32
//!  28 dir: child count | file: partition id | symlink: 0
//!  32 size u64 (file: logical bytes; symlink: target length; dir: 0)
//!  40 dir: first child index | file: payload offset | symlink: target offset in strings
//!  48 stored_len u64 (file)   56 payload xxh3 u64 (file)
//!  64 mtime_ns i64   72 atime_ns i64   80 ctime_ns i64
//!  88 nlink u32   92 reserved u32
//! children:   C x u32 node ids; a directory's children are contiguous, sorted by name
//! buckets:    B x u64, open addressing with linear probing on xxh3(path):
//!             (hash >> 32) << 32 | (node id + 1); 0 is an empty bucket
//! partitions: P x 64-byte records
//!   0 id u32   4 flags u32   8 file length u64   16 entry count u64
//!  24 logical bytes u64   32 partition header xxh3 u64   40..64 reserved
//! strings:    node paths (relative to the dataset root, no leading '/',
//!             the root's path is empty) and symlink targets, as raw bytes
//! ```

use crate::checksum::xxh3;
use crate::codec::Codec;
use crate::error::{FormatError, Result};
use crate::format::{self, FormatHeader, HeaderVersion};
use crate::le::*;
use std::io::{Seek, SeekFrom, Write};
use std::path::Path;

pub const MAGIC: [u8; 8] = *b"FANSTMF\0";
pub const VERSION: u32 = 1;
/// The manifest's file name inside a dataset directory.
pub const FILE_NAME: &str = "manifest.fsm";

const SECTION_ENTRY_LEN: usize = 24;
const SECTION_COUNT: usize = 5;
format::layout! {
    format::FIELDS_OFFSET;
    HEADER_LEN_OFF: 4, DATASET_OFF: 8, NODE_COUNT_OFF: 8, CHILD_COUNT_OFF: 8, PART_COUNT_OFF: 4,
    BUCKET_COUNT_OFF: 4, TOTAL_BYTES_OFF: 8, SECTIONS_OFF: SECTION_COUNT * SECTION_ENTRY_LEN,
    HEADER_SUM_OFF: format::CHECKSUM_LEN =>
    /// Length of the manifest header.
    pub HEADER_LEN
}

/// The manifest header's frame.
pub const HEADER: FormatHeader =
    FormatHeader { what: "manifest", magic: MAGIC, versions: &[HeaderVersion { version: VERSION, len: HEADER_LEN }] };

const SECTION_NAMES: [&str; SECTION_COUNT] = ["nodes", "children", "buckets", "partitions", "strings"];
const S_NODES: usize = 0;
const S_CHILDREN: usize = 1;
const S_BUCKETS: usize = 2;
const S_PARTS: usize = 3;
const S_STRINGS: usize = 4;

format::layout! {
    0;
    N_KIND: 1, N_CODEC: 1, N_FLAGS: 2, N_MODE: 4, N_PARENT: 4, N_NAME_LEN: 4, N_PATH_OFF: 8, N_PATH_LEN:
    4, N_AUX32: 4, N_SIZE: 8, N_LOC: 8, N_STORED: 8, N_SUM: 8, N_MTIME: 8, N_ATIME: 8, N_CTIME: 8,
    N_NLINK: 8 =>
    /// Length of one node record.
    pub NODE_LEN
}

format::layout! {
    0;
    P_ID: 4, P_FLAGS: 4, P_FILE_LEN: 8, P_ENTRIES: 8, P_BYTES: 8, P_HEADER_SUM: 8, P_RESERVED: 24 =>
    /// Length of one partition record.
    pub PART_LEN
}

/// Node flag: the file lives in a partition that every node loads.
pub const NODE_FLAG_REPLICATED: u8 = 1;

format::coded_enum! {
    /// What a node is.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum NodeKind: u8, from_u8 {
        Dir = 1,
        File = 2,
        Symlink = 3,
    }
}

/// How much of a manifest to check when opening it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verify {
    /// Header checksum and section bounds only: for clients mapping an index
    /// the daemon has already verified.
    Header,
    /// Every section checksum and every node's references.
    Full,
}

/// A partition as the manifest records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionInfo {
    pub id: u32,
    pub flags: u32,
    pub file_len: u64,
    pub entry_count: u64,
    pub logical_bytes: u64,
    pub header_checksum: u64,
}

impl PartitionInfo {
    pub fn replicated(&self) -> bool {
        self.flags & crate::partition::FLAG_REPLICATED != 0
    }
}

/// A read-only view of a manifest's bytes (a file, or the shared-memory index).
#[derive(Clone, Copy)]
pub struct IndexView<'a> {
    dataset_id: u64,
    node_count: u32,
    part_count: u32,
    bucket_mask: u64,
    total_bytes: u64,
    nodes: &'a [u8],
    children: &'a [u8],
    buckets: &'a [u8],
    parts: &'a [u8],
    strings: &'a [u8],
}

/// One node of the index.
#[derive(Clone, Copy)]
pub struct NodeRef<'a> {
    id: u32,
    rec: &'a [u8],
    strings: &'a [u8],
}

impl<'a> IndexView<'a> {
    /// Opens a view over `bytes`, which came from `file` (named in errors).
    pub fn parse(file: &Path, bytes: &'a [u8], verify: Verify) -> Result<IndexView<'a>> {
        let corrupt = |entry: &str, offset: u64, problem: String| FormatError::Corrupt {
            file: file.into(),
            entry: entry.into(),
            offset,
            problem,
        };
        HEADER.check(file, bytes)?;
        if u32_at(bytes, HEADER_LEN_OFF) as usize != HEADER_LEN {
            return Err(corrupt("manifest header", HEADER_LEN_OFF as u64, "unexpected header length".into()));
        }
        let node_count = u64_at(bytes, NODE_COUNT_OFF);
        let child_count = u64_at(bytes, CHILD_COUNT_OFF);
        let part_count = u32_at(bytes, PART_COUNT_OFF);
        let bucket_count = u32_at(bytes, BUCKET_COUNT_OFF) as u64;
        if node_count == 0 || node_count > u32::MAX as u64 - 1 || !bucket_count.is_power_of_two() || bucket_count < node_count
        {
            return Err(corrupt("manifest header", NODE_COUNT_OFF as u64, "inconsistent counts".into()));
        }
        // A crafted child count must not wrap into a length that matches.
        let children_len = child_count
            .checked_mul(4)
            .ok_or_else(|| corrupt("manifest header", CHILD_COUNT_OFF as u64, "inconsistent counts".into()))?;
        let expected_len = [
            node_count * NODE_LEN as u64,
            children_len,
            bucket_count * 8,
            part_count as u64 * PART_LEN as u64,
            u64::MAX,
        ];
        let mut secs: [&[u8]; SECTION_COUNT] = [&[]; SECTION_COUNT];
        for (i, sec) in secs.iter_mut().enumerate() {
            let e = SECTIONS_OFF + i * SECTION_ENTRY_LEN;
            let (off, len, sum) = (u64_at(bytes, e), u64_at(bytes, e + 8), u64_at(bytes, e + 16));
            let name = SECTION_NAMES[i];
            if expected_len[i] != u64::MAX && len != expected_len[i] {
                return Err(corrupt(&format!("{name} section"), off, format!("length {len}, expected {}", expected_len[i])));
            }
            let end = off.checked_add(len).filter(|&end| end <= bytes.len() as u64 && off >= HEADER_LEN as u64);
            let Some(end) = end else {
                return Err(FormatError::Truncated {
                    file: file.into(),
                    entry: format!("{name} section"),
                    offset: off,
                    needed: len,
                    len: bytes.len() as u64,
                });
            };
            *sec = &bytes[off as usize..end as usize];
            if verify == Verify::Full {
                FormatError::check_xxh3(file, || format!("{name} section"), off, sec, sum)?;
            }
        }
        let view = IndexView {
            dataset_id: u64_at(bytes, DATASET_OFF),
            node_count: node_count as u32,
            part_count,
            bucket_mask: bucket_count - 1,
            total_bytes: u64_at(bytes, TOTAL_BYTES_OFF),
            nodes: secs[S_NODES],
            children: secs[S_CHILDREN],
            buckets: secs[S_BUCKETS],
            parts: secs[S_PARTS],
            strings: secs[S_STRINGS],
        };
        if verify == Verify::Full {
            view.check_structure(file)?;
        }
        Ok(view)
    }

    /// Checks every node's references so that no accessor can go astray.
    fn check_structure(&self, file: &Path) -> Result<()> {
        let nodes_off = HEADER_LEN as u64;
        let bad = |id: u32, problem: String| FormatError::Corrupt {
            file: file.into(),
            entry: format!("node {id}"),
            offset: nodes_off + id as u64 * NODE_LEN as u64,
            problem,
        };
        for id in 0..self.node_count {
            let n = self.node_unchecked(id);
            let rec = n.rec;
            let kind = NodeKind::from_u8(rec[N_KIND]).ok_or_else(|| bad(id, format!("unknown kind {}", rec[N_KIND])))?;
            let (po, pl, nl) = (u64_at(rec, N_PATH_OFF), u32_at(rec, N_PATH_LEN) as u64, u32_at(rec, N_NAME_LEN) as u64);
            if po.checked_add(pl).is_none_or(|e| e > self.strings.len() as u64) || nl > pl {
                return Err(bad(id, "path outside the string table".into()));
            }
            if (id == 0) != (kind == NodeKind::Dir && pl == 0) {
                return Err(bad(id, "node 0 must be the root directory, and only it has an empty path".into()));
            }
            if u32_at(rec, N_PARENT) >= self.node_count {
                return Err(bad(id, "parent out of range".into()));
            }
            match kind {
                NodeKind::Dir => {
                    let (first, count) = (u64_at(rec, N_LOC), u32_at(rec, N_AUX32) as u64);
                    if first.checked_add(count).is_none_or(|e| e > self.children.len() as u64 / 4) {
                        return Err(bad(id, "children outside the children array".into()));
                    }
                    for i in first..first + count {
                        if u32_at(self.children, i as usize * 4) >= self.node_count {
                            return Err(bad(id, format!("child {i} out of range")));
                        }
                    }
                }
                NodeKind::File => {
                    if Codec::from_u8(rec[N_CODEC]).is_none() {
                        return Err(bad(id, format!("unknown codec {}", rec[N_CODEC])));
                    }
                    if u32_at(rec, N_AUX32) >= self.part_count {
                        return Err(bad(id, "partition out of range".into()));
                    }
                }
                NodeKind::Symlink => {
                    let (to, tl) = (u64_at(rec, N_LOC), u64_at(rec, N_SIZE));
                    if to.checked_add(tl).is_none_or(|e| e > self.strings.len() as u64) {
                        return Err(bad(id, "symlink target outside the string table".into()));
                    }
                }
            }
        }
        Ok(())
    }

    pub fn dataset_id(&self) -> u64 {
        self.dataset_id
    }
    pub fn node_count(&self) -> u32 {
        self.node_count
    }
    pub fn total_bytes(&self) -> u64 {
        self.total_bytes
    }
    pub fn partition_count(&self) -> u32 {
        self.part_count
    }

    fn node_unchecked(&self, id: u32) -> NodeRef<'a> {
        let s = id as usize * NODE_LEN;
        NodeRef { id, rec: &self.nodes[s..s + NODE_LEN], strings: self.strings }
    }

    /// The node with this id, if it exists.
    #[inline]
    pub fn node(&self, id: u32) -> Option<NodeRef<'a>> {
        (id < self.node_count).then(|| self.node_unchecked(id))
    }

    /// The root directory (the mount point).
    pub fn root(&self) -> NodeRef<'a> {
        self.node_unchecked(0)
    }

    /// Looks up a normalised path relative to the dataset root (`""` is the root).
    #[inline]
    pub fn lookup(&self, path: &[u8]) -> Option<NodeRef<'a>> {
        let h = xxh3(path);
        let tag = h >> 32;
        let mut i = h & self.bucket_mask;
        loop {
            let b = u64_at(self.buckets, i as usize * 8);
            if b == 0 {
                return None;
            }
            if b >> 32 == tag {
                let id = (b & 0xffff_ffff) as u32;
                if let Some(n) = id.checked_sub(1).and_then(|id| self.node(id)) {
                    if n.path() == path {
                        return Some(n);
                    }
                }
            }
            i = (i + 1) & self.bucket_mask;
        }
    }

    /// The entries of a directory, sorted by name.
    pub fn children(&self, dir: NodeRef<'a>) -> impl ExactSizeIterator<Item = NodeRef<'a>> + 'a {
        let (first, count) = if dir.kind() == Some(NodeKind::Dir) {
            (dir.loc() as usize, dir.aux32() as usize)
        } else {
            (0, 0)
        };
        let this = *self;
        let ids = self.children.get(first * 4..(first + count) * 4).unwrap_or(&[]);
        ids.chunks_exact(4).map(move |c| {
            let id = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            this.node(id).unwrap_or_else(|| this.root())
        })
    }

    /// The entry `name` of directory `dir` (binary search).
    pub fn child(&self, dir: NodeRef<'a>, name: &[u8]) -> Option<NodeRef<'a>> {
        let (first, count) = if dir.kind() == Some(NodeKind::Dir) {
            (dir.loc() as usize, dir.aux32() as usize)
        } else {
            return None;
        };
        let (mut lo, mut hi) = (0usize, count);
        while lo < hi {
            let mid = (lo + hi) / 2;
            let id = u32_at(self.children.get((first + mid) * 4..(first + mid + 1) * 4)?, 0);
            let n = self.node(id)?;
            match n.name().cmp(name) {
                std::cmp::Ordering::Equal => return Some(n),
                std::cmp::Ordering::Less => lo = mid + 1,
                std::cmp::Ordering::Greater => hi = mid,
            }
        }
        None
    }

    /// Partition `i` (0-based position in the table).
    pub fn partition(&self, i: u32) -> Option<PartitionInfo> {
        let s = i as usize * PART_LEN;
        let r = self.parts.get(s..s + PART_LEN)?;
        Some(PartitionInfo {
            id: u32_at(r, P_ID),
            flags: u32_at(r, P_FLAGS),
            file_len: u64_at(r, P_FILE_LEN),
            entry_count: u64_at(r, P_ENTRIES),
            logical_bytes: u64_at(r, P_BYTES),
            header_checksum: u64_at(r, P_HEADER_SUM),
        })
    }

    pub fn partitions(&self) -> impl Iterator<Item = PartitionInfo> + 'a {
        let this = *self;
        (0..self.part_count).filter_map(move |i| this.partition(i))
    }

    /// Every node, in id order.
    pub fn nodes(&self) -> impl Iterator<Item = NodeRef<'a>> + 'a {
        let this = *self;
        (0..self.node_count).map(move |i| this.node_unchecked(i))
    }
}

impl<'a> NodeRef<'a> {
    pub fn id(&self) -> u32 {
        self.id
    }
    /// `None` only in a manifest that was opened without full verification and is corrupt.
    pub fn kind(&self) -> Option<NodeKind> {
        NodeKind::from_u8(self.rec[N_KIND])
    }
    pub fn is_dir(&self) -> bool {
        self.rec[N_KIND] == NodeKind::Dir as u8
    }
    pub fn codec(&self) -> Codec {
        Codec::from_u8(self.rec[N_CODEC]).unwrap_or(Codec::None)
    }
    pub fn flags(&self) -> u8 {
        self.rec[N_FLAGS]
    }
    /// Full `st_mode`, type bits included.
    pub fn mode(&self) -> u32 {
        u32_at(self.rec, N_MODE)
    }
    pub fn parent(&self) -> u32 {
        u32_at(self.rec, N_PARENT)
    }
    /// Path relative to the dataset root, no leading slash; empty for the root.
    pub fn path(&self) -> &'a [u8] {
        let (o, l) = (u64_at(self.rec, N_PATH_OFF) as usize, u32_at(self.rec, N_PATH_LEN) as usize);
        self.strings.get(o..o.saturating_add(l)).unwrap_or(&[])
    }
    /// The last component of the path.
    pub fn name(&self) -> &'a [u8] {
        let p = self.path();
        let nl = (u32_at(self.rec, N_NAME_LEN) as usize).min(p.len());
        &p[p.len() - nl..]
    }
    fn aux32(&self) -> u32 {
        u32_at(self.rec, N_AUX32)
    }
    fn loc(&self) -> u64 {
        u64_at(self.rec, N_LOC)
    }
    /// Logical size (symlink: target length; directory: 0).
    pub fn size(&self) -> u64 {
        u64_at(self.rec, N_SIZE)
    }
    /// Number of entries of a directory.
    pub fn child_count(&self) -> u32 {
        if self.is_dir() {
            self.aux32()
        } else {
            0
        }
    }
    pub fn partition(&self) -> u32 {
        self.aux32()
    }
    pub fn payload_offset(&self) -> u64 {
        self.loc()
    }
    pub fn stored_len(&self) -> u64 {
        u64_at(self.rec, N_STORED)
    }
    pub fn checksum(&self) -> u64 {
        u64_at(self.rec, N_SUM)
    }
    pub fn mtime_ns(&self) -> i64 {
        i64_at(self.rec, N_MTIME)
    }
    pub fn atime_ns(&self) -> i64 {
        i64_at(self.rec, N_ATIME)
    }
    pub fn ctime_ns(&self) -> i64 {
        i64_at(self.rec, N_CTIME)
    }
    pub fn nlink(&self) -> u32 {
        u32_at(self.rec, N_NLINK)
    }
    /// Target of a symlink (empty for other kinds).
    pub fn symlink_target(&self) -> &'a [u8] {
        if self.rec[N_KIND] != NodeKind::Symlink as u8 {
            return &[];
        }
        let (o, l) = (self.loc() as usize, self.size() as usize);
        self.strings.get(o..o.saturating_add(l)).unwrap_or(&[])
    }
}

/// What a node of a manifest under construction is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BuildKind {
    Dir,
    File { partition: u32, payload_offset: u64, stored_len: u64, codec: Codec, checksum: u64, replicated: bool },
    Symlink { target: Vec<u8> },
}

/// One entry given to [`ManifestBuilder`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuildEntry {
    /// Normalised path relative to the dataset root; `b""` is the root.
    pub path: Vec<u8>,
    /// Permission bits (type bits are derived from `kind`).
    pub perm: u32,
    pub size: u64,
    pub mtime_ns: i64,
    pub atime_ns: i64,
    pub ctime_ns: i64,
    pub kind: BuildKind,
}

/// A fault in the entries given to the builder.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("path '{}': {problem}", String::from_utf8_lossy(.path))]
    BadPath { path: Vec<u8>, problem: &'static str },
    #[error("path '{}' appears twice", String::from_utf8_lossy(.0))]
    Duplicate(Vec<u8>),
    #[error("path '{}' has no parent directory in the manifest", String::from_utf8_lossy(.0))]
    MissingParent(Vec<u8>),
    #[error("too many entries for one manifest")]
    TooLarge,
}

/// Builds manifest bytes from entries given in any order.
pub struct ManifestBuilder {
    dataset_id: u64,
    entries: Vec<BuildEntry>,
    partitions: Vec<PartitionInfo>,
}

/// Longest file name (one component) a manifest accepts.
pub const NAME_MAX: usize = 255;
/// Longest relative path a manifest accepts.
pub const PATH_MAX: usize = 4096;

fn components(p: &[u8]) -> impl Iterator<Item = &[u8]> {
    p.split(|&b| b == b'/').filter(|c| !c.is_empty())
}

impl ManifestBuilder {
    pub fn new(dataset_id: u64) -> ManifestBuilder {
        ManifestBuilder { dataset_id, entries: Vec::new(), partitions: Vec::new() }
    }

    pub fn add(&mut self, e: BuildEntry) {
        self.entries.push(e);
    }

    pub fn add_partition(&mut self, p: PartitionInfo) {
        self.partitions.push(p);
    }

    /// Sorts the entries depth-first by name and returns the manifest bytes
    /// ([`ManifestBuilder::build`], then [`ManifestLayout::write_to`] into memory).
    pub fn finish(self) -> std::result::Result<Vec<u8>, BuildError> {
        let layout = self.build()?;
        let mut out = std::io::Cursor::new(Vec::with_capacity(layout.file_len() as usize));
        layout.write_to(&mut out).expect("writing into a Vec cannot fail");
        Ok(out.into_inner())
    }

    /// Checks the entries, sorts them depth-first by name and lays the
    /// manifest out; [`ManifestLayout::write_to`] then writes it. Only the
    /// children and bucket tables are built in memory: node records and
    /// strings are generated while they are written (for 1.28M files the
    /// whole manifest in memory was 185 MB, written from 430 MB of buffers).
    pub fn build(mut self) -> std::result::Result<ManifestLayout, BuildError> {
        for e in &self.entries {
            let bad = |problem| BuildError::BadPath { path: e.path.clone(), problem };
            if e.path.len() > PATH_MAX {
                return Err(bad("path longer than 4096 bytes"));
            }
            if e.path.first() == Some(&b'/') || e.path.last() == Some(&b'/') || e.path.windows(2).any(|w| w == b"//") {
                return Err(bad("not a normalised relative path"));
            }
            for c in components(&e.path) {
                if c.len() > NAME_MAX {
                    return Err(bad("a name is longer than 255 bytes"));
                }
                if c == b"." || c == b".." || c.contains(&0) {
                    return Err(bad("'.', '..' or NUL in a name"));
                }
            }
            if e.path.is_empty() && e.kind != BuildKind::Dir {
                return Err(bad("the root must be a directory"));
            }
        }
        if !self.entries.iter().any(|e| e.path.is_empty()) {
            self.entries.push(BuildEntry {
                path: Vec::new(),
                perm: 0o755,
                size: 0,
                mtime_ns: 0,
                atime_ns: 0,
                ctime_ns: 0,
                kind: BuildKind::Dir,
            });
        }
        self.entries.sort_by(|a, b| components(&a.path).cmp(components(&b.path)));
        for w in self.entries.windows(2) {
            if w[0].path == w[1].path {
                return Err(BuildError::Duplicate(w[0].path.clone()));
            }
        }
        let n = self.entries.len();
        if n >= u32::MAX as usize - 1 {
            return Err(BuildError::TooLarge);
        }
        // Parents: the nearest preceding directory whose path is our prefix.
        let mut parent = vec![0u32; n];
        {
            let mut dir_ids: std::collections::HashMap<&[u8], u32> = std::collections::HashMap::new();
            for (i, e) in self.entries.iter().enumerate() {
                if i > 0 {
                    let pp = match e.path.iter().rposition(|&b| b == b'/') {
                        Some(k) => &e.path[..k],
                        None => &b""[..],
                    };
                    parent[i] = *dir_ids.get(pp).ok_or_else(|| BuildError::MissingParent(e.path.clone()))?;
                }
                if e.kind == BuildKind::Dir {
                    dir_ids.insert(&e.path, i as u32);
                }
            }
        }
        // Children, grouped by parent in node order (a counting sort): the
        // children of node p are children[child_start[p]..child_start[p + 1]].
        let mut child_start = vec![0u32; n + 1];
        for &p in &parent[1..] {
            child_start[p as usize + 1] += 1;
        }
        for p in 0..n {
            child_start[p + 1] += child_start[p];
        }
        let mut children = vec![0u32; n - 1];
        let mut fill = child_start.clone();
        for (i, &p) in parent.iter().enumerate().skip(1) {
            children[fill[p as usize] as usize] = i as u32;
            fill[p as usize] += 1;
        }
        drop(fill);
        let bucket_count = (n * 2).next_power_of_two().max(16);
        let mask = bucket_count as u64 - 1;
        let mut buckets = vec![0u64; bucket_count];
        for (i, e) in self.entries.iter().enumerate() {
            let h = xxh3(&e.path);
            let mut b = h & mask;
            while buckets[b as usize] != 0 {
                b = (b + 1) & mask;
            }
            buckets[b as usize] = ((h >> 32) << 32) | (i as u64 + 1);
        }
        let mut strings_len = 0u64;
        let mut total_bytes = 0u64;
        for e in &self.entries {
            strings_len += e.path.len() as u64;
            match &e.kind {
                BuildKind::Symlink { target } => strings_len += target.len() as u64,
                BuildKind::File { .. } => total_bytes += e.size,
                BuildKind::Dir => {}
            }
        }
        let lens = [(n * NODE_LEN) as u64, children.len() as u64 * 4, bucket_count as u64 * 8, (self.partitions.len() * PART_LEN) as u64, strings_len];
        let mut sections = [(0u64, 0u64); SECTION_COUNT];
        let mut end = HEADER_LEN as u64;
        for (s, len) in sections.iter_mut().zip(lens) {
            let off = end.next_multiple_of(8);
            *s = (off, len);
            end = off + len;
        }
        Ok(ManifestLayout {
            dataset_id: self.dataset_id,
            entries: self.entries,
            partitions: self.partitions,
            parent,
            child_start,
            children,
            buckets,
            total_bytes,
            sections,
            len: end,
        })
    }
}

/// A checked, sorted manifest ready to be written ([`ManifestBuilder::build`]).
pub struct ManifestLayout {
    dataset_id: u64,
    entries: Vec<BuildEntry>,
    partitions: Vec<PartitionInfo>,
    parent: Vec<u32>,
    child_start: Vec<u32>,
    children: Vec<u32>,
    buckets: Vec<u64>,
    total_bytes: u64,
    /// (offset, length) of each section, in [`SECTION_NAMES`] order.
    sections: [(u64, u64); SECTION_COUNT],
    len: u64,
}

/// Bytes a section is generated in before they are hashed and written.
const WRITE_CHUNK: usize = 1 << 20;

/// One section being written: its bytes go to the writer a chunk at a
/// time, hashed on the way.
struct SectionSink<'w, W: Write> {
    w: &'w mut W,
    buf: Vec<u8>,
    hasher: crate::checksum::StreamingChecksum,
    written: u64,
}

impl<'w, W: Write> SectionSink<'w, W> {
    fn new(w: &'w mut W) -> Self {
        SectionSink { w, buf: Vec::with_capacity(WRITE_CHUNK), hasher: crate::checksum::StreamingChecksum::new(), written: 0 }
    }

    fn put(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.buf.extend_from_slice(bytes);
        if self.buf.len() >= WRITE_CHUNK {
            self.flush()?;
        }
        Ok(())
    }

    /// `len` zeroed bytes at the end of the section, to be filled in.
    fn record(&mut self, len: usize) -> std::io::Result<&mut [u8]> {
        if self.buf.len() + len > WRITE_CHUNK {
            self.flush()?;
        }
        let at = self.buf.len();
        self.buf.resize(at + len, 0);
        Ok(&mut self.buf[at..])
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.hasher.update(&self.buf);
        self.w.write_all(&self.buf)?;
        self.written += self.buf.len() as u64;
        self.buf.clear();
        Ok(())
    }

    /// The section's length and xxh3.
    fn finish(mut self) -> std::io::Result<(u64, u64)> {
        self.flush()?;
        Ok((self.written, self.hasher.digest()))
    }
}

impl ManifestLayout {
    /// Length of the manifest file in bytes.
    pub fn file_len(&self) -> u64 {
        self.len
    }

    /// Writes the manifest at `w`'s position: a header placeholder, the
    /// sections (generated in chunks and hashed as they go), then the header
    /// itself over the placeholder. Leaves `w` at the manifest's end.
    pub fn write_to<W: Write + Seek>(&self, w: &mut W) -> std::io::Result<()> {
        let base = w.stream_position()?;
        w.write_all(&[0u8; HEADER_LEN])?;
        let mut at = HEADER_LEN as u64;
        let mut sums = [0u64; SECTION_COUNT];
        for (i, &(off, len)) in self.sections.iter().enumerate() {
            w.write_all(&[0u8; 8][..(off - at) as usize])?;
            let mut sink = SectionSink::new(w);
            match i {
                S_NODES => self.write_nodes(&mut sink)?,
                S_CHILDREN => {
                    for c in &self.children {
                        sink.put(&c.to_le_bytes())?;
                    }
                }
                S_BUCKETS => {
                    for b in &self.buckets {
                        sink.put(&b.to_le_bytes())?;
                    }
                }
                S_PARTS => {
                    for p in &self.partitions {
                        let r = sink.record(PART_LEN)?;
                        put_u32(r, P_ID, p.id);
                        put_u32(r, P_FLAGS, p.flags);
                        put_u64(r, P_FILE_LEN, p.file_len);
                        put_u64(r, P_ENTRIES, p.entry_count);
                        put_u64(r, P_BYTES, p.logical_bytes);
                        put_u64(r, P_HEADER_SUM, p.header_checksum);
                    }
                }
                _ => {
                    for e in &self.entries {
                        sink.put(&e.path)?;
                        if let BuildKind::Symlink { target } = &e.kind {
                            sink.put(target)?;
                        }
                    }
                }
            }
            let (written, sum) = sink.finish()?;
            if written != len {
                return Err(std::io::Error::other(format!("manifest {} section: {written} bytes written, {len} laid out", SECTION_NAMES[i])));
            }
            sums[i] = sum;
            at = off + len;
        }
        let mut h = [0u8; HEADER_LEN];
        put_u32(&mut h, HEADER_LEN_OFF, HEADER_LEN as u32);
        put_u64(&mut h, DATASET_OFF, self.dataset_id);
        put_u64(&mut h, NODE_COUNT_OFF, self.entries.len() as u64);
        put_u64(&mut h, CHILD_COUNT_OFF, self.children.len() as u64);
        put_u32(&mut h, PART_COUNT_OFF, self.partitions.len() as u32);
        put_u32(&mut h, BUCKET_COUNT_OFF, self.buckets.len() as u32);
        put_u64(&mut h, TOTAL_BYTES_OFF, self.total_bytes);
        for (i, &(off, len)) in self.sections.iter().enumerate() {
            let e = SECTIONS_OFF + i * SECTION_ENTRY_LEN;
            put_u64(&mut h, e, off);
            put_u64(&mut h, e + 8, len);
            put_u64(&mut h, e + 16, sums[i]);
        }
        HEADER.seal(&mut h);
        w.seek(SeekFrom::Start(base))?;
        w.write_all(&h)?;
        w.seek(SeekFrom::Start(base + self.len))?;
        Ok(())
    }

    /// The node records, in order; strings are laid out as the strings
    /// section writes them: each path, then a symlink's target.
    fn write_nodes<W: Write>(&self, sink: &mut SectionSink<'_, W>) -> std::io::Result<()> {
        let mut string_at = 0u64;
        for (i, e) in self.entries.iter().enumerate() {
            let r = sink.record(NODE_LEN)?;
            let name_len = components(&e.path).last().map_or(0, |c| c.len());
            put_u32(r, N_PARENT, self.parent[i]);
            put_u32(r, N_NAME_LEN, name_len as u32);
            put_u64(r, N_PATH_OFF, string_at);
            put_u32(r, N_PATH_LEN, e.path.len() as u32);
            put_i64(r, N_MTIME, e.mtime_ns);
            put_i64(r, N_ATIME, e.atime_ns);
            put_i64(r, N_CTIME, e.ctime_ns);
            string_at += e.path.len() as u64;
            let perm = e.perm & 0o7777;
            match &e.kind {
                BuildKind::Dir => {
                    let kids = &self.children[self.child_start[i] as usize..self.child_start[i + 1] as usize];
                    r[N_KIND] = NodeKind::Dir as u8;
                    put_u32(r, N_MODE, libc::S_IFDIR | perm);
                    put_u32(r, N_AUX32, kids.len() as u32);
                    put_u64(r, N_LOC, self.child_start[i] as u64);
                    let subdirs = kids.iter().filter(|&&k| self.entries[k as usize].kind == BuildKind::Dir).count();
                    put_u32(r, N_NLINK, 2 + subdirs as u32);
                }
                BuildKind::File { partition, payload_offset, stored_len, codec, checksum, replicated } => {
                    r[N_KIND] = NodeKind::File as u8;
                    r[N_CODEC] = *codec as u8;
                    r[N_FLAGS] = if *replicated { NODE_FLAG_REPLICATED } else { 0 };
                    put_u32(r, N_MODE, libc::S_IFREG | perm);
                    put_u32(r, N_AUX32, *partition);
                    put_u64(r, N_SIZE, e.size);
                    put_u64(r, N_LOC, *payload_offset);
                    put_u64(r, N_STORED, *stored_len);
                    put_u64(r, N_SUM, *checksum);
                    put_u32(r, N_NLINK, 1);
                }
                BuildKind::Symlink { target } => {
                    r[N_KIND] = NodeKind::Symlink as u8;
                    put_u32(r, N_MODE, libc::S_IFLNK | 0o777);
                    put_u64(r, N_SIZE, target.len() as u64);
                    put_u64(r, N_LOC, string_at);
                    put_u32(r, N_NLINK, 1);
                    string_at += target.len() as u64;
                }
            }
        }
        Ok(())
    }
}

/// A manifest file opened and mapped read-only.
pub struct Manifest {
    path: std::path::PathBuf,
    map: memmap2::Mmap,
}

impl Manifest {
    /// Maps and fully verifies the manifest at `path`.
    pub fn open(path: &Path) -> Result<Manifest> {
        let f = std::fs::File::open(path).map_err(|e| FormatError::io(path, e))?;
        // SAFETY: the manifest is written once by prep and renamed into place;
        // nothing modifies it while mapped. A concurrent truncation would only
        // make later reads fault, which is the documented hazard of mmap.
        let map = unsafe { memmap2::Mmap::map(&f) }.map_err(|e| FormatError::io(path, e))?;
        IndexView::parse(path, &map, Verify::Full)?;
        Ok(Manifest { path: path.into(), map })
    }

    /// The verified view. Re-parses only the header.
    pub fn view(&self) -> IndexView<'_> {
        IndexView::parse(&self.path, &self.map, Verify::Header).expect("verified at open")
    }

    pub fn bytes(&self) -> &[u8] {
        &self.map
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &str, size: u64, part: u32) -> BuildEntry {
        BuildEntry {
            path: path.as_bytes().to_vec(),
            perm: 0o644,
            size,
            mtime_ns: 1_700_000_000_123_456_789,
            atime_ns: 5,
            ctime_ns: 6,
            kind: BuildKind::File {
                partition: part,
                payload_offset: 112,
                stored_len: size,
                codec: Codec::None,
                checksum: 42,
                replicated: false,
            },
        }
    }
    fn dir(path: &str) -> BuildEntry {
        BuildEntry {
            path: path.as_bytes().to_vec(),
            perm: 0o750,
            size: 0,
            mtime_ns: 1,
            atime_ns: 2,
            ctime_ns: 3,
            kind: BuildKind::Dir,
        }
    }

    fn sample() -> Vec<u8> {
        let mut b = ManifestBuilder::new(77);
        b.add(file("train/b.png", 10, 0));
        b.add(dir("train"));
        b.add(file("train/a.png", 1 << 33, 0));
        b.add(dir("val"));
        b.add(dir("train/sub"));
        b.add(file("a.b", 3, 0));
        b.add(BuildEntry {
            path: b"train/link".to_vec(),
            perm: 0o777,
            size: 5,
            mtime_ns: 0,
            atime_ns: 0,
            ctime_ns: 0,
            kind: BuildKind::Symlink { target: b"a.png".to_vec() },
        });
        b.add_partition(PartitionInfo { id: 0, flags: 0, file_len: 100, entry_count: 3, logical_bytes: 13, header_checksum: 9 });
        b.finish().unwrap()
    }

    #[test]
    fn lookup_children_and_stat_fields() {
        let bytes = sample();
        let v = IndexView::parse(Path::new("m"), &bytes, Verify::Full).unwrap();
        assert_eq!(v.dataset_id(), 77);
        assert_eq!(v.node_count(), 8);
        let names: Vec<&[u8]> = v.children(v.root()).map(|n| n.name()).collect();
        assert_eq!(names, vec![&b"a.b"[..], b"train", b"val"]);
        let train = v.lookup(b"train").unwrap();
        assert!(train.is_dir());
        assert_eq!(train.nlink(), 3);
        assert_eq!(train.mode(), libc::S_IFDIR | 0o750);
        let names: Vec<&[u8]> = v.children(train).map(|n| n.name()).collect();
        assert_eq!(names, vec![&b"a.png"[..], b"b.png", b"link", b"sub"]);
        let a = v.lookup(b"train/a.png").unwrap();
        assert_eq!(a.size(), 1 << 33);
        assert_eq!(a.mtime_ns(), 1_700_000_000_123_456_789);
        assert_eq!(a.parent(), train.id());
        assert_eq!(v.child(train, b"b.png").unwrap().size(), 10);
        assert!(v.child(train, b"zzz").is_none());
        assert_eq!(v.lookup(b"train/link").unwrap().symlink_target(), b"a.png");
        assert!(v.lookup(b"train/nope").is_none());
        assert!(v.lookup(b"").unwrap().is_dir());
        assert_eq!(v.partition(0).unwrap().entry_count, 3);
        assert_eq!(v.total_bytes(), (1 << 33) + 13);
    }

    #[test]
    fn names_are_bytes_and_long_names_work() {
        let mut b = ManifestBuilder::new(1);
        let long = "x".repeat(255);
        b.add(dir(&long));
        let mut deep = long.clone();
        while deep.len() + 256 <= PATH_MAX {
            deep.push('/');
            deep.push_str(&long);
            b.add(dir(&deep));
        }
        let mut raw = file("", 1, 0);
        raw.path = b"\xff\xfe-latin1-\xe9".to_vec();
        b.add(raw);
        b.add_partition(PartitionInfo { id: 0, flags: 0, file_len: 0, entry_count: 0, logical_bytes: 0, header_checksum: 0 });
        let bytes = b.finish().unwrap();
        let v = IndexView::parse(Path::new("m"), &bytes, Verify::Full).unwrap();
        assert!(v.lookup(deep.as_bytes()).unwrap().is_dir());
        assert_eq!(v.lookup(b"\xff\xfe-latin1-\xe9").unwrap().size(), 1);
        let mut b = ManifestBuilder::new(1);
        b.add(dir(&"y".repeat(256)));
        assert!(matches!(b.finish(), Err(BuildError::BadPath { .. })));
    }

    #[test]
    fn builder_refuses_bad_trees() {
        let mut b = ManifestBuilder::new(1);
        b.add(file("missing/x", 1, 0));
        assert!(matches!(b.finish(), Err(BuildError::MissingParent(_))));
        let mut b = ManifestBuilder::new(1);
        b.add(dir("a"));
        b.add(dir("a"));
        assert!(matches!(b.finish(), Err(BuildError::Duplicate(_))));
        let mut b = ManifestBuilder::new(1);
        b.add(dir("a/../b"));
        assert!(b.finish().is_err());
    }

    #[test]
    fn flipped_bytes_are_refused_with_the_section_named() {
        let bytes = sample();
        // header
        let mut h = bytes.clone();
        h[30] ^= 1;
        let e = IndexView::parse(Path::new("ds/manifest.fsm"), &h, Verify::Full).err().unwrap().to_string();
        assert!(e.contains("ds/manifest.fsm") && e.contains("manifest header") && e.contains("checksum"), "{e}");
        // each section
        for (i, name) in SECTION_NAMES.iter().enumerate() {
            let off = u64_at(&bytes, SECTIONS_OFF + i * SECTION_ENTRY_LEN) as usize;
            let len = u64_at(&bytes, SECTIONS_OFF + i * SECTION_ENTRY_LEN + 8) as usize;
            if len == 0 {
                continue;
            }
            let mut c = bytes.clone();
            c[off + len / 2] ^= 0x10;
            let e = IndexView::parse(Path::new("m"), &c, Verify::Full).err().unwrap().to_string();
            assert!(e.contains(&format!("{name} section")) && e.contains(&format!("offset {off}")), "{e}");
        }
    }

    #[test]
    fn version_magic_and_truncation_are_refused() {
        let mut bytes = sample();
        put_u32(&mut bytes, format::VERSION_OFFSET, 2);
        format::testing::reseal(&mut bytes, HEADER_LEN);
        let e = IndexView::parse(Path::new("m"), &bytes, Verify::Full).err().unwrap();
        assert!(matches!(e, FormatError::UnsupportedVersion { found: 2, .. }));
        let b = sample();
        assert!(IndexView::parse(Path::new("m"), &b[..b.len() - 1], Verify::Full).is_err());
        assert!(IndexView::parse(Path::new("m"), &b[..10], Verify::Full).is_err());
        assert!(matches!(IndexView::parse(Path::new("m"), b"not a manifest at all", Verify::Full), Err(FormatError::BadMagic { .. })));
    }

    #[test]
    fn every_header_fault_is_named() {
        let good = sample();
        format::testing::assert_header_faults_named(&HEADER, "ds/manifest.fsm", &good, |b| {
            IndexView::parse(Path::new("ds/manifest.fsm"), b, Verify::Full).map(|_| ())
        });
    }

    /// Re-seals every section and header checksum so a mutation reaches the structural checks.
    fn reseal(b: &mut [u8]) {
        format::testing::reseal_sections(b, SECTIONS_OFF, SECTION_COUNT);
        format::testing::reseal(b, HEADER_LEN);
    }

    #[test]
    fn mutated_manifests_never_panic() {
        let base = sample();
        let mut accepted = 0;
        for mut b in format::testing::mutated_copies(&base, 20_000, 4) {
            reseal(&mut b);
            let Ok(v) = IndexView::parse(Path::new("fuzz"), &b, Verify::Full) else { continue };
            accepted += 1;
            for n in v.nodes() {
                let _ = (n.path(), n.name(), n.symlink_target(), n.size(), n.kind());
                let _ = v.lookup(n.path());
                for c in v.children(n) {
                    let _ = v.child(n, c.name());
                }
            }
            let _ = v.partitions().count();
        }
        // Mutations of string bytes and stat fields keep a manifest valid.
        assert!(accepted > 100, "only {accepted} mutated manifests parsed");
    }

    /// A tree with nested directories, symlinks, several partitions, raw
    /// name bytes and shuffled input order.
    fn varied_tree() -> ManifestBuilder {
        let mut b = ManifestBuilder::new(0x5eed);
        let mut x = 0x9e3779b97f4a7c15u64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut entries = Vec::new();
        for d in 0..12 {
            entries.push(dir(&format!("d{d}")));
            for s in 0..(d % 3) {
                entries.push(dir(&format!("d{d}/s{s}")));
                for f in 0..(next() % 40) {
                    entries.push(file(&format!("d{d}/s{s}/f{f}"), next() % 100_000, (next() % 3) as u32));
                }
            }
            for f in 0..(next() % 200) {
                let mut e = file(&format!("d{d}/g{f}"), next() % 1000, (next() % 3) as u32);
                if let BuildKind::File { checksum, payload_offset, .. } = &mut e.kind {
                    *checksum = next();
                    *payload_offset = next() % (1 << 40);
                }
                e.mtime_ns = next() as i64;
                entries.push(e);
            }
            let mut l = file(&format!("d{d}/link"), 0, 0);
            l.kind = BuildKind::Symlink { target: format!("../d{}/g0", (d + 1) % 12).into_bytes() };
            entries.push(l);
        }
        let mut raw = file("", 7, 1);
        raw.path = b"d3/\xc3\xa9t\xc3\xa9-\xff".to_vec();
        entries.push(raw);
        for i in (1..entries.len()).rev() {
            entries.swap(i, (next() % (i as u64 + 1)) as usize);
        }
        for e in entries {
            b.add(e);
        }
        for id in 0..3 {
            b.add_partition(PartitionInfo { id, flags: id, file_len: 1000 + id as u64, entry_count: 9, logical_bytes: 99, header_checksum: next() });
        }
        b
    }

    #[test]
    fn the_written_layout_is_unchanged() {
        // The bytes of one varied tree, pinned: a change of the layout
        // (order, padding, offsets, checksums) must be a new version.
        let bytes = varied_tree().finish().unwrap();
        let v = IndexView::parse(Path::new("m"), &bytes, Verify::Full).unwrap();
        assert!(v.node_count() > 500);
        assert_eq!((bytes.len(), xxh3(&bytes)), (213_340, 15_033_959_725_640_890_019));
        assert_eq!(
            (HEADER_LEN_OFF, SECTIONS_OFF, HEADER_LEN, N_SIZE, N_NLINK, NODE_LEN, P_HEADER_SUM, PART_LEN),
            (12, 56, 184, 32, 88, 96, 32, 64)
        );
    }

    #[test]
    fn a_layout_is_written_where_the_writer_stands_and_write_faults_surface() {
        let whole = varied_tree().finish().unwrap();
        let layout = varied_tree().build().unwrap();
        assert_eq!(layout.file_len(), whole.len() as u64);
        let mut c = std::io::Cursor::new(b"prefix".to_vec());
        c.seek(SeekFrom::End(0)).unwrap();
        layout.write_to(&mut c).unwrap();
        assert_eq!(c.position(), 6 + whole.len() as u64);
        assert_eq!(&c.get_ref()[..6], b"prefix");
        assert!(c.get_ref()[6..] == whole[..]);
        // A writer that fails part way: the error comes back, no panic.
        let mut space = [0u8; 4096];
        let mut short = std::io::Cursor::new(&mut space[..]);
        assert!(layout.write_to(&mut short).is_err());
    }

    #[test]
    fn million_node_manifest_opens_fast() {
        // Correctness of a large table (timing is a benchmark, not a test).
        let mut b = ManifestBuilder::new(5);
        for d in 0..100 {
            b.add(dir(&format!("d{d}")));
            for f in 0..1000 {
                b.add(file(&format!("d{d}/f{f}"), f, 0));
            }
        }
        b.add_partition(PartitionInfo { id: 0, flags: 0, file_len: 0, entry_count: 0, logical_bytes: 0, header_checksum: 0 });
        let bytes = b.finish().unwrap();
        let v = IndexView::parse(Path::new("m"), &bytes, Verify::Full).unwrap();
        for d in (0..100).step_by(7) {
            for f in (0..1000).step_by(13) {
                assert_eq!(v.lookup(format!("d{d}/f{f}").as_bytes()).unwrap().size(), f);
            }
        }
        assert!(v.lookup(b"d5/f1000").is_none());
    }
}
