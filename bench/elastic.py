"""Elastic resume under chaos (issue 25): a data-parallel job of W ranks x
K DataLoader workers reads an epoch; at a random moment every rank is
SIGKILLed (a node lost), and sometimes the daemon too; the job comes back
on a random new topology from rank 0's last checkpoint, as a user's
training script would. Two jobs sharing one file run beside it in the same
daemon. Over many kills, each epoch must hold every record exactly once,
less nothing and plus only the padding DistributedSampler adds to the
last resumed part (at most ranks-1 repeats).

A rank logs each batch it delivers and, on rank 0, the state after it;
as in DDP, ranks step together, so the checkpoint a run can resume from
is rank 0's state at the last step every rank reached, and what the ranks
delivered after that step is delivered again after the resume (training
redoes those steps), so it is not counted. Rank 0's state after every
step is checked too: it must move on, within the epoch's positions (a
state that goes back is a resume's repeats, whether or not a kill lands
on it).

    PATH=/usr/local/go/bin:$PATH /usr/bin/python3 bench/elastic.py --kills 1000 --records 100000
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

RANK = """
import json, os, sys, time
sys.path.insert(0, {py!r})
import riffle.torch as rt
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
gen, out = {gen}, {out!r}
dl = rt.loader({path!r}, {batch}, num_workers={workers}, seed=7, rank=rank, world_size=world)
if os.path.exists({ckpt!r}):
    dl.load_state_dict(json.load(open({ckpt!r})))
log = open(f"{{out}}/log.{{gen}}.{{rank}}", "a", buffering=1)
step = 0
for epoch in range(2):
    for b in dl:
        step += 1
        time.sleep({step_s})  # the training step
        log.write(json.dumps([step, dl.dataset.epoch, [int(i) for i in b.reshape(-1)]]) + "\\n")
        if rank == 0:
            tmp = f"{{out}}/state.{{gen}}.{{step}}.tmp"
            json.dump(dl.state_dict(), open(tmp, "w"))
            os.rename(tmp, f"{{out}}/state.{{gen}}.{{step}}")
log.write(json.dumps(["done"]) + "\\n")
"""

SHARING = """
import sys
sys.path.insert(0, {py!r})
import riffle
lds = [riffle.Loader({path!r}, 64, seed=s, share=True) for s in (1, 2)]
while True:
    for a, b in zip(lds[0], lds[1]):
        pass
