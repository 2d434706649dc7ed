//! Extents: a committed file of new incompressible units adopted whole
//! (hard-linked, not copied), and what becomes of it: reads, reopen,
//! damage, a crash before the commit point, unlinks, compaction, and a
//! crash in the middle of that compaction.

mod common;

use common::*;
use fanstore_ckpt::{extent, pack, CheckpointStore, StoreOptions};
use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// A new temporary directory holding a store (`store/`) and the files
/// committed into it (`files/`) on one file system, so that the store can
/// link them; the directory is removed when the returned guard drops.
fn store_and_files() -> (tempfile::TempDir, PathBuf, PathBuf, CheckpointStore) {
    let d = tempfile::tempdir().unwrap();
    let (sdir, files) = (d.path().join("store"), d.path().join("files"));
    let store = CheckpointStore::open(&sdir).unwrap();
    (d, sdir, files, store)
}

/// A safetensors file of `n` random U8 tensors of 1 MiB, the first `shared`
/// of them from `shared_seed` (equal across files with the same seed).
fn file(rng: &mut Rng, shared_seed: u64, shared: usize, n: usize) -> Vec<u8> {
    let mut s = Rng(shared_seed);
    let ts: Vec<T> = (0..n)
        .map(|i| {
            let data = if i < shared { s.bytes(1 << 20) } else { rng.bytes(1 << 20) };
            t(&format!("w{i}"), "U8", &[1 << 20], data)
        })
        .collect();
    safetensors(&ts, StOpts::default())
}

/// Writes `bytes` to a file in `dir` (the store's file system) and commits
/// it through [`CheckpointStore::commit_adopting`], as the daemon does with
/// a program's closed output. Returns the file's path.
fn commit_file(store: &mut CheckpointStore, dir: &Path, path: &str, bytes: &[u8]) -> (PathBuf, fanstore_ckpt::store::CommitInfo) {
    commit_file_named(store, dir, path, bytes, true)
}

/// [`commit_file`]; with `named` false, the file's name is removed before
/// the commit (a program removed the output before the daemon's queued
/// commit ran).
fn commit_file_named(store: &mut CheckpointStore, dir: &Path, path: &str, bytes: &[u8], named: bool) -> (PathBuf, fanstore_ckpt::store::CommitInfo) {
    std::fs::create_dir_all(dir).unwrap();
    let p = dir.join(path);
    std::fs::write(&p, bytes).unwrap();
    let f = std::fs::File::open(&p).unwrap();
    if !named {
        std::fs::remove_file(&p).unwrap();
    }
    // SAFETY (test): nothing writes the file while it is mapped.
    let map = Arc::new(unsafe { memmap2::Mmap::map(&f) }.unwrap());
    let info = store.commit_adopting(path.as_bytes(), map, &f, None).unwrap();
    (p, info)
}

fn extents(store_dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(store_dir.join("units"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().and_then(|n| n.to_str()).and_then(extent::parse_name).is_some())
        .collect();
    v.sort();
    v
}

fn pack_bytes(store_dir: &Path) -> u64 {
    std::fs::read_dir(store_dir.join("units"))
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_name().to_str().and_then(pack::parse_name).is_some())
        .map(|e| e.metadata().unwrap().len())
        .sum()
}

fn check_all(store: &CheckpointStore, model: &BTreeMap<String, Vec<u8>>, what: &str) {
    for (p, f) in model {
        let got = store.read(p.as_bytes()).unwrap_or_else(|e| panic!("{what}: {p}: {e}"));
        assert!(got == *f, "{what}: {p} reads back different bytes");
    }
}

/// Closes `store`, opens the store at `sdir` again, and checks that every
/// file of `model` reads back and that the store verifies clean.
fn reopen_and_check_all(store: CheckpointStore, sdir: &Path, model: &BTreeMap<String, Vec<u8>>) {
    drop(store);
    let store = CheckpointStore::open(sdir).unwrap();
    check_all(&store, model, "reopened");
    assert!(store.verify(None).unwrap().ok());
}

