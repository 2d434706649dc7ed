//! Partition files: one exclusive subset of the dataset's file payloads.
//!
//! A partition is written once by `fanstore-prep` and read sequentially once
//! by the daemon that loads it. All integers are little-endian.
//!
//! ```text
//! partition file
//! +--------------------+  offset 0
//! | header (64 bytes)  |
//! +--------------------+  HEADER_LEN
//! | entry 0 header (48)|
//! | entry 0 payload    |  stored_len bytes, raw or compressed
//! | entry 1 header     |
//! | ...                |
//! +--------------------+  HEADER_LEN + data_len
//!
//! header                                  entry header
//!  0..8   magic  "FANSTPT\0"               0..8   path_hash  xxh3 of the file's
//!  8..12  version (1)                                        normalised path
//! 12..16  partition id                     8..16  raw_len    logical size
//! 16..24  entry count                     16..24  stored_len payload bytes
//! 24..32  data_len (bytes after header)   24..25  codec (0 none,1 lz4,2 zstd)
//! 32..40  dataset id                      25..32  reserved, zero
//! 40..44  flags (bit 0: replicated)       32..40  payload xxh3
//! 44..56  reserved, zero                  40..48  xxh3 of entry header 0..40
//! 56..64  xxh3 of header bytes 0..56
//! ```
//!
//! The header's frame (magic, version, checksum) is checked by
//! [`crate::format`]; the entry headers have a checksum but no frame.
//!
//! The manifest records, for every file, the offset of its *payload* (just
//! past its entry header), so a single file can be read without scanning.

use crate::checksum::{xxh3, StreamingChecksum};
use crate::codec::Codec;
use crate::error::{FormatError, Result};
use crate::format::{self, read_full, FormatHeader, HeaderVersion};
use crate::le::*;
use std::fs::File;
use crate::align::AlignedReader;
use std::io::{BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

pub const MAGIC: [u8; 8] = *b"FANSTPT\0";
pub const VERSION: u32 = 1;

format::layout! {
    format::FIELDS_OFFSET;
    ID_OFF: 4, COUNT_OFF: 8, DATA_LEN_OFF: 8, DATASET_OFF: 8, FLAGS_OFF: 4, RESERVED_OFF: 12,
    CHECKSUM_OFF: format::CHECKSUM_LEN =>
    /// Length of the partition header.
    pub HEADER_LEN
}

/// The partition header's frame.
pub const HEADER: FormatHeader =
    FormatHeader { what: "partition", magic: MAGIC, versions: &[HeaderVersion { version: VERSION, len: HEADER_LEN }] };

format::layout! {
    0;
    E_PATH_HASH_OFF: 8, E_RAW_OFF: 8, E_STORED_OFF: 8, E_CODEC_OFF: 8, E_PAYLOAD_SUM_OFF: 8,
    E_CHECKSUM_OFF: 8 =>
    /// Length of an entry header.
    pub ENTRY_HEADER_LEN
}

/// Flag bit: every node loads this partition.
pub const FLAG_REPLICATED: u32 = 1;

/// The file name of partition `id` inside a dataset directory.
pub fn file_name(id: u32) -> String {
    format!("part-{id:06}.fsp")
}

/// The decoded partition header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionHeader {
    pub id: u32,
    pub entry_count: u64,
    pub data_len: u64,
    pub dataset_id: u64,
    pub flags: u32,
    /// The header's own checksum, which the manifest records to tie the two.
    pub checksum: u64,
}

impl PartitionHeader {
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        put_u32(&mut b, ID_OFF, self.id);
        put_u64(&mut b, COUNT_OFF, self.entry_count);
        put_u64(&mut b, DATA_LEN_OFF, self.data_len);
        put_u64(&mut b, DATASET_OFF, self.dataset_id);
        put_u32(&mut b, FLAGS_OFF, self.flags);
        HEADER.seal(&mut b);
        b
    }

    /// Decodes the first bytes of partition `file` (all of them if shorter than a header).
    pub fn decode(file: &Path, b: &[u8]) -> Result<PartitionHeader> {
        HEADER.check(file, b)?;
        Ok(PartitionHeader {
            id: u32_at(b, ID_OFF),
            entry_count: u64_at(b, COUNT_OFF),
            data_len: u64_at(b, DATA_LEN_OFF),
            dataset_id: u64_at(b, DATASET_OFF),
            flags: u32_at(b, FLAGS_OFF),
            checksum: u64_at(b, CHECKSUM_OFF),
        })
    }
}

