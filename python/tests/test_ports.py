"""Ports of real training scripts to riffle, each run as a user runs it and
compared with its DataLoader twin (tests/ports/): an ImageNet-style script
(DDP launched by torchrun and by mp.spawn, set_epoch at each epoch's start,
a checkpoint every few steps holding the loader's state, SIGKILL mid-run and
--resume on another number of ranks and workers) and a Hugging Face-style
script (load_from_disk, with_transform, ClassLabel, DataLoader's collate).
Each checks every epoch by record identity: each record once, the same
samples (labels, tensors) as the twin's, and after a resume the batches of
the uninterrupted run."""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import free_port

PORTS = Path(__file__).resolve().parent / "ports"
PYTHON = str(Path(__file__).resolve().parents[1])
N = 48  # images: 3 classes of 16; 6 steps of 4 a rank on 2 ranks


def env(**kw) -> dict:
    return dict(os.environ, PYTHONPATH=PYTHON, OMP_NUM_THREADS="1", **kw)


def images(root: Path) -> Path:
    """Image i, of class i % 3, all of one colour whose red is 5 x i (its id, as the script reads it back)."""
    from PIL import Image
    for i in range(N):
        d = root / f"c{i % 3}"
        d.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.full((10 + i % 5, 14, 3), (5 * i, 100 + i, 200 - i), np.uint8)).save(d / f"{i:02d}.png")
    return root


def torchrun(world: int, tmp: Path) -> list[str]:
    """torchrun, as a user runs it. (Debian's torch 1.13 under Python 3.11 cannot read its default --redirects 0,
    an IntFlag's zero that 3.11 no longer iterates: redirecting stderr to the run's logs, and teeing it, avoids it.)"""
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", str(world),
            "--master_addr", "127.0.0.1", "--master_port", str(free_port()), "--redirects", "2", "--tee", "2",
            "--log_dir", str(tmp / "torchrun"), "--monitor_interval", "0.2"]


