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
//! Each plane is stored raw, as one zstd frame, or Huffman-coded
//! ([`mod@crate::huffman`]: an exponent plane is a skewed, memoryless
//! source, which zstd's fast levels code 10% above its entropy). Before
//! grouping, the elements may be rotated left by one bit (2, 4 and 8-byte
//! elements): the sign bit moves to the bottom, so that the exponent of a
//! bfloat16 or float32 fills one byte plane on its own instead of sharing
//! the top byte with the sign and leaving its lowest bit among the
//! mantissa's noise. The encoder tries both on a sample.
//!
//! ```text
//! body of a grouped (1) or delta (2) unit, element width W (1..=8 bytes),
//! payload length L, N = L / W elements, T = L % W tail bytes:
//!   W plane records, 16 bytes each, plane 0 first:
//!      0     mode u8 (0 raw, 1 one zstd frame, 2 Huffman)
//!      1     record 0: element transform u8 (0 none, 1 each element was
//!            rotated left by one bit before grouping); other records: 0
//!      2..8  reserved, zero
//!      8..16 stored length of the plane, u64
//!   the W planes, back to back; plane j decodes to N bytes: byte j of every
//!   element (j = 0 is the least significant byte of a little-endian element)
//!   the T tail bytes, raw
//! grouped: the planes and tail are the payload's bytes
//! delta:   they are payload XOR base payload (the base has the same length)
//! (rotated: the planes are those of the rotated elements; the tail is not
//! rotated)
//! ```
//!
//! Decoding checks every length; the unit header's checksums (body xxh3,
//! payload xxh3) catch any other damage.

use std::ops::Range;

/// Mode of a raw plane.
pub const PLANE_RAW: u8 = 0;
/// Mode of a zstd-compressed plane.
pub const PLANE_ZSTD: u8 = 1;
/// Mode of a Huffman-coded plane ([`mod@crate::huffman`]).
pub const PLANE_HUFF: u8 = 2;
/// Offset of the element transform in plane record 0.
pub const TRANSFORM_OFF: usize = 1;
/// Element transform: none.
pub const TRANSFORM_NONE: u8 = 0;
/// Element transform: each element rotated left by one bit.
pub const TRANSFORM_ROTL1: u8 = 1;
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
/// A Huffman plane is chosen over zstd only below this fraction of zstd's
/// size (zstd's decoder is the faster; a zstd frame also codes runs).
const HUFF_PAYS: f64 = 0.97;
/// Rotated elements are chosen only below this fraction of the plain estimate.
const ROTATE_PAYS: f64 = 0.99;
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

/// Whether elements of `w` bytes can be rotated ([`TRANSFORM_ROTL1`]).
fn rotatable(w: usize) -> bool {
    matches!(w, 2 | 4 | 8)
}

/// `src` with each whole element of `w` bytes (little-endian) rotated left
/// by one bit; the tail is copied as it is.
fn rotate(src: &[u8], w: usize) -> Vec<u8> {
    fn each<const W: usize>(src: &[u8], out: &mut Vec<u8>, f: impl Fn([u8; W]) -> [u8; W]) {
        let mut it = src.chunks_exact(W);
        for e in &mut it {
            let mut a = [0u8; W];
            a.copy_from_slice(e);
            out.extend_from_slice(&f(a));
        }
        out.extend_from_slice(it.remainder());
    }
    let mut out = Vec::with_capacity(src.len());
    match w {
        2 => each::<2>(src, &mut out, |a| u16::from_le_bytes(a).rotate_left(1).to_le_bytes()),
        4 => each::<4>(src, &mut out, |a| u32::from_le_bytes(a).rotate_left(1).to_le_bytes()),
        8 => each::<8>(src, &mut out, |a| u64::from_le_bytes(a).rotate_left(1).to_le_bytes()),
        _ => out.extend_from_slice(src),
    }
    out
}

/// Writes (or XORs, `xor`) into `dst` the elements whose byte `j` is
/// `planes[j][i]`, each rotated right by one bit (`w`: a rotatable width;
/// every plane holds `dst.len() / w` bytes).
fn gather_unrotated(planes: &[&[u8]], dst: &mut [u8], w: usize, xor: bool) {
    fn each<const W: usize>(planes: &[&[u8]], dst: &mut [u8], xor: bool, rot: impl Fn([u8; W]) -> [u8; W]) {
        let Ok(p) = <&[&[u8]; W]>::try_from(planes) else { return };
        for (i, d) in dst.chunks_exact_mut(W).enumerate() {
            let mut a = [0u8; W];
            for j in 0..W {
                a[j] = p[j][i];
            }
            let r = rot(a);
            if xor {
                for (d, r) in d.iter_mut().zip(r) {
                    *d ^= r;
                }
            } else {
                d.copy_from_slice(&r);
            }
        }
    }
    match w {
        2 => each::<2>(planes, dst, xor, |a| u16::from_le_bytes(a).rotate_right(1).to_le_bytes()),
        4 => each::<4>(planes, dst, xor, |a| u32::from_le_bytes(a).rotate_right(1).to_le_bytes()),
        8 => each::<8>(planes, dst, xor, |a| u64::from_le_bytes(a).rotate_right(1).to_le_bytes()),
        _ => {}
    }
}

