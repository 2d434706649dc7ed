"""pjdfstest, the POSIX conformance suite, through the preload library on a
4-rank cluster (issue 55): every failure must be listed in
tests/pjdfstest/expected-failures.txt with its reason, and every listed
failure must still fail (the list only shrinks). The harness is
tests/pjdfstest/run.py (its docstring says how to run it by hand and how to
update the list); about 3.5 minutes on 2 cores, most of it pjdfstest's own
sleeps (chown/00.t alone takes ~3 minutes).
"""
import importlib.util
import os
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("pjdfstest_run", Path(__file__).resolve().parent / "pjdfstest" / "run.py")
pjd = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pjd)


def test_pjdfstest_matches_the_expected_failures(bins, tmp_path):
    if os.geteuid() != 0:
        pytest.skip("pjdfstest runs as root (it switches to other users itself with -u/-g): "
                    "run the suite as root, or tests/pjdfstest/run.py --user for an unprivileged run")
    lines = []
    rc = pjd.main(["--logs", str(tmp_path / "logs")], log=lines.append)
    report = "\n".join(lines)
    print(report)
    if rc == 3 and not os.environ.get("CI"):
        pytest.skip(f"pjdfstest's source is not available on this machine (CI=true makes this a failure):\n{report[-2000:]}")
    if rc != 0:
        pytest.fail(f"pjdfstest on FanStore {'differs from' if rc == 1 else 'could not be compared with'} "
                    f"tests/pjdfstest/expected-failures.txt:\n{report[-15000:]}")
