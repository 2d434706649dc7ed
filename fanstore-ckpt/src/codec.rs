//! Lossless, float-aware encodings of unit payloads (the body of a version 2
//! unit file, see [`mod@crate::unit`]).
//!
//! Float weights compress badly as a byte stream: the sign/exponent byte of
//! every element is nearly constant, the low mantissa bytes are noise, and
//! they are interleaved. Grouping the bytes by their position in the element
//! (all byte 0s, then all byte 1s, ...) puts the compressible planes together;
//! each plane is then stored zstd-compressed when that pays, raw otherwise.
//! A fine-tuned tensor differs from its parent's in the low mantissa bits
//! only, so the XOR of the two tensors' element bits has near-zero high
//! planes: a *delta* unit stores that XOR, grouped the same way.
//!
//! ```text
//! body of a grouped (1) or delta (2) unit, element width W (1..=8 bytes),
//! payload length L, N = L / W elements, T = L % W tail bytes:
//!   W plane records, 16 bytes each, plane 0 first:
//!      0     mode u8 (0 raw, 1 one zstd frame)
//!      1..8  reserved, zero
//!      8..16 stored length of the plane, u64
//!   the W planes, back to back; plane j decodes to N bytes: byte j of every
//!   element (j = 0 is the least significant byte of a little-endian element)
//!   the T tail bytes, raw
//! grouped: the planes and tail are the payload's bytes
//! delta:   they are payload XOR base payload (the base has the same length)
//! ```
//!
//! Decoding checks every length; the unit header's checksums (body xxh3,
//! payload xxh3) catch any other damage.

use std::ops::Range;

/// Mode of a raw plane.
pub const PLANE_RAW: u8 = 0;
/// Mode of a zstd-compressed plane.
pub const PLANE_ZSTD: u8 = 1;
/// Length of one plane record.
pub const PLANE_REC_LEN: usize = 16;

/// zstd level of the planes: the fastest (a commit must keep up with a
/// plain write; the high planes of floats compress well at any level).
const LEVEL: i32 = 1;
/// A plane whose sample does not shrink below this fraction is stored raw
/// without compressing the rest of it.
const PLANE_PAYS: f64 = 0.95;
/// A unit whose best estimate does not shrink below this fraction is stored raw.
const UNIT_PAYS: f64 = 0.97;
/// A delta is chosen over the full encoding only below this fraction of it.
const DELTA_PAYS: f64 = 0.9;
/// A delta is only estimated when at least this fraction of the XOR's
/// bytes are zero (a small update of floats: about half; unrelated bytes: 1/256).
const MIN_XOR_ZEROS: f64 = 0.2;
/// Payloads shorter than this are stored raw (headers would eat the gain).
pub const MIN_ENCODE: usize = 4096;
/// Bytes sampled (in a few spread blocks) to choose the encoding.
const SAMPLE: usize = 256 << 10;

/// Element width in bytes of a dtype name (safetensors, torch storage or
/// numpy spelling); 1 when unknown (plain zstd of the bytes).
pub fn width_of(dtype: &str) -> usize {
    let d = dtype.trim_start_matches(['<', '=', '|']);
    match d {
        "F64" | "I64" | "U64" | "f8" | "i8" | "u8" | "c8" => 8,
        "F32" | "I32" | "U32" | "f4" | "i4" | "u4" => 4,
        "F16" | "BF16" | "I16" | "U16" | "f2" | "i2" | "u2" => 2,
        _ => 1,
    }
}

fanstore_core::format::coded_enum! {
    /// How a payload is stored.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Encoding: u8, from_u8 {
        /// The payload bytes as they are.
        Raw = 0 => "raw",
        /// Byte planes, each raw or zstd.
        Grouped = 1 => "grouped",
        /// XOR with the base unit's payload, then byte planes.
        Delta = 2 => "delta",
        /// Not encoded here: the payload lies raw in an extent file (a committed
        /// file the store adopted whole, see `extent.rs`); the record holds only
        /// where. [`encode`] never chooses it.
        External = 3 => "external",
    }
}

impl Encoding {
    /// The code a unit header stores.
    pub fn to_u8(self) -> u8 {
        self as u8
    }
}

