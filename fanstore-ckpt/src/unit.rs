//! Unit files: one stored unit (a tensor payload or a chunk), named by the
//! blake3 of its payload. Written once, never modified. The payload is
//! stored raw, byte-grouped and compressed, or as a delta against another
//! unit (its *base*), see [`mod@crate::codec`]; whatever the encoding, the
//! unit's identity is the blake3 of the decoded payload, so deduplication
//! does not depend on how a unit happens to be stored.
//!
//! ```text
//! units/<64 hex digits of blake3>.fsu   (one flat directory: ext4's hashed
//!                                        directories need no sharding, and
//!                                        a shard directory per first commit
//!                                        cost more than the writes)
//! version 2 (written by this build; HEADER_LEN = 128):
//!   0..8    magic "FANSTUN\0"
//!   8..12   version (2)
//!  12       encoding (0 raw, 1 byte-grouped planes, 2 XOR delta against the base, grouped,
//!           3 external: the payload lies raw in an extent file, see extent.rs)
//!  13       element width W in bytes (1..=8; 1 for raw)
//!  14       chain depth (0: decodes alone; a delta's is its base's + 1)
//!  15       reserved, zero
//!  16..24   payload length (decoded)
//!  24..56   blake3 of the decoded payload (the unit's identity, = the file name)
//!  56..64   xxh3 of the decoded payload (checked after every decode: fast)
//!  64..96   delta: blake3 of the base unit; external: 64..72 extent sequence
//!           number, 72..80 extent nonce, 80..88 offset of the payload in the
//!           extent, 88..96 zero; zero otherwise
//!  96..104  body length (the bytes after the header)
//! 104..112  xxh3 of the body (checked before decoding)
//! 112..120  reserved, zero
//! 120..128  xxh3 of header bytes 0..120
//! 128..     body: raw: the payload; grouped and delta: see codec;
//!           external: none (body length 0)
//! version 1 (still read; raw only):
//!   0..8 magic, 8..12 version (1), 12..16 reserved, 16..24 payload length,
//!  24..56 blake3, 56..64 xxh3 of the payload, 64..72 xxh3 of bytes 0..64,
//!  72.. payload
//! ```
//!
//! The header's frame (magic, version, checksum; both versions) is checked
//! by [`fanstore_core::format`].
//!
//! Reads check the header, the body's xxh3 before decoding, and the decoded
//! payload's xxh3 before a byte is handed out; `verify` also recomputes the
//! blake3. A delta's base is another unit file: the store keeps a base alive
//! while a delta needs it, and bounds chain depth.

use crate::codec::{self, Encoding};
use crate::error::{CkptError, Result};
use fanstore_core::checksum::xxh3;
use fanstore_core::format::{self, read_full_at, FormatHeader, HeaderVersion};
use fanstore_core::le::*;
use fanstore_core::FormatError;
use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

pub const MAGIC: [u8; 8] = *b"FANSTUN\0";
/// The version this build writes.
pub const VERSION: u32 = 2;

format::layout! {
    format::FIELDS_OFFSET;
    ENCODING_OFF: 1, WIDTH_OFF: 1, DEPTH_OFF: 2, LEN_OFF: 8, BLAKE3_OFF: 32, XXH3_OFF: 8, BASE_OFF: 32,
    BODY_LEN_OFF: 8, BODY_SUM_OFF: 8, RESERVED2_OFF: 8, CHECKSUM_OFF: format::CHECKSUM_LEN =>
    /// Length of a version 2 unit file header.
    pub HEADER_LEN
}

/// Length of a version 1 unit file header.
pub const V1_HEADER_LEN: usize = 72;

/// The unit header's frame: version 1 is still read, version 2 written.
pub const HEADER: FormatHeader = FormatHeader {
    what: "unit",
    magic: MAGIC,
    versions: &[HeaderVersion { version: 1, len: V1_HEADER_LEN }, HeaderVersion { version: VERSION, len: HEADER_LEN }],
};

/// Bodies at least this long are memory-mapped on read instead of copied.
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

/// Where an external unit's payload lies: extent file `seq` (whose name
/// also carries `nonce`), at byte `off`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ExtentRef {
    pub seq: u64,
    pub nonce: u64,
    pub off: u64,
}

