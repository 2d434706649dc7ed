"""FanStore from Python.

`fanstore.torch.save(obj, path)` is `torch.save` for checkpoints under a
running FanStore job's mount (`/fanstore`): it writes the same bytes, but
sends the node's daemon only the tensors that changed since this process
last saved them, and a reference to the unit the node's checkpoint store
already holds for each of the others. `fanstore.dcp.Writer` does the same
for torch.distributed.checkpoint shards, `fanstore.safetensors.save_file`
for safetensors files.

Why pure Python over the daemon's wire protocol, and not a PyO3/maturin
wheel over fanstore-core's client: the protocol is a 40-byte header over a
unix socket with an fd attached (SCM_RIGHTS), which the standard library
speaks (`socket.send_fds`, `os.memfd_create`, file sealing with `fcntl`),
so `pip install` of the repository's `python/` directory works on a fresh
Debian 12 or 13 with no Rust toolchain, maturin or compiler in the
install step, and the package never has to match the daemon's build. The
work a pure-Python client cannot do at C speed is done by C already: xxh3
(the `xxhash` wheel), CRC-32 (zlib), copies into the memfd (pwrite). The
hashing that identifies units (blake3) and everything the store does stay
in the daemon, which returns each unit's blake3.
"""
__version__ = "0.1.0"
