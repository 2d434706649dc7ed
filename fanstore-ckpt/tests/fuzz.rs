//! Bounded randomized mutation of every parser's input (xorshift, fixed
//! seeds): no panic, the pieces of whatever is accepted cover the file
//! exactly, and a sample of accepted and refused inputs round-trips
//! byte-exactly through the store. The JSON parser's own mutation test is
//! in `json.rs`.

mod common;

use common::*;
use fanstore_ckpt::split::{self, Piece, Split};
use fanstore_ckpt::{CdcParams, CheckpointStore, Format};

const ITERATIONS: usize = 6000;

/// Returns the mutated bytes and the net bytes inserted inside `hot`.
fn mutate(rng: &mut Rng, base: &[u8], hot: std::ops::Range<usize>) -> (Vec<u8>, isize) {
    let mut b = base.to_vec();
    let mut delta = 0isize;
    for _ in 0..1 + rng.below(3) {
        if b.is_empty() {
            break;
        }
        // Most mutations hit the structure (`hot`), some anywhere.
        let i = if rng.below(5) > 0 && hot.end <= b.len() && !hot.is_empty() {
            hot.start + rng.below(hot.len() as u64) as usize
        } else {
            rng.below(b.len() as u64) as usize
        };
        match rng.below(6) {
            0 => b[i] = rng.next() as u8,
            1 => b[i] ^= 1 << rng.below(8),
            2 => b[i] = b"{}[]\",:0123456789-eE.tfn \\'()PK\x01\x02\x03\x04\x05\x06\x07\xff\x00"[rng.below(38) as usize],
            3 => {
                // a 16- or 32-bit field set to a boundary value
                let v: u32 = [0, 1, 0xFFFF, 0xFFFF_FFFF, b.len() as u32, i as u32][rng.below(6) as usize];
                let w = if rng.below(2) == 0 { 2 } else { 4 };
                for k in 0..w.min(b.len() - i) {
                    b[i + k] = (v >> (8 * k)) as u8;
                }
            }
            4 => {
                b.remove(i);
                delta -= hot.contains(&i) as isize;
            }
            _ => {
                b.insert(i, rng.next() as u8);
                delta += hot.contains(&i) as isize;
            }
        }
    }
    if rng.below(10) == 0 {
        let n = rng.below(b.len() as u64 + 1) as usize;
        b.truncate(n);
    }
    (b, delta)
}

/// Re-seals a length prefix after insertions or deletions in the header, so
/// that mutations reach the header parsers: `(offset, width)` of the field.
fn fix_len(b: &mut [u8], field: (usize, usize), delta: isize) {
    let (off, w) = field;
    if b.len() < off + w || delta == 0 {
        return;
    }
    let mut v = [0u8; 8];
    v[..w].copy_from_slice(&b[off..off + w]);
    let n = (u64::from_le_bytes(v) as i64 + delta as i64) as u64;
    b[off..off + w].copy_from_slice(&n.to_le_bytes()[..w]);
}

/// Checks a split of `b` and returns whether a structured format accepted it.
fn check(b: &[u8], s: &Option<Split>) -> bool {
    let Some(s) = s else { return false };
    assert!(s.check_cover(b.len()), "pieces do not cover the input: {:?}", s.pieces);
    for p in &s.pieces {
        if let Piece::Unit(r, _) = p {
            assert!(r.end <= b.len());
        }
    }
    true
}

struct Harness {
    _dir: tempfile::TempDir,
    store: CheckpointStore,
    n: usize,
}

impl Harness {
    fn new() -> Harness {
        let (d, store) = temp_store();
        Harness { _dir: d, store, n: 0 }
    }
    /// Full pipeline: commit, read back, compare, unlink.
    fn round_trip(&mut self, b: &[u8], want: Option<Format>) {
        self.n += 1;
        let p = format!("fuzz/{}", self.n);
        let info = self.store.commit(p.as_bytes(), b).unwrap();
        if let Some(f) = want {
            assert_eq!(info.format, f);
        }
        assert!(self.store.read(p.as_bytes()).unwrap() == b, "round trip differs");
        self.store.unlink(p.as_bytes()).unwrap();
    }
}