/// The decoded header of a unit file (either version).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnitHeader {
    pub encoding: Encoding,
    pub width: u8,
    pub depth: u8,
    /// Decoded payload length.
    pub len: u64,
    pub blake3: Hash,
    /// xxh3 of the decoded payload.
    pub xxh3: u64,
    /// The unit a delta is XORed against.
    pub base: Option<Hash>,
    /// Where an external unit's payload is.
    pub extent: Option<ExtentRef>,
    /// Body length (the stored bytes after the header).
    pub body_len: u64,
    pub body_xxh3: u64,
    /// Length of the header in the file (72 for version 1, 128 for 2).
    pub header_len: u64,
}

impl UnitHeader {
    /// A raw unit's header.
    pub fn raw(len: u64, blake3: Hash, xxh3: u64) -> UnitHeader {
        UnitHeader {
            encoding: Encoding::Raw,
            width: 1,
            depth: 0,
            len,
            blake3,
            xxh3,
            base: None,
            extent: None,
            body_len: len,
            body_xxh3: xxh3,
            header_len: HEADER_LEN as u64,
        }
    }

    /// Bytes of the whole unit file.
    pub fn file_len(&self) -> u64 {
        self.header_len + self.body_len
    }

    /// The version 2 header.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[ENCODING_OFF] = self.encoding.to_u8();
        b[WIDTH_OFF] = self.width;
        b[DEPTH_OFF] = self.depth;
        put_u64(&mut b, LEN_OFF, self.len);
        b[BLAKE3_OFF..BLAKE3_OFF + 32].copy_from_slice(&self.blake3);
        put_u64(&mut b, XXH3_OFF, self.xxh3);
        if let Some(base) = &self.base {
            b[BASE_OFF..BASE_OFF + 32].copy_from_slice(base);
        }
        if let Some(x) = &self.extent {
            put_u64(&mut b, BASE_OFF, x.seq);
            put_u64(&mut b, BASE_OFF + 8, x.nonce);
            put_u64(&mut b, BASE_OFF + 16, x.off);
        }
        put_u64(&mut b, BODY_LEN_OFF, self.body_len);
        put_u64(&mut b, BODY_SUM_OFF, self.body_xxh3);
        HEADER.seal(&mut b);
        b
    }

    /// Decodes a header from the first bytes of a unit file (at least the
    /// header's length, or all of a shorter file).
    pub fn decode(file: &Path, b: &[u8]) -> Result<UnitHeader> {
        let version = HEADER.check(file, b)?;
        let mut blake3 = [0u8; 32];
        blake3.copy_from_slice(&b[BLAKE3_OFF..BLAKE3_OFF + 32]);
        let (len, x) = (u64_at(b, LEN_OFF), u64_at(b, XXH3_OFF));
        if version.version == 1 {
            let mut h = UnitHeader::raw(len, blake3, x);
            h.header_len = version.len as u64;
            return Ok(h);
        }
        let corrupt = |offset: usize, problem: String| -> CkptError {
            FormatError::Corrupt { file: file.into(), entry: "unit header".into(), offset: offset as u64, problem }.into()
        };
        let encoding = Encoding::from_u8(b[ENCODING_OFF])
            .ok_or_else(|| corrupt(ENCODING_OFF, format!("unknown encoding {}", b[ENCODING_OFF])))?;
        let width = b[WIDTH_OFF];
        if !(1..=8).contains(&width) {
            return Err(corrupt(WIDTH_OFF, format!("element width {width}")));
        }
        let depth = b[DEPTH_OFF];
        let mut base = [0u8; 32];
        base.copy_from_slice(&b[BASE_OFF..BASE_OFF + 32]);
        let base = (encoding == Encoding::Delta).then_some(base);
        if (encoding == Encoding::Delta) != (depth > 0) {
            return Err(corrupt(DEPTH_OFF, format!("{} unit at chain depth {depth}", encoding.name())));
        }
        if base == Some(blake3) {
            return Err(corrupt(BASE_OFF, "a delta against itself".into()));
        }
        let body_len = u64_at(b, BODY_LEN_OFF);
        if encoding == Encoding::Raw && body_len != len {
            return Err(corrupt(BODY_LEN_OFF, format!("raw unit of {len} bytes with a {body_len}-byte body")));
        }
        let extent = match encoding {
            Encoding::External => {
                if width != 1 {
                    return Err(corrupt(WIDTH_OFF, format!("external unit of element width {width}")));
                }
                if body_len != 0 {
                    return Err(corrupt(BODY_LEN_OFF, format!("external unit with a {body_len}-byte body")));
                }
                if b[BASE_OFF + 24..BASE_OFF + 32].iter().any(|&x| x != 0) {
                    return Err(corrupt(BASE_OFF + 24, "reserved bytes of an extent reference are not zero".into()));
                }
                let x = ExtentRef { seq: u64_at(b, BASE_OFF), nonce: u64_at(b, BASE_OFF + 8), off: u64_at(b, BASE_OFF + 16) };
                if x.off.checked_add(len).is_none() {
                    return Err(corrupt(BASE_OFF + 16, format!("payload of {len} bytes at offset {} of its extent", x.off)));
                }
                Some(x)
            }
            _ => None,
        };
        Ok(UnitHeader {
            encoding,
            width,
            depth,
            len,
            blake3,
            xxh3: x,
            base,
            extent,
            body_len,
            body_xxh3: u64_at(b, BODY_SUM_OFF),
            header_len: HEADER_LEN as u64,
        })
    }
}