def imagenet(data: Path, run: Path, launch: str, world: int, workers: int, *args: str,
             background: bool = False) -> subprocess.Popen | None:
    """The ImageNet-style script on world ranks (launched by torchrun, by its own mp.spawn, or as one process)."""
    (run / "log").mkdir(parents=True, exist_ok=True)
    script = [str(PORTS / "imagenet.py"), str(data), "-j", str(workers), "--log", str(run / "log"),
              "--checkpoint-dir", str(run), *args]
    if launch == "torchrun":
        cmd = torchrun(world, run) + script
    elif launch == "spawn":
        cmd = [sys.executable] + script + ["--multiprocessing-distributed", "--world-size", str(world),
                                           "--dist-url", f"tcp://127.0.0.1:{free_port()}"]
    else:
        cmd = [sys.executable] + script
    p = subprocess.Popen(cmd, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    if background:
        return p
    out, _ = p.communicate(timeout=900)
    assert p.returncode == 0, out[-4000:]
    return None


def steps(run: Path, until: int | None = None) -> dict[int, list[dict]]:
    """Each rank's logged steps (to global step `until`, the checkpoint a resume went on from)."""
    out = {}
    for f in sorted((run / "log").glob("rank*.jsonl")):
        lines = [json.loads(x) for x in f.read_text().splitlines()]
        out[int(f.stem[4:])] = [x for x in lines if "step" in x and (until is None or x["step"] <= until)]
    return out


def lens(run: Path) -> dict[int, dict[int, int]]:
    """len(train_loader) each rank logged at each epoch's start."""
    out = {}
    for f in sorted((run / "log").glob("rank*.jsonl")):
        out[int(f.stem[4:])] = {x["epoch"]: x["len"] for x in map(json.loads, f.read_text().splitlines()) if "len" in x}
    return out


def by_epoch(ranks: dict[int, list[dict]]) -> dict[int, dict[int, list[list[int]]]]:
    """epoch -> rank -> the ids of each of its batches."""
    out: dict = collections.defaultdict(dict)
    for r, ss in ranks.items():
        for s in ss:
            out[s["epoch"]].setdefault(r, []).append(s["ids"])
    return out


def exactly_once(epochs: dict, pad: dict | None = None) -> None:
    for e, ranks in epochs.items():
        seen = collections.Counter(i for batches in ranks.values() for b in batches for i in b)
        repeats = sum(c - 1 for c in seen.values())
        assert repeats <= (pad or {}).get(e, 0), f"epoch {e}: {repeats} samples repeated"
        assert set(seen) == set(range(N)), f"epoch {e}: {N - len(seen)} samples lost"


def samples(ranks: dict[int, list[dict]]) -> dict[int, tuple[int, str]]:
    """Every sample's label and tensor hash, by its id."""
    out = {}
    for ss in ranks.values():
        for s in ss:
            for i, y, h in zip(s["ids"], s["labels"], s["hashes"]):
                assert out.setdefault(i, (y, h)) == (y, h), f"sample {i} differs between epochs"
    return out


def kill_tree(p: subprocess.Popen) -> None:
    """SIGKILL a launch and every process under it (its session: the launcher, the ranks, their workers)."""
    os.killpg(p.pid, signal.SIGKILL)
    p.wait(timeout=60)


def wait_for(cond, what: str, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"waited {timeout}s for {what}"
        time.sleep(0.05)


def test_imagenet_port(daemon, tmp_path):
    """The ImageNet-style script, riffle and DataLoader, uninterrupted on 2 ranks x 2 workers by torchrun: the same
    samples each epoch, each once, as many steps. Killed (SIGKILL: launcher, ranks, workers) after its checkpoint at
    the end of epoch 1 and resumed from it by mp.spawn on 2 ranks x 1 worker: epoch 1 has nothing left (len 0),
    epoch 2 is the uninterrupted run's, rank by rank. Resumed from its checkpoint inside epoch 1 on 1 rank (batches
    of 8, no workers, no DDP): each batch is the uninterrupted run's global batch of that step."""
    data = images(tmp_path / "data")
    whole, twin, killed = tmp_path / "whole", tmp_path / "twin", tmp_path / "killed"
    imagenet(data, whole, "torchrun", 2, 2)
    imagenet(data, twin, "torchrun", 2, 2, "--loader", "torch")
    u, t = steps(whole), steps(twin)
    exactly_once(by_epoch(u))
    exactly_once(by_epoch(t))
    assert samples(u) == samples(t), "riffle's samples (labels, tensors) are not DataLoader's"
    assert {r: [len(b) for b in by_epoch(u)[e][r]] for e in range(3) for r in (0, 1)} == \
        {r: [len(b) for b in by_epoch(t)[e][r]] for e in range(3) for r in (0, 1)}
    assert lens(whole) == lens(twin) == {0: {0: 6, 1: 6, 2: 6}, 1: {0: 6, 1: 6, 2: 6}}

    # Killed after the checkpoint at step 12 (epoch 1's last), while epoch 2 is read.
    (killed / "log").mkdir(parents=True)
    p = imagenet(data, killed, "torchrun", 2, 2, background=True)
    rank0 = killed / "log" / "rank0.jsonl"
    wait_for(lambda: (killed / "checkpoint-12.pth.tar").exists() and rank0.exists()
             and any(json.loads(x).get("step", 0) >= 13 for x in rank0.read_text().splitlines()), "step 13")
    kill_tree(p)
    assert p.returncode != 0

    # On 2 ranks x 1 worker by mp.spawn, from the checkpoint at the end of epoch 1.
    r1 = tmp_path / "r1"
    imagenet(data, r1, "spawn", 2, 1, "--resume", str(killed / "checkpoint-12.pth.tar"))
    assert lens(r1) == {0: {1: 0, 2: 6}, 1: {1: 0, 2: 6}}, "len(loader) after the resume"
    done = steps(killed, until=12)
    merged = {r: done[r] + steps(r1)[r] for r in (0, 1)}
    exactly_once(by_epoch(merged))
    assert by_epoch(merged) == by_epoch(u), "the resumed run's batches are not the uninterrupted run's"

    # On 1 rank, batches of 8 (the same global batch), no workers, from the checkpoint inside epoch 1 (step 8).
    r2 = tmp_path / "r2"
    imagenet(data, r2, "one", 1, 0, "-b", "8", "--resume", str(killed / "checkpoint-8.pth.tar"))
    assert lens(r2) == {0: {1: 4, 2: 6}}
    done = steps(killed, until=8)
    resumed = by_epoch(steps(r2))
    for e in (1, 2):
        first = 2 if e == 1 else 0
        for k, batch in enumerate(resumed[e][0], first):
            want = set(by_epoch(u)[e][0][k]) | set(by_epoch(u)[e][1][k])
            assert set(batch) == want, f"epoch {e} step {k}: not the uninterrupted run's global batch"
    merged = by_epoch({0: done[0] + done[1] + steps(r2)[0]})
    exactly_once(merged)


def hf_data(root: Path) -> Path:
    """A DatasetDict saved to disk as datasets writes one (two shards): image i, of one colour whose red is 5 x i,
    labelled i % 3 by a ClassLabel."""
    import io
    import datasets
    from PIL import Image

    def png(i):
        b = io.BytesIO()
        Image.fromarray(np.full((10 + i % 5, 14, 3), (5 * i, 100 + i, 200 - i), np.uint8)).save(b, format="PNG")
        return {"bytes": b.getvalue(), "path": None}

    feats = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=["ant", "bee", "cow"])})
    train = datasets.Dataset.from_dict({"image": [png(i) for i in range(N)], "label": [i % 3 for i in range(N)]},
                                       features=feats)
    datasets.DatasetDict({"train": train}).save_to_disk(str(root), num_shards={"train": 2})
    return root


