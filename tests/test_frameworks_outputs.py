"""Checkpoint writers that need outputs to be a POSIX tree, through /fanstore on
4 nodes, read back on another node: PyTorch Lightning (ModelCheckpoint with
save_last, then a resume from ckpt_path: fsspec writes to /tmp and
shutil.move falls back to copy2, whose copystat sets the output's times and
mode) and JAX Orbax (StandardCheckpointer, CheckpointManager(max_to_keep=2):
tensorstore lock files opened twice, `*.orbax-checkpoint-tmp` directories
renamed into place, old steps removed), HF transformers' Trainer
(save_total_limit=2: checkpoint-N directories rotated with rmtree, then
resume_from_checkpoint on another node) and TensorFlow/Keras (model.save of a
.keras zip, tf.train.CheckpointManager(max_to_keep=2), save_weights to
HDF5). The frameworks come from the venv of scripts/setup.sh (fixture
framework_python)."""
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


HF_TRAINER = r"""
import json, os, sys, warnings
warnings.filterwarnings("ignore")
import torch
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments
from transformers.utils import logging
logging.set_verbosity_error()
root, mode = sys.argv[1], sys.argv[2]
torch.manual_seed(0)
class Data(torch.utils.data.Dataset):
    def __len__(self):
        return 64
    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return {"input_ids": torch.randint(0, 100, (8,), generator=g), "labels": i % 2}
model = BertForSequenceClassification(BertConfig(vocab_size=100, hidden_size=16, num_hidden_layers=1,
                                                 num_attention_heads=2, intermediate_size=32, num_labels=2))
args = TrainingArguments(output_dir=root, save_strategy="steps", save_steps=2, save_total_limit=2,
                         max_steps=8 if mode == "train" else 12, per_device_train_batch_size=4, report_to=[],
                         use_cpu=True, logging_steps=1000, dataloader_num_workers=0, seed=0)
trainer = Trainer(model=model, args=args, train_dataset=Data())
out = trainer.train(resume_from_checkpoint=(mode == "resume") or None)
ck = sorted(d for d in os.listdir(root) if d.startswith("checkpoint-"))
files = sorted(f for f in os.listdir(os.path.join(root, ck[-1])) if not f.startswith("rng_state"))
print(json.dumps({"step": out.global_step, "checkpoints": ck, "files": files}))
"""

TENSORFLOW = r"""
import json, os, sys
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
import numpy as np
import tensorflow as tf
root, mode = sys.argv[1], sys.argv[2]
tf.keras.utils.set_random_seed(0)
model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(3)])
ckpt = tf.train.Checkpoint(model=model)
mgr = tf.train.CheckpointManager(ckpt, os.path.join(root, "tf"), max_to_keep=2)
if mode == "save":
    os.makedirs(root, exist_ok=True)
    for step in range(3):
        model.layers[0].kernel.assign(np.full((4, 3), step, np.float32))
        mgr.save()
    model.save(os.path.join(root, "m.keras"))
    model.save_weights(os.path.join(root, "w.weights.h5"))
    print(json.dumps({"tf": sorted(os.listdir(os.path.join(root, "tf"))), "root": sorted(os.listdir(root))}))
else:
    ckpt.restore(mgr.latest_checkpoint).expect_partial()
    restored = float(model.layers[0].kernel.numpy()[0, 0])
    loaded = tf.keras.models.load_model(os.path.join(root, "m.keras"))
    other = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(3)])
    other.load_weights(os.path.join(root, "w.weights.h5"))
    print(json.dumps({"latest": os.path.basename(mgr.latest_checkpoint), "kernel": restored,
                      "keras": float(loaded.layers[0].kernel.numpy()[0, 0]), "h5": float(other.layers[0].kernel.numpy()[0, 0])}))
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


def test_hf_trainer_rotates_checkpoints_and_resumes_on_another_node(framework_python, cl, tmp_path):
    native = run(framework_python, None, 0, HF_TRAINER, str(tmp_path / "native"), "train")
    assert native["step"] == 8 and native["checkpoints"] == ["checkpoint-6", "checkpoint-8"], native
    assert run(framework_python, cl, 1, HF_TRAINER, f"{MOUNT}/hf", "train") == native
    resumed = run(framework_python, None, 0, HF_TRAINER, str(tmp_path / "native"), "resume")
    assert resumed["checkpoints"] == ["checkpoint-10", "checkpoint-12"], resumed
    assert run(framework_python, cl, 3, HF_TRAINER, f"{MOUNT}/hf", "resume") == resumed


def test_tensorflow_and_keras_checkpoints(framework_python, cl, tmp_path):
    native = run(framework_python, None, 0, TENSORFLOW, str(tmp_path / "native"), "save")
    assert "checkpoint" in native["tf"] and len([f for f in native["tf"] if f.endswith(".index")]) == 2, native
    assert run(framework_python, cl, 2, TENSORFLOW, f"{MOUNT}/tf", "save") == native
    back = run(framework_python, cl, 0, TENSORFLOW, f"{MOUNT}/tf", "load")
    assert back == {"latest": "ckpt-3", "kernel": 2.0, "keras": 2.0, "h5": 2.0}, back
