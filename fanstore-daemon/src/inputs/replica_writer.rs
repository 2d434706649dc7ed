//! Writes a fetched partition so that each byte lands once.
//!
//! A large uncompressed file of a local partition ([`EXTRACT_MIN`] bytes or
//! more) is opened as a file of its own, extracted from the partition copy
//! on its first open. For a partition fetched from a peer
//! ([`crate::inputs::replicate`]) that would write those bytes twice: into the
//! replica, then into the extracted file. This writer sends each fetched
//! range's bytes where they end up instead:
//!
//! ```text
//! fetched range   |hdr e0 payload0 | e1 | payload1 (large, raw) ....| e2 payload2 |
//!                  \______________/ \__/ \_________________________/ \___________/
//! written to       replica (.fetch)  rep.  in/xx/<id>.fetch (its own   replica
//!                                          file, from offset 0)
//! replica          |hdr e0 payload0 | e1 | hole ......................| e2 payload2 |
//! ```
//!
//! The replica keeps its full length with holes where the large payloads
//! were; `crate::inputs::load::verify_partition` checks it with those payloads
//! skipped (their entry headers are checked), and [`ReplicaWriter::verify_apart`]
//! checks each large file's length and xxh3 against the manifest. Only then
//! does [`ReplicaWriter::commit`] rename each to its extracted name. Nothing
//! ever reads a hole: these files' tier is "extracted" from then on, and an
//! open finds the extracted file even if the tier byte was cleared since.

use fanstore_core::checksum::StreamingChecksum;
use fanstore_core::codec::Codec;
use fanstore_core::manifest::IndexView;
use fanstore_core::tiers::EXTRACT_MIN;
use std::collections::BTreeMap;
use std::fs::File;
use std::io::Read;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// The large uncompressed payloads of a partition: payload offset -> (node id, length).
pub type Apart = BTreeMap<u64, (u32, u64)>;

/// Which payloads of a partition (`offsets`: payload offset -> node id) go
/// to files of their own.
pub(crate) fn large_payloads(view: &IndexView<'_>, offsets: &crate::inputs::load::OffsetMap) -> Apart {
    offsets
        .iter()
        .filter_map(|(&off, &id)| {
            let n = view.node(id)?;
            (n.codec() == Codec::None && n.size() >= EXTRACT_MIN && n.stored_len() == n.size())
                .then_some((off, (id, n.stored_len())))
        })
        .collect()
}

/// The temporary name of a large file while its partition is fetched.
fn fetch_name(path: &Path) -> PathBuf {
    let mut s = path.as_os_str().to_os_string();
    s.push(".fetch");
    PathBuf::from(s)
}

/// Splits the fetched bytes of one partition between the replica and the
/// large files' own files. Ranges must be written in order.
pub struct ReplicaWriter<'a> {
    replica: File,
    apart: &'a Apart,
    local_dir: PathBuf,
    /// The large file being written (at most one spans two ranges).
    current: Option<(u32, File)>,
    /// Every large file created, by node id (removed unless committed).
    made: Vec<u32>,
    committed: bool,
}

impl<'a> ReplicaWriter<'a> {
    /// `replica`: the partition's temporary file, created empty.
    pub fn new(replica: File, apart: &'a Apart, local_dir: &Path) -> ReplicaWriter<'a> {
        ReplicaWriter {
            replica,
            apart,
            local_dir: local_dir.to_path_buf(),
            current: None,
            made: Vec::new(),
            committed: false,
        }
    }

    fn path(&self, id: u32) -> PathBuf {
        fanstore_core::runtime::local_file_path(&self.local_dir, id)
    }

    fn large_file(&mut self, id: u32) -> std::io::Result<&File> {
        if self.current.as_ref().map(|(cur, _)| *cur) != Some(id) {
            let tmp = fetch_name(&self.path(id));
            let _ = std::fs::remove_file(&tmp);
            let f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o400)
                .custom_flags(libc::O_CLOEXEC)
                .open(&tmp)
                .map_err(|e| std::io::Error::new(e.kind(), format!("creating {}: {e}", tmp.display())))?;
            self.made.push(id);
            self.current = Some((id, f));
        }
        match &self.current {
            Some((_, f)) => Ok(f),
            None => Err(std::io::Error::other("no current file")),
        }
    }

    /// Writes the fetched bytes `bytes` of partition offset `off`.
    pub fn write(&mut self, off: u64, bytes: &[u8]) -> std::io::Result<()> {
        let end = off + bytes.len() as u64;
        let covering = self.apart.range(..=off).next_back().filter(|(&s, &(_, l))| s + l > off);
        let spans: Vec<(u64, u32, u64)> =
            covering.into_iter().chain(self.apart.range(off + 1..end)).map(|(&s, &(id, l))| (s, id, l)).collect();
        let mut pos = off;
        for (start, id, len) in spans {
            let (from, to) = (start.max(off), (start + len).min(end));
            if pos < from {
                self.replica.write_all_at(&bytes[(pos - off) as usize..(from - off) as usize], pos)?;
            }
            self.large_file(id)?.write_all_at(&bytes[(from - off) as usize..(to - off) as usize], from - start)?;
            if start + len <= end {
                self.current = None; // complete: its fd is closed
            }
            pos = to;
        }
        if pos < end {
            self.replica.write_all_at(&bytes[(pos - off) as usize..], pos)?;
        }
        Ok(())
    }

