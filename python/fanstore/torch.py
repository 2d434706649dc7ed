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
import threading

import xxhash

from . import _daemon, _parts, _tracker, _zipwriter
from ._crc import crc32

_TRACKER = _tracker.Tracker()
_CONN = None


class _NotHere(Exception):
    """Something only torch.save itself writes (CUDA storages, zip64 sizes)."""


def _connection(daemon):
    global _CONN
    if _CONN is not None and _CONN.pid != os.getpid():
        # A forked child (a DataLoader worker) must not share its parent's
        # socket, nor trust what the parent learnt of its own tensors.
        _CONN = None
        _TRACKER.reset(None)
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
         _disable_byteorder_record=False, *, trust_version=False, background=False):
    """torch.save(obj, f, ...), sending only the storages that changed when
    `f` is a path under a running FanStore job's mount (see the module doc).

    With `background=True` it returns a `SaveHandle` as soon as the bytes
    of the changed storages are copied into a sealed memfd this package
    owns (the program may then change its tensors); the daemon round trip
    and the store's commit run on a background thread, and
    `handle.wait()` returns once the checkpoint is stored on the node.
    A save (of either kind) first waits for the background save before it;
    saves from several threads run one at a time. Where `save` is
    torch.save itself, the handle is already done."""
    with _SAVE_LOCK:
        return _save(obj, f, pickle_module, pickle_protocol, _use_new_zipfile_serialization, _disable_byteorder_record,
                     trust_version, background)


_SAVE_LOCK = threading.Lock()


def _save(obj, f, pickle_module, pickle_protocol, _use_new_zipfile_serialization, _disable_byteorder_record,
          trust_version, background):
    import torch
    _wait_inflight()
    native = lambda: torch.save(obj, f, pickle_module, pickle_protocol, _use_new_zipfile_serialization,  # noqa: E731
                                _disable_byteorder_record)
    done = lambda: SaveHandle(None) if background else None  # noqa: E731
    if not isinstance(f, (str, os.PathLike)) or pickle_module is not _pickle or not _use_new_zipfile_serialization:
        native()
        return done()
    daemon = _daemon.find()
    rel = daemon.relative(f) if daemon is not None else None
    if rel is None:
        native()
        return done()
    path = os.fspath(f)
    try:
        records, tensors = _capture(obj, pickle_protocol, _disable_byteorder_record)
        conn = _connection(daemon)
        _TRACKER.sweep()
        prep = _prepare(daemon, path, rel, records, tensors, trust_version)
    except _NotHere:
        native()
        return done()
    if background:
        global _INFLIGHT
        _INFLIGHT = SaveHandle(threading.Thread(target=_send_background, args=(conn, prep), daemon=True,
                                                name="fanstore-save"))
        return _INFLIGHT
    try:
        if _send(conn, prep):
            return None
    finally:
        prep.close()
    # The store no longer holds what we referred to: every byte again.
    _TRACKER.reset(daemon.identity)
    prep = _prepare(daemon, path, rel, records, tensors, trust_version)
    try:
        if not _send(conn, prep):
            raise OSError(_errno.ESTALE, "the checkpoint store refused the checkpoint's references twice", path)
    finally:
        prep.close()
    return None


