"""Checkpoint files for the dedup tests, built byte by byte (no torch needed).

    torch_zip({'enc.weight': arr, ...})   -> bytes as torch.save writes them: a
        zip of stored entries (archive/data.pkl, archive/byteorder,
        archive/data/0.., archive/version, archive/.data/serialization_id),
        every payload 64-byte aligned by an "FB" extra field, as PyTorch's
        inline_container (caffe2/serialize/inline_container.cc) does; data.pkl
        is a protocol-2 pickle of an OrderedDict of
        torch._utils._rebuild_tensor_v2(persistent_id(('storage',
        torch.FloatStorage, key, 'cpu', numel)), offset, size, stride, False,
        OrderedDict()).
    opaque_blob(seed, ...)                -> random bytes made of repeated blocks
    series_state(base, k, frozen)         -> the k-th checkpoint of a fine-tuning series
    malformed()                           -> {name: bytes} of broken checkpoints (all >= 64 KiB)
    write_files(d, {name: bytes})         -> writes /fanstore/<d>/<name>; {d/name: sha256 and length}

Imported by client programs that run under LD_PRELOAD (tests/ is outside the
mount) and by the tests themselves.
"""
import collections
import hashlib
import io
import os
import pickle
import struct
import sys
import types
import zlib

import numpy as np

ALIGN = 64

# numpy dtype -> torch storage class name (pickled as torch.<Name>)
_STORAGE = {
    "float32": "FloatStorage",
    "float64": "DoubleStorage",
    "float16": "HalfStorage",
    "int64": "LongStorage",
    "int32": "IntStorage",
    "int16": "ShortStorage",
    "int8": "CharStorage",
    "uint8": "ByteStorage",
    "bool": "BoolStorage",
}
# what fanstore-ckpt reports for them (split/pickle.rs storage_dtype)
STORAGE_DTYPE = {
    "FloatStorage": "F32", "DoubleStorage": "F64", "HalfStorage": "F16", "LongStorage": "I64",
    "IntStorage": "I32", "ShortStorage": "I16", "CharStorage": "I8", "ByteStorage": "U8", "BoolStorage": "BOOL",
}


# --------------------------------------------------------------------------
# zip (stored entries, PyTorch alignment)
# --------------------------------------------------------------------------

def _fb_extra(offset: int, name_len: int) -> bytes:
    """PyTorch's getPadding(): an "FB" extra field whose padding puts the payload
    of a local header at `offset` on a 64-byte boundary (always present)."""
    start = offset + 30 + name_len + 4
    pad = (-start) % ALIGN
    return b"FB" + struct.pack("<H", pad) + b"Z" * pad


def zip_stored(entries, align=True, crc=True) -> bytes:
    """A zip of stored (uncompressed) entries [(name, payload)], no ZIP64."""
    out = io.BytesIO()
    central = []
    for name, data in entries:
        name_b = name.encode()
        off = out.tell()
        extra = _fb_extra(off, len(name_b)) if align else b""
        c = zlib.crc32(data) & 0xFFFFFFFF if crc else 0
        out.write(struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, 0, 0, 0, 0x21, c, len(data), len(data),
                              len(name_b), len(extra)))
        out.write(name_b)
        out.write(extra)
        assert not align or out.tell() % ALIGN == 0
        out.write(data)
        central.append(struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 20, 20, 0, 0, 0, 0x21, c, len(data),
                                   len(data), len(name_b), 0, 0, 0, 0, 0, off) + name_b)
    cd_off = out.tell()
    for h in central:
        out.write(h)
    cd_size = out.tell() - cd_off
    out.write(struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, len(central), len(central), cd_size, cd_off, 0))
    return out.getvalue()


def eocd_offset(b: bytes) -> int:
    return b.rindex(b"PK\x05\x06")


# --------------------------------------------------------------------------
# torch.save without torch
# --------------------------------------------------------------------------

