//! Deltas and float-aware compression in the store: fine-tuning series of
//! every float dtype, bounded chains, deleting parents, reopening, hot
//! copies, and a random operation sequence checked against a plain map.

mod common;

use common::*;
use fanstore_ckpt::unit::{self, UnitHeader};
use fanstore_ckpt::{CheckpointStore, StoreOptions};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

/// A normal-ish float (sum of uniforms), scaled like trained weights.
fn normal(rng: &mut Rng) -> f32 {
    let s: f64 = (0..4).map(|_| (rng.next() >> 11) as f64 / (1u64 << 53) as f64).sum();
    ((s - 2.0) * 1.7) as f32
}

fn weights(rng: &mut Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| normal(rng) * 0.02).collect()
}

/// `w += 1e-3 * 0.02 * noise`: one small fine-tuning step.
fn step(rng: &mut Rng, w: &[f32]) -> Vec<f32> {
    w.iter().map(|x| x + 1e-3 * 0.02 * normal(rng)).collect()
}

fn f32_bytes(w: &[f32]) -> Vec<u8> {
    w.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn bf16_bytes(w: &[f32]) -> Vec<u8> {
    w.iter().flat_map(|x| ((x.to_bits() >> 16) as u16).to_le_bytes()).collect()
}

/// IEEE half from f32 (round toward zero; normal range only: weights).
fn f16_bytes(w: &[f32]) -> Vec<u8> {
    w.iter()
        .flat_map(|x| {
            let b = x.to_bits();
            let sign = ((b >> 16) & 0x8000) as u16;
            let exp = ((b >> 23) & 0xff) as i32 - 127 + 15;
            let h = if exp <= 0 { sign } else { sign | ((exp.min(30) as u16) << 10) | ((b >> 13) & 0x3ff) as u16 };
            h.to_le_bytes()
        })
        .collect()
}

/// One model of three float dtypes plus an int tensor, as safetensors.
fn model(ws: &[Vec<f32>], ids: &[u8]) -> Vec<u8> {
    let n = ws[0].len() as u64;
    let ts = vec![
        t("embed.weight", "F32", &[n], f32_bytes(&ws[0])),
        t("layers.0.weight", "F32", &[n / 4, 4], f32_bytes(&ws[1])),
        t("layers.1.weight", "F16", &[n], f16_bytes(&ws[2])),
        t("layers.2.weight", "BF16", &[n], bf16_bytes(&ws[3])),
        t("buffers.ids", "U8", &[ids.len() as u64], ids.to_vec()),
    ];
    safetensors(&ts, StOpts { metadata: true, ..StOpts::default() })
}

/// The headers of the units the store holds (live and bases), read where they are stored.
fn headers(store: &CheckpointStore) -> Vec<UnitHeader> {
    store.unit_headers().unwrap()
}

fn opts(max_chain: u8) -> StoreOptions {
    StoreOptions { max_chain, ..StoreOptions::default() }
}

fn small_packs() -> StoreOptions {
    StoreOptions { hot: 1, pack_size: 96 << 10, compact_below_percent: 60, ..opts(2) }
}

/// (pack files, the highest pack sequence number) in a store directory.
fn packs_on_disk(dir: &Path) -> (usize, u64) {
    let seqs: Vec<u64> = std::fs::read_dir(dir.join("units"))
        .unwrap()
        .filter_map(|e| fanstore_ckpt::pack::parse_name(e.unwrap().file_name().to_str().unwrap()))
        .collect();
    (seqs.len(), seqs.iter().copied().max().unwrap_or(0))
}

#[test]
fn small_updates_become_bounded_deltas_and_read_back_exactly() {
    let d = tempfile::tempdir().unwrap();
    let mut rng = Rng(0x5eed);
    let n = 64 * 1024;
    let mut ws: Vec<Vec<f32>> = (0..4).map(|_| weights(&mut rng, n)).collect();
    let ids = rng.bytes(8192);
    let mut files = Vec::new();
    let mut store = CheckpointStore::open_with(d.path(), opts(3)).unwrap();
    for k in 0..10 {
        if k > 0 {
            ws = ws.iter().map(|w| step(&mut rng, w)).collect();
        }
        let f = model(&ws, &ids);
        let info = store.commit(format!("run/ckpt-{k}.safetensors").as_bytes(), &f).unwrap();
        if k > 0 {
            assert_eq!(info.parent, Some(info.id - 1), "the previous checkpoint is the lineage parent");
            assert!(info.units_delta >= 2, "checkpoint {k}: {info:?}");
        } else {
            assert!(info.units_grouped >= 3, "{info:?}");
        }
        files.push(f);
    }
    for (k, f) in files.iter().enumerate() {
        assert_eq!(&store.read(format!("run/ckpt-{k}.safetensors").as_bytes()).unwrap(), f, "checkpoint {k}");
    }
    let hs = headers(&store);
    assert!(hs.iter().all(|h| h.depth <= 3), "chains are bounded");
    assert!(hs.iter().any(|h| h.depth == 3));
    let du = store.du();
    let logical: u64 = files.iter().map(|f| f.len() as u64).sum();
    assert_eq!(du.logical, logical);
    assert!(du.physical() * 3 < logical * 2, "0% frozen, small updates: {} of {logical} bytes", du.physical());
    assert!(du.saved_by_delta() > 0 && du.saved_by_compression() > 0, "{du:?}");
    assert_eq!(du.saved_by_dedup(), 9 * (8192 + 0), "only the int buffer repeats: {du:?}");
    assert!(store.verify(None).unwrap().ok());
}

#[test]
fn deleting_parents_keeps_dependants_readable() {
    let d = tempfile::tempdir().unwrap();
    let mut rng = Rng(77);
    let n = 32 * 1024;
    let mut ws: Vec<Vec<f32>> = (0..4).map(|_| weights(&mut rng, n)).collect();
    let ids = rng.bytes(100);
    let mut files = BTreeMap::new();
    {
        let mut store = CheckpointStore::open_with(d.path(), opts(8)).unwrap();
        for k in 0..6 {
            ws = ws.iter().map(|w| step(&mut rng, w)).collect();
            let f = model(&ws, &ids);
            store.commit(format!("c{k}").as_bytes(), &f).unwrap();
            files.insert(k, f);
        }
        // Delete the middle of the chain, then its start.
        for k in [2, 3, 0, 1] {
            store.unlink(format!("c{k}").as_bytes()).unwrap();
            files.remove(&k);
            for (j, f) in &files {
                assert_eq!(&store.read(format!("c{j}").as_bytes()).unwrap(), f, "after unlinking c{k}");
            }
        }
        assert!(headers(&store).iter().any(|h| h.depth >= 4), "c5 still decodes through deleted versions");
    }
    // Reopen: dependants are counted from the unit headers, nothing needed is swept.
    let mut store = CheckpointStore::open_with(d.path(), opts(8)).unwrap();
    for (j, f) in &files {
        assert_eq!(&store.read(format!("c{j}").as_bytes()).unwrap(), f);
    }
    assert!(store.verify(None).unwrap().ok());
    store.unlink(b"c4").unwrap();
    assert_eq!(store.read(b"c5").unwrap(), files[&5]);
    let freed = store.unlink(b"c5").unwrap();
    assert!(freed.units_freed >= 6, "{freed:?}");
    // The whole chain is released: the one pack left holds only dead bytes.
    let du = store.du();
    assert_eq!(du.units, 0);
    let left: Vec<_> = std::fs::read_dir(d.path().join("units")).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(left.len(), 1, "{left:?}");
    assert_eq!((du.packs, du.pack_dead), (1, std::fs::metadata(&left[0]).unwrap().len()));
}

#[test]
fn a_damaged_base_is_named_by_its_dependants() {
    let d = tempfile::tempdir().unwrap();
    let mut rng = Rng(5);
    let w = weights(&mut rng, 50_000);
    let ts = |w: &[f32]| safetensors(&[t("w", "F32", &[w.len() as u64], f32_bytes(w))], StOpts::default());
    let mut store = CheckpointStore::open_with(d.path(), opts(4)).unwrap();
    let a = ts(&w);
    store.commit(b"a", &a).unwrap();
    let b = ts(&step(&mut rng, &w));
    assert_eq!(store.commit(b"b", &b).unwrap().units_delta, 1);
    let owners = store.owners(b"a").unwrap();
    let (base, off, len) = store.unit_location(&owners.rows[0].hash).unwrap();
    let mut bytes = std::fs::read(&base).unwrap();
    bytes[(off + len - 10) as usize] ^= 1;
    std::fs::write(&base, bytes).unwrap();
    let e = store.read(b"b").unwrap_err();
    assert!(e.is_corruption() && e.to_string().contains(&unit::hex(&owners.rows[0].hash)), "{e}");
    let v = store.verify(Some(b"b")).unwrap();
    assert!(!v.ok() && v.problems[0].tensor.as_deref() == Some(&b"w"[..]), "{v:?}");
}

#[test]
fn noise_is_stored_raw_with_little_overhead() {
    let d = tempfile::tempdir().unwrap();
    let mut rng = Rng(11);
    let mut store = CheckpointStore::open(d.path()).unwrap();
    let mut logical = 0;
    for k in 0..5 {
        let ts: Vec<T> = (0..4).map(|i| t(&format!("l{i}"), "F32", &[65536], rng.bytes(4 * 65536))).collect();
        let f = safetensors(&ts, StOpts::default());
        logical += f.len() as u64;
        let info = store.commit(format!("r{k}").as_bytes(), &f).unwrap();
        assert_eq!((info.units_delta, info.units_grouped), (0, 0), "{info:?}");
        assert_eq!(store.read(format!("r{k}").as_bytes()).unwrap(), f);
    }
    let du = store.du();
    assert!(du.physical() as f64 <= logical as f64 * 1.01, "{} of {logical}", du.physical());
}

#[test]
fn hot_copies_serve_reads_and_delta_bases() {
    let d = tempfile::tempdir().unwrap();
    let mut rng = Rng(21);
    let n = 40_000;
    let mut ws: Vec<Vec<f32>> = (0..4).map(|_| weights(&mut rng, n)).collect();
    let ids = rng.bytes(64);
    let mut store = CheckpointStore::open_with(d.path(), StoreOptions { hot: 1, ..opts(4) }).unwrap();
    let f1: Arc<Vec<u8>> = Arc::new(model(&ws, &ids));
    store.commit_shared(b"h1", f1.clone()).unwrap();
    assert!(store.is_hot(b"h1"));
    // The units are on disk all the same: remove the hot copy's effect by reopening later.
    ws = ws.iter().map(|w| step(&mut rng, w)).collect();
    let f2: Arc<Vec<u8>> = Arc::new(model(&ws, &ids));
    let info = store.commit_shared(b"h2", f2.clone()).unwrap();
    assert!(info.units_delta >= 2, "bases found in the hot copy: {info:?}");
    assert!(store.is_hot(b"h2") && !store.is_hot(b"h1"), "one hot copy kept");
    assert_eq!(store.read(b"h1").unwrap(), *f1);
    assert_eq!(store.read(b"h2").unwrap(), *f2);
    let mut out = Vec::new();
    store.read_to(b"h2", &mut out).unwrap();
    assert_eq!(out, *f2);
    store.unlink(b"h2").unwrap();
    assert!(!store.is_hot(b"h2"));
    drop(store);
    let store = CheckpointStore::open(d.path()).unwrap();
    assert_eq!(store.read(b"h1").unwrap(), *f1);
    assert!(store.verify(None).unwrap().ok());
}

#[test]
fn hot_copies_are_kept_within_their_byte_budget() {
    let d = tempfile::tempdir().unwrap();
    let mut rng = Rng(22);
    let ws: Vec<Vec<f32>> = (0..4).map(|_| weights(&mut rng, 20_000)).collect();
    let ids = rng.bytes(64);
    let size = model(&ws, &ids).len() as u64;
    // Room for two and a half files: the last two stay hot.
    let o = StoreOptions { hot: usize::MAX, hot_bytes: size * 5 / 2, ..opts(4) };
    let mut store = CheckpointStore::open_with(d.path(), o).unwrap();
    let mut files = Vec::new();
    for k in 0..4 {
        let ws: Vec<Vec<f32>> = ws.iter().map(|w| w.iter().map(|x| x + k as f32).collect()).collect();
        let f: Arc<Vec<u8>> = Arc::new(model(&ws, &ids));
        store.commit_shared(format!("b{k}").as_bytes(), f.clone()).unwrap();
        files.push(f);
    }
    let hot: Vec<bool> = (0..4).map(|k| store.is_hot(format!("b{k}").as_bytes())).collect();
    assert_eq!(hot, [false, false, true, true]);
    // A budget smaller than one file still keeps the newest.
    store.limit_hot(usize::MAX, 1);
    let hot: Vec<bool> = (0..4).map(|k| store.is_hot(format!("b{k}").as_bytes())).collect();
    assert_eq!(hot, [false, false, false, true]);
    assert!(store.forget_hot(b"b3"));
    assert!(!store.is_hot(b"b3") && !store.forget_hot(b"b3"));
    for (k, f) in files.iter().enumerate() {
        assert_eq!(store.read(format!("b{k}").as_bytes()).unwrap(), **f);
    }
}

/// Random commits (each derived from a live checkpoint: small updates,
/// rewrites, bit flips, new and dropped tensors, every dtype), unlinks,
/// renames and reopens, with short chains and small packs (96 KiB, compacted
/// below 60% live, so compaction runs often and moves delta bases); after
/// every step every live checkpoint reads back as the model says.
#[test]
fn random_operations_match_a_plain_map() {
    const DTYPES: [(&str, usize); 7] = [("F32", 4), ("F16", 2), ("BF16", 2), ("F64", 8), ("I64", 8), ("U8", 1), ("I32", 4)];
    let d = tempfile::tempdir().unwrap();
    let mut rng = Rng(0xfeed_beef);
    let mut model_map: BTreeMap<String, (Vec<T>, Vec<u8>)> = BTreeMap::new();
    let mut store = Some(CheckpointStore::open_with(d.path(), small_packs()).unwrap());
    let (mut deltas, mut deepest) = (0, 0);
    let fresh = |rng: &mut Rng, i: usize| -> T {
        let (dt, w) = DTYPES[i % DTYPES.len()];
        let n = 1024 + rng.below(6000) as usize;
        let data = match dt {
            "F32" => f32_bytes(&weights(rng, n)),
            "F16" => f16_bytes(&weights(rng, n)),
            "BF16" => bf16_bytes(&weights(rng, n)),
            _ => rng.bytes(n * w).iter().enumerate().map(|(k, b)| if k % w == w - 1 { 0 } else { *b }).collect(),
        };
        t(&format!("t{i}"), dt, &[n as u64], data)
    };
    for op in 0..160 {
        let s = store.as_mut().unwrap();
        let live: Vec<String> = model_map.keys().cloned().collect();
        match rng.below(10) {
            0..=5 => {
                let mut ts = match live.get(rng.below(live.len() as u64 + 1) as usize) {
                    Some(p) => model_map[p].0.clone(),
                    None => (0..4).map(|i| fresh(&mut rng, i)).collect(),
                };
                for (i, tt) in ts.iter_mut().enumerate() {
                    let w = DTYPES.iter().find(|d| d.0 == tt.dtype).map_or(1, |d| d.1);
                    match rng.below(6) {
                        0 => *tt = fresh(&mut rng, i),
                        1 | 2 => {
                            // Low-byte changes of a few elements: a small update.
                            for _ in 0..1 + rng.below(50) {
                                let e = rng.below((tt.data.len() / w) as u64) as usize;
                                tt.data[e * w] ^= rng.next() as u8 | 1;
                            }
                        }
                        _ => {}
                    }
                }
                if rng.below(8) == 0 {
                    let i = ts.len();
                    ts.push(fresh(&mut rng, i));
                }
                if rng.below(8) == 0 && ts.len() > 1 {
                    ts.remove(rng.below(ts.len() as u64) as usize);
                }
                let f = safetensors(&ts, StOpts::default());
                let p = format!("d{}/c{}", rng.below(2), rng.below(12));
                let info = if rng.below(2) == 0 {
                    s.commit_shared(p.as_bytes(), Arc::new(f.clone())).unwrap()
                } else {
                    s.commit(p.as_bytes(), &f).unwrap()
                };
                deltas += info.units_delta;
                model_map.insert(p, (ts, f));
            }
            6 | 7 if !live.is_empty() => {
                let p = &live[rng.below(live.len() as u64) as usize];
                s.unlink(p.as_bytes()).unwrap();
                model_map.remove(p);
            }
            8 if !live.is_empty() => {
                let p = live[rng.below(live.len() as u64) as usize].clone();
                let q = format!("d{}/c{}", rng.below(2), rng.below(12));
                s.rename(p.as_bytes(), q.as_bytes()).unwrap();
                let v = model_map.remove(&p).unwrap();
                model_map.insert(q, v);
            }
            _ => {
                drop(store.take());
                store = Some(CheckpointStore::open_with(d.path(), small_packs()).unwrap());
            }
        }
        let s = store.as_ref().unwrap();
        for (p, (_, f)) in &model_map {
            assert_eq!(&s.read(p.as_bytes()).unwrap(), f, "op {op}: {p}");
        }
        let hs = headers(s);
        assert!(hs.iter().all(|h| h.depth <= 2), "op {op}");
        deepest = hs.iter().map(|h| h.depth).max().unwrap_or(0).max(deepest);
    }
    assert!(deltas > 50 && deepest == 2, "{deltas} deltas, deepest chain {deepest}");
    let (files, highest) = packs_on_disk(d.path());
    assert!(highest > files as u64 + 3, "packs were compacted away: {files} files, highest pack {highest}");
    let mut s = store.take().unwrap();
    assert!(s.verify(None).unwrap().ok());
    for p in model_map.keys() {
        s.unlink(p.as_bytes()).unwrap();
    }
    // Every unit and base released: at most the active pack is left, all of it dead bytes.
    let du = s.du();
    assert_eq!(du.units, 0);
    let left: Vec<_> = std::fs::read_dir(d.path().join("units")).unwrap().map(|e| e.unwrap().path()).collect();
    assert!(left.len() <= 1, "{left:?}");
    assert_eq!(du.pack_dead, left.iter().map(|p| std::fs::metadata(p).unwrap().len()).sum::<u64>());
}
