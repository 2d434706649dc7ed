//! The record table: the output records a rank owns, published in shared
//! memory so that the clients of its node answer a stat, or find the bytes
//! of an output this node holds, with no message to the daemon.
//!
//! The owner rank of a path (hash of the path mod the rank count) keeps its
//! record in the daemon's `MetaStore`; every change there is also written
//! here, under the same lock, so a slot always holds the record the daemon
//! would answer with. A client looks a path up by the xxh3-128 of its bytes
//! and takes only *hits*: a path not found may still have a record (owned by
//! another rank, or not published because its probe window was full), so a
//! miss is asked of the daemon as before.
//!
//! One writer (the daemon, under its metadata lock), any number of readers
//! (every client of the node, read-only mappings): each slot is a seqlock.
//! The writer makes the slot's sequence odd, writes, and makes it even
//! again; a reader copies the slot and keeps the copy only if the sequence
//! was even and unchanged around it. All slot words are read and written as
//! atomics (the bytes change under the readers' feet).
//!
//! ```text
//! record table file (/dev/shm beside the index, `….records`; the index's mode)
//!   0..8    magic "FANSTRT\0"            8..12   version (2)
//!  12..16   slot length (128)           16..24   slot count S (a power of two)
//!  24..28   rank                        28..56   reserved, zero
//!  56..64   xxh3 of bytes 0..56
//!  64..     S slots of 128 bytes, each 16 u64 words (LE):
//!    word 0        sequence (low 32 bits; odd while written) | state << 32
//!                  (state 0 never used, 1 live, 2 removed)
//!    words 1..3    key: xxh3-128 of the path (low, high)
//!    words 3..13   the record (`OutRecord::encode`, 80 bytes)
//!    words 13..16  reserved, zero
//! ```
//!
//! A path has two probe windows of [`PROBE`] slots each, looked at in
//! order, each by linear probing from its home slot and left at a
//! never-used slot:
//! 1. its directory's: home `(xxh3_64(directory) + (key.low mod W)) mod S`,
//!    W = [`DIR_WINDOW`]: the records of one directory share W slots (W x
//!    128 bytes, 128 pages), so a process that stats or opens a whole
//!    directory touches (and page-faults on) a few hundred KiB of the
//!    mapping instead of one page per record (2000 stats right after
//!    their creation: 1,432 minor faults and 3.7 µs a stat with one
//!    window per path, version 1);
//! 2. its own: home `key.low mod S`, where a record goes when its
//!    directory's window is full (directories past ~W entries);
//! 3. its own second: home `key.high mod S`, for the few whose own window
//!    lands in the full window of a large directory.
//!
//! An insert updates the key's slot in either window, else takes the first
//! free slot of the first window that has one. A removed slot keeps its key
//! (a tombstone) and is reused by the next insert of any key. A record that
//! finds no slot in either window is not published (the table says so in
//! [`RecordTable::unpublished`]); its path is then always asked of the
//! daemon.

use crate::checksum::xxh3;
use crate::le::*;
use crate::wire::OutRecord;
use std::sync::atomic::{fence, AtomicU64, Ordering};

pub const MAGIC: [u8; 8] = *b"FANSTRT\0";
pub const VERSION: u32 = 2;
crate::format::layout! {
    crate::format::VERSION_OFFSET;
    VERSION_OFF: 4, SLOT_LEN_OFF: 4, SLOTS_OFF: 8, RANK_OFF: 4, RESERVED_OFF: 28, CHECKSUM_OFF:
    crate::format::CHECKSUM_LEN =>
    /// Length of the header; the slots follow it.
    pub HEADER_LEN
}
/// Bytes of a slot.
pub const SLOT_LEN: usize = 128;
const SLOT_WORDS: usize = SLOT_LEN / 8;
const KEY_WORD: usize = 1;
const REC_WORD: usize = 3;
const REC_WORDS: usize = OutRecord::LEN / 8;
/// Slots a lookup or an insert looks at, from each of a key's home slots.
pub const PROBE: usize = 32;
/// Slots the records of one directory spread over (a power of two).
pub const DIR_WINDOW: usize = 4096;
/// Slots of the table a daemon makes: 128 MiB of shared memory at most,
/// touched only where records land.
pub const DEFAULT_SLOTS: u64 = 1 << 20;