def hf(data: Path, run: Path, workers: int, *args: str, background: bool = False) -> subprocess.Popen | None:
    (run / "log").mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, str(PORTS / "hf.py"), str(data), "-j", str(workers), "--log",
           str(run / "log" / "rank0.jsonl"), "--checkpoint-dir", str(run), *args]
    p = subprocess.Popen(cmd, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    if background:
        return p
    out, _ = p.communicate(timeout=900)
    assert p.returncode == 0, out[-4000:]
    return None


def test_hf_port(daemon, tmp_path):
    """The Hugging Face-style script, riffle and DataLoader, with 2 workers: the same samples each epoch (the
    with_transform function's pixel_values, the ClassLabel's labels), each once, as many steps. Killed (SIGKILL)
    after its checkpoint inside epoch 0 and resumed from it with no workers: the uninterrupted run's batches."""
    data = hf_data(tmp_path / "data")
    whole, twin, killed, resumed = (tmp_path / k for k in ("whole", "twin", "killed", "resumed"))
    hf(data, whole, 2)
    hf(data, twin, 2, "--loader", "torch")
    u, t = steps(whole), steps(twin)
    exactly_once(by_epoch(u))
    exactly_once(by_epoch(t))
    assert samples(u) == samples(t), "riffle's samples (labels, pixel values) are not DataLoader's"
    assert all(y == i % 3 for i, (y, _) in samples(u).items())
    assert lens(whole) == lens(twin) == {0: {0: 6, 1: 6}}

    p = hf(data, killed, 2, background=True)
    log = killed / "log" / "rank0.jsonl"
    wait_for(lambda: (killed / "checkpoint-4.pt").exists() and log.exists()
             and any(json.loads(x).get("step", 0) >= 5 for x in log.read_text().splitlines()), "step 5")
    kill_tree(p)
    hf(data, resumed, 0, "--resume", str(killed / "checkpoint-4.pt"))
    assert lens(resumed) == {0: {0: 2, 1: 6}}, "len(loader) after the resume"
    merged = {0: steps(killed, until=4)[0] + steps(resumed)[0]}
    exactly_once(by_epoch(merged))
    assert by_epoch(merged) == by_epoch(u), "the resumed run's batches are not the uninterrupted run's"
