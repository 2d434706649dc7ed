#!/usr/bin/env python3
"""A training-shaped reader, the way a PyTorch DataLoader reads a dataset:
the parent lists the dataset, forked workers open, read and decode files in
random order for several epochs. Prints files/s, MB/s and an
order-independent digest (sum of per-file md5 prefixes) of every byte read, so a run on /fanstore can be
compared with a run on the original directory.

    train_reader.py ROOT [--workers 4] [--epochs 2] [--seed 0] [--ckpt-dir DIR]

With --ckpt-dir the parent writes a checkpoint after every epoch, the way
training frameworks do: a temporary file, then os.replace onto
DIR/epoch-N.npz. Half of the "model" is frozen after the first epoch.
"""
import argparse
import hashlib
import io
import multiprocessing as mp
import os
import random
import time

import numpy as np
from PIL import Image


def load(path):
    with open(path, "rb") as f:
        data = f.read()
    if path.endswith(".png"):
        arr = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"), dtype=np.float32) / 255.0
        assert arr.ndim == 3
    elif path.endswith(".npz"):
        with np.load(path) as z:
            assert z["x"].dtype == np.float32
    return len(data), int.from_bytes(hashlib.md5(data).digest()[:8], "little")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("root")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ckpt-dir")
    a = ap.parse_args()
    files = sorted(os.path.join(r, f) for r, _, fs in os.walk(a.root) for f in fs
                   if f.endswith((".png", ".npz")))
    if not files:
        raise SystemExit(f"no .png/.npz files under {a.root}")
    ctx = mp.get_context("fork")
    t0 = time.perf_counter()
    total_bytes, digest = 0, 0
    rng = np.random.default_rng(a.seed)
    model = {f"layer{i}.weight": rng.standard_normal((256, 256)).astype(np.float32) for i in range(8)}
    if a.ckpt_dir:
        os.makedirs(a.ckpt_dir, exist_ok=True)
    with ctx.Pool(a.workers) as pool:
        for epoch in range(a.epochs):
            order = files[:]
            random.Random(a.seed + epoch).shuffle(order)
            for n, h in pool.imap_unordered(load, order, chunksize=8):
                total_bytes += n
                digest = (digest + h) % (1 << 64)
            if a.ckpt_dir:
                for i, name in enumerate(sorted(model)):
                    if epoch == 0 or i >= len(model) // 2:  # the first half is frozen after epoch 0
                        model[name] = model[name] + np.float32(0.01)
                tmp = os.path.join(a.ckpt_dir, f".epoch-{epoch}.npz.tmp")
                with open(tmp, "wb") as f:
                    np.savez(f, **model)
                os.replace(tmp, os.path.join(a.ckpt_dir, f"epoch-{epoch}.npz"))
    secs = time.perf_counter() - t0
    nfiles = len(files) * a.epochs
    print(f"read {nfiles} files ({len(files)} x {a.epochs} epochs, {a.workers} forked workers) "
          f"in {secs:.2f} s: {nfiles / secs:.0f} files/s, {total_bytes / secs / 1e6:.1f} MB/s, "
          f"digest {digest:016x}")


if __name__ == "__main__":
    main()
