"""The module import graphs of the daemon and the preload library have no
cycle (scripts/import_graph.py --check; docs/architecture.md, "Import graph")."""
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "import_graph.py"


def check(crate):
    return subprocess.run([sys.executable, str(SCRIPT), str(crate), "--check"], capture_output=True, text=True)


@pytest.mark.parametrize("crate", ["fanstore-daemon", "fanstore-preload"])
def test_the_crate_has_no_import_cycle(crate):
    r = check(crate)
    assert r.returncode == 0, r.stdout + r.stderr


def test_a_cycle_through_super_a_group_and_a_child_impl_is_found(tmp_path):
    src = tmp_path / "src"
    (src / "inputs").mkdir(parents=True)
    (src / "lib.rs").write_text("pub mod inputs;\npub mod node;\n")
    (src / "node.rs").write_text("use crate::inputs::{Inputs, open};\npub struct Node { i: Inputs }\n")
    (src / "inputs" / "mod.rs").write_text("pub mod open;\npub struct Inputs;\n")
    # the child reaches its parent's struct through super::, the parent
    # reaches node: a cycle inputs::open -> inputs -> node -> inputs::open
    (src / "inputs" / "open.rs").write_text("use super::Inputs;\nimpl Inputs { fn f(&self) { let _ = crate::node::Node; } }\n")
    (src / "inputs" / "mod.rs").write_text("pub mod open;\npub struct Inputs;\nfn g() { crate::node::x(); }\n")
    r = check(tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "inputs::open -> inputs" in r.stdout and "inputs -> node" in r.stdout, r.stdout


def test_test_modules_and_pub_super_are_not_imports(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "lib.rs").write_text("pub mod a;\npub mod b;\n")
    (src / "a.rs").write_text("pub(super) fn f() { crate::b::g(); }\n")
    (src / "b.rs").write_text('pub fn g() { let _ = "crate::a::f"; }\n#[cfg(test)]\nmod tests {\n    use crate::a::f;\n}\n')
    r = check(tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "1 edges" in r.stdout, r.stdout
