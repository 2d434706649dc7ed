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
HDF5) and torch.distributed.checkpoint (2 ranks save, sync and async; 2
ranks and 1 rank load; FSDP2 shards saved by 2 ranks, loaded by 2, 1 and 3),
and TensorBoard event files (tf.summary, torch's SummaryWriter) read back by
TensorBoard's reader. The frameworks come from the venv of scripts/setup.sh
(fixture framework_python)."""
import json

import fs_cluster
from fs_cluster import cluster_fixture, run_json

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


DCP = r"""
import json, os, sys, warnings
warnings.filterwarnings("ignore")
import torch, torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
rank, world, port, root, mode = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
def trained(steps):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.Linear(512, 512), torch.nn.Linear(512, 16))
    o = torch.optim.Adam(m.parameters())
    m(torch.randn(4, 512)).sum().backward()
    o.step()
    with torch.no_grad():
        m[2].weight.add_(0.01 * steps)   # only the head changes between checkpoints
    return m, o
if mode == "save":
    for step in range(3):
        m, _ = trained(step)
        dcp.save({"model": m.state_dict()}, checkpoint_id=os.path.join(root, f"step{step}"))
    m, o = trained(2)
    msd, osd = get_state_dict(m, o)
    dcp.async_save({"model": msd, "optim": osd}, checkpoint_id=os.path.join(root, "full")).result()
    dist.barrier()
    print(json.dumps({d: sorted(os.listdir(os.path.join(root, d))) for d in ("step0", "step2", "full")}))
else:
    want, want_o = trained(2)
    m = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.Linear(512, 512), torch.nn.Linear(512, 16))
    sd = {"model": m.state_dict()}
    dcp.load(sd, checkpoint_id=os.path.join(root, "step2"))
    m.load_state_dict(sd["model"])
    m2 = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.Linear(512, 512), torch.nn.Linear(512, 16))
    o2 = torch.optim.Adam(m2.parameters())
    msd, osd = get_state_dict(m2, o2)
    full = {"model": msd, "optim": osd}
    dcp.load(full, checkpoint_id=os.path.join(root, "full"))
    set_state_dict(m2, o2, model_state_dict=full["model"], optim_state_dict=full["optim"])
    same = lambda a, b: all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    st = lambda o: [(v["step"].item(), v["exp_avg"].sum().item()) for v in o.state_dict()["state"].values()]
    print(json.dumps({"step2": same(m, want), "full": same(m2, want), "optim": st(o2) == st(want_o)}))
dist.barrier()  # no rank tears gloo down while a peer still uses it
dist.destroy_process_group()
"""

FSDP2 = r"""
import json, os, sys, warnings
warnings.filterwarnings("ignore")
import torch, torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
rank, world, port, root, mode = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
mesh = init_device_mesh("cpu", (world,))
torch.manual_seed(0)
m = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8))
for layer in (m[0], m[2]):
    fully_shard(layer, mesh=mesh)
fully_shard(m, mesh=mesh)
o = torch.optim.Adam(m.parameters())
msd, osd = get_state_dict(m, o)
if mode == "save":
    torch.manual_seed(1)
    m(torch.randn(4, 256)).sum().backward()
    o.step()
    msd, osd = get_state_dict(m, o)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=root)
else:
    state = {"model": msd, "optim": osd}
    dcp.load(state, checkpoint_id=root)
    set_state_dict(m, o, model_state_dict=state["model"], optim_state_dict=state["optim"])
# Every rank gathers the whole tensors: the same digest on every rank and world size.
digest = {k: v.full_tensor().numpy().tobytes().hex()[:64] + str(float(v.full_tensor().double().sum()))
          for k, v in m.state_dict().items()}
moments = {k: float(v["exp_avg"].full_tensor().double().sum()) for k, v in o.state_dict()["state"].items()}
print(json.dumps({"model": digest, "exp_avg": moments}))
dist.barrier()  # no rank tears gloo down while a peer still uses it
dist.destroy_process_group()
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


cl = cluster_fixture("fw", seed=8, n_files=8, mount=MOUNT)


TENSORBOARD = r"""
import json, os, sys
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
root, mode = sys.argv[1], sys.argv[2]
if mode == "write":
    import tensorflow as tf
    from torch.utils.tensorboard import SummaryWriter
    w = tf.summary.create_file_writer(os.path.join(root, "tf"))
    with w.as_default():
        for step in range(5):
            tf.summary.scalar("loss", 1.0 / (step + 1), step=step)
    w.close()
    sw = SummaryWriter(os.path.join(root, "pt"))
    for step in range(5):
        sw.add_scalar("loss", 2.0 / (step + 1), step)
    sw.close()
    print(json.dumps({d: len(os.listdir(os.path.join(root, d))) for d in ("tf", "pt")}))
else:
    import tensorflow as tf
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    out = {}
    for d in ("tf", "pt"):
        ea = EventAccumulator(os.path.join(root, d))
        ea.Reload()
        if "loss" in ea.Tags()["scalars"]:  # torch's SummaryWriter: scalar summaries
            values = [e.value for e in ea.Scalars("loss")]
        else:  # tf.summary in TF 2: tensor summaries
            values = [float(tf.make_ndarray(e.tensor_proto)) for e in ea.Tensors("loss")]
        out[d] = [round(v, 4) for v in values]
    print(json.dumps(out))
"""


