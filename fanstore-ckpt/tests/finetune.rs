//! A fine-tuning series scaled down from the benchmark: 10
//! safetensors checkpoints of a ~20 MB model whose first half of tensors is
//! frozen after checkpoint 1. Then keep-last-5 deletes 1..5.

mod common;

use common::*;
use fanstore_ckpt::{CheckpointStore, DiffStatus};
use std::collections::HashSet;

const TENSORS: usize = 20;
const ROWS: u64 = 256;
const COLS: u64 = 1024;
const FROZEN: usize = TENSORS / 2;

/// The model after `epoch` (1-based): frozen tensors keep their epoch-1
/// values, the others change every epoch.
fn model(epoch: u64) -> (Vec<T>, Vec<u8>) {
    let mut ts = Vec::new();
    for i in 0..TENSORS {
        let e = if i < FROZEN { 1 } else { epoch };
        let mut rng = Rng(0x9e37_79b9 ^ ((i as u64) << 20) ^ (e << 40) | 1);
        ts.push(t(&format!("layers.{i}.weight"), "F32", &[ROWS, COLS], rng.bytes((ROWS * COLS * 4) as usize)));
        ts.push(t(&format!("layers.{i}.bias"), "F32", &[COLS], rng.bytes((COLS * 4) as usize)));
    }
    let bytes = safetensors(&ts, StOpts { metadata: true, ..StOpts::default() });
    (ts, bytes)
}

fn path(epoch: u64) -> Vec<u8> {
    format!("run1/checkpoint-{epoch}.safetensors").into_bytes()
}

/// The units the store holds (live and delta bases), each read from where it is stored.
fn unit_files(store: &CheckpointStore) -> HashSet<String> {
    store.unit_headers().unwrap().iter().map(|h| fanstore_ckpt::unit::hex(&h.blake3)).collect()
}

