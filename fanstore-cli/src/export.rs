//! `fanstore export DIR --to PLAIN`: the outputs drained to a `--persist`
//! directory, written out as plain files, with no daemon running.
//!
//! Every record of the last drained job ([`fanstore_core::persisted`]) becomes
//! what it is (file, directory, symlink) under PLAIN, with its mode and
//! modification time. A file's bytes come from `DIR/data/` or, for an output
//! committed as a checkpoint, from the checkpoint store its rank drained to
//! `DIR/ckpt/rank-<r>/`; each is checked against the record's size and xxh3
//! before it is written.
//!
//! ```no_run
//! let n = fanstore_cli::export::export("/scratch/run1/persist".as_ref(), "/scratch/run1/plain".as_ref())?;
//! println!("exported {n} files");
//! # Ok::<(), fanstore_core::persisted::PersistError>(())
//! ```

use fanstore_ckpt::{CheckpointStore, CkptError};
use fanstore_core::checksum::xxh3;
use fanstore_ckpt::drained::{open_drained, persisted_catalogs};
use fanstore_core::persisted::{data_path, read_all, PersistError};
use fanstore_core::wire::OutRecord;
use std::collections::HashMap;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

fn io_err(p: &Path) -> impl FnOnce(io::Error) -> PersistError + '_ {
    move |e| PersistError::Io(p.to_path_buf(), e)
}

/// Sets the permission bits and modification time of `dst` (not following
/// a symlink) as its record says.
fn apply_attrs(dst: &Path, r: &OutRecord) -> Result<(), PersistError> {
    use std::os::unix::fs::PermissionsExt;
    if !r.is_link() {
        std::fs::set_permissions(dst, std::fs::Permissions::from_mode(r.mode & 0o7777)).map_err(io_err(dst))?;
    }
    let ts = |ns: i64| libc::timespec { tv_sec: ns.div_euclid(1_000_000_000), tv_nsec: ns.rem_euclid(1_000_000_000) };
    let c = std::ffi::CString::new(dst.as_os_str().as_bytes()).map_err(|e| PersistError::Io(dst.to_path_buf(), io::Error::other(e)))?;
    let times = [ts(r.atime_ns), ts(r.mtime_ns)];
    // SAFETY: c is a NUL-terminated path and times two valid timespecs.
    if unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), times.as_ptr(), libc::AT_SYMLINK_NOFOLLOW) } != 0 {
        return Err(PersistError::Io(dst.to_path_buf(), io::Error::last_os_error()));
    }
    Ok(())
}