/// The decoded header of one entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntryHeader {
    pub path_hash: u64,
    pub raw_len: u64,
    pub stored_len: u64,
    pub codec: Codec,
    pub payload_checksum: u64,
}

impl EntryHeader {
    pub fn encode(&self) -> [u8; ENTRY_HEADER_LEN] {
        let mut b = [0u8; ENTRY_HEADER_LEN];
        put_u64(&mut b, E_PATH_HASH_OFF, self.path_hash);
        put_u64(&mut b, E_RAW_OFF, self.raw_len);
        put_u64(&mut b, E_STORED_OFF, self.stored_len);
        b[E_CODEC_OFF] = self.codec as u8;
        put_u64(&mut b, E_PAYLOAD_SUM_OFF, self.payload_checksum);
        let sum = xxh3(&b[..E_CHECKSUM_OFF]);
        put_u64(&mut b, E_CHECKSUM_OFF, sum);
        b
    }

    /// Decodes the entry header found at `offset` of `file`.
    pub fn decode(file: &Path, offset: u64, b: &[u8]) -> Result<EntryHeader> {
        let entry = || format!("entry header at offset {offset}");
        if b.len() < ENTRY_HEADER_LEN {
            return Err(FormatError::Truncated {
                file: file.into(),
                entry: entry(),
                offset,
                needed: ENTRY_HEADER_LEN as u64,
                len: b.len() as u64,
            });
        }
        FormatError::check_xxh3(file, entry, offset, &b[..E_CHECKSUM_OFF], u64_at(b, E_CHECKSUM_OFF))?;
        let codec = Codec::from_u8(b[E_CODEC_OFF]).ok_or_else(|| FormatError::Corrupt {
            file: file.into(),
            entry: entry(),
            offset,
            problem: format!("unknown codec {}", b[E_CODEC_OFF]),
        })?;
        Ok(EntryHeader {
            path_hash: u64_at(b, E_PATH_HASH_OFF),
            raw_len: u64_at(b, E_RAW_OFF),
            stored_len: u64_at(b, E_STORED_OFF),
            codec,
            payload_checksum: u64_at(b, E_PAYLOAD_SUM_OFF),
        })
    }
}

/// Writes one partition file. Entries are appended in order; [`finish`]
/// rewrites the header with the final counts.
///
/// [`finish`]: PartitionWriter::finish
pub struct PartitionWriter {
    path: PathBuf,
    out: BufWriter<File>,
    id: u32,
    flags: u32,
    pos: u64,
    entries: u64,
}

impl PartitionWriter {
    pub fn create(path: &Path, id: u32, flags: u32) -> Result<PartitionWriter> {
        let f = File::create(path).map_err(|e| FormatError::io(path, e))?;
        let mut out = BufWriter::with_capacity(1 << 20, f);
        // Placeholder header with a zero magic: an unfinished partition is never valid.
        out.write_all(&[0u8; HEADER_LEN]).map_err(|e| FormatError::io(path, e))?;
        Ok(PartitionWriter { path: path.into(), out, id, flags, pos: HEADER_LEN as u64, entries: 0 })
    }

