"""bench/elastic.py's uniformity checks fail when they should: a resumed rest
in a uniform order passes, and one in id order, in reverse, sorted within
each half, correlated with the epoch's start or in another epoch's rest's
order fails, by the statistic made for it. No daemon: the rests are lists.

    .venv/bin/python -m pytest -q -p no:cacheprovider bench/test_elastic_checks.py
"""

from __future__ import annotations

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
