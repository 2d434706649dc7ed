//! What a `--persist DIR` holds once drained, as its readers see it: the
//! content-addressed output bytes and the checksummed output indexes.
//!
//! ```text
//! DIR/data/<xxh3 16 hex>-<size>   the bytes of one output, content-addressed
//!                                 (the name is its checksum and length, so a
//!                                 later drain of the same bytes is a no-op)
//! DIR/meta/nranks                 decimal N of the job that drained last
//! DIR/meta/rank-<r>.idx           the records rank r owned, format below
//! DIR/meta/lease                  held by the running job's rank 0
//! DIR/ckpt/rank-<r>/              rank r's checkpoint store, drained
//!
//! rank-<r>.idx   0..8 magic "FSOUTIX\0" | 8..10 version (2) | 10..12 zero
//!                12..16 count | entries | last 8 bytes: xxh3 of all before
//! entry          0..4 path length | path | OutRecord (wire.rs, 80 bytes; 56 in
//!                version 2, 40 in version 1: those records belong to the reader)
//! ```
//!
//! The daemon writes all of it (its `persist` module: drain at stop and at
//! `fanstore sync`) and reads it back at start; `fanstore export` (crate
//! fanstore-cli) reads it with no daemon running.
//!
//! ```no_run
//! use fanstore_core::persisted::{data_path, read_all};
//! let dir = std::path::Path::new("/scratch/run1/persist");
//! for (path, rec) in read_all(dir)? {
//!     if !rec.is_dir() {
//!         println!("{} {} bytes in {}", String::from_utf8_lossy(&path), rec.size, data_path(dir, &rec).display());
//!     }
//! }
//! # Ok::<(), fanstore_core::persisted::PersistError>(())
//! ```

use crate::checksum::xxh3;
use crate::wire::OutRecord;
use std::io;
use std::path::{Path, PathBuf};

/// Holder rank of a record whose bytes are in `DIR/data`.
pub const PERSISTED: u32 = u32::MAX;
const MAGIC: [u8; 8] = *b"FSOUTIX\0";
/// 3: records of 80 bytes (uid, gid, inode base, link count); versions 2 (56 bytes: atime, ctime)
/// and 1 (40 bytes) are read too, owned by the reading process's user.
const VERSION: u16 = 3;
/// The directory under DIR holding each rank's drained checkpoint store.
pub const STORE_DIR: &str = "ckpt";

#[derive(Debug, thiserror::Error)]
pub enum PersistError {
    #[error("{0}: {1}")]
    Io(PathBuf, io::Error),
    #[error("{0}: not a FanStore output index (bad magic)")]
    Magic(PathBuf),
    #[error("{0}: unsupported output index version {1}")]
    Version(PathBuf, u16),
    #[error("{0}: checksum mismatch (damaged index)")]
    Checksum(PathBuf),
    #[error("{0}: truncated entry")]
    Truncated(PathBuf),
    #[error("{0}: the bytes of '{1}' fail their checksum")]
    Data(PathBuf, String),
}

pub fn data_name(r: &OutRecord) -> String {
    format!("{:016x}-{}", r.sum, r.size)
}

pub fn data_path(dir: &Path, r: &OutRecord) -> PathBuf {
    dir.join("data").join(data_name(r))
}

/// Where rank `rank`'s checkpoint store is drained under `persist`.
pub fn drained_dir(persist: &Path, rank: u32) -> PathBuf {
    persist.join(STORE_DIR).join(format!("rank-{rank}"))
}

/// Encodes an index of records.
pub fn encode_index(recs: &[(Vec<u8>, OutRecord)]) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&MAGIC);
    b.extend_from_slice(&VERSION.to_le_bytes());
    b.extend_from_slice(&0u16.to_le_bytes());
    b.extend_from_slice(&(recs.len() as u32).to_le_bytes());
    for (p, r) in recs {
        b.extend_from_slice(&(p.len() as u32).to_le_bytes());
        b.extend_from_slice(p);
        r.encode_into(&mut b);
    }
    let sum = xxh3(&b);
    b.extend_from_slice(&sum.to_le_bytes());
    b
}

pub fn decode_index(path: &Path, b: &[u8]) -> Result<Vec<(Vec<u8>, OutRecord)>, PersistError> {
    let p = || path.to_path_buf();
    if b.len() < 24 || b[..8] != MAGIC {
        return Err(PersistError::Magic(p()));
    }
    let v = u16::from_le_bytes([b[8], b[9]]);
    if !(1..=VERSION).contains(&v) {
        return Err(PersistError::Version(p(), v));
    }
    // SAFETY: geteuid and getegid have no preconditions and cannot fail.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    let rec_len = [OutRecord::LEN_V1, OutRecord::LEN_V2, OutRecord::LEN][usize::from(v) - 1];
    let decode = |b: &[u8]| match v {
        1 => OutRecord::decode_v1(b).map(|r| OutRecord { uid, gid, ..r }),
        2 => OutRecord::decode_v2(b, uid, gid),
        _ => OutRecord::decode(b),
    };
    let (body, tail) = b.split_at(b.len() - 8);
    let mut s = [0u8; 8];
    s.copy_from_slice(tail);
    if xxh3(body) != u64::from_le_bytes(s) {
        return Err(PersistError::Checksum(p()));
    }
    let count = u32::from_le_bytes([b[12], b[13], b[14], b[15]]) as usize;
    let mut out = Vec::with_capacity(count.min(1 << 20));
    let mut off = 16;
    for _ in 0..count {
        let len_b = body.get(off..off + 4).ok_or_else(|| PersistError::Truncated(p()))?;
        let len = u32::from_le_bytes([len_b[0], len_b[1], len_b[2], len_b[3]]) as usize;
        off += 4;
        let path_b = body.get(off..off + len).ok_or_else(|| PersistError::Truncated(p()))?;
        off += len;
        let rec = body.get(off..).and_then(decode).ok_or_else(|| PersistError::Truncated(p()))?;
        off += rec_len;
        out.push((path_b.to_vec(), rec));
    }
    Ok(out)
}

