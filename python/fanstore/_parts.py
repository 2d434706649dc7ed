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
    fd = _memfd("fanstore:parts", data_off + data_len)
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
