//! Small datasets for tests, written with fanstore-core's writers directly
//! (the layout `fanstore-prep` produces: `manifest.fsm` + `part-NNNNNN.fsp`).

use fanstore_core::checksum::xxh3;
use fanstore_core::codec::{self, Codec, Compression};
use fanstore_core::manifest::{BuildEntry, BuildKind, ManifestBuilder, PartitionInfo};
use fanstore_core::partition::{self, PartitionWriter, FLAG_REPLICATED};
use std::collections::BTreeSet;
use std::path::Path;

/// One file of a test dataset.
pub struct TestFile {
    pub path: String,
    pub bytes: Vec<u8>,
}

/// Deterministic, partly compressible bytes.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|i| {
            if (i / 512) % 2 == 0 {
                (i % 7) as u8
            } else {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            }
        })
        .collect()
}

/// Writes a dataset of `files` into `dir` with `partitions` ordinary
/// partitions (file i goes to partition i mod P) plus, when
/// `replicate_prefix` is given, one replicated partition for the files under it.
pub fn build(dir: &Path, dataset_id: u64, files: &[TestFile], partitions: u32, comp: Compression, replicate_prefix: Option<&str>) {
    std::fs::create_dir_all(dir).expect("dataset dir");
    let nparts = partitions + u32::from(replicate_prefix.is_some());
    let mut writers: Vec<PartitionWriter> = (0..nparts)
        .map(|p| {
            let flags = if replicate_prefix.is_some() && p == partitions { FLAG_REPLICATED } else { 0 };
            PartitionWriter::create(&dir.join(partition::file_name(p)), p, flags).expect("partition")
        })
        .collect();
    let mut b = ManifestBuilder::new(dataset_id);
    let mut dirs = BTreeSet::new();
    for (i, f) in files.iter().enumerate() {
        let replicated = replicate_prefix.is_some_and(|r| f.path.starts_with(&format!("{r}/")));
        let p = if replicated { partitions } else { i as u32 % partitions };
        let (c, stored) = match codec::compress(comp, &f.bytes[..], f.bytes.len() as u64).expect("compress") {
            Some(z) => (comp.codec, z),
            None => (Codec::None, f.bytes.clone()),
        };
        let off = writers[p as usize].append(xxh3(f.path.as_bytes()), f.bytes.len() as u64, c, &stored).expect("append");
        let mut d = f.path.as_str();
        while let Some((parent, _)) = d.rsplit_once('/') {
            dirs.insert(parent.to_string());
            d = parent;
        }
        b.add(BuildEntry {
            path: f.path.as_bytes().to_vec(),
            perm: 0o644,
            size: f.bytes.len() as u64,
            mtime_ns: 1_700_000_000_000_000_000 + i as i64,
            atime_ns: 0,
            ctime_ns: 0,
            kind: BuildKind::File {
                partition: p,
                payload_offset: off,
                stored_len: stored.len() as u64,
                codec: c,
                checksum: xxh3(&stored),
                replicated,
            },
        });
    }
    for d in dirs {
        b.add(BuildEntry { path: d.into_bytes(), perm: 0o755, size: 0, mtime_ns: 0, atime_ns: 0, ctime_ns: 0, kind: BuildKind::Dir });
    }
    let mut logical = vec![0u64; nparts as usize];
    for (i, f) in files.iter().enumerate() {
        let replicated = replicate_prefix.is_some_and(|r| f.path.starts_with(&format!("{r}/")));
        logical[if replicated { partitions as usize } else { i % partitions as usize }] += f.bytes.len() as u64;
    }
    for (p, w) in writers.into_iter().enumerate() {
        let h = w.finish(dataset_id).expect("finish");
        let len = std::fs::metadata(dir.join(partition::file_name(p as u32))).expect("stat").len();
        b.add_partition(PartitionInfo {
            id: p as u32,
            flags: h.flags,
            file_len: len,
            entry_count: h.entry_count,
            logical_bytes: logical[p],
            header_checksum: h.checksum,
        });
    }
    std::fs::write(dir.join(fanstore_core::manifest::FILE_NAME), b.finish().expect("manifest")).expect("write manifest");
}
