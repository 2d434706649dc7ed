"""`fanstore.torch.save` vs native `torch.save` (issue 54): a state dict of
TENSORS float32 tensors (200 MB by default) saved CKPTS times, a fraction
of the tensors frozen (never changed), the others taking a small in-place
step under no_grad between saves (w += 1e-3 * 0.02 * N(0, 1)), per
fraction in BENCH_PYCKPT_FROZEN, once with the default (every storage
fingerprinted: safe against writes the version counters do not see) and
once with `trust_version=True` (storages whose version counters did not
move are not read at all); then 75% frozen with `background=True` (the
call returns once the changed storages are copied into a sealed memfd);
then 75% frozen as safetensors files: `fanstore.safetensors.save_file`
vs `safetensors.torch.save_file` (no goal of its own: measured).

One process (without the preload library: fanstore.torch.save needs only
the daemon's socket) holds the model and saves it alternately (the order
flipping every save) with `torch.save` to a plain directory on BENCH_DIR (ext4
here, no fsync: the page cache) and with `fanstore.torch.save` under the
mount of one daemon (MPI singleton, default `--dedup on`, local dir on the
same disk), same file names, and with `torch.save` to a second plain
directory whose previous checkpoint is removed (untimed) before each save
(`rotating`: the goals' reference; the RESULTS text says why). `sync`
runs (untimed) before every timed save, so that no scheme is throttled by
the dirty pages another left.
Timed: the save call, and (FanStore) until the node's store holds the
checkpoint (the daemon stores it behind the call's return; untimed
before the next save, so the next one does not pay for it). The first save of a series (every storage new) is
reported apart from the rest (saves 2..N: the steady state).
After the series every FanStore checkpoint is read back through the mount
and compared with the native file of the same name (sha256), then storage:
the native directory against the store's bytes (`fanstore ckpt du`).
Writes bench/out/pyckpt.md and bench/out/pyckpt.json (goals).

Usage: python3 bench/ckpt_python.py [--quick]
Environment (default / --quick): BENCH_PYCKPT_TENSORS [50/20]
  BENCH_PYCKPT_TENSOR_MB [4/1]  BENCH_PYCKPT_N [10/5]  BENCH_PYCKPT_FROZEN [0.75,0]  BENCH_DIR [/tmp]
"""
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from benchlib import BIN, OUT, ROOT, Daemon, du, median, table, tiny_dataset  # noqa: E402

QUICK = "--quick" in sys.argv
E = os.environ.get
TENSORS = int(E("BENCH_PYCKPT_TENSORS", "20" if QUICK else "50"))
TENSOR_MB = float(E("BENCH_PYCKPT_TENSOR_MB", "1" if QUICK else "4"))
CKPTS = int(E("BENCH_PYCKPT_N", "5" if QUICK else "10"))
FROZEN = [float(x) for x in E("BENCH_PYCKPT_FROZEN", "0.75,0").split(",")]
MB = 1e6

