//! Recipes: one file per checkpoint, holding everything needed to rebuild
//! its bytes (glue inline, units by hash) and its owner map (per tensor:
//! owner checkpoint, hash, dtype, shape, size). The path is not in the
//! recipe: the catalog maps paths to checkpoint ids, so a rename never
//! rewrites a recipe.
//!
//! All integers are little-endian. Sections follow the header in this order,
//! back to back, each with its own xxh3 in the header; the glue section is
//! last so that metadata can be loaded without reading the glue.
//!
//! ```text
//! recipes/<checkpoint id as 16 hex digits>.fsr
//! header (HEADER_LEN = 176 bytes)
//!   0..8     magic "FANSTRC\0"
//!   8..12    version (1)
//!  12..13    format (0 opaque, 1 safetensors, 2 torch zip, 3 npy, 4 npz, 5 torch DCP shard)
//!  13..16    reserved, zero
//!  16..24    checkpoint id
//!  24..32    parent checkpoint id (0: none)
//!  32..40    logical length (bytes of the original file)
//!  40..48    xxh3 of the original file's bytes
//!  48..56    new bytes: unit payload bytes first stored by this commit + glue bytes
//!  56..64    piece count P
//!  64..72    tensor count T
//!  72..168   section table: 4 x { offset u64, length u64, xxh3 u64 }
//!            in order: tensors, pieces, strings, glue
//! 168..176   xxh3 of header bytes 0..168
//!
//! tensors: T x 64-byte records (the owner map, in first-use order)
//!   0..32  blake3 of the payload (the unit)    32..40  payload length
//!  40..48  owner checkpoint id                 48..56  meta offset (into strings)
//!  56..60  name length u32    60..62  dtype length u16    62..64  ndim u16
//!  at meta offset in strings: name bytes, dtype bytes (UTF-8), ndim x u64 shape
//! pieces:  P x 24-byte records, in file order
//!   0      kind u8 (1 glue, 2 unit)    1..8  reserved, zero
//!   8..16  glue: offset into the glue section | unit: tensor index
//!  16..24  length
//! strings: tensor names, dtypes, shapes
//! glue:    the glue pieces' bytes, in order
//! ```
//!
//! The header's frame (magic, version, checksum) is checked by
//! [`fanstore_core::format`].

use crate::error::{CkptError, Result};
use fanstore_core::le::*;
use crate::split::Format;
use crate::unit::Hash;
use fanstore_core::checksum::xxh3;
use fanstore_core::format::{self, FormatHeader, HeaderVersion};
use fanstore_core::FormatError;
use std::path::Path;

pub const MAGIC: [u8; 8] = *b"FANSTRC\0";
pub const VERSION: u32 = 1;

const SECTION_ENTRY_LEN: usize = 24;
const SECTION_COUNT: usize = 4;
format::layout! {
    format::FIELDS_OFFSET;
    FORMAT_OFF: 4, ID_OFF: 8, PARENT_OFF: 8, LOGICAL_OFF: 8, FILE_SUM_OFF: 8, NEW_BYTES_OFF: 8,
    PIECE_COUNT_OFF: 8, TENSOR_COUNT_OFF: 8, SECTIONS_OFF: SECTION_COUNT * SECTION_ENTRY_LEN,
    HEADER_SUM_OFF: format::CHECKSUM_LEN =>
    /// Length of the recipe header.
    pub HEADER_LEN
}

/// The recipe header's frame.
pub const HEADER: FormatHeader =
    FormatHeader { what: "recipe", magic: MAGIC, versions: &[HeaderVersion { version: VERSION, len: HEADER_LEN }] };

const SECTION_NAMES: [&str; SECTION_COUNT] = ["tensors", "pieces", "strings", "glue"];
const S_TENSORS: usize = 0;
const S_PIECES: usize = 1;
const S_STRINGS: usize = 2;
const S_GLUE: usize = 3;

format::layout! {
    0;
    T_HASH: 32, T_LEN: 8, T_OWNER: 8, T_META: 8, T_NAME_LEN: 4, T_DTYPE_LEN: 2, T_NDIM: 2 =>
    /// Length of one tensor record.
    pub TENSOR_LEN
}

format::layout! {
    0;
    P_KIND: 8, P_A: 8, P_LEN: 8 =>
    /// Length of one piece record.
    pub PIECE_LEN
}

