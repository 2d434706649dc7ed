//! The tier map: where the bytes of each dataset file can be opened directly
//! on this node, without a message to the daemon.
//!
//! Loading copies each partition whole to the node-local directory (one
//! sequential file per partition, so a job is ready as fast as the bytes can
//! be copied, whatever the file count). A file's own bytes appear on first
//! open, in one of two places, and the daemon records which in this map, a
//! shared-memory file next to the index that every client maps read-only:
//!
//! - [`TIER_EXTRACTED`]: an uncompressed local file of [`EXTRACT_MIN`] bytes
//!   or more, extracted to `local/in/<bucket>/<id>`
//!   ([`crate::runtime::local_file_path`]) and kept until the job ends;
//! - [`TIER_COPY`]: a decompressed, remote, or small file, copied into the
//!   copy directory ([`copy_dir`], in shared memory), bounded by the daemon's
//!   `--cache-mem` and unlinked when evicted (open fds stay valid);
//! - [`TIER_PART`]: the file's partition was fetched whole from a peer after
//!   the job started (`--prefetch-remote`) and lies, verified, where a
//!   partition loaded at start lies (`local/parts/`): the client decodes a
//!   small file from it itself; a large one is extracted by the daemon;
//! - [`TIER_DECLINED`]: a file of a partition loaded here at start that a
//!   client decoded and asked a copy of (`WARM`) when the copy directory
//!   had no free room: clients go on decoding it themselves, and send no
//!   more hints for it; [`TIER_PART_DECLINED`], the same for a file of a
//!   partition replicated here ([`TIER_PART`]).
//!
//! A client reads the byte, opens the named file if there is one, and asks
//! the daemon when the byte is 0 or the open fails (evicted in between). The
//! daemon publishes a file before it sets the byte, and sets the byte back
//! before it unlinks the file: to 0, or to what it said before the copy when
//! that still holds (3, 5, 6). No fd is held per file by anyone but the
//! program.
//!
//! The byte of a directory node says whether an output may be listed in
//! that input directory: [`DIR_HAS_OUTPUTS`], set on every rank before the
//! first output name is added to its listing, and never cleared. While it is
//! 0, a client lists the directory and answers a lookup of a name that is
//! not in the index (ENOENT) from shared memory alone, with no message: on
//! a dataset nobody writes into, a walk of the tree asks the daemon nothing.
//!
//! ```text
//! tier map file (/dev/shm, mode 0600; the header is written once)
//!   0..8    magic "FANSTTM\0"          8..12   version (1)
//!  12..16   reserved, zero             16..24  dataset id
//!  24..32   node count N               32..56  reserved, zero
//!  56..64   xxh3 of bytes 0..56
//!  64..64+N one byte per node id: a file 0 none, 1 extracted, 2 copy,
//!           3 partition replicated here, 5 copy declined, 6 partition
//!           replicated here and copy declined; a directory 0 no output
//!           listed in it, 4 outputs may be listed in it
//! ```

use crate::checksum::xxh3;
use crate::format;
use crate::le::*;
use std::sync::atomic::{AtomicU8, Ordering};

pub const MAGIC: [u8; 8] = *b"FANSTTM\0";
pub const VERSION: u32 = 1;
format::layout! {
    format::VERSION_OFFSET;
    VERSION_OFF: 4, RESERVED_OFF: 4, DATASET_OFF: 8, COUNT_OFF: 8, RESERVED2_OFF: 24, CHECKSUM_OFF:
    format::CHECKSUM_LEN =>
    /// Length of the header; the per-node bytes follow it.
    pub HEADER_LEN
}

/// Nothing to open directly: ask the daemon.
pub const TIER_NONE: u8 = 0;
/// Extracted to the local directory at `local_file_path`.
pub const TIER_EXTRACTED: u8 = 1;
/// A copy in the copy directory at `copy_file_path_into`.
pub const TIER_COPY: u8 = 2;
/// Its partition's verified copy is in the local directory (replicated from
/// a peer after start); nothing of the file itself is yet.
pub const TIER_PART: u8 = 3;
/// The byte of an input directory in which an output may be listed: set on
/// every rank before the first output name is added to its listing (a
/// directory's byte is otherwise 0, and never any of the file tiers).
pub const DIR_HAS_OUTPUTS: u8 = 4;
/// A file of a partition loaded at start whose copy the daemon declined:
/// the copy directory had no free room when a client asked for the copy
/// (`WARM`). Making room would evict another file's copy, and a training
/// epoch reads every file once in a random order: the node would hit its
/// copies as often (as many fit either way) and pay a copy per miss.
/// Clients decode it as they do a [`TIER_NONE`] file of a local partition,
/// without the hint. A copy made since (a daemon OPEN) replaces the byte
/// with [`TIER_COPY`].
pub const TIER_DECLINED: u8 = 5;
/// [`TIER_PART`] and [`TIER_DECLINED`] at once: the file's partition was
/// replicated here, and its copy declined.
pub const TIER_PART_DECLINED: u8 = 6;

