//! The dataset id: a deterministic fingerprint of what is packed and how.
//!
//! It is xxh3 over a versioned tag, every entry in manifest order (path,
//! kind, size, permission bits, mtime, symlink target), the codec and level,
//! and the partition plan (each partition's flag and files). Access and
//! change times are left out: reading the input must not change the id.
//! The same tree packed with the same options gets the same id, whatever
//! the thread count; every partition header and the manifest carry it, so a
//! partition from another pack is detected.

use crate::assign::PlannedPartition;
use crate::walk::{EntryKind, TreeEntry};
use fanstore_core::checksum::StreamingChecksum;
use fanstore_core::codec::Compression;

/// The dataset id of `entries` packed with `compression` into `plan`.
pub fn dataset_id(entries: &[TreeEntry], compression: Compression, plan: &[PlannedPartition]) -> u64 {
    let mut h = StreamingChecksum::new();
    h.update(b"fanstore-dataset-id-v1\0");
    for e in entries {
        h.update(&(e.path.len() as u64).to_le_bytes());
        h.update(&e.path);
        let (kind, size, target): (u8, u64, &[u8]) = match &e.kind {
            EntryKind::Dir => (1, 0, b""),
            EntryKind::File { size } => (2, *size, b""),
            EntryKind::Symlink { target } => (3, target.len() as u64, target),
        };
        h.update(&[kind]);
        h.update(&size.to_le_bytes());
        h.update(&e.perm.to_le_bytes());
        h.update(&e.mtime_ns.to_le_bytes());
        h.update(target);
    }
    h.update(&[compression.codec as u8]);
    h.update(&compression.level.to_le_bytes());
    for p in plan {
        h.update(&[p.replicated as u8]);
        h.update(&(p.files.len() as u64).to_le_bytes());
        for &f in &p.files {
            h.update(&(f as u64).to_le_bytes());
        }
    }
    h.digest()
}