const KIND_GLUE: u8 = 1;
const KIND_UNIT: u8 = 2;

/// The file name of checkpoint `id`'s recipe.
pub fn file_name(id: u64) -> String {
    format!("{id:016x}.fsr")
}

/// One entry of the owner map.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorEntry {
    pub name: Vec<u8>,
    pub dtype: String,
    pub shape: Vec<u64>,
    pub hash: Hash,
    pub len: u64,
    /// The checkpoint that first stored this exact content.
    pub owner: u64,
}

/// One piece of a recipe, in file order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecipePiece {
    /// `len` bytes at `off` in the glue section.
    Glue { off: u64, len: u64 },
    /// The payload of `tensors[index]`.
    Unit { index: u32 },
}

/// A decoded recipe. `glue` is empty when only the metadata was loaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recipe {
    pub id: u64,
    pub parent: u64,
    pub format: Format,
    pub logical: u64,
    pub file_xxh3: u64,
    pub new_bytes: u64,
    pub tensors: Vec<TensorEntry>,
    pub pieces: Vec<RecipePiece>,
    pub glue_len: u64,
    pub glue: Vec<u8>,
}

impl Recipe {
    /// Encodes the recipe (with its glue).
    pub fn encode(&self) -> Vec<u8> {
        let mut strings = Vec::new();
        let mut tensors = vec![0u8; self.tensors.len() * TENSOR_LEN];
        for (i, t) in self.tensors.iter().enumerate() {
            let r = &mut tensors[i * TENSOR_LEN..(i + 1) * TENSOR_LEN];
            r[T_HASH..T_HASH + 32].copy_from_slice(&t.hash);
            put_u64(r, T_LEN, t.len);
            put_u64(r, T_OWNER, t.owner);
            put_u64(r, T_META, strings.len() as u64);
            put_u32(r, T_NAME_LEN, t.name.len() as u32);
            put_u16(r, T_DTYPE_LEN, t.dtype.len() as u16);
            put_u16(r, T_NDIM, t.shape.len() as u16);
            strings.extend_from_slice(&t.name);
            strings.extend_from_slice(t.dtype.as_bytes());
            for d in &t.shape {
                strings.extend_from_slice(&d.to_le_bytes());
            }
        }
        let mut pieces = vec![0u8; self.pieces.len() * PIECE_LEN];
        for (i, p) in self.pieces.iter().enumerate() {
            let r = &mut pieces[i * PIECE_LEN..(i + 1) * PIECE_LEN];
            match *p {
                RecipePiece::Glue { off, len } => {
                    r[P_KIND] = KIND_GLUE;
                    put_u64(r, P_A, off);
                    put_u64(r, P_LEN, len);
                }
                RecipePiece::Unit { index } => {
                    r[P_KIND] = KIND_UNIT;
                    put_u64(r, P_A, index as u64);
                    put_u64(r, P_LEN, self.tensors[index as usize].len);
                }
            }
        }
        let sections: [&[u8]; SECTION_COUNT] = [&tensors, &pieces, &strings, &self.glue];
        let total = HEADER_LEN + sections.iter().map(|s| s.len()).sum::<usize>();
        let mut b = vec![0u8; HEADER_LEN];
        b.reserve(total - HEADER_LEN);
        b[FORMAT_OFF] = self.format as u8;
        put_u64(&mut b, ID_OFF, self.id);
        put_u64(&mut b, PARENT_OFF, self.parent);
        put_u64(&mut b, LOGICAL_OFF, self.logical);
        put_u64(&mut b, FILE_SUM_OFF, self.file_xxh3);
        put_u64(&mut b, NEW_BYTES_OFF, self.new_bytes);
        put_u64(&mut b, PIECE_COUNT_OFF, self.pieces.len() as u64);
        put_u64(&mut b, TENSOR_COUNT_OFF, self.tensors.len() as u64);
        let mut off = HEADER_LEN;
        for (i, s) in sections.iter().enumerate() {
            let e = SECTIONS_OFF + i * SECTION_ENTRY_LEN;
            put_u64(&mut b, e, off as u64);
            put_u64(&mut b, e + 8, s.len() as u64);
            put_u64(&mut b, e + 16, xxh3(s));
            off += s.len();
        }
        HEADER.seal(&mut b);
        for s in sections {
            b.extend_from_slice(s);
        }
        b
    }

