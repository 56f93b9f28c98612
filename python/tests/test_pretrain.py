"""A mixture of token corpora across a kill and a resume on another topology, through riffle.torch with DataLoader
workers (issue 48): tests/ports/pretrain.py, launched by torchrun on 2 ranks x 2 workers, its weights changed at
step 10 by a schedule (or at step 4 by set_weights in its training loop, before the checkpoint), is SIGKILLed
(launcher, ranks, workers) after its checkpoint at step 6 and resumed from it on 3 ranks x 1 worker. Every sample
of the epoch comes once, each global batch (of 24 samples, a multiple of both runs' global batches) is the
uninterrupted run's, and from the change each source is within one sample of its share."""

from __future__ import annotations

import collections
import json
import subprocess
from pathlib import Path

import pytest

import riffle
from test_ports import PORTS, env, kill_tree, torchrun, wait_for
from test_tokens import make_docs, write_megatron

SEQ, SEED, WEIGHTS = 16, 7, [3.0, 1.0]


@pytest.fixture
def sources(tmp_path):
    """Two corpora of distinct tokens, so a sample's row says its source too."""
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    write_megatron(a, [x % 25000 for x in make_docs(50, seed=1)])
    write_megatron(b, [25000 + x % 25000 for x in make_docs(90, seed=2)])
    return a, b


def launch(sources, run: Path, world: int, workers: int, how: str, change: int, *args: str) -> subprocess.Popen:
    cmd = torchrun(world, run) + [str(PORTS / "pretrain.py"), *sources, "-j", str(workers), "--seed", str(SEED),
                                  "--seq-len", str(SEQ), f"--{how}", f"{change}:{WEIGHTS[0]},{WEIGHTS[1]}",
                                  "--checkpoint-dir", str(run), "--log", str(run / "log"), *args]
    run.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(cmd, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def last_step(log: Path) -> int:
    """The last step a rank's log holds whole (a line being written is not yet one)."""
    if not log.exists():
        return 0
    lines = log.read_text().split("\n")[:-1]  # what follows the last newline is a line being written
    return max((json.loads(x)["step"] for x in lines), default=0)


def steps(run: Path, until: int | None = None) -> dict[int, list[list[tuple]]]:
    """step -> each rank's rows (tuples of input_ids) that step."""
    out: dict = collections.defaultdict(list)
    for f in sorted((run / "log").glob("rank*.jsonl")):
        for x in map(json.loads, f.read_text().splitlines()):
            if until is None or x["step"] <= until:
                out[x["step"]] += [tuple(r) for r in x["rows"]]
    return out


@pytest.mark.parametrize("how,change", [("schedule", 10), ("set-weights", 4)])
def test_mixture_shares_across_a_kill_and_a_resume_on_another_topology(daemon, sources, tmp_path, how, change):
    # The uninterrupted run, as one loader of the whole global batch: position by position.
    ref = riffle.Loader(mixture=[(sources[0], 1), (sources[1], 1)], batch_size=8, seq_len=SEQ, seed=SEED,
                        mixture_schedule=[(change, WEIGHTS)], ordered=True)
    order = []  # (row, source) by position
    for b in ref:
        order += [(tuple(r), int(i >= ref.offsets[1])) for r, i in zip(b.data["input_ids"].tolist(), b.ids.tolist())]
    rows = [r for r, _ in order]
    assert len(set(rows)) == len(rows)
    n0, since = 0, change * 8
    for p, (_, src) in enumerate(order[since:], 1):
        n0 += src == 0
        assert abs(n0 - WEIGHTS[0] / sum(WEIGHTS) * p) <= 1, f"{p} samples after the change"

    killed = tmp_path / "killed"
    p = launch(sources, killed, 2, 2, how, change, "--hold-after", "8")
    logs = [killed / "log" / f"rank{r}.jsonl" for r in range(2)]
    try:
        # Every rank past the checkpoint: the ranks take their steps unsynchronized (the tiny model has no
        # all-reduce), so rank 0 at step 8 does not say rank 1 has logged step 6.
        wait_for(lambda: p.poll() is not None or (killed / "checkpoint-6.pt").exists()
                 and all(last_step(log) >= 8 for log in logs), "step 8 on every rank", timeout=300)
        assert p.poll() is None, p.communicate()[0][-4000:]
    finally:
        kill_tree(p)
    resumed = tmp_path / "resumed"
    q = launch(sources, resumed, 3, 1, how, change, "--resume", str(killed / "checkpoint-6.pt"))
    out, _ = q.communicate(timeout=600)
    assert q.returncode == 0, out[-4000:]

    head, rest = steps(killed, until=6), steps(resumed)
    for s in range(1, 7):
        assert set(head[s]) == set(rows[(s - 1) * 8: s * 8]), f"step {s} is not the uninterrupted run's"
    got = [r for s in sorted(head) for r in head[s]] + [r for s in sorted(rest) for r in rest[s]]
    counts = collections.Counter(got)
    assert set(counts) == set(rows), f"{len(set(rows) - set(counts))} samples lost, or others read"
    assert sum(c - 1 for c in counts.values()) <= 2, "more repeats than DistributedSampler's padding"
    # Each pair of the resumed run's global batches (24 samples, 3 of the first run's) is the uninterrupted run's.
    first = min(rest)
    assert first == 7
    for k in range(first, max(rest) + 1, 2):
        lo = 48 + (k - first) * 12
        want = set(rows[lo: lo + 24])
        have = set(rest[k]) | set(rest.get(k + 1, []))
        assert want <= have and len(have - want) <= 2, f"steps {k}-{k + 1} are not the uninterrupted run's"
