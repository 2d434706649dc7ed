"""A torch DataLoader the way image-classification scripts build one, without
torchvision: the dataset scan of torchvision's DatasetFolder.make_dataset
(os.scandir of the classes, os.walk of each, os.path.isfile of every file),
then a DataLoader (4 workers, batches of 256) over COUNT files drawn at random
(seed 0), read whole, twice: the first pass and the same files again.
Prints one JSON line: files, read, bytes, scan, pass1, pass2 (seconds).
Usage: python bench/loader_reader.py ROOT COUNT
"""
import json
import os
import random
import sys
import time

import torch


class Folder(torch.utils.data.Dataset):
    def __init__(self, root):
        classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
        self.samples = []
        for i, c in enumerate(classes):
            for r, _, fs in sorted(os.walk(os.path.join(root, c), followlinks=True)):
                for f in sorted(fs):
                    p = os.path.join(r, f)
                    if os.path.isfile(p):
                        self.samples.append((p, i))

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, k):
        with open(self.samples[k][0], "rb") as f:
            return len(f.read())


def main():
    root, count = sys.argv[1], int(sys.argv[2])
    t0 = time.perf_counter()
    ds = Folder(root)
    scan = time.perf_counter() - t0
    idx = random.Random(0).sample(range(len(ds)), min(count, len(ds)))
    sub = torch.utils.data.Subset(ds, idx)
    passes, total = [], 0
    for _ in range(2):
        t = time.perf_counter()
        dl = torch.utils.data.DataLoader(sub, batch_size=256, num_workers=4, collate_fn=sum)
        total = sum(dl)
        passes.append(time.perf_counter() - t)
    print(json.dumps(dict(files=len(ds), read=len(idx), bytes=total, scan=scan, pass1=passes[0], pass2=passes[1])))


if __name__ == "__main__":
    main()
