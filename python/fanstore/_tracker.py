"""Which tensors changed since this process last saved them.

Per storage (keyed by its data pointer and length) the tracker keeps what
the last save saw (see `Tracker.begin` and `Tracker.finish`; the save reads
each storage once, in `fanstore.torch._read_storages`): the signature of the tensors viewing it (dtype, shape,
stride, offset and version counter), an xxh3-128 fingerprint of its bytes,
their CRC-32 (the zip data descriptor needs it) and the blake3 of the unit
the daemon's checkpoint store holds for them.

The version counter is not enough to know a tensor did not change: writes
through `.data`, through a numpy view (`t.numpy()`), through
`untyped_storage()` or from C code leave it as it was (tests/test_ckpt_python.py
shows each). So by default every storage is fingerprinted (xxh3-128, about
13 GB/s on one core here) and a reference is sent only when the
fingerprint equals the one of the bytes the store holds; the CRC-32 of the
changed ones only is computed. `trust_version=True` skips the fingerprint of
storages whose signature (pointer, length, dtypes, shapes, strides, offsets,
versions) is unchanged: for programs that never write tensors behind the
counter's back. An entry holds its storage, so that no other tensor can be
allocated at its address while the tracker trusts what it knew of it; an
entry whose storage nothing else holds any more (the tensor is gone) is
dropped at the next save. Either way the whole-file xxh3 the daemon keeps is computed
over the actual bytes, so a wrong reference makes a read fail (EIO), never
return other bytes.
"""
import ctypes
from collections import OrderedDict

from ._crc import crc32


def storage_view(storage) -> memoryview:
    """The bytes of a CPU storage, without a copy."""
    n = storage.nbytes()
    if n == 0:
        return memoryview(b"")
    return memoryview((ctypes.c_char * n).from_address(storage.data_ptr())).cast("B")


def signature(tensors):
    """What the version counters say about a storage's tensors; None when
    there is nothing to trust (no tensor, or one without a counter)."""
    if not tensors:
        return None
    try:
        return tuple(sorted((t._version, str(t.dtype), tuple(t.shape), tuple(t.stride()), t.storage_offset())
                            for t in tensors))
    except RuntimeError:  # inference tensors have no version counter
        return None


class Entry:
    __slots__ = ("storage", "sig", "fp", "crc", "blake3")

    def __init__(self, storage, sig, fp, crc, blake3):
        self.storage, self.sig, self.fp, self.crc, self.blake3 = storage, sig, fp, crc, blake3


class Decision:
    """One storage of a save: its bytes, whether the store holds them
    (`blake3` set) and their CRC-32. Made by `Tracker.begin` (`fp` set
    already when the version counters are trusted, `likely_changed` when
    they moved), completed by `Tracker.finish` once its bytes are read."""
    __slots__ = ("key", "storage", "view", "sig", "fp", "crc", "blake3", "prev", "likely_changed")

    def __init__(self, key, storage, view, sig, fp, crc, blake3):
        self.key, self.storage, self.view = key, storage, view
        self.sig, self.fp, self.crc, self.blake3 = sig, fp, crc, blake3
        self.prev, self.likely_changed = None, True


def _only_ours(storage) -> bool:
    """Nothing but the tracker holds `storage` any more."""
    import torch
    return torch._C._storage_Use_Count(storage._cdata) <= 1


#: Units remembered by their bytes' fingerprint alone (see `Tracker.by_value`).
BY_VALUE_MAX = 65536


class Tracker:
    def __init__(self):
        self.identity = None
        self.entries = {}
        # (fingerprint, length) -> (crc, blake3) of the units the store was
        # last told about, whatever storage held them: a copy of unchanged
        # bytes in a new storage (DCP's async staging, its clone of a view,
        # a state dict rebuilt each step) is still sent as a reference.
        self.by_value = OrderedDict()
        self.stats = dict(fingerprinted=0, trusted=0, referenced=0, sent=0)

    def reset(self, identity=None):
        self.identity = identity
        self.entries.clear()
        self.by_value.clear()

    def sweep(self):
        """Drops the entries of storages whose tensors are gone."""
        for k in [k for k, e in self.entries.items() if _only_ours(e.storage)]:
            del self.entries[k]

    def begin(self, storage, tensors, trust_version: bool) -> Decision:
        """What is known of `storage` before reading it: with `trust_version`
        and unchanged counters, its fingerprint (it will not be read)."""
        view = storage_view(storage)
        key = (storage.data_ptr(), view.nbytes)
        sig = signature(tensors)
        e = self.entries.get(key)
        d = Decision(key, storage, view, sig, None, None, None)
        d.prev = e
        d.likely_changed = e is None or sig is None or e.sig != sig
        if trust_version and e is not None and sig is not None and e.sig == sig:
            self.stats["trusted"] += 1
            d.fp = e.fp
        else:
            self.stats["fingerprinted"] += 1
        return d

    def finish(self, d: Decision, fp: int, crc, need_crc=True) -> None:
        """`d` with its fingerprint `fp` (and its CRC-32 if computed on the
        way, else None): a reference if the store holds those bytes.
        `need_crc=False` (a format without CRCs: safetensors) leaves the
        CRC-32 of bytes that travel unknown (None); a later save that needs
        it computes it then."""
        e = d.prev
        d.fp = fp
        if e is not None and e.fp == fp and e.blake3 is not None:
            known = (e.crc, e.blake3)
        else:
            known = self.by_value.get((fp, d.view.nbytes))
        if known is not None:
            self.stats["referenced"] += 1
            d.crc, d.blake3 = known
            if d.crc is None and need_crc:
                d.crc = crc if crc is not None else crc32(d.view)
            return
        self.stats["sent"] += 1
        d.crc = crc if crc is not None or not need_crc else crc32(d.view)

    def learn(self, d: Decision, blake3: bytes):
        """The store holds `d`'s bytes as unit `blake3`."""
        self.entries[d.key] = Entry(d.storage, d.sig, d.fp, d.crc, blake3)
        if d.fp is not None:
            self.by_value[(d.fp, d.storage.nbytes())] = (d.crc, blake3)
            self.by_value.move_to_end((d.fp, d.storage.nbytes()))
            if len(self.by_value) > BY_VALUE_MAX:
                self.by_value.popitem(last=False)
