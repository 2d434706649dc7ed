"""`fanstore.dcp`: storage for `torch.distributed.checkpoint` (DCP) that
sends only what changed.

`Writer(path)` is DCP's `FileSystemWriter`, and writes the same files: the
shards `__<rank>_<n>.distcp` (every item's own `torch.save`, back to back)
and `.metadata`. Under the mount of a running FanStore job whose daemon
keeps the checkpoint store (`--dedup on`), a shard is not written through
POSIX: the package lays it out itself, byte for byte the file
`FileSystemWriter` writes, and commits it with CKPT_PUT, as
`fanstore.torch.save` does a single archive. Each storage the node's store
holds already (this process sent it before, the same bytes in any tensor)
travels as a reference; only the others travel as bytes. The metadata is
written through POSIX by DCP itself, in place (an output appears whole at
its close, so the temporary name and rename DCP uses are not needed). Elsewhere (a path outside the mount,
no daemon, stream extensions, another serialization format) it is
`FileSystemWriter`.

`Reader(path)` is DCP's `FileSystemReader`: the shards are read through the
mount, from the node's hot copies or store.

Example (every rank):

```python
import torch.distributed.checkpoint as dcp
import fanstore.dcp

dcp.save({"model": model.state_dict()}, storage_writer=fanstore.dcp.Writer("/fanstore/ckpt/step100"))
dcp.async_save(state, storage_writer=fanstore.dcp.Writer("/fanstore/ckpt/step200")).result()
dcp.load(state, storage_reader=fanstore.dcp.Reader("/fanstore/ckpt/step200"))
```
"""
import errno as _errno
import os
import queue
import time

import xxhash
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.filesystem import SerializationFormat, _StorageInfo
from torch.distributed.checkpoint.planner import WriteItemType
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future

from . import _daemon, _parts
from . import torch as _ft

__all__ = ["Writer", "Reader"]

#: The archive name torch.save gives a stream with no file name (DCP's items).
_ARCHIVE = "archive"