class _Prepared:
    """A save ready to send: the sealed memfd (a parts file, or the whole
    file when the daemon has no checkpoint store), and what to learn."""

    def __init__(self, path, rel, op, fd, decisions, mode):
        self.path, self.rel, self.op, self.fd, self.decisions, self.mode = path, rel, op, fd, decisions, mode

    def close(self):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _prepare(daemon, path, rel, records, tensors, trust_version) -> _Prepared:
    """Decides which storages changed, lays out the archive, hashes the
    whole file and copies what must travel into a sealed memfd: after this
    the program's tensors are no longer read."""
    decisions = _begin(records, tensors, trust_version)
    try:
        archive = path.encode("ascii") and _zipwriter.archive_name(path)
    except UnicodeEncodeError:
        archive = "archive"  # torch.save writes such a name through a Python file object
    mode = 0o666 & ~_umask()
    if not daemon.dedup:
        file_xxh3, layout = _read_storages(archive, records, decisions)
        pieces = [seg if isinstance(seg, bytes) else decisions[seg.key].view for seg in layout.segments]
        fd = _parts.file_memfd(pieces, layout.length)
        return _Prepared(path, rel, _daemon.OP_COMMIT, fd, [], mode)
    # The storages likely to travel are copied into the parts file by the
    # CRC thread, beside the hashing pass, not after it.
    draft = _layout(archive, records, decisions, crcs=False)
    writer = _parts.PartsWriter([(len(seg), True) if isinstance(seg, bytes) else (seg.nbytes, decisions[seg.key].likely_changed)
                                 for seg in draft.segments])
    try:
        file_xxh3, layout = _read_storages(archive, records, decisions, into=(writer, draft))
        if len(layout.segments) != len(draft.segments):
            raise _NotHere("the archive's layout changed with its CRCs")  # (never expected)
        written = {i for i, seg in enumerate(draft.segments) if not isinstance(seg, bytes) and decisions[seg.key].likely_changed}
        fd = writer.finish(_parts_of(layout, decisions), layout.length, file_xxh3, written)
    finally:
        writer.close()
    for d in decisions:
        d.view = None  # the tensors' memory is not read any more
    return _Prepared(path, rel, _daemon.OP_CKPT_PUT, fd, decisions, mode)


def _begin(records, tensors, trust_version):
    """The tracker's first look at each storage of `records` (file order)."""
    by_storage = {}
    for t in tensors:
        by_storage.setdefault(t.untyped_storage()._cdata, []).append(t)
    decisions = []
    for _name, data, _n in records:
        if isinstance(data, bytes):
            continue
        if data.device.type != "cpu":
            raise _NotHere("a storage not on the CPU")
        decisions.append(_TRACKER.begin(data, by_storage.get(data._cdata, ()), trust_version))
    return decisions


def _parts_of(layout, decisions):
    """An archive's parts for CKPT_PUT: its glue, a reference for each
    storage the store holds, the bytes of the others."""
    parts = []
    for seg in layout.segments:
        if isinstance(seg, bytes):
            parts.append(("glue", seg))
        else:
            d = decisions[seg.key]
            parts.append(("ref", d.blake3, d.view.nbytes) if d.blake3 is not None else ("new", d.view))
    return parts


_CHUNK = 1 << 20


#: Layouts by what they are made of: a save lays out every archive twice
#: (a draft before the CRCs, then the final one), and the archives of
#: unchanged tensors are the same save after save (a DCP shard is one
#: archive per tensor: 3.7 of a rank's 25 ms of CPU per save went to
#: laying out, measured with 12 tensors). Layouts are never changed once made.
_LAYOUTS: dict = {}
_LAYOUTS_MAX = 4096
#: Archives whose plain records (data.pkl...) are larger are laid out anew.
_LAYOUT_KEY_MAX = 1 << 16


def _layout(archive, records, decisions, crcs=True):
    recs, key, k, plain = [], [archive], 0, 0
    for name, data, _n in records:
        if isinstance(data, bytes):
            recs.append((name, data))
            key.append((name, data))
            plain += len(data)
        else:
            d = decisions[k]
            unit = (k, d.view.nbytes, (d.crc or 0) if crcs else 0)
            recs.append((name, _zipwriter.Unit(*unit)))
            key.append((name,) + unit)
            k += 1
    key = tuple(key) if plain <= _LAYOUT_KEY_MAX else None
    hit = _LAYOUTS.get(key) if key is not None else None
    if hit is not None:
        return hit
    try:
        layout = _zipwriter.Layout(archive, recs)
    except _zipwriter.Unsupported as e:
        raise _NotHere(str(e))
    if key is not None:
        if len(_LAYOUTS) >= _LAYOUTS_MAX:
            _LAYOUTS.clear()
        _LAYOUTS[key] = layout
    return layout