#[test]
fn an_incompressible_file_is_adopted_not_copied_and_reads_back_after_reopen() {
    let (_d, sdir, files, mut store) = store_and_files();
    let mut rng = Rng(1);
    let f1 = file(&mut rng, 100, 0, 12);
    let (p1, info) = commit_file(&mut store, &files, "a", &f1);
    assert_eq!((info.units_new, info.units_total), (12, 12), "{info:?}");
    let xs = extents(&sdir);
    assert_eq!(xs.len(), 1, "one extent: {xs:?}");
    assert_eq!(std::fs::metadata(&xs[0]).unwrap().ino(), std::fs::metadata(&p1).unwrap().ino(), "linked, not copied");
    assert!(pack_bytes(&sdir) < 64 << 10, "records only in the packs: {} B", pack_bytes(&sdir));
    let du = store.du();
    assert!(du.physical() >= f1.len() as u64 && (du.physical() as f64) < f1.len() as f64 * 1.01, "{du:?}");
    assert_eq!(du.hot, 0, "the hot copy is the extent, counted once: {du:?}");
    assert_eq!(store.read(b"a").unwrap(), f1);
    // The program's own name goes (the daemon unlinks its plain copy): the extent stays.
    std::fs::remove_file(&p1).unwrap();
    drop(store);
    let store = CheckpointStore::open(&sdir).unwrap();
    assert_eq!(store.read(b"a").unwrap(), f1, "after reopen, from the extent");
    assert!(store.verify(None).unwrap().ok());
    assert_eq!(extents(&sdir).len(), 1);
}

#[test]
fn a_file_removed_before_its_commit_is_copied_and_later_files_are_still_adopted() {
    let (_d, sdir, files, mut store) = store_and_files();
    let mut rng = Rng(5);
    // As when a program removes an output before the daemon's queued commit runs:
    // the file is open but has no name left, so it cannot be linked.
    let gone = file(&mut rng, 100, 0, 12);
    commit_file_named(&mut store, &files, "gone", &gone, false);
    assert!(extents(&sdir).is_empty(), "nothing to link");
    assert_eq!(store.read(b"gone").unwrap(), gone, "copied");
    assert!(store.repairs().is_empty(), "not a fault of the store: {:?}", store.repairs());
    let next = file(&mut rng, 101, 0, 12);
    let (p2, _) = commit_file(&mut store, &files, "next", &next);
    let xs = extents(&sdir);
    assert_eq!(xs.len(), 1, "the next file is adopted: {xs:?}");
    assert_eq!(std::fs::metadata(&xs[0]).unwrap().ino(), std::fs::metadata(&p2).unwrap().ino());
    assert_eq!(store.read(b"next").unwrap(), next);
}

#[test]
fn files_that_share_or_compress_are_copied_as_before() {
    let (_d, sdir, files, mut store) = store_and_files();
    let mut rng = Rng(2);
    let f1 = file(&mut rng, 7, 10, 10);
    commit_file(&mut store, &files, "a", &f1);
    assert_eq!(extents(&sdir).len(), 1);
    // Half of it shared with "a": too little new to adopt.
    let f2 = file(&mut rng, 7, 5, 10);
    commit_file(&mut store, &files, "b", &f2);
    assert_eq!(extents(&sdir).len(), 1, "b is mostly units of a");
    // Floats that compress: every unit is new, but they are stored grouped,
    // so the extent adopted first is given up and nothing points into it.
    let mut fr = Rng(3);
    let floats: Vec<u8> = (0..(12 << 20) / 4).flat_map(|_| ((fr.below(1000) as f32) * 1e-3).to_le_bytes()).collect();
    let f3 = safetensors(&[t("w", "F32", &[(floats.len() / 4) as u64], floats)], StOpts::default());
    let (_, info) = commit_file(&mut store, &files, "c", &f3);
    assert_eq!(info.units_grouped, 1, "{info:?}");
    assert_eq!(extents(&sdir).len(), 1, "c is not adopted");
    let model: BTreeMap<String, Vec<u8>> = [("a", f1), ("b", f2), ("c", f3)].into_iter().map(|(k, v)| (k.to_string(), v)).collect();
    check_all(&store, &model, "live");
    assert_eq!(store.du().hot, (model["b"].len() + model["c"].len()) as u64, "the two newest, neither adopted, are hot copies beside the store");
    reopen_and_check_all(store, &sdir, &model);
}

