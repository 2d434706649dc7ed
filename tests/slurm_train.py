"""A training-shaped task for tests/test_slurm.py and tests/test_launch.py: run on
every task of a job with LD_PRELOAD=libfanstore_preload.so.

    slurm_train.py MOUNT [--hold | --fail]

Every task reads every dataset file under MOUNT (sorted walk, outputs under
MOUNT/ckpt left out) and prints its digest. Task 0 then writes a checkpoint
MOUNT/ckpt/model-<job>.npy (np.save of ``expected_array()``) and prints
``closed``; every other task waits until the checkpoint is visible, loads it,
and checks it. With --hold, task 0 then sleeps (the job gets cancelled);
with --fail, task 0 then exits 3 (a training step that fails).

Tasks on emulated Slurm nodes of one host talk to their node's daemon
(FANSTORE_NODE = SLURM_NODEID), as they would on separate hosts.
"""
import hashlib
import os
import sys
import time

MODEL = "model-{job}.npy"


def expected_array():
    import numpy as np
    return (np.arange(300_000, dtype=np.float32) * 0.5).reshape(600, 500)


def task_id():
    for var in ("SLURM_PROCID", "PMI_RANK", "OMPI_COMM_WORLD_RANK"):
        if var in os.environ:
            return int(os.environ[var])
    return 0


def dataset_digest(mount: str):
    h = hashlib.sha256()
    n = 0
    for d, dirs, files in os.walk(mount):
        if d == mount:
            dirs[:] = [x for x in dirs if x != "ckpt"]
        dirs.sort()
        for f in sorted(files):
            p = os.path.join(d, f)
            if os.path.islink(p):
                continue
            with open(p, "rb") as fh:
                data = fh.read()
            h.update(os.path.relpath(p, mount).encode("utf-8", "surrogateescape") + b"\0")
            h.update(hashlib.sha256(data).digest())
            n += 1
    return n, h.hexdigest()


def main():
    if "FANSTORE_NODE" not in os.environ and "SLURM_NODEID" in os.environ:
        os.environ["FANSTORE_NODE"] = os.environ["SLURM_NODEID"]
        os.execv(sys.executable, [sys.executable, *sys.argv])
    import numpy as np
    mount = sys.argv[1].rstrip("/")
    hold = "--hold" in sys.argv[2:]
    fail = "--fail" in sys.argv[2:]
    task = task_id()
    job = os.environ.get("SLURM_JOB_ID") or os.environ.get("FANSTORE_TEST_JOB", "nojob")
    n, digest = dataset_digest(mount)
    print(f"task {task} node {os.environ.get('FANSTORE_NODE', '-')} files {n} digest {digest}", flush=True)
    model = f"{mount}/ckpt/{MODEL.format(job=job)}"
    want = expected_array()
    if task == 0:
        os.makedirs(f"{mount}/ckpt", exist_ok=True)
        np.save(model, want)
        print(f"task 0 closed {model}", flush=True)
        if hold:
            print("task 0 holding", flush=True)
            time.sleep(3600)
        if fail:
            print("task 0 fails", flush=True)
            sys.exit(3)
        return
    deadline = time.monotonic() + 120
    while not os.path.exists(model):
        if time.monotonic() > deadline:
            sys.exit(f"task {task}: {model} not visible after 120 s")
        time.sleep(0.2)
    got = np.load(model)
    if got.dtype != want.dtype or got.shape != want.shape or not np.array_equal(got, want):
        sys.exit(f"task {task}: {model} holds other bytes")
    print(f"task {task} read checkpoint ok", flush=True)
    if hold:
        time.sleep(3600)


if __name__ == "__main__":
    main()
