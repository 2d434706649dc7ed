//! Store behaviour: corruption is detected and named, renames keep owner
//! maps valid, crash leftovers are swept, the directory is locked, and every
//! report renders as valid JSON.

mod common;

use common::*;
use fanstore_ckpt::json::{self, Limits};
use fanstore_ckpt::{unit, CheckpointStore, CkptError};
use fanstore_core::FormatError;
use std::path::Path;

fn st(tensors: &[(&str, &[u8])]) -> Vec<u8> {
    let ts: Vec<T> = tensors.iter().map(|(n, d)| t(n, "U8", &[d.len() as u64], d.to_vec())).collect();
    safetensors(&ts, StOpts::default())
}

fn flip(p: &Path, off: u64) {
    let mut b = std::fs::read(p).unwrap();
    b[off as usize] ^= 0x01;
    std::fs::write(p, b).unwrap();
}

/// A writer that records what it was given, to check that a failed read
/// never handed out wrong bytes.
struct Sink(Vec<u8>);
impl std::io::Write for Sink {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn a_corrupt_unit_is_named_by_verify_and_never_read_back() {
    let (d, mut store) = temp_store();
    let mut rng = Rng(1);
    let (shared, small, other) = (rng.bytes(3 << 20), rng.bytes(1000), rng.bytes(5000));
    let f1 = st(&[("encoder.weight", &shared), ("head", &small)]);
    let f2 = st(&[("encoder.weight", &shared), ("head", &other)]);
    let f3 = st(&[("head", &other)]);
    for (p, f) in [("c/1", &f1), ("c/2", &f2), ("c/3", &f3)] {
        store.commit(p.as_bytes(), f).unwrap();
    }
    assert!(store.verify(None).unwrap().ok());
    let h = unit::hash(&shared);
    let (upath, at, _) = store.unit_location(&h).unwrap();
    flip(&upath, at + unit::HEADER_LEN as u64 + 12345);

    let v = store.verify(None).unwrap();
    assert!(!v.ok());
    assert_eq!(v.affected(), vec![1, 2]);
    for p in &v.problems {
        assert_eq!(p.tensor.as_deref(), Some(&b"encoder.weight"[..]));
        assert_eq!(p.unit, Some(h));
        assert!(p.problem.contains(&unit::hex(&h)), "{}", p.problem);
    }
    let table = v.to_table();
    assert!(table.contains("#1 c/1") && table.contains("#2 c/2") && table.contains("encoder.weight"), "{table}");
    assert!(!table.contains("c/3"));
    assert!(store.verify(Some(b"c/3")).unwrap().ok());
    let one = store.verify(Some(b"c/2")).unwrap();
    assert_eq!((one.checkpoints, one.affected()), (1, vec![2]));

    for p in [&b"c/1"[..], b"c/2"] {
        let e = store.read(p).unwrap_err();
        assert!(e.is_corruption(), "{e}");
        assert!(e.to_string().contains(".fsk") && e.to_string().contains("unit payload"), "{e}");
        assert!(e.to_string().contains(&format!("offset {}", at + unit::HEADER_LEN as u64)), "{e}");
        let mut sink = Sink(Vec::new());
        assert!(store.read_to(p, &mut sink).unwrap_err().is_corruption());
        let orig = if p == b"c/1" { &f1 } else { &f2 };
        assert!(orig.starts_with(&sink.0), "read_to wrote bytes that are not the file's");
        assert!(sink.0.len() < orig.len());
    }
    assert_eq!(store.read(b"c/3").unwrap(), f3);

