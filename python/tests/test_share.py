"""Sharing and the daemon's transforms through real clients: dependent
sampling across processes (with one killed at random), transforms against
independent readers (scikit-learn, Pillow), subsets, multilabel LIBSVM."""

from __future__ import annotations

import io
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import riffle
from riffle import client, decode

from conftest import REPO, Daemon, write_fixed, status

SHARER = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {py!r})
    import riffle
    import os
    ld = riffle.Loader({path!r}, batch_size=64, record_size=128, seed={seed}, share=True, autostart=False,
                       subset={subset!r})
    ld.info()
    print("ready", flush=True)
    while not os.path.exists({go!r}):  # all start together
        time.sleep(0.01)
    for epoch in range(2):
        ids = []
        for b in ld:
            ids += b.ids.tolist()
            print("batch", flush=True)
            time.sleep({sleep})
        assert sorted(ids) == sorted({want!r}), f"epoch {{epoch}} is not its subset once"
    print("read", flush=True)
    while not os.path.exists({end!r}):  # open until the group's counts are read
        time.sleep(0.01)
    print("ok", flush=True)
""")


def after_batches(p: subprocess.Popen, within: float) -> str | None:
    """p's first line other than "batch", or None if none came within seconds."""
    got = []
    t = threading.Thread(target=lambda: got.append(next((s for s in (line.strip() for line in iter(p.stdout.readline, ""))
                                                          if s != "batch"), "")), daemon=True)
    t.start()
    t.join(within)
    return got[0] if got else None


