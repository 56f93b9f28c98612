"""Structured .npy arrays written by numpy (nested, padded, sub-arrays,
Latin-1 and UTF-8 field names: header versions 1 and 3), read back through
a real daemon in a shuffled order: every row equals numpy.load's."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import riffle
import riffle.torch as rt

DTYPES = {
    "nested_aligned": np.dtype([("id", "<i8"), ("name", "U5"), ("pos", "<f4", (2, 3)),
                                ("inner", [("a", "u1"), ("b", "<f8")]), ("flag", "?")], align=True),
    "packed": np.dtype([("id", "<i4"), ("ñame", "S3"), ("when", "<M8[ms]"), ("x", ">f8")]),
    "utf8_v3": np.dtype([("id", "<u2"), ("名前", "<i4"), ("vals", "<f2", (4,))]),
}


def make(path, dt: np.dtype, n: int) -> np.ndarray:
    rng = np.random.default_rng(7)
    raw = rng.integers(0, 256, size=n * dt.itemsize, dtype=np.uint8)
    a = raw.view(dt).copy()
    a["id"] = np.arange(n)
    for name in dt.names:
        if dt[name].kind == "U":
            a[name] = [f"r{i}"[:5] for i in range(n)]
        if dt[name].kind == "f" or (dt[name].subdtype and dt[name].subdtype[0].kind == "f"):
            a[name] = rng.random(a[name].shape)
        if dt[name].kind == "M":
            a[name] = np.datetime64("2020-01-01") + rng.integers(0, 10**9, n).astype("m8[ms]")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # version 3 headers
        np.save(path, a)
    return a


@pytest.mark.parametrize("name", list(DTYPES))
def test_rows_equal_numpy_load(daemon, tmp_path, name):
    p = tmp_path / f"{name}.npy"
    make(p, DTYPES[name], 300)
    want = np.load(p)
    seen = []
    for b in riffle.Loader(str(p), batch_size=64, seed=1):
        rows = b.data
        assert rows.dtype == want.dtype
        for i, rid in enumerate(b.ids.tolist()):
            assert rows[i].tobytes() == want[rid].tobytes(), f"row {rid}"
        seen += b.ids.tolist()
    assert sorted(seen) == list(range(300)) and seen != sorted(seen)


def test_torch_gives_fields(daemon, tmp_path):
    import torch
    p = tmp_path / "s.npy"
    make(p, DTYPES["nested_aligned"], 100)
    want = np.load(p)
    b = next(iter(rt.loader(str(p), 20, num_workers=0)))
    assert isinstance(b["id"], torch.Tensor) and isinstance(b["pos"], torch.Tensor) and b["pos"].shape == (20, 2, 3)
    assert torch.equal(b["pos"], torch.from_numpy(want["pos"][b["id"].numpy()]))
