//! xxh3-64, the one checksum of every FanStore header and payload.

pub use xxhash_rust::xxh3::Xxh3 as StreamingChecksum;

/// xxh3-64 of `bytes`.
#[inline]
pub fn xxh3(bytes: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(bytes)
}