type Base = (Vec<u8>, std::ops::Range<usize>, Option<(usize, usize)>);

/// A base whose mutations may hit any byte of `b`.
fn whole(b: Vec<u8>) -> Base {
    let l = b.len();
    (b, 0..l, None)
}

fn run(name: &str, seed: u64, bases: &[Base], parse: fn(&[u8]) -> Option<Split>) {
    let mut rng = Rng(seed);
    let mut h = Harness::new();
    let (mut accepted, mut refused) = (0, 0);
    for it in 0..ITERATIONS {
        let (base, hot, len_field) = &bases[it % bases.len()];
        let (mut b, delta) = mutate(&mut rng, base, hot.clone());
        if let Some(f) = len_field.filter(|_| rng.below(4) > 0) {
            fix_len(&mut b, f, delta);
        }
        let s = parse(&b);
        if check(&b, &s) {
            accepted += 1;
            // The dispatcher must agree with the format's own parser.
            let full = split::split(&b, &CdcParams::default());
            assert!(full.check_cover(b.len()));
            if accepted % 40 == 0 {
                h.round_trip(&b, Some(full.format));
            }
        } else {
            refused += 1;
            if refused % 150 == 0 {
                h.round_trip(&b, None);
            }
        }
    }
    eprintln!("{name}: {accepted} accepted, {refused} refused of {ITERATIONS}");
    // Most random edits of a compact header break it; enough survive to reach past the parser.
    assert!(accepted > ITERATIONS / 50 && refused > ITERATIONS / 50, "{name}: {accepted} accepted, {refused} refused");
    assert_eq!(h.store.du().units, 0, "every unit freed after unlinking everything");
}

#[test]
fn safetensors_parser_survives_mutation() {
    let mut rng = Rng(1);
    let mut bases = Vec::new();
    for (gap, meta) in [(0, false), (3, true)] {
        let ts = vec![
            t("a", "F32", &[2, 3], rng.bytes(24)),
            t("b.c", "BF16", &[4], rng.bytes(8)),
            t("e", "U8", &[0], vec![]),
            t("\u{e9}\"", "I64", &[], rng.bytes(8)),
        ];
        let f = safetensors(&ts, StOpts { reverse_keys: gap > 0, gap, metadata: meta });
        let hlen = u64::from_le_bytes(f[..8].try_into().unwrap()) as usize;
        bases.push((f, 8..8 + hlen, Some((0, 8))));
    }
    run("safetensors", 0x5afe, &bases, split::split_safetensors);
}

#[test]
fn zip_parser_survives_mutation() {
    let mut rng = Rng(2);
    let mut bases = Vec::new();
    for o in [
        ZipOpts::default(),
        ZipOpts { zip64: true, descriptors: true, crc: true, align: 64 },
        ZipOpts { align: 0, ..ZipOpts::default() },
    ] {
        let f = torch_zip("archive", &[rng.bytes(100), rng.bytes(7), vec![]], o);
        // The central directory and end records: from the EOCD's cd offset on.
        let eocd = f.len() - 22;
        let cd = if o.zip64 {
            u64::from_le_bytes(f[eocd - 20 - 56 + 48..eocd - 20 - 56 + 56].try_into().unwrap()) as usize
        } else {
            u32::from_le_bytes(f[eocd + 16..eocd + 20].try_into().unwrap()) as usize
        };
        bases.push((f.clone(), cd..f.len(), None));
        bases.push((f, 0..cd, None));
    }
    let x = npy("<f4", &[3], &rng.bytes(12), 1);
    let z = zip(&[stored("x.npy", &x), stored("y.npy", &x)], ZipOpts { align: 0, ..ZipOpts::default() });
    bases.push(whole(z));
    run("zip", 0x21b, &bases, split::split_zip);
}

