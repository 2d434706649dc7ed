//! One quick measurement (not a benchmark suite): commit throughput of a
//! ~200 MB safetensors checkpoint with 0% repeated tensors against a plain
//! write of the same bytes, plus the cost of each step, and commits of the
//! next epoch with 50% and 75% of the tensors frozen.
//!
//! `cargo run --release -p fanstore-ckpt --example throughput [DIR] [MB] [RUNS]`

use fanstore_ckpt::{split, CdcParams, CheckpointStore};
use std::io::Write;
use std::time::Instant;

fn rng_bytes(seed: u64, n: usize) -> Vec<u8> {
    let mut x = seed | 1;
    let mut v = Vec::with_capacity(n + 8);
    while v.len() < n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(n);
    v
}

/// A safetensors file of `n` tensors of `each` bytes; tensor i has content
/// seed `seed(i)`.
fn model(n: usize, each: usize, seed: impl Fn(usize) -> u64) -> Vec<u8> {
    let mut header = String::from("{");
    for i in 0..n {
        if i > 0 {
            header.push(',');
        }
        header.push_str(&format!(
            "\"layers.{i}.weight\":{{\"dtype\":\"F32\",\"shape\":[{}],\"data_offsets\":[{},{}]}}",
            each / 4,
            i * each,
            (i + 1) * each
        ));
    }
    header.push('}');
    while header.len() % 8 != 0 {
        header.push(' ');
    }
    let mut b = (header.len() as u64).to_le_bytes().to_vec();
    b.extend_from_slice(header.as_bytes());
    for i in 0..n {
        b.extend_from_slice(&rng_bytes(seed(i), each));
    }
    b
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn best(v: &[f64]) -> f64 {
    v.iter().copied().fold(0.0, f64::max)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let base = std::path::PathBuf::from(args.get(1).cloned().unwrap_or_else(|| std::env::temp_dir().to_string_lossy().into_owned()));
    let mb: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(200);
    let n = 100;
    let each = mb * 1024 * 1024 / n;
    let runs: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(7);
    let mut r = std::collections::BTreeMap::<&str, Vec<f64>>::new();
    for run in 0..runs {
        let epoch = (run as u64 + 1) << 32;
        let bytes = model(n, each, |i| epoch ^ i as u64);
        let gb = bytes.len() as f64 / 1e9;
        let dir = tempfile::Builder::new().prefix("ckpt-tp").tempdir_in(&base).unwrap();

        let t = Instant::now();
        let mut f = std::fs::File::create(dir.path().join("plain")).unwrap();
        f.write_all(&bytes).unwrap();
        drop(f);
        r.entry("plain write").or_default().push(gb / t.elapsed().as_secs_f64());

        // A no-dedup commit that checksums the file (every FanStore payload carries an xxh3).
        let t = Instant::now();
        let mut f = std::fs::File::create(dir.path().join("plain2")).unwrap();
        f.write_all(&bytes).unwrap();
        std::hint::black_box(xxhash_rust::xxh3::xxh3_64(&bytes));
        drop(f);
        r.entry("plain write + xxh3").or_default().push(gb / t.elapsed().as_secs_f64());

        let t = Instant::now();
        let again = std::fs::read(dir.path().join("plain")).unwrap();
        r.entry("plain read").or_default().push(gb / t.elapsed().as_secs_f64());
        assert!(again == bytes);
        drop(again);

        let t = Instant::now();
        let s = split::split(&bytes, &CdcParams::default());
        r.entry("split (parse)").or_default().push(gb / t.elapsed().as_secs_f64());
        let t = Instant::now();
        for p in &s.pieces {
            std::hint::black_box(blake3::hash(&bytes[p.range().clone()]));
        }
        r.entry("blake3 all units").or_default().push(gb / t.elapsed().as_secs_f64());
        let t = Instant::now();
        std::hint::black_box(xxhash_rust::xxh3::xxh3_64(&bytes));
        r.entry("xxh3 whole file").or_default().push(gb / t.elapsed().as_secs_f64());
        // What the commit's hashing thread does: blake3 + unit xxh3 + file xxh3, blockwise.
        let t = Instant::now();
        let mut whole = xxhash_rust::xxh3::Xxh3::new();
        for p in &s.pieces {
            let mut b3 = blake3::Hasher::new();
            let mut x = xxhash_rust::xxh3::Xxh3::new();
            for block in bytes[p.range().clone()].chunks(128 << 10) {
                b3.update(block);
                x.update(block);
                whole.update(block);
            }
            std::hint::black_box((b3.finalize(), x.digest()));
        }
        std::hint::black_box(whole.digest());
        r.entry("hash stage (1 thread)").or_default().push(gb / t.elapsed().as_secs_f64());

        let mut store = CheckpointStore::open(&dir.path().join("store")).unwrap();
        let t = Instant::now();
        store.commit(b"run/epoch-1.safetensors", &bytes).unwrap();
        r.entry("commit, 0% repeats").or_default().push(gb / t.elapsed().as_secs_f64());

        let t = Instant::now();
        let back = store.read(b"run/epoch-1.safetensors").unwrap();
        r.entry("read back").or_default().push(gb / t.elapsed().as_secs_f64());
        assert!(back == bytes);
        drop(back);

        for (name, frozen) in [("commit next, 50% frozen", n / 2), ("commit next, 75% frozen", 3 * n / 4)] {
            let next = model(n, each, |i| if i < frozen { epoch ^ i as u64 } else { (epoch + 7 + frozen as u64) ^ i as u64 });
            let t = Instant::now();
            store.commit(format!("run/{frozen}.safetensors").as_bytes(), &next).unwrap();
            r.entry(name).or_default().push(gb / t.elapsed().as_secs_f64());
        }
    }
    println!("{mb} MB safetensors, {n} tensors, {runs} interleaved runs, GB/s (median, best):");
    for (k, v) in &r {
        println!("  {k:<26} {:6.2} {:6.2}", median(v.clone()), best(v));
    }
    if std::env::var_os("VERBOSE").is_some() {
        for (k, v) in &r {
            println!("  {k:<26} {v:.2?}");
        }
    }
    let (plain, commit) = (&r["plain write"], &r["commit, 0% repeats"]);
    println!("  commit / plain write      {:6.2}x {:6.2}x", median(commit.clone()) / median(plain.clone()), best(commit) / best(plain));
    let plain2 = &r["plain write + xxh3"];
    println!("  commit / plain write+xxh3 {:6.2}x {:6.2}x", median(commit.clone()) / median(plain2.clone()), best(commit) / best(plain2));
}
