//! Outputs kept beyond the job: `--persist DIR` (on the shared file system).
//!
//! ```text
//! DIR/data/<xxh3 16 hex>-<size>   the bytes of one output, content-addressed
//!                                 (the name is its checksum and length, so a
//!                                 later drain of the same bytes is a no-op)
//! DIR/meta/nranks                 decimal N of the job that drained last
//! DIR/meta/rank-<r>.idx           the records rank r owned, format below
//! DIR/meta/lease                  held by the running job's rank 0 (crate::outputs::persist_lease)
//!
//! rank-<r>.idx   0..8 magic "FSOUTIX\0" | 8..10 version (2) | 10..12 zero
//!                12..16 count | entries | last 8 bytes: xxh3 of all before
//! entry          0..4 path length | path | OutRecord (wire.rs, 56 bytes; 40 in version 1)
//! ```
//!
//! Drain (at stop): every rank copies the output bytes it holds into
//! `data/` (temp file, fsync, hash check, rename; a file its sidecar says
//! is already there is skipped) and its checkpoint store into `ckpt/`
//! (units and recipes, one syncfs, then the catalog), then writes the
//! records it owns
//! (temp file, fsync, rename); rank 0 writes `nranks` last. The daemon exits
//! after its drain, so `fanstore stop` returns when every rank drained.
//! Load (at start, same `--persist`): every rank reads every index and keeps
//! the records it owns under the new N (holder [`PERSISTED`]: opens read
//! `data/` directly) and the listings of the directories it owns.
//! Plain files are not kept in DIR directly: content addressing makes the
//! drain idempotent and lets a rename or a replaced output cost no copy;
//! `fanstore export DIR --to PLAIN` (crate fanstore-cli) writes the plain
//! tree (checksums checked). The layout's reading side is
//! [`fanstore_core::persisted`], re-exported here.

use fanstore_core::checksum::StreamingChecksum;
use fanstore_core::wire::OutRecord;
use std::io::{self, Read, Write};
use std::path::Path;

/// The layout and the output indexes of a persist directory, and their
/// reading: shared with `fanstore export` (crate fanstore-cli), in
/// fanstore-core.
pub use fanstore_core::persisted::{data_name, data_path, decode_index, encode_index, read_all, PersistError, PERSISTED};

fn io_err(p: &Path) -> impl FnOnce(io::Error) -> PersistError + '_ {
    move |e| PersistError::Io(p.to_path_buf(), e)
}

/// Writes `bytes` to `path` atomically (temp file, fsync, rename).
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), PersistError> {
    let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
    let res = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if res.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    res.map_err(io_err(path))
}

/// Copies the output file `src` into `DIR/data` under its content name
/// (skipped when present). Returns the (size, xxh3) read.
///
/// With `known` (the record's size and xxh3), a file already there costs
/// nothing. Otherwise it is copied (copy_file_range) to a temp file,
/// fsynced if it holds at least [`SYNC_ALONE_MIN`] bytes, checked against
/// `known` while its xxh3 is computed from the page cache, and renamed
/// under its content name. A smaller file is not fsynced: its bytes are
/// added to `unsynced`, and the caller flushes the file system
/// ([`flush`]) once they pass [`UNSYNCED_MAX`] and before any index names
/// them. A large file is fsynced on its own: one syncfs after 2 GiB of
/// copies drained at 0.33x `cp -r` + `sync` on this VM, an fsync per file
/// at 0.76x (the kernel throttles a writer that leaves that many dirty
/// pages); but an fsync per file of 100,000 outputs of 10 bytes drained
/// ~1,000 files/s (a 2-rank stop took over 60 s).
pub fn drain_file(dir: &Path, src: &Path, known: Option<(u64, u64)>, unsynced: &mut u64) -> Result<(u64, u64), PersistError> {
    let data = dir.join("data");
    std::fs::create_dir_all(&data).map_err(io_err(&data))?;
    let name = |size: u64, sum: u64| data.join(format!("{sum:016x}-{size}"));
    if let Some((size, sum)) = known {
        if name(size, sum).exists() {
            return Ok((size, sum));
        }
    }
    let tmp = data.join(format!("drain.tmp.{}.{}", std::process::id(), src.file_name().map_or_else(String::new, |n| n.to_string_lossy().into_owned())));
    let mut copy = || -> io::Result<(u64, u64)> {
        let len = std::fs::copy(src, &tmp)?;
        let mut f = std::fs::File::open(&tmp)?;
        if len >= SYNC_ALONE_MIN {
            f.sync_all()?;
        } else {
            *unsynced += len.max(1);
        }
        let mut h = StreamingChecksum::new();
        let mut buf = vec![0u8; 1 << 20];
        let mut size = 0u64;
        loop {
            let n = f.read(&mut buf)?;
            if n == 0 {
                break;
            }
            h.update(&buf[..n]);
            size += n as u64;
        }
        Ok((size, h.digest()))
    };
    let res = copy().map_err(io_err(src)).and_then(|(size, sum)| {
        if known.is_some_and(|k| k != (size, sum)) {
            return Err(PersistError::Data(src.to_path_buf(), "its held copy".into()));
        }
        std::fs::rename(&tmp, name(size, sum)).map_err(io_err(&name(size, sum)))?;
        Ok((size, sum))
    });
    if res.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    res
}