WRITER = r"""
import hashlib, json, os, sys, time
sys.path.insert(0, sys.argv[2])
import torch, fanstore.torch as ft, fanstore.safetensors as fst
from safetensors.torch import save_file as st_save
cfg = json.loads(sys.argv[1])
ext = ".safetensors" if cfg["fmt"] == "safetensors" else ".pt"
g = torch.Generator().manual_seed(cfg["seed"])
dtype = getattr(torch, cfg["dtype"])
n = int(cfg["tensor_mb"] * 2**20) // torch.tensor([], dtype=dtype).element_size()
sd = {f"layer{i:03d}.weight": (torch.randn(n, generator=g) * 0.02).to(dtype) for i in range(cfg["tensors"])}
frozen = int(round(cfg["frozen"] * cfg["tensors"]))
keys = list(sd)
first_last = sd[keys[-1]].clone()
rows = []
for k in range(cfg["ckpts"]):
    if k:
        with torch.no_grad():
            for name in keys[frozen:]:
                sd[name].add_((torch.randn(n, generator=g) * (cfg["step"] * 0.02)).to(dtype))
    name = f"ckpt-{k:02d}{ext}"
    order = [("native", os.path.join(cfg["native_dir"], name)), ("rotated", os.path.join(cfg["rotated_dir"], name)),
             ("fanstore", os.path.join(cfg["fs_dir"], name))]
    order = order[k % 3:] + order[:k % 3]
    row = {"k": k}
    for scheme, path in order:
        if scheme == "rotated" and k:
            # A trainer keeping its last checkpoint only: the one before goes first (untimed).
            os.remove(os.path.join(cfg["rotated_dir"], f"ckpt-{k - 1:02d}{ext}"))
        os.sync()
        t0 = time.perf_counter()
        if scheme != "fanstore" and cfg["fmt"] == "safetensors":
            st_save(sd, path)
        elif cfg["fmt"] == "safetensors":
            fst.save_file(sd, path, trust_version=cfg["trust"])
        elif scheme != "fanstore":
            torch.save(sd, path)
        elif cfg["background"]:
            h = ft.save(sd, path, trust_version=cfg["trust"], background=True)
        else:
            ft.save(sd, path, trust_version=cfg["trust"])
        row[scheme] = time.perf_counter() - t0
        if scheme == "fanstore":
            if cfg["background"]:
                h.wait()
            ft.wait_stored()
            row["stored"] = time.perf_counter() - t0
    rows.append(row)
changed = float((sd[keys[-1]] != first_last).float().mean()) if frozen < len(keys) else 0.0
print(json.dumps({"rows": rows, "bytes": os.path.getsize(os.path.join(cfg["native_dir"], f"ckpt-{cfg['ckpts'] - 1:02d}{ext}")),
                  "stats": ft.stats(), "changed_elements": changed}))
"""

VERIFY = r"""
import hashlib, json, os, sys
cfg = json.loads(sys.argv[1])
bad = []
for k in range(cfg["ckpts"]):
    name = f"ckpt-{k:02d}" + (".safetensors" if cfg["fmt"] == "safetensors" else ".pt")
    a = hashlib.sha256(open(os.path.join(cfg["native_dir"], name), "rb").read()).hexdigest()
    b = hashlib.sha256(open(os.path.join(cfg["fs_dir"], name), "rb").read()).hexdigest()
    if a != b:
        bad.append(name)
print(json.dumps({"bad": bad}))
"""


