"""The bytes `torch.save` writes around tensor data, without writing it.

`torch.save(obj, path)` stores an uncompressed zip archive through
PyTorch's `PyTorchStreamWriter` (caffe2/serialize/inline_container.cc,
miniz): per record a local header with its sizes and CRC left zero, an
extra field "FB" padding the data to the storage alignment (64), the data,
a data descriptor with the CRC-32 and sizes; then the central directory,
a zip64 end record and locator, and the end record. The record names are
`<archive>/<name>`, where `<archive>` is the file name without its last
extension (`archive` when writing to a buffer).

This module lays out the same archive from the records `torch.serialization`
hands its writer, with each tensor's bytes given by reference (length and
CRC-32, which the caller keeps from the last time it saw those bytes):
`Layout.segments` are the glue bytes and the tensor slots, in file order.
The last record, `.data/serialization_id`, is a hash over the record names
(in the writer's unordered set order) and the CRCs; it is taken from
PyTorch's own writer fed 4-byte records forged to carry the same CRCs, so
it is exact without reimplementing libstdc++'s hashing.

Archives past the zip32 limits (a record or offset >= 4 GiB, more than
65535 records) use zip64 fields: `Layout` refuses them (`Unsupported`) and
the caller falls back to `torch.save`.
"""
import io
import struct
import zipfile
import zlib

_LOCAL = struct.Struct("<4sHHHHHIIIHH")
_DESCRIPTOR = struct.Struct("<4sIII")
_CENTRAL = struct.Struct("<4sHHHHHHIIIHHHHHII")
_ZIP64_END = struct.Struct("<4sQHHIIQQQQ")
_ZIP64_LOCATOR = struct.Struct("<4sIQI")
_END = struct.Struct("<4sHHHHIIH")
_FLAGS = 0x0808          # bit 3: data descriptor; bit 11: UTF-8 names
_ZIP32_MAX = 0xFFFFFFFF


class Unsupported(Exception):
    """An archive this layout does not reproduce (zip64 sizes): use torch.save."""


def archive_name(path: str) -> str:
    """PyTorchStreamWriter's archive directory for a file `path`: its last
    component without the last extension."""
    start = max(path.rfind("/"), path.rfind("\\")) + 1
    if start >= len(path):
        return ""
    name = path[start:]
    dot = name.rfind(".")
    return name[:dot] if dot >= 0 else name


class Unit:
    """A tensor slot in the layout: `nbytes` of data with CRC-32 `crc`,
    `key` naming it for the caller."""
    __slots__ = ("key", "nbytes", "crc", "offset")

    def __init__(self, key, nbytes: int, crc: int):
        self.key, self.nbytes, self.crc, self.offset = key, nbytes, crc, 0


_INV = None


def _crc_basis():
    """For forging: the inverse of CRC-32 over 4-byte messages (an affine
    bijection of GF(2)^32), as 32 row masks."""
    global _INV
    if _INV is None:
        c0 = zlib.crc32(b"\0\0\0\0")
        cols = [zlib.crc32((1 << i).to_bytes(4, "little")) ^ c0 for i in range(32)]
        # Gauss-Jordan: find, for each output bit, the input mask producing it.
        rows = [(cols[i], 1 << i) for i in range(32)]
        basis = {}
        for v, m in rows:
            for bit in sorted(basis, reverse=True):
                if v >> bit & 1:
                    bv, bm = basis[bit]
                    v, m = v ^ bv, m ^ bm
            if v:
                top = v.bit_length() - 1
                for bit in list(basis):
                    bv, bm = basis[bit]
                    if bv >> top & 1:
                        basis[bit] = (bv ^ v, bm ^ m)
                basis[top] = (v, m)
        assert len(basis) == 32, "CRC-32 over 4 bytes is a bijection"
        _INV = (c0, [basis[b][1] for b in range(32)])
    return _INV


def forge4(crc: int) -> bytes:
    """The 4 bytes whose CRC-32 is `crc`."""
    c0, inv = _crc_basis()
    want = crc ^ c0
    m = 0
    for b in range(32):
        if want >> b & 1:
            m ^= inv[b]
    out = m.to_bytes(4, "little")
    assert zlib.crc32(out) == crc
    return out