    /// Gives the replica its full length (it may end in a hole).
    pub fn finish(&mut self, len: u64) -> std::io::Result<()> {
        self.current = None;
        self.replica.set_len(len)
    }

    /// Checks each large file's length and xxh3 against the manifest; the
    /// error names the file.
    pub fn verify_apart(&self, view: &IndexView<'_>) -> Result<(), String> {
        let mut buf = vec![0u8; 1 << 20];
        for &(id, len) in self.apart.values() {
            let tmp = fetch_name(&self.path(id));
            let sum = view.node(id).map(|n| n.checksum()).ok_or_else(|| format!("no node {id} in the manifest"))?;
            let mut f = File::open(&tmp).map_err(|e| format!("opening {}: {e}", tmp.display()))?;
            let mut h = StreamingChecksum::new();
            let mut total = 0u64;
            loop {
                let n = f.read(&mut buf).map_err(|e| format!("reading {}: {e}", tmp.display()))?;
                if n == 0 {
                    break;
                }
                h.update(&buf[..n]);
                total += n as u64;
            }
            if total != len {
                return Err(format!("{}: {total} bytes, the manifest records {len}", tmp.display()));
            }
            let got = h.digest();
            if got != sum {
                return Err(format!("{}: checksum {got:#018x}, the manifest records {sum:#018x}", tmp.display()));
            }
        }
        Ok(())
    }

    /// Renames every large file to its extracted name; returns their node ids.
    pub fn commit(mut self) -> Result<Vec<u32>, String> {
        for &id in &self.made {
            let path = self.path(id);
            std::fs::rename(fetch_name(&path), &path).map_err(|e| format!("renaming into {}: {e}", path.display()))?;
        }
        self.committed = true;
        Ok(std::mem::take(&mut self.made))
    }
}

impl Drop for ReplicaWriter<'_> {
    fn drop(&mut self) {
        if !self.committed {
            for &id in &self.made {
                let _ = std::fs::remove_file(fetch_name(&self.path(id)));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setup() -> (tempfile::TempDir, PathBuf) {
        let d = tempfile::tempdir().unwrap();
        crate::inputs::load::prepare_local_dir(d.path()).unwrap();
        let rep = d.path().join("rep");
        (d, rep)
    }

    #[test]
    fn each_byte_goes_to_the_replica_or_to_its_own_file_in_any_range_split() {
        // 100 bytes; large payloads at 10..40 (id 7) and 60..61 (id 8), one at 90..100 (id 9, the tail).
        let apart: Apart = [(10, (7, 30)), (60, (8, 1)), (90, (9, 10))].into_iter().collect();
        let data: Vec<u8> = (0..100u8).collect();
        for step in [1usize, 3, 10, 29, 30, 31, 60, 100] {
            let (d, rep) = setup();
            let mut w = ReplicaWriter::new(File::create(&rep).unwrap(), &apart, d.path());
            for (i, c) in data.chunks(step).enumerate() {
                w.write((i * step) as u64, c).unwrap();
            }
            w.finish(100).unwrap();
            let ids = w.commit().unwrap();
            assert_eq!(ids, vec![7, 8, 9], "step {step}");
            let r = std::fs::read(&rep).unwrap();
            let mut want = data.clone();
            want[10..40].fill(0);
            want[60] = 0;
            want[90..].fill(0);
            assert_eq!(r, want, "step {step}: the replica has holes where the large payloads were");
            let own = |id| std::fs::read(fanstore_core::runtime::local_file_path(d.path(), id)).unwrap();
            assert_eq!(own(7), &data[10..40]);
            assert_eq!(own(8), &data[60..61]);
            assert_eq!(own(9), &data[90..]);
        }
    }

    #[test]
    fn an_uncommitted_writer_leaves_no_file() {
        let apart: Apart = [(4, (3, 8))].into_iter().collect();
        let (d, rep) = setup();
        let mut w = ReplicaWriter::new(File::create(&rep).unwrap(), &apart, d.path());
        w.write(0, &[1; 16]).unwrap();
        let tmp = fetch_name(&fanstore_core::runtime::local_file_path(d.path(), 3));
        assert!(tmp.exists());
        drop(w);
        assert!(!tmp.exists());
        assert!(!fanstore_core::runtime::local_file_path(d.path(), 3).exists());
    }
}
