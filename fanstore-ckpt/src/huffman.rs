//! Order-0 canonical Huffman coding of one byte plane (plane mode 2 of
//! [`mod@crate::codec`]).
//!
//! The exponent plane of float weights is a skewed, memoryless source: on a
//! random-normal bf16 tensor its entropy is 2.55 bits a byte, and Huffman
//! codes it in 2.59. zstd at level 1 spends 2.83-2.88 on it (its matches
//! cost more than the literals they replace, and its literal tables are
//! built for speed), which keeps a fresh bf16 checkpoint at 1.46x; coded
//! here it is 1.51x.
//!
//! ```text
//! a Huffman plane of N symbols (N is known from the unit: the element count):
//!   0..128   code lengths, 4 bits per symbol: symbol 2i in the low nibble of
//!            byte i, symbol 2i+1 in the high nibble; 0 = the symbol does not
//!            occur, else 1..=MAX_LEN
//!   128..152 the byte lengths of streams 0, 1 and 2, u64 each (stream 3
//!            takes the rest of the plane)
//!   152..    4 streams back to back; stream k holds the codes of symbols
//!            k*Q .. min((k+1)*Q, N), Q = ceil(N / 4), least significant bit
//!            first, each code's bits reversed (canonical codes, assigned in
//!            order of (length, symbol)); each stream's last byte is padded
//!            with zero bits
//! ```
//!
//! Four streams: each code's length is known only once the code before it
//! is decoded, so one stream decodes one symbol per table-lookup latency;
//! four independent ones keep the CPU busy (as zstd's Huffman does).
//!
//! Decoding checks that the lengths form a complete prefix code (or a single
//! symbol of length 1, or none for an empty plane) and that the codes end inside the stream; the unit's
//! checksums catch any other damage.

/// Longest code: a decode looks up [`MAX_LEN`] bits in one table.
pub const MAX_LEN: u32 = 12;
/// Bytes of the code-length table.
pub const LENGTHS_LEN: usize = 128;
/// Streams of a plane.
pub const STREAMS: usize = 4;
/// Bytes before the first stream: the lengths, then 3 stream lengths.
pub const HEADER_LEN: usize = LENGTHS_LEN + 8 * (STREAMS - 1);

/// Code lengths for the byte counts `hist` (0 for absent symbols), at most
/// [`MAX_LEN`] bits: Huffman's, with the counts halved (kept ≥ 1) until
/// the longest fits.
pub fn code_lengths(hist: &[u64; 256]) -> [u8; 256] {
    let mut counts = *hist;
    loop {
        let lens = unlimited_lengths(&counts);
        if lens.iter().all(|&l| u32::from(l) <= MAX_LEN) {
            return lens;
        }
        for c in counts.iter_mut().filter(|c| **c > 0) {
            *c = (*c / 2).max(1);
        }
    }
}

fn unlimited_lengths(counts: &[u64; 256]) -> [u8; 256] {
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;
    let mut lens = [0u8; 256];
    // Nodes: 0..256 leaves, then internal nodes; parent links give depths.
    let mut parent: Vec<usize> = Vec::with_capacity(512);
    parent.resize(256, usize::MAX);
    let mut heap: BinaryHeap<Reverse<(u64, usize)>> = counts.iter().enumerate().filter(|(_, &c)| c > 0).map(|(s, &c)| Reverse((c, s))).collect();
    match heap.len() {
        0 => return lens,
        1 => {
            if let Some(Reverse((_, s))) = heap.pop() {
                lens[s] = 1;
            }
            return lens;
        }
        _ => {}
    }
    while heap.len() > 1 {
        let (Some(Reverse((ca, a))), Some(Reverse((cb, b)))) = (heap.pop(), heap.pop()) else { break };
        let id = parent.len();
        parent.push(usize::MAX);
        parent[a] = id;
        parent[b] = id;
        heap.push(Reverse((ca + cb, id)));
    }
    for s in 0..256 {
        if counts[s] == 0 {
            continue;
        }
        let (mut d, mut n) = (0u8, s);
        while parent[n] != usize::MAX {
            n = parent[n];
            d = d.saturating_add(1);
        }
        lens[s] = d;
    }
    lens
}