class Writer(FileSystemWriter):
    """`FileSystemWriter(path, ...)` whose shards are committed as parts
    (see the module doc). `trust_version=True`: as in
    `fanstore.torch.save`, storages whose version counters did not move
    are not read again (only for programs that never write tensors behind
    the counter's back)."""

    def __init__(self, path, *args, trust_version=False, **kwargs):
        super().__init__(path, *args, **kwargs)
        self.trust_version = trust_version
        #: Shards this writer committed as parts (the others went through POSIX).
        self.shards_sent = 0
        #: Seconds spent laying out, reading and copying the shards
        #: ("prepare"), in the daemon's CKPT_PUT round trips ("send"), and
        #: in the whole of writing the shards ("write": both, and waiting
        #: for this process's earlier saves, and the tensors' capture).
        #: Also DCP's own steps through the mount: the directory
        #: ("plan": prepare_local_plan's mkdir) and `.metadata` ("finish").
        self.seconds = {"prepare": 0.0, "send": 0.0, "write": 0.0, "plan": 0.0, "finish": 0.0}

    def prepare_local_plan(self, plan):
        t0 = time.perf_counter()
        try:
            return super().prepare_local_plan(plan)
        finally:
            self.seconds["plan"] += time.perf_counter() - t0

    def finish(self, metadata, results):
        t0 = time.perf_counter()
        daemon = _daemon.find()
        direct = daemon is not None and daemon.relative(self.path) is not None
        fs = self.fs
        if direct:
            self.fs = _MetadataInPlace(fs)
        try:
            return super().finish(metadata, results)
        finally:
            self.fs = fs
            self.seconds["finish"] += time.perf_counter() - t0

    def _write_data(self, planner, file_queue):
        t0 = time.perf_counter()
        try:
            return self._write_shards(planner, file_queue)
        finally:
            self.seconds["write"] += time.perf_counter() - t0

    def _write_shards(self, planner, file_queue):
        daemon = _daemon.find()
        if (daemon is None or not daemon.dedup or self.transforms.extensions
                or self.serialization_format != SerializationFormat.TORCH_SAVE
                or daemon.relative(self.path) is None):
            return super()._write_data(planner, file_queue)
        files = []
        while True:
            try:
                files.append(file_queue.get_nowait())
            except queue.Empty:
                break
        results = []
        with _ft._SAVE_LOCK:
            _ft._wait_inflight()
            conn = _ft._connection(daemon)
            _ft._TRACKER.sweep()
            for path, storage_key, items in files:
                got = self._send_shard(daemon, conn, planner, path, storage_key, items)
                if got is None:  # a tensor off the CPU, a zip64 archive: FileSystemWriter writes it
                    rest = queue.Queue()
                    rest.put((path, storage_key, items))
                    got = super()._write_data(planner, rest).result()
                else:
                    self.shards_sent += 1
                results += got
        fut = Future()
        fut.set_result(results)
        return fut

    def _send_shard(self, daemon, conn, planner, path, storage_key, items):
        """Commits one shard; its WriteResults, or None when it must go
        through POSIX."""
        rel = daemon.relative(path)
        if rel is None:
            return None
        byte_items = [wi for wi in items if wi.type == WriteItemType.BYTE_IO]
        tensor_items = [wi for wi in items if wi.type != WriteItemType.BYTE_IO]
        blobs = [(wi, planner.resolve_data(wi).getvalue()) for wi in byte_items]
        tensors = []
        for wi in tensor_items:
            # As FileSystemWriter's loader: a view of a larger storage is
            # saved as its own minimal copy.
            t = planner.resolve_data(wi).detach().cpu()
            if t.untyped_storage().size() != t.nbytes:
                t = t.clone()
            tensors.append((wi, t))
        captured = []
        try:
            for _wi, t in tensors:
                captured.append(_ft._capture(t, 2, False))
        except _ft._NotHere:
            return None
        for attempt in range(2):
            t0 = time.perf_counter()
            try:
                prep, results = self._prepare(daemon, path, rel, storage_key, blobs, tensors, captured)
            except _ft._NotHere:
                return None
            t1 = time.perf_counter()
            self.seconds["prepare"] += t1 - t0
            try:
                if _ft._send(conn, prep):
                    return results
            finally:
                prep.close()
                self.seconds["send"] += time.perf_counter() - t1
            # The store no longer holds what we referred to: every byte again.
            _ft._TRACKER.reset(daemon.identity)
        raise OSError(_errno.ESTALE, "the checkpoint store refused the shard's references twice", str(path))

    def _prepare(self, daemon, path, rel, storage_key, blobs, tensors, captured):
        """The shard's parts in a sealed memfd (what FileSystemWriter would
        write: the byte items, then each tensor's torch.save archive) and
        each item's WriteResult. As in `fanstore.torch.save`, the storages
        whose counters moved are copied into their reserved room by the
        CRC thread, in the same read as their CRC-32, beside the hashing
        pass (not in a third pass after it)."""
        h = xxhash.xxh3_64()
        archives = []
        reserve = [(len(b), True) for _wi, b in blobs]
        for (wi, _t), (records, seen) in zip(tensors, captured):
            ds = _ft._begin(records, seen, self.trust_version)
            draft = _ft._layout(_ARCHIVE, records, ds, crcs=False)
            archives.append((wi, records, ds, draft, len(reserve)))
            reserve += [(len(seg), True) if isinstance(seg, bytes) else (seg.nbytes, ds[seg.key].likely_changed)
                        for seg in draft.segments]
        writer = _parts.PartsWriter(reserve)
        try:
            parts, decisions, results, written = [], [], [], set()
            offset = 0

            def result(wi, length):
                return WriteResult(index=wi.index, size_in_bytes=length,
                                   storage_data=_StorageInfo(storage_key, offset, length, transform_descriptors=None))

            for wi, b in blobs:
                h.update(b)
                parts.append(("glue", b))
                results.append(result(wi, len(b)))
                offset += len(b)
            for wi, records, ds, draft, base in archives:
                h, layout = _ft._read_storages(_ARCHIVE, records, ds, h, into=(_Shifted(writer, base), draft))
                if len(layout.segments) != len(draft.segments):
                    raise _ft._NotHere("the archive's layout changed with its CRCs")  # (never expected)
                written |= {base + i for i, seg in enumerate(draft.segments)
                            if not isinstance(seg, bytes) and ds[seg.key].likely_changed}
                parts += _ft._parts_of(layout, ds)
                decisions += ds
                results.append(result(wi, layout.length))
                offset += layout.length
            fd = writer.finish(parts, offset, h.intdigest(), written)
        finally:
            writer.close()
        for d in decisions:
            d.view = None
        mode = 0o666 & ~_ft._umask()
        return _ft._Prepared(os.fspath(path), rel, _daemon.OP_CKPT_PUT, fd, decisions, mode), results


class _Shifted:
    """A `_parts.PartsWriter` seen from one archive of a shard: its part
    indexes start at `base`."""

    def __init__(self, writer, base):
        self.writer, self.base = writer, base

    def write(self, index, data, at=0):
        self.writer.write(self.base + index, data, at)


class _MetadataInPlace:
    """`FileSystemWriter.finish`'s file system, under the mount: `.metadata`
    is written in place instead of as `.metadata.tmp` renamed over it. An
    output appears, or replaces the one at its name, whole at its close
    (docs/posix.md), which is what the temporary name and the rename give
    on a native file system; here they cost two more operations at the
    names' owners (the rename alone 13-50 ms on 4 busy daemons)."""

    def __init__(self, fs):
        self._fs = fs
        self._final = {}

    def __getattr__(self, name):
        return getattr(self._fs, name)

    def create_stream(self, path, mode):
        p = os.fspath(path)
        if p.endswith(".tmp"):
            self._final[p] = final = p[:-len(".tmp")]
            return self._fs.create_stream(final, mode)
        return self._fs.create_stream(path, mode)

    def exists(self, path):
        # The old `.metadata` stays until the new one's close replaces it.
        if os.fspath(path) in self._final.values():
            return False
        return self._fs.exists(path)

    def rename(self, src, dst):
        if self._final.get(os.fspath(src)) == os.fspath(dst):
            return None
        return self._fs.rename(src, dst)


class Reader(FileSystemReader):
    """DCP's `FileSystemReader`: the shards are read through the mount."""
