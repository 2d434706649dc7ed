"""Checkpoint storage of torch.distributed.checkpoint (DCP) shards, a piece of
bench/ckpt_bench.py.

A daemon per scheme (dedup on, its defaults; the same tensors written two
ways to one daemon would be stored once). A writer in the frameworks' venv
(torch) saves one series per frozen fraction: DCP_N checkpoints of DCP_TENSORS float32
tensors of 1 MiB (~ N(0, 0.02)), the unfrozen ones taking a small
fine-tuning step between checkpoints (w += 1e-3 * 0.02 * N(0, 1), the
`update` series of ckpt_bench.py), each checkpoint written one of three ways
under the mount:
  - dcp:          `torch.distributed.checkpoint.save` (one process, no process
                  group: one `__0_0.distcp` shard of torch.save archives back to back);
  - safetensors:  `safetensors.torch.save_file` of the same state dict;
  - dcp as chunks: the shard's bytes behind one extra byte, which no format
                  parser recognises: the content-defined chunks every DCP
                  shard was stored as before the store knew the format.
Then `fanstore ckpt ls --json`: per scheme the logical bytes and the bytes
each checkpoint stored anew (after dedup, deltas and compression). The writer
loads the last DCP checkpoint back and compares every tensor.
"""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from benchlib import BIN, FRAMEWORK_PY, Daemon, table  # noqa: E402

E = os.environ.get
TENSORS = int(E("BENCH_DCP_TENSORS", "24"))
CKPTS = int(E("BENCH_DCP_N", "8"))
FRACTIONS = (0.0, 0.75)
MIB = 2**20

WRITER = r"""
import json, os, shutil, sys, tempfile, warnings
warnings.filterwarnings("ignore")
import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import save_file
root, scheme, tensors, ckpts = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
fractions = [float(x) for x in sys.argv[5].split(",")]
scratch = tempfile.mkdtemp(dir="/dev/shm")
ok = True
for frac in fractions:
    tag = f"{root}/frozen{int(frac * 100)}/{scheme}"
    os.makedirs(tag, exist_ok=True)
    g = torch.Generator().manual_seed(1234 + int(frac * 100))  # series apart: nothing shared
    sd = {f"layers.{i}.weight": torch.randn(256, 1024, generator=g) * 0.02 for i in range(tensors)}
    frozen = set(list(sd)[: int(frac * tensors)])
    for k in range(ckpts):
        if scheme == "dcp":
            dcp.save({"model": sd}, checkpoint_id=f"{tag}/step{k}")
        elif scheme == "safetensors":
            save_file(sd, f"{tag}/step{k}.safetensors")
        else:  # the shard's bytes behind one byte: written natively, then copied in
            dcp.save({"model": sd}, checkpoint_id=f"{scratch}/step{k}")
            with open(f"{scratch}/step{k}/__0_0.distcp", "rb") as f, open(f"{tag}/step{k}.bin", "wb") as out:
                out.write(b"X" + f.read())
        last = {n: w.clone() for n, w in sd.items()}
        for name, w in sd.items():
            if name not in frozen:
                w.add_(torch.randn(w.shape, generator=g) * (1e-3 * 0.02))
    if scheme == "dcp":
        back = {"model": {n: torch.empty_like(w) for n, w in sd.items()}}
        dcp.load(back, checkpoint_id=f"{tag}/step{ckpts - 1}")
        ok = ok and all(torch.equal(back["model"][n], w) for n, w in last.items())
shutil.rmtree(scratch)
print(json.dumps({"ok": ok}))
"""


