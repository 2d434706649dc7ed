//! Byte-exact round trips of every recognised format through the store, and
//! malformed inputs that must fall back to opaque chunks.

mod common;

use common::*;
use fanstore_ckpt::split::{self, Piece};
use fanstore_ckpt::{CdcParams, CheckpointStore, Format};
use std::path::Path;
use std::process::Command;

/// Commits `bytes` at `path`, reads it back both ways, and returns the
/// commit's format and the owner map's tensor names.
fn round_trip(store: &mut CheckpointStore, path: &str, bytes: &[u8]) -> (Format, Vec<String>) {
    let info = store.commit(path.as_bytes(), bytes).unwrap();
    assert_eq!(info.logical, bytes.len() as u64);
    let back = store.read(path.as_bytes()).unwrap();
    assert!(back == bytes, "{path}: read() differs from the committed bytes");
    let mut streamed = Vec::new();
    assert_eq!(store.read_to(path.as_bytes(), &mut streamed).unwrap(), bytes.len() as u64);
    assert!(streamed == bytes, "{path}: read_to() differs from the committed bytes");
    let names = store.owners(path.as_bytes()).unwrap().rows.iter().map(|r| String::from_utf8_lossy(&r.name).into_owned()).collect();
    (info.format, names)
}

/// The payload bytes of every unit of a split, by name.
fn unit_bytes<'a>(bytes: &'a [u8], s: &split::Split) -> Vec<(String, &'a [u8])> {
    s.pieces
        .iter()
        .filter_map(|p| match p {
            Piece::Unit(r, m) => Some((String::from_utf8_lossy(&m.name).into_owned(), &bytes[r.clone()])),
            Piece::Glue(_) => None,
        })
        .collect()
}

fn sample_tensors(rng: &mut Rng) -> Vec<T> {
    vec![
        t("embed.weight", "F32", &[64, 32], rng.bytes(64 * 32 * 4)),
        t("layer.0.bias", "F16", &[32], rng.bytes(64)),
        t("empty", "F32", &[0, 4], vec![]),
        t("scalar", "I64", &[], rng.bytes(8)),
        t("naïve \"quoted\" \\ name\t", "U8", &[5], rng.bytes(5)),
    ]
}

#[test]
fn safetensors_round_trip_in_any_layout() {
    let (_d, mut store) = temp_store();
    let mut rng = Rng(11);
    let tensors = sample_tensors(&mut rng);
    for (i, o) in [
        StOpts::default(),
        StOpts { reverse_keys: true, gap: 0, metadata: true },
        StOpts { reverse_keys: false, gap: 13, metadata: true },
    ]
    .into_iter()
    .enumerate()
    {
        let f = safetensors(&tensors, o);
        let s = split::split(&f, &CdcParams::default());
        assert_eq!(s.format, Format::Safetensors);
        let units = unit_bytes(&f, &s);
        for t in &tensors {
            let got = units.iter().find(|(n, _)| *n == t.name).unwrap_or_else(|| panic!("no unit {}", t.name));
            assert_eq!(got.1, &t.data[..], "{}", t.name);
        }
        let (fmt, mut names) = round_trip(&mut store, &format!("st/{i}.safetensors"), &f);
        assert_eq!(fmt, Format::Safetensors);
        names.sort();
        let mut want: Vec<_> = tensors.iter().map(|t| t.name.clone()).collect();
        want.sort();
        assert_eq!(names, want);
    }
    // The same tensors in three layouts: stored once.
    let payload: u64 = tensors.iter().map(|t| t.data.len() as u64).sum();
    assert_eq!(store.du().unit_payload, payload);
    let o = store.owners(b"st/2.safetensors").unwrap();
    let r = o.rows.iter().find(|r| r.name == b"embed.weight").unwrap();
    assert_eq!((r.dtype.as_str(), r.shape.as_slice(), r.len, r.owner.id), ("F32", &[64u64, 32][..], 64 * 32 * 4, 1));
}