    /// Appends an entry whose payload is in memory. Returns the payload offset.
    pub fn append(&mut self, path_hash: u64, raw_len: u64, codec: Codec, payload: &[u8]) -> Result<u64> {
        let h = EntryHeader {
            path_hash,
            raw_len,
            stored_len: payload.len() as u64,
            codec,
            payload_checksum: xxh3(payload),
        };
        let io = |e| FormatError::io(&self.path, e);
        self.out.write_all(&h.encode()).map_err(io)?;
        self.out.write_all(payload).map_err(|e| FormatError::io(&self.path, e))?;
        let payload_off = self.pos + ENTRY_HEADER_LEN as u64;
        self.pos = payload_off + payload.len() as u64;
        self.entries += 1;
        Ok(payload_off)
    }

    /// Appends a raw entry streamed from `input`, which must yield exactly
    /// `len` bytes (a file that changed size fails). Returns (payload offset, checksum).
    pub fn append_raw_stream(&mut self, path_hash: u64, len: u64, input: &mut impl Read) -> std::io::Result<(u64, u64)> {
        let header_pos = self.pos;
        self.out.write_all(&[0u8; ENTRY_HEADER_LEN])?;
        let mut sum = StreamingChecksum::new();
        let mut buf = crate::align::AlignedBuf::zeroed(1 << 20);
        let mut left = len;
        while left > 0 {
            let want = buf.len().min(left as usize);
            let n = input.read(&mut buf[..want])?;
            if n == 0 {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    format!("file shrank while packing: expected {len} bytes, got {}", len - left),
                ));
            }
            sum.update(&buf[..n]);
            self.out.write_all(&buf[..n])?;
            left -= n as u64;
        }
        let mut probe = [0u8; 1];
        if input.read(&mut probe)? != 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("file grew while packing: more than the {len} bytes it had when listed"),
            ));
        }
        let checksum = sum.digest();
        let h = EntryHeader { path_hash, raw_len: len, stored_len: len, codec: Codec::None, payload_checksum: checksum };
        self.out.flush()?;
        let f = self.out.get_mut();
        f.seek(SeekFrom::Start(header_pos))?;
        f.write_all(&h.encode())?;
        f.seek(SeekFrom::End(0))?;
        let payload_off = header_pos + ENTRY_HEADER_LEN as u64;
        self.pos = payload_off + len;
        self.entries += 1;
        Ok((payload_off, checksum))
    }

    /// Writes the final header and syncs the file. Returns the header.
    pub fn finish(mut self, dataset_id: u64) -> Result<PartitionHeader> {
        let h = PartitionHeader {
            id: self.id,
            entry_count: self.entries,
            data_len: self.pos - HEADER_LEN as u64,
            dataset_id,
            flags: self.flags,
            checksum: 0,
        };
        let enc = h.encode();
        let io = |e| FormatError::io(&self.path, e);
        self.out.flush().map_err(io)?;
        let f = self.out.get_mut();
        f.seek(SeekFrom::Start(0)).map_err(|e| FormatError::io(&self.path, e))?;
        f.write_all(&enc).map_err(|e| FormatError::io(&self.path, e))?;
        f.sync_all().map_err(|e| FormatError::io(&self.path, e))?;
        Ok(PartitionHeader { checksum: u64_at(&enc, CHECKSUM_OFF), ..h })
    }

    pub fn position(&self) -> u64 {
        self.pos
    }
}

/// One entry as read back from a partition.
#[derive(Debug)]
pub struct Entry {
    pub header: EntryHeader,
    /// Offset of the payload in the partition file.
    pub payload_offset: u64,
    pub payload: Vec<u8>,
}

/// Reads a partition sequentially, verifying every checksum.
pub struct PartitionReader {
    path: PathBuf,
    input: AlignedReader<File>,
    header: PartitionHeader,
    file_len: u64,
    pos: u64,
    seen: u64,
}