def dcp_storage(work: Path, data: Path):
    """Runs the series; returns (markdown lines, goal rows)."""
    py = FRAMEWORK_PY
    head = ["## Checkpoints: torch.distributed.checkpoint shards (bench/ckpt_dcp.py)", ""]
    r = subprocess.run([str(py), "-c", "import torch, safetensors"], capture_output=True, text=True) \
        if py.exists() else None
    if r is None or r.returncode != 0:
        why = f"{py} missing" if r is None else r.stderr.strip().splitlines()[-1:]
        return head + [f"**Not run**: the frameworks' venv has no torch ({why}); `bash scripts/setup.sh` installs it.", ""], []
    rows, ok = [], True
    for scheme in ("dcp", "safetensors", "chunks"):  # a daemon each: the same tensors would deduplicate across
        d = Daemon(data, work / f"dcp-{scheme}", mount="/fsdcp")
        try:
            w = subprocess.run([str(py), "-c", textwrap.dedent(WRITER), "/fsdcp/dcp", scheme, str(TENSORS), str(CKPTS),
                                ",".join(str(f) for f in FRACTIONS)],
                               env=dict(d.env(), OMP_NUM_THREADS="1"), capture_output=True, text=True, timeout=1800)
            if w.returncode != 0:
                raise RuntimeError(f"DCP writer ({scheme}) failed:\n{w.stderr[-3000:]}")
            ok = ok and json.loads(w.stdout.strip().splitlines()[-1])["ok"]
            ls = subprocess.run([str(BIN / "fanstore"), "ckpt", "ls", "--json", "--runtime-dir", str(d.runtime)],
                                capture_output=True, text=True, check=True)
            rows += json.loads(ls.stdout)
        finally:
            d.stop()
    sums = {}
    for row in rows:
        parts = row["path"].split("/")  # dcp/frozen<P>/<scheme>/...
        if len(parts) < 4 or (parts[2] == "dcp" and not row["path"].endswith(".distcp")):
            continue
        s = sums.setdefault((parts[1], parts[2]), {"logical": 0, "new": 0, "n": 0, "format": row["format"], "units": row["units"]})
        s["logical"] += row["logical_bytes"]
        s["new"] += row["stored_new_bytes"]
        s["n"] += 1
    trows, goals, measured = [], [], []
    for frac in FRACTIONS:
        tag = f"frozen{int(frac * 100)}"
        ratio = {}
        for scheme in ("dcp", "safetensors", "chunks"):
            s = sums.get((tag, scheme))
            if not s:
                continue
            ratio[scheme] = s["logical"] / max(s["new"], 1)
            trows.append([f"{int(frac * 100)}% frozen", {"dcp": "DCP shard", "chunks": "DCP shard as chunks"}.get(scheme, scheme),
                          s["format"], s["n"], s["units"], f"{s['logical'] / MIB:.1f}", f"{s['new'] / MIB:.1f}",
                          f"**{ratio[scheme]:.2f}x**"])
        if len(ratio) == 3:
            measured.append(f"{int(frac * 100)}% frozen: {ratio['dcp']:.2f}x (as chunks {ratio['chunks']:.2f}x; "
                            f"the same tensors as safetensors {ratio['safetensors']:.2f}x)")
    goals.append(("checkpoint storage, torch DCP shards, small updates",
                  "no goal set: DCP shards vs plain copies (as chunks; as safetensors)", "; ".join(measured), None))
    md = head + [
        f"A daemon per scheme; a writer with torch saves {CKPTS} checkpoints of {TENSORS} float32 tensors of 1 MiB "
        "(~N(0, 0.02)), the unfrozen ones taking a small fine-tuning step between checkpoints (1e-3 of the "
        "weights' scale), each checkpoint one of three ways: `torch.distributed.checkpoint.save` (one `__0_0.distcp` "
        "shard: torch.save archives back to back), `safetensors.torch.save_file` of the same tensors, and the "
        "DCP shard's bytes behind one extra byte (no format recognised: content-defined chunks, how DCP shards "
        "were stored before). `stored MiB`: the bytes the checkpoints stored anew (`fanstore ckpt ls`, after "
        "dedup, deltas and compression); ratio = logical / stored. "
        f"The last DCP checkpoint loaded back {'equal' if ok else 'DIFFERENT'}.", "",
        table(["series", "written as", "recognised as", "checkpoints", "units per file", "logical MiB",
               "stored MiB", "logical / stored"], trows), ""]
    return md, goals