#[test]
fn torch_zip_round_trip_in_every_writer_mode() {
    let (_d, mut store) = temp_store();
    let mut rng = Rng(5);
    let storages: Vec<Vec<u8>> = [4096usize, 12, 0, 70_000, 1].iter().map(|&n| rng.bytes(n)).collect();
    let modes = [
        ZipOpts::default(),
        ZipOpts { crc: true, ..ZipOpts::default() },
        ZipOpts { descriptors: true, ..ZipOpts::default() },
        ZipOpts { zip64: true, ..ZipOpts::default() },
        ZipOpts { zip64: true, descriptors: true, crc: true, align: 64 },
        ZipOpts { align: 4096, ..ZipOpts::default() },
        ZipOpts { align: 0, ..ZipOpts::default() },
    ];
    for (i, o) in modes.into_iter().enumerate() {
        let f = torch_zip(&format!("ckpt_epoch{i}"), &storages, o);
        let s = split::split(&f, &CdcParams::default());
        assert_eq!(s.format, Format::TorchZip, "mode {i}");
        let units = unit_bytes(&f, &s);
        assert_eq!(units.len(), storages.len(), "mode {i}");
        for (k, st) in storages.iter().enumerate() {
            let u = units.iter().find(|(n, _)| *n == format!("data/{k}")).unwrap();
            assert_eq!(u.1, &st[..], "mode {i} storage {k}");
        }
        let (fmt, names) = round_trip(&mut store, &format!("pt/{i}.pt"), &f);
        assert_eq!(fmt, Format::TorchZip);
        assert_eq!(names.len(), storages.len());
    }
    // Storages are shared across all seven archives; the diff by name sees them unchanged.
    let payload: u64 = storages.iter().map(|s| s.len() as u64).sum();
    assert_eq!(store.du().unit_payload, payload);
    let diff = store.diff(b"pt/0.pt", b"pt/6.pt").unwrap();
    assert_eq!(diff.total(fanstore_ckpt::DiffStatus::Unchanged).0, storages.len());
}

#[test]
fn npy_and_npz_round_trip() {
    let (_d, mut store) = temp_store();
    let mut rng = Rng(9);
    let a = rng.bytes(4 * 60);
    for major in [1u8, 2, 3] {
        let f = npy("<f4", &[3, 4, 5], &a, major);
        let (fmt, names) = round_trip(&mut store, &format!("n/{major}.npy"), &f);
        assert_eq!((fmt, names), (Format::Npy, vec!["array".to_string()]));
    }
    let x = npy("<i8", &[7], &rng.bytes(56), 1);
    let y = npy("|u1", &[3, 3], &rng.bytes(9), 1);
    let deflated = rng.bytes(77); // a deflated member's bytes: a unit as is
    let members = vec![
        stored("x.npy", &x),
        stored("y.npy", &y),
        Member { name: "z.npy".into(), data: &deflated, method: 8, usize: 500 },
    ];
    let f = zip(&members, ZipOpts { align: 0, ..ZipOpts::default() });
    let s = split::split(&f, &CdcParams::default());
    assert_eq!(s.format, Format::Npz);
    let units = unit_bytes(&f, &s);
    assert_eq!(units.iter().find(|u| u.0 == "x.npy").unwrap().1, &x[x.len() - 56..]);
    assert_eq!(units.iter().find(|u| u.0 == "z.npy").unwrap().1, &deflated[..]);
    let (fmt, names) = round_trip(&mut store, "n/arrays.npz", &f);
    assert_eq!((fmt, names.len()), (Format::Npz, 3));
    let o = store.owners(b"n/arrays.npz").unwrap();
    let xr = o.rows.iter().find(|r| r.name == b"x.npy").unwrap();
    assert_eq!((xr.dtype.as_str(), xr.shape.as_slice()), ("<i8", &[7u64][..]));
}

#[test]
fn unknown_binary_is_chunked_and_still_deduplicates() {
    let (_d, mut store) = temp_store();
    let mut rng = Rng(3);
    let payload = rng.bytes(2 << 20);
    let f1 = unknown_binary(&payload);
    let (fmt, names) = round_trip(&mut store, "h5/a.h5", &f1);
    assert_eq!(fmt, Format::Opaque);
    assert!(names.len() > 8 && names[0] == "chunk-0", "{names:?}");
    // The same payload behind a longer header: chunks resynchronise.
    let mut f2 = b"a longer superblock".to_vec();
    f2.extend_from_slice(&f1);
    let info = store.commit(b"h5/b.h5", &f2).unwrap();
    assert!(info.new_bytes < f2.len() as u64 / 4, "{} new of {}", info.new_bytes, f2.len());
    assert_eq!(info.parent, Some(1));
    assert_eq!(store.read(b"h5/b.h5").unwrap(), f2);
    // Small and empty files.
    round_trip(&mut store, "h5/tiny", b"x");
    let (fmt, names) = round_trip(&mut store, "h5/empty", b"");
    assert_eq!((fmt, names.len()), (Format::Opaque, 0));
}

