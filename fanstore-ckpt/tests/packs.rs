//! Pack files in a store: compaction while several threads commit and
//! unlink, what a crash in the middle of a compaction leaves (everything
//! committed reads back), and stores written before packs (one unit file
//! per unit) still load and keep deduplicating.

mod common;

use common::*;
use fanstore_ckpt::{pack, unit, CheckpointStore, StoreOptions};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

fn small_packs() -> StoreOptions {
    StoreOptions { pack_size: 64 << 10, compact_below_percent: 50, ..StoreOptions::default() }
}

/// A safetensors file of `n` random U8 tensors of 4-12 KiB, with one
/// tensor shared by every file of the same `family` (dedup across files).
fn file(rng: &mut Rng, family: u64, n: usize) -> Vec<u8> {
    let shared = Rng(family + 1).bytes(6000);
    let mut ts = vec![t("shared", "U8", &[shared.len() as u64], shared)];
    for i in 0..n {
        let len = 4096 + rng.below(8192) as usize;
        ts.push(t(&format!("w{i}"), "U8", &[len as u64], rng.bytes(len)));
    }
    safetensors(&ts, StOpts::default())
}

/// (pack files, the highest sequence number).
fn packs_on_disk(dir: &Path) -> (usize, u64) {
    let seqs: Vec<u64> =
        std::fs::read_dir(dir.join("units")).unwrap().filter_map(|e| pack::parse_name(e.unwrap().file_name().to_str().unwrap())).collect();
    (seqs.len(), seqs.iter().copied().max().unwrap_or(0))
}

fn check_all(store: &CheckpointStore, model: &BTreeMap<String, Vec<u8>>, what: &str) {
    for (p, f) in model {
        assert!(store.read(p.as_bytes()).unwrap() == *f, "{what}: {p} reads back different bytes");
    }
}

#[test]
fn compaction_under_concurrent_commits_keeps_every_checkpoint() {
    let d = tempfile::tempdir().unwrap();
    let store = Arc::new(Mutex::new(CheckpointStore::open_with(d.path(), small_packs()).unwrap()));
    let threads: Vec<_> = (0..4u64)
        .map(|k| {
            let store = store.clone();
            std::thread::spawn(move || {
                let mut rng = Rng(100 + k);
                let mut mine: BTreeMap<String, Vec<u8>> = BTreeMap::new();
                let mut n = 0;
                for _ in 0..40 {
                    let mut s = store.lock().unwrap();
                    if mine.len() > 3 || (rng.below(4) == 0 && !mine.is_empty()) {
                        // keep-last-k, and now and then an arbitrary one
                        let p = if rng.below(2) == 0 {
                            mine.keys().next().unwrap().clone()
                        } else {
                            mine.keys().nth(rng.below(mine.len() as u64) as usize).unwrap().clone()
                        };
                        s.unlink(p.as_bytes()).unwrap();
                        mine.remove(&p);
                    } else {
                        n += 1;
                        let p = format!("t{k}/c{n:03}");
                        let n_tensors = 2 + rng.below(4) as usize;
                        let f = file(&mut rng, k % 2, n_tensors);
                        s.commit(p.as_bytes(), &f).unwrap();
                        mine.insert(p, f);
                    }
                    check_all(&s, &mine, &format!("thread {k}"));
                    drop(s);
                    std::thread::yield_now();
                }
                mine
            })
        })
        .collect();
    let mut model = BTreeMap::new();
    for h in threads {
        model.extend(h.join().unwrap());
    }
    let store = Arc::try_unwrap(store).ok().unwrap().into_inner().unwrap();
    check_all(&store, &model, "after the threads");
    assert!(store.verify(None).unwrap().ok());
    let (files, highest) = packs_on_disk(d.path());
    assert!(highest > files as u64 + 5, "compaction removed packs: {files} files, highest {highest}");
    let du = store.du();
    assert_eq!(du.physical(), bytes_on_disk(d.path()), "du counts every byte: {du:?}");
    drop(store);
    let store = CheckpointStore::open_with(d.path(), small_packs()).unwrap();
    assert!(store.repairs().is_empty(), "{:?}", store.repairs());
    check_all(&store, &model, "reopened");
}

/// Snapshots of the store directory taken inside a compaction, with the
/// checkpoints that were live then.
struct Snapshots {
    taken: Arc<Mutex<Vec<(String, PathBuf)>>>,
    done: Vec<(String, PathBuf, BTreeMap<String, Vec<u8>>)>,
}