    // A flipped header byte and an overwritten record are named too.
    let hs = unit::hash(&small);
    let (spath, sat, _) = store.unit_location(&hs).unwrap();
    flip(&spath, sat + 20);
    let e = store.read(b"c/1").unwrap_err().to_string();
    assert!(e.contains("checksum mismatch in unit"), "{e}");
    let v = store.verify(Some(b"c/1")).unwrap();
    let p = v.problems.iter().find(|p| p.unit == Some(hs)).expect("the damaged header is named");
    assert!(p.problem.contains("checksum mismatch in unit header") && p.problem.contains(&format!("offset {sat}")), "{}", p.problem);
    let ho = unit::hash(&other);
    let (opath, oat, olen) = store.unit_location(&ho).unwrap();
    let mut b = std::fs::read(&opath).unwrap();
    b[oat as usize..(oat + olen) as usize].fill(0);
    std::fs::write(&opath, b).unwrap();
    let v = store.verify(None).unwrap();
    assert_eq!(v.affected(), vec![1, 2, 3]);
    assert!(v.problems.iter().any(|p| p.ckpt.id == 3 && p.tensor.as_deref() == Some(&b"head"[..])));
    let e = store.read(b"c/3").unwrap_err();
    assert!(e.is_corruption() && e.to_string().contains("bad magic"), "{e}");
    // Reopened, the pack's scan stops at that record: the pack is left as it
    // is (units are missing), reported, and the missing unit is an I/O error.
    let damaged_len = std::fs::metadata(&opath).unwrap().len();
    drop(store);
    let store = CheckpointStore::open(d.path()).unwrap();
    assert!(store.repairs().iter().any(|r| r.contains(".fsk") && r.contains("left in place")), "{:?}", store.repairs());
    assert!(matches!(store.read(b"c/3"), Err(CkptError::Format(FormatError::Io { .. }))));
    assert_eq!(std::fs::metadata(&opath).unwrap().len(), damaged_len, "a pack with missing units is not truncated");
}

#[test]
fn a_corrupt_recipe_is_named_and_never_read_back() {
    let (d, mut store) = temp_store();
    let f = st(&[("w", &Rng(4).bytes(10_000))]);
    store.commit(b"r/a", &f).unwrap();
    let rpath = d.path().join("recipes").join(fanstore_ckpt::recipe::file_name(1));
    let len = std::fs::metadata(&rpath).unwrap().len();
    flip(&rpath, len - 10); // glue (the safetensors header)
    let e = store.read(b"r/a").unwrap_err().to_string();
    assert!(e.contains("recipe section glue"), "{e}");
    let v = store.verify(None).unwrap();
    assert_eq!(v.affected(), vec![1]);
    assert!(v.problems[0].problem.contains("recipe section glue"));
    // Reopening names the damaged file... only if the metadata is damaged.
    drop(store);
    assert!(CheckpointStore::open(d.path()).is_ok());
    flip(&rpath, 40);
    let e = CheckpointStore::open(d.path()).err().unwrap().to_string();
    assert!(e.contains(&format!("{:016x}.fsr", 1)) && e.contains("recipe header"), "{e}");
}

#[test]
fn renames_keep_owner_maps_and_replacements_free_units() {
    let (d, mut store) = temp_store();
    let mut rng = Rng(8);
    let (a, b, c) = (rng.bytes(4000), rng.bytes(4000), rng.bytes(4000));
    store.commit(b"run/tmp-1", &st(&[("a", &a), ("b", &b)])).unwrap();
    store.commit(b"run/tmp-2", &st(&[("a", &a), ("b", &c)])).unwrap();
    assert!(store.rename(b"run/tmp-1", b"run/epoch-1").unwrap().is_none());
    assert!(matches!(store.read(b"run/tmp-1"), Err(CkptError::NotFound { .. })));
    let o = store.owners(b"run/tmp-2").unwrap();
    assert_eq!(o.rows[0].owner.path, b"run/epoch-1");
    assert_eq!(store.log(b"run/tmp-2").unwrap().chain[0].ckpt.path, b"run/epoch-1");
    // Rename over an existing checkpoint replaces it; its own unit (b=c) is freed.
    let units_before = store.du().units;
    let freed = store.rename(b"run/tmp-2", b"run/epoch-1").unwrap().unwrap();
    assert_eq!((freed.id, freed.units_freed, freed.bytes_freed), (1, 1, 4000));
    assert_eq!(store.du().units, units_before - 1);
    assert_eq!(store.read(b"run/epoch-1").unwrap(), st(&[("a", &a), ("b", &c)]));
    // Committing over a path replaces too.
    let f3 = st(&[("a", &a)]);
    let info = store.commit(b"run/epoch-1", &f3).unwrap();
    assert_eq!((info.replaced, info.parent), (Some(2), Some(2)));
    assert_eq!(store.du().units, 1);
    assert_eq!(store.du().physical(), bytes_on_disk(d.path()));
    // Renamed and replaced state survives a reopen.
    drop(store);
    let store = CheckpointStore::open(d.path()).unwrap();
    assert_eq!(store.read(b"run/epoch-1").unwrap(), f3);
    assert_eq!(store.ls(b"").rows.len(), 1);
    assert_eq!(store.entries().len(), 3);
}

#[test]
fn crash_leftovers_are_swept_at_open() {
    let d = tempfile::tempdir().unwrap();
    let f = st(&[("w", &Rng(2).bytes(20_000))]);
    {
        let mut store = CheckpointStore::open(d.path()).unwrap();
        store.commit(b"a", &f).unwrap();
    }
    let clean = bytes_on_disk(d.path());
    // What a crash between unit/recipe writes and the catalog leaves behind.
    let orphan = unit::hash(b"orphan");
    let op = unit::path(&d.path().join("units"), &orphan);
    unit::write(&op, &unit::UnitHeader::raw(6, orphan, 0), b"orphan").unwrap();
    std::fs::write(d.path().join("recipes").join(fanstore_ckpt::recipe::file_name(2)), b"half a recipe").unwrap();
    std::fs::write(d.path().join("tmp/77.tmp"), b"partial").unwrap();
    // ... and a torn append: half a record at the end of the pack.
    let pack = d.path().join("units").join(fanstore_ckpt::pack::file_name(1));
    let pack_len = std::fs::metadata(&pack).unwrap().len();
    let torn = unit::UnitHeader::raw(1000, orphan, 0).encode();
    let mut pf = std::fs::OpenOptions::new().append(true).open(&pack).unwrap();
    std::io::Write::write_all(&mut pf, &torn[..]).unwrap();
    std::io::Write::write_all(&mut pf, &[7u8; 300]).unwrap();
    drop(pf);
    assert!(bytes_on_disk(d.path()) > clean);
    let store = CheckpointStore::open(d.path()).unwrap();
    assert_eq!(std::fs::metadata(&pack).unwrap().len(), pack_len, "the torn record is truncated away");
    assert!(store.repairs().iter().any(|r| r.contains("torn append")), "{:?}", store.repairs());
    assert_eq!(bytes_on_disk(d.path()), clean);
    assert!(!op.exists());
    assert_eq!(store.read(b"a").unwrap(), f);
    assert_eq!(store.du().physical(), clean);
}

#[test]
fn the_store_is_locked_and_a_damaged_catalog_is_refused() {
    let (d, mut store) = temp_store();
    store.commit(b"x", b"some opaque bytes").unwrap();
    assert!(matches!(CheckpointStore::open(d.path()), Err(CkptError::Locked { .. })));
    drop(store);
    let cat = d.path().join("catalog.fsc");
    flip(&cat, 80);
    let e = CheckpointStore::open(d.path()).err().unwrap().to_string();
    assert!(e.contains("catalog.fsc") && e.contains("catalog entries"), "{e}");
    std::fs::remove_file(&cat).unwrap();
    let e = CheckpointStore::open(d.path()).err().unwrap().to_string();
    assert!(e.contains("missing, but the store holds recipes"), "{e}");
}

#[test]
fn reports_render_valid_json_and_tables() {
    let (d, mut store) = temp_store();
    let mut rng = Rng(6);
    let w = rng.bytes(3000);
    let odd = "odd \"name\"\\\n\u{1}é";
    store.commit(b"q/one \"1\"", &st(&[("w", &w), (odd, &rng.bytes(10))])).unwrap();
    store.commit(b"q/two", &st(&[("w", &w), ("new", &rng.bytes(10))])).unwrap();
    let parse = |s: String| {
        let v = json::parse(s.as_bytes(), Limits::default()).unwrap_or_else(|e| panic!("{e}: {s}"));
        format!("{v:?}")
    };
    let ls = store.ls(b"q/");
    let j = parse(ls.to_json());
    assert!(j.contains("q/one \\\"1\\\"") || j.contains("q/one \"1\""), "{j}");
    parse(store.log(b"q/two").unwrap().to_json());
    let o = store.owners(b"q/one \"1\"").unwrap();
    let oj_text = o.to_json();
    let oj = json::parse(oj_text.as_bytes(), Limits::default()).unwrap();
    let names: Vec<_> = oj.get("tensors").unwrap().as_array().unwrap().iter().map(|t| t.get("name").unwrap().as_str().unwrap().to_string()).collect();
    assert!(names.contains(&odd.to_string()), "{names:?}");
    let diff = store.diff(b"q/one \"1\"", b"q/two").unwrap();
    let dj_text = diff.to_json();
    let dj = json::parse(dj_text.as_bytes(), Limits::default()).unwrap();
    let totals = dj.get("totals").unwrap();
    assert_eq!(totals.get("unchanged").unwrap().get("bytes").unwrap().as_u64(), Some(3000));
    assert_eq!(totals.get("added").unwrap().get("tensors").unwrap().as_u64(), Some(1));
    assert_eq!(totals.get("removed").unwrap().get("tensors").unwrap().as_u64(), Some(1));
    let du_text = store.du().to_json();
    let du = json::parse(du_text.as_bytes(), Limits::default()).unwrap();
    assert_eq!(du.get("physical_bytes").unwrap().as_u64(), Some(bytes_on_disk(d.path())));
    parse(store.verify(None).unwrap().to_json());
    for t in [ls.to_table(), store.log(b"q/two").unwrap().to_table(), o.to_table(), diff.to_table(), store.du().to_table()] {
        assert!(t.lines().count() >= 2, "{t}");
    }
    assert!(diff.to_table().contains("added") && diff.to_table().contains("new"));
}

#[test]
fn commit_file_maps_sealed_memfds_and_reads_other_files() {
    use std::io::{Seek, SeekFrom, Write};
    use std::os::fd::FromRawFd;
    let d = tempfile::tempdir().unwrap();
    let mut store = CheckpointStore::open(&d.path().join("s")).unwrap();
    let f = st(&[("w", &Rng(12).bytes(300_000))]);
    // A sealed memfd, as the daemon holds a closed output.
    // SAFETY: memfd_create with a valid C string; the fd is owned by the File below.
    let fd = unsafe { libc::memfd_create(c"ckpt".as_ptr(), libc::MFD_ALLOW_SEALING) };
    assert!(fd >= 0);
    // SAFETY: fd is a fresh descriptor that nothing else owns.
    let mut m = unsafe { std::fs::File::from_raw_fd(fd) };
    m.write_all(&f).unwrap();
    // SAFETY: fcntl on our own descriptor.
    let r = unsafe { libc::fcntl(fd, libc::F_ADD_SEALS, libc::F_SEAL_WRITE | libc::F_SEAL_SHRINK | libc::F_SEAL_GROW) };
    assert_eq!(r, 0);
    let info = store.commit_file(b"m/sealed", &m).unwrap();
    assert_eq!(info.format, fanstore_ckpt::Format::Safetensors);
    assert_eq!(store.read(b"m/sealed").unwrap(), f);
    // A plain file whose offset is elsewhere: read from 0, offset untouched.
    let p = d.path().join("plain");
    let mut plain = std::fs::File::options().create(true).truncate(true).read(true).write(true).open(&p).unwrap();
    plain.write_all(&f).unwrap();
    plain.seek(SeekFrom::Start(7)).unwrap();
    store.commit_file(b"m/plain", &plain).unwrap();
    assert_eq!(plain.stream_position().unwrap(), 7);
    assert_eq!(store.read(b"m/plain").unwrap(), f);
    let empty = std::fs::File::options().create(true).truncate(true).read(true).write(true).open(d.path().join("empty")).unwrap();
    assert_eq!(store.commit_file(b"m/empty", &empty).unwrap().logical, 0);
}

#[test]
fn the_store_can_be_shared_across_threads() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<CheckpointStore>();
    let (_d, mut store) = temp_store();
    let files: Vec<Vec<u8>> = (0..4).map(|i| st(&[("w", &Rng(40 + i).bytes(50_000))])).collect();
    for (i, f) in files.iter().enumerate() {
        store.commit(format!("t/{i}").as_bytes(), f).unwrap();
    }
    // Reads take &self: concurrent readers (the daemon holds the store in an RwLock).
    let store = std::sync::RwLock::new(store);
    std::thread::scope(|s| {
        for (i, f) in files.iter().enumerate() {
            let store = &store;
            s.spawn(move || {
                for _ in 0..20 {
                    assert!(store.read().unwrap().read(format!("t/{i}").as_bytes()).unwrap() == *f);
                }
            });
        }
    });
}
