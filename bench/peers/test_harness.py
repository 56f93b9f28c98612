"""The harness flags a loader that delivers wrong: a record twice, too few
or too many, a failure; and it reads a runner's result through its noise.
Run by `make test` (it needs no peer installed)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness  # noqa: E402


def run(ids, error=None):
    return harness.Run(n=len(ids), distinct=len(set(ids)), ids=list(ids), error=error)


def test_exactly_once_is_not_flagged():
    assert harness.flags(run(range(100)), 100) == []


def test_a_repeated_record_is_flagged():
    ids = list(range(100))
    ids[7] = 3
    assert harness.flags(run(ids), 100) == ["1 records repeated"]


def test_a_wrong_count_is_flagged():
    assert harness.flags(run(range(90)), 100) == ["90 records of 100"]
    assert "110 records of 100" in harness.flags(run(list(range(100)) + list(range(10))), 100)


def test_a_failure_is_flagged_not_counted():
    f = harness.flags(run(range(10), error="OSError: boom"), 100)
    assert f == ["failed: OSError: boom"]


def test_parse_run_skips_noise():
    out = "Generating train split\n{not json\n" + json.dumps({"n": 5, "distinct": 5}) + "\n"
    assert harness.parse_run(out)["n"] == 5


def test_speed_runs_flag_repeats_without_a_count():
    # A time-bounded run has no expected count, but a repeat still shows.
    assert harness.flags(run([1, 2, 2])) == ["1 records repeated"]
