//! Library-level pack tests: determinism across thread counts, balance of
//! real partitions, verify and extract of what was packed.

use fanstore_core::codec::Compression;
use fanstore_core::manifest::Manifest;
use fanstore_prep::assign::PartitionCount;
use fanstore_prep::pack::{pack, PackOptions};
use fanstore_prep::progress::ProgressMode;
use std::path::{Path, PathBuf};

/// A new temporary directory holding [`make_tree`] at `in/` (the path
/// returned); a test packs it into siblings of `in/`.
fn tree_in_tempdir() -> (tempfile::TempDir, PathBuf) {
    let d = tempfile::tempdir().unwrap();
    let input = d.path().join("in");
    make_tree(&input);
    (d, input)
}

/// A small tree with files of many sizes (compressible and not), empty
/// files and directories, and a symlink.
fn make_tree(root: &Path) {
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut rnd = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for d in 0..6 {
        let dir = root.join(format!("class{d}"));
        std::fs::create_dir_all(&dir).unwrap();
        for f in 0..40 {
            let size = (rnd() % 200_000) as usize;
            let bytes: Vec<u8> = if f % 2 == 0 { (0..size).map(|_| rnd() as u8).collect() } else { (0..size).map(|i| (i % 7) as u8).collect() };
            std::fs::write(dir.join(format!("f{f:03}.bin")), bytes).unwrap();
        }
    }
    std::fs::create_dir_all(root.join("val/empty")).unwrap();
    std::fs::write(root.join("val/a.txt"), b"validation").unwrap();
    std::fs::write(root.join("empty.txt"), b"").unwrap();
    std::os::unix::fs::symlink("class0/f000.bin", root.join("link")).unwrap();
}

fn options(input: &Path, output: PathBuf, threads: usize, compression: &str) -> PackOptions {
    PackOptions {
        input: input.into(),
        output,
        partitions: PartitionCount::Count(5),
        compression: Compression::parse(compression).unwrap(),
        replicate_dirs: vec!["val".into()],
        threads,
        skip_unreadable: false,
        skip_special: false,
        progress: ProgressMode::Off,
        progress_interval: fanstore_prep::progress::PLAIN_INTERVAL,
    }
}

fn dataset_bytes(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap())
        .map(|e| (e.file_name().to_string_lossy().into_owned(), std::fs::read(e.path()).unwrap()))
        .collect();
    v.sort();
    v
}

#[test]
fn output_is_identical_for_any_thread_count() {
    let (d, input) = tree_in_tempdir();
    // The first read of each input may move its atime (relatime: atime <=
    // mtime until then; seen on overlayfs, a container's /tmp), which the
    // manifest records: one pack first, so the packs compared see the same.
    pack(&options(&input, d.path().join("settle"), 1, "none")).unwrap();
    for codec in ["none", "lz4", "zstd:3"] {
        let one = d.path().join(format!("t1-{codec}"));
        let four = d.path().join(format!("t4-{codec}"));
        pack(&options(&input, one.clone(), 1, codec)).unwrap();
        pack(&options(&input, four.clone(), 4, codec)).unwrap();
        let (a, b) = (dataset_bytes(&one), dataset_bytes(&four));
        assert_eq!(a.len(), 7, "manifest + 5 regular + 1 replicated partition");
        assert!(a == b, "{codec}: outputs differ between 1 and 4 threads");
        let report = fanstore_prep::verify::verify(&one);
        assert!(report.faults.is_empty(), "{:?}", report.faults);
    }
}