def run_py(env, code, *args):
    r = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=3600)
    if r.returncode != 0:
        raise RuntimeError(f"exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def series(frozen: float, trust: bool, background: bool, work: Path, dtype: str = "float32", fmt: str = "torch") -> dict:
    d = Daemon(tiny_dataset(work), work / "fs")
    try:
        native_dir = work / "native"
        native_dir.mkdir()
        rotated_dir = work / "rotated"
        rotated_dir.mkdir()
        fs_dir = f"{d.mount}/pyckpt"
        env = d.env()
        subprocess.run([sys.executable, "-c", f"import os; os.makedirs({fs_dir!r}, exist_ok=True)"], env=env, check=True)
        # bf16 holds 8 bits of mantissa: a fp32-sized step (1e-3 of the weights'
        # scale) would leave most elements as they were; 1e-2 changes most.
        step = 1e-3 if dtype == "float32" else 1e-2
        cfg = dict(seed=54, tensors=TENSORS, tensor_mb=TENSOR_MB, ckpts=CKPTS, frozen=frozen, trust=trust, background=background,
                   native_dir=str(native_dir), rotated_dir=str(rotated_dir), fs_dir=fs_dir, dtype=dtype, step=step, fmt=fmt)
        # The writer needs no preload library (fanstore.torch.save talks to the
        # daemon's socket): without it, torch.save runs exactly as natively.
        plain = {k: v for k, v in env.items() if k != "LD_PRELOAD"}
        out = run_py(plain, WRITER, json.dumps(cfg), str(ROOT / "python"))
        out["verify"] = run_py(env, VERIFY, json.dumps(cfg))
        dd = json.loads(subprocess.run([str(BIN / "fanstore"), "--runtime-dir", str(d.runtime), "ckpt", "du", "--json"],
                                       capture_output=True, text=True, check=True).stdout)
        out["du_json"] = dd
        ls = json.loads(subprocess.run([str(BIN / "fanstore"), "--runtime-dir", str(d.runtime), "ckpt", "ls", "--json"],
                                       capture_output=True, text=True, check=True).stdout)
        out["first"] = next((r for r in ls if r["path"].endswith("ckpt-00." + ("safetensors" if fmt == "safetensors" else "pt"))), None)
        out["native_disk"] = du(native_dir)
        out["store_disk"] = du(d.local / "rank-0" / "out" / "ckpt")
        return out
    finally:
        d.stop()


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    base = Path(E("BENCH_DIR", "/tmp"))
    results = {}
    configs = [(frozen, trust, False, "float32", "torch") for frozen in FROZEN for trust in (False, True)]
    configs += [(FROZEN[0], False, True, "float32", "torch")]  # background=True: the call returns once the changed storages are copied
    configs += [(FROZEN[0], False, False, "bfloat16", "torch")]
    configs += [(FROZEN[0], False, False, "float32", "safetensors")]
    for frozen, trust, background, dtype, fmt in configs:
        with tempfile.TemporaryDirectory(dir=base, prefix="pyckpt-") as t:
            results[(frozen, trust, background, dtype, fmt)] = series(frozen, trust, background, Path(t), dtype, fmt)
    rows, goals = [], []
    logical = TENSORS * TENSOR_MB * 2**20
    for (frozen, trust, background, dtype, fmt), r in results.items():
        dt = ("fp32" if dtype == "float32" else "bf16") + (" safetensors" if fmt == "safetensors" else "")
        first = r["rows"][0]
        rest = r["rows"][1:] or r["rows"]
        keep, fs = median([x["native"] for x in rest]), median([x["fanstore"] for x in rest])
        nat = median([x["rotated"] for x in rest])  # the goals' reference: see the module doc
        stored = median([x["stored"] for x in rest])
        fastest = min(min(x["native"], x["rotated"]) for x in r["rows"])
        ratio = nat / fs
        storage = r["native_disk"] / max(r["store_disk"], 1)
        ok = not r["verify"]["bad"]
        mode = ("trust_version" if trust else "fingerprint") + (", background" if background else "")
        rows.append([f"{frozen:.0%}", mode, f"{logical / MB:.0f} MB {dt}", f"{first['native'] * 1e3:.0f} / {first['fanstore'] * 1e3:.0f} ms",
                     f"{nat * 1e3:.0f} / {keep * 1e3:.0f} ms", f"{fs * 1e3:.0f} ms", f"{stored * 1e3:.0f} ms", f"{logical / nat / MB:.0f} / {logical / fs / MB:.0f} MB/s",
                     f"**{ratio:.2f}x** / {keep / fs:.2f}x", f"{fastest / fs:.2f}x", f"{r['native_disk'] / MB:.0f} MB / {r['store_disk'] / MB:.0f} MB ({storage:.1f}x)",
                     "yes" if ok else f"NO: {r['verify']['bad']}"])
        if fmt == "safetensors":
            goals.append((f"fanstore.safetensors.save_file, {frozen:.0%} frozen, {logical / MB:.0f} MB fp32, {CKPTS} saves",
                          "measured (no goal set; torch.save's is 3x)",
                          f"{ratio:.2f}x safetensors.torch.save_file rotating its files ({keep / fs:.2f}x keeping them)", None if ok else False))
            continue
        if background:
            goals.append((f"fanstore.torch.save(background=True), {frozen:.0%} frozen, {logical / MB:.0f} MB {dt}",
                          "the training loop waits <= 0.2x native torch.save (rotating its files)",
                          f"{fs / nat:.2f}x ({fs / keep:.2f}x of native keeping its files)",
                          fs <= 0.2 * nat and ok))
            continue
        want = 3.0 if frozen >= 0.75 else 1.0
        goals.append((f"fanstore.torch.save{' (trust_version)' if trust else ''}, {frozen:.0%} frozen, {logical / MB:.0f} MB {dt}, {CKPTS} saves",
                      f">= {want:.1f}x native torch.save throughput (ext4, no fsync; native rotating its files)",
                      f"{ratio:.2f}x (against native keeping its files: {keep / fs:.2f}x)", ratio >= want and ok))
        if dtype == "bfloat16" and r.get("first"):
            f0 = r["first"]
            fresh = f0["logical_bytes"] / max(f0["stored_new_bytes"], 1)
            goals.append((f"checkpoint store, a fresh bf16 checkpoint (random normal, std 0.02, {logical / MB:.0f} MB), no dedup possible",
                          ">= 1.5x lossless (ZipNN's published ratio for bf16 models)", f"{fresh:.2f}x", fresh >= 1.5))
    md = ["## fanstore.torch.save vs torch.save, fanstore.safetensors.save_file vs safetensors' (issue 54)", "",
          f"A state dict of {TENSORS} float32 (or bfloat16) tensors of {TENSOR_MB:g} MiB, {CKPTS} saves, the unfrozen tensors "
          "stepped in place between saves (fp32: by 1e-3 of the weights' scale; bf16, whose 8-bit mantissa would round most "
          "such steps away: by 1e-2); torch.save to ext4 (page cache, no fsync) vs fanstore.torch.save "
          "under the mount of one daemon (default --dedup on). Saves 2..N (medians); the first save "
          "(every storage new) apart. Storage: the native directory vs the node's checkpoint store on disk. "
          "`exact`: every FanStore checkpoint read back through the mount has the native file's sha256. "
          "Native is timed twice per save: writing a new file beside the earlier ones (`keeping`), and "
          "writing it after removing the one before (`rotating`, as a trainer keeping its last "
          "checkpoint; the removal untimed). On this VM a new file's page-cache pages cost 4x more when no "
          "freed page-cache pages are at hand: 210 MB torch.save, 6 saves in a row, 429-498 ms keeping "
          "the files, 91-116 ms removing the one before (touching and freeing 420 MB of anonymous memory "
          "first did not help: 381-501 ms); the first saves of a series reuse the pages the series before "
          "freed. The goals are checked against `rotating`, the faster. The `safetensors` row: the same series written with safetensors.torch.save_file "
          "vs fanstore.safetensors.save_file.", "",
          table(["frozen", "unchanged storages", "state dict", "first save native / fanstore", "native save rotating / keeping", "fanstore save",
                 "fanstore until stored", "throughput native (rotating) / fanstore", "fanstore / native rotating / keeping",
                 "fanstore / fastest native save", "storage native / store", "exact"], rows), ""]
    for (frozen, trust, background, dtype, fmt), r in results.items():
        md.append(f"- {frozen:.0%} frozen, {dtype}{' safetensors' if fmt == 'safetensors' else ''}, {'trust_version' if trust else 'fingerprint'}{', background' if background else ''}: storages fingerprinted {r['stats']['fingerprinted']}, sent as references "
                  f"{r['stats']['referenced']}, sent as bytes {r['stats']['sent']}, trusted unread {r['stats']['trusted']}; "
                  f"elements of a stepped tensor changed over the series: {r.get('changed_elements', 0):.0%}"
                  + (f"; the first checkpoint stored {r['first']['logical_bytes'] / MB:.0f} MB as {r['first']['stored_new_bytes'] / MB:.0f} MB" if r.get("first") else "") + ".")
    md.append("")
    (OUT / "pyckpt.md").write_text("\n".join(md) + "\n")
    (OUT / "pyckpt.json").write_text(json.dumps({"goals": goals, "runs": {f"{k[0]}:{k[3]}:{'trust' if k[1] else 'fingerprint'}{':background' if k[2] else ''}{':' + k[4] if k[4] != 'torch' else ''}": v for k, v in results.items()}}))
    print("\n".join(md))


if __name__ == "__main__":
    main()
