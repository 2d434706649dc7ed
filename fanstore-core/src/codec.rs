//! Payload codecs: raw, lz4 (frame format) and zstd.
//!
//! A payload that does not shrink is stored raw: [`compress`] returns `None`
//! as soon as the compressed output would be at least as large as the input.

use std::io::{self, Read, Write};

crate::format::coded_enum! {
    /// How a payload is stored. The numeric value is written to disk.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub enum Codec: u8, from_u8 {
        None = 0 => "none",
        Lz4 = 1 => "lz4",
        Zstd = 2 => "zstd",
    }
}

/// A codec choice for packing: the codec and, for zstd, its level.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Compression {
    pub codec: Codec,
    pub level: i32,
}

impl Compression {
    pub const NONE: Compression = Compression { codec: Codec::None, level: 0 };

    /// Parses `none`, `lz4`, `zstd` or `zstd:LEVEL` (1..=22, default 3).
    pub fn parse(s: &str) -> Result<Compression, String> {
        match s {
            "none" => Ok(Compression::NONE),
            "lz4" => Ok(Compression { codec: Codec::Lz4, level: 0 }),
            "zstd" => Ok(Compression { codec: Codec::Zstd, level: 3 }),
            _ => {
                let lvl = s
                    .strip_prefix("zstd:")
                    .ok_or_else(|| format!("unknown compression '{s}' (expected none, lz4, zstd or zstd:LEVEL)"))?;
                let level: i32 = lvl.parse().map_err(|_| format!("bad zstd level '{lvl}'"))?;
                if !(1..=22).contains(&level) {
                    return Err(format!("zstd level {level} out of range 1..=22"));
                }
                Ok(Compression { codec: Codec::Zstd, level })
            }
        }
    }
}

/// A writer that fails once `limit` bytes would be reached, and says so in `overflow`.
struct Bounded {
    buf: Vec<u8>,
    limit: u64,
    overflow: std::rc::Rc<std::cell::Cell<bool>>,
}

impl Write for Bounded {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        if self.buf.len() as u64 + data.len() as u64 >= self.limit {
            self.overflow.set(true);
            // A payload-free error: lz4_flex re-wraps io errors and must not see a custom one.
            return Err(io::ErrorKind::WriteZero.into());
        }
        self.buf.extend_from_slice(data);
        Ok(data.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Compresses everything `input` yields (`raw_len` bytes expected).
/// Returns `Ok(None)` when the result would not be smaller than `raw_len`.
pub fn compress(c: Compression, mut input: impl Read, raw_len: u64) -> io::Result<Option<Vec<u8>>> {
    let overflow = std::rc::Rc::new(std::cell::Cell::new(false));
    let out = Bounded {
        buf: Vec::with_capacity((raw_len / 2).min(1 << 26) as usize),
        limit: raw_len,
        overflow: overflow.clone(),
    };
    let res = match c.codec {
        Codec::None => return Ok(None),
        Codec::Lz4 => {
            let mut enc = lz4_flex::frame::FrameEncoder::new(out);
            io::copy(&mut input, &mut enc).and_then(|_| enc.finish().map_err(io::Error::from))
        }
        Codec::Zstd => {
            let mut enc = zstd::stream::Encoder::new(out, c.level)?;
            io::copy(&mut input, &mut enc).and_then(|_| enc.finish())
        }
    };
    match res {
        _ if overflow.get() => Ok(None),
        Ok(b) => Ok(Some(b.buf)),
        Err(e) => Err(e),
    }
}

/// Inputs up to this size are compressed by [`Compressor`] with a reused
/// encoder; a fresh lz4 frame encoder picks this block size for them too.
pub const REUSE_MAX: usize = 64 << 10;

/// Compresses many in-memory inputs one after the other (one per thread),
/// with the same result as [`compress`], byte for byte.
///
/// A fresh lz4 frame encoder allocates about 270 KB of buffers and a 16 KB
/// table; for a 100-byte file that is most of the work, and glibc maps and
/// unmaps (or trims) the buffers on every file. For lz4 inputs of at most
/// [`REUSE_MAX`] bytes one encoder is kept and reused: lz4_flex resets its
/// state at the start of each frame, and its block size, fixed by the first
/// frame, is 64 KiB for every such input, as a fresh encoder would choose.
/// Other inputs go to [`compress`].
#[derive(Default)]
pub struct Compressor {
    lz4: Option<lz4_flex::frame::FrameEncoder<Vec<u8>>>,
}

impl Compressor {
    pub fn new() -> Compressor {
        Compressor::default()
    }

    /// `compress(c, input, input.len())`.
    pub fn compress(&mut self, c: Compression, input: &[u8]) -> io::Result<Option<Vec<u8>>> {
        let mut out = Vec::new();
        Ok(self.compress_into(c, input, &mut out)?.then_some(out))
    }

    /// Appends `compress(c, input, input.len())` to `out` and returns true
    /// if that is `Some`; leaves `out` as it was and returns false if not.
    pub fn compress_into(&mut self, c: Compression, input: &[u8], out: &mut Vec<u8>) -> io::Result<bool> {
        if c.codec != Codec::Lz4 || input.is_empty() || input.len() > REUSE_MAX {
            return Ok(match compress(c, input, input.len() as u64)? {
                Some(z) => {
                    out.extend_from_slice(&z);
                    true
                }
                None => false,
            });
        }
        let enc = self.lz4.get_or_insert_with(|| lz4_flex::frame::FrameEncoder::new(Vec::new()));
        enc.get_mut().clear();
        let mut reader = input;
        let res = io::copy(&mut reader, enc).and_then(|_| enc.try_finish().map_err(io::Error::from));
        if let Err(e) = res {
            self.lz4 = None; // its state is unknown: start afresh next time
            return Err(e);
        }
        let z = enc.get_ref();
        if z.len() >= input.len() {
            return Ok(false);
        }
        out.extend_from_slice(z);
        Ok(true)
    }
}

/// Decompresses `stored` into `out`, which must receive exactly `raw_len` bytes.
pub fn decompress_to(codec: Codec, stored: &[u8], raw_len: u64, out: &mut impl Write) -> io::Result<()> {
    let n = match codec {
        Codec::None => {
            out.write_all(stored)?;
            stored.len() as u64
        }
        Codec::Lz4 => io::copy(&mut lz4_flex::frame::FrameDecoder::new(stored), out)?,
        Codec::Zstd => io::copy(&mut zstd::stream::Decoder::with_buffer(stored)?, out)?,
    };
    if n != raw_len {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{} payload decoded to {n} bytes, expected {raw_len}", codec.name()),
        ));
    }
    Ok(())
}