#[test]
fn a_crash_during_compaction_loses_nothing_committed() {
    let d = tempfile::tempdir().unwrap();
    let snaps_dir = tempfile::tempdir().unwrap();
    let mut store = CheckpointStore::open_with(d.path(), small_packs()).unwrap();
    let mut snaps = Snapshots { taken: Arc::new(Mutex::new(Vec::new())), done: Vec::new() };
    {
        let (taken, dir, root) = (snaps.taken.clone(), d.path().to_path_buf(), snaps_dir.path().to_path_buf());
        let seen: Mutex<BTreeMap<String, usize>> = Mutex::new(BTreeMap::new());
        store.set_compaction_hook(Some(Box::new(move |step: &str| {
            // The first two times each step is reached, and a few more mid-copy states.
            let mut seen = seen.lock().unwrap();
            let total: usize = seen.values().sum();
            let n = seen.entry(step.to_string()).or_default();
            if *n < if step == "record copied" { 4 } else { 2 } {
                *n += 1;
                let to = root.join(format!("{total}"));
                copy_dir(&dir, &to);
                taken.lock().unwrap().push((step.to_string(), to));
            }
        })));
    }
    let mut rng = Rng(7);
    let mut model = BTreeMap::new();
    for k in 0..16 {
        let p = format!("c{k:02}");
        let f = file(&mut rng, 0, 3);
        store.commit(p.as_bytes(), &f).unwrap();
        model.insert(p, f);
    }
    for k in (0..16).step_by(2) {
        let p = format!("c{k:02}");
        store.unlink(p.as_bytes()).unwrap();
        model.remove(&p);
        for (step, dir) in snaps.taken.lock().unwrap().drain(..) {
            snaps.done.push((step, dir, model.clone()));
        }
    }
    check_all(&store, &model, "the store itself");
    let steps: Vec<&str> = snaps.done.iter().map(|s| s.0.as_str()).collect();
    for want in ["record copied", "copies synced", "pack removed"] {
        assert!(steps.contains(&want), "no compaction reached {want}: {steps:?}");
    }
    let mut duplicated = 0;
    for (step, dir, live) in &snaps.done {
        let records: usize = std::fs::read_dir(dir.join("units"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "fsk"))
            .map(|p| pack::scan(&p).unwrap().records.len())
            .sum();
        let mut s = CheckpointStore::open_with(dir, small_packs()).unwrap_or_else(|e| panic!("{step}: {e}"));
        check_all(&s, live, step);
        assert!(s.verify(None).unwrap().ok(), "{step}");
        if records > s.du().units as usize {
            duplicated += 1;
        }
        // The store goes on: everything unlinked, nothing is left alive.
        for p in live.keys() {
            s.unlink(p.as_bytes()).unwrap();
        }
        assert_eq!(s.du().units, 0, "{step}");
    }
    assert!(duplicated > 0, "some snapshot held two records of a unit (copied, old pack not yet deleted)");
}

#[test]
fn a_damaged_compaction_copy_is_passed_over_for_the_original() {
    let d = tempfile::tempdir().unwrap();
    let snap = tempfile::tempdir().unwrap();
    let mut store = CheckpointStore::open_with(d.path(), small_packs()).unwrap();
    let (dir, to) = (d.path().to_path_buf(), snap.path().join("s"));
    let once = Arc::new(Mutex::new(false));
    let o = once.clone();
    store.set_compaction_hook(Some(Box::new(move |step: &str| {
        let mut done = o.lock().unwrap();
        if step == "copies synced" && !*done {
            copy_dir(&dir, &to);
            *done = true;
        }
    })));
    let mut rng = Rng(9);
    let mut model = BTreeMap::new();
    for k in 0..10 {
        let f = file(&mut rng, 3, 3);
        store.commit(format!("c{k}").as_bytes(), &f).unwrap();
        model.insert(format!("c{k}"), f);
    }
    let mut k = 0;
    while !*once.lock().unwrap() {
        store.unlink(format!("c{k}").as_bytes()).unwrap();
        model.remove(&format!("c{k}"));
        k += 1;
    }
    // In the snapshot, damage the body of every record in the newest pack
    // (the copies): open must take the older, intact records.
    let s = snap.path().join("s");
    let (_, highest) = packs_on_disk(&s);
    let newest = s.join("units").join(pack::file_name(highest));
    let scan = pack::scan(&newest).unwrap();
    let mut b = std::fs::read(&newest).unwrap();
    for r in &scan.records {
        b[(r.end() - 1) as usize] ^= 0x55;
    }
    std::fs::write(&newest, b).unwrap();
    let s = CheckpointStore::open_with(&s, small_packs()).unwrap();
    // Units whose only record is in the newest pack are damaged in every
    // copy; the ones compaction copied have an intact original.
    let mut intact = 0;
    for (p, f) in &model {
        match s.read(p.as_bytes()) {
            Ok(got) => {
                assert!(got == *f, "{p}: never wrong bytes");
                intact += 1;
            }
            Err(e) => assert!(e.is_corruption(), "{p}: {e}"),
        }
    }
    assert!(intact > 0, "the originals were chosen over the damaged copies");
    let copied: Vec<_> = scan.records.iter().filter(|r| s.unit_location(&r.head.blake3).is_some_and(|l| l.0 != newest)).collect();
    assert!(!copied.is_empty(), "some unit was located in its old pack");
}

