//! Where file bytes are read to: buffers whose first byte is 64-byte aligned.
//!
//! On AMD Zen CPUs the kernel copies between the page cache and user memory
//! with `rep movsb`, which runs several times slower when the destination
//! lies 1 to 31 bytes past the source's offset within a page. A file read
//! from offset 0 into a buffer that starts 16 bytes past a page boundary
//! (what malloc returns for 128 KiB and more, so any large `Vec`) takes that
//! slow path for every byte. Measured on a 2-vCPU AMD EPYC guest, Linux 6.18:
//!
//! ```text
//! pread of 128 KiB from a memfd, destination at page offset:
//!     0: 10 µs    1..31: 55-87 µs    32, 40, 63, 64, 4064: 10-11 µs
//! glibc 2.36 memcpy of 128 KiB, destination - source = 8..24: 56-63 µs, 0 or 32+: 3-4 µs
//! fanstore-prep pack, 256 files of 2 MiB, 2 threads: 0.62-0.67 s (system 0.51-0.60 s)
//!     with buffers from malloc, 0.51-0.54 s (system 0.27-0.35 s) read aligned
//! daemon load of the 512 MiB packed from them: 0.30-0.37 s with a BufReader,
//!     0.25-0.28 s with an AlignedReader
//! ```
//!
//! A reader that keeps the destination 64-byte aligned never meets the slow
//! distances: the file's byte `k` sits at page offset `k % 4096` and lands at
//! `start + k` with `start % 64 == 0`.
//!
//! ```
//! use fanstore_core::align::{pad_to, AlignedBuf, READ_ALIGN};
//! let mut v: Vec<u8> = Vec::with_capacity(1000 + READ_ALIGN);
//! let pad = pad_to(v.as_ptr());
//! v.resize(pad, 0); // bytes appended from here on start 64-byte aligned
//! assert_eq!((v.as_ptr() as usize + v.len()) % READ_ALIGN, 0);
//! let b = AlignedBuf::zeroed(1 << 20);
//! assert_eq!(b.as_ptr() as usize % READ_ALIGN, 0);
//! assert_eq!(b.len(), 1 << 20);
//! ```

/// The alignment reads are given.
pub const READ_ALIGN: usize = 64;

/// How many bytes past `ptr` the next [`READ_ALIGN`] boundary is (0 if
/// `ptr` is on one).
pub fn pad_to(ptr: *const u8) -> usize {
    (READ_ALIGN - ptr as usize % READ_ALIGN) % READ_ALIGN
}

/// A zero-filled byte buffer of a fixed length whose first byte is
/// [`READ_ALIGN`]-aligned.
pub struct AlignedBuf {
    backing: Vec<u8>,
    start: usize,
    len: usize,
}

impl AlignedBuf {
    /// A buffer of `len` zero bytes.
    pub fn zeroed(len: usize) -> AlignedBuf {
        let mut backing = vec![0u8; len + READ_ALIGN];
        let start = pad_to(backing.as_mut_ptr());
        AlignedBuf { backing, start, len }
    }
}

impl std::ops::Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.backing[self.start..self.start + self.len]
    }
}

impl std::ops::DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.backing[self.start..self.start + self.len]
    }
}

/// A buffered reader (as `std::io::BufReader`) whose reads into its buffer
/// keep the file's offsets and the buffer's addresses equal modulo
/// [`READ_ALIGN`], so that the kernel's copies never meet the slow
/// distances. Every read goes through the buffer, even one larger than it:
/// a direct read into the caller's memory (16 bytes past a page, if it came
/// from malloc) costs more than the extra copy out of a warm buffer.
pub struct AlignedReader<R> {
    inner: R,
    buf: AlignedBuf,
    /// `buf[begin..end]` holds the bytes read by the last fill, which
    /// started at an inner position equal to `begin` modulo [`READ_ALIGN`];
    /// `at` is the reader's position among them.
    begin: usize,
    at: usize,
    end: usize,
}

impl<R: std::io::Read + std::io::Seek> AlignedReader<R> {
    /// A reader of `inner`, whose position is `start`, buffering up to
    /// `capacity` bytes.
    pub fn new(inner: R, start: u64, capacity: usize) -> AlignedReader<R> {
        let phase = (start % READ_ALIGN as u64) as usize;
        let buf = AlignedBuf::zeroed(capacity.max(READ_ALIGN) + READ_ALIGN);
        AlignedReader { inner, buf, begin: phase, at: phase, end: phase }
    }