/// Decompresses `stored` into `out`, which must be exactly the decoded
/// length, allocating nothing per call: an lz4 frame is parsed here and each
/// block decoded straight into `out` (a linked block with the output before
/// it as its dictionary); zstd decodes with a context kept per thread. This
/// is the path of every read: a fresh decoder's buffers, freed and trimmed
/// off the heap after each file, cost fresh pages on every call, which on
/// some machines costs more than the decoding itself. Malformed input is an
/// error, never a panic.
pub fn decompress_into(codec: Codec, stored: &[u8], out: &mut [u8]) -> io::Result<()> {
    match codec {
        Codec::None => {
            if stored.len() != out.len() {
                return Err(invalid(format!("raw payload of {} bytes, expected {}", stored.len(), out.len())));
            }
            out.copy_from_slice(stored);
            Ok(())
        }
        Codec::Lz4 => lz4_frames_into(stored, out),
        Codec::Zstd => ZSTD_DCTX.with(|cell| {
            let mut slot = cell.try_borrow_mut().map_err(|_| invalid("zstd context in use".into()))?;
            if slot.is_none() {
                *slot = Some(zstd::bulk::Decompressor::new()?);
            }
            let Some(d) = slot.as_mut() else { return Err(invalid("no zstd context".into())) };
            let n = d.decompress_to_buffer(stored, out)?;
            if n != out.len() {
                return Err(invalid(format!("zstd payload decoded to {n} bytes, expected {}", out.len())));
            }
            Ok(())
        }),
    }
}

thread_local! {
    static ZSTD_DCTX: std::cell::RefCell<Option<zstd::bulk::Decompressor<'static>>> = const { std::cell::RefCell::new(None) };
}

fn invalid(m: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, m)
}

const LZ4_MAGIC: u32 = 0x184D_2204;
const LZ4_FLG_VERSION: u8 = 0b1100_0000;
const LZ4_FLG_INDEPENDENT: u8 = 0b0010_0000;
const LZ4_FLG_BLOCK_CHECKSUM: u8 = 0b0001_0000;
const LZ4_FLG_CONTENT_SIZE: u8 = 0b0000_1000;
const LZ4_FLG_CONTENT_CHECKSUM: u8 = 0b0000_0100;
const LZ4_FLG_DICT_ID: u8 = 0b0000_0001;
const LZ4_UNCOMPRESSED_BLOCK: u32 = 0x8000_0000;
/// The most history an lz4 block may refer to.
const LZ4_WINDOW: usize = 64 << 10;

