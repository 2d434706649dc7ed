//! Pack files: many units appended to one large file, so that storing a
//! unit costs a write, not a file creation (0.3-1 ms each on ext4, which
//! dominated commits of many small tensors). A record is exactly the image
//! a unit file had (its 128-byte version 2 header with its own checksums,
//! then its body, see [`mod@crate::unit`]), so a pack is self-describing:
//! scanning the record headers rebuilds where every unit is, and no index
//! has to agree with the records after a crash.
//!
//! ```text
//! units/<seq:016x>.fsk     seq: 1, 2, ... never reused by a store (the
//!                          highest pack is never deleted); .fsk, as .fsp
//!                          names the dataset's partition files
//! pack header (HEADER_LEN = 40):
//!   0..8    magic "FANSTPK\0"
//!   8..12   version (1)
//!  12..16   reserved, zero
//!  16..24   pack sequence number (= the file name)
//!  24..32   nonce: random, tells apart packs of the same sequence number
//!           written by different stores (a drain appends only the tail of a
//!           pack whose header it already holds)
//!  32..40   xxh3 of header bytes 0..32
//! 40..      records, back to back:
//!   +0..128       unit header, version 2 (unit.rs: magic, lengths, blake3,
//!                 payload xxh3, base, body length, body xxh3, header xxh3)
//!   +128..+128+B  body (B = the header's body length)
//! ```
//!
//! The header's frame (magic, version, checksum) is checked by
//! [`fanstore_core::format`].
//!
//! Records are only appended; a pack is never rewritten. Appending threads
//! reserve disjoint ranges and pwrite into them, so a crash can leave a
//! *torn tail*: a record whose header or body is incomplete, possibly
//! followed by complete ones of the same (uncommitted) commit. [`scan`]
//! stops at the first record that does not parse or does not fit, and the
//! store truncates the pack there when no committed unit is missing (see
//! `packs.rs`). A unit may have records in two packs (compaction copied it
//! and stopped before deleting the old pack, or it was freed and stored
//! again): the store picks the latest one whose body checks out.

use crate::error::{CkptError, Result};
use crate::unit::{self, UnitHeader};
use fanstore_core::format::{self, read_full_at, FormatHeader, HeaderVersion};
use fanstore_core::le::*;
use fanstore_core::FormatError;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

pub const MAGIC: [u8; 8] = *b"FANSTPK\0";
/// The version this build writes (and the only one it reads).
pub const VERSION: u32 = 1;

format::layout! {
    format::FIELDS_OFFSET;
    RESERVED_OFF: 4, SEQ_OFF: 8, NONCE_OFF: 8, CHECKSUM_OFF: format::CHECKSUM_LEN =>
    /// Length of the pack header; the first record starts here.
    pub HEADER_LEN
}

/// The pack header's frame.
pub const HEADER: FormatHeader =
    FormatHeader { what: "pack", magic: MAGIC, versions: &[HeaderVersion { version: VERSION, len: HEADER_LEN }] };

/// The file name of pack `seq`.
pub fn file_name(seq: u64) -> String {
    format!("{seq:016x}.fsk")
}

/// The sequence number a pack file name stands for.
pub fn parse_name(name: &str) -> Option<u64> {
    let s = name.strip_suffix(".fsk")?;
    if s.len() != 16 {
        return None;
    }
    u64::from_str_radix(s, 16).ok()
}

/// The path of pack `seq` under the store's `units` directory.
pub fn path(units_dir: &Path, seq: u64) -> PathBuf {
    units_dir.join(file_name(seq))
}

/// The decoded header of a pack file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PackHeader {
    pub seq: u64,
    pub nonce: u64,
}