#[test]
fn malformed_inputs_fall_back_to_opaque_chunks() {
    let (_d, mut store) = temp_store();
    let mut rng = Rng(21);
    let tensors = vec![t("a", "F32", &[1000], rng.bytes(4000)), t("b", "F32", &[1000], rng.bytes(4000))];
    let good = safetensors(&tensors, StOpts::default());
    let hlen = u64::from_le_bytes(good[..8].try_into().unwrap()) as usize;
    let mut cases: Vec<(&str, Vec<u8>)> = Vec::new();
    cases.push(("truncated safetensors header", good[..8 + hlen / 2].to_vec()));
    let mut beyond = good.clone();
    beyond[..8].copy_from_slice(&(good.len() as u64 * 2).to_le_bytes());
    cases.push(("header length beyond EOF", beyond));
    let text = String::from_utf8(good[8..8 + hlen].to_vec()).unwrap();
    let overlapping = text.replacen("[4000,8000]", "[3000,7000]", 1);
    assert_ne!(overlapping, text);
    let mut ov = good.clone();
    ov[8..8 + hlen].copy_from_slice(overlapping.as_bytes());
    cases.push(("overlapping offsets", ov));
    let past = text.replacen("[4000,8000]", "[4000,8001]", 1);
    let mut pe = good.clone();
    pe[8..8 + hlen].copy_from_slice(past.as_bytes());
    cases.push(("offsets past the end", pe));
    let zipf = torch_zip("archive", &[rng.bytes(3000)], ZipOpts::default());
    let eocd = zipf.len() - 22;
    let mut bad_cd = zipf.clone();
    bad_cd[eocd + 16] ^= 0x5; // central directory offset
    cases.push(("zip with a bad central directory offset", bad_cd));
    let cd = u32::from_le_bytes(zipf[eocd + 16..eocd + 20].try_into().unwrap()) as usize;
    let mut bad_sig = zipf.clone();
    bad_sig[cd] = b'X';
    cases.push(("zip with a bad central header", bad_sig));
    let mut bad_local = zipf.clone();
    bad_local[30] ^= 1; // the first local header's name no longer agrees
    cases.push(("zip whose local header disagrees", bad_local));
    cases.push(("truncated zip", zipf[..zipf.len() - 30].to_vec()));
    let mut np = npy("<f4", &[10], &rng.bytes(40), 1);
    np[12] = b'#';
    cases.push(("npy with a bad header", np));
    let mut npv = npy("<f4", &[10], &rng.bytes(40), 1);
    npv[6] = 9;
    cases.push(("npy with an unknown version", npv));
    for (i, (what, bytes)) in cases.iter().enumerate() {
        assert_eq!(split::split_structured(bytes), None, "{what} was recognised");
        let (fmt, names) = round_trip(&mut store, &format!("bad/{i}"), bytes);
        assert_eq!(fmt, Format::Opaque, "{what}");
        assert!(names.iter().all(|n| n.starts_with("chunk-")), "{what}");
    }
}

const PY_FIXTURES: &str = r#"
import sys, numpy as np
from safetensors.numpy import save_file
out = sys.argv[1]
rng = np.random.default_rng(0)
t = {
    "embed.weight": rng.standard_normal((64, 32), dtype=np.float32),
    "layer.0.bias": np.zeros(32, np.float16),
    "scalar": np.array(3, np.int64),
    "empty": np.zeros((0, 4), np.float32),
    "ids": np.arange(100, dtype=np.uint8),
}
save_file(t, out + "/model.safetensors", metadata={"epoch": "3"})
save_file({"w": t["embed.weight"]}, out + "/plain.safetensors")
np.save(out + "/arr.npy", t["embed.weight"])
np.save(out + "/fortran.npy", np.asfortranarray(rng.standard_normal((5, 7))))
np.save(out + "/struct.npy", np.zeros(4, dtype=[("a", "<i4"), ("b", "<f8", (2,))]))
np.save(out + "/text.npy", np.array(["ab", "cde"]))
for v in [(2, 0), (3, 0)]:
    with open(out + "/v%d.npy" % v[0], "wb") as f:
        np.lib.format.write_array(f, t["embed.weight"], version=v)