/// Writes a unit at `dest`: `head` (version 2) and `body` (for a raw unit,
/// the payload); on failure the partial file is removed. Returns the bytes
/// written.
///
/// No temp file and rename: the file is named by its content and no recipe
/// refers to it until the catalog that commits the recipe is renamed into
/// place, so a partial file left by a crash is unreferenced, and the sweep
/// at open deletes it before anything could use it.
pub fn write(dest: &Path, head: &UnitHeader, body: &[u8]) -> Result<u64> {
    let mut head = *head;
    head.header_len = HEADER_LEN as u64;
    head.body_len = body.len() as u64;
    let enc = head.encode();
    let r = File::create(dest).and_then(|mut f| {
        f.write_all(&enc)?;
        f.write_all(body)
    });
    if let Err(e) = r {
        let _ = std::fs::remove_file(dest);
        return Err(CkptError::io(dest, e));
    }
    Ok(head.file_len())
}

/// Encodes `payload` (blake3 `h`, xxh3 `x`, element width `width`; against
/// `base` = (hash, depth, bytes) when given): the version 2 header and the
/// body to store after it (borrowed from `payload` when raw).
pub fn encode<'a>(h: &Hash, x: u64, payload: &'a [u8], width: usize, base: Option<(&Hash, u8, &[u8])>) -> (UnitHeader, std::borrow::Cow<'a, [u8]>) {
    let e = codec::encode(payload, width, base.map(|b| b.2));
    let mut head = UnitHeader::raw(payload.len() as u64, *h, x);
    let body = match e.encoding {
        Encoding::Raw => std::borrow::Cow::Borrowed(payload),
        enc => {
            head.encoding = enc;
            head.width = e.width as u8;
            head.body_xxh3 = xxh3(&e.body);
            if let (Encoding::Delta, Some((bh, depth, _))) = (enc, base) {
                head.base = Some(*bh);
                head.depth = depth.saturating_add(1);
            }
            std::borrow::Cow::Owned(e.body)
        }
    };
    head.body_len = body.len() as u64;
    (head, body)
}

/// Encodes `payload` as [`encode`] does and writes it as a unit file at
/// `dest` (the layout of stores written before packs; tests build them).
/// Returns the header written.
pub fn encode_and_write(dest: &Path, h: &Hash, x: u64, payload: &[u8], width: usize, base: Option<(&Hash, u8, &[u8])>) -> Result<UnitHeader> {
    let (head, body) = encode(h, x, payload, width, base);
    write(dest, &head, &body)?;
    Ok(head)
}

/// A unit's body, read and checked: mapped when large, copied when small.
pub enum Payload {
    Mapped(memmap2::Mmap, usize),
    Owned(Vec<u8>),
}

impl Payload {
    pub fn bytes(&self) -> &[u8] {
        match self {
            Payload::Mapped(m, off) => &m[*off..],
            Payload::Owned(v) => v,
        }
    }
}