/// Writes every drained output under `to` as what it is (file, directory,
/// symlink) with its mode and modification time, checking each file's
/// checksum. Returns the count of files and symlinks.
pub fn export(dir: &Path, to: &Path) -> Result<usize, PersistError> {
    let mut recs = read_all(dir)?;
    // Hard links: each name of a linked file is written as a copy of its
    // shared record's file (the shared records themselves have no name).
    let shared: std::collections::HashMap<Vec<u8>, OutRecord> =
        recs.iter().filter(|(p, _)| fanstore_core::wire::is_linked_key(p)).map(|(p, r)| (p.clone(), *r)).collect();
    recs.retain(|(p, _)| !fanstore_core::wire::is_linked_key(p));
    for (_, r) in recs.iter_mut() {
        if r.is_linked_name() {
            match shared.get(&r.linked_key()) {
                Some(s) => *r = *s,
                None => return Err(PersistError::Truncated(dir.join("meta"))),
            }
        }
    }
    recs.sort_by(|a, b| a.0.cmp(&b.0));
    std::fs::create_dir_all(to).map_err(io_err(to))?;
    let mut drained = DrainedStores::default();
    let mut n = 0;
    for (p, r) in &recs {
        let dst = to.join(Path::new(std::ffi::OsStr::from_bytes(p)));
        if r.is_dir() {
            std::fs::create_dir_all(&dst).map_err(io_err(&dst))?;
        }
    }
    for (p, r) in &recs {
        let rel = Path::new(std::ffi::OsStr::from_bytes(p));
        let dst = to.join(rel);
        if r.is_dir() {
            continue;
        }
        if let Some(parent) = dst.parent() {
            std::fs::create_dir_all(parent).map_err(io_err(parent))?;
        }
        // A FIFO is made again (no bytes); a unix socket is skipped, as
        // tar does: nothing listens on it any more.
        if r.is_special() {
            if r.mode & libc::S_IFMT == libc::S_IFIFO {
                make_fifo(&dst)?;
                apply_attrs(&dst, r)?;
                n += 1;
            }
            continue;
        }
        let src = data_path(dir, r);
        let bytes = if src.exists() {
            std::fs::read(&src).map_err(io_err(&src))?
        } else {
            drained.read(dir, p).map_err(|e| PersistError::Data(src.clone(), format!("{}: {e}", String::from_utf8_lossy(p))))?
        };
        if bytes.len() as u64 != r.size || xxh3(&bytes) != r.sum {
            return Err(PersistError::Data(src, String::from_utf8_lossy(p).into_owned()));
        }
        if r.is_link() {
            match std::fs::symlink_metadata(&dst) {
                Ok(_) => std::fs::remove_file(&dst).map_err(io_err(&dst))?,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(PersistError::Io(dst, e)),
            }
            std::os::unix::fs::symlink(std::ffi::OsStr::from_bytes(&bytes), &dst).map_err(io_err(&dst))?;
        } else {
            std::fs::write(&dst, &bytes).map_err(io_err(&dst))?;
        }
        apply_attrs(&dst, r)?;
        n += 1;
    }
    // Directories last, deepest first: writing their entries changed their times.
    for (p, r) in recs.iter().rev().filter(|(_, r)| r.is_dir()) {
        apply_attrs(&to.join(Path::new(std::ffi::OsStr::from_bytes(p))), r)?;
    }
    Ok(n)
}

/// A FIFO at `dst` (an earlier one there is replaced).
fn make_fifo(dst: &Path) -> Result<(), PersistError> {
    let _ = std::fs::remove_file(dst);
    let c = std::ffi::CString::new(dst.as_os_str().as_bytes()).map_err(|e| PersistError::Io(dst.to_path_buf(), io::Error::other(e)))?;
    // SAFETY: c is a NUL-terminated path.
    if unsafe { libc::mkfifo(c.as_ptr(), 0o600) } != 0 {
        return Err(PersistError::Io(dst.to_path_buf(), io::Error::last_os_error()));
    }
    Ok(())
}

/// The checkpoint stores drained to a persist directory, opened on demand
/// (outputs that were committed as checkpoints have no `data/` file).
#[derive(Default)]
struct DrainedStores {
    catalogs: Option<HashMap<Vec<u8>, u32>>,
    open: HashMap<u32, CheckpointStore>,
}