def _fake_torch():
    """Modules named torch / torch._utils holding the globals torch.save's pickle
    names, so that the standard pickler writes them as GLOBAL opcodes."""
    torch = types.ModuleType("torch")
    utils = types.ModuleType("torch._utils")

    def _rebuild_tensor_v2(*a):  # never called: we only pickle
        raise AssertionError("not torch")

    _rebuild_tensor_v2.__module__ = "torch._utils"
    _rebuild_tensor_v2.__qualname__ = "_rebuild_tensor_v2"
    utils._rebuild_tensor_v2 = _rebuild_tensor_v2
    torch._utils = utils
    for cls in _STORAGE.values():
        setattr(torch, cls, type(cls, (), {"__module__": "torch", "__qualname__": cls}))
    return torch, utils


class _Storage:
    def __init__(self, key, cls, numel):
        self.key, self.cls, self.numel = key, cls, numel


class _Tensor:
    def __init__(self, rebuild, storage, shape):
        self.rebuild, self.storage, self.shape = rebuild, storage, tuple(int(d) for d in shape)

    def __reduce_ex__(self, proto):
        stride = []
        acc = 1
        for d in reversed(self.shape):
            stride.append(acc)
            acc *= d
        return (self.rebuild, (self.storage, 0, self.shape, tuple(reversed(stride)), False, collections.OrderedDict()))


class _Pickler(pickle.Pickler):
    def __init__(self, f, torch_mod):
        super().__init__(f, protocol=2)
        self.torch_mod = torch_mod

    def persistent_id(self, obj):
        if isinstance(obj, _Storage):
            return ("storage", getattr(self.torch_mod, obj.cls), obj.key, "cpu", obj.numel)
        return None


def torch_pickle(state_dict: dict) -> bytes:
    """data.pkl of a state_dict whose i-th tensor lives in storage key str(i)."""
    torch, utils = _fake_torch()
    saved = {k: sys.modules.get(k) for k in ("torch", "torch._utils")}
    sys.modules["torch"], sys.modules["torch._utils"] = torch, utils
    try:
        od = collections.OrderedDict()
        for i, (name, arr) in enumerate(state_dict.items()):
            cls = _STORAGE[str(arr.dtype)]
            od[name] = _Tensor(utils._rebuild_tensor_v2, _Storage(str(i), cls, int(arr.size)), arr.shape)
        f = io.BytesIO()
        _Pickler(f, torch).dump(od)
        return f.getvalue()
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v


def torch_zip(state_dict: dict, archive="archive", crc=True) -> bytes:
    """The bytes torch.save(state_dict, f) writes (new zip serialization), with
    storage key str(i) holding the i-th tensor's little-endian bytes."""
    entries = [(f"{archive}/data.pkl", torch_pickle(state_dict)), (f"{archive}/byteorder", b"little")]
    for i, arr in enumerate(state_dict.values()):
        entries.append((f"{archive}/data/{i}", np.ascontiguousarray(arr).astype(arr.dtype.newbyteorder("<")).tobytes()))
    entries.append((f"{archive}/version", b"3\n"))
    entries.append((f"{archive}/.data/serialization_id", b"1234567890123456789012345678901234567890"))
    return zip_stored(entries, crc=crc)


def storage_dtype(arr) -> str:
    return STORAGE_DTYPE[_STORAGE[str(arr.dtype)]]


# --------------------------------------------------------------------------
# other content
# --------------------------------------------------------------------------

def format_samples():
    """(state_dict for safetensors and torch zip, arrays for np.savez, array for np.save)."""
    rng = np.random.default_rng(1)
    st = {"emb": rng.random((64, 1024), dtype=np.float32),            # 256 KiB
          "proj": rng.random((128, 256), dtype=np.float32),           # 128 KiB
          "step": np.array([7], dtype=np.int64)}
    arrs = {"x": rng.random((100, 1000), dtype=np.float32),          # 400 KB
            "y": rng.integers(-1000, 1000, 50000).astype(np.int16)}  # 100 KB
    single = rng.random(20000)                                        # float64, 160 KB
    return st, arrs, single


def small_safetensors_bytes() -> bytes:
    from safetensors.numpy import save
    return save({"t": np.arange(1000, dtype=np.float32)})


def opaque_blob(seed=7, nblocks=6, block=192 << 10, repeats=4) -> bytes:
    """Not a known format: `nblocks` random blocks, each written `repeats` times,
    interleaved (a b c ... a b c ...), behind a small odd-sized preamble."""
    rng = np.random.default_rng(seed)
    blocks = [rng.integers(0, 256, block, dtype=np.uint8).tobytes() for _ in range(nblocks)]
    return b"OPAQUE-FORMAT v1\x00\x01\x02" + b"".join(b"".join(blocks) for _ in range(repeats))