/// The canonical codes of `lens` (bit-reversed, for least-significant-bit-
/// first output). None when the lengths are not a usable prefix code.
fn canonical_codes(lens: &[u8; 256]) -> Option<[u16; 256]> {
    let mut count = [0u32; MAX_LEN as usize + 1];
    for &l in lens {
        if u32::from(l) > MAX_LEN {
            return None;
        }
        count[l as usize] += 1;
    }
    count[0] = 0;
    let used: u32 = count.iter().sum();
    // Kraft: a complete code, one symbol of length 1, or none (an empty plane).
    let kraft: u64 = (1..=MAX_LEN as usize).map(|l| u64::from(count[l]) << (MAX_LEN as usize - l)).sum();
    if !(kraft == 1 << MAX_LEN || (used == 1 && count[1] == 1) || used == 0) {
        return None;
    }
    let mut next = [0u32; MAX_LEN as usize + 2];
    let mut code = 0u32;
    for l in 1..=MAX_LEN as usize {
        code = (code + count[l - 1]) << 1;
        next[l] = code;
    }
    let mut codes = [0u16; 256];
    for s in 0..256 {
        let l = lens[s] as u32;
        if l == 0 {
            continue;
        }
        let c = next[l as usize];
        next[l as usize] += 1;
        codes[s] = (c.reverse_bits() >> (32 - l)) as u16;
    }
    Some(codes)
}

/// The byte counts of `plane`.
pub fn histogram(plane: &[u8]) -> [u64; 256] {
    // Four tables: consecutive equal bytes do not wait on one counter.
    let mut h = [[0u64; 256]; 4];
    let mut it = plane.chunks_exact(4);
    for c in &mut it {
        h[0][c[0] as usize] += 1;
        h[1][c[1] as usize] += 1;
        h[2][c[2] as usize] += 1;
        h[3][c[3] as usize] += 1;
    }
    for &b in it.remainder() {
        h[0][b as usize] += 1;
    }
    let mut out = [0u64; 256];
    for (s, o) in out.iter_mut().enumerate() {
        *o = h[0][s] + h[1][s] + h[2][s] + h[3][s];
    }
    out
}

/// The size of the Huffman plane of a plane with byte counts `hist`
/// (within the padding of its streams: at most 3 bytes more).
pub fn encoded_len(hist: &[u64; 256], lens: &[u8; 256]) -> usize {
    let bits: u64 = hist.iter().zip(lens).map(|(&c, &l)| c * u64::from(l)).sum();
    HEADER_LEN + bits.div_ceil(8) as usize
}

/// The symbols of stream `k` of a plane of `n` symbols.
fn stream_range(n: usize, k: usize) -> std::ops::Range<usize> {
    let q = n.div_ceil(STREAMS);
    (k * q).min(n)..((k + 1) * q).min(n)
}

/// Encodes `plane` with the code lengths `lens` (from [`code_lengths`] of
/// its histogram). None when `lens` lacks a symbol of `plane`.
pub fn encode(plane: &[u8], lens: &[u8; 256]) -> Option<Vec<u8>> {
    let codes = canonical_codes(lens)?;
    let mut out = Vec::with_capacity(HEADER_LEN + plane.len() / 2 + 8);
    for i in 0..LENGTHS_LEN {
        out.push(lens[2 * i] | (lens[2 * i + 1] << 4));
    }
    out.resize(HEADER_LEN, 0);
    for k in 0..STREAMS {
        let start = out.len();
        let (mut acc, mut nbits) = (0u64, 0u32);
        for &b in &plane[stream_range(plane.len(), k)] {
            let l = u32::from(lens[b as usize]);
            if l == 0 {
                return None;
            }
            acc |= u64::from(codes[b as usize]) << nbits;
            nbits += l;
            if nbits >= 32 {
                out.extend_from_slice(&(acc as u32).to_le_bytes());
                acc >>= 32;
                nbits -= 32;
            }
        }
        while nbits > 0 {
            out.push(acc as u8);
            acc >>= 8;
            nbits = nbits.saturating_sub(8);
        }
        if k < STREAMS - 1 {
            let at = LENGTHS_LEN + 8 * k;
            let len = (out.len() - start) as u64;
            out[at..at + 8].copy_from_slice(&len.to_le_bytes());
        }
    }
    Some(out)
}