/// Shifts the offset of a format error found in a unit that starts at byte
/// `at` of `file` (a record inside a pack), so that it is the file's offset.
pub fn rebase(e: CkptError, at: u64) -> CkptError {
    let CkptError::Format(e) = e else { return e };
    let rebased = match e {
        FormatError::Checksum { file, entry, offset, stored, computed } => {
            FormatError::Checksum { file, entry, offset: offset + at, stored, computed }
        }
        FormatError::Corrupt { file, entry, offset, problem } => FormatError::Corrupt { file, entry, offset: offset + at, problem },
        FormatError::Truncated { file, entry, offset, needed, len } => FormatError::Truncated { file, entry, offset: offset + at, needed, len },
        // Inside a pack a record with another magic or version is damage
        // at that record, not a file of another kind.
        FormatError::BadMagic { file, .. } if at > 0 => {
            FormatError::Corrupt { file, entry: "unit header".into(), offset: at, problem: "bad magic".into() }
        }
        FormatError::UnsupportedVersion { file, found, .. } if at > 0 => FormatError::Corrupt {
            file,
            entry: "unit header".into(),
            offset: at,
            problem: format!("unit header version {found}"),
        },
        other => other,
    };
    rebased.into()
}

/// Decodes the header of the unit that starts at byte `at` of the open file
/// `f` (named `file` in errors, offsets counted from the file's start).
pub fn read_header_at(file: &Path, f: &File, at: u64) -> Result<UnitHeader> {
    let mut hb = [0u8; HEADER_LEN];
    let got = read_full_at(f, &mut hb, at).map_err(|e| CkptError::io(file, e))?;
    UnitHeader::decode(file, &hb[..got]).map_err(|e| rebase(e, at))
}

/// Opens unit file `file` and decodes its header.
pub fn open_header(file: &Path) -> Result<(File, UnitHeader)> {
    let f = File::open(file).map_err(|e| CkptError::io(file, e))?;
    let head = read_header_at(file, &f, 0)?;
    Ok((f, head))
}

/// Reads the header of unit file `file` only.
pub fn read_header(file: &Path) -> Result<UnitHeader> {
    open_header(file).map(|(_, h)| h)
}

/// Checks that the header names unit `h` of `len` bytes.
pub fn check_header(file: &Path, head: &UnitHeader, h: &Hash, len: u64) -> Result<()> {
    if head.blake3 != *h || head.len != len {
        return Err(FormatError::Corrupt {
            file: file.into(),
            entry: "unit header".into(),
            offset: LEN_OFF as u64,
            problem: format!(
                "header names unit {} of {} bytes, the recipe expects {} of {len} bytes",
                hex(&head.blake3),
                head.len,
                hex(h)
            ),
        }
        .into());
    }
    Ok(())
}

fn truncated_body(file: &Path, at: u64, head: &UnitHeader, have: u64) -> CkptError {
    FormatError::Truncated {
        file: file.into(),
        entry: "unit body".into(),
        offset: at + head.header_len,
        needed: head.body_len,
        len: have,
    }
    .into()
}

/// Reads the body of the unit at byte `at` of an open file (a unit file:
/// 0) and checks its length and xxh3. Offsets in errors are the file's.
pub fn read_body(file: &Path, f: &File, at: u64, head: &UnitHeader) -> Result<Payload> {
    let flen = f.metadata().map_err(|e| CkptError::io(file, e))?.len();
    let start = at + head.header_len;
    let have = flen.saturating_sub(start);
    if have < head.body_len {
        return Err(truncated_body(file, at, head, have));
    }
    let body = if head.body_len >= MAP_THRESHOLD {
        let page = 4096u64;
        let aligned = start / page * page;
        let skip = (start - aligned) as usize;
        let len = usize::try_from(head.body_len).map_err(|_| CkptError::Invalid("unit larger than memory".into()))? + skip;
        // SAFETY: unit files and pack records are never modified once
        // written (packs only grow at their end, past every record handed
        // out), only this process (which holds the store lock) deletes or
        // truncates them, never while a record in them is referenced, and
        // the mapped range lies inside the file (checked above).
        let m = unsafe { memmap2::MmapOptions::new().offset(aligned).len(len).map(f) }.map_err(|e| CkptError::io(file, e))?;
        Payload::Mapped(m, skip)
    } else {
        let mut v = vec![0u8; head.body_len as usize];
        f.read_exact_at(&mut v, start).map_err(|e| CkptError::io(file, e))?;
        Payload::Owned(v)
    };
    FormatError::check_xxh3(file, || "unit body".into(), start, body.bytes(), head.body_xxh3)?;
    Ok(body)
}

/// Reads the payload of the raw unit at byte `at` of an open file straight
/// into `dst` (no checks of the payload).
pub fn read_raw_into(file: &Path, f: &File, at: u64, head: &UnitHeader, dst: &mut [u8]) -> Result<()> {
    let start = at + head.header_len;
    let n = read_full_at(f, dst, start).map_err(|e| CkptError::io(file, e))?;
    if n < dst.len() {
        return Err(truncated_body(file, at, head, n as u64));
    }
    Ok(())
}