impl DrainedStores {
    fn read(&mut self, dir: &Path, path: &[u8]) -> Result<Vec<u8>, CkptError> {
        if self.catalogs.is_none() {
            self.catalogs = Some(persisted_catalogs(dir)?);
        }
        let rank = self
            .catalogs
            .as_ref()
            .and_then(|c| c.get(path).copied())
            .ok_or_else(|| CkptError::NotFound { path: "no drained checkpoint store holds it".into() })?;
        if let std::collections::hash_map::Entry::Vacant(e) = self.open.entry(rank) {
            e.insert(open_drained(dir, rank)?);
        }
        self.open[&rank].read(path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fanstore_core::persisted::{drained_dir, encode_index, PERSISTED};

    /// One drained output: its path, its record and its bytes.
    type Drained<'a> = (&'a [u8], OutRecord, &'a [u8]);

    /// Drains as the daemon does: the bytes under their content name, the
    /// records in rank indexes, `nranks` last.
    fn drain(dir: &Path, per_rank: &[&[Drained]]) {
        std::fs::create_dir_all(dir.join("data")).unwrap();
        std::fs::create_dir_all(dir.join("meta")).unwrap();
        for (rank, recs) in per_rank.iter().enumerate() {
            for (_, r, bytes) in recs.iter().filter(|(_, r, _)| !r.is_dir()) {
                std::fs::write(data_path(dir, r), bytes).unwrap();
            }
            let idx: Vec<(Vec<u8>, OutRecord)> = recs.iter().map(|(p, r, _)| (p.to_vec(), *r)).collect();
            std::fs::write(dir.join("meta").join(format!("rank-{rank}.idx")), encode_index(&idx)).unwrap();
        }
        std::fs::write(dir.join("meta").join("nranks"), format!("{}\n", per_rank.len())).unwrap();
    }

    #[test]
    fn files_links_and_directories_come_out_with_their_attributes() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("persist");
        let file = |bytes: &[u8], mode| OutRecord { size: bytes.len() as u64, sum: xxh3(bytes), mode, holder: PERSISTED, mtime_ns: 1_500_000_000, ..Default::default() };
        let r = file(b"hello", libc::S_IFREG | 0o640);
        let l = file(b"x", libc::S_IFLNK | 0o777);
        let dr = OutRecord { mode: libc::S_IFDIR | 0o750, mtime_ns: 2_000_000_000, ..Default::default() };
        drain(&dir, &[&[(b"ck/x", r, b"hello"), (b"ck/link", l, b"x")], &[(b"ck", dr, b"")]]);
        let plain = d.path().join("plain");
        assert_eq!(export(&dir, &plain).unwrap(), 2);
        assert_eq!(std::fs::read(plain.join("ck/x")).unwrap(), b"hello");
        assert_eq!(std::fs::read_link(plain.join("ck/link")).unwrap(), Path::new("x"));
        use std::os::unix::fs::MetadataExt;
        let md = std::fs::metadata(plain.join("ck/x")).unwrap();
        assert_eq!((md.mode() & 0o7777, md.mtime()), (0o640, 1));
        let md = std::fs::metadata(plain.join("ck")).unwrap();
        assert_eq!((md.mode() & 0o7777, md.mtime()), (0o750, 2), "a directory's time is set after its entries");
        // Exported again over the first tree: the same result.
        assert_eq!(export(&dir, &plain).unwrap(), 2);
    }

    #[test]
    fn damaged_or_missing_bytes_are_refused() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("persist");
        let r = OutRecord { size: 5, sum: xxh3(b"hello"), mode: libc::S_IFREG | 0o644, holder: PERSISTED, ..Default::default() };
        drain(&dir, &[&[(b"ck/x", r, b"hello")]]);
        std::fs::write(data_path(&dir, &r), b"HELLO").unwrap();
        assert!(matches!(export(&dir, &d.path().join("p1")), Err(PersistError::Data(..))));
        std::fs::remove_file(data_path(&dir, &r)).unwrap();
        let e = export(&dir, &d.path().join("p2")).unwrap_err();
        assert!(matches!(e, PersistError::Data(..)) && e.to_string().contains("no drained checkpoint store holds it"), "{e}");
        assert_eq!(export(&d.path().join("empty"), &d.path().join("p3")).unwrap(), 0, "nothing drained: nothing to write");
    }

    #[test]
    fn a_checkpoint_comes_from_its_rank_drained_store() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("persist");
        let bytes: Vec<u8> = (0..4096u32).flat_map(|i| i.to_le_bytes()).collect();
        {
            let mut store = CheckpointStore::open(&drained_dir(&dir, 1)).unwrap();
            store.commit(b"run/ck.bin", &bytes).unwrap();
        }
        let r = OutRecord { size: bytes.len() as u64, sum: xxh3(&bytes), mode: libc::S_IFREG | 0o600, holder: PERSISTED, ..Default::default() };
        // rank 0 owns the record; its bytes are only in rank 1's store.
        drain(&dir, &[&[], &[]]);
        let idx = encode_index(&[(b"run/ck.bin".to_vec(), r)]);
        std::fs::write(dir.join("meta").join("rank-0.idx"), idx).unwrap();
        let plain = d.path().join("plain");
        assert_eq!(export(&dir, &plain).unwrap(), 1);
        assert_eq!(std::fs::read(plain.join("run/ck.bin")).unwrap(), bytes);
    }
}