/// Decodes the Huffman plane `stored` into `out` (cleared first), `n` symbols.
pub fn decode(stored: &[u8], n: usize, out: &mut Vec<u8>) -> Result<(), String> {
    if stored.len() < LENGTHS_LEN {
        return Err(format!("{} bytes cannot hold the code lengths", stored.len()));
    }
    let mut lens = [0u8; 256];
    for i in 0..LENGTHS_LEN {
        lens[2 * i] = stored[i] & 0x0f;
        lens[2 * i + 1] = stored[i] >> 4;
    }
    let codes = canonical_codes(&lens).ok_or("the code lengths are not a prefix code")?;
    // table[bits] = symbol | length << 8, for every MAX_LEN-bit string whose
    // low `length` bits are the symbol's code.
    let mut table = vec![0u16; 1 << MAX_LEN];
    for s in 0..256 {
        let l = u32::from(lens[s]);
        if l == 0 {
            continue;
        }
        let mut i = usize::from(codes[s]);
        while i < table.len() {
            table[i] = s as u16 | (l as u16) << 8;
            i += 1 << l;
        }
    }
    if stored.len() < HEADER_LEN {
        return Err(format!("{} bytes cannot hold the stream lengths", stored.len()));
    }
    // The streams' bytes.
    let mut streams: [&[u8]; STREAMS] = [&[]; STREAMS];
    let mut at = HEADER_LEN;
    for (k, st) in streams.iter_mut().enumerate() {
        let len = if k < STREAMS - 1 {
            let mut l = [0u8; 8];
            l.copy_from_slice(&stored[LENGTHS_LEN + 8 * k..LENGTHS_LEN + 8 * k + 8]);
            u64::from_le_bytes(l)
        } else {
            (stored.len() - at) as u64
        };
        let end = (at as u64).checked_add(len).filter(|&e| e <= stored.len() as u64);
        let Some(end) = end.map(|e| e as usize) else {
            return Err(format!("stream {k} of {len} bytes runs past the plane ({} bytes)", stored.len()));
        };
        *st = &stored[at..end];
        at = end;
    }
    out.clear();
    out.resize(n, 0);
    let mut readers: [Reader; STREAMS] = std::array::from_fn(|k| Reader::new(streams[k], stream_range(n, k)));
    // Fast: the four streams in turn, each refilled then 4 symbols
    // unchecked, while every one has 8 bytes to read and 4 symbols due.
    while readers.iter().all(Reader::fast_ok) {
        for r in readers.iter_mut() {
            r.fast4(&table, out);
        }
    }
    for (k, r) in readers.iter_mut().enumerate() {
        r.finish(&table, out).map_err(|i| format!("stream {k} runs past its end ({} bytes) at symbol {i}", r.bits.len()))?;
    }
    Ok(())
}

/// One stream's bit reader ([`decode`]).
struct Reader<'a> {
    bits: &'a [u8],
    /// Next byte to read.
    at: usize,
    acc: u64,
    /// Bits of `acc` counted as read (it may hold more: see [`Self::fast4`]).
    nbits: u32,
    /// Next symbol, and the end of this stream's symbols.
    i: usize,
    end: usize,
}

impl<'a> Reader<'a> {
    fn new(bits: &'a [u8], symbols: std::ops::Range<usize>) -> Self {
        Reader { bits, at: 0, acc: 0, nbits: 0, i: symbols.start, end: symbols.end }
    }

    fn fast_ok(&self) -> bool {
        self.at + 8 <= self.bits.len() && self.i + 4 <= self.end
    }

    /// Refills to at least 56 bits and decodes 4 symbols (4 x MAX_LEN <=
    /// 56), unchecked: entries of a complete code all have a length, and a
    /// damaged stream decodes to other bytes, which the unit's checksums
    /// catch. The refill reads 8 bytes and counts the whole ones it took;
    /// the bits beyond are the stream's own next bits, read again later.
    #[inline(always)]
    fn fast4(&mut self, table: &[u16], out: &mut [u8]) {
        let mut w = [0u8; 8];
        w.copy_from_slice(&self.bits[self.at..self.at + 8]);
        self.acc |= u64::from_le_bytes(w) << self.nbits;
        self.at += ((63 - self.nbits) >> 3) as usize;
        self.nbits |= 56;
        let mask = (1u64 << MAX_LEN) - 1;
        for o in &mut out[self.i..self.i + 4] {
            let e = table[(self.acc & mask) as usize];
            *o = e as u8;
            let l = u32::from(e >> 8);
            self.acc >>= l;
            self.nbits -= l.min(self.nbits);
        }
        self.i += 4;
    }