#: end_records' answers by their question: a save asks the same ones again
#: and again (every draft layout, every unchanged tensor's archive), and
#: each answer built ~40 Python objects, whose allocations set off the
#: interpreter's full collections (213-227 ms each with torch loaded, one
#: every ~7 DCP saves of 12 tensors: measured).
_END_CACHE: dict = {}
_END_CACHE_MAX = 4096


def end_records(records, alignment: int):
    """The `version` and `.data/serialization_id` records PyTorch's writer
    appends at its end, for `records` [(name, crc32, size)] written before them:
    [(name, bytes)], from the writer itself (see the module doc)."""
    key = (tuple(records), alignment)
    hit = _END_CACHE.get(key)
    if hit is not None:
        return list(hit)
    out = _end_records(records, alignment)
    if len(_END_CACHE) >= _END_CACHE_MAX:
        _END_CACHE.clear()
    _END_CACHE[key] = tuple(out)
    return out


def _end_records(records, alignment: int):
    import torch
    buf = io.BytesIO()
    w = torch._C.PyTorchFileWriter(buf, True, alignment)
    for name, crc, size in records:
        # An empty record has no data descriptor, so no CRC in the hash.
        w.write_record(name, forge4(crc) if size else b"", 4 if size else 0)
    w.write_end_of_file()
    z = zipfile.ZipFile(io.BytesIO(buf.getvalue()))
    known = {r[0] for r in records}
    out = []
    for info in z.infolist():
        name = info.filename.split("/", 1)[1]
        if name not in known:
            out.append((name, z.read(info)))
    return out


class Layout:
    """The archive of `records` [(name, bytes | Unit)] under `archive`:
    `segments` in file order, each bytes (glue) or a Unit (with its
    offset set), and `length`."""

    def __init__(self, archive: str, records, alignment: int = 64):
        head = [(n, d if isinstance(d, Unit) else bytes(d)) for n, d in records]
        crcs = [(n, d.crc, d.nbytes) if isinstance(d, Unit) else (n, zlib.crc32(d), len(d)) for n, d in head]
        head += end_records(crcs, alignment)
        if len(head) > 0xFFFF:
            raise Unsupported("more than 65535 records")
        segs, central = [], []
        glue = bytearray()
        pos = 0
        for name, data in head:
            full = f"{archive}/{name}".encode()
            size = data.nbytes if isinstance(data, Unit) else len(data)
            crc = data.crc if isinstance(data, Unit) else zlib.crc32(data)
            if size >= _ZIP32_MAX or pos >= _ZIP32_MAX:
                raise Unsupported("a record or offset past 4 GiB")
            start = pos + _LOCAL.size + len(full) + 4
            pad = (-start) % alignment
            local_at = pos
            # miniz writes no data descriptor (and no flag for one) for an empty record.
            flags = _FLAGS if size else _FLAGS & ~0x0008
            glue += _LOCAL.pack(b"PK\x03\x04", 0, flags, 0, 0, 0, 0, 0, 0, len(full), pad + 4)
            glue += full + b"FB" + struct.pack("<H", pad) + b"Z" * pad
            pos = start + pad
            if isinstance(data, Unit):
                segs.append(bytes(glue))
                glue = bytearray()
                data.offset = pos
                segs.append(data)
            else:
                glue += data
            pos += size
            if size:
                glue += _DESCRIPTOR.pack(b"PK\x07\x08", crc, size, size)
                pos += _DESCRIPTOR.size
            central.append(_CENTRAL.pack(b"PK\x01\x02", 0, 0, flags, 0, 0, 0, crc, size, size, len(full),
                                         0, 0, 0, 0, 0, local_at) + full)
        cd_at = pos
        cd = b"".join(central)
        n = len(central)
        end64_at = cd_at + len(cd)
        if end64_at >= _ZIP32_MAX:
            raise Unsupported("central directory past 4 GiB")
        glue += cd
        glue += _ZIP64_END.pack(b"PK\x06\x06", 44, 0x031E, 0x002D, 0, 0, n, n, len(cd), cd_at)
        glue += _ZIP64_LOCATOR.pack(b"PK\x06\x07", 0, end64_at, 1)
        glue += _END.pack(b"PK\x05\x06", 0, 0, n, n, len(cd), cd_at, 0)
        segs.append(bytes(glue))
        self.segments = segs
        self.length = end64_at + _ZIP64_END.size + _ZIP64_LOCATOR.size + _END.size
