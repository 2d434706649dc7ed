"""Client matrix, Python libraries: numpy, pillow, h5py, safetensors read /fanstore.

Each script prints, per file, digests of the decoded values (dtype, shape,
md5 of the array bytes); the same script runs natively on the source tree and
under LD_PRELOAD on the mount, and the outputs must be equal.
"""
import json

import pytest

from fs_clients import start_fs


@pytest.fixture(scope="module")
def fs(bins, tmp_path_factory):
    yield from start_fs(bins, tmp_path_factory, "libs", codec="lz4")


def compare(fs, code, node, expect_keys):
    """Runs `code` natively and on the mount; both must decode the same
    values, and the native run must see exactly `expect_keys` (not none)."""
    assert expect_keys, "bad test: no source file of the kind"
    nat, vir = fs.py_both(code, node=node)
    n, v = json.loads(nat), json.loads(vir)
    assert sorted(n) == sorted(expect_keys), "bad test: the native run did not see the expected files"
    for k in n:
        assert v.get(k) == n[k], f"{k}: {v.get(k)} != {n[k]}"


def files_ending(fs, *suffixes):
    """The source tree's files whose names end with one of `suffixes`."""
    return [f for f in fs.src.files if f.endswith(suffixes)]


NUMPY = r'''
import glob, hashlib, json, os, sys
import numpy as np
root = sys.argv[1]
def dig(a):
    a = np.asarray(a)
    return [str(a.dtype), list(a.shape), hashlib.md5(np.ascontiguousarray(a).tobytes()).hexdigest()]
out = {}
for p in sorted(glob.glob(os.path.join(root, "**", "*.npy"), recursive=True)):
    rel = os.path.relpath(p, root)
    a = np.load(p)
    m = np.load(p, mmap_mode="r")
    with open(p, "rb") as f:
        fo = np.load(f)
    out[rel] = [dig(a), dig(m), dig(fo), type(m).__name__, bool(m.flags.f_contiguous)]
for p in sorted(glob.glob(os.path.join(root, "**", "*.npz"), recursive=True)):
    rel = os.path.relpath(p, root)
    with np.load(p) as z:
        out[rel] = {k: dig(z[k]) for k in sorted(z.files)}
    with np.load(p, mmap_mode="r") as z:   # ignored for npz, must still work
        out[rel + ":mmap"] = {k: dig(z[k]) for k in sorted(z.files)}
for p in sorted(glob.glob(os.path.join(root, "own", "arrays", "raw_*.bin"))):
    rel = os.path.relpath(p, root)
    dt = np.float32 if "f32" in rel else np.int32
    a = np.fromfile(p, dtype=dt)
    b = np.fromfile(p, dtype=dt, count=100, offset=4 * 50)
    with open(p, "rb") as f:
        f.seek(8)
        c = np.fromfile(f, dtype=np.uint8, count=1000)
    d = np.memmap(p, dtype=np.uint8, mode="r")
    out[rel] = [dig(a), dig(b), dig(c), dig(d)]
for rel in ["own/big/random_2m.bin", "own/big/zeros_1m.bin"]:
    out[rel] = dig(np.fromfile(os.path.join(root, rel), dtype=np.uint8))
print(json.dumps(out, sort_keys=True))
'''


@pytest.mark.parametrize("node", [0, 2])
def test_numpy(fs, node):
    keys = files_ending(fs, ".npy")
    npz = files_ending(fs, ".npz")
    keys += npz + [f + ":mmap" for f in npz]
    keys += [f for f in fs.src.files if f.startswith("own/arrays/raw_")]
    keys += ["own/big/random_2m.bin", "own/big/zeros_1m.bin"]
    compare(fs, NUMPY, node, keys)


def test_numpy_values_match_source_directly(fs):
    """np.fromfile / np.load on /fanstore equal the source bytes (not just a native run)."""
    code = r'''
import hashlib, sys, numpy as np
root = sys.argv[1]
print(hashlib.md5(np.fromfile(root + "/own/big/random_2m.bin", dtype=np.uint8).tobytes()).hexdigest())
print(hashlib.md5(np.load(root + "/own/arrays/ramp_u16.npy", mmap_mode="r").tobytes()).hexdigest())
'''
    import hashlib
    import numpy as np
    out = fs.py(code, node=1).stdout.split()
    assert out[0] == fs.src.md5("own/big/random_2m.bin")
    assert out[1] == hashlib.md5(np.load(fs.src.path("own/arrays/ramp_u16.npy")).tobytes()).hexdigest()


