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
}