    /// Length of the prefix (header and every section but the glue) that
    /// [`Recipe::decode`] needs when `with_glue` is false; `b` holds at least
    /// the header.
    pub fn meta_len(file: &Path, b: &[u8]) -> Result<usize> {
        let h = Header::decode(file, b)?;
        Ok(h.sections[S_GLUE].0 as usize)
    }

    /// Decodes `b` (the whole file, or the [`Recipe::meta_len`] prefix when
    /// `with_glue` is false), checking every checksum and reference.
    pub fn decode(file: &Path, b: &[u8], with_glue: bool) -> Result<Recipe> {
        let h = Header::decode(file, b)?;
        let corrupt = |entry: String, offset: usize, problem: String| -> CkptError {
            FormatError::Corrupt { file: file.into(), entry, offset: offset as u64, problem }.into()
        };
        let need = if with_glue { h.sections[S_GLUE].0 + h.sections[S_GLUE].1 } else { h.sections[S_GLUE].0 };
        if (b.len() as u64) < need {
            return Err(FormatError::Truncated {
                file: file.into(),
                entry: "recipe sections".into(),
                offset: HEADER_LEN as u64,
                needed: need,
                len: b.len() as u64,
            }
            .into());
        }
        if with_glue && b.len() as u64 != need {
            return Err(corrupt("recipe".into(), need as usize, format!("{} trailing bytes", b.len() as u64 - need)));
        }
        let last = if with_glue { SECTION_COUNT } else { S_GLUE };
        let mut sec: [&[u8]; SECTION_COUNT] = [&[]; SECTION_COUNT];
        for (i, s) in sec.iter_mut().enumerate().take(last) {
            let (off, len, stored) = h.sections[i];
            let bytes = &b[off as usize..(off + len) as usize];
            FormatError::check_xxh3(file, || format!("recipe section {}", SECTION_NAMES[i]), off, bytes, stored)?;
            *s = bytes;
        }
        let tens_off = h.sections[S_TENSORS].0 as usize;
        let piece_off = h.sections[S_PIECES].0 as usize;
        let strings = sec[S_STRINGS];
        let mut tensors = Vec::with_capacity(h.tensor_count);
        for i in 0..h.tensor_count {
            let r = &sec[S_TENSORS][i * TENSOR_LEN..(i + 1) * TENSOR_LEN];
            let at = tens_off + i * TENSOR_LEN;
            let meta = u64_at(r, T_META);
            let name_len = u32_at(r, T_NAME_LEN) as u64;
            let dtype_len = u16_at(r, T_DTYPE_LEN) as u64;
            let ndim = u16_at(r, T_NDIM) as u64;
            let end = meta.checked_add(name_len + dtype_len + 8 * ndim);
            let Some(end) = end.filter(|&e| e <= strings.len() as u64) else {
                return Err(corrupt(format!("tensor {i}"), at + T_META, "name/dtype/shape past the strings section".into()));
            };
            let m = &strings[meta as usize..end as usize];
            let (name, rest) = m.split_at(name_len as usize);
            let (dtype, shape) = rest.split_at(dtype_len as usize);
            let Ok(dtype) = std::str::from_utf8(dtype) else {
                return Err(corrupt(format!("tensor {i}"), at + T_DTYPE_LEN, "dtype is not UTF-8".into()));
            };
            let mut hash = [0u8; 32];
            hash.copy_from_slice(&r[T_HASH..T_HASH + 32]);
            tensors.push(TensorEntry {
                name: name.to_vec(),
                dtype: dtype.to_string(),
                shape: shape.chunks_exact(8).map(|c| u64_at(c, 0)).collect(),
                hash,
                len: u64_at(r, T_LEN),
                owner: u64_at(r, T_OWNER),
            });
        }
        let glue_len = h.sections[S_GLUE].1;
        let mut pieces = Vec::with_capacity(h.piece_count);
        let (mut logical, mut glue_at) = (0u64, 0u64);
        for i in 0..h.piece_count {
            let r = &sec[S_PIECES][i * PIECE_LEN..(i + 1) * PIECE_LEN];
            let at = piece_off + i * PIECE_LEN;
            let (a, len) = (u64_at(r, P_A), u64_at(r, P_LEN));
            let p = match r[P_KIND] {
                KIND_GLUE => {
                    if a != glue_at || len == 0 || !matches!(a.checked_add(len), Some(e) if e <= glue_len) {
                        return Err(corrupt(format!("piece {i}"), at, format!("glue {a}+{len} is not the next glue range")));
                    }
                    glue_at += len;
                    RecipePiece::Glue { off: a, len }
                }
                KIND_UNIT => {
                    let t = tensors.get(a as usize).filter(|t| t.len == len);
                    if t.is_none() {
                        return Err(corrupt(format!("piece {i}"), at, format!("unit piece names tensor {a} of {len} bytes")));
                    }
                    RecipePiece::Unit { index: a as u32 }
                }
                k => return Err(corrupt(format!("piece {i}"), at, format!("unknown piece kind {k}"))),
            };
            logical = logical.saturating_add(len);
            pieces.push(p);
        }
        if glue_at != glue_len || logical != h.logical {
            return Err(corrupt(
                "recipe pieces".into(),
                piece_off,
                format!("pieces cover {logical} bytes and {glue_at} glue bytes, header says {} and {glue_len}", h.logical),
            ));
        }
        Ok(Recipe {
            id: h.id,
            parent: h.parent,
            format: h.format,
            logical: h.logical,
            file_xxh3: h.file_xxh3,
            new_bytes: h.new_bytes,
            tensors,
            pieces,
            glue_len,
            glue: if with_glue { sec[S_GLUE].to_vec() } else { Vec::new() },
        })
    }
}