_CRC_POOL = (None, 0)


def _crc_pool():
    """One thread that computes CRC-32s beside the hashing pass (zlib
    releases the GIL for buffers over 5 KiB); a new one in a forked child,
    which has none of its parent's threads."""
    global _CRC_POOL
    pool, pid = _CRC_POOL
    if pool is None or pid != os.getpid():
        import concurrent.futures
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="fanstore-crc")
        _CRC_POOL = (pool, os.getpid())
    return pool


def _crc_of(view, writer=None, index=0):
    """The CRC-32 of `view`; with `writer`, its bytes also go into part
    `index` of that parts file on the way (one read of the tensor for both)."""
    crc = 0
    for off in range(0, view.nbytes, _CHUNK):
        c = view[off:off + _CHUNK]
        crc = crc32(c, crc)
        if writer is not None:
            writer.write(index, c, off)
    return crc


def _read_storages(archive, records, decisions, h=None, into=None):
    """Reads every storage once, in file order, for both its fingerprint
    and the whole-file xxh3 (one pass over memory instead of two), while
    another thread computes the CRC-32 of each storage whose counters
    moved (a third of the pass's time, measured on a 75%-frozen save, now
    beside it): the glue between storages only needs the CRC of the one
    before it, patched into its data descriptor. Returns (whole-file xxh3,
    the final layout).
    With `h` (an xxh3 hasher of what precedes the archive in its file) the
    archive's bytes are added to `h`, which is returned. With `into`
    (a `_parts.PartsWriter` and the draft layout it was made for), each
    storage whose CRC is computed is also copied into its reserved part."""
    writer, draft = into if into is not None else (None, _layout(archive, records, decisions, crcs=False))
    outer = h
    h = xxhash.xxh3_64() if outer is None else outer
    prev = None
    glue = []
    pool = _crc_pool()
    crcs = {seg.key: pool.submit(_crc_of, decisions[seg.key].view, writer, i) for i, seg in enumerate(draft.segments[:-1])
            if not isinstance(seg, bytes) and decisions[seg.key].likely_changed}
    try:
        return _hash_storages(draft, archive, records, decisions, h, outer, prev, glue, crcs)
    finally:
        for f in crcs.values():
            f.cancel()  # (after an error: no CRC reads the tensors once we return)
        for f in crcs.values():
            if not f.cancelled():
                f.exception()  # waits for the one running


def _fingerprint_into(d, h) -> int:
    """Adds storage `d`'s bytes to the whole-file hash `h` and returns its
    fingerprint, in one read (the one its decision already holds, if its
    version counters are trusted)."""
    fph = None if d.fp is not None else xxhash.xxh3_128()
    view = d.view
    for off in range(0, view.nbytes, _CHUNK):
        c = view[off:off + _CHUNK]
        h.update(c)
        if fph is not None:
            fph.update(c)
    return d.fp if fph is None else fph.intdigest()


def _hash_storages(draft, archive, records, decisions, h, outer, prev, glue, crcs):
    for seg in draft.segments[:-1]:
        if isinstance(seg, bytes):
            if prev is not None and prev.nbytes and seg[:4] == b"PK\x07\x08":
                seg = seg[:4] + decisions[prev.key].crc.to_bytes(4, "little") + seg[8:]
            h.update(seg)
            glue.append(seg)
            continue
        d = decisions[seg.key]
        fp = _fingerprint_into(d, h)
        crc = crcs[seg.key].result() if seg.key in crcs else None
        _TRACKER.finish(d, fp, crc)
        prev = seg
    layout = _layout(archive, records, decisions)
    same = len(layout.segments) == len(draft.segments) and \
        [s for s in layout.segments[:-1] if isinstance(s, bytes)] == glue
    _TRACKER.stats["rehashed"] = _TRACKER.stats.get("rehashed", 0) + (not same)
    if not same:  # (never expected) hash the final layout again, in a second pass
        if outer is not None:
            raise _NotHere("the archive's layout changed with its CRCs")
        h = xxhash.xxh3_64()
        for seg in layout.segments[:-1]:
            h.update(seg if isinstance(seg, bytes) else decisions[seg.key].view)
    h.update(layout.segments[-1])
    return (h if outer is not None else h.intdigest()), layout


