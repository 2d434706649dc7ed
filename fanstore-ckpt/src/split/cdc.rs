//! The fallback: content-defined chunks (FastCDC 2020), so that repeated
//! content in formats we do not parse (HDF5, pickles, anything) still
//! deduplicates even when it moves. Each chunk is a unit named `chunk-<i>`.

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

pub(super) fn chunk(bytes: &[u8], p: &CdcParams) -> Vec<Piece> {
    let p = p.sanitized();
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
