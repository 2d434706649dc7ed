//! Recognise a committed file's format and split its bytes, byte-exactly,
//! into *units* (tensor payloads, stored once by content) and *glue* (every
//! other byte, kept verbatim in the recipe).
//!
//! The pieces of a [`Split`] cover `0..len` in order with no gap and no
//! overlap, so concatenating them gives back the file: [`Split::check_cover`]
//! states exactly that (asserted on every commit in debug builds, and by the
//! fuzz tests); the whole-file checksum in each recipe checks it again on
//! every read.
//!
//! | format | recognised by | units |
//! | --- | --- | --- |
//! | safetensors | 8-byte header length + JSON header | each tensor's `data_offsets` range |
//! | torch.save zip | central directory, an `X/data.pkl` entry | each `X/data/<key>` entry payload, named after the first tensor data.pkl says uses it (`state_dict.enc.weight`), else `data/<key>` |
//! | .npy | `\x93NUMPY` v1/v2/v3 + header dict | the array data after the header |
//! | .npz | zip whose members all end in `.npy` | each stored member's array data; a deflated member's payload as is |
//! | torch.distributed.checkpoint shard (`.distcp`) | torch.save archives back to back, each ended by its own end record | each archive's storages, `item<k>` after the archive's place |
//! | anything else | (fallback, and every malformed input above) | content-defined chunks (fastcdc) |

mod cdc;
mod dcp;
mod npy;
mod pickle;
mod safetensors;
mod zip;

pub use cdc::CdcParams;
pub use npy::{npy_file, parse_npy_header, NpyHeader};
pub use pickle::{torch_storages, StorageInfo};
pub use zip::{parse_zip, ZipEntry};

use std::ops::Range;

fanstore_core::format::coded_enum! {
    /// The format a file was recognised as.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub enum Format: u8, from_u8 {
        /// Not recognised: content-defined chunks.
        Opaque = 0 => "opaque",
        Safetensors = 1 => "safetensors",
        TorchZip = 2 => "torch-zip",
        Npy = 3 => "npy",
        Npz = 4 => "npz",
        /// torch.distributed.checkpoint shard: torch.save archives back to back.
        TorchDcp = 5 => "torch-dcp",
    }
}

/// What a unit is, as far as the format tells.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct UnitMeta {
    /// Tensor name (safetensors key, zip entry path, npz member, `array`, `chunk-<i>`).
    pub name: Vec<u8>,
    /// The format's dtype text (`F32`, `<f4`, ...); empty when unknown.
    pub dtype: String,
    /// Empty when unknown or scalar.
    pub shape: Vec<u64>,
}

/// One piece of a split file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    /// Bytes kept verbatim in the recipe.
    Glue(Range<usize>),
    /// Bytes stored once by content.
    Unit(Range<usize>, UnitMeta),
}

impl Piece {
    pub fn range(&self) -> &Range<usize> {
        match self {
            Piece::Glue(r) | Piece::Unit(r, _) => r,
        }
    }
}

/// A file split into pieces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Split {
    pub format: Format,
    pub pieces: Vec<Piece>,
}

impl Split {
    /// True when the pieces cover `0..len` in order, with no gap or overlap,
    /// and no glue piece is empty.
    pub fn check_cover(&self, len: usize) -> bool {
        let mut at = 0;
        for p in &self.pieces {
            let r = p.range();
            if r.start != at || r.end < r.start {
                return false;
            }
            if matches!(p, Piece::Glue(_)) && r.is_empty() {
                return false;
            }
            at = r.end;
        }
        at == len
    }

    /// Number of unit pieces.
    pub fn unit_count(&self) -> usize {
        self.pieces.iter().filter(|p| matches!(p, Piece::Unit(..))).count()
    }
}

/// Builds a piece list from unit ranges sorted by start and non-overlapping;
/// every byte between units becomes glue.
pub(crate) fn fill_glue(len: usize, units: Vec<(Range<usize>, UnitMeta)>) -> Vec<Piece> {
    let mut pieces = Vec::with_capacity(units.len() * 2 + 1);
    let mut at = 0;
    for (r, m) in units {
        if r.start > at {
            pieces.push(Piece::Glue(at..r.start));
        }
        at = r.end;
        pieces.push(Piece::Unit(r, m));
    }
    if at < len {
        pieces.push(Piece::Glue(at..len));
    }
    pieces
}

/// Sorts unit ranges by start and refuses overlaps of non-empty ranges. An
/// empty range inside another range holds no bytes: it is moved to the end
/// of that range so the pieces stay in file order.
pub(crate) fn sort_disjoint(units: &mut [(Range<usize>, UnitMeta)]) -> bool {
    units.sort_by_key(|(r, _)| (r.start, r.end));
    let mut end = 0;
    for (r, _) in units.iter_mut() {
        if r.end <= r.start {
            if r.start < end {
                *r = end..end;
            }
            continue;
        }
        if r.start < end {
            return false;
        }
        end = r.end;
    }
    true
}

/// Recognises `bytes` and splits it. Never fails: anything not recognised,
/// including every malformed input, becomes content-defined chunks.
pub fn split(bytes: &[u8], cdc: &CdcParams) -> Split {
    let s = split_structured(bytes).unwrap_or_else(|| Split { format: Format::Opaque, pieces: cdc::chunk(bytes, cdc) });
    debug_assert!(s.check_cover(bytes.len()));
    s
}

/// The structured formats only: `None` when `bytes` is none of them (or is malformed).
pub fn split_structured(bytes: &[u8]) -> Option<Split> {
    split_structured_skipping(bytes, &[])
}

/// [`split_structured`] of a file whose ranges `zeros` hold only zero
/// bytes, as the caller knows: the skeleton of a commit from parts, its
/// units' ranges never written. The split is the same; the zero ranges are
/// not read where a parser would only search them (a DCP shard's end
/// records), so a skeleton's untouched pages are not faulted in. `zeros`
/// not sorted and disjoint: they are all read.
pub fn split_structured_skipping(bytes: &[u8], zeros: &[Range<usize>]) -> Option<Split> {
    let sorted = zeros.windows(2).all(|w| w[0].end <= w[1].start) && zeros.iter().all(|z| z.start <= z.end);
    let zeros = if sorted { zeros } else { &[] };
    if bytes.starts_with(npy::MAGIC) {
        return npy::split(bytes);
    }
    if bytes.starts_with(b"PK\x03\x04") {
        return zip::split(bytes).or_else(|| dcp::split_skipping(bytes, zeros));
    }
    safetensors::split(bytes)
}

/// Only the safetensors parser (tests and fuzzing).
pub fn split_safetensors(bytes: &[u8]) -> Option<Split> {
    safetensors::split(bytes)
}

/// Only the zip parser (torch.save archives and npz).
pub fn split_zip(bytes: &[u8]) -> Option<Split> {
    zip::split(bytes)
}

/// Only the parser of torch.distributed.checkpoint shards.
pub fn split_dcp(bytes: &[u8]) -> Option<Split> {
    dcp::split(bytes)
}

/// Only the .npy parser.
pub fn split_npy(bytes: &[u8]) -> Option<Split> {
    npy::split(bytes)
}