"""

TOPOLOGIES = [(w, k) for w in (1, 2, 3, 4, 8) for k in (0, 1, 2, 4)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kills", type=int, default=1000)
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--max-procs", type=int, default=12, help="skip topologies of more rank and worker processes")
    ap.add_argument("--keep", action="store_true", help="keep every generation's states (state.GEN.STEP) for analysis")
    args = ap.parse_args()
    res = run(args.records, args.kills, args.seed, args.batch, args.max_procs, log=print, keep=args.keep)
    print(json.dumps(res))


def run(n: int, kills: int, seed: int, batch: int = 64, max_procs: int = 12, log=lambda *a: None,
        workdir: str | None = None, step_s: float = 0.002, kill_after: float = 3.0, keep: bool = False) -> dict:
    """Kill and resume `kills` times over an ids.npy of n records; returns the counts."""
    import numpy as np
    rng = random.Random(seed)
    work = Path(workdir or tempfile.mkdtemp(prefix="riffle-elastic-"))
    log(f"work directory {work}")
    path = work / "ids.npy"
    np.save(path, np.arange(n, dtype=np.int64))
    sock_dir = work / "sock"
    sock_dir.mkdir(mode=0o700, exist_ok=True)
    env = dict(os.environ, RIFFLE_SOCKET=str(sock_dir / "riffle.sock"), RIFFLE_BIN=str(REPO / "bin" / "riffle"))
    sharing = subprocess.Popen([sys.executable, "-c", SHARING.format(py=str(REPO / "python"), path=str(path))],
                               env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ckpt = work / "ckpt.json"
    # Committed batches per epoch: (the resume it came from, its ids).
    epochs: dict[int, list[int]] = {}
    pads: dict[int, int] = {}  # each epoch's padding: its last part's, DistributedSampler's
    delivered = daemon_kills = mid = backward = 0
    where: dict[int, list] = {}  # (generation, rank, step) of each delivered record, by epoch
    kept: list[dict] = []  # each generation: its topology, the state it resumed from, the steps kept
    started = time.time()
    try:
        for gen in range(kills + 1):
            world, workers = rng.choice([t for t in TOPOLOGIES if t[0] * max(1, t[1] + 1) <= max_procs])
            state = json.loads(ckpt.read_text()) if ckpt.exists() else {"epoch": 0, "position": 0}
            start_epoch, start_pos = int(state["epoch"]), int(state.get("position", 0))
            mid += start_pos > 0
            procs = []
            for r in range(world):
                code = RANK.format(py=str(REPO / "python"), gen=gen, out=str(work), path=str(path), batch=batch,
                                   workers=workers, ckpt=str(ckpt), step_s=step_s)
                procs.append(subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL,
                                              stderr=subprocess.PIPE, env=dict(env, RANK=str(r), WORLD_SIZE=str(world)),
                                              start_new_session=True))
            last = gen == kills
            if not last:
                # Kill once every rank delivered a batch or more, after a random while.
                deadline = time.time() + 120
                while time.time() < deadline and not all((work / f"log.{gen}.{r}").exists() for r in range(world)):
                    if any(p.poll() not in (None, 0) for p in procs):
                        break
                    time.sleep(0.05)
                time.sleep(rng.uniform(0.0, kill_after))
                if rng.random() < 0.2:
                    subprocess.run(["pkill", "-KILL", "-f", f"riffle serve --socket {sock_dir}"], check=False)
                    daemon_kills += 1
                    time.sleep(rng.uniform(0.0, 0.5))
                for p in procs:
                    try:
                        os.killpg(p.pid, signal.SIGKILL)  # the rank and its DataLoader workers
                    except ProcessLookupError:
                        pass
            errs = []
            for p in procs:
                _, err = p.communicate(timeout=600)
                if p.returncode not in (0, -signal.SIGKILL):
                    errs.append(err.decode()[-2000:])
            if errs:
                raise RuntimeError(f"generation {gen} ({world} ranks x {workers} workers): {errs[0]}")
            # The step every rank reached, and rank 0's state there.
            logs = []
            for r in range(world):
                p = work / f"log.{gen}.{r}"
                rows = [json.loads(line) for line in p.read_text().splitlines()] if p.exists() else []
                logs.append([row for row in rows if row != ["done"]])
            common = min(len(rows) for rows in logs)
            if last:
                assert all(len(rows) == common for rows in logs), "ranks of unequal lengths"
            while common > 0 and not (work / f"state.{gen}.{common}").exists():
                common -= 1
            for r, rows in enumerate(logs):
                for step, epoch, ids in rows[:common]:
                    epochs.setdefault(epoch, []).extend(ids)
                    where.setdefault(epoch, []).extend((gen, r, step) for _ in ids)
                    delivered += len(ids)
            kept.append({"gen": gen, "world": world, "workers": workers, "from": state, "steps": common})
            if common > 0:
                st = json.loads((work / f"state.{gen}.{common}").read_text())
                tmp = work / "ckpt.json.tmp"
                tmp.write_text(json.dumps(st))
                os.replace(tmp, ckpt)
            # The padding of an epoch is its last part's: the rest from the
            # position it resumed at, split over this generation's ranks.
            for e in {row[1] for rows in logs for row in rows[:common]}:
                pos = start_pos if e == start_epoch else 0
                pads[e] = (-(n - pos)) % world
            # Rank 0's place after each step moves on, within the epoch's
            # positions: a state that goes back resumes from positions
            # delivered already, whether or not a kill lands on it.
            prev = (start_epoch, start_pos)
            for s in range(1, len(logs[0]) + 1):
                f = work / f"state.{gen}.{s}"
                if f.exists():
                    st = json.loads(f.read_text())
                    cur = (int(st["epoch"]), int(st.get("position", 0)))
                    if cur <= prev or cur[1] >= n:
                        backward += 1
                        log(f"gen {gen}: rank 0's state after step {s} is at epoch {cur[0]} position {cur[1]}, "
                            f"the one before at {prev}")
                    prev = max(prev, cur)
            for f in work.glob(f"state.{gen}.*"):
                if not keep:
                    f.unlink()
            log(f"gen {gen}: {world} ranks x {workers} workers from epoch {start_epoch} position {start_pos}; "
                f"{common} steps kept; {delivered} samples so far")
    finally:
        sharing.kill()
        sharing.wait()
        subprocess.run(["pkill", "-KILL", "-f", f"riffle serve --socket {sock_dir}"], check=False)
    dup = lost = 0
    complete = sorted(epochs)  # the last generation ran its epochs to their ends
    for e in complete:
        counts: dict[int, int] = {}
        for i in epochs[e]:
            counts[i] = counts.get(i, 0) + 1
        lost += n - len(counts)
        extra = sum(c - 1 for c in counts.values()) - pads.get(e, 0)
        dup += max(0, extra)
        if extra > 0:
            first: dict[int, tuple] = {}
            pairs: dict[tuple, int] = {}
            for i, w in zip(epochs[e], where[e]):
                if i in first:
                    pairs[(first[i], w)] = pairs.get((first[i], w), 0) + 1
                else:
                    first[i] = w
            (a, b), k = max(pairs.items(), key=lambda kv: kv[1])
            log(f"epoch {e}: {extra} repeats; e.g. {k} records of gen {a[0]} rank {a[1]} step {a[2]} again at gen "
                f"{b[0]} rank {b[1]} step {b[2]}; gens {[g for g in kept if g['gen'] in (a[0], b[0])]}")
    return {"kills": kills, "daemon_kills": daemon_kills, "mid_epoch_resumes": mid, "records": n, "delivered": delivered,
            "complete_epochs": len(complete), "duplicates": dup, "losses": lost, "backward_states": backward,
            "seconds": round(time.time() - started, 1)}


if __name__ == "__main__":
    main()