def run(py, c, node, code, *args):
    """`code` under `py` on `node` of `c` (natively when `c` is None): the JSON of its last line."""
    return run_json(c, node, code, *args, python=py, timeout=600,
                    env=dict(OMP_NUM_THREADS="2", JAX_PLATFORMS="cpu") if c else None)


def run_ranks(py, c, nodes, code, *args):
    """fs_cluster.run_ranks of `code` under the frameworks' python `py`."""
    return fs_cluster.run_ranks(c, nodes, code, *args, python=py)


def test_torch_distributed_checkpoint_shards_are_stored_per_tensor(framework_python, cl, tmp_path):
    """torch.distributed.checkpoint (DCP): 2 ranks on nodes 1 and 2 write 3
    checkpoints (only the head changes) and an async_save of model + optimizer;
    2 ranks on nodes 3 and 0, then 1 rank alone, load them back. Each
    __<rank>_0.distcp shard is stored per tensor: the frozen tensors once."""
    native = run_ranks(framework_python, None, [0, 1], DCP, str(tmp_path / "native"), "save")
    assert native[0]["step2"] == [".metadata", "__0_0.distcp", "__1_0.distcp"], native
    assert run_ranks(framework_python, cl, [1, 2], DCP, f"{MOUNT}/dcp", "save") == native
    for nodes in ([3, 0], [0]):
        back = run_ranks(framework_python, cl, nodes, DCP, f"{MOUNT}/dcp", "load")
        assert back == [{"step2": True, "full": True, "optim": True}] * len(nodes), (nodes, back)
    rows = {row["path"]: row for row in json.loads(cl.cli("ckpt", "ls", "--json").stdout)}
    shards = sorted(p for p in rows if p.startswith("dcp/step") and p.endswith(".distcp"))
    assert len(shards) == 6 and all(rows[p]["format"] == "torch-dcp" for p in shards), rows
    changed = []
    for shard in ("__0_0.distcp", "__1_0.distcp"):
        first, last = rows[f"dcp/step0/{shard}"], rows[f"dcp/step2/{shard}"]
        assert last["parent"]["path"] == f"dcp/step1/{shard}", last
        # A later shard stores at most the head (16 x 512 floats, 32 KiB) anew.
        assert last["stored_new_bytes"] < 40_000 < first["stored_new_bytes"], (first, last)
        owners = json.loads(cl.cli("ckpt", "owners", "--json", f"{MOUNT}/dcp/step2/{shard}").stdout)["tensors"]
        assert owners and all(t["name"].startswith("item") and t["dtype"] == "F32" for t in owners), owners
        for t in owners:
            if t["owner"]["path"] != f"dcp/step0/{shard}":
                changed.append((t["shape"], t["owner"]["path"]))
    assert len(changed) == 1 and changed[0][0] == [16, 512] and changed[0][1].startswith("dcp/step2/"), changed


def test_fsdp2_sharded_checkpoint_reloads_on_other_world_sizes(framework_python, cl):
    """FSDP2 (fully_shard on a CPU device mesh, gloo): 2 ranks on nodes 1 and 2
    save their shards of the model and of Adam's state with DCP; 2, 1 and 3
    ranks on other nodes load them back, resharded, and gather the same tensors."""
    saved = run_ranks(framework_python, cl, [1, 2], FSDP2, f"{MOUNT}/fsdp", "save")
    assert saved[0] == saved[1] and len(saved[0]["model"]) == 4 and len(saved[0]["exp_avg"]) == 4, saved
    for nodes in ([3, 0], [0], [2, 3, 1]):
        back = run_ranks(framework_python, cl, nodes, FSDP2, f"{MOUNT}/fsdp", "load")
        assert back == [saved[0]] * len(nodes), nodes
    rows = {row["path"]: row for row in json.loads(cl.cli("ckpt", "ls", "--json").stdout)}
    assert {p: rows[p]["format"] for p in rows if p.startswith("fsdp/")} == \
        {"fsdp/__0_0.distcp": "torch-dcp", "fsdp/__1_0.distcp": "torch-dcp"}, rows


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


def test_tensorboard_event_files_from_tensorflow_and_torch(framework_python, cl, tmp_path):
    """tf.summary and torch's SummaryWriter write event files through /fanstore;
    TensorBoard's own reader reads them back on another node as natively."""
    native = run(framework_python, None, 0, TENSORBOARD, str(tmp_path / "native"), "write")
    assert native == {"tf": 1, "pt": 1}, native
    assert run(framework_python, cl, 1, TENSORBOARD, f"{MOUNT}/tb", "write") == native
    want = run(framework_python, None, 0, TENSORBOARD, str(tmp_path / "native"), "read")
    assert want["pt"] == [2.0, 1.0, 0.6667, 0.5, 0.4] and want["tf"] == [1.0, 0.5, 0.3333, 0.25, 0.2], want
    assert run(framework_python, cl, 3, TENSORBOARD, f"{MOUNT}/tb", "read") == want
