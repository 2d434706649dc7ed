//! Loading: every partition this rank holds is read sequentially once from
//! the dataset directory, every checksum verified against the manifest, and
//! written as it is read to the rank's local directory as one file,
//! [`local_partition_path`] (a sequential copy: the time to ready is bound
//! by bytes, not by the number of files). The copies are then mapped
//! read-only (no fd is kept) and serve every local file: a file's own bytes
//! appear on its first open, extracted or copied (see [`crate::inputs::copies`] and
//! [`fanstore_core::tiers`]).
//!
//! One thread per partition in flight reads, verifies and writes; the first
//! fault stops every thread and names the partition file; the caller never
//! runs with holes.

use crate::placement::Placement;
use crate::status::LoadReport;
use fanstore_core::manifest::{IndexView, NodeKind};
use fanstore_core::partition::{self, PartitionReader};
use fanstore_core::FormatError;
use std::collections::HashMap;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Why loading failed. Every variant names the file at fault.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// (FormatError's message names the file and the offset.)
    #[error("{error}")]
    Format { file: PathBuf, error: FormatError },
    #[error("partition {file} does not match the manifest: {problem}")]
    Mismatch { file: PathBuf, problem: String },
    #[error("writing {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("manifest: {0}")]
    Manifest(String),
}

/// A partition's local copy, mapped read-only (the whole partition file).
pub type PartMap = Arc<memmap2::Mmap>;

/// What a finished load produced.
#[derive(Debug, Clone)]
pub struct Loaded {
    pub report: LoadReport,
    /// `local[p]`: partition p is held here.
    pub local: Vec<bool>,
    /// `parts[p]`: the mapped local copy of partition p, if held here.
    pub parts: Vec<Option<PartMap>>,
}

/// Where the payloads of one partition belong: payload offset -> node id.
pub(crate) type OffsetMap = HashMap<u64, u32>;

/// The local copy of partition `p`: `local/parts/part-NNNNNN.fsp`.
pub fn local_partition_path(local: &Path, p: u32) -> PathBuf {
    local.join("parts").join(partition::file_name(p))
}

/// Checks that partition ids are 0..P-1 in table order (the placement and
/// the state bitmap index partitions by id).
pub fn check_partition_table(view: &IndexView<'_>) -> Result<(), LoadError> {
    if view.node_count() >= crate::ids::PART_BIT {
        return Err(LoadError::Manifest(format!(
            "{} nodes: at most {} are supported (node ids share the MPI request field with partition ranges)",
            view.node_count(),
            crate::ids::PART_BIT - 1
        )));
    }
    for (i, p) in view.partitions().enumerate() {
        if p.id as usize != i {
            return Err(LoadError::Manifest(format!("partition record {i} has id {} (expected ids 0..P-1 in order)", p.id)));
        }
    }
    Ok(())
}

pub(crate) fn offset_maps(view: &IndexView<'_>, wanted: &[u32]) -> HashMap<u32, OffsetMap> {
    let mut maps: HashMap<u32, OffsetMap> = wanted.iter().map(|&p| (p, OffsetMap::new())).collect();
    for n in view.nodes() {
        if n.kind() == Some(NodeKind::File) {
            if let Some(m) = maps.get_mut(&n.partition()) {
                m.insert(n.payload_offset(), n.id());
            }
        }
    }
    maps
}

/// Creates `local/parts` and `local/in/00` .. `local/in/ff` (the buckets of
/// `local_file_path`, where large uncompressed files are extracted on first open).
pub fn prepare_local_dir(local: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(local.join("parts"))?;
    for b in 0..256 {
        std::fs::create_dir_all(local.join("in").join(format!("{b:02x}")))?;
    }
    Ok(())
}