/// Whether a file's byte says that its partition was replicated here
/// (clients decode a small file of it themselves).
pub fn part_replicated(tier: u8) -> bool {
    matches!(tier, TIER_PART | TIER_PART_DECLINED)
}

/// Whether a file's byte says that the daemon declined its copy (clients
/// send no `WARM` hint for it).
pub fn copy_declined(tier: u8) -> bool {
    matches!(tier, TIER_DECLINED | TIER_PART_DECLINED)
}

/// Uncompressed local files of at least this size are extracted to the local
/// disk (one file creation is small next to their bytes); smaller ones are
/// copied into the budgeted copy directory (a file creation each on the
/// local disk would dominate, and millions of them would make start and stop
/// slow).
pub const EXTRACT_MIN: u64 = 64 << 10;

/// The header of a tier map for `nodes` nodes of dataset `dataset_id`.
pub fn encode_header(dataset_id: u64, nodes: u64) -> [u8; HEADER_LEN] {
    let mut b = [0u8; HEADER_LEN];
    b[..8].copy_from_slice(&MAGIC);
    put_u32(&mut b, VERSION_OFF, VERSION);
    put_u64(&mut b, DATASET_OFF, dataset_id);
    put_u64(&mut b, COUNT_OFF, nodes);
    let sum = xxh3(&b[..CHECKSUM_OFF]);
    put_u64(&mut b, CHECKSUM_OFF, sum);
    b
}

/// Why a mapped tier map cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TierMapError {
    #[error("tier map: {0} bytes, shorter than its header")]
    Short(usize),
    #[error("tier map: bad magic")]
    Magic,
    #[error("tier map: version {0}, this build reads version {VERSION}")]
    Version(u32),
    #[error("tier map: header checksum mismatch")]
    Checksum,
    #[error("tier map: dataset {found:#x} and {nodes} nodes, the index has dataset {dataset:#x} and {index_nodes} nodes")]
    Mismatch { found: u64, nodes: u64, dataset: u64, index_nodes: u64 },
}

/// A read-only view of a mapped tier map (the clients' side).
#[derive(Clone, Copy)]
pub struct TierView<'a> {
    bytes: &'a [AtomicU8],
}

