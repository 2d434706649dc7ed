"""`fanstore.safetensors.save_file`: safetensors' `save_file` that sends
only what changed.

`save_file(tensors, filename, metadata)` writes the file
`safetensors.torch.save_file` writes: an 8-byte header length, the JSON
header (padded with spaces to 8 bytes), then every tensor's bytes, the
tensors ordered by dtype (widest first, as the installed safetensors
orders them) then by name. Under the mount of a running FanStore job whose
daemon keeps the checkpoint store (`--dedup on`) the file is not written
through POSIX: the header travels as glue, each tensor the node's store
holds already (this process saved the same bytes before, in any format of
this package) as a reference, the others as bytes, in one CKPT_PUT, as
`fanstore.torch.save` sends an archive (`fanstore._tracker` decides).

The header is built here, so the layout is checked against the installed
safetensors once per process: a probe of one tensor of every dtype and
metadata with escapes is laid out both ways, and if the bytes differ (a
version of safetensors that lays files out otherwise) every save is
safetensors' own. Metadata of several keys: safetensors writes them in its
hash map's order, which varies between runs; here they are in the dict's
order (either file reads back the same dict).

Anywhere else (a path outside the mount, no daemon or no store, tensors off
the CPU, not contiguous, sharing memory, or views of part of a storage) it
is `safetensors.torch.save_file` itself, errors included.

```python
import fanstore.safetensors
fanstore.safetensors.save_file(model.state_dict(), "/fanstore/ckpt/step-100.safetensors", {"step": "100"})
```
"""
import errno as _errno
import json
import os
import struct

import xxhash

from . import _daemon, _parts
from . import torch as _ft

__all__ = ["save_file"]



def save_file(tensors, filename, metadata=None, *, trust_version=False):
    """`safetensors.torch.save_file(tensors, filename, metadata)`, sending
    only the tensors that changed when `filename` is under a running
    FanStore job's mount (see the module doc). `trust_version`: as in
    `fanstore.torch.save`."""
    with _ft._SAVE_LOCK:
        _ft._wait_inflight()
        if not _save(tensors, filename, metadata, trust_version):
            from safetensors.torch import save_file as native
            native(tensors, filename, metadata=metadata)


def _save(tensors, filename, metadata, trust_version) -> bool:
    """Commits the file as parts; False where safetensors must write it."""
    if not isinstance(filename, (str, os.PathLike)):
        return False
    daemon = _daemon.find()
    rel = daemon.relative(filename) if daemon is not None else None
    if rel is None or not daemon.dedup:
        return False
    order = _plan(tensors, metadata)
    if order is None or not _layout_matches():
        return False
    conn = _ft._connection(daemon)
    _ft._TRACKER.sweep()
    path = os.fspath(filename)
    for _attempt in range(2):
        prep = _prepare(path, rel, tensors, metadata, order, trust_version)
        try:
            if _ft._send(conn, prep):
                return True
        finally:
            prep.close()
        # The store no longer holds what we referred to: every byte again.
        _ft._TRACKER.reset(daemon.identity)
    raise OSError(_errno.ESTALE, "the checkpoint store refused the file's references twice", path)


def _plan(tensors, metadata):
    """The names in file order, or None where safetensors itself must
    write (or refuse) the file."""
    import torch
    from safetensors.torch import _TYPES
    codes = {dt: code for code, dt in _TYPES.items()}
    if not isinstance(tensors, dict) or not tensors:
        return None
    if metadata is not None and not (isinstance(metadata, dict)
                                     and all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items())):
        return None
    ranks = _dtype_ranks()
    seen = set()
    for name, t in tensors.items():
        if not isinstance(name, str) or not isinstance(t, torch.Tensor) or t.device.type != "cpu" \
                or t.layout != torch.strided or not t.is_contiguous() or codes.get(t.dtype) not in ranks:
            return None
        storage = t.untyped_storage()
        # A view of part of a storage, or two tensors of one storage (shared
        # weights, which safetensors refuses): its own writer decides.
        if t.storage_offset() != 0 or storage.nbytes() != t.nbytes or (t.nbytes and storage.data_ptr() in seen):
            return None
        seen.add(storage.data_ptr())
    try:
        for name in tensors:
            name.encode("utf-8")
        for k, v in (metadata or {}).items():
            k.encode("utf-8"), v.encode("utf-8")
    except UnicodeEncodeError:
        return None
    return sorted(tensors, key=lambda n: (-ranks[codes[tensors[n].dtype]], n))