const NEVER_USED: u64 = 0;
const LIVE: u64 = 1;
const REMOVED: u64 = 2;

/// The record table's path for the index at `index_path` (`….index` -> `….records`).
pub fn table_path(index_path: &[u8]) -> Vec<u8> {
    let stem = index_path.strip_suffix(b".index").unwrap_or(index_path);
    [stem, b".records"].concat()
}

/// The key of `path`: its xxh3-128.
pub fn key_of(path: &[u8]) -> u128 {
    xxhash_rust::xxh3::xxh3_128(path)
}

/// The header of a table of `slots` slots for `rank`.
pub fn encode_header(slots: u64, rank: u32) -> [u8; HEADER_LEN] {
    let mut b = [0u8; HEADER_LEN];
    b[..8].copy_from_slice(&MAGIC);
    put_u32(&mut b, VERSION_OFF, VERSION);
    put_u32(&mut b, SLOT_LEN_OFF, SLOT_LEN as u32);
    put_u64(&mut b, SLOTS_OFF, slots);
    put_u32(&mut b, RANK_OFF, rank);
    let sum = xxh3(&b[..CHECKSUM_OFF]);
    put_u64(&mut b, CHECKSUM_OFF, sum);
    b
}

/// Why a mapped record table cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordTableError {
    #[error("record table: {0} bytes, shorter than its header")]
    Short(usize),
    #[error("record table: bad magic")]
    Magic,
    #[error("record table: version {0}, this build reads version {VERSION}")]
    Version(u32),
    #[error("record table: header checksum mismatch")]
    Checksum,
    #[error("record table: {slots} slots of {slot_len} bytes do not fit its {len} bytes (or are not a power of two)")]
    Size { slots: u64, slot_len: u32, len: usize },
    #[error("record table of rank {found}, expected rank {expected}")]
    Rank { found: u32, expected: u32 },
}

/// The slots of a mapped table, seen as atomics (both sides).
#[derive(Clone, Copy)]
struct Slots<'a> {
    words: &'a [AtomicU64],
    mask: usize,
}

impl<'a> Slots<'a> {
    fn parse(map: &'a [u8], rank: u32) -> Result<Slots<'a>, RecordTableError> {
        if map.len() < HEADER_LEN {
            return Err(RecordTableError::Short(map.len()));
        }
        if map[..8] != MAGIC {
            return Err(RecordTableError::Magic);
        }
        let v = u32_at(map, VERSION_OFF);
        if v != VERSION {
            return Err(RecordTableError::Version(v));
        }
        if u64_at(map, CHECKSUM_OFF) != xxh3(&map[..CHECKSUM_OFF]) {
            return Err(RecordTableError::Checksum);
        }
        let (slots, slot_len) = (u64_at(map, SLOTS_OFF), u32_at(map, SLOT_LEN_OFF));
        let fits = slots.checked_mul(SLOT_LEN as u64).and_then(|b| b.checked_add(HEADER_LEN as u64)).is_some_and(|n| n <= map.len() as u64);
        if slot_len as usize != SLOT_LEN || !slots.is_power_of_two() || !fits {
            return Err(RecordTableError::Size { slots, slot_len, len: map.len() });
        }
        let found = u32_at(map, RANK_OFF);
        if found != rank {
            return Err(RecordTableError::Rank { found, expected: rank });
        }
        let body = &map[HEADER_LEN..HEADER_LEN + slots as usize * SLOT_LEN];
        if body.as_ptr() as usize % 8 != 0 {
            return Err(RecordTableError::Size { slots, slot_len, len: map.len() });
        }
        // SAFETY: the body is 8-byte aligned (checked above; mappings are
        // page-aligned and the header is 64 bytes) and a whole number of
        // words long; AtomicU64 has the size of u64. The bytes live in a
        // shared mapping that the daemon changes concurrently, so they are
        // only ever accessed through these atomics.
        let words = unsafe { std::slice::from_raw_parts(body.as_ptr().cast::<AtomicU64>(), body.len() / 8) };
        Ok(Slots { words, mask: slots as usize - 1 })
    }

    fn slot(&self, i: usize) -> &'a [AtomicU64] {
        let i = i & self.mask;
        &self.words[i * SLOT_WORDS..(i + 1) * SLOT_WORDS]
    }