#[test]
fn real_partitions_are_balanced_and_replicated_ones_flagged() {
    let (d, input) = tree_in_tempdir();
    let out = d.path().join("out");
    let s = pack(&options(&input, out.clone(), 2, "none")).unwrap();
    assert_eq!((s.partitions, s.replicated_partitions), (6, 1));
    let m = Manifest::open(&out.join("manifest.fsm")).unwrap();
    let v = m.view();
    let parts: Vec<_> = v.partitions().collect();
    let regular: Vec<u64> = parts.iter().filter(|p| !p.replicated()).map(|p| p.logical_bytes).collect();
    let total: u64 = regular.iter().sum();
    for b in &regular {
        // Contiguous runs: each within one (largest, < 200 KB) file of the ideal.
        assert!(b.abs_diff(total / 5) < 200_000, "{regular:?}");
    }
    let val = v.lookup(b"val/a.txt").unwrap();
    assert!(parts[val.partition() as usize].replicated());
    assert_eq!(val.flags() & fanstore_core::manifest::NODE_FLAG_REPLICATED, 1);
    assert!(!parts[v.lookup(b"class0/f000.bin").unwrap().partition() as usize].replicated());
}

#[test]
fn extract_restores_what_was_packed() {
    let (d, input) = tree_in_tempdir();
    let out = d.path().join("out");
    pack(&options(&input, out.clone(), 2, "zstd")).unwrap();
    let back = d.path().join("back");
    fanstore_prep::extract::extract(&out, &back).unwrap();
    for e in std::fs::read_dir(input.join("class3")).unwrap() {
        let e = e.unwrap();
        assert_eq!(std::fs::read(e.path()).unwrap(), std::fs::read(back.join("class3").join(e.file_name())).unwrap());
    }
    assert_eq!(std::fs::read_link(back.join("link")).unwrap(), Path::new("class0/f000.bin"));
    assert!(back.join("val/empty").is_dir());
    // Extracting into a non-empty directory is refused.
    assert!(fanstore_prep::extract::extract(&out, &back).is_err());
}

#[test]
fn existing_dataset_is_refused_and_left_intact() {
    let (d, input) = tree_in_tempdir();
    let out = d.path().join("out");
    pack(&options(&input, out.clone(), 2, "none")).unwrap();
    let before = dataset_bytes(&out);
    let e = pack(&options(&input, out.clone(), 2, "none")).unwrap_err().to_string();
    assert!(e.contains("already holds a dataset") && e.contains("manifest.fsm"), "{e}");
    assert!(before == dataset_bytes(&out));
}

#[test]
fn big_files_stream_raw_and_incompressible_big_files_fall_back_to_raw() {
    let d = tempfile::tempdir().unwrap();
    let input = d.path().join("in");
    std::fs::create_dir_all(&input).unwrap();
    // 70 MiB, sparse with some data: above the 64 MiB streaming threshold.
    let sparse = input.join("sparse.bin");
    let f = std::fs::File::create(&sparse).unwrap();
    f.set_len(70 << 20).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, b"data in the middle", 33 << 20).unwrap();
    // 65 MiB of noise: lz4 cannot shrink it, so it must be stored raw.
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let noise: Vec<u8> = (0..(65usize << 20) / 8)
        .flat_map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x.to_le_bytes()
        })
        .collect();
    std::fs::write(input.join("noise.bin"), &noise).unwrap();
    for codec in ["none", "lz4"] {
        let out = d.path().join(format!("out-{codec}"));
        let mut opts = options(&input, out.clone(), 2, codec);
        opts.replicate_dirs.clear();
        pack(&opts).unwrap();
        let report = fanstore_prep::verify::verify(&out);
        assert!(report.faults.is_empty(), "{:?}", report.faults);
        let m = Manifest::open(&out.join("manifest.fsm")).unwrap();
        let v = m.view();
        assert_eq!(v.lookup(b"noise.bin").unwrap().codec(), fanstore_core::codec::Codec::None);
        let expected_sparse_codec = if codec == "lz4" { fanstore_core::codec::Codec::Lz4 } else { fanstore_core::codec::Codec::None };
        assert_eq!(v.lookup(b"sparse.bin").unwrap().codec(), expected_sparse_codec);
        let back = d.path().join(format!("back-{codec}"));
        fanstore_prep::extract::extract(&out, &back).unwrap();
        assert!(std::fs::read(back.join("noise.bin")).unwrap() == noise);
        assert!(std::fs::read(back.join("sparse.bin")).unwrap() == std::fs::read(&sparse).unwrap());
    }
}