/// Decodes a sequence of lz4 frames (magic, FLG, BD, optional content size
/// and dictionary id, header checksum; blocks of `u32` size with the high
/// bit meaning "stored"; an end mark; optional checksums) straight into
/// `out`. Checksums inside the frame are not checked: the payload's own
/// checksum is checked before it is decoded, and the decoded length must be
/// `out.len()` exactly.
fn lz4_frames_into(stored: &[u8], out: &mut [u8]) -> io::Result<()> {
    let bad = |m: &str, at: usize| invalid(format!("lz4 frame: {m} at byte {at}"));
    let u32_at = |at: usize| -> io::Result<u32> {
        let b = stored.get(at..at + 4).ok_or_else(|| bad("truncated", at))?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    let (mut at, mut pos) = (0usize, 0usize);
    while at < stored.len() {
        if u32_at(at)? != LZ4_MAGIC {
            return Err(bad("bad magic", at));
        }
        let flg = *stored.get(at + 4).ok_or_else(|| bad("truncated", at + 4))?;
        if flg & LZ4_FLG_VERSION != 0b0100_0000 || flg & LZ4_FLG_DICT_ID != 0 {
            return Err(bad("unsupported version or dictionary", at + 4));
        }
        let independent = flg & LZ4_FLG_INDEPENDENT != 0;
        let block_sum = if flg & LZ4_FLG_BLOCK_CHECKSUM != 0 { 4 } else { 0 };
        // magic, FLG, BD, [content size], header checksum
        at += 4 + 2 + if flg & LZ4_FLG_CONTENT_SIZE != 0 { 8 } else { 0 } + 1;
        let frame_start = pos;
        loop {
            let size = u32_at(at)?;
            at += 4;
            if size == 0 {
                break;
            }
            let len = (size & !LZ4_UNCOMPRESSED_BLOCK) as usize;
            let data = stored.get(at..at + len).ok_or_else(|| bad("block past the end", at))?;
            at += len + block_sum;
            let n = if size & LZ4_UNCOMPRESSED_BLOCK != 0 {
                let dst = out.get_mut(pos..pos + len).ok_or_else(|| bad("more bytes than expected", at))?;
                dst.copy_from_slice(data);
                len
            } else if independent || pos == frame_start {
                lz4_flex::block::decompress_into(data, &mut out[pos..]).map_err(|e| bad(&e.to_string(), at))?
            } else {
                let (before, rest) = out.split_at_mut(pos);
                let dict = &before[before.len().saturating_sub(LZ4_WINDOW).max(frame_start)..];
                lz4_flex::block::decompress_into_with_dict(data, rest, dict).map_err(|e| bad(&e.to_string(), at))?
            };
            pos += n;
        }
        if flg & LZ4_FLG_CONTENT_CHECKSUM != 0 {
            at += 4;
        }
    }
    if at != stored.len() || pos != out.len() {
        return Err(invalid(format!("lz4 payload decoded to {pos} bytes, expected {}", out.len())));
    }
    Ok(())
}

/// Decompresses `stored` into a new vector of exactly `raw_len` bytes.
pub fn decompress(codec: Codec, stored: &[u8], raw_len: u64) -> io::Result<Vec<u8>> {
    let mut v = Vec::with_capacity(raw_len as usize);
    decompress_to(codec, stored, raw_len, &mut v)?;
    Ok(v)
}

#[cfg(test)]
pub(crate) mod tests {
    /// A deterministic stream of test bytes' sources (xorshift64).
    pub(crate) fn xorshift(seed: u64) -> impl FnMut() -> u64 {
        let mut x = seed;
        move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        }
    }

    #[test]
    fn decompress_into_matches_the_stream_decoders() {
        use super::*;
        let mut rnd = xorshift(11);
        for &n in &[0usize, 1, 100, 65535, 65536, 65537, 200_000, 1 << 20] {
            let data: Vec<u8> = (0..n).map(|k| if k % 3000 < 1500 { (k / 7) as u8 } else { rnd() as u8 }).collect();
            let mut frames = Vec::new();
            // What prep writes, and the frame options a foreign writer might use.
            if let Some(z) = compress(Compression { codec: Codec::Lz4, level: 0 }, &data[..], n as u64).unwrap() {
                frames.push(z);
            }
            for (mode, size, sums) in [
                (lz4_flex::frame::BlockMode::Linked, lz4_flex::frame::BlockSize::Max64KB, true),
                (lz4_flex::frame::BlockMode::Independent, lz4_flex::frame::BlockSize::Max256KB, false),
            ] {
                let info = lz4_flex::frame::FrameInfo::new()
                    .block_mode(mode)
                    .block_size(size)
                    .block_checksums(sums)
                    .content_checksum(sums)
                    .content_size(sums.then_some(n as u64));
                let mut enc = lz4_flex::frame::FrameEncoder::with_frame_info(info, Vec::new());
                for c in data.chunks(50_000) {
                    enc.write_all(c).unwrap();
                }
                frames.push(enc.finish().unwrap());
            }
            for z in &frames {
                let mut out = vec![0u8; n];
                decompress_into(Codec::Lz4, z, &mut out).unwrap();
                assert_eq!(out, data, "{n} bytes");
                assert_eq!(decompress(Codec::Lz4, z, n as u64).unwrap(), data);
                // A wrong length, a cut, or flipped bytes: an error, never a panic.
                assert!(decompress_into(Codec::Lz4, z, &mut vec![0u8; n + 1]).is_err());
                if n > 0 {
                    assert!(decompress_into(Codec::Lz4, z, &mut vec![0u8; n - 1]).is_err());
                }
                assert!(decompress_into(Codec::Lz4, &z[..z.len() - 1], &mut out).is_err());
                for i in (0..z.len()).step_by((z.len() / 40).max(1)) {
                    let mut bad = z.clone();
                    bad[i] ^= 0x5a;
                    let _ = decompress_into(Codec::Lz4, &bad, &mut out);
                }
            }
            if let Some(z) = compress(Compression { codec: Codec::Zstd, level: 3 }, &data[..], n as u64).unwrap() {
                let mut out = vec![0u8; n];
                decompress_into(Codec::Zstd, &z, &mut out).unwrap();
                assert_eq!(out, data);
                assert!(decompress_into(Codec::Zstd, &z, &mut vec![0u8; n + 1]).is_err());
                assert!(decompress_into(Codec::Zstd, &z[..z.len() / 2], &mut out).is_err());
            }
            let mut out = vec![0u8; n];
            decompress_into(Codec::None, &data, &mut out).unwrap();
            assert_eq!(out, data);
        }
    }

    #[test]
    fn reused_compressor_gives_the_bytes_of_a_fresh_encoder() {
        let mut rnd = xorshift(7);
        let mut reused = Compressor::new();
        let lz4 = Compression { codec: Codec::Lz4, level: 0 };
        let sizes = [1usize, 2, 15, 16, 100, 101, 4095, 4096, 8191, 8192, 8193, 65535, 65536, 65537, 70000, 200_000, 100];
        for (i, &n) in sizes.iter().enumerate() {
            for compressible in [false, true] {
                let data: Vec<u8> = (0..n)
                    .map(|k| if compressible { b"label 0123 sample\n"[(k + i) % 18] } else { rnd() as u8 })
                    .collect();
                let fresh = compress(lz4, &data[..], n as u64).unwrap();
                let again = reused.compress(lz4, &data).unwrap();
                assert_eq!(again, fresh, "{n} bytes, compressible {compressible}");
                if n >= 4096 {
                    assert_eq!(fresh.is_some(), compressible, "{n} bytes");
                }
                if let Some(z) = again {
                    assert_eq!(decompress(Codec::Lz4, &z, n as u64).unwrap(), data);
                }
            }
        }
        let zstd = Compression { codec: Codec::Zstd, level: 3 };
        let text = b"abcabcabcabcabcabcabcabcabcabc".repeat(10);
        assert_eq!(reused.compress(zstd, &text).unwrap(), compress(zstd, &text[..], text.len() as u64).unwrap());
    }
    use super::*;

    #[test]
    fn round_trip_each_codec() {
        let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        for c in ["lz4", "zstd", "zstd:19"] {
            let c = Compression::parse(c).unwrap();
            let z = compress(c, &data[..], data.len() as u64).unwrap().expect("shrinks");
            assert!(z.len() < data.len());
            assert_eq!(decompress(c.codec, &z, data.len() as u64).unwrap(), data);
        }
    }

    #[test]
    fn incompressible_is_stored_raw() {
        let mut rnd = xorshift(0x9e3779b97f4a7c15);
        let data: Vec<u8> = (0..65536).map(|_| rnd() as u8).collect();
        for c in ["lz4", "zstd"] {
            let c = Compression::parse(c).unwrap();
            assert!(compress(c, &data[..], data.len() as u64).unwrap().is_none());
        }
        assert!(compress(Compression::parse("lz4").unwrap(), &b""[..], 0).unwrap().is_none());
    }

    #[test]
    fn wrong_length_is_refused() {
        let data = vec![7u8; 10_000];
        let c = Compression::parse("zstd").unwrap();
        let z = compress(c, &data[..], 10_000).unwrap().unwrap();
        assert!(decompress(Codec::Zstd, &z, 9_999).is_err());
        assert!(decompress(Codec::Zstd, &z[..z.len() / 2], 10_000).is_err());
    }

    #[test]
    fn parse_rejects_bad_levels() {
        assert!(Compression::parse("zstd:0").is_err());
        assert!(Compression::parse("zstd:x").is_err());
        assert!(Compression::parse("gzip").is_err());
        assert_eq!(Compression::parse("zstd:7").unwrap().level, 7);
    }
}