#[test]
fn dcp_parser_survives_mutation() {
    let mut rng = Rng(4);
    let mut bases = Vec::new();
    let items = [
        torch_zip("archive", &[rng.bytes(60)], ZipOpts { descriptors: true, ..ZipOpts::default() }),
        torch_zip("archive", &[], ZipOpts::default()),
        torch_zip("archive", &[rng.bytes(9), rng.bytes(30)], ZipOpts { zip64: true, align: 0, ..ZipOpts::default() }),
    ];
    let f = items.concat();
    // Mutations in the first archive's end records and the second archive, then anywhere.
    let first = items[0].len();
    bases.push((f.clone(), first - 60..first + items[1].len(), None));
    bases.push(whole(f));
    run("dcp", 0xdc9, &bases, split::split_dcp);
}

#[test]
fn npy_parser_survives_mutation() {
    let mut rng = Rng(3);
    let mut bases = Vec::new();
    for major in [1u8, 2, 3] {
        let f = npy("<f8", &[2, 2], &rng.bytes(32), major);
        let (start, field) = if major == 1 { (10, (8, 2)) } else { (12, (8, 4)) };
        let hot = start..f.len() - 32;
        bases.push((f, hot, Some(field)));
    }
    run("npy", 0x4e9, &bases, split::split_npy);
}

#[test]
fn random_bytes_with_every_magic_never_panic() {
    let mut rng = Rng(4);
    let mut h = Harness::new();
    for i in 0..3000 {
        let prefix: &[u8] = match i % 4 {
            0 => b"\x93NUMPY\x01\x00",
            1 => b"PK\x03\x04",
            2 => b"\x10\x00\x00\x00\x00\x00\x00\x00{\"",
            _ => b"",
        };
        let mut b = prefix.to_vec();
        let n = rng.below(300) as usize;
        b.extend_from_slice(&rng.bytes(n));
        let s = split::split(&b, &CdcParams::default());
        assert!(s.check_cover(b.len()));
        if i % 30 == 0 {
            h.round_trip(&b, None);
        }
    }
}

/// Generated safetensors headers with random offsets (overlapping, reversed,
/// out of range, duplicate keys, empty tensors) against an independent
/// statement of the rule: accepted iff every range is inside the data,
/// begin <= end, non-empty ranges do not overlap, and keys are unique.
#[test]
fn safetensors_offsets_against_an_oracle() {
    let mut rng = Rng(0x0a4c1e);
    let mut h = Harness::new();
    let (mut yes, mut no) = (0, 0);
    for it in 0..4000 {
        let data_len = rng.below(64) as usize;
        let n = 1 + rng.below(4) as usize;
        let mut ranges = Vec::new();
        let mut entries = Vec::new();
        let mut keys = Vec::new();
        for _ in 0..n {
            let b = rng.below(data_len as u64 + 8) as usize;
            let e = if rng.below(4) == 0 { b } else { rng.below(data_len as u64 + 8) as usize };
            let key = format!("k{}", rng.below(6));
            entries.push(format!("\"{key}\":{{\"dtype\":\"U8\",\"shape\":[{}],\"data_offsets\":[{b},{e}]}}", e.saturating_sub(b)));
            ranges.push((b, e));
            keys.push(key);
        }
        if rng.below(3) == 0 {
            entries.push("\"__metadata__\":{\"a\":\"b\"}".into());
        }
        let header = format!("{{{}}}", entries.join(","));
        let mut f = (header.len() as u64).to_le_bytes().to_vec();
        f.extend_from_slice(header.as_bytes());
        f.extend_from_slice(&rng.bytes(data_len));

        let mut uniq = keys.clone();
        uniq.sort();
        uniq.dedup();
        let in_range = ranges.iter().all(|&(b, e)| b <= e && e <= data_len);
        let mut sorted: Vec<_> = ranges.iter().filter(|(b, e)| b < e).collect();
        sorted.sort();
        let disjoint = sorted.windows(2).all(|w| w[0].1 <= w[1].0);
        let want = uniq.len() == keys.len() && in_range && disjoint;

        let got = split::split_safetensors(&f);
        assert_eq!(got.is_some(), want, "{header} with {data_len} data bytes");
        check(&f, &got);
        if want {
            yes += 1;
        } else {
            no += 1;
        }
        if it % 25 == 0 {
            h.round_trip(&f, Some(if want { Format::Safetensors } else { Format::Opaque }));
        }
    }
    assert!(yes > 400 && no > 400, "{yes} accepted, {no} refused");
}