/// An encoded payload: the encoding chosen and the body (empty for raw:
/// the body of a raw unit is the payload itself).
#[derive(Debug)]
pub struct Encoded {
    pub encoding: Encoding,
    pub width: usize,
    pub body: Vec<u8>,
}

/// A decoding fault: what is wrong, and where in the body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CodecError {
    pub offset: u64,
    pub problem: String,
}

fn err(offset: usize, problem: String) -> CodecError {
    CodecError { offset: offset as u64, problem }
}

/// The blocks of `len` bytes (multiples of `w`) that estimate an encoding.
fn sample_ranges(len: usize, w: usize) -> Vec<Range<usize>> {
    if len <= SAMPLE {
        return vec![0..len - len % w];
    }
    let blocks = 4;
    let blk = (SAMPLE / blocks) / w * w;
    (0..blocks)
        .map(|k| {
            let start = (len / blocks * k) / w * w;
            start..(start + blk).min(len - len % w)
        })
        .collect()
}

/// Fraction of zero bytes in `src` XOR `base` over the sample blocks.
fn xor_zero_fraction(src: &[u8], base: &[u8], w: usize) -> f64 {
    let (mut zeros, mut total) = (0usize, 0usize);
    for r in sample_ranges(src.len(), w) {
        zeros += src[r.clone()].iter().zip(&base[r.clone()]).filter(|(a, b)| a == b).count();
        total += r.len();
    }
    if total == 0 {
        0.0
    } else {
        zeros as f64 / total as f64
    }
}

/// Splits `src` (XOR `base`) into `w` planes of `src.len() / w` bytes.
fn group(src: &[u8], base: Option<&[u8]>, w: usize) -> Vec<Vec<u8>> {
    match w {
        2 => group_fixed::<2>(src, base),
        4 => group_fixed::<4>(src, base),
        8 => group_fixed::<8>(src, base),
        _ => group_any(src, base, w),
    }
}

/// [`group`] for a width known at compile time: elements are transposed a
/// block at a time into fixed-size arrays (no bounds checks, vectorised),
/// then copied into the planes (the generic loop was a third of a delta
/// commit's CPU time).
fn group_fixed<const W: usize>(src: &[u8], base: Option<&[u8]>) -> Vec<Vec<u8>> {
    const B: usize = 512;
    let n = src.len() / W;
    let mut planes: Vec<Vec<u8>> = (0..W).map(|_| Vec::with_capacity(n)).collect();
    let mut tmp = [[0u8; B]; W];
    let blocks = n / B;
    let elems = |b: &[u8]| -> [u8; W] {
        let mut a = [0u8; W];
        a.copy_from_slice(b);
        a
    };
    for blk in 0..blocks {
        let range = blk * B * W..(blk + 1) * B * W;
        let s = &src[range.clone()];
        match base {
            Some(base) => {
                for (k, (e, f)) in s.chunks_exact(W).zip(base[range].chunks_exact(W)).enumerate().take(B) {
                    let (e, f) = (elems(e), elems(f));
                    for j in 0..W {
                        tmp[j][k] = e[j] ^ f[j];
                    }
                }
            }
            None => {
                for (k, e) in s.chunks_exact(W).enumerate().take(B) {
                    let e = elems(e);
                    for j in 0..W {
                        tmp[j][k] = e[j];
                    }
                }
            }
        }
        for (p, t) in planes.iter_mut().zip(&tmp) {
            p.extend_from_slice(t);
        }
    }
    let done = blocks * B;
    let rest = group_any(&src[done * W..n * W], base.map(|b| &b[done * W..n * W]), W);
    for (p, r) in planes.iter_mut().zip(rest) {
        p.extend_from_slice(&r);
    }
    planes
}

/// [`group`] for any width.
fn group_any(src: &[u8], base: Option<&[u8]>, w: usize) -> Vec<Vec<u8>> {
    let n = src.len() / w;
    let mut planes: Vec<Vec<u8>> = (0..w).map(|_| vec![0u8; n]).collect();
    match base {
        None => {
            for (i, e) in src.chunks_exact(w).enumerate() {
                for (j, &b) in e.iter().enumerate() {
                    planes[j][i] = b;
                }
            }
        }
        Some(base) => {
            for (i, (e, f)) in src.chunks_exact(w).zip(base.chunks_exact(w)).enumerate() {
                for j in 0..w {
                    planes[j][i] = e[j] ^ f[j];
                }
            }
        }
    }
    planes
}