/// The smallest way to store plane `p`: (mode, Huffman lengths when that
/// is the mode, estimated stored bytes). `zstd_len` is its zstd size, if
/// known; with `sample` only a sample of it is compressed to judge zstd.
fn plane_choice(c: &mut zstd::bulk::Compressor<'_>, p: &[u8], w: usize) -> (u8, Option<[u8; 256]>, usize) {
    let hist = crate::huffman::histogram(p);
    let lens = crate::huffman::code_lengths(&hist);
    let huff = crate::huffman::encoded_len(&hist, &lens);
    let sample = &p[..p.len().min(SAMPLE / w.max(1))];
    let zs = c.compress(sample).map_or(sample.len(), |z| z.len());
    // zstd's size of the whole plane, scaled from its sample.
    let zstd = if sample.is_empty() { p.len() } else { (zs as f64 * p.len() as f64 / sample.len() as f64) as usize };
    let pays = |n: usize| (n as f64) < PLANE_PAYS * p.len() as f64;
    if pays(huff) && (huff as f64) < HUFF_PAYS * zstd as f64 {
        (PLANE_HUFF, Some(lens), huff)
    } else if pays(zstd) {
        (PLANE_ZSTD, None, zstd)
    } else {
        (PLANE_RAW, None, p.len())
    }
}