SERIES_TENSORS = 40
SERIES_ELEMS = (5 << 20) // 4      # 5 MiB of float32 per tensor


def series_base(n_tensors=SERIES_TENSORS, elems=SERIES_ELEMS):
    """Distinct seeded base tensors (cheap: uniform float32)."""
    return [np.random.default_rng(1000 + i).random(elems, dtype=np.float32) for i in range(n_tensors)]


def series_state(base, k: int, frozen: int) -> dict:
    """Checkpoint k (1-based) of a fine-tuning run: tensors [0, frozen) are frozen
    after checkpoint 1 (their checkpoint-1 values), the others move every
    checkpoint (base + k)."""
    out = {}
    for i, b in enumerate(base):
        step = 1 if (i < frozen and k > 1) else k
        out[f"layer{i:02d}.weight"] = b + np.float32(step)
    return out


# --------------------------------------------------------------------------
# malformed inputs (each >= 64 KiB so that the store sees it)
# --------------------------------------------------------------------------

def _st_file(header: bytes, data: bytes, n=None) -> bytes:
    return struct.pack("<Q", len(header) if n is None else n) + header + data


def malformed() -> dict:
    rng = np.random.default_rng(99)
    data = rng.integers(0, 256, 120_000, dtype=np.uint8).tobytes()
    ok_hdr = b'{"a":{"dtype":"U8","shape":[60000],"data_offsets":[0,60000]},' \
             b'"b":{"dtype":"U8","shape":[60000],"data_offsets":[60000,120000]}}'
    out = {}
    # the length says the whole header, but the JSON stops mid-way
    cut = ok_hdr[:37]
    out["truncated_header.safetensors"] = _st_file(cut, data)
    # the header length points past the end of the file
    out["header_beyond_eof.safetensors"] = _st_file(ok_hdr, data, n=len(ok_hdr) + len(data) + 4096)
    # two tensors sharing bytes 40000..80000
    ov = b'{"a":{"dtype":"U8","shape":[80000],"data_offsets":[0,80000]},' \
         b'"b":{"dtype":"U8","shape":[80000],"data_offsets":[40000,120000]}}'
    out["overlap.safetensors"] = _st_file(ov, data)
    # a torch.save zip whose central directory is damaged (its first entry's signature)
    sd = {"w": rng.random(20_000, dtype=np.float32), "b": rng.random(10_000, dtype=np.float32)}
    z = bytearray(torch_zip(sd))
    eocd = eocd_offset(bytes(z))
    (cd_off,) = struct.unpack_from("<I", z, eocd + 16)
    z[cd_off:cd_off + 4] = b"PK\x09\x09"
    out["bad_central_dir.pt"] = bytes(z)
    # a torch zip whose EOCD points the central directory past the end
    z2 = bytearray(torch_zip(sd))
    eocd = eocd_offset(bytes(z2))
    struct.pack_into("<I", z2, eocd + 16, len(z2) + 100)
    out["cd_past_eof.pt"] = bytes(z2)
    # .npy magic with a header that is not a dict
    hdr = b"{'descr': '<f4', 'fortran_order': False, 'shape': (30000,), 'extra': 1, }"
    hdr += b" " * ((-(10 + len(hdr) + 1)) % 64) + b"\n"
    out["bad_header.npy"] = b"\x93NUMPY\x01\x00" + struct.pack("<H", len(hdr)) + hdr + data
    for k, v in out.items():
        assert len(v) >= 64 << 10, k
    return out


def digest(b: bytes) -> dict:
    """What a writing client reports of a file's bytes, for the readers to check."""
    return {'sha256': hashlib.sha256(b).hexdigest(), 'len': len(b)}


def write_files(d: str, files: dict, root='/fanstore') -> dict:
    """Writes each name -> bytes of `files`, in order, to `root`/`d`/name (the
    directory made if missing); returns {d/name: digest} of what it wrote."""
    os.makedirs(os.path.join(root, d), exist_ok=True)
    out = {}
    for name, b in files.items():
        with open(os.path.join(root, d, name), 'wb') as f:
            f.write(b)
        out[d + '/' + name] = digest(b)
    return out