/// Estimated body bytes of encoding the sample blocks of `src` (XOR `base`).
fn estimate(c: &mut zstd::bulk::Compressor<'_>, src: &[u8], base: Option<&[u8]>, w: usize) -> usize {
    let mut total = 0;
    for r in sample_ranges(src.len(), w) {
        let planes = group(&src[r.clone()], base.map(|b| &b[r]), w);
        for p in planes {
            total += c.compress(&p).map_or(p.len(), |z| z.len().min(p.len()));
        }
    }
    total
}

/// Encodes `src` (element width `w`), as a delta against `base` when given
/// and smaller. Never larger than raw: a payload that does not compress is
/// [`Encoding::Raw`].
pub fn encode(src: &[u8], w: usize, base: Option<&[u8]>) -> Encoded {
    let raw = Encoded { encoding: Encoding::Raw, width: 1, body: Vec::new() };
    let w = w.clamp(1, 8);
    let base = base.filter(|b| b.len() == src.len());
    if src.len() < MIN_ENCODE.max(w) {
        return raw;
    }
    let Ok(mut c) = zstd::bulk::Compressor::new(LEVEL) else { return raw };
    let sampled: usize = sample_ranges(src.len(), w).iter().map(|r| r.len()).sum();
    let full = estimate(&mut c, src, None, w);
    // A delta can only pay where the XOR has many zero bytes: a quick count
    // on the sample saves compressing it for tensors that changed wholesale.
    let base = base.filter(|b| xor_zero_fraction(src, b, w) >= MIN_XOR_ZEROS);
    let delta = base.map(|b| estimate(&mut c, src, Some(b), w));
    let (encoding, best, base) = match delta {
        // A delta must clearly pay: it costs a decode of its base on reads
        // and keeps the base alive.
        Some(d) if (d as f64) < DELTA_PAYS * full as f64 => (Encoding::Delta, d, base),
        _ => (Encoding::Grouped, full, None),
    };
    if best as f64 > UNIT_PAYS * sampled as f64 {
        return raw;
    }
    let planes = group(src, base, w);
    let mut recs = vec![0u8; w * PLANE_REC_LEN];
    let mut body = Vec::with_capacity(src.len() / 2);
    body.extend_from_slice(&recs);
    for (j, p) in planes.iter().enumerate() {
        let sample = &p[..p.len().min(SAMPLE / w.max(1))];
        let pays = c.compress(sample).is_ok_and(|z| (z.len() as f64) < PLANE_PAYS * sample.len() as f64);
        let z = if pays { c.compress(p).ok().filter(|z| z.len() < p.len()) } else { None };
        let rec = &mut recs[j * PLANE_REC_LEN..(j + 1) * PLANE_REC_LEN];
        match z {
            Some(z) => {
                rec[0] = PLANE_ZSTD;
                rec[8..16].copy_from_slice(&(z.len() as u64).to_le_bytes());
                body.extend_from_slice(&z);
            }
            None => {
                rec[0] = PLANE_RAW;
                rec[8..16].copy_from_slice(&(p.len() as u64).to_le_bytes());
                body.extend_from_slice(p);
            }
        }
    }
    let tail = src.len() - src.len() % w;
    match base {
        Some(b) => body.extend(src[tail..].iter().zip(&b[tail..]).map(|(x, y)| x ^ y)),
        None => body.extend_from_slice(&src[tail..]),
    }
    body[..recs.len()].copy_from_slice(&recs);
    if body.len() >= src.len() {
        return raw;
    }
    Encoded { encoding, width: w, body }
}

