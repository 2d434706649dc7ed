"""The DLIO benchmark (argonne-lcf/dlio_benchmark, MLPerf Storage's I/O
generator) reading its own datasets natively and through FanStore.

    bench/out/dlio-venv/bin/python bench/dlio_run.py [--quick]   (prints a markdown section)

bench/dlio.sh makes the venv and runs this. Two of DLIO's workloads, scaled
down to this machine and made I/O-bound (`train.computation_time=0`: no
emulated compute between batches, so the samples/s are the reader's):
- unet3d: npz files, one sample each, read by DLIO's PyTorch DataLoader,
  checkpoints written every epoch (torch.save of a model and optimizer of
  `checkpoint.model_size` bytes);
- resnet50: TFRecord files of many samples, read by DLIO's tf.data loader.
DLIO generates each dataset natively (its own generator), fanstore-prep packs
it, then every round runs DLIO's training on the native tree, through one
daemon holding everything, and through 4 daemons (`mpiexec -n 4`, UCX_TLS=tcp)
with DLIO on node 0 (3/4 of the files remote), in a rotating order; each
FanStore run is a fresh job. The checkpoints of the FanStore runs go to
/fanstore (outputs), the native ones to a local directory.
"""
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
import fs_cluster  # noqa: E402  (starts the daemons)

B = ROOT / "target" / "release"
QUICK = "--quick" in sys.argv
ROUNDS = 1 if QUICK else 3
DLIO = str(Path(sys.executable).parent / "dlio_benchmark")
MOUNT = "/fsdlio"
env = dict(os.environ, UCX_TLS=os.environ.get("UCX_TLS", "tcp"), RUST_LOG="warn", OMP_NUM_THREADS="2",
           TF_CPP_MIN_LOG_LEVEL="2", PYTHONWARNINGS="ignore")

# (name, DLIO workload config, its overrides, bytes of one sample for the table)
WORKLOADS = [
    ("unet3d", "unet3d_a100", {
        "dataset.num_files_train": 48 if QUICK else 128, "dataset.record_length": 2 << 20,
        "dataset.record_length_stdev": 0, "dataset.record_length_resize": 2 << 20,
        "reader.read_threads": 2, "reader.batch_size": 4, "train.epochs": 3,
        "workflow.checkpoint": True, "checkpoint.checkpoint_after_epoch": 1,
        "checkpoint.epochs_between_checkpoints": 1, "checkpoint.model_size": 16 << 20}),
    ("resnet50", "resnet50_tf", {
        "dataset.num_files_train": 16 if QUICK else 32, "dataset.num_samples_per_file": 128,
        "dataset.record_length": 114688, "dataset.record_length_resize": 114688,
        "reader.read_threads": 2, "reader.computation_threads": 2, "reader.batch_size": 64, "train.epochs": 2}),
]


def overrides(d):
    return [f"++workload.{k}={v}" for k, v in d.items()]


def run_dlio(work, name, config, extra, data, ckpt, run_env, tag):
    """One DLIO training run; returns (samples/s, first epoch's, later epochs' mean, seconds)."""
    out = work / f"hydra-{tag}"
    cmd = [DLIO, f"workload={config}", "++workload.workflow.generate_data=False", "++workload.workflow.train=True",
           "++workload.train.computation_time=0", f"++workload.dataset.data_folder={data}",
           f"++workload.checkpoint.checkpoint_folder={ckpt}", f"++workload.output.folder={out}", f"hydra.run.dir={out}",
           *overrides(extra)]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, env=run_env, capture_output=True, text=True, timeout=900, cwd=work)
    secs = time.perf_counter() - t0
    text = r.stdout + r.stderr
    (work / f"{tag}.log").write_text(text)
    m = re.search(r"\[METRIC\] Training Throughput \(samples/second\): ([\d.]+)", text)
    epochs = [float(x) for x in re.findall(r"Epoch \d+ - Block 1 \[Training\] Throughput \(samples/second\): ([\d.]+)", text)]
    if r.returncode != 0 or not m or len(epochs) < 2:
        raise RuntimeError(f"DLIO {name} ({tag}) failed (exit {r.returncode}):\n{text[-3000:]}")
    return float(m[1]), epochs[0], statistics.mean(epochs[1:]), secs


def start(ds, work, tag, n):
    """`mpiexec -n n` daemons (the tests' cluster helper) with the module's env
    (RUST_LOG=warn: no info lines for its MPI library check)."""
    return fs_cluster.start_cluster(fs_cluster.release_bins(), ds, work, nranks=n, mount=MOUNT, timeout=120,
                                    runtime=work / f"rt-{tag}", local=work / f"local-{tag}",
                                    log_path=work / f"daemon-{tag}.log", env=env, check_mpi=False)


def listing(rt, path):
    e = dict(env, FANSTORE_RUNTIME_DIR=str(rt), FANSTORE_NODE="0", LD_PRELOAD=str(B / "libfanstore_preload.so"))
    r = subprocess.run(["find", path, "-type", "f", "-printf", "%s\n"], env=e, capture_output=True, text=True)
    sizes = [int(x) for x in r.stdout.split()]
    return len(sizes), sum(sizes)


