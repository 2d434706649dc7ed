"""The parts file a checkpoint travels in to the daemon (CKPT_PUT), and the
whole-file memfd of a plain COMMIT: sealed memfds the daemon maps.

Layout (fanstore-ckpt/src/parts_file.rs has the byte diagram): a 48-byte
header (magic "FSPARTS\\0", version 1, part count, file length, whole-file
xxh3, data offset, xxh3 of the header and table), a 48-byte entry per part
(kind 1 glue / 2 new unit / 3 reference, length, data offset or blake3),
then the data section: glue bytes and new unit bytes.
"""
import fcntl
import os
import struct
import threading

import xxhash

MAGIC = b"FSPARTS\0"
VERSION = 1
HEADER = struct.Struct("<8sIIQQQ")      # magic, version, count, file length, file xxh3, data offset
ENTRY_LEN = 48
KIND_GLUE, KIND_NEW, KIND_REF = 1, 2, 3
_SEALS = fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL


def _entry(kind: int, length: int, tail: bytes) -> bytes:
    return struct.pack("<B7xQ", kind, length) + tail.ljust(32, b"\0")


def _memfd(name: str, size: int) -> int:
    fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, size)
    except BaseException:
        os.close(fd)
        raise
    return fd


#: A memfd whose pages were allocated after the last save, for the next
#: one's parts (one per process): a save's copy of its changed tensors then
#: only copies. Measured here, 52 MB into a new memfd 22-35 ms, into one
#: whose pages are allocated 12-16 ms. It holds as many bytes as the last
#: parts file, between saves.
_SPARE = {"fd": None, "pid": 0, "busy": False}
_SPARE_LOCK = threading.Lock()
#: Parts files smaller than this get no spare (allocating is cheap).
_SPARE_MIN = 1 << 20


def _parts_fd(size: int) -> int:
    """A memfd of `size` bytes for a parts file: the spare (its pages
    allocated, cut or grown to `size`) when this process has one, else a new one."""
    with _SPARE_LOCK:
        fd, mine = _SPARE["fd"], _SPARE["pid"] == os.getpid()
        _SPARE["fd"] = None
    if fd is not None and not mine:
        os.close(fd)  # a forked child's copy of its parent's spare
        fd = None
    if fd is not None:
        try:
            os.ftruncate(fd, size)
            return fd
        except OSError:
            os.close(fd)
    return _memfd("fanstore:parts", size)


def prepare_spare(size: int) -> None:
    """Allocates, on a thread, the pages of a memfd of `size` bytes for
    the next save of this process (see `_SPARE`)."""
    if size < _SPARE_MIN:
        return
    with _SPARE_LOCK:
        if _SPARE["busy"] and _SPARE["pid"] == os.getpid():
            return
        _SPARE["busy"], _SPARE["pid"] = True, os.getpid()

    def run():
        fd = None
        try:
            fd = os.memfd_create("fanstore:parts", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
            os.ftruncate(fd, size)
            os.posix_fallocate(fd, 0, size)
        except OSError:
            if fd is not None:
                os.close(fd)
            fd = None
        with _SPARE_LOCK:
            old = _SPARE["fd"]
            _SPARE.update(fd=fd, busy=False)
        if old is not None:
            os.close(old)

    threading.Thread(target=run, name="fanstore-spare", daemon=True).start()


def _pwrite_all(fd: int, data, off: int) -> None:
    view = memoryview(data).cast("B")
    while len(view):
        n = os.pwrite(fd, view, off)
        view, off = view[n:], off + n


def seal(fd: int) -> None:
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)


def parts_memfd(parts, file_len: int, file_xxh3: int) -> int:
    """A sealed memfd holding the parts file of `parts`, in file order:
    ("glue", bytes) | ("new", buffer) | ("ref", blake3 bytes, length)."""
    table = bytearray()
    data = []
    data_len = 0
    for p in parts:
        if p[0] == "ref":
            table += _entry(KIND_REF, p[2], p[1])
        else:
            n = memoryview(p[1]).nbytes
            table += _entry(KIND_GLUE if p[0] == "glue" else KIND_NEW, n, struct.pack("<Q", data_len))
            data.append(p[1])
            data_len += n
    data_off = HEADER.size + 8 + len(table)
    head = HEADER.pack(MAGIC, VERSION, len(parts), file_len, file_xxh3, data_off)
    h = xxhash.xxh3_64()
    h.update(head)
    h.update(table)
    fd = _parts_fd(data_off + data_len)
    try:
        _pwrite_all(fd, head + struct.pack("<Q", h.intdigest()) + bytes(table), 0)
        at = data_off
        for d in data:
            _pwrite_all(fd, d, at)
            at += memoryview(d).nbytes
        seal(fd)
    except BaseException:
        os.close(fd)
        raise
    return fd


class PartsWriter:
    """A parts memfd written while its parts are still being decided.
    Room for each glue part and for each storage likely to travel is
    reserved up front, in file order (`reserve`: one (length, reserved)
    per part), so that another thread can copy a storage's bytes into
    place (`write`) while the hashing pass goes on. A storage that turns
    out to be stored already leaves its room unused: the table gives each
    part's offset, so the data section may have holes. One that travels
    unexpectedly is appended at `finish`."""

    def __init__(self, reserve):
        self.data_off = HEADER.size + 8 + ENTRY_LEN * len(reserve)
        self.offsets, at = [], 0
        for n, reserved in reserve:
            self.offsets.append(at if reserved else None)
            at += n if reserved else 0
        self.end = at
        self.fd = _parts_fd(self.data_off + at)

    def write(self, index: int, data, at: int = 0) -> None:
        """Bytes `data` of part `index`, from `at` within it (pwrite: any thread)."""
        _pwrite_all(self.fd, data, self.data_off + self.offsets[index] + at)

    def finish(self, parts, file_len: int, file_xxh3: int, written) -> int:
        """The sealed memfd of `parts` (as for `parts_memfd`, in file order,
        one per reserved entry); `written`: the indexes whose bytes `write`
        put in place already."""
        table = bytearray()
        for i, p in enumerate(parts):
            if p[0] == "ref":
                table += _entry(KIND_REF, p[2], p[1])
                continue
            n = memoryview(p[1]).nbytes
            off = self.offsets[i]
            if off is None:
                off, self.end = self.end, self.end + n
                os.ftruncate(self.fd, self.data_off + self.end)
                _pwrite_all(self.fd, p[1], self.data_off + off)
            elif i not in written:
                _pwrite_all(self.fd, p[1], self.data_off + off)
            table += _entry(KIND_GLUE if p[0] == "glue" else KIND_NEW, n, struct.pack("<Q", off))
        head = HEADER.pack(MAGIC, VERSION, len(parts), file_len, file_xxh3, self.data_off)
        h = xxhash.xxh3_64()
        h.update(head)
        h.update(table)
        _pwrite_all(self.fd, head + struct.pack("<Q", h.intdigest()) + bytes(table), 0)
        seal(self.fd)
        fd, self.fd = self.fd, None
        return fd

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def file_memfd(pieces, length: int) -> int:
    """A sealed memfd holding the concatenation of `pieces` (buffers)."""
    fd = _memfd("fanstore:output", length)
    try:
        at = 0
        for p in pieces:
            _pwrite_all(fd, p, at)
            at += memoryview(p).nbytes
        seal(fd)
    except BaseException:
        os.close(fd)
        raise
    return fd