/// Decodes a grouped body into `dst` (`xor`: a delta body, XORed into `dst`,
/// which holds the base payload). `dst.len()` is the payload length.
pub fn decode_into(body: &[u8], w: usize, dst: &mut [u8], xor: bool) -> Result<(), CodecError> {
    if !(1..=8).contains(&w) {
        return Err(err(0, format!("element width {w} (1 to 8 supported)")));
    }
    let n = dst.len() / w;
    let recs = w * PLANE_REC_LEN;
    if body.len() < recs {
        return Err(err(0, format!("{} body bytes cannot hold {w} plane records", body.len())));
    }
    let mut at = recs;
    let mut plane = Vec::new();
    let mut d = zstd::bulk::Decompressor::new().map_err(|e| err(0, format!("zstd: {e}")))?;
    for j in 0..w {
        let rec = &body[j * PLANE_REC_LEN..(j + 1) * PLANE_REC_LEN];
        let mode = rec[0];
        let mut l = [0u8; 8];
        l.copy_from_slice(&rec[8..16]);
        let len = u64::from_le_bytes(l);
        let end = (at as u64).checked_add(len).filter(|&e| e <= body.len() as u64);
        let Some(end) = end.map(|e| e as usize) else {
            return Err(err(j * PLANE_REC_LEN, format!("plane {j} of {len} bytes runs past the body ({} bytes)", body.len())));
        };
        let stored = &body[at..end];
        let bytes: &[u8] = match mode {
            PLANE_RAW => {
                if stored.len() != n {
                    return Err(err(at, format!("raw plane {j} has {} bytes, expected {n}", stored.len())));
                }
                stored
            }
            PLANE_ZSTD => {
                plane.clear();
                plane.reserve(n);
                let got = d
                    .decompress_to_buffer(stored, &mut plane)
                    .map_err(|e| err(at, format!("zstd plane {j}: {e}")))?;
                if got != n {
                    return Err(err(at, format!("zstd plane {j} decodes to {got} bytes, expected {n}")));
                }
                &plane
            }
            m => return Err(err(j * PLANE_REC_LEN, format!("plane {j}: unknown mode {m}"))),
        };
        scatter(bytes, j, w, &mut dst[..n * w], xor);
        at = end;
    }
    let tail = &body[at..];
    if tail.len() != dst.len() - n * w {
        return Err(err(at, format!("{} tail bytes, expected {}", tail.len(), dst.len() - n * w)));
    }
    for (o, &t) in dst[n * w..].iter_mut().zip(tail) {
        if xor {
            *o ^= t;
        } else {
            *o = t;
        }
    }
    Ok(())
}