np.savez(out + "/plain.npz", a=t["embed.weight"], b=t["ids"])
np.savez_compressed(out + "/comp.npz", a=t["embed.weight"], b=t["ids"])
"#;

/// Real files from the `safetensors` and `numpy` Python packages. Skipped
/// (loudly) when they are missing, except under CI, where they are installed.
#[test]
fn real_safetensors_and_numpy_files() {
    let d = tempfile::tempdir().unwrap();
    let fx = d.path().join("fixtures");
    std::fs::create_dir(&fx).unwrap();
    let ran = Command::new("python3").arg("-c").arg(PY_FIXTURES).arg(&fx).output();
    match ran {
        Ok(o) if o.status.success() => {}
        other => {
            let why = match other {
                Ok(o) => String::from_utf8_lossy(&o.stderr).into_owned(),
                Err(e) => e.to_string(),
            };
            assert!(std::env::var_os("CI").is_none(), "python3 with numpy and safetensors is required under CI: {why}");
            eprintln!("SKIPPED real_safetensors_and_numpy_files: {why}");
            return;
        }
    }
    let mut store = CheckpointStore::open(&d.path().join("store")).unwrap();
    let want = [
        ("model.safetensors", Format::Safetensors, 5),
        ("plain.safetensors", Format::Safetensors, 1),
        ("arr.npy", Format::Npy, 1),
        ("fortran.npy", Format::Npy, 1),
        ("struct.npy", Format::Npy, 1),
        ("text.npy", Format::Npy, 1),
        ("v2.npy", Format::Npy, 1),
        ("v3.npy", Format::Npy, 1),
        ("plain.npz", Format::Npz, 2),
        ("comp.npz", Format::Npz, 2),
    ];
    for (name, fmt, units) in want {
        let bytes = std::fs::read(fx.join(name)).unwrap();
        let (got, names) = round_trip(&mut store, &format!("real/{name}"), &bytes);
        assert_eq!((got, names.len()), (fmt, units), "{name}: {names:?}");
    }
    // The same float32 matrix is one unit across model.safetensors, plain.safetensors,
    // arr.npy, v2.npy, v3.npy and plain.npz.
    let o = store.owners(b"real/plain.npz").unwrap();
    let a = o.rows.iter().find(|r| r.name == b"a.npy").unwrap();
    assert_eq!((a.dtype.as_str(), a.shape.as_slice()), ("<f4", &[64u64, 32][..]));
    assert_eq!(a.owner.id, 1, "owner of the shared matrix");
    let st = store.owners(b"real/model.safetensors").unwrap();
    let dtypes: Vec<_> = st.rows.iter().map(|r| r.dtype.as_str()).collect();
    for dt in ["F32", "F16", "I64", "U8"] {
        assert!(dtypes.contains(&dt), "{dtypes:?}");
    }
    let f = File::open(fx.join("model.safetensors")).unwrap();
    let info = store.commit_file(b"real/again.safetensors", &f).unwrap();
    assert_eq!((info.units_new, info.parent), (0, Some(1)));
    assert_eq!(store.read(b"real/again.safetensors").unwrap(), std::fs::read(fx.join("model.safetensors")).unwrap());
    assert!(Path::new(&fx).exists());
}

use std::fs::File;

/// Pickles made by Python's own pickler the way torch.save makes data.pkl
/// (torch's reductions and persistent ids, emulated by stand-in `torch`
/// modules: torch itself is not installed), with the storage -> tensor
/// mapping Python computed, for protocols 2 (torch's default) and 4.
const PY_TORCH_PICKLES: &str = r#"
import sys, types, pickle, collections, json, os
torch = types.ModuleType("torch"); utils = types.ModuleType("torch._utils")
torch._utils = utils; sys.modules["torch"] = torch; sys.modules["torch._utils"] = utils
def mkcls(name):
    c = type(name, (), {}); c.__module__ = "torch"; c.__qualname__ = name; setattr(torch, name, c); return c