/// Loads the partitions `placement` gives `rank` from `data` into `local`
/// using `threads` threads. `view` must be a fully verified manifest.
pub fn load(
    data: &Path,
    view: &IndexView<'_>,
    placement: &Placement,
    rank: u32,
    local: &Path,
    threads: usize,
) -> Result<Loaded, LoadError> {
    let start = Instant::now();
    check_partition_table(view)?;
    let parts = placement.partitions_of(rank);
    prepare_local_dir(local).map_err(|source| LoadError::Write { path: local.to_path_buf(), source })?;
    let maps = offset_maps(view, &parts);
    let workers = threads.max(1).min(parts.len()).max(1);
    let next = AtomicUsize::new(0);
    let abort = AtomicBool::new(false);
    let first_error: Mutex<Option<LoadError>> = Mutex::new(None);
    let (files, bytes_read) = (AtomicU64::new(0), AtomicU64::new(0));
    let fail = |e: LoadError| {
        abort.store(true, Relaxed);
        let mut g = first_error.lock().unwrap_or_else(|p| p.into_inner());
        if g.is_none() {
            *g = Some(e);
        }
    };
    std::thread::scope(|s| {
        for _ in 0..workers {
            let (next, abort, fail, parts, maps, bytes_read, files) = (&next, &abort, &fail, &parts, &maps, &bytes_read, &files);
            s.spawn(move || loop {
                let i = next.fetch_add(1, Relaxed);
                let Some(&p) = parts.get(i) else { break };
                if abort.load(Relaxed) {
                    break;
                }
                let file = data.join(partition::file_name(p));
                let empty = OffsetMap::new();
                let offsets = maps.get(&p).unwrap_or(&empty);
                match copy_partition(&file, &local_partition_path(local, p), view, p, offsets, abort) {
                    Ok(n) => {
                        bytes_read.fetch_add(n, Relaxed);
                        files.fetch_add(offsets.len() as u64, Relaxed);
                    }
                    Err(e) => fail(e),
                }
            });
        }
    });
    if let Some(e) = first_error.into_inner().unwrap_or_else(|p| p.into_inner()) {
        return Err(e);
    }
    let mut local_parts = vec![false; view.partition_count() as usize];
    let mut part_maps = vec![None; view.partition_count() as usize];
    for &p in &parts {
        local_parts[p as usize] = true;
        let path = local_partition_path(local, p);
        let f = std::fs::File::open(&path).map_err(|source| LoadError::Write { path: path.clone(), source })?;
        // SAFETY: the daemon wrote this file just now and never changes or
        // truncates it while the job runs; the mapping is read-only.
        let m = unsafe { memmap2::Mmap::map(&f) }.map_err(|source| LoadError::Write { path, source })?;
        part_maps[p as usize] = Some(Arc::new(m));
    }
    let bytes = bytes_read.load(Relaxed);
    Ok(Loaded {
        report: LoadReport {
            partitions: parts.len() as u64,
            files: files.load(Relaxed),
            bytes_read: bytes,
            bytes_local: bytes,
            seconds: start.elapsed().as_secs_f64(),
        },
        local: local_parts,
        parts: part_maps,
    })
}

/// Copies partition `p` from `file` to `dest` entry by entry, checking every
/// entry against the manifest (the reader verifies every checksum). The copy
/// is byte-identical, so manifest payload offsets address it. Returns the
/// partition's length in bytes.
fn copy_partition(
    file: &Path,
    dest: &Path,
    view: &IndexView<'_>,
    p: u32,
    offsets: &OffsetMap,
    abort: &AtomicBool,
) -> Result<u64, LoadError> {
    let werr = |source| LoadError::Write { path: dest.to_path_buf(), source };
    let mut out: Option<std::io::BufWriter<std::fs::File>> = None;
    let open = || -> Result<std::io::BufWriter<std::fs::File>, LoadError> {
        let f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o400).open(dest).map_err(werr)?;
        Ok(std::io::BufWriter::with_capacity(4 << 20, f))
    };
    let n = walk_partition(file, view, p, offsets, abort, &|_| false, &mut |bytes: &[u8]| {
        if out.is_none() {
            out = Some(open()?);
        }
        match out.as_mut() {
            Some(w) => w.write_all(bytes).map_err(werr),
            None => Ok(()),
        }
    })?;
    match out {
        Some(mut w) => w.flush().map_err(werr)?,
        None => drop(open()?),
    }
    Ok(n)
}

/// Checks every entry of partition file `file` against the manifest's
/// partition `p` (header, entry count, each entry's lengths, codec and
/// checksum; the reader verifies every checksum) without copying it: a
/// partition fetched from a peer is held to what the loader demands of one
/// read from the dataset. Returns its length in bytes. The payloads at the
/// offsets for which `elsewhere` holds are not in `file` (a hole): the caller
/// wrote them to files of their own and checks them itself; their entry
/// headers are checked here as all others.
pub(crate) fn verify_partition(
    file: &Path,
    view: &IndexView<'_>,
    p: u32,
    offsets: &OffsetMap,
    abort: &AtomicBool,
    elsewhere: &dyn Fn(u64) -> bool,
) -> Result<u64, LoadError> {
    walk_partition(file, view, p, offsets, abort, elsewhere, &mut |_| Ok(()))
}

