//! The parts file: how a writer hands a checkpoint to its daemon as parts
//! (`CKPT_PUT`, see `fanstore_core::wire`): one sealed memfd holding a
//! header, a part table and a data section. Written by the `fanstore`
//! Python package (`python/fanstore/_parts.py`), read here.
//!
//! ```text
//! header (48 bytes, all integers little-endian)
//!  0..8    magic "FSPARTS\0"
//!  8..12   version (1)
//! 12..16   part count n
//! 16..24   file length: the bytes the parts make, in table order
//! 24..32   xxh3 of those bytes (the whole file; kept in its recipe and record)
//! 32..40   data offset D (>= 48 + 48 n): where the data section starts
//! 40..48   xxh3 of bytes 0..40 followed by the part table (48..48+48n)
//! part table: n entries of 48 bytes, in file order
//!  0       kind: 1 glue, 2 new unit, 3 reference to a stored unit
//!  1..8    zero
//!  8..16   length: bytes this part adds to the file
//! 16..48   glue, new unit: 16..24 offset of its bytes in the data section,
//!          24..48 zero; reference: the unit's blake3
//! data section: D.. to the end of the memfd
//! ```
//!
//! Glue parts must be the bytes between the units exactly as the store's
//! split finds them (see [`crate::parts`]): the commit is refused otherwise.

use crate::parts::PartUnit;
use crate::unit::Hash;
use fanstore_core::checksum::StreamingChecksum;
use std::ops::Range;

pub const MAGIC: [u8; 8] = *b"FSPARTS\0";
pub const VERSION: u32 = 1;
pub const HEADER_LEN: usize = 48;
pub const ENTRY_LEN: usize = 48;
pub const KIND_GLUE: u8 = 1;
pub const KIND_NEW: u8 = 2;
pub const KIND_REF: u8 = 3;

/// A parts file that cannot be taken as one.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PartsError {
    #[error("parts file of {0} bytes is shorter than its header or table")]
    Short(usize),
    #[error("not a parts file (bad magic)")]
    BadMagic,
    #[error("unsupported parts file version {0}")]
    Version(u32),
    #[error("parts file header or table checksum mismatch")]
    Checksum,
    #[error("part {index}: {problem}")]
    Part { index: usize, problem: String },
    #[error("the parts make {made} bytes, the header says {said}")]
    Length { made: u64, said: u64 },
}