impl PackHeader {
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        put_u64(&mut b, SEQ_OFF, self.seq);
        put_u64(&mut b, NONCE_OFF, self.nonce);
        HEADER.seal(&mut b);
        b
    }

    /// Decodes the first bytes of pack `file` (all of them if shorter than a header).
    pub fn decode(file: &Path, b: &[u8]) -> Result<PackHeader> {
        HEADER.check(file, b)?;
        let seq = u64_at(b, SEQ_OFF);
        if u32_at(b, RESERVED_OFF) != 0 || seq == 0 {
            return Err(FormatError::Corrupt {
                file: file.into(),
                entry: "pack header".into(),
                offset: RESERVED_OFF as u64,
                problem: format!("reserved field {} and sequence number {seq}", u32_at(b, RESERVED_OFF)),
            }
            .into());
        }
        Ok(PackHeader { seq, nonce: u64_at(b, NONCE_OFF) })
    }
}

/// A nonce for a new pack: distinct across stores and processes.
pub fn new_nonce(seq: u64) -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(seq);
    h.write_u32(std::process::id());
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    h.write_u128(t);
    h.finish()
}

/// Creates pack `header.seq` at `file` (which must not exist) holding its
/// header only. On failure nothing is left behind.
pub fn create(file: &Path, header: &PackHeader) -> Result<File> {
    let f = File::options().read(true).write(true).create_new(true).open(file).map_err(|e| CkptError::io(file, e))?;
    if let Err(e) = f.write_all_at(&header.encode(), 0) {
        let _ = std::fs::remove_file(file);
        return Err(CkptError::io(file, e));
    }
    Ok(f)
}

/// Opens pack `file` for reading and appending and checks its header.
pub fn open(file: &Path) -> Result<(File, PackHeader)> {
    let f = File::options().read(true).write(true).open(file).map_err(|e| CkptError::io(file, e))?;
    let mut b = [0u8; HEADER_LEN];
    let n = read_full_at(&f, &mut b, 0).map_err(|e| CkptError::io(file, e))?;
    let head = PackHeader::decode(file, &b[..n])?;
    Ok((f, head))
}

/// One record of a pack: the unit whose header starts at `off`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record {
    pub off: u64,
    pub head: UnitHeader,
}

impl Record {
    /// Bytes of the record (header and body).
    pub fn len(&self) -> u64 {
        self.head.file_len()
    }

    pub fn is_empty(&self) -> bool {
        false
    }

    pub fn end(&self) -> u64 {
        self.off + self.len()
    }
}

/// What [`scan`] found in a pack.
#[derive(Debug)]
pub struct Scan {
    pub header: PackHeader,
    /// Every record up to the first that does not parse or fit, in file order.
    pub records: Vec<Record>,
    /// End of the last good record (where appending may continue).
    pub valid_len: u64,
    pub file_len: u64,
    /// Why the scan stopped before `file_len`, when it did.
    pub tail: Option<CkptError>,
}

/// Reads the header of pack `file` and the header of every record (one
/// pread each: bodies are skipped by their length, not read).
pub fn scan(file: &Path) -> Result<Scan> {
    let (f, header) = open(file)?;
    scan_open(file, &f, header)
}

/// [`scan`] of a pack already open as `f`.
pub fn scan_open(file: &Path, f: &File, header: PackHeader) -> Result<Scan> {
    let file_len = f.metadata().map_err(|e| CkptError::io(file, e))?.len();
    let mut records = Vec::new();
    let mut off = HEADER_LEN as u64;
    let mut tail = None;
    while off < file_len {
        match unit::read_header_at(file, f, off) {
            Ok(head) if head.header_len != unit::HEADER_LEN as u64 => {
                tail = Some(CkptError::from(FormatError::Corrupt {
                    file: file.into(),
                    entry: "pack record".into(),
                    offset: off,
                    problem: "a version 1 unit header (packs hold version 2 records)".into(),
                }));
                break;
            }
            Ok(head) => {
                let r = Record { off, head };
                if r.end() > file_len {
                    tail = Some(CkptError::from(FormatError::Truncated {
                        file: file.into(),
                        entry: format!("record of unit {}", unit::hex(&head.blake3)),
                        offset: off,
                        needed: r.len(),
                        len: file_len - off,
                    }));
                    break;
                }
                off = r.end();
                records.push(r);
            }
            Err(e) => {
                tail = Some(e);
                break;
            }
        }
    }
    Ok(Scan { header, records, valid_len: off, file_len, tail })
}

