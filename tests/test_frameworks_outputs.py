"""Checkpoint writers that need outputs to be a POSIX tree, through /fanstore on
4 nodes, read back on another node: PyTorch Lightning (ModelCheckpoint with
save_last, then a resume from ckpt_path: fsspec writes to /tmp and
shutil.move falls back to copy2, whose copystat sets the output's times and
mode) and JAX Orbax (StandardCheckpointer, CheckpointManager(max_to_keep=2):
tensorstore lock files opened twice, `*.orbax-checkpoint-tmp` directories
renamed into place, old steps removed). The frameworks come from the venv of
scripts/setup.sh (fixture framework_python)."""
import json
import subprocess
import textwrap

import pytest

from fs_cluster import small_cluster

MOUNT = "/fanstore"

LIGHTNING = r"""
import json, os, sys, warnings
warnings.filterwarnings("ignore")
import torch, lightning as L
from torch.utils.data import DataLoader, TensorDataset
torch.manual_seed(0)
class M(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.l = torch.nn.Linear(4, 1)
    def training_step(self, b, i):
        x, y = b
        return torch.nn.functional.mse_loss(self.l(x), y)
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)
root, mode = sys.argv[1], sys.argv[2]
ds = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
kw = dict(default_root_dir=root, logger=False, enable_progress_bar=False, enable_model_summary=False, accelerator="cpu")
ck = lambda: L.pytorch.callbacks.ModelCheckpoint(dirpath=os.path.join(root, "ckpts"), save_last=True, save_top_k=2,
                                                 monitor="step", mode="max")
if mode == "fit":
    L.Trainer(max_epochs=3, callbacks=[ck()], **kw).fit(M(), DataLoader(ds, batch_size=16))
else:
    t = L.Trainer(max_epochs=4, callbacks=[ck()], **kw)
    t.fit(M(), DataLoader(ds, batch_size=16), ckpt_path=os.path.join(root, "ckpts", "last.ckpt"))
last = torch.load(os.path.join(root, "ckpts", "last.ckpt"), weights_only=False)
print(json.dumps({"files": sorted(os.listdir(os.path.join(root, "ckpts"))), "epoch": last["epoch"],
                  "step": last["global_step"]}))
"""

ORBAX = r"""
import json, os, sys, warnings
warnings.filterwarnings("ignore")
import numpy as np
import jax, jax.numpy as jnp
import orbax.checkpoint as ocp
root, mode = sys.argv[1], sys.argv[2]
state = {"w": jnp.arange(12.0).reshape(3, 4), "b": jnp.ones(4), "step": jnp.array(7)}
if mode == "save":
    ck = ocp.StandardCheckpointer()
    ck.save(os.path.join(root, "std"), state)
    ck.wait_until_finished()
    mgr = ocp.CheckpointManager(os.path.join(root, "mgr"), options=ocp.CheckpointManagerOptions(max_to_keep=2))
    for step in range(4):
        mgr.save(step, args=ocp.args.StandardSave(jax.tree_util.tree_map(lambda x: x + step, state)))
    mgr.wait_until_finished()
    print(json.dumps({"steps": list(mgr.all_steps()), "root": sorted(os.listdir(root))}))
else:
    got = ocp.StandardCheckpointer().restore(os.path.join(root, "std"), state)
    same = all(np.array_equal(got[k], state[k]) for k in state)
    mgr = ocp.CheckpointManager(os.path.join(root, "mgr"))
    latest = mgr.restore(mgr.latest_step(), args=ocp.args.StandardRestore(state))
    print(json.dumps({"std": same, "steps": list(mgr.all_steps()), "latest_w_ok": bool(np.array_equal(latest["w"], state["w"] + 3))}))
"""


@pytest.fixture(scope="module")
def cl(bins, tmp_path_factory):
    c = small_cluster(bins, tmp_path_factory.mktemp("fw"), seed=8, n_files=8, mount=MOUNT)
    yield c
    c.stop()


def run(py, c, node, code, *args):
    env = c.env(node) if c else None
    if env is not None:
        env.update(OMP_NUM_THREADS="2", JAX_PLATFORMS="cpu")
    r = subprocess.run([py, "-c", textwrap.dedent(code), *args], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"node {node}: {r.stderr[-4000:]}\n" + (c.log()[-2000:] if c else "")
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_lightning_checkpoints_and_resume(framework_python, cl, tmp_path):
    native = run(framework_python, None, 0, LIGHTNING, str(tmp_path / "native"), "fit")
    assert native["files"] == ["epoch=1-step=8.ckpt", "epoch=2-step=12.ckpt", "last.ckpt"], native
    assert run(framework_python, cl, 0, LIGHTNING, f"{MOUNT}/lt", "fit") == native
    resumed_native = run(framework_python, None, 0, LIGHTNING, str(tmp_path / "native"), "resume")
    # Resumed on another node from the checkpoint node 0 wrote.
    assert run(framework_python, cl, 2, LIGHTNING, f"{MOUNT}/lt", "resume") == resumed_native
    assert resumed_native["epoch"] == 3


def test_orbax_standard_checkpointer_and_manager(framework_python, cl, tmp_path):
    native = run(framework_python, None, 0, ORBAX, str(tmp_path / "native"), "save")
    assert native == {"steps": [2, 3], "root": ["mgr", "std"]}, native
    assert run(framework_python, cl, 0, ORBAX, f"{MOUNT}/ox", "save") == native
    back = run(framework_python, cl, 3, ORBAX, f"{MOUNT}/ox", "load")
    assert back == {"std": True, "steps": [2, 3], "latest_w_ok": True}