    /// Decodes the rest of the stream, every step checked. Err: the
    /// symbol at which the codes ran past the stream's end.
    fn finish(&mut self, table: &[u16], out: &mut [u8]) -> Result<(), usize> {
        let mask = (1u64 << MAX_LEN) - 1;
        // Drop the bits read beyond those counted.
        self.acc &= if self.nbits >= 64 { u64::MAX } else { (1u64 << self.nbits) - 1 };
        while self.i < self.end {
            while self.nbits <= 56 && self.at < self.bits.len() {
                self.acc |= u64::from(self.bits[self.at]) << self.nbits;
                self.at += 1;
                self.nbits += 8;
            }
            let e = table[(self.acc & mask) as usize];
            let l = u32::from(e >> 8);
            if l == 0 || l > self.nbits {
                return Err(self.i);
            }
            out[self.i] = e as u8;
            self.acc >>= l;
            self.nbits -= l;
            self.i += 1;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(plane: &[u8]) -> usize {
        let h = histogram(plane);
        let lens = code_lengths(&h);
        let enc = encode(plane, &lens).expect("every symbol has a code");
        let est = encoded_len(&h, &lens);
        assert!((est..=est + STREAMS - 1).contains(&enc.len()), "{} vs {est}", enc.len());
        let mut out = Vec::new();
        decode(&enc, plane.len(), &mut out).unwrap();
        assert_eq!(out, plane);
        enc.len()
    }

    fn lcg(seed: &mut u64) -> u64 {
        *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        *seed >> 33
    }

    #[test]
    fn skewed_uniform_single_and_empty_planes_round_trip() {
        let mut s = 7u64;
        // Geometric-like: a few common symbols, a long tail (lengths beyond MAX_LEN before limiting).
        let skew: Vec<u8> = (0..200_000).map(|_| (lcg(&mut s) as u32).trailing_zeros().min(40) as u8 * 5).collect();
        let n = round_trip(&skew);
        assert!(n < skew.len() / 3, "{n}");
        let uniform: Vec<u8> = (0..70_001).map(|_| lcg(&mut s) as u8).collect();
        round_trip(&uniform);
        round_trip(&[42u8; 1000]);
        round_trip(&[]);
        round_trip(&[1, 2]);
        for len in 0..40 {
            let v: Vec<u8> = (0..len).map(|_| (lcg(&mut s) % 3) as u8).collect();
            round_trip(&v);
        }
    }

    #[test]
    fn lengths_stay_within_the_table() {
        // Fibonacci counts make the deepest unlimited Huffman tree.
        let mut h = [0u64; 256];
        let (mut a, mut b) = (1u64, 1u64);
        for c in h.iter_mut().take(40) {
            *c = a;
            (a, b) = (b, a + b);
        }
        let lens = code_lengths(&h);
        assert!(lens.iter().all(|&l| u32::from(l) <= MAX_LEN));
        assert!(lens.iter().take(40).all(|&l| l > 0));
        assert!(canonical_codes(&lens).is_some());
    }

    #[test]
    fn damaged_planes_are_errors_not_panics() {
        let mut s = 3u64;
        let plane: Vec<u8> = (0..5000).map(|_| (lcg(&mut s) % 17) as u8).collect();
        let enc = encode(&plane, &code_lengths(&histogram(&plane))).unwrap();
        let mut out = Vec::new();
        // Truncated: runs past the end.
        assert!(decode(&enc[..enc.len() - 40], plane.len(), &mut out).is_err());
        assert!(decode(&enc[..100], plane.len(), &mut out).is_err());
        // Lengths that are not a prefix code.
        let mut bad = enc.clone();
        bad[0] = 0x11;
        bad[1] = 0x11;
        assert!(decode(&bad, plane.len(), &mut out).is_err());
        // Every single-byte change: an error or other bytes, never a panic.
        for i in (0..enc.len()).step_by(7) {
            let mut b = enc.clone();
            b[i] ^= 0x5a;
            let _ = decode(&b, plane.len(), &mut out);
        }
    }
}