def main():
    work = Path(tempfile.mkdtemp(prefix="fsdlio-"))
    rows, notes = [], []
    try:
        for name, config, extra in WORKLOADS:
            src = work / "src" / name
            gen = [DLIO, f"workload={config}", "++workload.workflow.generate_data=True", "++workload.workflow.train=False",
                   f"++workload.dataset.data_folder={src}", f"hydra.run.dir={work / ('gen-' + name)}", *overrides(extra)]
            r = subprocess.run(gen, env=env, capture_output=True, text=True, timeout=900, cwd=work)
            if r.returncode != 0:
                raise RuntimeError(f"DLIO could not generate {name}:\n{(r.stdout + r.stderr)[-3000:]}")
            files = [f for f in src.rglob("*") if f.is_file()]
            nbytes = sum(f.stat().st_size for f in files)
            ds = work / f"ds-{name}"
            subprocess.run([str(B / "fanstore-prep"), "pack", "--input", str(src.parent), "--output", str(ds),
                            "--partitions", "8"], env=env, check=True, capture_output=True)
            res = {"native": [], "1 daemon": [], "4 daemons": []}
            ckpt_seen = None
            for rnd in range(ROUNDS):
                order = list(res)
                order = order[rnd % 3:] + order[:rnd % 3]
                for system in order:
                    tag = f"{name}-{system.replace(' ', '')}-{rnd}"
                    if system == "native":
                        ck = work / f"ckpt-{tag}"
                        res[system].append(run_dlio(work, name, config, extra, src, ck, env, tag))
                        shutil.rmtree(ck, ignore_errors=True)
                        continue
                    n = 1 if system == "1 daemon" else 4
                    c = start(ds, work, tag, n)
                    rt = c.runtime
                    try:
                        e = dict(env, FANSTORE_RUNTIME_DIR=str(rt), FANSTORE_NODE="0",
                                 LD_PRELOAD=str(B / "libfanstore_preload.so"))
                        res[system].append(run_dlio(work, name, config, extra, f"{MOUNT}/{name}",
                                                    f"{MOUNT}/ckpt-{name}", e, tag))
                        if extra.get("workflow.checkpoint"):
                            ckpt_seen = listing(rt, f"{MOUNT}/ckpt-{name}")
                    finally:
                        c.stop(timeout=60, check=False)
            med = {k: [statistics.median(x[i] for x in v) for i in range(3)] for k, v in res.items()}
            rows.append((name, config, len(files), nbytes, med, {k: [round(x[0]) for x in v] for k, v in res.items()}))
            if ckpt_seen:
                notes.append(f"{name}: the last FanStore run's checkpoints in {MOUNT}/ckpt-{name}: "
                             f"{ckpt_seen[0]} files, {ckpt_seen[1] / 1e6:.1f} MB")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    L = ["## DLIO benchmark (bench/dlio_run.py)", "",
         f"DLIO {dlio_version()} (MLPerf Storage's I/O generator) from PyPI, in bench/out/dlio-venv on top of the "
         "frameworks' venv (torch, tensorflow). Workloads scaled to this machine and I/O-bound (`train.computation_time=0`): "
         "unet3d (npz, one 2 MiB sample per file, DLIO's PyTorch DataLoader with 2 workers, batches of 4, 3 epochs, a "
         "checkpoint every epoch: torch.save of a 16 MiB model + optimizer) and resnet50 (TFRecord, 128 samples of "
         "112 KiB per file, DLIO's tf.data reader with 2 threads, batches of 64, 2 epochs). DLIO generated each dataset "
         "natively, fanstore-prep packed it (8 partitions); then DLIO's training on the native tree (page cache), through one "
         f"daemon holding everything, and through 4 daemons (`mpiexec -n 4`, UCX_TLS=tcp) with DLIO on node 0 (3/4 of "
         f"the files remote), {ROUNDS} rounds in a rotating order, a fresh FanStore job per run, checkpoints to "
         f"{MOUNT} (outputs). samples/s: DLIO's own `Training Throughput` (mean over its epochs; `epoch 1` and "
         "`later`: its per-epoch figures, the first one and the mean of the others); medians of the rounds. The daemons "
         "run with their defaults: among them `--extract-ahead auto` (large local files extracted in the background "
         "after ready) and `--replicate-on-read auto`.", "",
         "| workload | files | MB | native samples/s (epoch 1, later) | FanStore 1 daemon | 4 daemons, DLIO on node 0 | 1 daemon / native | 4 daemons / native | epoch 1: 1 daemon / native | epoch 1: 4 daemons / native | runs (native; 1; 4) |",
         "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for name, config, nf, nb, med, runs in rows:
        n, o, f = med["native"], med["1 daemon"], med["4 daemons"]
        cell = lambda m: f"{m[0]:.0f} ({m[1]:.0f}, {m[2]:.0f})"  # noqa: E731
        L.append(f"| {name} (`{config}`) | {nf} | {nb / 1e6:.0f} | {cell(n)} | {cell(o)} | {cell(f)} | "
                 f"**{o[0] / n[0]:.2f}x** | **{f[0] / n[0]:.2f}x** | {o[1] / n[1]:.2f}x | {f[1] / n[1]:.2f}x | "
                 f"{runs['native']}; {runs['1 daemon']}; {runs['4 daemons']} |")
    if notes:
        L += ["", "; ".join(notes) + "."]
    print("\n".join(L))


def dlio_version():
    try:
        from importlib.metadata import version
        return version("dlio-benchmark")
    except Exception:
        return "(version unknown)"


if __name__ == "__main__":
    main()