/// Writes (or XORs) plane `j` into byte `j` of every element of `dst`.
fn scatter(plane: &[u8], j: usize, w: usize, dst: &mut [u8], xor: bool) {
    if xor {
        for (e, &b) in dst.chunks_exact_mut(w).zip(plane) {
            e[j] ^= b;
        }
    } else {
        for (e, &b) in dst.chunks_exact_mut(w).zip(plane) {
            e[j] = b;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn normal(&mut self) -> f32 {
            // Sum of uniforms: close enough to a bell for weights.
            let s: f64 = (0..6).map(|_| (self.next() >> 11) as f64 / (1u64 << 53) as f64).sum();
            (s - 3.0) as f32
        }
    }

    fn weights(rng: &mut Rng, n: usize) -> Vec<f32> {
        (0..n).map(|_| rng.normal() * 0.02).collect()
    }

    fn bytes_f32(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    fn round_trip(src: &[u8], w: usize, base: Option<&[u8]>) -> Encoded {
        let e = encode(src, w, base);
        let mut dst = match (e.encoding, base) {
            (Encoding::Delta, Some(b)) => b.to_vec(),
            _ => vec![0xAA; src.len()],
        };
        match e.encoding {
            Encoding::Raw => dst.copy_from_slice(src),
            Encoding::Grouped => decode_into(&e.body, e.width, &mut dst, false).unwrap(),
            Encoding::Delta => decode_into(&e.body, e.width, &mut dst, true).unwrap(),
            Encoding::External => panic!("encode chose External, which only the store assigns"),
        }
        assert_eq!(dst, src, "{:?} w={w}", e.encoding);
        e
    }

    #[test]
    fn floats_group_and_deltas_shrink() {
        let mut rng = Rng(0x9e3779b97f4a7c15);
        let w = weights(&mut rng, 100_000);
        let raw = bytes_f32(&w);
        let e = round_trip(&raw, 4, None);
        assert_eq!(e.encoding, Encoding::Grouped);
        assert!(e.body.len() < raw.len() * 9 / 10, "{} of {}", e.body.len(), raw.len());
        let upd: Vec<f32> = w.iter().map(|x| x + 1e-3 * 0.02 * rng.normal()).collect();
        let ub = bytes_f32(&upd);
        let d = round_trip(&ub, 4, Some(&raw));
        assert_eq!(d.encoding, Encoding::Delta);
        assert!(d.body.len() < raw.len() * 7 / 10, "{} of {}", d.body.len(), raw.len());
        // Unrelated base: the full encoding wins.
        let other = bytes_f32(&weights(&mut rng, 100_000));
        assert_eq!(round_trip(&ub, 4, Some(&other)).encoding, Encoding::Grouped);
    }

    #[test]
    fn noise_stays_raw() {
        let mut rng = Rng(7);
        let noise: Vec<u8> = (0..300_000).map(|_| rng.next() as u8).collect();
        for w in [1, 2, 4, 8] {
            assert_eq!(round_trip(&noise, w, None).encoding, Encoding::Raw);
        }
        assert_eq!(round_trip(&noise[..100], 4, None).encoding, Encoding::Raw);
    }

    #[test]
    fn every_width_and_tail_round_trips() {
        let mut rng = Rng(99);
        for w in 1..=8usize {
            for len in [4096usize, 4099, 70_001, 300_007] {
                let src: Vec<u8> = (0..len).map(|i| if i % w == w - 1 { 0x3c } else { rng.next() as u8 & 0x0f }).collect();
                let mut base = src.clone();
                for b in base.iter_mut().step_by(3) {
                    *b ^= 1;
                }
                round_trip(&src, w, None);
                round_trip(&src, w, Some(&base));
            }
        }
    }

    #[test]
    fn damaged_bodies_are_errors_not_panics() {
        let mut rng = Rng(3);
        let raw = bytes_f32(&weights(&mut rng, 20_000));
        let e = encode(&raw, 4, None);
        assert_eq!(e.encoding, Encoding::Grouped);
        let mut dst = vec![0u8; raw.len()];
        assert!(decode_into(&e.body[..10], 4, &mut dst, false).unwrap_err().problem.contains("plane records"));
        let mut b = e.body.clone();
        b[8] ^= 0x40; // plane 0 length
        assert!(decode_into(&b, 4, &mut dst, false).is_err());
        let mut b = e.body.clone();
        b[16] = 9;
        assert!(decode_into(&b, 4, &mut dst, false).unwrap_err().problem.contains("unknown mode 9"));
        assert!(decode_into(&e.body, 9, &mut dst, false).is_err());
        assert!(decode_into(&e.body, 4, &mut dst[..raw.len() - 4], false).is_err());
        // Random bytes anywhere: an error or (checksums catch it later) other bytes, never a panic.
        for k in 0..2000 {
            let mut b = e.body.clone();
            let i = (rng.next() % b.len() as u64) as usize;
            b[i] = rng.next() as u8;
            if k % 5 == 0 {
                b.truncate((rng.next() % b.len() as u64) as usize);
            }
            let _ = decode_into(&b, 4, &mut dst, k % 2 == 0);
        }
    }

    #[test]
    fn fixed_width_grouping_matches_the_generic_loop() {
        let mut rng = Rng(77);
        for w in [2usize, 4, 8] {
            for len in [0usize, 7, 512 * w - 1, 512 * w, 512 * w + 3, 3 * 512 * w + 5 * w + 1, 40_000] {
                let src: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
                let base: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
                assert_eq!(group(&src, None, w), group_any(&src, None, w), "w={w} len={len}");
                assert_eq!(group(&src, Some(&base), w), group_any(&src, Some(&base), w), "w={w} len={len} xor");
            }
        }
    }

    #[test]
    fn dtype_widths() {
        assert_eq!(width_of("F32"), 4);
        assert_eq!(width_of("BF16"), 2);
        assert_eq!(width_of("<f2"), 2);
        assert_eq!(width_of("<f8"), 8);
        assert_eq!(width_of("U8"), 1);
        assert_eq!(width_of(""), 1);
    }
}