    /// The home slots of `path` (key `key`): its directory's window's, then its own two.
    fn homes(&self, path: &[u8], key: u128) -> [usize; 3] {
        let dir = &path[..path.iter().rposition(|&b| b == b'/').unwrap_or(0)];
        let (low, high) = (key as u64 as usize, (key >> 64) as u64 as usize);
        let in_dir = (xxhash_rust::xxh3::xxh3_64(dir) as usize).wrapping_add(low & (DIR_WINDOW - 1));
        [in_dir & self.mask, low & self.mask, high & self.mask]
    }
}

/// A consistent copy of one slot: (state, key, record words), or None if
/// the writer was in it (try again).
fn read_slot(s: &[AtomicU64]) -> Option<(u64, u128, [u64; REC_WORDS])> {
    let head = s[0].load(Ordering::Acquire);
    if head & 1 != 0 {
        return None;
    }
    let key = u128::from(s[KEY_WORD].load(Ordering::Relaxed)) | u128::from(s[KEY_WORD + 1].load(Ordering::Relaxed)) << 64;
    let mut rec = [0u64; REC_WORDS];
    for (i, w) in rec.iter_mut().enumerate() {
        *w = s[REC_WORD + i].load(Ordering::Relaxed);
    }
    fence(Ordering::Acquire);
    (s[0].load(Ordering::Relaxed) == head).then_some((head >> 32, key, rec))
}

fn record_of(words: &[u64; REC_WORDS]) -> Option<OutRecord> {
    let mut b = [0u8; OutRecord::LEN];
    for (i, w) in words.iter().enumerate() {
        b[i * 8..i * 8 + 8].copy_from_slice(&w.to_le_bytes());
    }
    OutRecord::decode(&b)
}

/// The clients' read-only view of a rank's record table.
#[derive(Clone, Copy)]
pub struct RecordView<'a> {
    slots: Slots<'a>,
}

/// What a lookup in the table found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Found {
    /// The record the owner holds for the path now.
    Live(OutRecord),
    /// Not here: ask the daemon.
    Unknown,
}