def _send(conn, prep: _Prepared) -> bool:
    """Sends a prepared save; False when the store refused a reference
    (ESTALE: nothing was committed)."""
    err, n, _p, rfd = conn.call(prep.op, 0, prep.mode, prep.rel.encode("utf-8", "surrogateescape"), prep.fd)
    if prep.op == _daemon.OP_CKPT_PUT:
        _parts.prepare_spare(os.fstat(prep.fd).st_size)
    if err == 0:
        if prep.op == _daemon.OP_CKPT_PUT:
            _learn(prep.decisions, rfd, n)
        elif rfd is not None:
            os.close(rfd)
        return True
    if rfd is not None:
        os.close(rfd)
    if err == _errno.ESTALE:
        return False
    raise OSError(err, os.strerror(err), prep.path)


class SaveHandle:
    """A background save (see `save`). `done()`: finished (stored, or
    failed); `wait(timeout)`: returns once the checkpoint is stored on the
    node (True), False on timeout, or raises the save's error."""

    def __init__(self, thread):
        self._thread = thread
        self._error = None
        if thread is not None:
            thread._fanstore_handle = self
            thread.start()

    def done(self) -> bool:
        return self._thread is None or not self._thread.is_alive()

    def wait(self, timeout=None) -> bool:
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                return False
        if self._error is not None:
            raise self._error
        return True


_INFLIGHT = None


def _send_background(conn, prep: _Prepared):
    handle = threading.current_thread()._fanstore_handle
    try:
        if not _send(conn, prep):
            # The bytes behind the refused references are the program's
            # again (it may have changed them): the save cannot be redone here.
            _TRACKER.reset(conn.daemon.identity)
            raise OSError(_errno.ESTALE, "the checkpoint store no longer holds units this save referred to; "
                          "save again (every byte is sent then)", prep.path)
        wait_stored()
    except BaseException as e:  # reported by handle.wait()
        handle._error = e
    finally:
        prep.close()


def _wait_inflight():
    """A save waits for the background save before it (one in flight: the
    tracker learns from its reply)."""
    h = _INFLIGHT
    if h is not None and h._thread is not None:
        h._thread.join()


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


def load_matching(model, path, map_location="cpu") -> list:
    """Loads into `model` (an nn.Module, or a state dict updated in place)
    the tensors of the checkpoint at `path` whose names and shapes are the
    model's (a warm start from `fanstore.ckpt.best(model)`); returns the
    names loaded. Other tensors of the model keep their values."""
    import torch
    stored = torch.load(path, map_location=map_location)
    if hasattr(stored, "state_dict") and not isinstance(stored, dict):
        stored = stored.state_dict()
    mine = model.state_dict() if hasattr(model, "state_dict") else model
    take = {k: v for k, v in stored.items()
            if k in mine and isinstance(v, torch.Tensor) and tuple(v.shape) == tuple(mine[k].shape)}
    if hasattr(model, "load_state_dict"):
        model.load_state_dict(take, strict=False)
    else:
        with torch.no_grad():
            for k, v in take.items():
                mine[k].copy_(v)
    return sorted(take)


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
    their version counters, sent as references, sent as bytes; `rehashed`:
    saves whose single pass had to be redone (never expected)."""
    return dict(_TRACKER.stats)
