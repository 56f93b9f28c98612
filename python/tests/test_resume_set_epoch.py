"""A resume as DDP scripts write it: ``load_state_dict(checkpoint)``, then at
each epoch's start ``sampler.set_epoch(epoch)`` from the checkpoint's epoch
on. set_epoch of the epoch the state is in keeps the loaded place (it
replayed the whole epoch: issue 45), and of the epoch a state taken after
its last batch ended delivers nothing; len(loader) is what the rank delivers
of the epoch it is in. Every order that resumes, on 1 rank and on 2 (each
rank a real process, launched as torchrun launches it, with RANK,
WORLD_SIZE and MASTER_ADDR/PORT, in a gloo process group), each with 0, 1
and 2 DataLoader workers (PLAN: every order with two worker counts, the
global order with all three), checked by record identity against the
uninterrupted run. (mp.spawn's ranks spawn their DataLoader workers, each
importing torch again: the port tests launch by it, beside torchrun.)

Run as a script, this file is one rank's runs: ``RANK=r WORLD_SIZE=w
python test_resume_set_epoch.py DATA OUT``."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

N = 480  # records of each file: whole batches on 1 and 2 ranks
BATCH = 16
STOP = 5  # batches of epoch 0 each rank delivers before its checkpoint (or all of them: the boundary)

# Every order state_dict resumes: name -> (source, options). "shared" and "opportunistic" are orders whose
# records depend on timing (their batches are checked as sets: each record once); the others are functions of
# (seed, epoch, position), whose resumed batches are the uninterrupted run's.
ORDERS = {
    "global": ("a", {}),
    "sequential": ("a", {"shuffle": False}),
    "block": ("a", {"sampler": "block", "block_size": 4096, "window": 4}),
    "buffered": ("a", {"sampler": "buffered", "block_size": 4096, "buffer": 128}),
    "reservoir": ("a", {"sampler": "reservoir", "reservoir": 64}),
    "shared": ("a", {"share": True}),
    "opportunistic": ("a", {"sampler": "global", "opportunistic": 2}),
    "mixture": ("mix", {}),
    "subset": ("a", {"ids": list(range(0, N, 3))}),
}
TIMED = ("shared", "opportunistic")
# The DataLoader workers each order runs with, on 1 rank and on 2: every order with two counts, every count with
# each rank count.
PLAN = {
    1: [("global", 0), ("global", 1), ("global", 2), ("sequential", 1), ("block", 2), ("buffered", 0),
        ("reservoir", 1), ("shared", 0), ("shared", 2), ("opportunistic", 1), ("opportunistic", 2), ("mixture", 1),
        ("subset", 2)],
    2: [("global", 0), ("global", 1), ("global", 2), ("sequential", 2), ("block", 0), ("buffered", 1),
        ("reservoir", 2), ("shared", 1), ("shared", 2), ("opportunistic", 0), ("opportunistic", 2), ("mixture", 2),
        ("subset", 0)],
}


def ids_of(batch) -> list[int]:
    return [int(i) for i in batch.ids]


def run(rank: int, world: int, data: str, out: str) -> None:
    import torch.distributed as dist
    import riffle.torch as rt
    if world > 1:
        dist.init_process_group("gloo")  # from the environment, as torchrun sets it
    files = json.loads(Path(data).read_text())
    got = {}
    for name, workers in PLAN[world]:
        src, opts = ORDERS[name]
        source = {"mixture": [(files["a"], 1), (files["b"], 1)]} if src == "mix" else {"paths": files["a"]}
        kw = dict(opts, seed=3, num_workers=workers, decode=ids_of, record_size=64, **source)
        gather = world > 1 and name in TIMED

        def loader():
            return rt.loader(batch_size=BATCH, **kw)

        # The uninterrupted run, as a DDP script reads it: set_epoch at each epoch's start.
        dl = loader()
        whole = []
        for epoch in range(2):
            dl.sampler.set_epoch(epoch)
            whole.append(list(dl))
        runs = {}
        for stop in (STOP, len(whole[0])):
            dl = loader()
            dl.sampler.set_epoch(0)
            it = iter(dl)
            head = [next(it) for _ in range(stop)]
            state = dl.state_dict(all_ranks=gather)
            del it, dl
            # Killed and resumed: a new loader, the checkpoint loaded, then the script's epoch loop from the
            # checkpoint's epoch (0), set_epoch at each epoch's start.
            dl = loader()
            dl.load_state_dict(state)
            epochs, lens = [], []
            for epoch in range(2):
                dl.sampler.set_epoch(epoch)
                lens.append(len(dl))
                epochs.append(list(dl))
            runs[stop] = {"head": head, "epochs": epochs, "lens": lens, "state_epoch": state["epoch"]}
        got[f"{name}/{workers}"] = {"whole": whole, "runs": runs}
    Path(f"{out}.{rank}").write_text(json.dumps(got))
    if world > 1:
        dist.destroy_process_group()


def write_data(tmp: Path) -> Path:
    from conftest import write_fixed
    files = {"a": str(write_fixed(tmp / "a.bin", N, 64)), "b": str(write_fixed(tmp / "b.bin", N // 2, 64))}
    p = tmp / "data.json"
    p.write_text(json.dumps(files))
    return p


@pytest.mark.parametrize("world", [1, 2])
def test_set_epoch_after_load_state_dict_resumes_every_order(daemon, tmp_path, world):
    from conftest import free_port
    data = write_data(tmp_path)
    out = str(tmp_path / "out")
    env = dict(os.environ, PYTHONPATH=str(HERE.parent), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(free_port()))
    procs = [subprocess.Popen([sys.executable, __file__, str(data), out], stderr=subprocess.PIPE, text=True,
                              env=dict(env, RANK=str(r), LOCAL_RANK=str(r))) for r in range(world)]
    for p in procs:
        _, err = p.communicate(timeout=1800)
        assert p.returncode == 0, err[-4000:]
    ranks = [json.loads(Path(f"{out}.{k}").read_text()) for k in range(world)]
    failed = []
    for name, workers in PLAN[world]:
        for stop in ("mid", "end"):
            try:
                check(name, stop, [g[f"{name}/{workers}"] for g in ranks])
            except AssertionError as e:
                failed.append(f"{name} with {workers} workers, stopped at the {stop}: {e}")
    assert not failed, "\n".join(failed)


def check(name: str, stop: str, ranks: list[dict]) -> None:
    """One order's runs on every rank, stopped mid-epoch or after the epoch's last batch, resumed."""
    world = len(ranks)
    picked = []
    for k, g in enumerate(ranks):
        whole = g["whole"]
        run_ = g["runs"][str(len(whole[0]) if stop == "end" else STOP)]
        picked.append(run_)
        head, (rest, after) = run_["head"], run_["epochs"]
        where = f"rank {k}"
        # len() is what the rank delivers of the epoch it is in: the rest, then a whole epoch.
        assert run_["lens"] == [len(rest), len(after)], f"{where}: len {run_['lens']}"
        assert len(after) == len(whole[1]), f"{where}: epoch 1 has {len(after)} batches, not {len(whole[1])}"
        if stop == "end":
            # After the epoch's last batch the state is the next epoch's start: set_epoch(0) has nothing left.
            assert run_["state_epoch"] == 1 and rest == [], f"{where}: {len(rest)} batches of epoch 0 again"
        if name not in TIMED:
            assert head + rest == whole[0], f"{where}: the resumed epoch is not the uninterrupted run's"
            assert after == whole[1], f"{where}: the next epoch is not the uninterrupted run's"
    # Every rank together: each record of the epoch once (a mixture's epoch is padded over ranks as
    # DistributedSampler pads), none lost.
    for epoch in (0, 1):
        seen = collections.Counter()
        for run_ in picked:
            seen.update(i for b in (run_["head"] if epoch == 0 else []) + run_["epochs"][epoch] for i in b)
        repeats = sum(c - 1 for c in seen.values())
        assert repeats <= (world - 1 if name == "mixture" else 0), f"epoch {epoch}: {repeats} records repeated"
        if name == "mixture":
            # An epoch of a mixture ends when its first source runs out: all of it, as many of the other's.
            assert set(range(N, N + N // 2)) <= set(seen), f"epoch {epoch}: records of the second source lost"
        else:
            want = set(ORDERS[name][1].get("ids") or range(N))
            assert set(seen) == want, f"epoch {epoch}: {len(want - set(seen))} records lost"


if __name__ == "__main__":
    run(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), sys.argv[1], sys.argv[2])
