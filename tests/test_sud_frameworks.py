"""ML frameworks write checkpoints through /fanstore: safetensors (torch),
transformers save_pretrained/from_pretrained, accelerate save_state/
load_state. All of them end in safetensors' save_file, which renames its
temp file with a raw renameat2 (rustix): caught by syscall user dispatch.
Written through one node, read back through another (4 daemons under
mpiexec, FANSTORE_NODE picks the node). The frameworks come from the venv
of scripts/setup.sh (fixture framework_python).
"""
import textwrap

import pytest

from fs_cluster import packed_cluster

MOUNT = "/fanstore"
TIMEOUT = 300

# A digest of every tensor of a state dict (names sorted), printed as DIGEST=...
DIGEST = """
import hashlib
def digest(sd):
    h = hashlib.sha256()
    for k in sorted(sd):
        v = sd[k]
        if hasattr(v, "detach"):
            h.update(k.encode()); h.update(v.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()
"""


@pytest.fixture(scope="module")
def cl(bins, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sudfw")
    with packed_cluster(bins, tmp, n_files=8, seed=3, mount=MOUNT) as (c, _):
        yield c, tmp


def run(py, c, tmp, node, code):
    env = dict(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_HOME=str(tmp / "hf-home"),
               OMP_NUM_THREADS="2", TOKENIZERS_PARALLELISM="false", TRANSFORMERS_VERBOSITY="error")
    r = c.run_python(node, DIGEST + textwrap.dedent(code), python=py, timeout=TIMEOUT, env=env)
    got = [l[len("DIGEST="):] for l in r.stdout.splitlines() if l.startswith("DIGEST=")]
    assert got, r.stdout
    return got


def test_safetensors_torch_save_file(framework_python, cl):
    c, tmp = cl
    w = run(framework_python, c, tmp, 0, f"""
        import torch
        from safetensors.torch import save_file
        torch.manual_seed(1)
        t = {{"a": torch.randn(64, 33), "b": torch.arange(1000, dtype=torch.int64), "c": torch.randn(3).half()}}
        import os
        os.makedirs("{MOUNT}/fw/st", exist_ok=True)
        save_file(t, "{MOUNT}/fw/st/t.safetensors", metadata={{"k": "v"}})
        print("DIGEST=" + digest(t))
    """)
    r = run(framework_python, c, tmp, 2, f"""
        import os
        from safetensors.torch import load_file
        from safetensors import safe_open
        assert sorted(os.listdir("{MOUNT}/fw/st")) == ["t.safetensors"], os.listdir("{MOUNT}/fw/st")
        with safe_open("{MOUNT}/fw/st/t.safetensors", "pt") as f:
            assert f.metadata() == {{"k": "v"}}
        print("DIGEST=" + digest(load_file("{MOUNT}/fw/st/t.safetensors")))
    """)
    assert w == r


def test_transformers_save_pretrained_from_pretrained(framework_python, cl):
    c, tmp = cl
    w = run(framework_python, c, tmp, 1, f"""
        import torch
        from transformers import GPT2Config, GPT2LMHeadModel
        torch.manual_seed(0)
        cfg = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=64, bos_token_id=0, eos_token_id=0)
        m = GPT2LMHeadModel(cfg).eval()
        m.save_pretrained("{MOUNT}/fw/gpt2")
        x = torch.arange(10).reshape(1, 10)
        print("DIGEST=" + digest(m.state_dict()))
        print("DIGEST=%.6f" % m(x).logits.double().sum().item())
    """)
    r = run(framework_python, c, tmp, 3, f"""
        import os, torch
        from transformers import GPT2LMHeadModel
        names = sorted(os.listdir("{MOUNT}/fw/gpt2"))
        assert "model.safetensors" in names and "config.json" in names, names
        assert not [n for n in names if n.startswith(".tmp")], names
        m = GPT2LMHeadModel.from_pretrained("{MOUNT}/fw/gpt2").eval()
        x = torch.arange(10).reshape(1, 10)
        print("DIGEST=" + digest(m.state_dict()))
        print("DIGEST=%.6f" % m(x).logits.double().sum().item())
    """)
    assert w == r


def test_accelerate_save_state_load_state(framework_python, cl):
    c, tmp = cl
    code = f"""
        import torch
        from accelerate import Accelerator
        from accelerate.utils import set_seed
        acc = Accelerator(cpu=True)
        set_seed(SEED)
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        model, opt = acc.prepare(model, opt)
    """
    w = run(framework_python, c, tmp, 0, code.replace("SEED", "0") + f"""
        for _ in range(3):
            loss = model(torch.randn(8, 16)).pow(2).mean()
            acc.backward(loss)
            opt.step()
            opt.zero_grad()
        acc.save_state("{MOUNT}/fw/acc/ckpt")
        print("DIGEST=" + digest(model.state_dict()))
        print("DIGEST=" + digest({{f"{{i}}.{{k}}": v for i, s in opt.state_dict()["state"].items() for k, v in s.items()}}))
    """)
    r = run(framework_python, c, tmp, 2, code.replace("SEED", "1") + f"""
        import os
        names = sorted(os.listdir("{MOUNT}/fw/acc/ckpt"))
        assert "model.safetensors" in names and "optimizer.bin" in names, names
        before = digest(model.state_dict())
        acc.load_state("{MOUNT}/fw/acc/ckpt")
        assert digest(model.state_dict()) != before
        print("DIGEST=" + digest(model.state_dict()))
        print("DIGEST=" + digest({{f"{{i}}.{{k}}": v for i, s in opt.state_dict()["state"].items() for k, v in s.items()}}))
    """)
    assert w == r