/// Drained files of at least this many bytes are fsynced one by one.
pub const SYNC_ALONE_MIN: u64 = 1 << 20;
/// Bytes of smaller drained files left unsynced before a [`flush`].
pub const UNSYNCED_MAX: u64 = 64 << 20;

/// Flushes the file system holding `dir` (syncfs): every unit of a drained
/// checkpoint store is on stable storage before its catalog names it.
pub fn flush(dir: &Path) -> Result<(), PersistError> {
    let d = std::fs::File::open(dir).map_err(io_err(dir))?;
    // SAFETY: syncfs on a directory fd we own; no memory is shared.
    if unsafe { libc::syncfs(std::os::fd::AsRawFd::as_raw_fd(&d)) } != 0 {
        return Err(PersistError::Io(dir.to_path_buf(), io::Error::last_os_error()));
    }
    Ok(())
}

/// Writes rank `rank`'s index (and, for rank 0, `nranks`).
pub fn write_index(dir: &Path, rank: u32, nranks: u32, recs: &[(Vec<u8>, OutRecord)]) -> Result<(), PersistError> {
    let meta = dir.join("meta");
    std::fs::create_dir_all(&meta).map_err(io_err(&meta))?;
    write_atomic(&meta.join(format!("rank-{rank}.idx")), &encode_index(recs))?;
    if rank == 0 {
        write_atomic(&meta.join("nranks"), format!("{nranks}\n").as_bytes())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use fanstore_core::checksum::xxh3;

    #[test]
    fn drain_and_index() {
        let d = tempfile::tempdir().unwrap();
        let src = d.path().join("o");
        std::fs::write(&src, b"hello").unwrap();
        let dir = d.path().join("persist");
        let mut unsynced = 0;
        let (size, sum) = drain_file(&dir, &src, None, &mut unsynced).unwrap();
        assert_eq!(unsynced, size, "a small file is left to the caller's flush");
        assert_eq!(drain_file(&dir, &src, Some((size, sum)), &mut unsynced).unwrap(), (size, sum));
        assert_eq!(unsynced, size, "a file already there is not copied again");
        assert!(matches!(drain_file(&dir.join("other"), &src, Some((size, sum ^ 1)), &mut unsynced), Err(PersistError::Data(..))));
        assert_eq!((size, sum), (5, xxh3(b"hello")));
        let r = OutRecord { size, sum, mode: libc::S_IFREG | 0o644, holder: PERSISTED, ..Default::default() };
        let dr = OutRecord { mode: libc::S_IFDIR | 0o755, ..Default::default() };
        write_index(&dir, 0, 2, &[(b"ck/x".to_vec(), r)]).unwrap();
        write_index(&dir, 1, 2, &[(b"ck".to_vec(), dr)]).unwrap();
        assert_eq!(read_all(&dir).unwrap(), vec![(b"ck/x".to_vec(), r), (b"ck".to_vec(), dr)]);
        assert_eq!(std::fs::read(data_path(&dir, &r)).unwrap(), b"hello");
    }
}