def _header(entries, metadata) -> bytes:
    """The 8-byte length and the JSON header of tensors `entries`, a list
    of (name, dtype code, shape, byte length) in file order."""
    dumps = lambda o: json.dumps(o, ensure_ascii=False, separators=(",", ":"))  # noqa: E731
    fields = []
    if metadata is not None:
        fields.append('"__metadata__":' + dumps(metadata))
    at = 0
    for name, code, shape, n in entries:
        fields.append(f'{dumps(name)}:{{"dtype":"{code}","shape":{dumps(list(shape))},"data_offsets":[{at},{at + n}]}}')
        at += n
    text = ("{" + ",".join(fields) + "}").encode("utf-8")
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text


def _entries(tensors, order):
    from safetensors.torch import _TYPES
    codes = {dt: code for code, dt in _TYPES.items()}
    return [(n, codes[tensors[n].dtype], tuple(tensors[n].shape), tensors[n].nbytes) for n in order]


def _prepare(path, rel, tensors, metadata, order, trust_version) -> "_ft._Prepared":
    """One pass over the tensors' bytes: the whole-file xxh3, each
    tensor's fingerprint (unless its counters are trusted), and the parts
    file (a sealed memfd) of the header, references and changed bytes."""
    head = _header(_entries(tensors, order), metadata)
    h = xxhash.xxh3_64(head)
    parts, decisions = [("glue", head)], []
    length = len(head)
    for name in order:
        t = tensors[name]
        d = _ft._TRACKER.begin(t.untyped_storage(), [t], trust_version)
        view = d.view
        _ft._TRACKER.finish(d, _ft._fingerprint_into(d, h), None, need_crc=False)
        parts.append(("ref", d.blake3, view.nbytes) if d.blake3 is not None else ("new", view))
        decisions.append(d)
        length += view.nbytes
    fd = _parts.parts_memfd(parts, length, h.intdigest())
    for d in decisions:
        d.view = None  # the tensors' memory is not read any more
    mode = 0o666 & ~_ft._umask()
    return _ft._Prepared(path, rel, _daemon.OP_CKPT_PUT, fd, decisions, mode)


_RANKS = None
_MATCHES = None


def _dtype_ranks():
    """dtype code -> its place in the installed safetensors' file order
    (higher first), from a probe of one element of each dtype."""
    global _RANKS
    if _RANKS is None:
        _RANKS = {code: -i for i, (code, _shape) in enumerate(_probe()[1])}
    return _RANKS


def _probe():
    """safetensors' own bytes for one element of every dtype it maps
    (names that sort against their dtypes' order), and the (dtype code,
    shape) of its header's tensors in file order."""
    import torch
    from safetensors.torch import _TYPES, save
    probe = {}
    for i, (code, dt) in enumerate(_TYPES.items()):
        try:
            probe[f"{len(_TYPES) - i:03d}/{code}"] = torch.zeros(1, dtype=dt)
        except (RuntimeError, TypeError):
            continue
    meta = {"k\u00e9\n\x01\"\\/": "v\x7f\t"}
    raw = save(probe, metadata=meta)
    n = struct.unpack_from("<Q", raw)[0]
    header = json.loads(raw[8:8 + n])
    in_order = [(v["dtype"], v["shape"]) for k, v in header.items() if k != "__metadata__"]
    return (probe, meta, raw), in_order


def _layout_matches() -> bool:
    """The header built here equals the installed safetensors' (once)."""
    global _MATCHES
    if _MATCHES is None:
        try:
            (probe, meta, raw), _ = _probe()
            order = _plan(probe, meta)
            body = b"".join(bytes(_ft._tracker.storage_view(probe[n].untyped_storage())) for n in order)
            _MATCHES = order is not None and _header(_entries(probe, order), meta) + body == raw
        except Exception:  # noqa: BLE001 (any surprise in the probe: safetensors writes every file)
            _MATCHES = False
    return _MATCHES