#[test]
fn stores_written_with_one_file_per_unit_still_load() {
    let d = tempfile::tempdir().unwrap();
    let mut rng = Rng(21);
    let mut model = BTreeMap::new();
    {
        let mut store = CheckpointStore::open(d.path()).unwrap();
        for k in 0..4 {
            let f = file(&mut rng, 5, 3);
            store.commit(format!("old/{k}").as_bytes(), &f).unwrap();
            model.insert(format!("old/{k}"), f);
        }
    }
    // Rewrite the packs as an earlier build stored units: a record is
    // exactly a unit file's image.
    let units = d.path().join("units");
    for e in std::fs::read_dir(&units).unwrap() {
        let p = e.unwrap().path();
        let b = std::fs::read(&p).unwrap();
        for r in pack::scan(&p).unwrap().records {
            std::fs::write(unit::path(&units, &r.head.blake3), &b[r.off as usize..r.end() as usize]).unwrap();
        }
        std::fs::remove_file(&p).unwrap();
    }
    let fsu = |h: &unit::Hash| unit::path(&units, h);
    let mut store = CheckpointStore::open(d.path()).unwrap();
    check_all(&store, &model, "legacy");
    assert!(store.verify(None).unwrap().ok());
    // New commits deduplicate against the unit files and go to a pack.
    let shared = unit::hash(&Rng(6).bytes(6000));
    assert!(fsu(&shared).exists());
    let f = file(&mut rng, 5, 2);
    let info = store.commit(b"new/0", &f).unwrap();
    assert_eq!(info.units_new, 2, "the shared tensor is the old unit file's");
    model.insert("new/0".into(), f);
    assert!(store.unit_location(&shared).unwrap().0.extension().is_some_and(|x| x == "fsu"));
    // Unlinking frees unit files as before.
    let gone: Vec<unit::Hash> = store.owners(b"old/0").unwrap().rows.iter().map(|r| r.hash).filter(|h| *h != shared).collect();
    store.unlink(b"old/0").unwrap();
    model.remove("old/0");
    assert!(gone.iter().all(|h| !fsu(h).exists()));
    drop(store);
    let store = CheckpointStore::open(d.path()).unwrap();
    check_all(&store, &model, "mixed, reopened");
    assert_eq!(store.du().physical(), bytes_on_disk(d.path()));
}

#[test]
fn deleting_gives_back_space_in_a_store_smaller_than_one_pack() {
    let (d, mut store) = temp_store();
    let mut rng = Rng(33);
    let mut last = None;
    for k in 0..12 {
        let f = safetensors(&[t("w", "U8", &[1 << 20], rng.bytes(1 << 20)), t("b", "U8", &[1 << 20], rng.bytes(1 << 20))], StOpts::default());
        store.commit(format!("c{k}").as_bytes(), &f).unwrap();
        if let Some(p) = last.replace(format!("c{k}")) {
            store.unlink(p.as_bytes()).unwrap();
        }
        let du = store.du();
        // keep-last-1 of 2 MiB checkpoints: the active pack is compacted
        // when less than half of it is live, so at most ~2x the live bytes stay.
        assert!(du.physical() < 2 * du.referenced + (2 << 20), "after c{k}: {du:?}");
        assert_eq!(du.physical(), bytes_on_disk(d.path()));
    }
    let (files, highest) = packs_on_disk(d.path());
    assert!(files <= 2 && highest > 3, "{files} packs, highest {highest}");
    assert_eq!(store.read(b"c11").unwrap().len() as u64, store.du().logical);
}

