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


def test_image_rows_are_named_and_checked():
    assert harness.image_rows("center,rrc") == ["center", "rrc"]
    assert harness.image_rows("rrc") == ["rrc"]
    for bad in ("crop", "", "center,flip"):
        try:
            harness.image_rows(bad)
        except SystemExit:
            continue
        raise AssertionError(f"{bad!r} was accepted")


def test_rrc_boxes_are_torchvisions():
    # The map-stage peers' RandomResizedCrop draws as torchvision 0.14's
    # get_params does: a box inside the image of 8-100% of its area and a
    # ratio in [3/4, 4/3] (give or take rounding), else the centre box.
    import random

    import loaders
    rnd = random.Random(1)
    for w, h in [(500, 375), (375, 500), (224, 224), (1000, 50)]:
        for _ in range(200):
            l, t, cw, ch = loaders.rrc_box(w, h, rnd)
            assert 0 <= l and 0 <= t and l + cw <= w and t + ch <= h and cw > 0 and ch > 0
            if (w, h) != (1000, 50):
                assert 0.08 * w * h * 0.9 <= cw * ch <= w * h
                assert 3 / 4 * 0.9 <= cw / ch <= 4 / 3 * 1.1
    assert loaders.rrc_box(1000, 50, random.Random(0)) == (466, 0, 67, 50)  # no box fits: the centre one


def test_rrc_equals_torchvision_for_the_same_box():
    import io

    import numpy as np
    import pytest
    torchvision = pytest.importorskip("torchvision")
    from PIL import Image
    import torchvision.transforms.functional as F

    import loaders
    rng = np.random.default_rng(0)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (120, 160, 3), dtype=np.uint8)).save(buf, "JPEG", quality=90)
    im = Image.open(io.BytesIO(buf.getvalue())).convert("RGB")
    for (l, t, w, h), flip in [((10, 5, 100, 90), False), ((0, 0, 160, 120), True)]:
        want = F.resized_crop(im, t, l, h, w, [224, 224], F.InterpolationMode.BILINEAR)
        want = F.hflip(want) if flip else want
        got = loaders.prep_rrc(buf.getvalue(), box=(l, t, w, h), flip=flip)
        assert np.array_equal(got, np.asarray(want))
