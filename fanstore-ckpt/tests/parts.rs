//! Commits from parts (`CheckpointStore::commit_parts`): references to
//! stored units plus new bytes give back exactly the file they describe,
//! with the owner map a whole-file commit gives; bad references and parts
//! that do not match the file's split commit nothing.

mod common;
use common::*;
use fanstore_ckpt::split::{split_structured, Piece};
use fanstore_ckpt::{CkptError, PartUnit};
use std::ops::Range;

/// The unit ranges of `file` (a structured format).
fn unit_ranges(file: &[u8]) -> Vec<Range<usize>> {
    let s = split_structured(file).expect("a structured file");
    s.pieces
        .iter()
        .filter_map(|p| match p {
            Piece::Unit(r, _) => Some(r.clone()),
            Piece::Glue(_) => None,
        })
        .collect()
}

/// `file` with every unit range zeroed (what a writer that does not send
/// those bytes can build), and the parts: units in `new` travel as bytes
/// (in a payload), the others as the given references.
fn parts_of(file: &[u8], refs: &[Option<[u8; 32]>]) -> (Vec<u8>, Vec<(Range<usize>, PartUnit)>, Vec<u8>) {
    let mut skeleton = file.to_vec();
    let mut payload = Vec::new();
    let mut units = Vec::new();
    for (r, rf) in unit_ranges(file).into_iter().zip(refs) {
        skeleton[r.clone()].fill(0);
        let u = match rf {
            Some(h) => PartUnit::Ref(*h),
            None => {
                let at = payload.len();
                payload.extend_from_slice(&file[r.clone()]);
                PartUnit::New(at..payload.len())
            }
        };
        units.push((r, u));
    }
    (skeleton, units, payload)
}

fn storages(rng: &mut Rng, n: usize, len: usize) -> Vec<Vec<u8>> {
    (0..n).map(|_| rng.bytes(len)).collect()
}

#[test]
fn references_and_new_bytes_read_back_as_the_file() {
    let (_d, mut store) = temp_store();
    let mut rng = Rng(7);
    let mut s = storages(&mut rng, 4, 100_000);
    let first = torch_zip("ck", &s, ZipOpts::default());
    store.commit(b"run/1.pt", &first).unwrap();
    let hashes: Vec<[u8; 32]> = store.tensors(store.id_of(b"run/1.pt").unwrap()).unwrap().iter().map(|t| t.hash).collect();
    assert_eq!(hashes.len(), 4);
    // Storages 1 and 3 change; 0 and 2 are referenced.
    s[1] = rng.bytes(100_000);
    s[3] = rng.bytes(100_000);
    let second = torch_zip("ck", &s, ZipOpts::default());
    let (skeleton, units, payload) = parts_of(&second, &[Some(hashes[0]), None, Some(hashes[2]), None]);
    assert_eq!(payload.len(), 200_000);
    let sum = fanstore_core::checksum::xxh3(&second);
    // Checking commits nothing and gives the hashes the commit then gives.
    let checked = store.check_parts(&skeleton, &units, &payload).unwrap();
    assert_eq!(store.entries().len(), 1);
    let (info, got) = store.commit_parts(b"run/2.pt", &skeleton, &units, &payload, sum).unwrap();
    assert_eq!(checked, got);
    assert_eq!(store.read(b"run/2.pt").unwrap(), second);
    assert_eq!(info.units_new, 2);
    assert_eq!(info.parent, store.id_of(b"run/1.pt"));
    assert_eq!(got[0], hashes[0]);
    assert_eq!(got[2], hashes[2]);
    assert_ne!(got[1], hashes[1]);
    // The same owner map as the bytes committed whole would have.
    store.commit(b"run/2-whole.pt", &second).unwrap();
    let a = store.tensors(store.id_of(b"run/2.pt").unwrap()).unwrap().to_vec();
    let b = store.tensors(store.id_of(b"run/2-whole.pt").unwrap()).unwrap().to_vec();
    let key = |v: &[fanstore_ckpt::recipe::TensorEntry]| v.iter().map(|t| (t.name.clone(), t.dtype.clone(), t.shape.clone(), t.hash, t.owner)).collect::<Vec<_>>();
    assert_eq!(key(&a), key(&b));
    assert!(store.verify(None).unwrap().ok());
}

