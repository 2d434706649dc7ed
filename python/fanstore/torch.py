"""`fanstore.torch.save`: `torch.save` that sends only what changed.

`save(obj, path)` writes exactly the bytes `torch.save(obj, path)` writes.
Under the mount of a running FanStore job (and with the daemon's checkpoint
store, `--dedup on`) it does not write them through POSIX: it lays out the
archive itself (`fanstore._zipwriter`), and sends the daemon the glue, a
reference (blake3) for each storage the node's store holds already and the
bytes of the changed ones only (`fanstore._tracker` says which: an
xxh3-128 fingerprint per storage, or the version counters with
`trust_version=True`). The daemon commits them as a checkpoint (CKPT_PUT)
visible to every node like any closed output. A reference the store no
longer holds (an unlinked checkpoint freed it) makes the daemon refuse the
commit; the save is then sent again with every byte.

Anywhere else (a path outside the mount, a file object, no daemon, a custom
`pickle_module`, tensors not on the CPU, archives past 4 GiB) it is
`torch.save` itself.
"""
import errno as _errno
import os
import pickle as _pickle

import xxhash

from . import _daemon, _parts, _tracker, _zipwriter

_TRACKER = _tracker.Tracker()
_CONN = None


class _NotHere(Exception):
    """Something only torch.save itself writes (CUDA storages, zip64 sizes)."""


def _connection(daemon):
    global _CONN
    if _CONN is None or _CONN.daemon.identity != daemon.identity:
        if _CONN is not None:
            _CONN.close()
        _CONN = _daemon.Connection(daemon)
    if _TRACKER.identity != daemon.identity:
        _TRACKER.reset(daemon.identity)
    return _CONN


class _Recorder:
    """Stands in for PyTorchFileWriter: keeps what `_save` writes."""

    def __init__(self):
        self.records = []

    def write_record(self, name, data, nbytes):
        if isinstance(data, str):
            data = data.encode()
        self.records.append((name, data, nbytes))

    def write_record_metadata(self, name, nbytes):
        raise _NotHere("skip_data saves")


def _capture(obj, pickle_protocol, disable_byteorder):
    """The records torch.save would write, and the tensors it pickled."""
    import torch
    from torch import serialization

    seen = []

    class Pickler(_pickle.Pickler):
        def reducer_override(self, o):
            if isinstance(o, torch.Tensor):
                seen.append(o)
            return NotImplemented

    class Module:
        pass

    mod = Module()
    mod.Pickler = Pickler
    rec = _Recorder()
    serialization._save(obj, rec, mod, pickle_protocol, disable_byteorder)
    return rec.records, seen


def _umask() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    return 0o022


def save(obj, f, pickle_module=_pickle, pickle_protocol=2, _use_new_zipfile_serialization=True,
         _disable_byteorder_record=False, *, trust_version=False):
    """torch.save(obj, f, ...), sending only the storages that changed when
    `f` is a path under a running FanStore job's mount (see the module doc)."""
    import torch
    native = lambda: torch.save(obj, f, pickle_module, pickle_protocol, _use_new_zipfile_serialization,  # noqa: E731
                                _disable_byteorder_record)
    if not isinstance(f, (str, os.PathLike)) or pickle_module is not _pickle or not _use_new_zipfile_serialization:
        return native()
    daemon = _daemon.find()
    rel = daemon.relative(f) if daemon is not None else None
    if rel is None:
        return native()
    path = os.fspath(f)
    try:
        records, tensors = _capture(obj, pickle_protocol, _disable_byteorder_record)
        _put(daemon, path, rel, records, tensors, trust_version)
    except _NotHere:
        return native()