Float, Half, Long = mkcls("FloatStorage"), mkcls("HalfStorage"), mkcls("LongStorage")
def mkfn(name):
    def f(*a): pass
    f.__module__ = "torch._utils"; f.__qualname__ = f.__name__ = name; setattr(utils, name, f); return f
rebuild, rebuild_param = mkfn("_rebuild_tensor_v2"), mkfn("_rebuild_parameter")
class Storage:
    def __init__(s, key, cls, numel): s.key, s.cls, s.numel = key, cls, numel
class Tensor:
    def __init__(s, st, size): s.st, s.size = st, size
    def __reduce_ex__(s, proto):
        stride = tuple(1 for _ in s.size)
        return (rebuild, (s.st, 0, s.size, stride, False, collections.OrderedDict()))
class Parameter:
    def __init__(s, t): s.t = t
    def __reduce_ex__(s, proto): return (rebuild_param, (s.t, True, collections.OrderedDict()))
class P(pickle.Pickler):
    def persistent_id(s, o):
        return ("storage", o.cls, o.key, "cpu", o.numel) if isinstance(o, Storage) else None
S = [Storage(str(i), c, n) for i, (c, n) in enumerate([(Float, 12), (Half, 3), (Float, 6), (Long, 1), (Float, 6)])]
names = {}
dtype = {Float: "F32", Half: "F16", Long: "I64"}
def T(path, k, size):
    if S[k].key not in names: names[S[k].key] = [path, dtype[S[k].cls], list(size)]
    return Tensor(S[k], size)
sd = collections.OrderedDict()
sd["enc.weight"] = T("enc.weight", 0, (4, 3))
sd["enc.bias"] = T("enc.bias", 1, (3,))
sd["tied"] = Tensor(S[0], (12,))
sd["dec.weight"] = Parameter(T("dec.weight", 2, (2, 3)))
out = sys.argv[1]
for proto in (2, 4):
    with open(os.path.join(out, "sd%d.pkl" % proto), "wb") as f: P(f, protocol=proto).dump(sd)
full_names = {k: ["state_dict." + v[0], v[1], v[2]] for k, v in names.items()}
names.clear()
opt = {"state": {0: {"step": T("optimizer.state.0.step", 3, ()), "exp_avg": T("optimizer.state.0.exp_avg", 4, (2, 3))}},
       "param_groups": [{"lr": 0.1, "params": [0, 1]}]}
opt_names = dict(names)
ckpt = {"epoch": 3, "state_dict": sd, "optimizer": opt, "note": "x"}
for proto in (2, 4):
    with open(os.path.join(out, "ckpt%d.pkl" % proto), "wb") as f: P(f, protocol=proto).dump(ckpt)
sd_names = {k: [v[0][len("state_dict."):], v[1], v[2]] for k, v in full_names.items()}
full_names.update(opt_names)
json.dump({"sd": sd_names, "ckpt": full_names}, open(os.path.join(out, "expected.json"), "w"))
"#;

#[test]
fn torch_pickles_name_their_storages() {
    let d = tempfile::tempdir().unwrap();
    let ran = Command::new("python3").arg("-c").arg(PY_TORCH_PICKLES).arg(d.path()).output();
    match ran {
        Ok(o) if o.status.success() => {}
        other => {
            assert!(std::env::var_os("CI").is_none(), "python3 is required under CI: {other:?}");
            eprintln!("SKIPPED torch_pickles_name_their_storages: {other:?}");
            return;
        }
    }
    let expected_text = std::fs::read(d.path().join("expected.json")).unwrap();
    let expected = fanstore_ckpt::json::parse(&expected_text, fanstore_ckpt::json::Limits::default()).unwrap();
    let mut store = CheckpointStore::open(&d.path().join("store")).unwrap();
    let mut rng = Rng(31);
    let storages: Vec<Vec<u8>> = [48usize, 6, 24, 8, 24].iter().map(|&n| rng.bytes(n)).collect();
    for (file, which) in [("sd2.pkl", "sd"), ("sd4.pkl", "sd"), ("ckpt2.pkl", "ckpt"), ("ckpt4.pkl", "ckpt")] {
        let pkl = std::fs::read(d.path().join(file)).unwrap();
        let want = expected.get(which).unwrap().as_object().unwrap();
        let got = split::torch_storages(&pkl).unwrap_or_else(|| panic!("{file} not understood"));
        assert_eq!(got.len(), want.len(), "{file}: {got:?}");
        for (key, v) in want {
            let v = v.as_array().unwrap();
            let g = &got[key.as_ref()];
            assert_eq!(g.name, v[0].as_str().unwrap(), "{file} storage {key}");
            assert_eq!(g.dtype, v[1].as_str().unwrap(), "{file} storage {key}");
            let shape: Vec<u64> = v[2].as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect();
            assert_eq!(g.shape, shape, "{file} storage {key}");
        }
        // In an archive, the units carry those names; the bytes round-trip.
        let n = want.len();
        let f = torch_zip_with_pkl("model", &pkl, &storages[..n], ZipOpts::default());
        let (fmt, mut names) = round_trip(&mut store, &format!("pt/{file}.pt"), &f);
        assert_eq!(fmt, Format::TorchZip);
        names.sort();
        let mut want_names: Vec<String> = want.iter().map(|(_, v)| v.as_array().unwrap()[0].as_str().unwrap().to_string()).collect();
        want_names.sort();
        assert_eq!(names, want_names, "{file}");
    }
    // The state_dict's tensors keep their names and owners across the two archives.
    let diff = store.diff(b"pt/sd2.pkl.pt", b"pt/sd4.pkl.pt").unwrap();
    assert_eq!(diff.total(fanstore_ckpt::DiffStatus::Unchanged).0, 3);
}