/// Reads partition `p` from `file`, checking it against the manifest, and
/// hands every verified byte (header, then each entry's header and payload)
/// to `sink` in file order.
fn walk_partition(
    file: &Path,
    view: &IndexView<'_>,
    p: u32,
    offsets: &OffsetMap,
    abort: &AtomicBool,
    elsewhere: &dyn Fn(u64) -> bool,
    sink: &mut dyn FnMut(&[u8]) -> Result<(), LoadError>,
) -> Result<u64, LoadError> {
    let mismatch = |problem: String| LoadError::Mismatch { file: file.to_path_buf(), problem };
    let info = view.partition(p).ok_or_else(|| mismatch(format!("no partition {p} in the manifest")))?;
    let mut r = PartitionReader::open(file).map_err(|source| LoadError::Format { file: file.to_path_buf(), error: source })?;
    let h = *r.header();
    if h.checksum != info.header_checksum {
        return Err(mismatch(format!(
            "header checksum {:#018x}, the manifest records {:#018x} (a partition of another packing?)",
            h.checksum, info.header_checksum
        )));
    }
    if h.dataset_id != view.dataset_id() || h.id != p || h.entry_count != info.entry_count || h.flags != info.flags {
        return Err(mismatch(format!(
            "header (id {}, dataset {:#x}, {} entries, flags {}) differs from the manifest (id {p}, dataset {:#x}, {} entries, flags {})",
            h.id,
            h.dataset_id,
            h.entry_count,
            h.flags,
            view.dataset_id(),
            info.entry_count,
            info.flags
        )));
    }
    if h.entry_count != offsets.len() as u64 {
        return Err(mismatch(format!("{} entries, but the manifest has {} files in it", h.entry_count, offsets.len())));
    }
    sink(&h.encode())?;
    loop {
        if abort.load(Relaxed) {
            return Ok(0);
        }
        let e = r.next_entry_with(elsewhere).map_err(|source| LoadError::Format { file: file.to_path_buf(), error: source })?;
        let Some(e) = e else { break };
        let node = offsets
            .get(&e.payload_offset)
            .and_then(|&id| view.node(id))
            .ok_or_else(|| mismatch(format!("entry at offset {} belongs to no file of the manifest", e.payload_offset)))?;
        let eh = &e.header;
        if eh.stored_len != node.stored_len()
            || eh.raw_len != node.size()
            || eh.codec != node.codec()
            || eh.payload_checksum != node.checksum()
        {
            return Err(mismatch(format!(
                "entry at offset {} differs from '{}' in the manifest",
                e.payload_offset,
                String::from_utf8_lossy(node.path())
            )));
        }
        sink(&eh.encode())?;
        sink(&e.payload)?;
    }
    Ok(info.file_len)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::PeerSource;
    use crate::node::LocalStore;
    use crate::testkit::{self, TestFile};
    use fanstore_core::codec::Compression;
    use fanstore_core::manifest::{Manifest, Verify};

    fn dataset(dir: &Path) -> Vec<TestFile> {
        let files: Vec<TestFile> = (0..12)
            .map(|i| TestFile { path: format!("d{}/f{i}", i % 3), bytes: testkit::pattern(i * 70_000 + 3, i as u64) })
            .chain(std::iter::once(TestFile { path: "rep/x".into(), bytes: b"everywhere".to_vec() }))
            .collect();
        testkit::build(dir, 9, &files, 4, Compression::parse("lz4").unwrap(), Some("rep"));
        files
    }

    /// The test dataset packed in `dir/ds`: (its directory, its files, its manifest).
    fn packed(dir: &Path) -> (std::path::PathBuf, Vec<TestFile>, Manifest) {
        let ds = dir.join("ds");
        let files = dataset(&ds);
        let m = Manifest::open(&ds.join("manifest.fsm")).unwrap();
        (ds, files, m)
    }

    fn view(m: &Manifest) -> IndexView<'_> {
        IndexView::parse(m.path(), m.bytes(), Verify::Header).unwrap()
    }

    #[test]
    fn loads_its_partitions_and_serves_peers() {
        let d = tempfile::tempdir().unwrap();
        let (_, files, m) = packed(d.path());
        let v = view(&m);
        let replicated: Vec<bool> = v.partitions().map(|p| p.replicated()).collect();
        let placement = Placement::new(2, 1, replicated);
        let local = d.path().join("local");
        let l = load(&d.path().join("ds"), &v, &placement, 1, &local, 2).unwrap();
        assert_eq!(l.local, vec![false, true, false, true, true]);
        assert_eq!(l.report.partitions, 3);
        // Each held partition is copied whole and byte-identical; nothing is extracted per file.
        for p in 0..5u32 {
            let copy = std::fs::read(local_partition_path(&local, p));
            if l.local[p as usize] {
                assert_eq!(copy.unwrap(), std::fs::read(d.path().join("ds").join(partition::file_name(p))).unwrap());
                assert_eq!(l.parts[p as usize].as_ref().unwrap().len() as u64, v.partition(p).unwrap().file_len);
            } else {
                assert!(copy.is_err() && l.parts[p as usize].is_none());
            }
        }
        assert!(walk_files(&local.join("in")).is_empty());
        let store = LocalStore { view: v, local_dir: local.clone(), parts: l.parts.clone(), dedup: None };
        let mut held = 0;
        for f in &files {
            let n = v.lookup(f.path.as_bytes()).unwrap();
            if l.local[n.partition() as usize] {
                held += 1;
                let sent = store.payload(n.id(), n.stored_len(), None).unwrap();
                let b = sent.bytes();
                assert_eq!(b.len() as u64, n.stored_len());
                assert_eq!(fanstore_core::checksum::xxh3(b), n.checksum());
                if n.codec() == fanstore_core::codec::Codec::None {
                    assert_eq!(b, &f.bytes[..], "raw payloads are the file's exact bytes");
                }
                assert!(store.payload(n.id(), n.stored_len() + 1, None).is_none(), "length must match the manifest");
            } else {
                assert!(store.payload(n.id(), n.stored_len(), None).is_none());
            }
        }
        assert_eq!(held as u64, l.report.files);
        assert!(store.payload(0, 0, None).is_none(), "the root is not a file");
    }

    fn walk_files(dir: &Path) -> Vec<PathBuf> {
        let mut out = Vec::new();
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            if e.path().is_dir() {
                out.extend(walk_files(&e.path()));
            } else {
                out.push(e.path());
            }
        }
        out
    }

    #[test]
    fn a_bad_partition_is_named() {
        let d = tempfile::tempdir().unwrap();
        let (ds, _, m) = packed(d.path());
        let v = view(&m);
        let placement = Placement::new(1, 1, v.partitions().map(|p| p.replicated()).collect());
        // A payload byte flipped.
        let p2 = ds.join(partition::file_name(2));
        let mut b = std::fs::read(&p2).unwrap();
        let n = b.len();
        b[n - 2] ^= 1;
        std::fs::write(&p2, &b).unwrap();
        let e = load(&ds, &v, &placement, 0, &d.path().join("l1"), 2).unwrap_err().to_string();
        assert!(e.contains("part-000002.fsp") && e.contains("checksum"), "{e}");
        // A partition from another packing (valid on its own, but not this manifest's).
        b[n - 2] ^= 1;
        std::fs::write(&p2, &b).unwrap();
        let other = d.path().join("other");
        testkit::build(&other, 10, &dataset_variant(), 4, Compression::NONE, None);
        std::fs::copy(other.join(partition::file_name(3)), ds.join(partition::file_name(3))).unwrap();
        let e = load(&ds, &v, &placement, 0, &d.path().join("l2"), 2).unwrap_err().to_string();
        assert!(e.contains("part-000003.fsp") && e.contains("does not match the manifest"), "{e}");
        // Missing.
        std::fs::remove_file(ds.join(partition::file_name(0))).unwrap();
        let e = load(&ds, &v, &placement, 0, &d.path().join("l3"), 1).unwrap_err().to_string();
        assert!(e.contains("part-000000.fsp"), "{e}");
    }

    #[test]
    fn a_fetched_partition_is_verified_like_a_loaded_one() {
        let d = tempfile::tempdir().unwrap();
        let (ds, _, m) = packed(d.path());
        let v = view(&m);
        let maps = offset_maps(&v, &[1]);
        let abort = AtomicBool::new(false);
        let good = ds.join(partition::file_name(1));
        let len = std::fs::metadata(&good).unwrap().len();
        assert_eq!(verify_partition(&good, &v, 1, &maps[&1], &abort, &|_| false).unwrap(), len);
        // Every byte of the file matters: a flipped byte anywhere is refused, naming the file.
        let b = std::fs::read(&good).unwrap();
        let bad = d.path().join("fetched.fsp");
        for i in (0..b.len()).step_by((b.len() / 97).max(1)) {
            let mut c = b.clone();
            c[i] ^= 0x10;
            std::fs::write(&bad, &c).unwrap();
            let e = verify_partition(&bad, &v, 1, &maps[&1], &abort, &|_| false).unwrap_err().to_string();
            assert!(e.contains("fetched.fsp"), "byte {i}: {e}");
        }
        // Cut short, or another partition of the same dataset.
        std::fs::write(&bad, &b[..b.len() - 1]).unwrap();
        assert!(verify_partition(&bad, &v, 1, &maps[&1], &abort, &|_| false).is_err());
        let e = verify_partition(&ds.join(partition::file_name(2)), &v, 1, &maps[&1], &abort, &|_| false).unwrap_err().to_string();
        assert!(e.contains("does not match the manifest"), "{e}");
    }

    fn dataset_variant() -> Vec<TestFile> {
        (0..5).map(|i| TestFile { path: format!("v{i}"), bytes: vec![i as u8; 100] }).collect()
    }
}