#[test]
fn an_unknown_reference_commits_nothing() {
    let (_d, mut store) = temp_store();
    let mut rng = Rng(9);
    let s = storages(&mut rng, 3, 70_000);
    let file = torch_zip("ck", &s, ZipOpts::default());
    store.commit(b"a.pt", &file).unwrap();
    let before = store.entries().len();
    let (skeleton, units, payload) = parts_of(&file, &[None, Some([7u8; 32]), None]);
    let sum = fanstore_core::checksum::xxh3(&file);
    assert!(matches!(store.check_parts(&skeleton, &units, &payload), Err(CkptError::UnknownUnit { .. })));
    match store.commit_parts(b"b.pt", &skeleton, &units, &payload, sum) {
        Err(CkptError::UnknownUnit { len, .. }) => assert_eq!(len, 70_000),
        other => panic!("expected an unknown unit, got {other:?}"),
    }
    assert_eq!(store.entries().len(), before);
    assert!(store.id_of(b"b.pt").is_none());
    // A reference of the right hash and the wrong length is unknown too.
    let h = store.tensors(store.id_of(b"a.pt").unwrap()).unwrap()[0].hash;
    let s2: Vec<Vec<u8>> = vec![rng.bytes(50_000), rng.bytes(70_000)];
    let file2 = torch_zip("ck", &s2, ZipOpts::default());
    let (skeleton, units, payload) = parts_of(&file2, &[Some(h), None]);
    assert!(matches!(store.commit_parts(b"c.pt", &skeleton, &units, &payload, 0), Err(CkptError::UnknownUnit { .. })));
}

#[test]
fn parts_that_are_not_the_files_units_are_refused() {
    let (_d, mut store) = temp_store();
    let mut rng = Rng(11);
    let s = storages(&mut rng, 2, 80_000);
    let file = torch_zip("ck", &s, ZipOpts::default());
    let (skeleton, mut units, payload) = parts_of(&file, &[None, None]);
    // A unit range shifted by one byte: the split of the glue disagrees.
    units[1].0 = units[1].0.start + 1..units[1].0.end + 1;
    let sum = fanstore_core::checksum::xxh3(&file);
    assert!(matches!(store.commit_parts(b"x.pt", &skeleton, &units, &payload, sum), Err(CkptError::Invalid(_))));
    // Something that is not a structured format at all.
    let junk = vec![1u8; 100_000];
    assert!(matches!(store.commit_parts(b"y.pt", &junk, &[], &[], 0), Err(CkptError::Invalid(_))));
    assert!(store.entries().is_empty());
}

#[test]
fn a_wrong_file_checksum_fails_reads_instead_of_giving_other_bytes() {
    let (_d, mut store) = temp_store();
    let mut rng = Rng(13);
    let s = storages(&mut rng, 2, 80_000);
    let file = torch_zip("ck", &s, ZipOpts::default());
    let (skeleton, units, payload) = parts_of(&file, &[None, None]);
    store.commit_parts(b"x.pt", &skeleton, &units, &payload, 12345).unwrap();
    assert!(matches!(store.read(b"x.pt"), Err(CkptError::FileChecksum { .. })));
}

#[test]
fn large_parts_are_hashed_on_helper_threads_in_order() {
    let (_d, mut store) = temp_store();
    let mut rng = Rng(17);
    let s = storages(&mut rng, 9, 1 << 20);
    let file = torch_zip("ck", &s, ZipOpts::default());
    let (skeleton, units, payload) = parts_of(&file, &[None; 9]);
    let checked = store.check_parts(&skeleton, &units, &payload).unwrap();
    let want: Vec<[u8; 32]> = s.iter().map(|b| *blake3::hash(b).as_bytes()).collect();
    assert_eq!(checked, want);
    let (_, got) = store.commit_parts(b"big.pt", &skeleton, &units, &payload, fanstore_core::checksum::xxh3(&file)).unwrap();
    assert_eq!(got, want);
    assert_eq!(store.read(b"big.pt").unwrap(), file);
}