    /// Moves the position by `offset` bytes, keeping the buffer when the
    /// new position is inside it.
    pub fn seek_relative(&mut self, offset: i64) -> std::io::Result<()> {
        let (back, ahead) = ((self.at - self.begin) as i64, (self.end - self.at) as i64);
        if (-back..=ahead).contains(&offset) {
            self.at = (self.at as i64 + offset) as usize;
            return Ok(());
        }
        let pos = self.inner.seek(std::io::SeekFrom::Current(offset - ahead))?;
        let phase = (pos % READ_ALIGN as u64) as usize;
        (self.begin, self.at, self.end) = (phase, phase, phase);
        Ok(())
    }

    /// Reads the next bytes of `inner` into the buffer; 0 at its end.
    fn fill(&mut self) -> std::io::Result<usize> {
        // The inner position is the last fill's start + what it read: `end`.
        let phase = self.end % READ_ALIGN;
        let n = loop {
            match self.inner.read(&mut self.buf[phase..]) {
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                r => break r?,
            }
        };
        (self.begin, self.at, self.end) = (phase, phase, phase + n);
        Ok(n)
    }
}

impl<R: std::io::Read + std::io::Seek> std::io::Read for AlignedReader<R> {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        if out.is_empty() {
            return Ok(0);
        }
        if self.at == self.end && self.fill()? == 0 {
            return Ok(0);
        }
        let n = out.len().min(self.end - self.at);
        out[..n].copy_from_slice(&self.buf[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pad_reaches_the_next_boundary_and_no_further() {
        for addr in [0usize, 1, 15, 16, 63, 64, 65, 4096 + 16] {
            let p = pad_to(addr as *const u8);
            assert!(p < READ_ALIGN, "{addr}: pad {p}");
            assert_eq!((addr + p) % READ_ALIGN, 0, "{addr}");
        }
    }

    #[test]
    fn aligned_buffers_start_aligned_and_hold_their_length() {
        for len in [0usize, 1, 100, 128 << 10, (1 << 20) + 3] {
            let mut b = AlignedBuf::zeroed(len);
            assert_eq!(b.as_ptr() as usize % READ_ALIGN, 0, "len {len}");
            assert_eq!(b.len(), len);
            assert!(b.iter().all(|&x| x == 0));
            if len > 0 {
                b[len - 1] = 7;
                assert_eq!(b[len - 1], 7);
            }
        }
    }

    /// Random reads and seeks against the bytes themselves, from every
    /// starting phase; every fill must land where the file's offset says.
    #[test]
    fn aligned_reader_reads_and_seeks_as_the_bytes_are_laid_out() {
        use std::io::{Cursor, Read, Seek, SeekFrom};
        struct Checked(Cursor<Vec<u8>>);
        impl Read for Checked {
            fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
                let pos = self.0.position() as usize;
                assert_eq!(out.as_ptr() as usize % READ_ALIGN, pos % READ_ALIGN, "fill at offset {pos} misaligned");
                self.0.read(out)
            }
        }
        impl Seek for Checked {
            fn seek(&mut self, p: SeekFrom) -> std::io::Result<u64> {
                self.0.seek(p)
            }
        }
        let data: Vec<u8> = (0..50_000u32).map(|k| (k.wrapping_mul(2654435761) >> 13) as u8).collect();
        let mut x = 0x9e3779b97f4a7c15u64;
        let mut rnd = move |m: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % m
        };
        for start in [0u64, 1, 17, 63, 64, 1000] {
            let mut c = Cursor::new(data.clone());
            c.set_position(start);
            let mut r = AlignedReader::new(Checked(c), start, 1000);
            let mut pos = start as usize;
            for _ in 0..2000 {
                if rnd(4) == 0 {
                    let off = rnd(3000) as i64 - 1200;
                    let to = pos as i64 + off;
                    if to < 0 || to > data.len() as i64 {
                        continue;
                    }
                    r.seek_relative(off).unwrap();
                    pos = to as usize;
                } else {
                    let mut out = vec![0u8; rnd(2500) as usize];
                    let n = r.read(&mut out).unwrap();
                    let want = out.len().min(data.len() - pos);
                    assert!(n > 0 || want == 0, "short read at {pos}");
                    assert!(n <= want);
                    assert_eq!(&out[..n], &data[pos..pos + n], "bytes at {pos}");
                    pos += n;
                }
            }
        }
    }
}
