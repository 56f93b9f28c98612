"""bench/mixture.py counts what it claims: a share's error over windows, a
record twice within its source's epoch, a record lost; and a small run of
the peers goes through end to end (skipped without their venv).

    /usr/bin/python3 -m pytest -q -p no:cacheprovider bench/test_mixture.py
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import mixture  # noqa: E402


def delivered(pairs) -> np.ndarray:
    return np.asarray(pairs, np.int64).reshape(-1, 2)


def test_a_source_cycling_its_epochs_has_no_duplicates():
    # Source 0 of 3 records delivered three times over, each pass a new order.
    d = delivered([(0, 0), (0, 1), (0, 2), (0, 2), (0, 0), (0, 1), (0, 1), (0, 0)])
    assert mixture.duplicates(d, np.array([3])) == 0
    assert mixture.losses(d, np.array([3])) == 0


def test_a_repeat_within_a_source_epoch_is_a_duplicate():
    # Source 1 (2 records) repeats record 0 inside its first epoch; source 0 is fine.
    d = delivered([(1, 0), (0, 0), (1, 0), (1, 1)])
    assert mixture.duplicates(d, np.array([2, 2])) == 1


def test_a_batch_straddling_a_source_epoch_is_a_set():
    # Epochs 0,1,2 then 0,2,1 in batches of 2, the second batch delivered as (0, 2):
    # in delivery order epoch 0 would hold 0 twice, but the batch may be taken as (2, 0).
    d = delivered([(0, 0), (0, 1), (0, 0), (0, 2), (0, 2), (0, 1)])
    assert mixture.duplicates(d, np.array([3])) == 2
    assert mixture.duplicates(d, np.array([3]), batch=2) == 0
    # The batch at the boundary may hold a record of both epochs.
    d = delivered([(0, 0), (0, 1), (0, 2), (0, 2), (0, 1), (0, 0)])
    assert mixture.duplicates(d[[0, 1, 3, 2, 4, 5]], np.array([3]), batch=2) == 0
    # A record twice in one batch, inside one epoch, stays a duplicate.
    assert mixture.duplicates(delivered([(0, 0), (0, 0), (0, 1), (0, 2)]), np.array([3]), batch=2) == 1


def test_losses_count_only_sources_delivered_in_full():
    # Source 0 came 3 times (n=3) but record 2 never; source 1 came once of 4: no promise.
    d = delivered([(0, 0), (0, 1), (0, 1), (1, 3)])
    assert mixture.losses(d, np.array([3, 4])) == 1


def test_same_order_notices_a_repeated_epoch_order():
    n = np.array([3])
    assert mixture.same_order(delivered([(0, 2), (0, 0), (0, 1), (0, 2), (0, 0)]), n) == 1
    assert mixture.same_order(delivered([(0, 2), (0, 0), (0, 1), (0, 0), (0, 2)]), n) == 0
    assert mixture.same_order(delivered([(0, 2), (0, 0)]), n) is None


def test_window_error_of_an_exact_schedule_and_of_a_coin():
    share = np.array([0.25, 0.75])
    exact = np.tile([0, 1, 1, 1], 1000)
    assert mixture.window_error(exact, share, 400) == (0.0, 0.0)
    assert mixture.window_error(exact, share, 5000) is None  # no full window
    coin = np.random.default_rng(0).choice(2, 4000, p=share)
    err, off = mixture.window_error(coin, share, 400)
    assert err > 0.05 and off >= 5  # about sqrt(400 * 0.25 * 0.75) = 8.7 samples off, per window


def test_measure_flags_records_not_in_the_data():
    p = {"n": [2, 2], "weights": [1.0, 1.0]}
    m = mixture.measure(delivered([(0, 0), (1, 1), (0, 5), (7, 0)]), p, False, [2])
    assert m["invalid"] == 2 and m["samples"] == 4 and m["w2_error"] == 0.0


def test_plan_is_seeded_and_weights_are_not_equal():
    a, b = mixture.plan(20, 2000, 1), mixture.plan(20, 2000, 1)
    assert a == b and len(set(a["weights"])) == 20 and a["sources"] == 20


@pytest.mark.skipif(not mixture.VENV_PYTHON.exists(), reason="no peers venv (bash bench/peers/setup.sh torch)")
def test_a_small_run_of_the_peers(tmp_path):
    out = tmp_path / "runs.jsonl"
    r = subprocess.run([sys.executable, mixture.__file__, "--data", str(tmp_path), "--sources", "8", "--records", "600",
                        "--loaders", "hf-first,mosaic", "--windows", "100", "--json", str(out)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    runs = {j["loader"]: j for j in map(json.loads, out.read_text().splitlines())}
    assert set(runs) == {"hf-first", "mosaic"}
    for j in runs.values():
        assert "error" not in j and j["invalid"] == 0 and j["samples"] > 0
    # Mosaic's epoch is the sum of the sources' sizes; HF's first_exhausted ends at a used-up source.
    assert runs["mosaic"]["samples"] == runs["mosaic"]["records"]
    assert runs["hf-first"]["sources_used_up"] >= 1 and runs["hf-first"]["duplicates"] == 0
    assert "| hf-first |" in r.stdout and "| mosaic |" in r.stdout


def test_table_gives_each_run_as_a_share_of_both_unmixed_baselines():
    row = {"samples": 10, "setup_s": 0.0, "invalid": 0, "run_error": 0.0, "run_dev": 0.0, "sources_used_up": 1,
           "duplicates": 0, "losses": 0, "w100_error": None, "daemon_us_per_sample": 1.0}
    rows = [row | {"loader": "riffle-unmixed", "samples_per_s": 400}, row | {"loader": "riffle-files", "samples_per_s": 200},
            row | {"loader": "riffle-first", "samples_per_s": 100}]
    lines = mixture.table(rows, [100])
    assert "| % of all.npy | % of the files unmixed |" in lines[0]
    cells = {l.split(" | ")[0].strip("| "): l.split(" | ")[4:7] for l in lines[2:]}
    assert cells["riffle-first"] == ["100", "25%", "50%"]
    assert cells["riffle-files"] == ["200", "50%", "-"] and cells["riffle-unmixed"] == ["400", "-", "200%"]