impl PartitionReader {
    pub fn open(path: &Path) -> Result<PartitionReader> {
        let f = File::open(path).map_err(|e| FormatError::io(path, e))?;
        let file_len = f.metadata().map_err(|e| FormatError::io(path, e))?.len();
        let mut input = AlignedReader::new(f, 0, 4 << 20);
        let mut hb = [0u8; HEADER_LEN];
        let got = read_full(&mut input, &mut hb).map_err(|e| FormatError::io(path, e))?;
        let header = PartitionHeader::decode(path, &hb[..got])?;
        let expect = HEADER_LEN as u64 + header.data_len;
        if expect != file_len {
            return Err(FormatError::Corrupt {
                file: path.into(),
                entry: "partition header".into(),
                offset: DATA_LEN_OFF as u64,
                problem: format!("header says {expect} bytes, file has {file_len}"),
            });
        }
        Ok(PartitionReader { path: path.into(), input, header, file_len, pos: HEADER_LEN as u64, seen: 0 })
    }

    pub fn header(&self) -> &PartitionHeader {
        &self.header
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Reads the next entry, or `None` after the last. Every checksum is verified.
    pub fn next_entry(&mut self) -> Result<Option<Entry>> {
        self.next_entry_with(&|_| false)
    }

    /// As [`PartitionReader::next_entry`], except that the payload of an
    /// entry for which `elsewhere(payload offset)` holds is neither read nor
    /// checked: the caller keeps those bytes in another file (a replica whose
    /// large files were written straight to their own files, leaving a hole
    /// here) and must verify them against the entry's `payload_checksum`
    /// itself. Such an entry is returned with an empty `payload`; its header
    /// is verified as always.
    pub fn next_entry_with(&mut self, elsewhere: &dyn Fn(u64) -> bool) -> Result<Option<Entry>> {
        if self.seen == self.header.entry_count {
            if self.pos != self.file_len {
                return Err(FormatError::Corrupt {
                    file: self.path.clone(),
                    entry: "partition".into(),
                    offset: self.pos,
                    problem: format!("{} trailing bytes after the last entry", self.file_len - self.pos),
                });
            }
            return Ok(None);
        }
        let off = self.pos;
        let mut hb = [0u8; ENTRY_HEADER_LEN];
        let got = read_full(&mut self.input, &mut hb).map_err(|e| FormatError::io(&self.path, e))?;
        let header = EntryHeader::decode(&self.path, off, &hb[..got])?;
        let payload_offset = off + ENTRY_HEADER_LEN as u64;
        if payload_offset + header.stored_len > self.file_len {
            return Err(FormatError::Truncated {
                file: self.path.clone(),
                entry: format!("payload of entry {}", self.seen),
                offset: payload_offset,
                needed: header.stored_len,
                len: self.file_len - payload_offset,
            });
        }
        if elsewhere(payload_offset) {
            let skip = i64::try_from(header.stored_len).map_err(|_| FormatError::Corrupt {
                file: self.path.clone(),
                entry: format!("entry {}", self.seen),
                offset: payload_offset,
                problem: format!("payload of {} bytes", header.stored_len),
            })?;
            self.input.seek_relative(skip).map_err(|e| FormatError::io(&self.path, e))?;
            self.pos = payload_offset + header.stored_len;
            self.seen += 1;
            return Ok(Some(Entry { header, payload_offset, payload: Vec::new() }));
        }
        let mut payload = vec![0u8; header.stored_len as usize];
        self.input.read_exact(&mut payload).map_err(|e| FormatError::io(&self.path, e))?;
        let entry = || format!("payload of entry {}", self.seen);
        FormatError::check_xxh3(&self.path, entry, payload_offset, &payload, header.payload_checksum)?;
        self.pos = payload_offset + header.stored_len;
        self.seen += 1;
        Ok(Some(Entry { header, payload_offset, payload }))
    }
}

/// Reads one payload at a known offset (random access), verifying its entry
/// header against the expected length and its checksum.
pub fn read_payload_at(path: &Path, f: &File, payload_offset: u64, stored_len: u64, checksum: u64) -> Result<Vec<u8>> {
    use std::os::unix::fs::FileExt;
    let hoff = payload_offset
        .checked_sub(ENTRY_HEADER_LEN as u64)
        .ok_or_else(|| FormatError::Corrupt {
            file: path.into(),
            entry: "payload reference".into(),
            offset: payload_offset,
            problem: "offset inside the partition header".into(),
        })?;
    let mut buf = vec![0u8; ENTRY_HEADER_LEN + stored_len as usize];
    f.read_exact_at(&mut buf, hoff).map_err(|e| FormatError::io(path, e))?;
    let h = EntryHeader::decode(path, hoff, &buf[..ENTRY_HEADER_LEN])?;
    if h.stored_len != stored_len || h.payload_checksum != checksum {
        return Err(FormatError::Corrupt {
            file: path.into(),
            entry: format!("entry header at offset {hoff}"),
            offset: hoff,
            problem: "entry does not match the manifest".into(),
        });
    }
    let payload = buf.split_off(ENTRY_HEADER_LEN);
    FormatError::check_xxh3(path, || format!("payload at offset {payload_offset}"), payload_offset, &payload, checksum)?;
    Ok(payload)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_written_layout_is_unchanged() {
        let d = tempfile::tempdir().unwrap();
        let (p, _) = write_sample(d.path());
        let b = std::fs::read(&p).unwrap();
        assert_eq!((b.len(), xxh3(&b)), (219, 1_246_941_140_916_333_872));
        assert_eq!(
            (ID_OFF, DATASET_OFF, CHECKSUM_OFF, HEADER_LEN, E_CODEC_OFF, ENTRY_HEADER_LEN),
            (12, 32, 56, 64, 24, 48)
        );
    }

    fn write_sample(dir: &Path) -> (PathBuf, Vec<u64>) {
        let p = dir.join(file_name(3));
        let mut w = PartitionWriter::create(&p, 3, 0).unwrap();
        let mut offs = vec![];
        offs.push(w.append(11, 5, Codec::None, b"hello").unwrap());
        offs.push(w.append(12, 0, Codec::None, b"").unwrap());
        let (o, _) = w.append_raw_stream(13, 6, &mut &b"world!"[..]).unwrap();
        offs.push(o);
        w.finish(0xabcd).unwrap();
        (p, offs)
    }

    #[test]
    fn round_trip() {
        let d = tempfile::tempdir().unwrap();
        let (p, offs) = write_sample(d.path());
        let mut r = PartitionReader::open(&p).unwrap();
        assert_eq!(r.header().id, 3);
        assert_eq!(r.header().dataset_id, 0xabcd);
        let mut got = vec![];
        while let Some(e) = r.next_entry().unwrap() {
            got.push((e.header.path_hash, e.payload_offset, e.payload));
        }
        assert_eq!(
            got,
            vec![(11, offs[0], b"hello".to_vec()), (12, offs[1], vec![]), (13, offs[2], b"world!".to_vec())]
        );
        let f = File::open(&p).unwrap();
        assert_eq!(read_payload_at(&p, &f, offs[2], 6, xxh3(b"world!")).unwrap(), b"world!");
    }

    fn corrupt_at(p: &Path, off: u64) {
        let mut b = std::fs::read(p).unwrap();
        b[off as usize] ^= 0x40;
        std::fs::write(p, b).unwrap();
    }

    fn read_all(p: &Path) -> Result<()> {
        let mut r = PartitionReader::open(p)?;
        while r.next_entry()?.is_some() {}
        Ok(())
    }

    #[test]
    fn flipped_header_byte_is_named() {
        let d = tempfile::tempdir().unwrap();
        let (p, _) = write_sample(d.path());
        corrupt_at(&p, 20);
        let e = read_all(&p).unwrap_err().to_string();
        assert!(e.contains("part-000003.fsp") && e.contains("partition header") && e.contains("checksum"), "{e}");
    }

    #[test]
    fn flipped_payload_byte_is_named() {
        let d = tempfile::tempdir().unwrap();
        let (p, offs) = write_sample(d.path());
        corrupt_at(&p, offs[2] + 1);
        let e = read_all(&p).unwrap_err().to_string();
        assert!(e.contains("payload of entry 2") && e.contains(&format!("offset {}", offs[2])), "{e}");
    }

    #[test]
    fn payloads_kept_elsewhere_are_skipped_but_their_headers_checked() {
        let d = tempfile::tempdir().unwrap();
        let (p, offs) = write_sample(d.path());
        // A hole where entry 2's payload was: read through, it fails; skipped, it is not read.
        let mut b = std::fs::read(&p).unwrap();
        b[offs[2] as usize..offs[2] as usize + 6].fill(0);
        std::fs::write(&p, &b).unwrap();
        assert!(read_all(&p).unwrap_err().to_string().contains("payload of entry 2"));
        let mut r = PartitionReader::open(&p).unwrap();
        let mut got = vec![];
        while let Some(e) = r.next_entry_with(&|off| off == offs[2]).unwrap() {
            got.push((e.header.path_hash, e.header.payload_checksum, e.payload));
        }
        assert_eq!(got, vec![(11, xxh3(b"hello"), b"hello".to_vec()), (12, xxh3(b""), vec![]), (13, xxh3(b"world!"), vec![])]);
        // A skipped entry's header is still checked.
        corrupt_at(&p, offs[2] - 30);
        let mut r = PartitionReader::open(&p).unwrap();
        let mut res = Ok(None);
        for _ in 0..3 {
            res = r.next_entry_with(&|off| off == offs[2]);
        }
        let e = res.unwrap_err().to_string();
        assert!(e.contains(&format!("entry header at offset {}", offs[2] - 48)), "{e}");
    }

    #[test]
    fn flipped_entry_header_byte_is_named() {
        let d = tempfile::tempdir().unwrap();
        let (p, offs) = write_sample(d.path());
        corrupt_at(&p, offs[1] - 30);
        let e = read_all(&p).unwrap_err().to_string();
        assert!(e.contains(&format!("entry header at offset {}", offs[1] - 48)), "{e}");
    }

    #[test]
    fn unknown_version_and_magic_are_refused() {
        let d = tempfile::tempdir().unwrap();
        let (p, _) = write_sample(d.path());
        let mut b = std::fs::read(&p).unwrap();
        b[format::VERSION_OFFSET] = 9;
        format::testing::reseal(&mut b, HEADER_LEN);
        std::fs::write(&p, &b).unwrap();
        let e = read_all(&p).unwrap_err().to_string();
        assert!(e.contains("unsupported partition format version 9"), "{e}");
        b[0] = b'X';
        std::fs::write(&p, &b).unwrap();
        assert!(matches!(read_all(&p), Err(FormatError::BadMagic { .. })));
    }

    #[test]
    fn every_header_fault_is_named() {
        let d = tempfile::tempdir().unwrap();
        let (p, _) = write_sample(d.path());
        let good = std::fs::read(&p).unwrap();
        format::testing::assert_header_faults_named(&HEADER, "part-000003.fsp", &good, |b| {
            std::fs::write(&p, b).unwrap();
            read_all(&p)
        });
    }

    #[test]
    fn truncated_and_unfinished_are_refused() {
        let d = tempfile::tempdir().unwrap();
        let (p, _) = write_sample(d.path());
        let b = std::fs::read(&p).unwrap();
        std::fs::write(&p, &b[..b.len() - 2]).unwrap();
        assert!(read_all(&p).is_err());
        let q = d.path().join("unfinished.fsp");
        let mut w = PartitionWriter::create(&q, 0, 0).unwrap();
        w.append(1, 1, Codec::None, b"x").unwrap();
        drop(w);
        assert!(matches!(read_all(&q), Err(FormatError::BadMagic { .. })));
    }

    #[test]
    fn stream_that_changes_size_fails() {
        let d = tempfile::tempdir().unwrap();
        let mut w = PartitionWriter::create(&d.path().join("p"), 0, 0).unwrap();
        assert!(w.append_raw_stream(1, 10, &mut &b"short"[..]).is_err());
        let mut w = PartitionWriter::create(&d.path().join("q"), 0, 0).unwrap();
        assert!(w.append_raw_stream(1, 2, &mut &b"longer"[..]).is_err());
    }
}
