//! Unit files: one stored unit (a tensor payload or a chunk), named by the
//! blake3 of its payload. Written once (temp file + rename), never modified.
//!
//! ```text
//! units/<64 hex digits of blake3>.fsu   (one flat directory: ext4's hashed
//!                                        directories need no sharding, and
//!                                        a shard directory per first commit
//!                                        cost more than the writes)
//!  0..8    magic "FANSTUN\0"
//!  8..12   version (1)
//! 12..16   reserved, zero
//! 16..24   payload length
//! 24..56   blake3 of the payload (the unit's identity, = the file name)
//! 56..64   xxh3 of the payload (checked on every read: fast)
//! 64..72   xxh3 of header bytes 0..64
//! 72..     payload
//! ```
//!
//! Reads check the header and the payload's xxh3 before a byte is handed
//! out; `verify` also recomputes the blake3.

use crate::error::{CkptError, Result};
use fanstore_core::le::*;
use fanstore_core::checksum::xxh3;
use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

pub const MAGIC: [u8; 8] = *b"FANSTUN\0";
pub const VERSION: u32 = 1;

const MAGIC_OFF: usize = 0;
const VERSION_OFF: usize = MAGIC_OFF + 8;
const RESERVED_OFF: usize = VERSION_OFF + 4;
const LEN_OFF: usize = RESERVED_OFF + 4;
const BLAKE3_OFF: usize = LEN_OFF + 8;
const XXH3_OFF: usize = BLAKE3_OFF + 32;
const CHECKSUM_OFF: usize = XXH3_OFF + 8;
/// Length of a unit file header.
pub const HEADER_LEN: usize = CHECKSUM_OFF + 8;

/// Payloads at least this long are memory-mapped on read instead of copied.
const MAP_THRESHOLD: u64 = 1 << 20;

/// A unit's identity: the blake3 of its payload.
pub type Hash = [u8; 32];

/// Lower-case hex of a hash.
pub fn hex(h: &Hash) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(64);
    for b in h {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// Parses 64 hex digits.
pub fn parse_hex(s: &str) -> Option<Hash> {
    if s.len() != 64 || !s.is_ascii() {
        return None;
    }
    let mut h = [0u8; 32];
    for (i, out) in h.iter_mut().enumerate() {
        *out = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(h)
}

/// The path of unit `h` under the store's `units` directory.
pub fn path(units_dir: &Path, h: &Hash) -> PathBuf {
    let x = hex(h);
    units_dir.join(format!("{x}.fsu"))
}

/// The decoded header of a unit file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnitHeader {
    pub len: u64,
    pub blake3: Hash,
    pub xxh3: u64,
}

impl UnitHeader {
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[MAGIC_OFF..MAGIC_OFF + 8].copy_from_slice(&MAGIC);
        put_u32(&mut b, VERSION_OFF, VERSION);
        put_u64(&mut b, LEN_OFF, self.len);
        b[BLAKE3_OFF..BLAKE3_OFF + 32].copy_from_slice(&self.blake3);
        put_u64(&mut b, XXH3_OFF, self.xxh3);
        let sum = xxh3(&b[..CHECKSUM_OFF]);
        put_u64(&mut b, CHECKSUM_OFF, sum);
        b
    }

    pub fn decode(file: &Path, b: &[u8]) -> Result<UnitHeader> {
        if b.len() < HEADER_LEN {
            return Err(CkptError::Truncated {
                file: file.into(),
                entry: "unit header".into(),
                offset: 0,
                needed: HEADER_LEN as u64,
                len: b.len() as u64,
            });
        }
        if b[..8] != MAGIC {
            return Err(CkptError::BadMagic { file: file.into(), what: "unit" });
        }
        let version = u32_at(b, VERSION_OFF);
        if version != VERSION {
            return Err(CkptError::UnsupportedVersion { file: file.into(), what: "unit", found: version, supported: VERSION });
        }
        let stored = u64_at(b, CHECKSUM_OFF);
        let computed = xxh3(&b[..CHECKSUM_OFF]);
        if stored != computed {
            return Err(CkptError::Checksum { file: file.into(), entry: "unit header".into(), offset: 0, stored, computed });
        }
        let mut blake3 = [0u8; 32];
        blake3.copy_from_slice(&b[BLAKE3_OFF..BLAKE3_OFF + 32]);
        Ok(UnitHeader { len: u64_at(b, LEN_OFF), blake3, xxh3: u64_at(b, XXH3_OFF) })
    }
}