/// Not a check: how long open takes to scan the record headers of 10k
/// units (the reason packs need no index file). `cargo test --release
/// --test packs -- --ignored --nocapture`.
#[test]
#[ignore]
fn measure_open_with_10k_units() {
    let d = tempfile::tempdir().unwrap();
    let opts = StoreOptions::default();
    let mut n = 0;
    {
        let mut store = CheckpointStore::open_with(d.path(), opts).unwrap();
        let mut rng = Rng(1);
        for k in 0..4 {
            let ts: Vec<T> = (0..2500).map(|i| t(&format!("t{i}"), "U8", &[2048], rng.bytes(2048))).collect();
            n += store.commit(format!("b{k}").as_bytes(), &safetensors(&ts, StOpts::default())).unwrap().units_new;
        }
    }
    let t = std::time::Instant::now();
    let store = CheckpointStore::open_with(d.path(), opts).unwrap();
    let cold = t.elapsed();
    drop(store);
    let t = std::time::Instant::now();
    let store = CheckpointStore::open_with(d.path(), opts).unwrap();
    eprintln!("open with {n} units in {} packs: {:?} (first), {:?} (again)", store.du().packs, cold, t.elapsed());
}

#[test]
fn commits_written_by_several_threads_into_small_packs_read_back() {
    let d = tempfile::tempdir().unwrap();
    let opts = StoreOptions { threads: 2, pack_size: 4 << 20, compact_below_percent: 50, ..StoreOptions::default() };
    let mut store = CheckpointStore::open_with(d.path(), opts).unwrap();
    let mut rng = Rng(44);
    let mut model = BTreeMap::new();
    for k in 0..6 {
        // 48 tensors of 128 KiB: 6 MiB, enough for the helper threads.
        let ts: Vec<T> = (0..48).map(|i| t(&format!("w{i}"), "U8", &[128 << 10], rng.bytes(128 << 10))).collect();
        let f = safetensors(&ts, StOpts::default());
        store.commit(format!("c{k}").as_bytes(), &f).unwrap();
        model.insert(format!("c{k}"), f);
        if k == 0 {
            // Which thread stores which unit depends on scheduling (lanes are
            // checked in packs.rs); 6 MiB cannot fit one 4 MiB pack.
            let packs: std::collections::BTreeSet<PathBuf> =
                store.owners(b"c0").unwrap().rows.iter().map(|r| store.unit_location(&r.hash).unwrap().0).collect();
            assert!(packs.len() >= 2, "one commit's units went to {} packs: {packs:?}", packs.len());
        }
        if k >= 2 {
            let p = format!("c{}", k - 2);
            store.unlink(p.as_bytes()).unwrap();
            model.remove(&p);
        }
        check_all(&store, &model, &format!("after c{k}"));
    }
    drop(store);
    let store = CheckpointStore::open_with(d.path(), opts).unwrap();
    check_all(&store, &model, "reopened");
    assert!(store.verify(None).unwrap().ok());
    assert_eq!(store.du().physical(), bytes_on_disk(d.path()));
}

/// float32 bytes of `n` small weights, and the same with a few low bits changed.
fn weights_and_step(seed: u64, n: usize) -> (Vec<u8>, Vec<u8>) {
    let mut rng = Rng(seed);
    let w: Vec<f32> = (0..n).map(|_| (rng.below(1 << 20) as f32 / (1 << 20) as f32 - 0.5) * 0.04).collect();
    let a: Vec<u8> = w.iter().flat_map(|x| x.to_le_bytes()).collect();
    let mut b = a.clone();
    for k in (0..b.len()).step_by(4 * 7) {
        b[k] ^= 1;
    }
    (a, b)
}

#[test]
fn a_dead_record_whose_base_is_gone_is_not_chosen() {
    // Unit U is stored raw in pack 1; a pack with a higher sequence number
    // also holds a (dead) record of U, a delta against a base B no pack
    // holds any more: what an unlink and a commit on another writer lane can
    // leave. Open must take the raw record, whose chain resolves.
    let d = tempfile::tempdir().unwrap();
    let (b_bytes, u_bytes) = weights_and_step(5, 50_000);
    let f = safetensors(&[t("w", "F32", &[50_000], u_bytes.clone())], StOpts::default());
    {
        let mut store = CheckpointStore::open(d.path()).unwrap();
        assert_eq!(store.commit(b"c", &f).unwrap().units_delta, 0);
    }
    let (hu, hb) = (unit::hash(&u_bytes), unit::hash(&b_bytes));
    let (head, body) = unit::encode(&hu, fanstore_core::checksum::xxh3(&u_bytes), &u_bytes, 4, Some((&hb, 0, &b_bytes)));
    assert_eq!(head.base, Some(hb), "stored as a delta");
    use std::os::unix::fs::FileExt;
    let p = d.path().join("units").join(pack::file_name(9));
    let pf = pack::create(&p, &pack::PackHeader { seq: 9, nonce: 1 }).unwrap();
    pf.write_all_at(&head.encode(), pack::HEADER_LEN as u64).unwrap();
    pf.write_all_at(&body, (pack::HEADER_LEN + unit::HEADER_LEN) as u64).unwrap();
    drop(pf);
    let store = CheckpointStore::open(d.path()).unwrap();
    assert_eq!(store.read(b"c").unwrap(), f);
    assert!(!store.unit_location(&hu).unwrap().0.ends_with(pack::file_name(9)));
}

