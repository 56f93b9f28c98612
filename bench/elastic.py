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

Each generation that resumed mid-epoch delivers the rest of that epoch (to
its end, or to the next kill), which must come in a uniform order: the
rest of a uniform permutation, given the records before it, is a uniform
order of the others, so its order must not follow the records' ids (file
order), nor the order of the epoch's records before the resume, nor
another epoch's rest (uniformity(), tested in test_elastic_checks.py; a
rest is a "remainder" in the counts run() returns).

    PATH=/usr/local/go/bin:$PATH /usr/bin/python3 bench/elastic.py --kills 1000 --records 100000
"""

from __future__ import annotations

import argparse
import json
import math
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

# A rest of fewer records, or of one global batch, is counted as skipped:
# it would show only gross faults (200 records in id order are z = 14).
MIN_REST = 200
# A z past this fails a rest: one statistic's chance is at most 4e-8, so
# four statistics over 1,000 rests fail a correct run about once in 6,000
# runs (Bonferroni).
LIMIT = 5.5


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
    print(f"resumed remainders: {res['remainders_checked']} checked, {res['remainders_skipped']} too small to test, "
          f"{res['nonuniform_remainders']} not uniform (|z| > {LIMIT}); worst z: order {res['worst_z_order']}, "
          f"cells {res['worst_z_cells']} (pooled {res['z_cells_pooled']}), prefix {res['worst_z_prefix']} "
          f"(of {res['remainders_checked_prefix']}), other epoch {res['worst_z_other']} "
          f"(of {res['remainders_checked_other']})")
    print(json.dumps(res))


def run(n: int, kills: int, seed: int, batch: int = 64, max_procs: int = 12, log=lambda *a: None,
        workdir: str | None = None, step_s: float = 0.002, kill_after: float = 3.0, keep: bool = False) -> dict:
    """Kill and resume `kills` times over an ids.npy of n records; returns the counts."""
    import numpy as np
    rng = random.Random(seed)
    work = Path(workdir or tempfile.mkdtemp(prefix="riffle-elastic-"))
    work.mkdir(parents=True, exist_ok=True)
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
    batches: dict[int, list[list[int]]] = {}  # each epoch's committed global batches, in delivery order
    rests: list[tuple] = []  # each mid-epoch resume: its epoch, the batches before it, the batches of the rest
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
                # Kill once every rank delivered a batch or more (its log, opened
                # before its first batch, holds a line), after a random while.
                deadline = time.time() + 120
                while time.time() < deadline and not all((work / f"log.{gen}.{r}").exists()
                                                         and (work / f"log.{gen}.{r}").stat().st_size > 0
                                                         for r in range(world)):
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
            # Step s of every rank is the s-th global batch of the epoch (ranks
            # step together, as in DDP).
            got: dict[int, list[list[int]]] = {}
            for e in sorted({row[1] for rows in logs for row in rows[:common]}):
                parts = [[ids for _, epoch, ids in rows[:common] if epoch == e] for rows in logs]
                got[e] = [[i for p in parts if s < len(p) for i in p[s]] for s in range(max(map(len, parts)))]
            if start_pos > 0:
                rests.append((start_epoch, list(batches.get(start_epoch, [])), got.get(start_epoch, [])))
            for e, b in got.items():
                batches.setdefault(e, []).extend(b)
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
            **uniformity(rests), "seconds": round(time.time() - started, 1)}


def uniformity(rests: list[tuple[int, list[list[int]], list[list[int]]]]) -> dict:
    """Tests that each resumed rest of an epoch comes in a uniform order. A rest is (its epoch, the global batches
    of the epoch delivered before the resume, the global batches delivered after it), in delivery order; a global
    batch is a set, as the order inside it is arbitrary. The rest of a uniform permutation, given the records
    before it, is a uniform order of the others, so each statistic is about standard normal under a correct
    resume, and a rest fails when one is past LIMIT:

    order: the correlation of a record's id with its batch's step (Spearman's, in ids): id or file order, reverse,
      a rest sorted in parts;
    cells: a chi-square of tenths of the ids against tenths of the rest's time (a Wilson-Hilferty z, one-sided;
      pooled over all rests too, as sampler_test.go's TestPositionUniform does): any other dependence of
      order on id;
    prefix: how much a record's tenth of ids depends on the tenths the epoch delivered at the same positions from
      its start (as shares over the positions of its batch and of theirs; dependence_z, one-sided): a rest drawn
      as a new keyed permutation of the records left, keyed as the epoch, repeats the order's start;
    other: the correlation of the steps at which this rest and the last rest of another epoch delivered their
      common records: a rest whose order ignores its epoch."""
    import numpy as np
    checked = skipped = nonuniform = 0
    tested = {"prefix": 0, "other": 0}
    worst: dict[str, tuple[float, float]] = {}  # of each statistic, the z farthest in the direction that fails
    chi = df = 0.0
    latest: dict[int, tuple] = {}  # the last rest of each of the last two epochs: ids, steps
    for epoch, before, rest in rests:
        ids, steps, seen = [], [], set()
        for s, batch in enumerate(rest):
            for i in batch:
                if i not in seen:  # DistributedSampler's padding repeats the rest's first records
                    seen.add(i)
                    ids.append(i)
                    steps.append(s)
        if len(ids) < MIN_REST or steps[-1] == 0:
            skipped += 1
            continue
        checked += 1
        ids, steps = np.array(ids), np.array(steps)
        z = {"order": correlation_z(ranks(ids), steps)}
        x2, k = cells(ranks(ids), steps)
        chi, df = chi + x2, df + k
        z["cells"] = wilson_hilferty(x2, k)
        # Where the rest's batches lie within the epoch's start: the share
        # of each tenth of its ids there, batch by batch.
        head = [i for b in before for i in b]
        sizes = np.bincount(steps)
        ends = np.cumsum(sizes)
        inside = int(np.searchsorted(ends, len(head), side="right"))
        if inside and sizes[inside - 1] < 50:
            inside -= 1  # the rest's last batch, cut short: its tenths would expect under 5 records
        if inside >= 2 and ends[inside - 1] >= MIN_REST:
            tenth = (ranks(np.array(head)) * 10 // len(head)).astype(int)
            share = np.zeros((len(before), 10))
            np.add.at(share, (np.repeat(np.arange(len(before)), [len(b) for b in before]), tenth), 1)
            share /= share.sum(axis=1, keepdims=True)
            total = np.concatenate([np.zeros((1, 10)), np.cumsum(np.repeat(share, [len(b) for b in before], axis=0),
                                                                 axis=0)])
            n = ends[inside - 1]
            there = (total[ends[:inside]] - total[ends[:inside] - sizes[:inside]]) / sizes[:inside, None]
            z["prefix"] = dependence_z((ranks(ids[:n]) * 10 // n).astype(int), there[steps[:n]])
            tested["prefix"] += 1
        other = next((v for e, v in reversed(latest.items()) if e != epoch), None)
        if other is not None:
            _, mine, theirs = np.intersect1d(ids, other[0], assume_unique=True, return_indices=True)
            if len(mine) >= MIN_REST:
                z["other"] = correlation_z(steps[mine], other[1][theirs])
                tested["other"] += 1
        latest.pop(epoch, None)
        latest[epoch] = (ids, steps)
        while len(latest) > 2:
            latest.pop(next(iter(latest)))
        # A chi-square's z is one-sided: below 0 is a closer fit, not a fault.
        fault = {name: v if name in ("cells", "prefix") else abs(v) for name, v in z.items()}
        for name, v in z.items():
            if name not in worst or fault[name] > worst[name][0]:
                worst[name] = (fault[name], v)
        nonuniform += max(fault.values()) > LIMIT
    return {"remainders_checked": checked, "remainders_skipped": skipped, "nonuniform_remainders": nonuniform,
            "remainders_checked_prefix": tested["prefix"], "remainders_checked_other": tested["other"],
            **{f"worst_z_{name}": round(worst[name][1], 2) if name in worst else None
               for name in ("order", "cells", "prefix", "other")},
            "z_cells_pooled": round(wilson_hilferty(chi, df), 2) if df else 0.0}


def ranks(ids):
    """Each id's rank among ids (distinct)."""
    import numpy as np
    r = np.empty(len(ids))
    r[np.argsort(ids, kind="stable")] = np.arange(len(ids))
    return r


def correlation_z(x, y) -> float:
    """Pearson's correlation of x and y as a z-score against a uniform pairing: over the m! orders of y its mean is
    0 and its variance exactly 1/(m-1), ties included, and it is about normal for large m. 0 when x or y is one
    value: no evidence."""
    x, y = x - x.mean(), y - y.mean()
    d = math.sqrt(float(x @ x) * float(y @ y))
    return 0.0 if d == 0 else float(x @ y) / d * math.sqrt(len(x) - 1)


def dependence_z(tenth, there) -> float:
    """How much a record's tenth of ids depends on the shares of tenths there (one row per record), as a z-score
    against a uniform order: (m-1) times the sum of the squared canonical correlations of the two (Pillai's trace)
    has mean exactly p*q over the orders of the records, for p and q the ranks of the two sides (the multivariate
    form of correlation_z's variance, as a linear permutation statistic: Hoeffding's combinatorial central limit
    theorem, 1951), and is about chi-square of p*q degrees of freedom. Any map between the two sides' tenths
    counts, a batch giving up to 81 contrasts where a correlation of ranks gives one."""
    import numpy as np

    def span(a):
        # An orthonormal basis of the centred columns; rounding's directions
        # (1e-15 of the largest) would each count as a full one.
        u, s, _ = np.linalg.svd(a - a.mean(axis=0), full_matrices=False)
        return u[:, s > s[0] * 1e-9] if s[0] > 0 else u[:, :0]

    x, y = span(np.eye(10)[tenth]), span(there)
    pillai = float(((x.T @ y) ** 2).sum())
    return wilson_hilferty((len(tenth) - 1) * pillai, x.shape[1] * y.shape[1])


def cells(rank, steps) -> tuple[float, int]:
    """The chi-square of independence of (tenth of rank) x (tenth of time) and its degrees of freedom. A tenth of
    time is whole batches, gathered in step order until it holds a tenth of the records (a last one under half
    that joins the one before); fewer tenths when a cell would expect under 10 records, as the chi-square's
    normal limit wants."""
    import numpy as np
    m = len(rank)
    bins = max(2, min(10, int(math.sqrt(m / 10))))
    col, c, held = [], 0, 0
    for k in np.bincount(steps):
        if held >= m / bins:
            c, held = c + 1, 0
        col.append(c)
        held += k
    col = np.array(col)
    if c > 0 and held < m / bins / 2:
        col[col == c] = c - 1
    table = np.zeros((bins, col.max() + 1))
    np.add.at(table, ((rank * bins // m).astype(int), col[steps]), 1)
    table = table[:, table.sum(axis=0) > 0]
    if table.shape[1] < 2:
        return 0.0, 0
    want = np.outer(table.sum(axis=1), table.sum(axis=0)) / m
    # Over the orders with these margins the statistic's mean is df m/(m-1)
    # (Haldane): scaled, rests of any size pool without a bias.
    x2 = float(((table - want) ** 2 / want).sum()) * (m - 1) / m
    return x2, (bins - 1) * (table.shape[1] - 1)


def wilson_hilferty(x2: float, df: float) -> float:
    """A chi-square of df degrees of freedom as a z-score: (x2/df)^(1/3) is about normal with mean 1-2/(9df) and
    standard deviation sqrt(2/(9df)) (Wilson and Hilferty, 1931). 0 with no degrees of freedom."""
    if df == 0:
        return 0.0
    return (math.pow(x2 / df, 1 / 3) - (1 - 2 / (9 * df))) / math.sqrt(2 / (9 * df))


if __name__ == "__main__":
    main()