PILLOW = r'''
import glob, hashlib, io, json, os, sys
import numpy as np
from PIL import Image
root = sys.argv[1]
out = {}
files = sorted(glob.glob(os.path.join(root, "**", "*.png"), recursive=True) + glob.glob(os.path.join(root, "**", "*.jpg"), recursive=True))
for p in files:
    rel = os.path.relpath(p, root)
    im = Image.open(p)
    im.load()
    px = np.asarray(im)
    r = [im.format, im.mode, list(im.size), hashlib.md5(px.tobytes()).hexdigest()]
    with open(p, "rb") as f:             # from a file object
        im2 = Image.open(f); im2.load()
        r.append(hashlib.md5(np.asarray(im2).tobytes()).hexdigest())
    with Image.open(p) as im3:            # lazy: draft/thumbnail path
        im3.thumbnail((16, 16))
        r.append(hashlib.md5(np.asarray(im3).tobytes()).hexdigest())
    out[rel] = r
print(json.dumps(out, sort_keys=True))
'''


@pytest.mark.parametrize("node", [1, 3])
def test_pillow_png_jpeg(fs, node):
    keys = files_ending(fs, ".png", ".jpg")
    assert any(k.endswith(".jpg") for k in keys) and any(k.endswith(".png") for k in keys)
    compare(fs, PILLOW, node, keys)


H5 = r'''
import glob, hashlib, json, os, sys
import h5py, numpy as np
root = sys.argv[1]
out = {}
for p in sorted(glob.glob(os.path.join(root, "**", "*.h5"), recursive=True)):
    rel = os.path.relpath(p, root)
    r = {}
    with h5py.File(p, "r") as h:
        def visit(name, obj):
            if isinstance(obj, h5py.Dataset):
                a = obj[()]
                r[name] = [str(a.dtype), list(a.shape), hashlib.md5(np.ascontiguousarray(a).tobytes()).hexdigest(),
                           obj.chunks and list(obj.chunks), obj.compression]
                if a.ndim >= 1 and len(a) > 3:
                    r[name + "[1:3]"] = hashlib.md5(np.ascontiguousarray(obj[1:3]).tobytes()).hexdigest()
        h.visititems(visit)
        r["attrs"] = sorted([k, str(v)] for k, v in h.attrs.items())
        r["grp_attrs"] = sorted([k, str(v)] for k, v in h["grp"].attrs.items()) if "grp" in h else None
    with open(p, "rb") as f, h5py.File(f, "r") as h:   # a Python file object driver
        r["fileobj_x"] = hashlib.md5(h["x"][()].tobytes()).hexdigest() if "x" in h else None
    out[rel] = r
print(json.dumps(out, sort_keys=True))
'''


@pytest.mark.parametrize("node", [0, 3])
def test_h5py(fs, node):
    compare(fs, H5, node, files_ending(fs, ".h5"))


SAFETENSORS = r'''
import glob, hashlib, json, os, sys
import numpy as np
from safetensors import safe_open
from safetensors.numpy import load_file, load
root = sys.argv[1]
def dig(a):
    return [str(a.dtype), list(a.shape), hashlib.md5(np.ascontiguousarray(a).tobytes()).hexdigest()]
out = {}
for p in sorted(glob.glob(os.path.join(root, "**", "*.safetensors"), recursive=True)):
    rel = os.path.relpath(p, root)
    r = {}
    with safe_open(p, framework="numpy") as f:     # mmap of the file
        r["keys"] = sorted(f.keys())
        r["metadata"] = f.metadata()
        r["safe_open"] = {k: dig(f.get_tensor(k)) for k in sorted(f.keys())}
        r["slices"] = {k: dig(f.get_slice(k)[0:2]) for k in sorted(f.keys())}
    r["load_file"] = {k: dig(v) for k, v in sorted(load_file(p).items())}
    with open(p, "rb") as fh:
        r["load_bytes"] = {k: dig(v) for k, v in sorted(load(fh.read()).items())}
    out[rel] = r
print(json.dumps(out, sort_keys=True))
'''


@pytest.mark.parametrize("node", [1, 2])
def test_safetensors(fs, node):
    compare(fs, SAFETENSORS, node, files_ending(fs, ".safetensors"))