impl<'a> TierView<'a> {
    /// Checks the header of `map` against the index's dataset id and node count.
    pub fn parse(map: &'a [u8], dataset_id: u64, nodes: u64) -> Result<TierView<'a>, TierMapError> {
        if map.len() < HEADER_LEN {
            return Err(TierMapError::Short(map.len()));
        }
        if map[..8] != MAGIC {
            return Err(TierMapError::Magic);
        }
        let v = u32_at(map, VERSION_OFF);
        if v != VERSION {
            return Err(TierMapError::Version(v));
        }
        if u64_at(map, CHECKSUM_OFF) != xxh3(&map[..CHECKSUM_OFF]) {
            return Err(TierMapError::Checksum);
        }
        let (found, n) = (u64_at(map, DATASET_OFF), u64_at(map, COUNT_OFF));
        if found != dataset_id || n != nodes || (map.len() as u64) < HEADER_LEN as u64 + n {
            return Err(TierMapError::Mismatch { found, nodes: n, dataset: dataset_id, index_nodes: nodes });
        }
        let body = &map[HEADER_LEN..HEADER_LEN + n as usize];
        // SAFETY: AtomicU8 has the size and alignment of u8. The bytes live in
        // a shared mapping that the daemon updates concurrently, so they are
        // only ever read through atomics.
        let bytes = unsafe { std::slice::from_raw_parts(body.as_ptr().cast::<AtomicU8>(), body.len()) };
        Ok(TierView { bytes })
    }

    /// The tier of node `id` (out of range: [`TIER_NONE`]).
    pub fn get(&self, id: u32) -> u8 {
        self.bytes.get(id as usize).map_or(TIER_NONE, |b| b.load(Ordering::Acquire))
    }
}

/// The tier map's path for the index at `index_path` (`….index` -> `….tiers`).
pub fn tier_map_path(index_path: &[u8]) -> Vec<u8> {
    with_suffix(index_path, b".tiers")
}

/// The copy directory for the index at `index_path` (`….index` -> `….copies`).
pub fn copy_dir(index_path: &[u8]) -> Vec<u8> {
    with_suffix(index_path, b".copies")
}

fn with_suffix(index_path: &[u8], suffix: &[u8]) -> Vec<u8> {
    let stem = index_path.strip_suffix(b".index").unwrap_or(index_path);
    [stem, suffix].concat()
}

/// `copy_dir/<id>` into `out`, NUL-terminated (no allocation); the length without the NUL.
pub fn copy_file_path_into(copy_dir: &[u8], node_id: u32, out: &mut [u8]) -> Option<usize> {
    let mut digits = [0u8; 10];
    let num = crate::runtime::decimal(node_id, &mut digits);
    let len = copy_dir.len() + 1 + num.len();
    if len + 1 > out.len() {
        return None;
    }
    out[..copy_dir.len()].copy_from_slice(copy_dir);
    out[copy_dir.len()] = b'/';
    out[copy_dir.len() + 1..len].copy_from_slice(num);
    out[len] = 0;
    Some(len)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The offsets and lengths that `layout!` declares are those the
    /// format has always had.
    #[test]
    fn key_offsets_keep_their_values() {
        assert_eq!((VERSION_OFF, DATASET_OFF, CHECKSUM_OFF, HEADER_LEN), (8, 16, 56, 64));
    }

    fn map(dataset: u64, nodes: u64) -> Vec<u8> {
        let mut m = encode_header(dataset, nodes).to_vec();
        m.resize(HEADER_LEN + nodes as usize, 0);
        m
    }

    #[test]
    fn round_trip_and_values() {
        let mut m = map(7, 5);
        m[HEADER_LEN + 3] = TIER_COPY;
        let v = TierView::parse(&m, 7, 5).unwrap();
        assert_eq!((v.get(0), v.get(3), v.get(5), v.get(u32::MAX)), (TIER_NONE, TIER_COPY, TIER_NONE, TIER_NONE));
        let all = [TIER_NONE, TIER_EXTRACTED, TIER_COPY, TIER_PART, DIR_HAS_OUTPUTS, TIER_DECLINED, TIER_PART_DECLINED];
        assert_eq!(all.map(part_replicated), [false, false, false, true, false, false, true]);
        assert_eq!(all.map(copy_declined), [false, false, false, false, false, true, true]);
    }

    #[test]
    fn every_corruption_is_refused() {
        let m = map(7, 5);
        assert_eq!(TierView::parse(&m[..10], 7, 5).err(), Some(TierMapError::Short(10)));
        let mut bad = m.clone();
        bad[0] ^= 1;
        assert_eq!(TierView::parse(&bad, 7, 5).err(), Some(TierMapError::Magic));
        let mut bad = m.clone();
        bad[VERSION_OFF] = 2;
        assert_eq!(TierView::parse(&bad, 7, 5).err(), Some(TierMapError::Version(2)));
        for off in [RESERVED_OFF, DATASET_OFF, COUNT_OFF, RESERVED2_OFF + 3, CHECKSUM_OFF] {
            let mut bad = m.clone();
            bad[off] ^= 0x10;
            assert_eq!(TierView::parse(&bad, 7, 5).err(), Some(TierMapError::Checksum), "byte {off}");
        }
        assert!(matches!(TierView::parse(&m, 8, 5), Err(TierMapError::Mismatch { .. })));
        assert!(matches!(TierView::parse(&m, 7, 6), Err(TierMapError::Mismatch { .. })));
        assert!(matches!(TierView::parse(&m[..HEADER_LEN + 4], 7, 5), Err(TierMapError::Mismatch { .. })));
    }

    #[test]
    fn paths() {
        assert_eq!(tier_map_path(b"/dev/shm/fanstore-0-j-r1.index"), b"/dev/shm/fanstore-0-j-r1.tiers");
        assert_eq!(copy_dir(b"/dev/shm/x-r0.index"), b"/dev/shm/x-r0.copies");
        let mut out = [0u8; 32];
        let n = copy_file_path_into(b"/c", 1234, &mut out).unwrap();
        assert_eq!(&out[..=n], b"/c/1234\0");
        assert!(copy_file_path_into(b"/c", 1234, &mut [0u8; 7]).is_none());
    }
}