/// Decodes a grouped or delta body into `dst` (for a delta, `dst` holds the
/// base's payload).
pub fn decode_body(file: &Path, head: &UnitHeader, body: &[u8], dst: &mut [u8]) -> Result<()> {
    codec::decode_into(body, head.width as usize, dst, head.encoding == Encoding::Delta).map_err(|e| {
        FormatError::Corrupt {
            file: file.into(),
            entry: format!("unit body ({})", head.encoding.name()),
            offset: head.header_len + e.offset,
            problem: e.problem,
        }
        .into()
    })
}

/// Checks a decoded payload against the header's xxh3 (and blake3 when `full`).
pub fn check_payload(file: &Path, head: &UnitHeader, payload: &[u8], full: bool) -> Result<()> {
    FormatError::check_xxh3(file, || "unit payload".into(), head.header_len, payload, head.xxh3)?;
    if full {
        let b = hash(payload);
        if b != head.blake3 {
            return Err(FormatError::Corrupt {
                file: file.into(),
                entry: "unit payload".into(),
                offset: head.header_len,
                problem: format!("blake3 is {}, the unit is named {}", hex(&b), hex(&head.blake3)),
            }
            .into());
        }
    }
    Ok(())
}

/// blake3 of `payload`, single-threaded (SIMD across chunks, no rayon).
pub fn hash(payload: &[u8]) -> Hash {
    *blake3::hash(payload).as_bytes()
}


/// Reads unit `h` of `dst.len()` bytes from unit file `file` into `dst`,
/// decoded and checked (header names, body xxh3, payload xxh3, and the
/// blake3 when `full`). A delta's base is first loaded into `dst` by
/// `base(hash, depth budget, dst)`; `budget` bounds the chain depth this
/// unit may have (a header claiming more is corruption, and a chain cannot
/// loop).
pub fn load_into(
    file: &Path,
    h: &Hash,
    dst: &mut [u8],
    full: bool,
    budget: u8,
    base: &mut dyn FnMut(&Hash, u8, &mut [u8]) -> Result<()>,
) -> Result<UnitHeader> {
    let f = File::open(file).map_err(|e| CkptError::io(file, e))?;
    load_at(file, &f, 0, h, dst, full, budget, base)
}

/// [`load_into`] for the unit that starts at byte `at` of the open file `f`
/// (a record of a pack, or 0 for a unit file). Errors of this unit carry
/// the file's offsets; errors of its base pass through as the base gave them.
#[allow(clippy::too_many_arguments)]
pub fn load_at(
    file: &Path,
    f: &File,
    at: u64,
    h: &Hash,
    dst: &mut [u8],
    full: bool,
    budget: u8,
    base: &mut dyn FnMut(&Hash, u8, &mut [u8]) -> Result<()>,
) -> Result<UnitHeader> {
    let head = read_header_at(file, f, at)?;
    load_with(file, f, at, head, h, dst, full, budget, base, &mut |_, _| {
        Err(CkptError::Invalid(format!("unit {} in {} is external, with no extent to read it from", hex(h), file.display())))
    })
}

