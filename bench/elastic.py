"""Elastic resume under chaos (issue 25): a data-parallel job of W ranks x
K DataLoader workers reads an epoch; at a random moment every rank is
SIGKILLed (a node lost), and sometimes the daemon too; the job comes back
on a random new topology from its last checkpoint, as a user's training
script would. Two jobs sharing one file run beside it in the same daemon.
(A rank that raises DaemonGone once its daemon is killed, before it is
killed itself, is counted, not failed: the loader should have reconnected.)
Over many kills, each epoch must hold every record exactly once, less
nothing and plus only the padding DistributedSampler adds (at most ranks-1
repeats to a deal of the epoch's records over the ranks).

--order picks the job's order. The global order (the default) is a
function of position, so the checkpoint is rank 0's state. A shared order
(share=True: the job samples dependently with the two sharing jobs) and an
opportunistic one (opportunistic=2: windows of 2 batches, each batch taken
as its reads end) deliver records that depend on timing: each rank's state
says what that rank delivered, and the checkpoint is riffle.merge_states of
every rank's, as DDP saves state_dict(all_ranks=True).

A rank logs each batch it delivers and the state after it (rank 0 only,
in the global order); as in DDP, ranks step together, so the checkpoint a
run can resume from is the state at the last step every rank reached, and
what the ranks delivered after that step is delivered again after the
resume (training redoes those steps), so it is not counted. The state
after every step is checked too, whether or not a kill lands on it
(placed()): rank 0's position must move on, within the epoch's positions;
a shared or opportunistic rank's places must say exactly how many records
the rank delivered of each epoch. A state behind that is a resume's
repeats, one past it a resume's losses: both are "backward states".

The padding: a resume on another topology deals the rest of the epoch to
the new ranks in equal parts, padded as DistributedSampler pads, and a
resume on the same topology goes on with the deal it had. The global
order's padding comes at the ends of its ranks' parts, so only the part
that ends the epoch delivers it; a shared order's pads are records of two
ranks' parts, delivered whenever the group takes them, and an
opportunistic window may deliver its pads before a kill, so each deal of
their epoch may add its own (repeats()).

Each generation that resumed mid-epoch delivers the rest of that epoch (to
its end, or to the next kill), which must come in a uniform order: the
rest of a uniform permutation, given the records before it, is a uniform
order of the others, so its order must not follow the records' ids (file
order), nor the order of the epoch's records before the resume, nor
another epoch's rest (uniformity(), tested in test_elastic_checks.py; a
rest is a "remainder" in the counts run() returns). A shared rest is a new
uniform order of the records not delivered; an opportunistic one goes on
with the epoch's permutation from the first position not every rank
delivered: either way independent of the epoch's start. An opportunistic
window splits its records over its batches as their reads end, so its
unit is the window of every rank and worker, and the windows a kill cut
short are left out (global_batches(), rest_sets()).

    PATH=/usr/local/go/bin:$PATH /usr/bin/python3 bench/elastic.py --kills 1000 --records 100000 [--order shared]
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
dl = rt.loader({path!r}, {batch}, num_workers={workers}, seed=7, rank=rank, world_size=world, **{order!r})
if os.path.exists({ckpt!r}):
    dl.load_state_dict(json.load(open({ckpt!r})))
log = open(f"{{out}}/log.{{gen}}.{{rank}}", "a", buffering=1)
step = 0
for epoch in range(2):
    for b in dl:
        step += 1
        time.sleep({step_s})  # the training step
        log.write(json.dumps([step, dl.dataset.epoch, [int(i) for i in b.reshape(-1)]]) + "\\n")
        if {every_rank} or rank == 0:
            tmp = f"{{out}}/state.{{gen}}.{{step}}.{{rank}}.tmp"
            json.dump(dl.state_dict(), open(tmp, "w"))
            os.rename(tmp, f"{{out}}/state.{{gen}}.{{step}}.{{rank}}")
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

# The job's options of each order. A shared or opportunistic order's
# checkpoint is every rank's state, merged; a global one's, rank 0's.
WINDOW = 2  # an opportunistic order's batches per window
ORDERS = {"global": {}, "shared": {"share": True}, "opportunistic": {"opportunistic": WINDOW}}

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
    ap.add_argument("--order", choices=sorted(ORDERS), default="global")
    ap.add_argument("--max-procs", type=int, default=12, help="skip topologies of more rank and worker processes")
    ap.add_argument("--keep", action="store_true",
                    help="keep every generation's states (state.GEN.STEP.RANK) for analysis")
    args = ap.parse_args()
    res = run(args.records, args.kills, args.seed, args.batch, args.max_procs, log=print, keep=args.keep,
              order=args.order)
    print(f"resumed remainders: {res['remainders_checked']} checked, {res['remainders_skipped']} too small to test, "
          f"{res['nonuniform_remainders']} not uniform (|z| > {LIMIT}); worst z: order {res['worst_z_order']}, "
          f"cells {res['worst_z_cells']} (pooled {res['z_cells_pooled']}), prefix {res['worst_z_prefix']} "
          f"(of {res['remainders_checked_prefix']}), other epoch {res['worst_z_other']} "
          f"(of {res['remainders_checked_other']})")
    print(json.dumps(res))


def delivered(state: bytes) -> int:
    """How many records a shared member's state says it delivered (share.Delivered's formats): RFSHR2's position
    less its tail, RFSHR1's position, or, kept by a client whose daemon went (RFBIT1), the records of the state it
    opened from and a bit a record since."""
    magic, rest = state.split(b"\0", 1)
    head, body = rest.split(b"\n", 1)
    f = [int(x) for x in head.split()]
    if magic == b"RFBIT1":
        n = f[2]
        return (delivered(body[:n]) if n else 0) + sum(bin(c).count("1") for c in body[n:])
    return f[1] - (f[3] if magic == b"RFSHR2" else 0)


def run(n: int, kills: int, seed: int, batch: int = 64, max_procs: int = 12, log=lambda *a: None,
        workdir: str | None = None, step_s: float = 0.002, kill_after: float = 3.0, keep: bool = False,
        order: str = "global") -> dict:
    """Kill and resume `kills` times over an ids.npy of n records, in `order` (ORDERS); returns the counts."""
    import numpy as np
    sys.path.insert(0, str(REPO / "python"))
    import riffle
    every_rank = order != "global"  # whose states make the checkpoint
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
    # Each epoch's committed batches: (its deal, generation, rank, step, ids).
    committed: dict[int, list[tuple]] = {}
    seen: dict[int, np.ndarray] = {}  # each epoch's records committed so far
    # A deal is one dealing of an epoch's records over ranks, which a
    # resume on the same topology goes on with (the global order's epoch
    # is one deal, its padding the last part's); its padding is
    # DistributedSampler's.
    deal_of: dict[int, tuple] = {}  # each epoch's deal the checkpoint goes on with
    deals: dict[tuple, tuple[int, int]] = {}  # a deal's records and ranks
    pads: dict[tuple, int] = {}
    dealt: dict[tuple, int] = {}  # of each (deal, rank), the records committed
    deal_steps: dict[tuple, int] = {}  # of each deal, the steps committed
    in_flight: dict[int, int] = {}  # of each epoch, the records of the windows in flight at the checkpoint
    delivered = daemon_kills = daemon_gone = mid = dealt_anew = backward = 0
    kept: list[dict] = []  # each generation: its topology, the state it resumed from, the steps kept
    batches: dict[int, list[list[int]]] = {}  # each epoch's committed global batches, in delivery order
    rests: list[tuple] = []  # each mid-epoch resume: its epoch, the batches before it, the batches of the rest
    started = time.time()
    try:
        for gen in range(kills + 1):
            world, workers = rng.choice([t for t in TOPOLOGIES if t[0] * max(1, t[1] + 1) <= max_procs])
            state = json.loads(ckpt.read_text()) if ckpt.exists() else {"epoch": 0, "position": 0}
            start_epoch, start_pos = int(state["epoch"]), int(state.get("position", 0))
            before = batches.get(start_epoch, [])  # the resumed epoch's global batches so far
            mid += bool(before)
            procs = []
            for r in range(world):
                code = RANK.format(py=str(REPO / "python"), gen=gen, out=str(work), path=str(path), batch=batch,
                                   workers=workers, ckpt=str(ckpt), step_s=step_s, order=ORDERS[order],
                                   every_rank=every_rank)
                procs.append(subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL,
                                              stderr=subprocess.PIPE, env=dict(env, RANK=str(r), WORLD_SIZE=str(world)),
                                              start_new_session=True))
            last = gen == kills
            daemon_killed = False
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
                    daemon_killed = True
                    time.sleep(rng.uniform(0.0, 0.5))
                for p in procs:
                    try:
                        os.killpg(p.pid, signal.SIGKILL)  # the rank and its DataLoader workers
                    except ProcessLookupError:
                        pass
            errs = []
            for p in procs:
                _, err = p.communicate(timeout=600)
                if p.returncode in (0, -signal.SIGKILL):
                    continue
                lines = err.decode().strip().splitlines() or [""]
                if daemon_killed and lines[-1].startswith("riffle.errors.DaemonGone"):
                    # A rank that gave up on its killed daemon before we
                    # killed it: the loader should have reconnected (README),
                    # so it is counted; as a kill it costs the rank nothing.
                    daemon_gone += 1
                    where = [line.strip() for line in lines if "riffle/" in line and line.strip().startswith("File")]
                    log(f"gen {gen}: a rank raised DaemonGone ({where[-1] if where else 'no riffle frame'}): {lines[-1]}")
                    continue
                errs.append(err.decode()[-2000:])
            if errs:
                raise RuntimeError(f"generation {gen} ({world} ranks x {workers} workers): {errs[0]}")
            logs = []
            for r in range(world):
                p = work / f"log.{gen}.{r}"
                text = p.read_text() if p.exists() else ""
                if text and not text.endswith("\n"):
                    # The rank was killed in the middle of writing its last
                    # line: that step was not logged, so it is not counted.
                    text = text[: text.rfind("\n") + 1]
                rows = [json.loads(line) for line in text.splitlines()]
                logs.append([row for row in rows if row != ["done"]])

            def saved(step: int, rank: int) -> dict | None:
                f = work / f"state.{gen}.{step}.{rank}"
                return json.loads(f.read_text()) if f.exists() else None

            # The step every rank reached, with the states the checkpoint
            # is made of there.
            common = min(len(rows) for rows in logs)
            if last:
                assert all(len(rows) == common for rows in logs), "ranks of unequal lengths"
            savers = range(world) if every_rank else [0]
            while common > 0 and not all((work / f"state.{gen}.{common}.{r}").exists() for r in savers):
                common -= 1
            # This generation's deals: the epoch it resumed goes on with the
            # checkpoint's deal when the run went on with its places (on the
            # same topology: none says what a run before delivered), else it
            # is a deal of the records left; the epoch after is a deal of all.
            # The global order's epoch is one deal.
            first = next((st for s in range(1, max(map(len, logs)) + 1) for r in range(world)
                          if (st := saved(s, r)) is not None), None) if every_rank else None
            goes_on = bool(before) and first is not None and not rest_run(first)
            if before and common > 0:
                # A rest of the epoch dealt anew to this run's ranks, not the
                # run before going on (a global order's, from a position off
                # this topology's global batches).
                dealt_anew += not goes_on if every_rank else start_pos % (world * batch) > 0
            here = {e: (e, 0 if not every_rank else gen) for e in (start_epoch, start_epoch + 1)}
            if goes_on:
                here[start_epoch] = deal_of[start_epoch]
            for e, d in here.items():
                if d not in deals:
                    deals[d] = (n - int(seen[e].sum()) if e in seen else n, world)
                    pads[d] = (-deals[d][0]) % world
            if every_rank:
                # Each rank's state after each of its steps says what it
                # delivered: its records of each epoch in this generation,
                # counted on from what it delivered of the deal before.
                for r, rows in enumerate(logs):
                    got = {e: dealt.get((d, r), 0) for e, d in here.items()}
                    for step, epoch, ids in rows:
                        got[epoch] = got.get(epoch, 0) + len(ids)
                        st = saved(step, r)
                        if st is None:
                            continue
                        says = placed(st, order, {e: deals[d] for e, d in here.items()}, batch, WINDOW)
                        wrong = {e: (says.get(e, 0), k) for e, k in got.items() if says.get(e, 0) != k}
                        if wrong:
                            backward += 1
                            log(f"gen {gen}: rank {r}'s state after step {step} says it delivered "
                                + ", ".join(f"{s} records of epoch {e} (it delivered {k}: a resume "
                                            f"{'repeats' if s < k else 'loses'} {abs(k - s)})"
                                            for e, (s, k) in sorted(wrong.items())))
            else:
                # Rank 0's place after each step moves on, within the epoch's
                # positions: a state that goes back resumes from positions
                # delivered already, whether or not a kill lands on it.
                prev = (start_epoch, start_pos)
                for s in range(1, len(logs[0]) + 1):
                    st = saved(s, 0)
                    if st is not None:
                        cur = (int(st["epoch"]), int(st.get("position", 0)))
                        if cur <= prev or cur[1] >= n:
                            backward += 1
                            log(f"gen {gen}: rank 0's state after step {s} is at epoch {cur[0]} position {cur[1]}, "
                                f"the one before at {prev}")
                        prev = max(prev, cur)
            if common > 0:
                deal_of.update(here)
            for r, rows in enumerate(logs):
                for step, epoch, ids in rows[:common]:
                    committed.setdefault(epoch, []).append((here[epoch], gen, r, step, ids))
                    dealt[(here[epoch], r)] = dealt.get((here[epoch], r), 0) + len(ids)
                    seen.setdefault(epoch, np.zeros(n, dtype=bool))[ids] = True
                    delivered += len(ids)
            kept.append({"gen": gen, "world": world, "workers": workers, "from": state, "steps": common})
            # Step s of every rank is the s-th global batch of the epoch (ranks
            # step together, as in DDP); an opportunistic order's are put
            # together in its windows (global_batches()).
            block = WINDOW * max(1, workers) if order == "opportunistic" else 1
            got_batches: dict[int, list[list[int]]] = {}
            began_inside: dict[int, bool] = {}  # of each epoch, whether a run before ended inside a window
            for e in sorted({row[1] for rows in logs for row in rows[:common]}):
                parts = [[ids for _, epoch, ids in rows[:common] if epoch == e] for rows in logs]
                steps = [[i for p in parts if s < len(p) for i in p[s]] for s in range(max(map(len, parts)))]
                got_batches[e] = global_batches(steps, block, deal_steps.get(here[e], 0))
                began_inside[e] = deal_steps.get(here[e], 0) % block > 0
                deal_steps[here[e]] = deal_steps.get(here[e], 0) + len(steps)
            # Of each epoch, the records of the windows in flight where the run
            # ended (every rank's and worker's), unless it ended the epoch.
            cut = {e: world * block * batch if deal_steps[here[e]] % block and not bool(seen[e].all()) else 0
                   for e in got_batches}
            if before:
                # A new deal's first positions hold what the windows in flight
                # at the checkpoint did not deliver: sets up to their records.
                lead = 0 if goes_on else -(-in_flight.get(start_epoch, 0) // (world * block * batch))
                rests.append((start_epoch, *rest_sets(before, got_batches.get(start_epoch, []),
                                                      began_inside.get(start_epoch, False),
                                                      cut.get(start_epoch, 0) > 0, lead)))
            in_flight.update(cut)
            for e, b in got_batches.items():
                if began_inside[e] and batches.get(e):
                    batches[e][-1] = batches[e][-1] + b.pop(0)
                batches.setdefault(e, []).extend(b)
            if not every_rank:
                # The global order's padding is the last part's: the rest
                # from the position it resumed at, split over its ranks.
                for e in {row[1] for rows in logs for row in rows[:common]}:
                    pads[here[e]] = (-(n - (start_pos if e == start_epoch else 0))) % world
            if common > 0:
                if every_rank:
                    st = riffle.merge_states([saved(common, r) for r in range(world)])
                else:
                    st = saved(common, 0)
                tmp = work / "ckpt.json.tmp"
                tmp.write_text(json.dumps(st))
                os.replace(tmp, ckpt)
            for f in work.glob(f"state.{gen}.*"):
                if not keep:
                    f.unlink()
            place = f"position {start_pos}" if not every_rank else "going on with its deal" if goes_on else \
                "a new deal" if before else "its start"
            log(f"gen {gen}: {world} ranks x {workers} workers from epoch {start_epoch} {place}; {common} steps kept; "
                f"{delivered} samples so far")
    finally:
        sharing.kill()
        sharing.wait()
        subprocess.run(["pkill", "-KILL", "-f", f"riffle serve --socket {sock_dir}"], check=False)
    dup, lost = repeats(committed, n, pads, log, kept)
    return {"order": order, "kills": kills, "daemon_kills": daemon_kills, "ranks_daemon_gone": daemon_gone,
            "mid_epoch_resumes": mid, "rests_dealt_anew": dealt_anew, "records": n,
            "delivered": delivered, "complete_epochs": len(committed), "duplicates": dup, "losses": lost,
            "backward_states": backward, **uniformity(rests), "seconds": round(time.time() - started, 1)}


def global_batches(steps: list[list[int]], block: int, done: int) -> list[list[int]]:
    """A run's global batches (each step's records of every rank), put together in sets of `block` steps of their
    deal, of which runs before it took `done`: the first set ends the one they were inside. An opportunistic window's
    batches split its records as their reads end (in id order, in a file of ids), so only the window of every rank
    and worker is a set of the order: WINDOW x workers steps, worker w's window i being its steps
    w + (WINDOW i + j) x workers (DataLoader takes its workers' batches in turn)."""
    cuts = [0] + list(range(-done % block or block, len(steps), block)) + [len(steps)]
    return [[i for b in steps[a:z] for i in b] for a, z in zip(cuts, cuts[1:]) if z > a]


def rest_sets(before: list[list[int]], rest: list[list[int]], began_inside: bool, cut: bool,
              lead: int = 0) -> tuple[list, list]:
    """A resumed rest's global batches as the uniformity checks take them, and the epoch's before it. A window of an
    opportunistic order is one set, its records split as their reads end (global_batches()), so a window cut short
    holds the reads that ended first (in a file of ids, the lower ids) and what it did not deliver the others. A
    window the run before was inside, and this run ended, is the rest's (the set before's last one began); a window
    the kill cut is left out of the rest; and a rest dealt anew starts with the records the windows in flight at its
    checkpoint did not deliver, at their positions: its first `lead` sets, left out."""
    before = list(before)
    if began_inside and before and rest:
        before, rest = before[:-1], [before[-1] + rest[0]] + rest[1:]
    return before, (rest[:-1] if cut else rest)[lead:]


def rest_run(state: dict) -> bool:
    """Whether a rank's state (of a shared or opportunistic order) is of a run of the rest of an epoch: its places
    carry what the runs before it delivered ("delivered"; "ended" past the rest's end), which a run that went on
    with its own deal has not."""
    roles = list((state.get("workers") or {}).values()) or [state]
    return any(role.get("delivered") or role.get("ended") for role in roles)


def placed(state: dict, order: str, deals: dict[int, tuple[int, int]], batch: int, window: int) -> dict[int, int]:
    """How many records of each epoch a rank's state says it delivered, by docs/protocol.md's rules, given each
    epoch's deal in its run (the records dealt, over how many ranks). A role (each DataLoader worker's place, or the
    rank's) past an epoch delivered its whole part of it. Rank r's part is ceil(m/world) records; a shared order's
    worker w of k takes the rank's records q = w (mod k), and its place's sampler_state ("RFSHR2\\0epoch pos size
    tail\\n...") took pos records, of which the tail's undelivered ones are those not in its skip. An opportunistic
    order's worker w of k owns the windows w, w+k, ... of the rank's part: before its place's batch it delivered
    each of its windows whole, and of the window it is inside, its skip."""
    import base64
    roles = state.get("workers") or {"0": state}
    k = len(roles)
    out: dict[int, int] = {}

    def ceil(a: int, b: int) -> int:
        return -(-a // b)

    def window_records(m: int, world: int, t: int) -> int:
        return max(0, min(ceil(m, world), (t + 1) * window * batch) - t * window * batch)

    def whole(m: int, world: int, w: int) -> int:
        if order == "shared":
            return len(range(w, ceil(m, world), k))
        windows = ceil(ceil(ceil(m, world), batch), window)
        return sum(window_records(m, world, t) for t in range(w, windows, k))

    for w, role in roles.items():
        w, epoch = int(w), int(role["epoch"])
        for e, (m, world) in deals.items():
            if e < epoch:
                out[e] = out.get(e, 0) + whole(m, world, w)
        if epoch not in deals:
            continue
        m, world = deals[epoch]
        skip = len(role.get("skip") or [])
        if order == "shared":
            took = delivered(base64.b64decode(role["sampler_state"])) + skip if role.get("sampler_state") else 0
        else:
            b = int(role.get("batch", 0))
            took = sum(window_records(m, world, t) for t in range(w, b // window, k)) + (skip if b % window else 0)
        out[epoch] = out.get(epoch, 0) + took
    return out


def repeats(committed: dict[int, list[tuple]], n: int, pads: dict[tuple, int], log=lambda *a: None,
            gens: list[dict] = ()) -> tuple[int, int]:
    """The duplicates and losses of each epoch's committed batches, (deal, generation, rank, step, ids) each: a
    record must come once, but for the padding of the deal that delivered it (pads: at most that many records twice
    within one deal), and none may be missing. Logs an example of each epoch's duplicates, with the generations
    (gens: run()'s topologies and checkpoints) that delivered it."""
    import numpy as np
    dup = lost = 0
    for e, rows in sorted(committed.items()):
        ids = np.concatenate([np.asarray(row[4], dtype=np.int64) for row in rows])
        distinct = len(np.unique(ids))
        lost += n - distinct
        extra = len(ids) - distinct  # every repeat, then less each deal's padding
        for d in {row[0] for row in rows}:
            mine = np.concatenate([np.asarray(row[4], dtype=np.int64) for row in rows if row[0] == d])
            within = len(mine) - len(np.unique(mine))
            extra -= min(within, pads.get(d, 0))
        dup += extra
        if extra > 0:
            first: dict[int, tuple] = {}
            pairs: dict[tuple, int] = {}
            for d, g, r, s, batch_ids in rows:
                for i in batch_ids:
                    if i in first:
                        pairs[(first[i], (d, g, r, s))] = pairs.get((first[i], (d, g, r, s)), 0) + 1
                    else:
                        first[i] = (d, g, r, s)
            (a, b), k = max(pairs.items(), key=lambda kv: kv[1])
            log(f"epoch {e}: {extra} repeats; e.g. {k} records of gen {a[1]} rank {a[2]} step {a[3]} (deal of gen "
                f"{a[0][1]}) again at gen {b[1]} rank {b[2]} step {b[3]} (deal of gen {b[0][1]}); gens "
                f"{[g for g in gens if g['gen'] in (a[1], b[1])]}")
    return dup, lost


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