#[test]
fn a_damaged_or_missing_extent_is_an_error_naming_it() {
    let (_d, sdir, files, mut store) = store_and_files();
    let f1 = file(&mut Rng(4), 0, 0, 10);
    let (p1, _) = commit_file(&mut store, &files, "a", &f1);
    drop(store);
    std::fs::remove_file(&p1).unwrap();
    let x = extents(&sdir).remove(0);
    let flip = |at: u64| {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().read(true).write(true).open(&x).unwrap();
        let mut b = [0u8];
        f.read_exact_at(&mut b, at).unwrap();
        f.write_all_at(&[b[0] ^ 0x40], at).unwrap();
    };
    flip(5 << 20);
    let store = CheckpointStore::open(&sdir).unwrap();
    let e = store.read(b"a").unwrap_err().to_string();
    assert!(e.contains(".fsx") && e.contains("external payload"), "{e}");
    let v = store.verify(None).unwrap();
    assert!(!v.ok(), "verify finds it");
    drop(store);
    flip(5 << 20);
    let store = CheckpointStore::open(&sdir).unwrap();
    assert_eq!(store.read(b"a").unwrap(), f1, "restored");
    drop(store);
    let hidden = x.with_extension("moved");
    std::fs::rename(&x, &hidden).unwrap();
    let store = CheckpointStore::open(&sdir).unwrap();
    let e = store.read(b"a").unwrap_err().to_string();
    assert!(e.contains("missing") && e.contains(x.file_name().unwrap().to_str().unwrap()), "{e}");
}

#[test]
fn a_crash_before_the_catalog_leaves_no_extent_behind() {
    let (_d, sdir, files, mut store) = store_and_files();
    let f1 = file(&mut Rng(5), 0, 0, 10);
    commit_file(&mut store, &files, "a", &f1);
    let catalog = std::fs::read(sdir.join("catalog.fsc")).unwrap();
    let f2 = file(&mut Rng(6), 0, 0, 10);
    commit_file(&mut store, &files, "b", &f2);
    assert_eq!(extents(&sdir).len(), 2);
    drop(store);
    // As if the crash came after b's extent and records, before its catalog.
    std::fs::write(sdir.join("catalog.fsc"), &catalog).unwrap();
    let store = CheckpointStore::open(&sdir).unwrap();
    assert_eq!(extents(&sdir).len(), 1, "b's extent, which nothing committed refers to, is gone");
    assert_eq!(store.read(b"a").unwrap(), f1);
    assert!(store.read(b"b").is_err());
    assert!(store.verify(None).unwrap().ok());
}

/// A step of a compaction and the directory copied there, with what was live.
type Snapshot = (String, PathBuf, BTreeMap<String, Vec<u8>>);

