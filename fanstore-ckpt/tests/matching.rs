//! `ckpt match` on a series with a changed head: the stored checkpoints
//! ranked by the longest equal prefix of tensors, then by shared tensors.

mod common;

use common::*;
use fanstore_ckpt::matching::{keys_of_file, TensorKey};
use fanstore_ckpt::{CdcParams, CheckpointStore};

const N: usize = 4096;

fn layer(seed: u64) -> Vec<u8> {
    Rng(seed * 0x9e37_79b9 | 1).bytes(N * 4)
}

/// Layers 0..8 (seeds given) and a head of `classes` rows.
fn model(seeds: &[u64; 8], head_seed: u64, classes: u64) -> Vec<u8> {
    let mut ts: Vec<T> = seeds.iter().enumerate().map(|(i, &s)| t(&format!("layers.{i}.weight"), "F32", &[N as u64], layer(s))).collect();
    ts.push(t("head.weight", "F32", &[classes, 64], Rng(head_seed).bytes(classes as usize * 64 * 4)));
    safetensors(&ts, StOpts::default())
}

fn paths(r: &fanstore_ckpt::matching::MatchReport) -> Vec<(String, u64, u64)> {
    r.rows.iter().map(|m| (String::from_utf8_lossy(&m.ckpt.path).into_owned(), m.prefix, m.shared)).collect()
}

#[test]
fn changed_head_finds_its_body() {
    let d = tempfile::tempdir().unwrap();
    let mut s = CheckpointStore::open(d.path()).unwrap();
    let base = [1, 2, 3, 4, 5, 6, 7, 8];
    // e1: the pretrained model; e2: fine-tuned top layers and head; e3: only the head moves.
    s.commit(b"run/e1.safetensors", &model(&base, 100, 10)).unwrap();
    s.commit(b"run/e2.safetensors", &model(&[1, 2, 3, 4, 5, 6, 17, 18], 101, 10)).unwrap();
    // shares layers 1..7 but not layer 0: many tensors, no prefix
    s.commit(b"other/x.safetensors", &model(&[90, 2, 3, 4, 5, 6, 7, 8], 102, 10)).unwrap();
    // shares layers 0..2 only: a short prefix
    s.commit(b"other/y.safetensors", &model(&[1, 2, 3, 91, 92, 93, 94, 95], 103, 10)).unwrap();
    s.commit(b"other/z.safetensors", &model(&[80, 81, 82, 83, 84, 85, 86, 87], 104, 10)).unwrap();

    // A new architecture: e1's body, a head of 5 classes (new shape).
    let new = model(&base, 200, 5);
    let q = keys_of_file(&new, &CdcParams::default());
    assert_eq!(q.len(), 9);
    let r = s.best_match(&q, None);
    assert_eq!(
        paths(&r),
        vec![
            ("run/e1.safetensors".into(), 8, 8),
            ("run/e2.safetensors".into(), 6, 6),
            ("other/y.safetensors".into(), 3, 3),
            ("other/x.safetensors".into(), 0, 7),
        ],
        "{}",
        r.to_table()
    );
    assert_eq!(r.rows[0].shared_bytes, 8 * N as u64 * 4);
    assert!(r.to_json().contains("\"prefix\":8"), "{}", r.to_json());
    assert!(r.to_table().contains("8/9"), "{}", r.to_table());

    // The same head with the same shape but other values: the head never matches.
    let r = s.best_match(&keys_of_file(&model(&base, 300, 10), &CdcParams::default()), None);
    assert_eq!((r.rows[0].prefix, r.rows[0].shared), (8, 8));

    // A stored checkpoint as the query: itself is left out.
    let q = s.keys_of(b"run/e2.safetensors").unwrap();
    let r = s.best_match(&q, Some(b"run/e2.safetensors"));
    assert_eq!(paths(&r)[0], ("run/e1.safetensors".into(), 6, 6));
    assert!(r.rows.iter().all(|m| m.ckpt.path != b"run/e2.safetensors"));

    // Nothing in common.
    let lone = vec![TensorKey { name: b"nope".to_vec(), shape: vec![1], hash: [9; 32], len: 4 }];
    let r = s.best_match(&lone, None);
    assert!(r.rows.is_empty() && r.to_table().contains("no stored checkpoint"));
}