/// [`load_at`] with the record's header already read (`head`, at byte `at`
/// of `f`); `extent` reads an external unit's payload into `dst` and
/// checks it (as [`check_payload`] does).
#[allow(clippy::too_many_arguments)]
pub fn load_with(
    file: &Path,
    f: &File,
    at: u64,
    head: UnitHeader,
    h: &Hash,
    dst: &mut [u8],
    full: bool,
    budget: u8,
    base: &mut dyn FnMut(&Hash, u8, &mut [u8]) -> Result<()>,
    extent: &mut dyn FnMut(&UnitHeader, &mut [u8]) -> Result<()>,
) -> Result<UnitHeader> {
    let own = |e: CkptError| rebase(e, at);
    check_header(file, &head, h, dst.len() as u64).map_err(own)?;
    if head.depth > budget {
        return Err(own(
            FormatError::Corrupt {
                file: file.into(),
                entry: "unit header".into(),
                offset: DEPTH_OFF as u64,
                problem: format!("delta chain depth {} where at most {budget} is possible", head.depth),
            }
            .into(),
        ));
    }
    match (head.encoding, head.base) {
        (Encoding::Raw, _) => read_raw_into(file, f, at, &head, dst)?,
        (Encoding::Grouped, _) => {
            let body = read_body(file, f, at, &head)?;
            decode_body(file, &head, body.bytes(), dst).map_err(own)?;
        }
        (Encoding::Delta, Some(b)) => {
            let body = read_body(file, f, at, &head)?;
            base(&b, head.depth - 1, dst)?;
            decode_body(file, &head, body.bytes(), dst).map_err(own)?;
        }
        (Encoding::Delta, None) => unreachable!("decode gives every delta a base"),
        (Encoding::External, _) => {
            // Read and checked by `extent`, whose errors name the extent file.
            extent(&head, dst)?;
            return Ok(head);
        }
    }
    check_payload(file, &head, dst, full).map_err(own)?;
    Ok(head)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_written_layout_is_unchanged() {
        let mut head = UnitHeader::raw(12_345, [7; 32], 0xfeed);
        let raw = head.encode();
        head.encoding = Encoding::Delta;
        head.depth = 1;
        head.width = 4;
        head.base = Some([9; 32]);
        head.body_len = 99;
        head.body_xxh3 = 0xbeef;
        let delta = head.encode();
        assert_eq!((xxh3(&raw), xxh3(&delta)), (4_665_811_220_935_316_719, 15_891_533_394_258_682_550));
        assert_eq!((DEPTH_OFF, BASE_OFF, CHECKSUM_OFF, HEADER_LEN), (14, 64, 120, 128));
    }

    fn floats(n: usize, seed: u32, scale: f32) -> Vec<u8> {
        let mut x = seed.wrapping_mul(2654435761) | 1;
        (0..n)
            .flat_map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                (((x >> 8) as f32 / (1u32 << 24) as f32 - 0.5) * scale).to_le_bytes()
            })
            .collect()
    }

    struct Dir {
        _t: tempfile::TempDir,
        units: PathBuf,
    }

    fn dir() -> Dir {
        let t = tempfile::tempdir().unwrap();
        let units = t.path().join("units");
        std::fs::create_dir_all(&units).unwrap();
        Dir { _t: t, units }
    }

    fn put(d: &Dir, payload: &[u8], width: usize, base: Option<(&Hash, u8, &[u8])>) -> (PathBuf, Hash, UnitHeader) {
        let h = hash(payload);
        let p = path(&d.units, &h);
        let head = encode_and_write(&p, &h, xxh3(payload), payload, width, base).unwrap();
        assert_eq!(std::fs::metadata(&p).unwrap().len(), head.file_len());
        (p, h, head)
    }

    /// Loads `h` resolving bases from the same directory.
    fn load(d: &Dir, h: &Hash, len: usize, full: bool) -> Result<Vec<u8>> {
        fn rec(units: &Path, h: &Hash, dst: &mut [u8], full: bool, budget: u8) -> Result<()> {
            load_into(&path(units, h), h, dst, full, budget, &mut |b, bud, dst| rec(units, b, dst, full, bud)).map(|_| ())
        }
        let mut v = vec![0u8; len];
        rec(&d.units, h, &mut v, full, 8)?;
        Ok(v)
    }

    #[test]
    fn raw_grouped_and_delta_round_trip() {
        let d = dir();
        for n in [0usize, 5, 3 << 20] {
            let data: Vec<u8> = (0..n).map(|i| (i * 7 + i / 251) as u8).collect();
            let (_, h, _) = put(&d, &data, 1, None);
            assert_eq!(load(&d, &h, n, true).unwrap(), data);
        }
        let a = floats(200_000, 1, 0.04);
        let (_, ha, head_a) = put(&d, &a, 4, None);
        assert_eq!(head_a.encoding, Encoding::Grouped);
        assert!(head_a.body_len < a.len() as u64);
        // b = a with low mantissa bits changed: a delta, chained twice.
        let mut b = a.clone();
        for e in b.chunks_exact_mut(4).step_by(2) {
            e[0] ^= 0x35;
        }
        let (_, hb, head_b) = put(&d, &b, 4, Some((&ha, head_a.depth, &a)));
        assert_eq!((head_b.encoding, head_b.depth, head_b.base), (Encoding::Delta, 1, Some(ha)));
        assert!(head_b.body_len < a.len() as u64 / 4, "{}", head_b.body_len);
        let mut c = b.clone();
        c[1000] ^= 0x80;
        let (_, hc, head_c) = put(&d, &c, 4, Some((&hb, head_b.depth, &b)));
        assert_eq!(head_c.depth, 2);
        assert_eq!(load(&d, &hc, c.len(), true).unwrap(), c);
        assert_eq!(load(&d, &hb, b.len(), true).unwrap(), b);
        // A missing base is an I/O error naming its file.
        std::fs::remove_file(path(&d.units, &ha)).unwrap();
        let e = load(&d, &hc, c.len(), false).unwrap_err().to_string();
        assert!(e.contains(&hex(&ha)), "{e}");
    }

    fn flip(p: &Path, off: u64) {
        let mut b = std::fs::read(p).unwrap();
        b[off as usize] ^= 0x20;
        std::fs::write(p, b).unwrap();
    }

    fn reseal(b: &mut [u8]) {
        format::testing::reseal(b, HEADER_LEN);
    }

    #[test]
    fn every_header_fault_is_named() {
        let a = floats(3000, 7, 1.0);
        let good = UnitHeader::raw(a.len() as u64, hash(&a), xxh3(&a)).encode();
        format::testing::assert_header_faults_named(&HEADER, "units/x.fsu", &good, |b| UnitHeader::decode(Path::new("units/x.fsu"), b));
    }

    #[test]
    fn every_corrupted_byte_is_named() {
        let d = dir();
        let a = floats(50_000, 2, 0.04);
        let (pa, ha, head) = put(&d, &a, 4, None);
        let orig = std::fs::read(&pa).unwrap();
        // Every header byte and a spread of body bytes: an error, never wrong bytes.
        let mut offs: Vec<u64> = (0..HEADER_LEN as u64).collect();
        offs.extend((HEADER_LEN as u64..head.file_len()).step_by(997));
        offs.push(head.file_len() - 1);
        for off in offs {
            std::fs::write(&pa, &orig).unwrap();
            flip(&pa, off);
            let e = load(&d, &ha, a.len(), false).unwrap_err().to_string();
            let named = if off < 8 {
                e.contains("bad magic")
            } else if off < 12 {
                e.contains("unsupported unit format version")
            } else if off < HEADER_LEN as u64 {
                e.contains("checksum mismatch in unit header")
            } else {
                e.contains("checksum mismatch in unit body")
            };
            assert!(named && e.contains(".fsu"), "offset {off}: {e}");
        }
        std::fs::write(&pa, &orig).unwrap();
        assert_eq!(load(&d, &ha, a.len(), true).unwrap(), a);
        // Wrong length expected, truncation, bad magic, unknown version.
        assert!(load(&d, &ha, a.len() - 4, false).unwrap_err().to_string().contains("the recipe expects"));
        std::fs::write(&pa, &orig[..orig.len() - 3]).unwrap();
        assert!(matches!(load(&d, &ha, a.len(), false), Err(CkptError::Format(FormatError::Truncated { .. }))));
        std::fs::write(&pa, &orig[..40]).unwrap();
        assert!(matches!(load(&d, &ha, a.len(), false), Err(CkptError::Format(FormatError::Truncated { .. }))));
        let mut m = orig.clone();
        m[0] = b'X';
        std::fs::write(&pa, &m).unwrap();
        assert!(matches!(load(&d, &ha, a.len(), false), Err(CkptError::Format(FormatError::BadMagic { .. }))));
        let mut v = orig.clone();
        put_u32(&mut v, format::VERSION_OFFSET, 3);
        reseal(&mut v);
        std::fs::write(&pa, &v).unwrap();
        assert!(load(&d, &ha, a.len(), false).unwrap_err().to_string().contains("unsupported unit format version 3"));
        // A resealed header with an impossible field: a named structural error.
        let mut s = orig.clone();
        s[ENCODING_OFF] = 7;
        reseal(&mut s);
        std::fs::write(&pa, &s).unwrap();
        assert!(load(&d, &ha, a.len(), false).unwrap_err().to_string().contains("unknown encoding 7"));
        let mut s = orig.clone();
        s[DEPTH_OFF] = 3;
        reseal(&mut s);
        std::fs::write(&pa, &s).unwrap();
        assert!(load(&d, &ha, a.len(), false).unwrap_err().to_string().contains("chain depth"));
        // A body that passes its xxh3 but decodes wrong: the payload checksum catches it.
        let mut s = orig.clone();
        let at = HEADER_LEN + 4 * codec::PLANE_REC_LEN;
        s[at] ^= 1; // first raw (mantissa) plane
        let body_sum = xxh3(&s[HEADER_LEN..]);
        put_u64(&mut s, BODY_SUM_OFF, body_sum);
        reseal(&mut s);
        std::fs::write(&pa, &s).unwrap();
        let e = load(&d, &ha, a.len(), false).unwrap_err().to_string();
        assert!(e.contains("unit payload") || e.contains("unit body"), "{e}");
    }

    #[test]
    fn version_1_units_are_still_read() {
        let d = dir();
        let payload = b"an old raw unit payload".to_vec();
        let h = hash(&payload);
        let mut b = vec![0u8; V1_HEADER_LEN];
        b[..8].copy_from_slice(&MAGIC);
        put_u32(&mut b, format::VERSION_OFFSET, 1);
        put_u64(&mut b, LEN_OFF, payload.len() as u64);
        b[BLAKE3_OFF..BLAKE3_OFF + 32].copy_from_slice(&h);
        put_u64(&mut b, XXH3_OFF, xxh3(&payload));
        format::testing::reseal(&mut b, V1_HEADER_LEN);
        b.extend_from_slice(&payload);
        std::fs::write(path(&d.units, &h), &b).unwrap();
        assert_eq!(load(&d, &h, payload.len(), true).unwrap(), payload);
        let head = read_header(&path(&d.units, &h)).unwrap();
        assert_eq!((head.header_len, head.file_len()), (72, b.len() as u64));
    }

    #[test]
    fn mutated_headers_never_panic() {
        let a = floats(3000, 5, 1.0);
        let h = hash(&a);
        let mut head = UnitHeader::raw(a.len() as u64, h, xxh3(&a));
        head.encoding = Encoding::Delta;
        head.depth = 1;
        head.base = Some([7; 32]);
        let base = head.encode();
        let mut x = 0x2545f4914f6cdd1du64;
        let mut ok = 0;
        for _ in 0..20_000 {
            let mut b = base.to_vec();
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            b[(x % HEADER_LEN as u64) as usize] = (x >> 32) as u8;
            if x % 7 == 0 {
                b.truncate((x >> 40) as usize % HEADER_LEN);
            }
            if b.len() >= CHECKSUM_OFF + 8 {
                reseal(&mut b);
            }
            if UnitHeader::decode(Path::new("u"), &b).is_ok() {
                ok += 1;
            }
        }
        assert!(ok > 100, "{ok}");
    }

    #[test]
    fn external_headers_round_trip_and_bad_ones_are_named() {
        let a = floats(3000, 6, 1.0);
        let mut head = UnitHeader::raw(a.len() as u64, hash(&a), xxh3(&a));
        head.encoding = Encoding::External;
        head.extent = Some(ExtentRef { seq: 9, nonce: 0x1234, off: 4096 });
        head.body_len = 0;
        head.body_xxh3 = xxh3(&[]);
        let good = head.encode();
        let back = UnitHeader::decode(Path::new("p.fsk"), &good).unwrap();
        assert_eq!(back, head);
        assert_eq!(back.file_len(), HEADER_LEN as u64);
        // A body, a wider element, a reserved byte, a chain depth: each refused, naming the field.
        let cases: [(usize, u8, &str); 4] =
            [(BODY_LEN_OFF, 1, "body"), (WIDTH_OFF, 4, "width"), (BASE_OFF + 30, 1, "reserved"), (DEPTH_OFF, 1, "depth")];
        for (off, v, word) in cases {
            let mut b = good;
            b[off] = v;
            reseal(&mut b);
            let e = UnitHeader::decode(Path::new("p.fsk"), &b).unwrap_err().to_string();
            assert!(e.contains(word) && e.contains("p.fsk"), "byte {off}: {e}");
        }
        // An offset that overflows with the payload length.
        let mut b = good;
        b[BASE_OFF + 16..BASE_OFF + 24].copy_from_slice(&u64::MAX.to_le_bytes());
        reseal(&mut b);
        assert!(UnitHeader::decode(Path::new("p.fsk"), &b).is_err());
        // Loading an external unit without an extent reader is an error, not a panic.
        let d = dir();
        let f = d.units.join("x.fsu");
        std::fs::write(&f, good).unwrap();
        let mut dst = vec![0u8; a.len()];
        let e = load_into(&f, &head.blake3, &mut dst, false, 4, &mut |_, _, _| Ok(())).unwrap_err().to_string();
        assert!(e.contains("external"), "{e}");
    }
}
