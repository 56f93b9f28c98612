"""Run by scripts/test-installed.sh against the pip-installed package: riffle
imports from site-packages, starts the daemon bundled in the wheel, and
`riffle` is on PATH."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np


def test_installed_package_loads_and_shuffles():
    import riffle
    from riffle import client

    assert "site-packages" in riffle.__file__, riffle.__file__
    binary = client.find_binary()
    assert "site-packages" in binary and Path(binary).name == "riffle", binary
    on_path = shutil.which("riffle")
    assert on_path and "version" in subprocess.run([on_path, "--version"], capture_output=True, text=True).stdout
    d = Path(tempfile.mkdtemp())
    run = Path(tempfile.mkdtemp(prefix="riffle-run-"))
    run.chmod(0o700)
    os.environ["RIFFLE_SOCKET"] = str(run / "riffle.sock")
    path = d / "r.bin"
    np.arange(1000, dtype="<i8").repeat(8).tofile(path)  # record i: eight copies of i
    ld = riffle.Loader(str(path), batch_size=100, record_size=64, dtype=np.int64, shape=(8,), seed=3)
    ids = []
    for b in ld:
        x = b.data
        assert (x[:, 0] == b.ids).all()
        ids += b.ids.tolist()
    assert sorted(ids) == list(range(1000)) and ids != sorted(ids)
    import riffle.torch as rt
    n = sum(len(t) for t in rt.loader(str(path), 128, record_size=64, dtype=np.int64, shape=(8,), num_workers=2))
    assert n == 1000