/// A shard as torch.distributed.checkpoint writes it: one torch.save
/// archive per item, back to back, each with offsets from its own start.
fn dcp_shard(items: &[Vec<u8>]) -> Vec<u8> {
    items.concat()
}

/// A commit from parts splits a skeleton whose unit ranges are zeros never
/// written: the DCP split must not read them (on a 50 MB shard that was two
/// scans and 12,800 zero-page faults per save). The units' inner pages are
/// made unreadable here: a split that reads them crashes the test.
#[test]
fn a_dcp_skeleton_is_split_without_reading_its_units() {
    let mut rng = Rng(43);
    let page = 4096;
    let items: Vec<Vec<u8>> = (0..3).map(|_| rng.bytes(5 * page)).collect();
    let shard = dcp_shard(&[
        torch_zip("archive", std::slice::from_ref(&items[0]), ZipOpts { descriptors: true, align: 64, ..ZipOpts::default() }),
        torch_zip("archive", &[], ZipOpts::default()),
        torch_zip("archive", &items[1..], ZipOpts { descriptors: true, align: 64, ..ZipOpts::default() }),
    ]);
    let full = split::split_dcp(&shard).expect("a shard");
    let units: Vec<std::ops::Range<usize>> = full.pieces.iter().filter_map(|p| match p {
        Piece::Unit(r, _) => Some(r.clone()),
        Piece::Glue(_) => None,
    }).collect();
    assert_eq!(units.len(), 3);
    let mut map = memmap2::MmapMut::map_anon(shard.len()).unwrap();
    for p in &full.pieces {
        if let Piece::Glue(r) = p {
            map[r.clone()].copy_from_slice(&shard[r.clone()]);
        }
    }
    let base = map.as_ptr() as usize;
    for r in &units {
        let (lo, hi) = ((base + r.start).next_multiple_of(page), (base + r.end) / page * page);
        assert!(hi - lo >= 3 * page);
        // SAFETY: pages inside this test's own anonymous mapping; nothing
        // else refers to them, and the mapping outlives the split below.
        assert_eq!(unsafe { libc::mprotect(lo as *mut libc::c_void, hi - lo, libc::PROT_NONE) }, 0);
    }
    let skipped = split::split_structured_skipping(&map, &units).expect("the skeleton splits");
    assert_eq!(skipped.format, Format::TorchDcp);
    assert_eq!(skipped.pieces, full.pieces);
}

