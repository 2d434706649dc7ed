//! The catalog: which checkpoints exist, under which path, and the next
//! checkpoint id. It is the store's commit point: a checkpoint exists once
//! the catalog that lists it has been renamed into place. Deleted
//! checkpoints stay as tombstones (last path, parent, sizes) so lineage
//! through them can still be shown; their recipes and units are gone.
//!
//! ```text
//! catalog.fsc
//! header (HEADER_LEN = 72 bytes)
//!   0..8    magic "FANSTCK\0"
//!   8..12   version (1)
//!  12..16   reserved, zero
//!  16..24   next checkpoint id (ids start at 1; 0 means "none")
//!  24..32   generation (incremented by every write)
//!  32..40   entry count E
//!  40..48   strings length
//!  48..56   xxh3 of the entries section
//!  56..64   xxh3 of the strings section
//!  64..72   xxh3 of header bytes 0..64
//! entries: E x 64-byte records, right after the header, in id order
//!   0 id u64   8 parent u64   16 logical bytes u64   24 new bytes u64
//!  32 recipe file length u64 (0 for a tombstone)   40 path offset u64 (strings)
//!  48 path length u32   52 state u8 (1 live, 2 deleted)   53 format u8
//!  54..56 reserved   56 tensor count u64
//! strings: paths (bytes, relative to the mount), after the entries
//! ```
//!
//! The header's frame (magic, version, checksum) is checked by
//! [`fanstore_core::format`].

use crate::error::{CkptError, Result};
use fanstore_core::le::*;
use crate::split::Format;
use fanstore_core::checksum::xxh3;
use fanstore_core::format::{self, FormatHeader, HeaderVersion};
use fanstore_core::FormatError;
use std::path::Path;

pub const MAGIC: [u8; 8] = *b"FANSTCK\0";
pub const VERSION: u32 = 1;
pub const FILE_NAME: &str = "catalog.fsc";

format::layout! {
    format::FIELDS_OFFSET;
    RESERVED_OFF: 4, NEXT_ID_OFF: 8, GENERATION_OFF: 8, COUNT_OFF: 8, STRINGS_LEN_OFF: 8,
    ENTRIES_SUM_OFF: 8, STRINGS_SUM_OFF: 8, HEADER_SUM_OFF: format::CHECKSUM_LEN =>
    /// Length of the catalog header.
    pub HEADER_LEN
}

/// The catalog header's frame.
pub const HEADER: FormatHeader =
    FormatHeader { what: "catalog", magic: MAGIC, versions: &[HeaderVersion { version: VERSION, len: HEADER_LEN }] };

format::layout! {
    0;
    E_ID: 8, E_PARENT: 8, E_LOGICAL: 8, E_NEW: 8, E_RECIPE_LEN: 8, E_PATH_OFF: 8, E_PATH_LEN: 4,
    E_STATE: 1, E_FORMAT: 3, E_TENSORS: 8 =>
    /// Length of one catalog entry.
    pub ENTRY_LEN
}

const STATE_LIVE: u8 = 1;
const STATE_DELETED: u8 = 2;

/// One checkpoint as the catalog records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CatalogEntry {
    pub id: u64,
    pub parent: u64,
    pub logical: u64,
    pub new_bytes: u64,
    pub recipe_len: u64,
    /// The current path (live) or the last path (deleted).
    pub path: Vec<u8>,
    pub live: bool,
    pub format: Format,
    pub tensors: u64,
}

/// The decoded catalog.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Catalog {
    pub next_id: u64,
    pub generation: u64,
    /// In id order.
    pub entries: Vec<CatalogEntry>,
}

impl Default for Catalog {
    fn default() -> Self {
        Catalog { next_id: 1, generation: 0, entries: Vec::new() }
    }
}

impl Catalog {
    pub fn encode(&self) -> Vec<u8> {
        let mut entries = vec![0u8; self.entries.len() * ENTRY_LEN];
        let mut strings = Vec::new();
        for (i, e) in self.entries.iter().enumerate() {
            let r = &mut entries[i * ENTRY_LEN..(i + 1) * ENTRY_LEN];
            put_u64(r, E_ID, e.id);
            put_u64(r, E_PARENT, e.parent);
            put_u64(r, E_LOGICAL, e.logical);
            put_u64(r, E_NEW, e.new_bytes);
            put_u64(r, E_RECIPE_LEN, e.recipe_len);
            put_u64(r, E_PATH_OFF, strings.len() as u64);
            put_u32(r, E_PATH_LEN, e.path.len() as u32);
            r[E_STATE] = if e.live { STATE_LIVE } else { STATE_DELETED };
            r[E_FORMAT] = e.format as u8;
            put_u64(r, E_TENSORS, e.tensors);
            strings.extend_from_slice(&e.path);
        }
        let mut b = vec![0u8; HEADER_LEN];
        put_u64(&mut b, NEXT_ID_OFF, self.next_id);
        put_u64(&mut b, GENERATION_OFF, self.generation);
        put_u64(&mut b, COUNT_OFF, self.entries.len() as u64);
        put_u64(&mut b, STRINGS_LEN_OFF, strings.len() as u64);
        put_u64(&mut b, ENTRIES_SUM_OFF, xxh3(&entries));
        put_u64(&mut b, STRINGS_SUM_OFF, xxh3(&strings));
        HEADER.seal(&mut b);
        b.extend_from_slice(&entries);
        b.extend_from_slice(&strings);
        b
    }