/// Writes unit `h` (whose payload's xxh3 is `x`) at `dest`; on failure the
/// partial file is removed. Returns the bytes written.
///
/// No temp file and rename: the file is named by its content and no recipe
/// refers to it until the catalog that commits the recipe is renamed into
/// place, so a partial file left by a crash is unreferenced, and the sweep
/// at open deletes it before anything could use it.
pub fn write(dest: &Path, h: &Hash, x: u64, payload: &[u8]) -> Result<u64> {
    let head = UnitHeader { len: payload.len() as u64, blake3: *h, xxh3: x }.encode();
    let r = File::create(dest).and_then(|mut f| {
        f.write_all(&head)?;
        f.write_all(payload)
    });
    if let Err(e) = r {
        let _ = std::fs::remove_file(dest);
        return Err(CkptError::io(dest, e));
    }
    Ok((HEADER_LEN + payload.len()) as u64)
}

/// A unit's payload, read and checked: mapped when large, copied when small.
pub enum Payload {
    Mapped(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl Payload {
    pub fn bytes(&self) -> &[u8] {
        match self {
            Payload::Mapped(m) => &m[HEADER_LEN..],
            Payload::Owned(v) => &v[HEADER_LEN..],
        }
    }
}

/// Opens unit `h` at `file` and checks its header against the expected
/// hash and length, and its payload against the header's xxh3
/// (plus the blake3 when `full`).
pub fn open(file: &Path, h: &Hash, len: u64, full: bool) -> Result<Payload> {
    let mut f = File::open(file).map_err(|e| CkptError::io(file, e))?;
    let flen = f.metadata().map_err(|e| CkptError::io(file, e))?.len();
    let payload = if flen >= MAP_THRESHOLD {
        // SAFETY: unit files are immutable once renamed into place and only
        // this process (which holds the store lock) deletes them, and only
        // when no recipe refers to them; nothing truncates a mapped unit.
        let m = unsafe { memmap2::Mmap::map(&f) }.map_err(|e| CkptError::io(file, e))?;
        Payload::Mapped(m)
    } else {
        let mut v = Vec::with_capacity(flen as usize);
        f.read_to_end(&mut v).map_err(|e| CkptError::io(file, e))?;
        Payload::Owned(v)
    };
    let all = match &payload {
        Payload::Mapped(m) => &m[..],
        Payload::Owned(v) => &v[..],
    };
    let head = UnitHeader::decode(file, all)?;
    check(file, &head, all, h, len, full)?;
    Ok(payload)
}

/// Reads unit `h` straight into `dst` (whose length is the expected length)
/// and checks it as [`open`] does.
pub fn read_into(file: &Path, h: &Hash, dst: &mut [u8], full: bool) -> Result<()> {
    use std::os::unix::fs::FileExt;
    let f = File::open(file).map_err(|e| CkptError::io(file, e))?;
    let mut hb = [0u8; HEADER_LEN];
    let got = read_full_at(&f, &mut hb, 0).map_err(|e| CkptError::io(file, e))?;
    let head = UnitHeader::decode(file, &hb[..got])?;
    check_header(file, &head, h, dst.len() as u64)?;
    f.read_exact_at(dst, HEADER_LEN as u64).map_err(|e| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            CkptError::Truncated {
                file: file.into(),
                entry: "unit payload".into(),
                offset: HEADER_LEN as u64,
                needed: dst.len() as u64,
                len: f.metadata().map(|m| m.len().saturating_sub(HEADER_LEN as u64)).unwrap_or(0),
            }
        } else {
            CkptError::io(file, e)
        }
    })?;
    check_payload(file, &head, dst, full)
}