/// Every record of the last drained job (empty if DIR holds none yet).
pub fn read_all(dir: &Path) -> Result<Vec<(Vec<u8>, OutRecord)>, PersistError> {
    let np = dir.join("meta").join("nranks");
    let n = match std::fs::read_to_string(&np) {
        Ok(s) => s.trim().parse::<u32>().map_err(|e| PersistError::Io(np.clone(), io::Error::new(io::ErrorKind::InvalidData, e)))?,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(PersistError::Io(np, e)),
    };
    let mut all = Vec::new();
    for r in 0..n {
        let p = dir.join("meta").join(format!("rank-{r}.idx"));
        let b = match std::fs::read(&p) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue, // that rank owned nothing
            Err(e) => return Err(PersistError::Io(p, e)),
        };
        all.extend(decode_index(&p, &b)?);
    }
    Ok(all)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_roundtrip_and_corruption() {
        let r = OutRecord { size: 3, mode: libc::S_IFREG | 0o644, holder: PERSISTED, mtime_ns: 5, id: 0, sum: 9, atime_ns: 4, ctime_ns: 6, uid: 1000, gid: 100, ino: 1 << 63 | 5, nlink: 2 };
        let recs = vec![(b"a/b".to_vec(), r), (b"d".to_vec(), OutRecord { mode: libc::S_IFDIR | 0o755, ..r })];
        let b = encode_index(&recs);
        let p = Path::new("x.idx");
        assert_eq!(decode_index(p, &b).unwrap(), recs);
        let mut bad = b.clone();
        bad[20] ^= 1;
        assert!(matches!(decode_index(p, &bad), Err(PersistError::Checksum(_))));
        let mut bad = b.clone();
        bad[8] = 7;
        assert!(matches!(decode_index(p, &bad), Err(PersistError::Version(_, 7))));
        assert!(matches!(decode_index(p, b"nope"), Err(PersistError::Magic(_))));
    }

    #[test]
    fn a_version_1_index_is_read_with_its_mtime_as_atime_and_ctime() {
        // Built by hand as version 1 wrote it: 40-byte records.
        let r = OutRecord { size: 3, mode: libc::S_IFREG | 0o600, holder: PERSISTED, mtime_ns: 77, id: 2, sum: 9, ..Default::default() };
        let mut b = Vec::new();
        b.extend_from_slice(&MAGIC);
        b.extend_from_slice(&1u16.to_le_bytes());
        b.extend_from_slice(&0u16.to_le_bytes());
        b.extend_from_slice(&1u32.to_le_bytes());
        b.extend_from_slice(&3u32.to_le_bytes());
        b.extend_from_slice(b"a/b");
        let mut full = Vec::new();
        r.encode_into(&mut full);
        b.extend_from_slice(&full[..OutRecord::LEN_V1]);
        let sum = xxh3(&b);
        b.extend_from_slice(&sum.to_le_bytes());
        let got = decode_index(Path::new("v1.idx"), &b).unwrap();
        // SAFETY: no preconditions.
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        assert_eq!(got, vec![(b"a/b".to_vec(), OutRecord { atime_ns: 77, ctime_ns: 77, uid, gid, ..r })]);
        let cut = &b[..b.len() - 12];
        assert!(decode_index(Path::new("v1.idx"), cut).is_err(), "a cut index is refused");
    }

    #[test]
    fn read_all_takes_every_rank_and_skips_a_rank_that_owned_nothing() {
        let d = tempfile::tempdir().unwrap();
        assert!(read_all(d.path()).unwrap().is_empty(), "nothing drained yet");
        let meta = d.path().join("meta");
        std::fs::create_dir_all(&meta).unwrap();
        let r = OutRecord { size: 5, sum: 1, mode: libc::S_IFREG | 0o644, holder: PERSISTED, ..Default::default() };
        std::fs::write(meta.join("rank-0.idx"), encode_index(&[(b"x".to_vec(), r)])).unwrap();
        std::fs::write(meta.join("rank-2.idx"), encode_index(&[(b"y".to_vec(), r)])).unwrap();
        std::fs::write(meta.join("nranks"), "3\n").unwrap();
        let names: Vec<Vec<u8>> = read_all(d.path()).unwrap().into_iter().map(|(p, _)| p).collect();
        assert_eq!(names, [b"x".to_vec(), b"y".to_vec()]);
        assert_eq!(data_path(d.path(), &r), d.path().join("data").join("0000000000000001-5"));
        assert_eq!(drained_dir(d.path(), 4), d.path().join("ckpt").join("rank-4"));
    }
}