impl<'a> RecordView<'a> {
    /// Checks the header of `map` (rank `rank`'s table).
    pub fn parse(map: &'a [u8], rank: u32) -> Result<RecordView<'a>, RecordTableError> {
        Ok(RecordView { slots: Slots::parse(map, rank)? })
    }

    /// The record of `path` if the table holds it. A slot the writer keeps
    /// busy for a few tries counts as unknown.
    pub fn get(&self, path: &[u8]) -> Found {
        let key = key_of(path);
        for home in self.slots.homes(path, key) {
            for i in 0..PROBE {
                let s = self.slots.slot(home + i);
                let mut tries = 0;
                let (state, k, rec) = loop {
                    match read_slot(s) {
                        Some(x) => break x,
                        None if tries < 64 => {
                            tries += 1;
                            std::hint::spin_loop();
                        }
                        None => return Found::Unknown,
                    }
                };
                match state {
                    NEVER_USED => break, // (the next window, if this one was full when it was put)
                    LIVE if k == key => return record_of(&rec).map_or(Found::Unknown, Found::Live),
                    // (a removed slot of this key: an insert may have put it further on)
                    _ => {}
                }
            }
        }
        Found::Unknown
    }
}

/// The daemon's side: the one writer of its rank's table. Callers
/// serialise every call (the daemon holds its metadata lock).
pub struct RecordTable {
    map: memmap2::MmapMut,
    slots: Slots<'static>,
    unpublished: AtomicU64,
}

impl RecordTable {
    /// Makes (or replaces) the table at `path` with `slots` slots (a power
    /// of two) for `rank`, readable by others as `mode` says.
    pub fn create(path: &std::path::Path, slots: u64, rank: u32, mode: u32) -> std::io::Result<RecordTable> {
        use std::os::unix::fs::OpenOptionsExt;
        if !slots.is_power_of_two() {
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, "record table: slot count must be a power of two"));
        }
        let _ = std::fs::remove_file(path);
        let f = std::fs::OpenOptions::new().read(true).write(true).create_new(true).mode(mode).open(path)?;
        f.set_len(HEADER_LEN as u64 + slots * SLOT_LEN as u64)?;
        // SAFETY: a fresh file only this process writes; readers map it
        // read-only and access the slots through atomics only.
        let mut map = unsafe { memmap2::MmapMut::map_mut(&f)? };
        map[..HEADER_LEN].copy_from_slice(&encode_header(slots, rank));
        // SAFETY: the mapping lives as long as the table (it is moved into
        // it and never unmapped before it), so the 'static slice never
        // outlives it; the header was just written.
        let bytes: &'static [u8] = unsafe { std::slice::from_raw_parts(map.as_ptr(), map.len()) };
        let slots = Slots::parse(bytes, rank).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string()))?;
        Ok(RecordTable { map, slots, unpublished: AtomicU64::new(0) })
    }

    /// Records that found no slot since the table was made.
    pub fn unpublished(&self) -> u64 {
        self.unpublished.load(Ordering::Relaxed)
    }

    /// The live slot of `key` in either of its windows, and the first free
    /// slot (removed or never used) of the first window that has one.
    fn find(&self, path: &[u8], key: u128) -> (Option<usize>, Option<usize>) {
        let mut free = None;
        for home in self.slots.homes(path, key) {
            for i in 0..PROBE {
                let idx = (home + i) & self.slots.mask;
                let s = self.slots.slot(idx);
                // (the one writer: its own words are stable)
                let state = s[0].load(Ordering::Relaxed) >> 32;
                let k = u128::from(s[KEY_WORD].load(Ordering::Relaxed)) | u128::from(s[KEY_WORD + 1].load(Ordering::Relaxed)) << 64;
                match state {
                    NEVER_USED => {
                        free = free.or(Some(idx));
                        break;
                    }
                    LIVE if k == key => return (Some(idx), free),
                    REMOVED if free.is_none() => free = Some(idx),
                    _ => {}
                }
            }
        }
        (None, free)
    }

    fn write(&self, idx: usize, state: u64, key: u128, rec: Option<&OutRecord>) {
        let s = self.slots.slot(idx);
        let seq = s[0].load(Ordering::Relaxed) as u32;
        s[0].store(u64::from(seq.wrapping_add(1)) | state << 32, Ordering::Relaxed);
        fence(Ordering::Release);
        s[KEY_WORD].store(key as u64, Ordering::Relaxed);
        s[KEY_WORD + 1].store((key >> 64) as u64, Ordering::Relaxed);
        if let Some(r) = rec {
            let mut b = Vec::with_capacity(OutRecord::LEN);
            r.encode_into(&mut b);
            for (i, w) in b.chunks_exact(8).enumerate() {
                s[REC_WORD + i].store(u64::from_le_bytes(w.try_into().unwrap_or([0; 8])), Ordering::Relaxed);
            }
        }
        s[0].store(u64::from(seq.wrapping_add(2)) | state << 32, Ordering::Release);
    }

    /// Publishes `rec` as the record of `path`.
    pub fn put(&self, path: &[u8], rec: &OutRecord) {
        let key = key_of(path);
        match self.find(path, key) {
            (Some(idx), _) | (None, Some(idx)) => self.write(idx, LIVE, key, Some(rec)),
            (None, None) => {
                self.unpublished.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// `path` has no record any more.
    pub fn remove(&self, path: &[u8]) {
        let key = key_of(path);
        if let (Some(idx), _) = self.find(path, key) {
            self.write(idx, REMOVED, key, None);
        }
    }

    /// The bytes of the mapping (tests).
    pub fn bytes(&self) -> &[u8] {
        &self.map
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(id: u64) -> OutRecord {
        OutRecord { size: id * 10, mode: libc::S_IFREG | 0o644, holder: 1, id, sum: id ^ 77, ..Default::default() }
    }

    fn table(slots: u64) -> (tempfile::TempDir, RecordTable) {
        let d = tempfile::tempdir().unwrap();
        let t = RecordTable::create(&d.path().join("x.records"), slots, 3, 0o600).unwrap();
        (d, t)
    }

    #[test]
    fn key_offsets_keep_their_values() {
        assert_eq!((VERSION_OFF, SLOT_LEN_OFF, SLOTS_OFF, RANK_OFF, CHECKSUM_OFF, HEADER_LEN), (8, 12, 16, 24, 56, 64));
        assert_eq!(REC_WORD + REC_WORDS, 13);
    }

    #[test]
    fn put_get_replace_remove() {
        let (_d, t) = table(1 << 10);
        let v = RecordView::parse(t.bytes(), 3).unwrap();
        assert_eq!(v.get(b"a/b"), Found::Unknown);
        t.put(b"a/b", &rec(5));
        assert_eq!(v.get(b"a/b"), Found::Live(rec(5)));
        assert_eq!(v.get(b"a/c"), Found::Unknown);
        t.put(b"a/b", &rec(6));
        assert_eq!(v.get(b"a/b"), Found::Live(rec(6)));
        t.remove(b"a/b");
        assert_eq!(v.get(b"a/b"), Found::Unknown);
        t.put(b"a/b", &rec(7));
        assert_eq!(v.get(b"a/b"), Found::Live(rec(7)));
    }

    /// Against a reference map, with a table small enough that windows fill
    /// and wrap: every hit is the current record, every key the table
    /// published is found, and only records that found no slot are missing.
    #[test]
    fn matches_a_reference_model() {
        let (_d, t) = table(64);
        let v = RecordView::parse(t.bytes(), 3).unwrap();
        let mut model = std::collections::HashMap::new();
        let mut seed = 0x9e3779b97f4a7c15u64;
        for step in 0..20_000u64 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let path = match seed % 5 {
                0 => format!("{}", seed % 40),
                _ => format!("d{}/{}", seed % 3, seed % 120),
            }
            .into_bytes();
            if seed % 3 == 0 {
                t.remove(&path);
                model.remove(&path);
            } else {
                t.put(&path, &rec(step));
                model.insert(path.clone(), rec(step));
            }
            for (p, r) in model.iter().take(8) {
                match v.get(p) {
                    Found::Live(got) => assert_eq!(&got, r),
                    Found::Unknown => assert!(t.unpublished() > 0, "{} missing with every record published", String::from_utf8_lossy(p)),
                }
            }
            match v.get(&path) {
                Found::Live(got) => assert_eq!(Some(&got), model.get(&path)),
                Found::Unknown => assert!(!model.contains_key(&path) || t.unpublished() > 0),
            }
        }
    }

    /// Distinct pages of the mapping holding the slots of `paths`.
    fn pages_of(t: &RecordTable, paths: &[Vec<u8>]) -> usize {
        let pages: std::collections::HashSet<usize> =
            paths.iter().map(|p| (HEADER_LEN + t.find(p, key_of(p)).0.unwrap() * SLOT_LEN) / 4096).collect();
        pages.len()
    }

    #[test]
    fn the_records_of_a_directory_share_a_few_pages() {
        let (_d, t) = table(1 << 16);
        let v = RecordView::parse(t.bytes(), 3).unwrap();
        let paths: Vec<Vec<u8>> = (0..2000).map(|i| format!("ab/test-dir.0-0/mdtest_tree.0/file.mdtest.0.{i}").into_bytes()).collect();
        for (i, p) in paths.iter().enumerate() {
            t.put(p, &rec(i as u64));
        }
        assert_eq!(t.unpublished(), 0);
        assert!(paths.iter().enumerate().all(|(i, p)| v.get(p) == Found::Live(rec(i as u64))));
        // One page per record, or nearly, when each record had a window of its own.
        let window_pages = DIR_WINDOW * SLOT_LEN / 4096;
        assert!(pages_of(&t, &paths) <= window_pages + 2, "{} pages for 2000 records of one directory", pages_of(&t, &paths));
    }

    #[test]
    fn a_directory_past_its_window_spills_into_the_records_own_windows() {
        let (_d, t) = table(DEFAULT_SLOTS); // (a sparse file: only the pages written take space)
        let v = RecordView::parse(t.bytes(), 3).unwrap();
        let paths: Vec<Vec<u8>> = (0..3 * DIR_WINDOW).map(|i| format!("big/shard-{i:06}").into_bytes()).collect();
        for (i, p) in paths.iter().enumerate() {
            t.put(p, &rec(i as u64));
        }
        assert_eq!(t.unpublished(), 0);
        assert!(paths.iter().enumerate().all(|(i, p)| v.get(p) == Found::Live(rec(i as u64))));
        // Removed and put again: still one live slot per path, found.
        for p in paths.iter().step_by(7) {
            t.remove(p);
        }
        for (i, p) in paths.iter().enumerate().step_by(7) {
            assert_eq!(v.get(p), Found::Unknown);
            t.put(p, &rec(i as u64 + 1));
        }
        assert!(paths.iter().enumerate().all(|(i, p)| v.get(p) == Found::Live(rec(i as u64 + u64::from(i % 7 == 0)))));
    }

    #[test]
    fn every_corruption_is_refused() {
        let (_d, t) = table(16);
        let m = t.bytes().to_vec();
        assert!(RecordView::parse(&m, 3).is_ok());
        assert_eq!(RecordView::parse(&m[..10], 3).err(), Some(RecordTableError::Short(10)));
        let mut bad = m.clone();
        bad[0] ^= 1;
        assert_eq!(RecordView::parse(&bad, 3).err(), Some(RecordTableError::Magic));
        let mut bad = m.clone();
        bad[VERSION_OFF] = 1; // the layout of one window per path
        assert_eq!(RecordView::parse(&bad, 3).err(), Some(RecordTableError::Version(1)));
        for off in [SLOT_LEN_OFF, SLOTS_OFF, RANK_OFF, RESERVED_OFF + 5, CHECKSUM_OFF] {
            let mut bad = m.clone();
            bad[off] ^= 0x10;
            assert_eq!(RecordView::parse(&bad, 3).err(), Some(RecordTableError::Checksum), "byte {off}");
        }
        assert_eq!(RecordView::parse(&m, 2).err(), Some(RecordTableError::Rank { found: 3, expected: 2 }));
        assert!(matches!(RecordView::parse(&m[..m.len() - 8], 3), Err(RecordTableError::Size { .. })));
    }

    #[test]
    fn path_beside_the_index() {
        assert_eq!(table_path(b"/dev/shm/fanstore-0-j-r1.index"), b"/dev/shm/fanstore-0-j-r1.records");
    }
}