/// Estimated body bytes of encoding the sample blocks of `src` (XOR `base`),
/// with the elements rotated (`rot`).
fn estimate(c: &mut zstd::bulk::Compressor<'_>, src: &[u8], base: Option<&[u8]>, w: usize, rot: bool) -> usize {
    let mut total = 0;
    for r in sample_ranges(src.len(), w) {
        let planes = if rot {
            let (s, b) = (rotate(&src[r.clone()], w), base.map(|b| rotate(&b[r.clone()], w)));
            group(&s, b.as_deref(), w)
        } else {
            group(&src[r.clone()], base.map(|b| &b[r]), w)
        };
        for p in planes {
            let z = c.compress(&p).map_or(p.len(), |z| z.len().min(p.len()));
            let hist = crate::huffman::histogram(&p);
            let h = crate::huffman::encoded_len(&hist, &crate::huffman::code_lengths(&hist));
            total += z.min(h);
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
    let plain = estimate(&mut c, src, None, w, false);
    let rotated = rotatable(w).then(|| estimate(&mut c, src, None, w, true));
    let rot = rotated.is_some_and(|r| (r as f64) < ROTATE_PAYS * plain as f64);
    let full = if rot { rotated.unwrap_or(plain) } else { plain };
    // A delta can only pay where the XOR has many zero bytes: a quick count
    // on the sample saves compressing it for tensors that changed wholesale.
    let base = base.filter(|b| xor_zero_fraction(src, b, w) >= MIN_XOR_ZEROS);
    let delta = base.map(|b| estimate(&mut c, src, Some(b), w, rot));
    let (encoding, best, base) = match delta {
        // A delta must clearly pay: it costs a decode of its base on reads
        // and keeps the base alive.
        Some(d) if (d as f64) < DELTA_PAYS * full as f64 => (Encoding::Delta, d, base),
        _ => (Encoding::Grouped, full, None),
    };
    if best as f64 > UNIT_PAYS * sampled as f64 {
        return raw;
    }
    let planes = if rot {
        let (s, b) = (rotate(src, w), base.map(|b| rotate(b, w)));
        group(&s, b.as_deref(), w)
    } else {
        group(src, base, w)
    };
    let mut recs = vec![0u8; w * PLANE_REC_LEN];
    if rot {
        recs[TRANSFORM_OFF] = TRANSFORM_ROTL1;
    }
    let mut body = Vec::with_capacity(src.len() / 2);
    body.extend_from_slice(&recs);
    for (j, p) in planes.iter().enumerate() {
        let stored = match plane_choice(&mut c, p, w) {
            (PLANE_HUFF, Some(lens), _) => crate::huffman::encode(p, &lens).map(|h| (PLANE_HUFF, h)),
            (PLANE_ZSTD, _, _) => c.compress(p).ok().map(|z| (PLANE_ZSTD, z)),
            _ => None,
        };
        let rec = &mut recs[j * PLANE_REC_LEN..(j + 1) * PLANE_REC_LEN];
        match stored.filter(|(_, z)| z.len() < p.len()) {
            Some((mode, z)) => {
                rec[0] = mode;
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
    let rot = match body[TRANSFORM_OFF] {
        TRANSFORM_NONE => false,
        TRANSFORM_ROTL1 if rotatable(w) => true,
        t => return Err(err(TRANSFORM_OFF, format!("element transform {t} for {w}-byte elements"))),
    };
    // Rotated: every plane is kept (raw ones where they lie in the body),
    // then gathered into rotated-back elements in one pass.
    let mut kept: Vec<std::borrow::Cow<'_, [u8]>> = Vec::new();
    let mut at = recs;
    let mut plane = Vec::new();
    let mut d = zstd::bulk::Decompressor::new().map_err(|e| err(0, format!("zstd: {e}")))?;
    for j in 0..w {
        let rec = &body[j * PLANE_REC_LEN..(j + 1) * PLANE_REC_LEN];
        let mode = rec[0];
        if rec[2..8].iter().any(|&b| b != 0) || (j > 0 && rec[TRANSFORM_OFF] != 0) {
            return Err(err(j * PLANE_REC_LEN, format!("plane {j}: reserved bytes are not zero")));
        }
        let mut l = [0u8; 8];
        l.copy_from_slice(&rec[8..16]);
        let len = u64::from_le_bytes(l);
        let end = (at as u64).checked_add(len).filter(|&e| e <= body.len() as u64);
        let Some(end) = end.map(|e| e as usize) else {
            return Err(err(j * PLANE_REC_LEN, format!("plane {j} of {len} bytes runs past the body ({} bytes)", body.len())));
        };
        let stored = &body[at..end];
        if rot {
            plane = Vec::new(); // kept below: a new buffer for each plane
        }
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
            PLANE_HUFF => {
                crate::huffman::decode(stored, n, &mut plane).map_err(|e| err(at, format!("Huffman plane {j}: {e}")))?;
                &plane
            }
            m => return Err(err(j * PLANE_REC_LEN, format!("plane {j}: unknown mode {m}"))),
        };
        if rot {
            kept.push(if mode == PLANE_RAW { std::borrow::Cow::Borrowed(stored) } else { std::borrow::Cow::Owned(std::mem::take(&mut plane)) });
        } else {
            scatter(bytes, j, w, &mut dst[..n * w], xor);
        }
        at = end;
    }
    if rot {
        let planes: Vec<&[u8]> = kept.iter().map(|p| &p[..]).collect();
        gather_unrotated(&planes, &mut dst[..n * w], w, xor);
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

    /// Random-normal bfloat16 (Box-Muller; std 0.02), as a fresh checkpoint's weights.
    fn bf16_normal(rng: &mut Rng, n: usize) -> Vec<u8> {
        let mut u = || ((rng.next() >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
        (0..n)
            .flat_map(|_| {
                let z = (-2.0 * u().ln()).sqrt() * (2.0 * std::f64::consts::PI * u()).cos();
                (((z * 0.02) as f32).to_bits() >> 16) as u16
            }.to_le_bytes())
            .collect()
    }

    #[test]
    fn bf16_exponents_get_a_plane_of_their_own_and_a_huffman_code() {
        let mut rng = Rng(0x5eed);
        let raw = bf16_normal(&mut rng, 1 << 20);
        let e = round_trip(&raw, 2, None);
        assert_eq!(e.encoding, Encoding::Grouped);
        assert_eq!(e.body[TRANSFORM_OFF], TRANSFORM_ROTL1, "the sign bit moved below the exponent");
        // Plane 1 (the exponent) Huffman-coded, plane 0 (sign and mantissa) raw.
        assert_eq!((e.body[PLANE_REC_LEN], e.body[0]), (PLANE_HUFF, PLANE_RAW));
        // The entropy bound of these bytes is 1.529x; zstd's planes gave 1.46x.
        let ratio = raw.len() as f64 / e.body.len() as f64;
        assert!(ratio >= 1.5, "{ratio:.4}x");
        // A small update: a delta of rotated elements.
        let upd: Vec<u8> = raw.chunks_exact(2).enumerate().flat_map(|(i, c)| {
            let v = u16::from_le_bytes([c[0], c[1]]);
            (if i % 3 == 0 { v ^ 1 } else { v }).to_le_bytes()
        }).collect();
        let d = round_trip(&upd, 2, Some(&raw));
        assert_eq!((d.encoding, d.body[TRANSFORM_OFF]), (Encoding::Delta, TRANSFORM_ROTL1));
        // A transform the width cannot have, or set on another record: an error.
        for (at, v) in [(TRANSFORM_OFF, 7u8), (PLANE_REC_LEN + TRANSFORM_OFF, 1), (3, 1)] {
            let mut bad = e.body.clone();
            bad[at] = v;
            let mut dst = vec![0u8; raw.len()];
            assert!(decode_into(&bad, 2, &mut dst, false).is_err(), "byte {at} = {v}");
        }
        let mut odd = e.body.clone();
        odd.truncate(3 * PLANE_REC_LEN);
        assert!(decode_into(&odd, 3, &mut vec![0u8; 30], false).is_err());
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