#[test]
fn unlinks_free_extents_and_compaction_keeps_what_others_share_even_across_a_crash() {
    let d = tempfile::tempdir().unwrap();
    let snaps_dir = tempfile::tempdir().unwrap();
    let (sdir, files) = (d.path().join("store"), d.path().join("files"));
    let mut store = CheckpointStore::open_with(&sdir, StoreOptions { compact_below_percent: 50, ..StoreOptions::default() }).unwrap();
    let taken: Arc<Mutex<Vec<(String, PathBuf)>>> = Arc::new(Mutex::new(Vec::new()));
    {
        let (taken, dir, root) = (taken.clone(), sdir.clone(), snaps_dir.path().to_path_buf());
        let n = Mutex::new(0usize);
        store.set_compaction_hook(Some(Box::new(move |step: &str| {
            let mut n = n.lock().unwrap();
            *n += 1;
            let to = root.join(format!("{n}"));
            copy_dir(&dir, &to);
            taken.lock().unwrap().push((step.to_string(), to));
        })));
    }
    let mut model = BTreeMap::new();
    // a: 10 new tensors (adopted). b: 2 of a's, 8 new (< 90% new: copied).
    // c: all new (adopted). Unlinking c frees its whole extent; unlinking a
    // leaves 2 MiB of its 10 live (b's), which compaction copies to a pack.
    let fa = file(&mut Rng(10), 42, 0, 10);
    let mut shared = Rng(10);
    let fb = {
        let mut ts: Vec<T> = (0..2).map(|i| t(&format!("w{i}"), "U8", &[1 << 20], shared.bytes(1 << 20))).collect();
        let mut r = Rng(11);
        ts.extend((2..10).map(|i| t(&format!("w{i}"), "U8", &[1 << 20], r.bytes(1 << 20))));
        safetensors(&ts, StOpts::default())
    };
    let fc = file(&mut Rng(12), 0, 0, 10);
    for (k, f) in [("a", &fa), ("b", &fb), ("c", &fc)] {
        let (p, _) = commit_file(&mut store, &files, k, f);
        std::fs::remove_file(p).unwrap();
        model.insert(k.to_string(), f.clone());
    }
    assert_eq!(extents(&sdir).len(), 2, "a and c adopted, b copied");
    store.unlink(b"c").unwrap();
    model.remove("c");
    assert_eq!(extents(&sdir).len(), 1, "c's extent freed whole");
    let mut snaps: Vec<Snapshot> = Vec::new();
    for (step, dir) in taken.lock().unwrap().drain(..) {
        snaps.push((step, dir, model.clone()));
    }
    let packs_before = pack_bytes(&sdir);
    store.unlink(b"a").unwrap();
    model.remove("a");
    for (step, dir) in taken.lock().unwrap().drain(..) {
        snaps.push((step, dir, model.clone()));
    }
    assert!(extents(&sdir).is_empty(), "a's extent compacted away: {:?}", extents(&sdir));
    assert!(pack_bytes(&sdir) >= packs_before + (2 << 20), "b's two shared tensors copied into a pack");
    check_all(&store, &model, "after compaction");
    let steps: Vec<&str> = snaps.iter().map(|s| s.0.as_str()).collect();
    for want in ["record copied", "copies synced", "extent removed"] {
        assert!(steps.contains(&want), "no compaction reached {want}: {steps:?}");
    }
    for (step, dir, live) in &snaps {
        let mut s = CheckpointStore::open(dir).unwrap_or_else(|e| panic!("{step}: {e}"));
        check_all(&s, live, step);
        assert!(s.verify(None).unwrap().ok(), "{step}");
        for p in live.keys() {
            s.unlink(p.as_bytes()).unwrap();
        }
        assert_eq!(s.du().units, 0, "{step}");
        assert!(extents(dir).is_empty(), "{step}: nothing live, no extent left");
    }
    reopen_and_check_all(store, &sdir, &model);
}

#[test]
fn a_file_on_another_file_system_is_copied_and_reported_once() {
    let d = tempfile::tempdir().unwrap();
    let shm = tempfile::tempdir_in("/dev/shm").unwrap();
    assert_ne!(
        std::fs::metadata(d.path()).unwrap().dev(),
        std::fs::metadata(shm.path()).unwrap().dev(),
        "the test needs two file systems"
    );
    let sdir = d.path().join("store");
    let mut store = CheckpointStore::open(&sdir).unwrap();
    let f1 = file(&mut Rng(30), 0, 0, 10);
    let f2 = file(&mut Rng(31), 0, 0, 10);
    commit_file(&mut store, shm.path(), "a", &f1);
    commit_file(&mut store, shm.path(), "b", &f2);
    assert!(extents(&sdir).is_empty());
    assert!(pack_bytes(&sdir) >= (f1.len() + f2.len()) as u64 - (64 << 10), "copied into packs");
    let lines: Vec<&String> = store.repairs().iter().filter(|r| r.contains("adopting")).collect();
    assert_eq!(lines.len(), 1, "{:?}", store.repairs());
    assert!(lines[0].contains(".fsx"), "{lines:?}");
    assert_eq!(store.read(b"a").unwrap(), f1);
    assert_eq!(store.read(b"b").unwrap(), f2);
}