fn read_full_at(f: &File, buf: &mut [u8], off: u64) -> std::io::Result<usize> {
    use std::os::unix::fs::FileExt;
    let mut n = 0;
    while n < buf.len() {
        match f.read_at(&mut buf[n..], off + n as u64)? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

fn check_header(file: &Path, head: &UnitHeader, h: &Hash, len: u64) -> Result<()> {
    if head.blake3 != *h || head.len != len {
        return Err(CkptError::Corrupt {
            file: file.into(),
            entry: "unit header".into(),
            offset: LEN_OFF as u64,
            problem: format!(
                "header names unit {} of {} bytes, the recipe expects {} of {len} bytes",
                hex(&head.blake3),
                head.len,
                hex(h)
            ),
        });
    }
    Ok(())
}

fn check(file: &Path, head: &UnitHeader, all: &[u8], h: &Hash, len: u64, full: bool) -> Result<()> {
    check_header(file, head, h, len)?;
    let have = all.len() as u64 - HEADER_LEN as u64;
    if have != len {
        return Err(CkptError::Truncated {
            file: file.into(),
            entry: "unit payload".into(),
            offset: HEADER_LEN as u64,
            needed: len,
            len: have,
        });
    }
    check_payload(file, head, &all[HEADER_LEN..], full)
}

fn check_payload(file: &Path, head: &UnitHeader, payload: &[u8], full: bool) -> Result<()> {
    let computed = xxh3(payload);
    if computed != head.xxh3 {
        return Err(CkptError::Checksum {
            file: file.into(),
            entry: "unit payload".into(),
            offset: HEADER_LEN as u64,
            stored: head.xxh3,
            computed,
        });
    }
    if full {
        let b = hash(payload);
        if b != head.blake3 {
            return Err(CkptError::Corrupt {
                file: file.into(),
                entry: "unit payload".into(),
                offset: HEADER_LEN as u64,
                problem: format!("blake3 is {}, the unit is named {}", hex(&b), hex(&head.blake3)),
            });
        }
    }
    Ok(())
}

/// blake3 of `payload`, single-threaded (SIMD across chunks, no rayon).
pub fn hash(payload: &[u8]) -> Hash {
    *blake3::hash(payload).as_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(dir: &Path, payload: &[u8]) -> (PathBuf, Hash) {
        let h = hash(payload);
        std::fs::create_dir_all(dir.join("units")).unwrap();
        let p = path(&dir.join("units"), &h);
        write(&p, &h, xxh3(payload), payload).unwrap();
        (p, h)
    }

    #[test]
    fn round_trip_small_and_mapped() {
        let d = tempfile::tempdir().unwrap();
        for n in [0usize, 5, 3 << 20] {
            let data: Vec<u8> = (0..n).map(|i| (i * 7) as u8).collect();
            let (p, h) = sample(d.path(), &data);
            assert_eq!(open(&p, &h, n as u64, true).unwrap().bytes(), &data[..]);
            let mut dst = vec![0u8; n];
            read_into(&p, &h, &mut dst, true).unwrap();
            assert_eq!(dst, data);
            assert_eq!(std::fs::metadata(&p).unwrap().len(), (HEADER_LEN + n) as u64);
        }
        assert_eq!(parse_hex(&hex(&hash(b"x"))), Some(hash(b"x")));
    }

    fn flip(p: &Path, off: usize) {
        let mut b = std::fs::read(p).unwrap();
        b[off] ^= 0x20;
        std::fs::write(p, b).unwrap();
    }

    #[test]
    fn flipped_bytes_are_named() {
        let d = tempfile::tempdir().unwrap();
        let (p, h) = sample(d.path(), b"some tensor bytes");
        flip(&p, HEADER_LEN + 3);
        let e = open(&p, &h, 17, false).err().unwrap().to_string();
        assert!(e.contains("checksum mismatch in unit payload at offset 72") && e.contains(".fsu"), "{e}");
        let mut dst = [0u8; 17];
        assert!(read_into(&p, &h, &mut dst, false).is_err());
        let (p, h) = sample(d.path(), b"other bytes");
        flip(&p, LEN_OFF);
        let e = open(&p, &h, 11, false).err().unwrap().to_string();
        assert!(e.contains("checksum mismatch in unit header"), "{e}");
        let (p, h) = sample(d.path(), b"third");
        assert!(open(&p, &h, 6, false).err().unwrap().to_string().contains("the recipe expects"));
        let mut b = std::fs::read(&p).unwrap();
        b[VERSION_OFF] = 2;
        let sum = xxh3(&b[..CHECKSUM_OFF]);
        put_u64(&mut b, CHECKSUM_OFF, sum);
        std::fs::write(&p, &b).unwrap();
        assert!(open(&p, &h, 5, false).err().unwrap().to_string().contains("unsupported unit format version 2"));
        b.truncate(HEADER_LEN + 2);
        b[VERSION_OFF] = 1;
        let sum = xxh3(&b[..CHECKSUM_OFF]);
        put_u64(&mut b, CHECKSUM_OFF, sum);
        std::fs::write(&p, &b).unwrap();
        assert!(matches!(open(&p, &h, 5, false), Err(CkptError::Truncated { .. })));
    }
}