#[test]
fn fine_tuning_series_dedups_tracks_owners_and_survives_deletion() {
    let (d, mut store) = temp_store();
    let (ts1, _) = model(1);
    let payload: u64 = ts1.iter().map(|t| t.data.len() as u64).sum();
    let frozen_payload: u64 = ts1.iter().take(2 * FROZEN).map(|t| t.data.len() as u64).sum();
    let mut ids = Vec::new();
    let mut logical = 0;
    for e in 1..=10 {
        let (_, bytes) = model(e);
        logical += bytes.len() as u64;
        let info = store.commit(&path(e), &bytes).unwrap();
        ids.push(info.id);
        if e == 1 {
            assert_eq!((info.parent, info.units_new), (None, 2 * TENSORS));
        } else {
            assert_eq!(info.parent, Some(ids[e as usize - 2]), "parent of checkpoint {e}");
            assert_eq!(info.units_new, 2 * (TENSORS - FROZEN));
        }
    }
    // Stored bytes: one whole model plus nine half models.
    let du = store.du();
    let expect = payload as f64 * (1.0 + 9.0 * (1.0 - frozen_payload as f64 / payload as f64));
    let model_bytes = model(1).1.len() as f64;
    let ratio = du.physical() as f64 / logical as f64;
    eprintln!(
        "fine-tuning: logical {} B, physical {} B, stored/logical {:.4} ({:.3} model sizes; expected {:.3})",
        logical,
        du.physical(),
        ratio,
        du.physical() as f64 / model_bytes,
        expect / payload as f64
    );
    assert!((du.unit_payload as f64 - expect).abs() / expect < 1e-9, "{} vs {expect}", du.unit_payload);
    assert!((du.physical() as f64 / model_bytes - 5.5).abs() < 0.05 * 5.5, "{} model sizes", du.physical() as f64 / model_bytes);
    assert_eq!(du.logical, logical);
    assert_eq!(du.physical(), bytes_on_disk(d.path()), "du must agree with the bytes on disk");

    // Owners: checkpoint 1 owns every frozen tensor; each checkpoint owns its trained half.
    for e in 1..=10u64 {
        let o = store.owners(&path(e)).unwrap();
        assert_eq!(o.rows.len(), 2 * TENSORS);
        for (i, r) in o.rows.iter().enumerate() {
            let want = if i < 2 * FROZEN { ids[0] } else { ids[e as usize - 1] };
            assert_eq!(r.owner.id, want, "checkpoint {e} tensor {}", String::from_utf8_lossy(&r.name));
            assert_eq!(r.owner.path, path(if i < 2 * FROZEN { 1 } else { e }));
        }
    }
    let log = store.log(&path(10)).unwrap();
    assert_eq!(log.ids(), ids[..9].iter().rev().copied().collect::<Vec<_>>());
    let diff = store.diff(&path(9), &path(10)).unwrap();
    assert_eq!(diff.total(DiffStatus::Unchanged), (2 * FROZEN, frozen_payload));
    assert_eq!(diff.total(DiffStatus::Changed), (2 * (TENSORS - FROZEN), payload - frozen_payload));
    assert_eq!(diff.total(DiffStatus::Added).0 + diff.total(DiffStatus::Removed).0, 0);
    let ls = store.ls(b"run1");
    assert_eq!(ls.rows.len(), 10);
    assert!(ls.to_table().contains("checkpoint-10.safetensors"));

    // Keep the last five.
    let before = unit_files(&store);
    let mut freed = 0;
    for e in 1..=5 {
        freed += store.unlink(&path(e)).unwrap().units_freed;
    }
    // Units of 1..5's trained halves are gone; checkpoint 1's frozen half stays.
    assert_eq!(freed, 5 * 2 * (TENSORS - FROZEN));
    let after = unit_files(&store);
    let mut live_units = HashSet::new();
    for e in 6..=10 {
        for r in store.owners(&path(e)).unwrap().rows {
            live_units.insert(fanstore_ckpt::unit::hex(&r.hash));
        }
    }
    assert_eq!(after, live_units, "units stored = units referenced by 6..10");
    assert_eq!(before.len() - after.len(), freed);
    for e in 6..=10 {
        assert!(store.read(&path(e)).unwrap() == model(e).1, "checkpoint {e} reads back exactly");
    }
    let du = store.du();
    assert_eq!(du.physical(), bytes_on_disk(d.path()), "du after deletion");
    assert_eq!(du.unit_payload, frozen_payload + 5 * (payload - frozen_payload));
    assert_eq!((du.checkpoints, du.deleted), (5, 5));
    // Owners still name deleted checkpoint 1 for the frozen half; lineage runs through tombstones.
    let o = store.owners(&path(10)).unwrap();
    assert!(o.rows[..2 * FROZEN].iter().all(|r| r.owner.id == ids[0] && !r.owner.live));
    let log = store.log(&path(10)).unwrap();
    assert_eq!(log.ids(), ids[..9].iter().rev().copied().collect::<Vec<_>>());
    assert!(log.chain.iter().all(|r| r.ckpt.live == (r.ckpt.id > ids[4])));
    assert!(log.to_table().contains("(deleted)"));

    // A later job reopens the store and keeps deduplicating against it.
    drop(store);
    let mut store = CheckpointStore::open(d.path()).unwrap();
    assert_eq!(store.du(), du);
    let (_, b11) = model(11);
    let info = store.commit(&path(11), &b11).unwrap();
    assert_eq!(info.parent, Some(ids[9]));
    assert!(info.id > ids[9]);
    assert_eq!(info.units_new, 2 * (TENSORS - FROZEN));
    assert_eq!(store.read(&path(10)).unwrap(), model(10).1);
    assert!(store.verify(None).unwrap().ok());
}

#[test]
fn parent_prefers_most_shared_bytes_then_same_directory_then_recency() {
    let (_d, mut store) = temp_store();
    let mut rng = Rng(77);
    let a = rng.bytes(100_000);
    let b = rng.bytes(100_000);
    let c = rng.bytes(50_000);
    let st = |xs: &[&Vec<u8>]| {
        let ts: Vec<T> = xs.iter().enumerate().map(|(i, x)| t(&format!("t{i}"), "U8", &[x.len() as u64], (*x).clone())).collect();
        safetensors(&ts, StOpts::default())
    };
    let i1 = store.commit(b"x/base", &st(&[&a, &b])).unwrap().id;
    let i2 = store.commit(b"y/other", &st(&[&a])).unwrap().id;
    let i3 = store.commit(b"z/third", &st(&[&a])).unwrap().id;
    // Shares a and b with x/base (most bytes) -> x/base, even though later ones exist.
    assert_eq!(store.commit(b"y/new1", &st(&[&a, &b, &c])).unwrap().parent, Some(i1));
    // Shares only a: i1, i2, i3 and y/new1 tie on bytes; same directory (y/) wins, then recency.
    let i5 = store.id_of(b"y/new1").unwrap();
    assert_eq!(store.commit(b"y/new2", &st(&[&a])).unwrap().parent, Some(i5));
    assert_eq!(store.commit(b"z/new3", &st(&[&a, &rng.bytes(10)])).unwrap().parent, Some(i3));
    assert_eq!(store.commit(b"w/new4", &st(&[&c])).unwrap().parent, Some(i5));
    assert_eq!(store.commit(b"w/none", &st(&[&rng.bytes(1000)])).unwrap().parent, None);
    let _ = i2;
}