def _put(daemon, path, rel, records, tensors, trust_version):
    by_storage = {}
    for t in tensors:
        by_storage.setdefault(t.untyped_storage()._cdata, []).append(t)
    conn = _connection(daemon)
    _TRACKER.sweep()
    for attempt in range(2):
        decisions, layout_records = [], []
        for name, data, _n in records:
            if isinstance(data, bytes):
                layout_records.append((name, data))
                continue
            if data.device.type != "cpu":
                raise _NotHere("a storage not on the CPU")
            d = _TRACKER.decide(data, by_storage.get(data._cdata, ()), trust_version)
            decisions.append(d)
            layout_records.append((name, _zipwriter.Unit(len(decisions) - 1, d.view.nbytes, d.crc)))
        try:
            archive = path.encode("ascii") and _zipwriter.archive_name(path)
        except UnicodeEncodeError:
            archive = "archive"  # torch.save writes such a name through a Python file object
        try:
            layout = _zipwriter.Layout(archive, layout_records)
        except _zipwriter.Unsupported as e:
            raise _NotHere(str(e))
        h = xxhash.xxh3_64()
        pieces = []
        for s in layout.segments:
            b = s if isinstance(s, bytes) else decisions[s.key].view
            h.update(b)
            pieces.append(b)
        file_xxh3 = h.intdigest()
        mode = 0o666 & ~_umask()
        if not daemon.dedup:
            return _commit_whole(conn, path, rel, pieces, layout.length, mode)
        parts = []
        for s in layout.segments:
            if isinstance(s, bytes):
                parts.append(("glue", s))
            else:
                d = decisions[s.key]
                parts.append(("ref", d.blake3, d.view.nbytes) if d.blake3 is not None else ("new", d.view))
        fd = _parts.parts_memfd(parts, layout.length, file_xxh3)
        try:
            err, n, _p, hfd = conn.call(_daemon.OP_CKPT_PUT, 0, mode, rel.encode("utf-8", "surrogateescape"), fd)
        finally:
            os.close(fd)
        if err == 0:
            _learn(decisions, hfd, n)
            return
        if hfd is not None:
            os.close(hfd)
        if err == _errno.ESTALE and attempt == 0:
            _TRACKER.reset(daemon.identity)  # the store no longer holds what we referred to: send every byte
            continue
        if err == _errno.ENOTSUP:
            return _commit_whole(conn, path, rel, pieces, layout.length, mode)
        raise OSError(err, os.strerror(err), path)


def _learn(decisions, hfd, n):
    """The daemon's reply: the blake3 of every unit, in file order (the
    storages' order)."""
    if hfd is None:
        raise ConnectionError("CKPT_PUT answered without the unit hashes")
    try:
        raw = b""
        while len(raw) < 32 * n:
            chunk = os.pread(hfd, 32 * n - len(raw), len(raw))
            if not chunk:
                break
            raw += chunk
    finally:
        os.close(hfd)
    if n != len(decisions) or len(raw) != 32 * n:
        # Units the store split otherwise than the storages: nothing to remember.
        return
    for i, d in enumerate(decisions):
        _TRACKER.learn(d, raw[32 * i:32 * i + 32])


def _commit_whole(conn, path, rel, pieces, length, mode):
    """COMMIT of the whole file's bytes (no checkpoint store, or too small for it)."""
    fd = _parts.file_memfd(pieces, length)
    try:
        err, _v, _p, extra = conn.call(_daemon.OP_COMMIT, 0, mode, rel.encode("utf-8", "surrogateescape"), fd)
    finally:
        os.close(fd)
    if extra is not None:
        os.close(extra)
    if err:
        raise OSError(err, os.strerror(err), path)


def wait_stored():
    """Returns once the node's checkpoint store holds every checkpoint this
    process saved (the daemon stores a checkpoint behind the reply to
    `save`: its readers wait for it meanwhile, so this is only needed to
    know the store's work is done, as a benchmark does)."""
    conn = _CONN
    if conn is None:
        return
    err, _v, _p, fd = conn.call(_daemon.OP_CKPT, 5, 0)  # `fanstore ckpt du`: answered once every commit is stored
    if fd is not None:
        os.close(fd)
    if err and err != _errno.ENOTSUP:
        raise OSError(err, os.strerror(err))


def stats() -> dict:
    """Counters of this process's saves: storages fingerprinted, trusted by
    their version counters, sent as references, sent as bytes."""
    return dict(_TRACKER.stats)
