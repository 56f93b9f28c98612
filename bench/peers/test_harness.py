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


def test_elastic_counts_repeats_and_losses():
    # Records 0..9; phase 1 took 0-3, phase 2 took 3-7 and 3 again: 3 came
    # three times (one record repeated), 8 and 9 never.
    assert harness.elastic_counts(10, [0, 1, 2, 3], [3, 4, 5, 6, 7, 3]) == (1, 2)
    assert harness.elastic_counts(4, [0, 1], [2, 3]) == (0, 0)


def test_elastic_cell_reports_a_refusal_not_counts():
    ok = [run(range(5))]
    refused = [harness.Run(error="ValueError: Worker count in checkpoint does not match")]
    assert harness.elastic_cell(10, ok, [run(range(5, 10))]) == "0 duplicates, 0 lost"
    assert harness.elastic_cell(10, ok, refused).startswith("refused or failed (ValueError: Worker count")