#[test]
fn dcp_shards_split_per_item_and_deduplicate_across_checkpoints() {
    let (_d, mut store) = temp_store();
    let mut rng = Rng(41);
    let frozen = rng.bytes(40_000);
    let mut changing = rng.bytes(30_000);
    // A payload holding an end-record signature (comment length 0) that is not an archive's end.
    let mut decoy = rng.bytes(5_000);
    decoy[1000..1004].copy_from_slice(b"PK\x05\x06");
    decoy[1020..1022].copy_from_slice(&[0, 0]);
    let shard = |changing: &[u8]| {
        dcp_shard(&[
            torch_zip("archive", std::slice::from_ref(&frozen), ZipOpts { descriptors: true, ..ZipOpts::default() }),
            torch_zip("archive", &[], ZipOpts::default()), // a non-tensor item (BYTE_IO)
            torch_zip("archive", &[changing.to_vec()], ZipOpts { descriptors: true, align: 64, ..ZipOpts::default() }),
            torch_zip("archive", &[decoy.clone(), rng_bytes(7, 300)], ZipOpts { zip64: true, ..ZipOpts::default() }),
        ])
    };
    let f1 = shard(&changing);
    let s = split::split(&f1, &CdcParams::default());
    assert_eq!(s.format, Format::TorchDcp);
    let units = unit_bytes(&f1, &s);
    let names: Vec<&str> = units.iter().map(|u| u.0.as_str()).collect();
    assert_eq!(names, ["item0", "item2", "item3/data/0", "item3/data/1"]);
    assert_eq!(units[0].1, &frozen[..]);
    assert_eq!(units[1].1, &changing[..]);
    assert_eq!(units[2].1, &decoy[..]);
    let (fmt, _) = round_trip(&mut store, "dcp/step1/__0_0.distcp", &f1);
    assert_eq!(fmt, Format::TorchDcp);
    // The next checkpoint changes one item: only its bytes are new.
    changing[100] ^= 1;
    let f2 = shard(&changing);
    let info = store.commit(b"dcp/step2/__0_0.distcp", &f2).unwrap();
    assert_eq!(info.format, Format::TorchDcp);
    assert!(info.new_bytes < 31_000, "{} new bytes of {}", info.new_bytes, f2.len());
    assert_eq!(store.read(b"dcp/step2/__0_0.distcp").unwrap(), f2);
    let diff = store.diff(b"dcp/step1/__0_0.distcp", b"dcp/step2/__0_0.distcp").unwrap();
    assert_eq!(diff.total(fanstore_ckpt::DiffStatus::Unchanged).0, 3);
    assert_eq!(diff.total(fanstore_ckpt::DiffStatus::Changed).0, 1);
    // Items of one layout (same sizes): the last archive's relative offsets also
    // fit the first archive, which must not be taken for one archive plus junk.
    let (a, b) = (rng_bytes(1, 1000), rng_bytes(2, 1000));
    for o in [ZipOpts::default(), ZipOpts { zip64: true, descriptors: true, ..ZipOpts::default() }] {
        let same = dcp_shard(&[torch_zip("archive", &[a.clone()], o), torch_zip("archive", &[b.clone()], o)]);
        let s = split::split(&same, &CdcParams::default());
        assert_eq!(s.format, Format::TorchDcp, "{o:?}");
        assert_eq!(unit_bytes(&same, &s), [("item0".to_string(), &a[..]), ("item1".to_string(), &b[..])], "{o:?}");
    }
    // Not shards: one archive alone is a torch.save file; a damaged end record, a
    // trailing byte or a foreign archive in the sequence fall back to chunks.
    let one = torch_zip("archive", std::slice::from_ref(&frozen), ZipOpts::default());
    assert_eq!(split::split(&one, &CdcParams::default()).format, Format::TorchZip);
    let first_len = torch_zip("archive", std::slice::from_ref(&frozen), ZipOpts { descriptors: true, ..ZipOpts::default() }).len();
    let mut bad_end = f1.clone();
    bad_end[first_len - 22 + 16] ^= 0x40; // archive 0's central directory offset
    let mut trailing = f1.clone();
    trailing.push(0);
    let npz_inside = dcp_shard(&[one.clone(), zip(&[stored("x.npy", &npy("<f4", &[1], &[0; 4], 1))], ZipOpts::default())]);
    for (what, b) in [("damaged end record", bad_end), ("trailing byte", trailing), ("an npz in the sequence", npz_inside)] {
        assert!(split::split_dcp(&b).is_none(), "{what}");
        let (fmt, _) = round_trip(&mut store, &format!("bad/{what}"), &b);
        assert_eq!(fmt, Format::Opaque, "{what}");
    }
}

fn rng_bytes(seed: u64, n: usize) -> Vec<u8> {
    Rng(seed).bytes(n)
}
