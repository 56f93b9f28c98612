"""bench/elastic.py's checks fail when they should. Uniformity: a resumed
rest in a uniform order passes, and one in id order, in reverse, sorted
within each half, correlated with the epoch's start or in another epoch's
rest's order fails, by the statistic made for it; an opportunistic order's
windows, split as their reads end, pass as sets. Counts: a deal's padding
is no duplicate, a repeat across deals is; a shared or opportunistic
rank's state says how many records it delivered by the protocol's rules.
No daemon: the rests and states are lists and dicts.

    .venv/bin/python -m pytest -q -p no:cacheprovider bench/test_elastic_checks.py
"""

from __future__ import annotations

import base64
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import elastic  # noqa: E402

N = 20000


def batches(ids, size: int) -> list[list[int]]:
    """ids as global batches of size, each in an arbitrary order."""
    rng = np.random.default_rng(len(ids))
    return [[int(i) for i in rng.permutation(ids[k:k + size])] for k in range(0, len(ids), size)]


def rest_of(order, start: int, stop: int, size: int = 256) -> tuple[list[list[int]], list[list[int]]]:
    """An epoch's order resumed at start: its batches before, and the rest's to stop."""
    return batches(order[:start], size), batches(order[start:stop], size)


def uniform_rests(count: int, seed: int) -> list[tuple[int, list[list[int]], list[list[int]]]]:
    """Rests of uniform orders, of many sizes: three to an epoch (a rest of a rest, and another), at places and
    with batch sizes of every kind, some too small to test."""
    rng = np.random.default_rng(seed)
    out = []
    for k in range(count):
        order = rng.permutation(N)
        start = int(rng.integers(1, N - 100))
        stop = start + int(rng.integers(0, N - start))
        before, rest = rest_of(order, start, stop, int(rng.choice([64, 192, 256, 512, 1024])))
        out.append((k // 3, before, rest))
    return out


def test_uniform_rests_pass():
    res = elastic.uniformity(uniform_rests(240, seed=1))
    assert res["nonuniform_remainders"] == 0 and res["z_cells_pooled"] <= elastic.LIMIT, res
    assert res["remainders_checked"] >= 200 and res["remainders_skipped"] >= 1, res
    assert res["remainders_checked_prefix"] >= 150 and res["remainders_checked_other"] >= 150, res


def test_small_rests_are_skipped():
    order = np.random.default_rng(2).permutation(N)
    one_batch = rest_of(order, 5000, 5300, size=512)
    few = rest_of(order, 5000, 5000 + elastic.MIN_REST - 1, size=64)
    res = elastic.uniformity([(0, *one_batch), (0, *few), (0, [], [])])
    assert (res["remainders_checked"], res["remainders_skipped"]) == (0, 3), res


def with_bad(make) -> dict:
    """The checks over uniform rests with one bad rest among them, the bad one made from an epoch's order."""
    rests = uniform_rests(30, seed=3)
    order = np.random.default_rng(4).permutation(N)
    rests.insert(17, (99, *make(order)))
    return elastic.uniformity(rests)


def in_id_order(order):
    before, rest = rest_of(order, 6000, 9000)
    return before, batches(np.sort(np.concatenate(rest)), 256)


def in_reverse_id_order(order):
    before, rest = rest_of(order, 6000, 9000)
    return before, batches(np.sort(np.concatenate(rest))[::-1], 256)


def sorted_within_halves(order):
    before, rest = rest_of(order, 6000, 9000)
    ids = np.concatenate(rest)
    half = len(ids) // 2
    return before, batches(np.concatenate([np.sort(ids[:half]), np.sort(ids[half:])]), 256)


@pytest.mark.parametrize("make", [in_id_order, in_reverse_id_order, sorted_within_halves])
def test_a_rest_following_ids_fails(make):
    res = with_bad(make)
    assert res["nonuniform_remainders"] == 1, res
    assert abs(res["worst_z_order"]) > elastic.LIMIT and res["worst_z_cells"] > elastic.LIMIT, res


def walk(perm, x: int, n: int) -> int:
    """Cycle walking down to [0, n), as sampler/global.go does over its power-of-two domain."""
    x = perm[x]
    while x >= n:
        x = perm[x]
    return int(x)


def test_a_rest_correlated_with_the_epochs_start_fails():
    """The rest drawn as a new keyed permutation of the records left, keyed as the epoch: over a domain of the same
    power of two, position k of the rest takes the rank the epoch's order took at k, wherever both fall below
    the rest's size. Inside a batch the places are unknown, so what counts is the batches the two share: 125 of 64
    records here (z 11; of 256 records, z 3)."""
    def make(_):
        feistel = np.random.default_rng(5).permutation(1 << (N - 1).bit_length())
        order = [walk(feistel, k, N) for k in range(N)]
        start = 8000
        left = np.sort(order[start:])
        rest = [int(left[walk(feistel, k, N - start)]) for k in range(N - start)]
        return batches(order[:start], 64), batches(rest, 64)
    res = with_bad(make)
    assert res["nonuniform_remainders"] == 1 and res["worst_z_prefix"] > elastic.LIMIT, res
    assert abs(res["worst_z_order"]) < elastic.LIMIT, "the id statistics see it too: the test tests nothing new"


def test_a_rest_in_another_epochs_order_fails():
    """Two epochs' rests ordered by one key of the record, not of the epoch: their common records come in the
    same relative order."""
    rng = np.random.default_rng(6)
    key = rng.permutation(N)
    rests = uniform_rests(12, seed=7)
    for epoch, start in ((50, 4000), (51, 9000)):
        order = rng.permutation(N)
        left = order[start:]
        rests.append((epoch, batches(order[:start], 256), batches(left[np.argsort(key[left])], 256)))
    res = elastic.uniformity(rests)
    assert res["nonuniform_remainders"] == 1 and res["worst_z_other"] > elastic.LIMIT, res
    assert abs(res["worst_z_order"]) < elastic.LIMIT and abs(res["worst_z_prefix"]) < elastic.LIMIT, res


def test_windows_in_read_order_pass_as_sets():
    """An opportunistic order's window splits its records over its batches as their reads end: in a file of ids, its
    first batch holds the lower ids. The rests of uniform orders so delivered fail taken batch by batch, and pass
    with each window of every worker one set (global_batches), a run that went on with its deal ending the window
    the one before it was inside, and the window a kill cut left out (rest_sets)."""
    rng = np.random.default_rng(8)
    workers, size = 2, 64
    block = elastic.WINDOW * workers

    def delivered(order):
        """order in batches of size, each window of WINDOW batches sorted by id, as steps of a rank."""
        span = elastic.WINDOW * size
        ids = np.concatenate([np.sort(order[k:k + span]) for k in range(0, len(order), span)])
        # Worker w's i-th window is the rank's window w + i x workers: its steps w + (WINDOW i + j) x workers.
        steps = {}
        for t in range(-(-len(ids) // span)):
            w, i = t % workers, t // workers
            for j in range(elastic.WINDOW):
                steps[w + (elastic.WINDOW * i + j) * workers] = [int(x) for x in ids[t * span + j * size:][:size]]
        return [steps[s] for s in sorted(steps)]

    by_batch, uncut, by_window = [], [], []
    for epoch in range(8):
        steps = delivered(rng.permutation(N))
        # A run took 13 steps, ending inside a window; the next went on with its deal to step 25, the first batch
        # of a window (its lower ids).
        start, stop = 13, 25
        by_batch.append((epoch, steps[:start], steps[start:stop]))
        head = elastic.global_batches(steps[:start], block, 0)
        rest = elastic.global_batches(steps[start:stop], block, start)
        uncut.append((epoch, *elastic.rest_sets(head, rest, True, False)))
        by_window.append((epoch, *elastic.rest_sets(head, rest, True, True)))
        assert [len(b) for b in by_window[-1][2]] == [block * size] * 3
    assert elastic.uniformity(by_batch)["nonuniform_remainders"] > 0
    assert elastic.uniformity(uncut)["nonuniform_remainders"] > 0
    res = elastic.uniformity(by_window)
    assert res["remainders_checked"] == 8 and res["nonuniform_remainders"] == 0, res


def test_a_rest_dealt_anew_leaves_out_the_windows_in_flight():
    """The rest of an opportunistic order dealt anew (1 rank, no workers: windows of 2 batches of 64) starts with what
    the windows in flight at its checkpoint did not deliver (4 ranks x 2 workers: 8 windows of 128, each having
    delivered the reads that ended first, its lower 64 ids), at their positions: its higher ids. Left out as the sets
    up to their 1024 records (rest_sets' lead), the rests pass; kept, they fail."""
    rng = np.random.default_rng(9)
    kept, left_out = [], []
    for epoch in range(8):
        order = rng.permutation(N)
        start, span = 4096, 1024
        flight = order[start:start + span].reshape(8, 128)
        low = np.sort(flight, axis=1)[:, :64]
        before = batches(order[:start], 512) + [[int(i) for i in low.reshape(-1)]]
        later = [i for i in order[start:start + span] if i not in set(low.reshape(-1).tolist())]
        rest = elastic.global_batches(batches(np.array(later + list(order[start + span:start + span + 3000])), 64),
                                      elastic.WINDOW, 0)
        lead = -(-span // (elastic.WINDOW * 64))
        kept.append((epoch, *elastic.rest_sets(before, rest, False, False)))
        left_out.append((epoch, *elastic.rest_sets(before, rest, False, False, lead)))
    assert elastic.uniformity(kept)["nonuniform_remainders"] > 0
    res = elastic.uniformity(left_out)
    assert res["remainders_checked"] == 8 and res["nonuniform_remainders"] == 0, res


def test_global_batches_end_the_window_a_run_was_inside():
    steps = [[i] for i in range(10)]
    assert elastic.global_batches(steps, 4, 0) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert elastic.global_batches(steps, 4, 7) == [[0], [1, 2, 3, 4], [5, 6, 7, 8], [9]]
    assert elastic.global_batches(steps[:2], 4, 1) == [[0, 1]]
    assert elastic.global_batches(steps, 1, 5) == steps


def test_repeats_allow_each_deals_padding():
    """A record twice within one deal is its padding, up to the deal's; twice across deals, or past its padding, a
    duplicate; one never delivered, a loss."""
    n = 100
    a, b = ("e0", 0), ("e0", 1)  # two deals of epoch 0: of 3 ranks, then of the records left over 4
    pads = {a: 2, b: 1}

    def rows(first, second):
        return {0: [(a, 0, 0, 1, first), (b, 1, 0, 1, second)]}

    whole = rows(list(range(60)) + [0, 1], list(range(60, 100)) + [60])
    assert elastic.repeats(whole, n, pads) == (0, 0)
    # Record 5 again in the second deal: never padding, though that deal padded less than it may.
    assert elastic.repeats(rows(list(range(60)), list(range(60, 100)) + [5]), n, pads) == (1, 0)
    # Three pads of a deal of two.
    assert elastic.repeats(rows(list(range(60)) + [0, 1, 2], list(range(60, 100))), n, pads) == (1, 0)
    assert elastic.repeats(rows(list(range(59)), list(range(60, 100))), n, pads) == (0, 1)


def shared_place(epoch: int, pos: int, size: int, tail: int = 0, **more) -> dict:
    """A shared role's place: its sampler_state's header (docs/protocol.md), then bytes the count does not read."""
    header = b"RFSHR2\0" + f"{epoch} {pos} {size} {tail}\n".encode() + b"\x3a\x30\x00\x00"
    return {"epoch": epoch, "batch": -(-pos // 64), "sampler_state": base64.b64encode(header).decode(), **more}


def test_placed_counts_a_shared_ranks_records():
    """1000 records over 2 ranks of 2 workers: each worker's part is 250; a worker past the epoch delivered all of
    its part, one at its start none."""
    deals = {0: (1000, 2), 1: (1000, 2)}
    st = {"epoch": 0, "workers": {"0": shared_place(0, 128, 250), "1": shared_place(0, 64, 250)}}
    assert elastic.placed(st, "shared", deals, 64, 2) == {0: 192}
    st = {"epoch": 0, "workers": {"0": {"epoch": 1, "batch": 0, "ended": []}, "1": {"epoch": 0, "batch": 0}}}
    assert elastic.placed(st, "shared", deals, 64, 2) == {0: 250, 1: 0}
    # The rest of epoch 0, 616 records on 3 ranks (206 each, 2 pads), then epoch 1 on the same 3 ranks.
    deals = {0: (616, 3), 1: (1000, 3)}
    st = {"epoch": 1, "workers": {"0": shared_place(1, 64, 167), "1": {"epoch": 1, "batch": 0}}}
    assert elastic.placed(st, "shared", deals, 64, 2) == {0: 206, 1: 64}
    # Without workers the rank is the one role; a tail's records count as its skip says.
    assert elastic.placed(shared_place(0, 70, 500, tail=6, skip=[1, 2]), "shared", {0: (1000, 2)}, 64, 2) == {0: 66}


def test_placed_counts_an_opportunistic_ranks_records():
    """1000 records over 3 ranks: 334 each, in batches of 64 (the last of 14), windows of 2 batches (128, 128, 78);
    of 2 workers, worker 0 owns windows 0 and 2, worker 1 window 1. A place's batch is the next it delivers: the
    windows before it of its own are delivered, and of the one it is inside, its skip."""
    deals = {0: (1000, 3), 1: (1000, 3)}
    st = {"epoch": 0, "workers": {"0": {"epoch": 0, "batch": 4},
                                  "1": {"epoch": 0, "batch": 3, "skip": list(range(64))}}}
    assert elastic.placed(st, "opportunistic", deals, 64, 2) == {0: 128 + 64}
    st = {"epoch": 0, "workers": {"0": {"epoch": 1, "batch": 1, "skip": list(range(64))},
                                  "1": {"epoch": 0, "batch": 6}}}
    assert elastic.placed(st, "opportunistic", deals, 64, 2) == {0: 128 + 78 + 128, 1: 64}
    # One role: a window at its start (batch 2, no skip) holds nothing delivered yet.
    assert elastic.placed({"epoch": 0, "batch": 2}, "opportunistic", deals, 64, 2) == {0: 128}


def test_rest_run_is_a_run_opened_from_places():
    assert not elastic.rest_run({"epoch": 0, "batch": 3, "workers": {"0": {"epoch": 0, "batch": 2}}})
    assert elastic.rest_run({"epoch": 0, "batch": 1, "delivered": [{"epoch": 0, "batch": 0}]})
    assert elastic.rest_run({"epoch": 0, "workers": {"0": {"epoch": 1, "batch": 0, "ended": [{}]}, "1": {"epoch": 0}}})
