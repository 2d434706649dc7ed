//! The fallback: content-defined chunks (FastCDC 2020), so that repeated
//! content in formats we do not parse (HDF5, pickles, anything) still
//! deduplicates even when it moves. Each chunk is a unit named `chunk-<i>`.
//!
//! Every chunk is a file in the store, and creating a file costs 0.3-1 ms on
//! the ext4 of these machines (measured: a 1 GiB file in 64 KiB chunks took
//! 9.8 s to commit, against 1.1 s as one plain file). So the sizes grow with
//! the file: a file of up to [`MAX_CHUNKS`] x avg keeps the configured sizes;
//! a larger one has every size multiplied by the same power of two, so it
//! has about [`MAX_CHUNKS`] chunks. Files of one size class (a series of
//! checkpoints of one model) still cut the same content at the same places.

use super::{Piece, UnitMeta};

/// Chunk size bounds in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CdcParams {
    pub min: u32,
    pub avg: u32,
    pub max: u32,
}

impl Default for CdcParams {
    fn default() -> Self {
        CdcParams { min: 16 << 10, avg: 64 << 10, max: 256 << 10 }
    }
}

impl CdcParams {
    /// Clamped into the ranges fastcdc accepts (it asserts on anything else)
    /// and ordered min <= avg <= max.
    pub fn sanitized(self) -> CdcParams {
        use fastcdc::v2020::*;
        let min = self.min.clamp(MINIMUM_MIN, MINIMUM_MAX);
        let avg = self.avg.clamp(AVERAGE_MIN, AVERAGE_MAX).max(min);
        let max = self.max.clamp(MAXIMUM_MIN, MAXIMUM_MAX).max(avg);
        CdcParams { min, avg, max }
    }
}

/// About how many chunks a large file is cut into at most.
pub const MAX_CHUNKS: u64 = 256;

impl CdcParams {
    /// The sizes for a file of `len` bytes (see the module documentation).
    pub fn for_len(self, len: u64) -> CdcParams {
        let p = self.sanitized();
        let scale = (len / (u64::from(p.avg) * MAX_CHUNKS)).max(1).next_power_of_two().min(1 << 16) as u32;
        if scale == 1 {
            return p;
        }
        CdcParams { min: p.min.saturating_mul(scale), avg: p.avg.saturating_mul(scale), max: p.max.saturating_mul(scale) }.sanitized()
    }
}

pub(super) fn chunk(bytes: &[u8], p: &CdcParams) -> Vec<Piece> {
    let p = p.for_len(bytes.len() as u64);
    fastcdc::v2020::FastCDC::new(bytes, p.min, p.avg, p.max)
        .enumerate()
        .map(|(i, c)| {
            let name = format!("chunk-{i}").into_bytes();
            Piece::Unit(c.offset..c.offset + c.length, UnitMeta { name, ..UnitMeta::default() })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::{split, Format};
    use super::*;

    #[test]
    fn chunk_sizes_grow_with_large_files_only() {
        let p = CdcParams::default();
        assert_eq!(p.for_len(1 << 20), p.sanitized());
        assert_eq!(p.for_len(16 << 20), p.sanitized());
        let big = p.for_len(1 << 30);
        assert_eq!((big.min, big.avg, big.max), (p.min * 64, p.avg * 64, (p.max * 64).min(fastcdc::v2020::MAXIMUM_MAX)));
        let n = 64 << 20;
        let data: Vec<u8> = (0..n as u64).map(|i| (i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as u8).collect();
        let pieces = chunk(&data, &p);
        assert!(pieces.len() as u64 <= 2 * MAX_CHUNKS, "{} chunks for 64 MiB", pieces.len());
    }

    #[test]
    fn chunks_cover_and_resynchronise_after_an_insert() {
        let mut x = 7u64;
        let data: Vec<u8> = (0..3_000_000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        let p = CdcParams::default();
        let a = split(&data, &p);
        assert_eq!(a.format, Format::Opaque);
        assert!(a.check_cover(data.len()));
        assert!(a.pieces.len() > 20, "{}", a.pieces.len());
        let mut shifted = b"inserted!".to_vec();
        shifted.extend_from_slice(&data);
        let b = split(&shifted, &p);
        let ha: std::collections::HashSet<_> = a.pieces.iter().map(|q| blake3::hash(&data[q.range().clone()])).collect();
        let same = b.pieces.iter().filter(|q| ha.contains(&blake3::hash(&shifted[q.range().clone()]))).count();
        assert!(same + 2 >= b.pieces.len(), "{same} of {} chunks shared", b.pieces.len());
        assert!(split(b"", &p).pieces.is_empty());
        let bad = CdcParams { min: 0, avg: 1, max: u32::MAX }.sanitized();
        assert!(bad.min <= bad.avg && bad.avg <= bad.max);
    }
}
