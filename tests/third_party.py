"""Where the tests find a pinned third-party source tarball (pjdfstest,
IOR/mdtest): the file an environment variable names, else the newest
`<prefix>-*.tar.gz` in the third-party directory beside the project (CI and
this project's machines), else None (the caller downloads or skips).

    from third_party import find_tarball
    t = find_tarball("ior", "FANSTORE_IOR_TARBALL")   # Path or None
"""
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DIRS = [ROOT.parent / "shared" / "third_party", Path("/work/shared/third_party")]


def find_tarball(prefix: str, env_var: str):
    """The tarball of `prefix`, or None; FileNotFoundError if `env_var`
    names a file that does not exist."""
    env = os.environ.get(env_var)
    if env:
        if not Path(env).is_file():
            raise FileNotFoundError(f"{env_var}={env}: no such file")
        return Path(env)
    for d in DIRS:
        found = sorted(d.glob(f"{prefix}-*.tar.gz"))
        if found:
            return found[-1]
    return None