#[test]
fn a_pack_with_a_damaged_header_is_kept_and_new_units_go_to_a_new_pack() {
    let d = tempfile::tempdir().unwrap();
    let mut rng = Rng(61);
    let f1 = file(&mut rng, 8, 2);
    {
        let mut store = CheckpointStore::open(d.path()).unwrap();
        store.commit(b"a", &f1).unwrap();
    }
    let (n, highest) = packs_on_disk(d.path());
    assert_eq!(n, 1);
    let p = d.path().join("units").join(pack::file_name(highest));
    let mut b = std::fs::read(&p).unwrap();
    b[20] ^= 0xff; // the sequence number: the header checksum fails
    std::fs::write(&p, &b).unwrap();
    let mut store = CheckpointStore::open(d.path()).unwrap();
    assert!(store.repairs().iter().any(|r| r.contains("pack header") && r.contains("left in place")), "{:?}", store.repairs());
    assert!(store.read(b"a").is_err(), "its units are not found, never read wrong");
    // New commits still work (the damaged pack's number is not taken again).
    let f2 = file(&mut rng, 9, 2);
    store.commit(b"b", &f2).unwrap();
    assert_eq!(store.read(b"b").unwrap(), f2);
    assert_eq!(std::fs::read(&p).unwrap(), b, "the damaged pack is left as it was");
}

/// Bytes of every pack file of the store in `dir`, by name.
fn pack_lengths(dir: &Path) -> BTreeMap<String, u64> {
    std::fs::read_dir(dir.join("units"))
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| pack::parse_name(e.file_name().to_str().unwrap()).is_some())
        .map(|e| (e.file_name().to_string_lossy().into_owned(), e.metadata().unwrap().len()))
        .collect()
}

#[test]
fn a_failed_commit_gives_back_what_it_appended() {
    // A commit that fails after its units are in the packs (here: its recipe
    // cannot be put in place; on a node, a full local disk) must not keep
    // their bytes: a full disk would stay full for every later output.
    let d = tempfile::tempdir().unwrap();
    let mut s = CheckpointStore::open_with(d.path(), small_packs()).unwrap();
    let mut rng = Rng(7);
    let a = file(&mut rng, 1, 6);
    s.commit(b"a.safetensors", &a).unwrap();
    let before = pack_lengths(d.path());
    let next = s.entries().iter().map(|e| e.id).max().unwrap_or(0) + 1;
    let blocker = d.path().join("recipes").join(fanstore_ckpt::recipe::file_name(next));
    std::fs::create_dir_all(blocker.join("x")).unwrap(); // a non-empty directory: no rename replaces it
    let b = file(&mut rng, 2, 12);
    assert!(s.commit(b"b.safetensors", &b).is_err());
    let after = pack_lengths(d.path());
    for (name, len) in &after {
        let want = before.get(name).copied().unwrap_or(pack::HEADER_LEN as u64);
        assert_eq!(*len, want, "{name}: the failed commit's records were not given back");
    }
    assert!(after.values().sum::<u64>() < before.values().sum::<u64>() + b.len() as u64 / 2);
    // The store goes on: the same file commits once the obstacle is gone, and both read back.
    std::fs::remove_dir_all(&blocker).unwrap();
    s.commit(b"b.safetensors", &b).unwrap();
    assert_eq!(s.read(b"a.safetensors").unwrap(), a);
    assert_eq!(s.read(b"b.safetensors").unwrap(), b);
    drop(s);
    let s = CheckpointStore::open_with(d.path(), small_packs()).unwrap();
    assert_eq!(s.read(b"b.safetensors").unwrap(), b);
}
