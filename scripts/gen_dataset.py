#!/usr/bin/env python3
"""Generates a small image-like training dataset: class directories holding
PNG images and .npz arrays, plus a validation split.

    gen_dataset.py OUT [--classes 8] [--per-class 40] [--size 64] [--seed 0]

Images are smooth gradients with noise (they compress like photos do a bit);
arrays are float32 feature maps. The output is deterministic for a seed.
"""
import argparse
import os

import numpy as np
from PIL import Image


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--classes", type=int, default=8)
    ap.add_argument("--per-class", type=int, default=40)
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    yy, xx = np.mgrid[0 : a.size, 0 : a.size]
    n = 0
    for split, per in (("train", a.per_class), ("val", max(1, a.per_class // 4))):
        for c in range(a.classes):
            d = os.path.join(a.out, split, f"class{c:03d}")
            os.makedirs(d, exist_ok=True)
            for i in range(per):
                base = (xx * (c + 1) + yy * (i % 7 + 1)) % 256
                noise = rng.integers(0, 24, size=(a.size, a.size, 3))
                img = (base[..., None] + noise).astype(np.uint8)
                Image.fromarray(img, "RGB").save(os.path.join(d, f"img{i:05d}.png"))
                if i % 4 == 0:
                    feats = rng.standard_normal((16, a.size)).astype(np.float32)
                    np.savez(os.path.join(d, f"feat{i:05d}.npz"), x=feats, label=np.int64(c))
                n += 1
    with open(os.path.join(a.out, "labels.txt"), "w") as f:
        for c in range(a.classes):
            f.write(f"class{c:03d}\n")
    print(f"generated {n} images in {a.classes} classes under {a.out}")


if __name__ == "__main__":
    main()