def test_sharing_jobs_across_processes(tmp_path):
    n = 20000
    path = str(write_fixed(tmp_path / "s.bin", n, 128))
    go, end = str(tmp_path / "go"), str(tmp_path / "end")
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    d = Daemon(str(run / "riffle.sock"), "--cache-bytes", "32MiB")
    py = str(REPO / "python")
    try:
        full, half = list(range(n)), list(range(n // 2, n))
        procs = [subprocess.Popen([sys.executable, "-c", SHARER.format(py=py, path=path, seed=s, subset=sub, want=want, sleep=sl, go=go, end=end)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ, RIFFLE_SOCKET=d.sock))
                 for s, sub, want, sl in [(1, None, full, 0.003), (2, None, full, 0.003),
                                          (3, {"ranges": [[n // 2, n]]}, half, 0.003), (4, None, full, 0.003)]]
        for p in procs:
            assert p.stdout.readline().strip() == "ready"
        open(go, "w").close()
        for p in procs:
            assert p.stdout.readline().strip() == "batch"
        st = status(d.sock)
        sizes = sorted(len(g["jobs"]) for g in st["groups"])
        assert sizes[-1] >= 3, f"groups {st['groups']}"
        # One sharer dies mid-epoch; the others go on.
        victim = procs[3]
        for _ in range(random.Random(1).randint(2, 10)):
            victim.stdout.readline()
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        for p in procs[:3]:
            assert after_batches(p, 300) == "read", p.communicate(timeout=60)[1][-2000:]
        # Every survivor has read its epochs and is still open: the group's
        # counts. Dependent sampling at one pace: a round gives the full
        # jobs one shared record, and the half-subset job the same one or
        # (half the time) one of its own: 1.5 reads a round for 2.5 records
        # given (fewer while the victim lived), where independent jobs
        # would read every record they are given. Given counts what the
        # open jobs' loaders read ahead into their next epoch too, so the
        # bound is on reads per record given. (Raw records of a local file
        # wait in the page cache, not copied into the record cache: the
        # daemon's own reads count each job's.)
        g = max(status(d.sock)["groups"], key=lambda g: len(g["jobs"]))
        open(end, "w").close()
        for p in procs[:3]:
            out, err = p.communicate(timeout=300)
            assert p.returncode == 0 and out.strip().endswith("ok"), err[-2000:]
        reads = g["given"] - g["saved"]
        assert g["given"] >= 5 * n and reads < 0.7 * g["given"], f"{reads} reads for {g['given']} records given: {g}"
        st = status(d.sock)
        assert st["cache"]["hits"] == 0, f"records copied through the record cache: {st['cache']}"
    finally:
        d.stop()


def test_libsvm_dense_transform_matches_sklearn(daemon, tmp_path):
    from sklearn.datasets import load_svmlight_file
    p = tmp_path / "d.svm"
    rng = np.random.default_rng(0)
    lines = []
    for i in range(300):
        idx = sorted(rng.choice(np.arange(1, 31), size=rng.integers(1, 8), replace=False))
        lines.append(f"{i % 3 - 1} " + " ".join(f"{j}:{rng.normal():.6f}" for j in idx))
    p.write_text("\n".join(lines) + "\n")
    X, y = load_svmlight_file(str(p), n_features=30)
    X = X.toarray().astype(np.float32)
    got = {}
    for b in riffle.Loader(p, batch_size=50, transform="libsvm_dense:n_features=30", shuffle=True, seed=1):
        arr = b.data
        assert arr.shape == (b.n, 31) and arr.dtype == np.float32
        for i, rid in enumerate(b.ids):
            got[int(rid)] = arr[i]
    assert sorted(got) == list(range(300))
    for i in range(300):
        assert got[i][0] == y[i]
        np.testing.assert_allclose(got[i][1:], X[i], rtol=1e-6)


def test_image_transform_matches_pillow(daemon, tmp_path):
    from PIL import Image
    import torch
    import riffle.torch as rt
    root = tmp_path / "imgs"
    rng = np.random.default_rng(3)
    for c in ("a", "b"):
        (root / c).mkdir(parents=True)
        for i in range(6):
            base = np.linspace(0, 255, 300 * 220 * 3).reshape(220, 300, 3)
            img = (base * rng.uniform(0.5, 1) + rng.integers(0, 20, (220, 300, 3))).clip(0, 255).astype(np.uint8)
            Image.fromarray(img).save(root / c / f"{i}.jpg", quality=95)
    n = 0
    for x, y in rt.loader(str(root), 4, transform="image:size=128,crop=112"):
        assert x.shape[1:] == (112, 112, 3) and x.dtype == torch.uint8
        n += len(y)
    assert n == 12
    # Against Pillow's resize (bilinear, antialiased) and center crop.
    ld = riffle.Loader(root, batch_size=12, transform="image:size=128,crop=112", shuffle=False)
    b = next(iter(ld))
    paths = [p for p, _ in ld.locate(b.ids.tolist())]
    for i, path in enumerate(paths):
        im = Image.open(path).convert("RGB")
        w, h = im.size
        s = 128 / min(w, h)
        im = im.resize((round(w * s), round(h * s)), Image.BILINEAR)
        left, top = (im.size[0] - 112) // 2, (im.size[1] - 112) // 2
        ref = np.asarray(im.crop((left, top, left + 112, top + 112)), np.float32)
        diff = np.abs(b.data[i].astype(np.float32) - ref).mean()
        assert diff < 6, f"{path}: mean difference {diff:.1f} from Pillow's"


def test_subsets(daemon, fixed_file):
    got = sorted(i for b in riffle.Loader(fixed_file, batch_size=64, record_size=64, subset=range(100, 300)) for i in b.ids)
    assert got == list(range(100, 300))
    got = sorted(i for b in riffle.Loader(fixed_file, batch_size=7, record_size=64, subset=[5, 999, 17]) for i in b.ids)
    assert got == [5, 17, 999]
    with pytest.raises(riffle.RiffleError, match="subset"):
        riffle.Loader(fixed_file, batch_size=7, record_size=64, subset=[1000]).info()


def test_multilabel_libsvm_like_sklearn(daemon, tmp_path):
    from sklearn.datasets import dump_svmlight_file, load_svmlight_file
    X = np.array([[0.5, 0, 1], [0, 2, 0], [1, 1, 1]], np.float64)
    Y = np.array([[1, 0, 1], [0, 0, 0], [0, 1, 0]])  # labels (0, 2), none, (1,)
    p = tmp_path / "m.svm"
    dump_svmlight_file(X, Y, str(p), multilabel=True, comment="made for riffle")
    Xr, Yr = load_svmlight_file(str(p), multilabel=True)
    b = next(iter(riffle.Loader(p, batch_size=10, shuffle=False)))
    labels, x = decode.libsvm(b, n_features=3, dense=True, zero_based=True, multilabel=True)
    assert [tuple(float(v) for v in l) for l in labels] == [tuple(float(v) for v in l) for l in Yr]
    np.testing.assert_allclose(x, Xr.toarray())
    with pytest.raises(decode.DecodeError, match="multilabel"):
        decode.libsvm(b, zero_based=True)