/// A decoded parts file: what the store's [`crate::CheckpointStore::commit_parts`] takes.
pub struct Parts {
    /// The file with its glue in place and zeros where its units go
    /// (an anonymous mapping: the unit ranges are never touched, so never allocated).
    pub skeleton: memmap2::MmapMut,
    /// Each unit's range in the file and where its bytes come from (a
    /// [`PartUnit::New`] range is in the whole parts file).
    pub units: Vec<(Range<usize>, PartUnit)>,
    pub file_xxh3: u64,
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

/// Decodes `b` (a whole parts file) and builds its skeleton.
pub fn decode(b: &[u8]) -> Result<Parts, PartsError> {
    if b.len() < HEADER_LEN {
        return Err(PartsError::Short(b.len()));
    }
    if b[..8] != MAGIC {
        return Err(PartsError::BadMagic);
    }
    let version = u32_at(b, 8);
    if version != VERSION {
        return Err(PartsError::Version(version));
    }
    let n = u32_at(b, 12) as usize;
    let file_len = u64_at(b, 16);
    let file_xxh3 = u64_at(b, 24);
    let data_off = u64_at(b, 32);
    let table_end = n.checked_mul(ENTRY_LEN).and_then(|t| t.checked_add(HEADER_LEN)).ok_or(PartsError::Short(b.len()))?;
    if table_end > b.len() {
        return Err(PartsError::Short(b.len()));
    }
    let mut sum = StreamingChecksum::new();
    sum.update(&b[..40]);
    sum.update(&b[HEADER_LEN..table_end]);
    if sum.digest() != u64_at(b, 40) {
        return Err(PartsError::Checksum);
    }
    let data = usize::try_from(data_off).ok().filter(|&d| d >= table_end && d <= b.len()).ok_or(PartsError::Part {
        index: 0,
        problem: format!("data offset {data_off} outside {table_end}..={}", b.len()),
    })?;
    let file_len = usize::try_from(file_len).map_err(|_| PartsError::Length { made: 0, said: file_len })?;
    let mut skeleton = memmap2::MmapMut::map_anon(file_len.max(1)).map_err(|e| PartsError::Part { index: 0, problem: format!("mapping {file_len} bytes: {e}") })?;
    let mut units = Vec::new();
    let mut at = 0usize;
    for i in 0..n {
        let e = &b[HEADER_LEN + i * ENTRY_LEN..HEADER_LEN + (i + 1) * ENTRY_LEN];
        let bad = |problem: String| PartsError::Part { index: i, problem };
        let len = usize::try_from(u64_at(e, 8)).map_err(|_| bad("length does not fit".into()))?;
        let end = at.checked_add(len).filter(|&end| end <= file_len).ok_or(PartsError::Length { made: (at + len.min(usize::MAX - at)) as u64, said: file_len as u64 })?;
        let src = || -> Result<Range<usize>, PartsError> {
            let off = usize::try_from(u64_at(e, 16)).map_err(|_| bad("offset does not fit".into()))?;
            let start = data.checked_add(off).ok_or_else(|| bad("offset overflows".into()))?;
            let stop = start.checked_add(len).filter(|&s| s <= b.len()).ok_or_else(|| bad(format!("bytes {off}+{len} past the data section")))?;
            Ok(start..stop)
        };
        match e[0] {
            KIND_GLUE => {
                let r = src()?;
                skeleton[at..end].copy_from_slice(&b[r]);
            }
            KIND_NEW => units.push((at..end, PartUnit::New(src()?))),
            KIND_REF => {
                let mut h: Hash = [0; 32];
                h.copy_from_slice(&e[16..48]);
                units.push((at..end, PartUnit::Ref(h)));
            }
            k => return Err(bad(format!("unknown kind {k}"))),
        }
        at = end;
    }
    if at != file_len {
        return Err(PartsError::Length { made: at as u64, said: file_len as u64 });
    }
    Ok(Parts { skeleton, units, file_xxh3 })
}

/// Encodes a parts file (the Python package writes the same bytes; tests
/// and Rust writers use this). `parts`: (kind, length, data offset or blake3).
pub fn encode(file_len: u64, file_xxh3: u64, parts: &[(u8, u64, [u8; 32])], data: &[u8]) -> Vec<u8> {
    let table_end = HEADER_LEN + parts.len() * ENTRY_LEN;
    let mut b = vec![0u8; table_end];
    b[..8].copy_from_slice(&MAGIC);
    b[8..12].copy_from_slice(&VERSION.to_le_bytes());
    b[12..16].copy_from_slice(&(parts.len() as u32).to_le_bytes());
    b[16..24].copy_from_slice(&file_len.to_le_bytes());
    b[24..32].copy_from_slice(&file_xxh3.to_le_bytes());
    b[32..40].copy_from_slice(&(table_end as u64).to_le_bytes());
    for (i, (kind, len, tail)) in parts.iter().enumerate() {
        let e = &mut b[HEADER_LEN + i * ENTRY_LEN..HEADER_LEN + (i + 1) * ENTRY_LEN];
        e[0] = *kind;
        e[8..16].copy_from_slice(&len.to_le_bytes());
        e[16..48].copy_from_slice(tail);
    }
    let mut sum = StreamingChecksum::new();
    sum.update(&b[..40]);
    sum.update(&b[HEADER_LEN..table_end]);
    let s = sum.digest();
    b[40..48].copy_from_slice(&s.to_le_bytes());
    b.extend_from_slice(data);
    b
}

/// The 32-byte tail of a glue or new-unit entry: its data offset.
pub fn offset_tail(off: u64) -> [u8; 32] {
    let mut t = [0u8; 32];
    t[..8].copy_from_slice(&off.to_le_bytes());
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_checks() {
        let data = b"GLUE1unitbytesGLUE2".to_vec();
        let parts = [(KIND_GLUE, 5, offset_tail(0)), (KIND_NEW, 9, offset_tail(5)), (KIND_REF, 4, [9u8; 32]), (KIND_GLUE, 5, offset_tail(14))];
        let b = encode(23, 77, &parts, &data);
        let p = decode(&b).unwrap();
        assert_eq!(&p.skeleton[..5], b"GLUE1");
        assert_eq!(&p.skeleton[5..18], &[0u8; 13]);
        assert_eq!(&p.skeleton[18..23], b"GLUE2");
        assert_eq!(p.file_xxh3, 77);
        let d = 48 + 4 * 48;
        assert_eq!(p.units, vec![(5..14, PartUnit::New(d + 5..d + 14)), (14..18, PartUnit::Ref([9u8; 32]))]);
        // Every flipped header or table byte is caught.
        for i in [0, 9, 13, 17, 25, 33, 41, 48, 56, 70, 200] {
            let mut c = b.clone();
            c[i] ^= 1;
            assert!(decode(&c).is_err(), "byte {i}");
        }
        // Parts longer than the file, or bytes past the data section.
        assert!(matches!(decode(&encode(10, 0, &parts, &data)), Err(PartsError::Length { .. })));
        assert!(matches!(decode(&encode(23, 0, &parts, &data[..10])), Err(PartsError::Part { .. })));
        assert!(matches!(decode(&b[..40]), Err(PartsError::Short(40))));
    }
}