/// Checks the body of record `r` of pack `f` against its xxh3 (used to
/// choose between two records of one unit).
pub fn body_ok(file: &Path, f: &File, r: &Record) -> bool {
    unit::read_body(file, f, r.off, &r.head).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::unit::Hash;
    use fanstore_core::checksum::xxh3;

    #[test]
    fn every_header_fault_is_named() {
        let good = PackHeader { seq: 3, nonce: 0x1234_5678 }.encode();
        format::testing::assert_header_faults_named(&HEADER, "units/0000000000000003.fsk", &good, |b| {
            PackHeader::decode(Path::new("units/0000000000000003.fsk"), b)
        });
    }

    #[test]
    fn the_written_layout_is_unchanged() {
        let b = PackHeader { seq: 3, nonce: 0x1234_5678 }.encode();
        assert_eq!(xxh3(&b), 13_279_227_832_005_055_774);
        assert_eq!((SEQ_OFF, NONCE_OFF, HEADER_LEN), (16, 24, 40));
    }

    struct Built {
        _t: tempfile::TempDir,
        path: PathBuf,
        units: Vec<(Hash, Vec<u8>, Record)>,
    }

    /// A pack holding `n` raw and grouped units, written as the store does.
    fn build(n: usize) -> Built {
        let t = tempfile::tempdir().unwrap();
        let path = t.path().join(file_name(7));
        let f = create(&path, &PackHeader { seq: 7, nonce: 99 }).unwrap();
        let mut off = HEADER_LEN as u64;
        let mut units = Vec::new();
        for i in 0..n {
            let payload: Vec<u8> = if i % 2 == 0 {
                (0..1000 + i * 37).map(|k| (k * 31 + i) as u8).collect()
            } else {
                (0..2000u32).flat_map(|k| ((k as f32 + i as f32) * 0.001).to_le_bytes()).collect()
            };
            let h = unit::hash(&payload);
            let (head, body) = unit::encode(&h, xxh3(&payload), &payload, if i % 2 == 0 { 1 } else { 4 }, None);
            f.write_all_at(&head.encode(), off).unwrap();
            f.write_all_at(&body, off + unit::HEADER_LEN as u64).unwrap();
            let r = Record { off, head };
            off = r.end();
            units.push((h, payload, r));
        }
        Built { _t: t, path, units }
    }

    fn load(path: &Path, r: &Record, h: &Hash, len: usize) -> Result<Vec<u8>> {
        let f = File::open(path).unwrap();
        let mut v = vec![0u8; len];
        unit::load_at(path, &f, r.off, h, &mut v, true, 8, &mut |_, _, _| unreachable!("no deltas"))?;
        Ok(v)
    }

    #[test]
    fn records_round_trip_through_a_scan() {
        let b = build(6);
        let s = scan(&b.path).unwrap();
        assert_eq!(s.header, PackHeader { seq: 7, nonce: 99 });
        assert!(s.tail.is_none());
        assert_eq!(s.valid_len, s.file_len);
        assert_eq!(s.records, b.units.iter().map(|u| u.2).collect::<Vec<_>>());
        for (h, payload, r) in &b.units {
            assert_eq!(&load(&b.path, r, h, payload.len()).unwrap(), payload);
        }
        assert_eq!(parse_name(&file_name(7)), Some(7));
        assert_eq!(parse_name("7.fsk"), None);
    }

    #[test]
    fn every_pack_header_byte_is_checked() {
        let b = build(2);
        let orig = std::fs::read(&b.path).unwrap();
        for off in 0..HEADER_LEN {
            let mut m = orig.clone();
            m[off] ^= 0x10;
            std::fs::write(&b.path, &m).unwrap();
            let e = scan(&b.path).unwrap_err().to_string();
            let named = if off < 8 {
                e.contains("not a FanStore pack")
            } else if off < 12 {
                e.contains("unsupported pack format version")
            } else {
                e.contains("checksum mismatch in pack header")
            };
            assert!(named && e.contains(".fsk"), "offset {off}: {e}");
        }
        // An unknown version is refused even with a valid checksum.
        let mut m = orig.clone();
        put_u32(&mut m, format::VERSION_OFFSET, 2);
        format::testing::reseal(&mut m, HEADER_LEN);
        std::fs::write(&b.path, &m).unwrap();
        let e = scan(&b.path).unwrap_err().to_string();
        assert!(e.contains("unsupported pack format version 2") && e.contains(&file_name(7)), "{e}");
        std::fs::write(&b.path, &orig[..20]).unwrap();
        assert!(matches!(scan(&b.path), Err(CkptError::Format(FormatError::Truncated { .. }))));
    }

    #[test]
    fn every_record_header_byte_is_checked_and_named() {
        let b = build(3);
        let orig = std::fs::read(&b.path).unwrap();
        let (h, payload, r) = &b.units[1];
        for k in 0..unit::HEADER_LEN as u64 {
            let mut m = orig.clone();
            m[(r.off + k) as usize] ^= 0x04;
            std::fs::write(&b.path, &m).unwrap();
            // Reading the unit: an error naming the pack and an offset inside the record.
            let e = load(&b.path, r, h, payload.len()).unwrap_err();
            let text = e.to_string();
            assert!(e.is_corruption() && text.contains(".fsk") && text.contains("unit header"), "byte {k}: {text}");
            // Scanning: the records before it survive, the scan stops there.
            let s = scan(&b.path).unwrap();
            assert_eq!(s.records, vec![b.units[0].2], "byte {k}");
            assert_eq!(s.valid_len, r.off);
            let tail = s.tail.unwrap().to_string();
            assert!(tail.contains(&format!("offset {}", r.off)), "byte {k}: {tail}");
        }
        // A body byte: the record scans (bodies are not read) but the unit never reads back wrong.
        let mut m = orig.clone();
        m[(r.off + unit::HEADER_LEN as u64 + 5) as usize] ^= 1;
        std::fs::write(&b.path, &m).unwrap();
        assert_eq!(scan(&b.path).unwrap().records.len(), 3);
        let e = load(&b.path, r, h, payload.len()).unwrap_err().to_string();
        assert!(e.contains(&format!("{}", r.off + unit::HEADER_LEN as u64)) || e.contains("unit payload"), "{e}");
        assert!(e.contains("checksum mismatch"), "{e}");
        let f = File::open(&b.path).unwrap();
        assert!(!body_ok(&b.path, &f, r) || r.head.encoding == crate::codec::Encoding::Raw);
    }

    #[test]
    fn a_torn_tail_stops_the_scan_after_the_intact_records() {
        let b = build(4);
        let orig = std::fs::read(&b.path).unwrap();
        let last = b.units[3].2;
        for cut in [last.off + 1, last.off + 100, last.off + unit::HEADER_LEN as u64, last.end() - 1] {
            std::fs::write(&b.path, &orig[..cut as usize]).unwrap();
            let s = scan(&b.path).unwrap();
            assert_eq!(s.records.len(), 3, "cut at {cut}");
            assert_eq!(s.valid_len, last.off);
            assert_eq!(s.file_len, cut);
            assert!(s.tail.is_some());
            for (h, payload, r) in &b.units[..3] {
                assert_eq!(&load(&b.path, r, h, payload.len()).unwrap(), payload);
            }
        }
        // Zeros where a record should be (a reserved range never written).
        let mut m = orig.clone();
        m.truncate(last.off as usize);
        m.extend(std::iter::repeat_n(0, 500));
        std::fs::write(&b.path, &m).unwrap();
        let s = scan(&b.path).unwrap();
        assert_eq!((s.records.len(), s.valid_len), (3, last.off));
        assert!(s.tail.unwrap().to_string().contains("bad magic"));
    }
}