    pub fn decode(file: &Path, b: &[u8]) -> Result<Catalog> {
        HEADER.check(file, b)?;
        let count = u64_at(b, COUNT_OFF);
        let strings_len = u64_at(b, STRINGS_LEN_OFF);
        let need = count
            .checked_mul(ENTRY_LEN as u64)
            .and_then(|n| n.checked_add(strings_len))
            .and_then(|n| n.checked_add(HEADER_LEN as u64));
        if need != Some(b.len() as u64) {
            return Err(FormatError::Corrupt {
                file: file.into(),
                entry: "catalog header".into(),
                offset: COUNT_OFF as u64,
                problem: format!("{count} entries and {strings_len} string bytes do not fit a {}-byte file", b.len()),
            }
            .into());
        }
        let ents_end = HEADER_LEN + count as usize * ENTRY_LEN;
        let (ents, strings) = (&b[HEADER_LEN..ents_end], &b[ents_end..]);
        for (name, sec, sum_off, off) in
            [("entries", ents, ENTRIES_SUM_OFF, HEADER_LEN), ("strings", strings, STRINGS_SUM_OFF, ents_end)]
        {
            FormatError::check_xxh3(file, || format!("catalog {name}"), off as u64, sec, u64_at(b, sum_off))?;
        }
        let next_id = u64_at(b, NEXT_ID_OFF);
        let mut entries = Vec::with_capacity(count as usize);
        let mut live_paths = std::collections::HashSet::new();
        for i in 0..count as usize {
            let r = &ents[i * ENTRY_LEN..(i + 1) * ENTRY_LEN];
            let at = (HEADER_LEN + i * ENTRY_LEN) as u64;
            let corrupt = |problem: String| -> CkptError {
                FormatError::Corrupt { file: file.into(), entry: format!("catalog entry {i}"), offset: at, problem }.into()
            };
            let (po, pl) = (u64_at(r, E_PATH_OFF), u32_at(r, E_PATH_LEN) as u64);
            let Some(path) = po.checked_add(pl).filter(|&e| e <= strings.len() as u64).map(|e| &strings[po as usize..e as usize])
            else {
                return Err(corrupt("path past the strings section".into()));
            };
            let live = match r[E_STATE] {
                STATE_LIVE => true,
                STATE_DELETED => false,
                s => return Err(corrupt(format!("unknown state {s}"))),
            };
            let format = Format::from_u8(r[E_FORMAT]).ok_or_else(|| corrupt(format!("unknown format {}", r[E_FORMAT])))?;
            let id = u64_at(r, E_ID);
            let prev = entries.last().map_or(0, |e: &CatalogEntry| e.id);
            if id <= prev || id >= next_id {
                return Err(corrupt(format!("id {id} out of order (previous {prev}, next id {next_id})")));
            }
            if live && !live_paths.insert(path) {
                return Err(corrupt(format!("second live checkpoint at {}", String::from_utf8_lossy(path))));
            }
            entries.push(CatalogEntry {
                id,
                parent: u64_at(r, E_PARENT),
                logical: u64_at(r, E_LOGICAL),
                new_bytes: u64_at(r, E_NEW),
                recipe_len: u64_at(r, E_RECIPE_LEN),
                path: path.to_vec(),
                live,
                format,
                tensors: u64_at(r, E_TENSORS),
            });
        }
        Ok(Catalog { next_id, generation: u64_at(b, GENERATION_OFF), entries })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_written_layout_is_unchanged() {
        assert_eq!(
            (NEXT_ID_OFF, STRINGS_SUM_OFF, HEADER_LEN, E_STATE, E_FORMAT, ENTRY_LEN),
            (16, 56, 72, 52, 53, 64)
        );
        let b = sample().encode();
        assert_eq!((b.len(), xxh3(&b)), (279, 14_749_468_446_664_810_576));
    }

    fn sample() -> Catalog {
        let e = |id, path: &str, live| CatalogEntry {
            id,
            parent: id - 1,
            logical: 100 * id,
            new_bytes: 10 * id,
            recipe_len: if live { 500 } else { 0 },
            path: path.as_bytes().to_vec(),
            live,
            format: Format::Safetensors,
            tensors: 4,
        };
        Catalog { next_id: 9, generation: 42, entries: vec![e(1, "run/a", false), e(2, "run/a", true), e(5, "run/b", true)] }
    }

    #[test]
    fn round_trip() {
        let c = sample();
        assert_eq!(Catalog::decode(Path::new("c"), &c.encode()).unwrap(), c);
        assert_eq!(Catalog::decode(Path::new("c"), &Catalog::default().encode()).unwrap(), Catalog::default());
    }

    #[test]
    fn every_header_fault_is_named() {
        let good = sample().encode();
        format::testing::assert_header_faults_named(&HEADER, "store/catalog.fsc", &good, |b| {
            Catalog::decode(Path::new("store/catalog.fsc"), b)
        });
    }

    #[test]
    fn flipped_bytes_are_named() {
        let b = sample().encode();
        let p = Path::new("catalog.fsc");
        for (off, what) in [(20, "catalog header"), (HEADER_LEN + 3, "catalog entries"), (b.len() - 1, "catalog strings")] {
            let mut c = b.clone();
            c[off] ^= 4;
            let e = Catalog::decode(p, &c).unwrap_err().to_string();
            assert!(e.contains("catalog.fsc") && e.contains(&format!("checksum mismatch in {what}")), "{e}");
        }
        let mut dup = sample();
        dup.entries[0].live = true;
        let e = Catalog::decode(p, &dup.encode()).unwrap_err().to_string();
        assert!(e.contains("catalog entry 1") && e.contains("second live checkpoint at run/a"), "{e}");
        let mut v = b.clone();
        put_u32(&mut v, format::VERSION_OFFSET, 3);
        format::testing::reseal(&mut v, HEADER_LEN);
        assert!(Catalog::decode(p, &v).unwrap_err().to_string().contains("unsupported catalog format version 3"));
        assert!(Catalog::decode(p, &b[..b.len() - 1]).is_err());
    }
}