struct Header {
    id: u64,
    parent: u64,
    format: Format,
    logical: u64,
    file_xxh3: u64,
    new_bytes: u64,
    piece_count: usize,
    tensor_count: usize,
    sections: [(u64, u64, u64); SECTION_COUNT],
}

impl Header {
    fn decode(file: &Path, b: &[u8]) -> Result<Header> {
        HEADER.check(file, b)?;
        let corrupt = |offset: usize, problem: String| -> CkptError {
            FormatError::Corrupt { file: file.into(), entry: "recipe header".into(), offset: offset as u64, problem }.into()
        };
        let format =
            Format::from_u8(b[FORMAT_OFF]).ok_or_else(|| corrupt(FORMAT_OFF, format!("unknown format {}", b[FORMAT_OFF])))?;
        let piece_count = u64_at(b, PIECE_COUNT_OFF);
        let tensor_count = u64_at(b, TENSOR_COUNT_OFF);
        let mut sections = [(0u64, 0u64, 0u64); SECTION_COUNT];
        let mut expect = HEADER_LEN as u64;
        for (i, s) in sections.iter_mut().enumerate() {
            let e = SECTIONS_OFF + i * SECTION_ENTRY_LEN;
            *s = (u64_at(b, e), u64_at(b, e + 8), u64_at(b, e + 16));
            if s.0 != expect || s.0.checked_add(s.1).is_none() {
                return Err(corrupt(e, format!("section {} at {} is not where the previous one ends ({expect})", SECTION_NAMES[i], s.0)));
            }
            expect = s.0 + s.1;
        }
        if Some(sections[S_TENSORS].1) != tensor_count.checked_mul(TENSOR_LEN as u64)
            || Some(sections[S_PIECES].1) != piece_count.checked_mul(PIECE_LEN as u64)
            || tensor_count > u32::MAX as u64
        {
            return Err(corrupt(TENSOR_COUNT_OFF, "section lengths disagree with the piece and tensor counts".into()));
        }
        Ok(Header {
            id: u64_at(b, ID_OFF),
            parent: u64_at(b, PARENT_OFF),
            format,
            logical: u64_at(b, LOGICAL_OFF),
            file_xxh3: u64_at(b, FILE_SUM_OFF),
            new_bytes: u64_at(b, NEW_BYTES_OFF),
            piece_count: piece_count as usize,
            tensor_count: tensor_count as usize,
            sections,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_written_layout_is_unchanged() {
        assert_eq!((SECTIONS_OFF, HEADER_LEN, T_NDIM, TENSOR_LEN, PIECE_LEN), (72, 176, 62, 64, 24));
        let b = sample().encode();
        assert_eq!((b.len(), xxh3(&b)), (439, 13_233_508_174_490_665_414));
    }

    fn sample() -> Recipe {
        let t = |name: &str, n: u8, len: u64| TensorEntry {
            name: name.as_bytes().to_vec(),
            dtype: "F32".into(),
            shape: vec![len / 4],
            hash: [n; 32],
            len,
            owner: n as u64,
        };
        Recipe {
            id: 7,
            parent: 3,
            format: Format::Safetensors,
            logical: 5 + 8 + 3 + 4,
            file_xxh3: 0xfeed,
            new_bytes: 12,
            tensors: vec![t("a.weight", 1, 8), t("b", 2, 4)],
            pieces: vec![
                RecipePiece::Glue { off: 0, len: 5 },
                RecipePiece::Unit { index: 0 },
                RecipePiece::Glue { off: 5, len: 3 },
                RecipePiece::Unit { index: 1 },
            ],
            glue_len: 8,
            glue: b"HEAD!pad".to_vec(),
        }
    }

    #[test]
    fn round_trip_with_and_without_glue() {
        let r = sample();
        let b = r.encode();
        let p = Path::new("r.fsr");
        assert_eq!(Recipe::decode(p, &b, true).unwrap(), r);
        let m = Recipe::meta_len(p, &b).unwrap();
        assert_eq!(m, b.len() - 8);
        let meta = Recipe::decode(p, &b[..m], false).unwrap();
        assert_eq!(meta.tensors, r.tensors);
        assert!(meta.glue.is_empty());
    }

    /// Re-seals every section and header checksum so a mutation reaches the structural checks.
    fn reseal(b: &mut [u8]) {
        format::testing::reseal_sections(b, SECTIONS_OFF, SECTION_COUNT);
        format::testing::reseal(b, HEADER_LEN);
    }

    #[test]
    fn every_header_fault_is_named() {
        let good = sample().encode();
        format::testing::assert_header_faults_named(&HEADER, "recipes/0000000000000007.fsr", &good, |b| {
            Recipe::decode(Path::new("recipes/0000000000000007.fsr"), b, true)
        });
    }

    #[test]
    fn flipped_bytes_are_named() {
        let b = sample().encode();
        let p = Path::new("ckpt.fsr");
        let mut h = b.clone();
        h[ID_OFF] ^= 1;
        let e = Recipe::decode(p, &h, true).unwrap_err().to_string();
        assert!(e.contains("ckpt.fsr") && e.contains("checksum mismatch in recipe header"), "{e}");
        for (sec, name) in SECTION_NAMES.iter().enumerate() {
            let mut c = b.clone();
            let off = u64_at(&c, SECTIONS_OFF + sec * SECTION_ENTRY_LEN) as usize;
            c[off] ^= 0x10;
            let e = Recipe::decode(p, &c, true).unwrap_err().to_string();
            assert!(e.contains(&format!("recipe section {name} at offset {off}")), "{e}");
        }
        let mut v = b.clone();
        put_u32(&mut v, format::VERSION_OFFSET, 2);
        reseal(&mut v);
        assert!(Recipe::decode(p, &v, true).unwrap_err().to_string().contains("unsupported recipe format version 2"));
        assert!(matches!(Recipe::decode(p, &b[..b.len() - 1], true), Err(CkptError::Format(FormatError::Truncated { .. }))));
        assert!(matches!(Recipe::decode(p, b"FANSTPT\0", true), Err(CkptError::Format(FormatError::BadMagic { .. }))));
        // A unit piece that names the wrong tensor length, re-sealed: a named structural error.
        let mut s = b.clone();
        let pieces = u64_at(&s, SECTIONS_OFF + S_PIECES * SECTION_ENTRY_LEN) as usize;
        put_u64(&mut s, pieces + PIECE_LEN + P_LEN, 9);
        reseal(&mut s);
        let e = Recipe::decode(p, &s, true).unwrap_err().to_string();
        assert!(e.contains("corrupt piece 1") && e.contains("tensor 0 of 9 bytes"), "{e}");
    }

    #[test]
    fn mutated_recipes_never_panic() {
        let base = sample().encode();
        let mut accepted = 0;
        for mut b in format::testing::mutated_copies(&base, 20_000, 3) {
            reseal(&mut b);
            if let Ok(r) = Recipe::decode(Path::new("f"), &b, true) {
                accepted += 1;
                let total: u64 = r
                    .pieces
                    .iter()
                    .map(|p| match *p {
                        RecipePiece::Glue { len, .. } => len,
                        RecipePiece::Unit { index } => r.tensors[index as usize].len,
                    })
                    .sum();
                assert_eq!(total, r.logical);
            }
        }
        assert!(accepted > 100, "{accepted}");
    }
}
