"""Datasets of rows (Arrow IPC, Hugging Face save_to_disk, Parquet) take
what record datasets take. `riffle pack` writes them as Arrow IPC shards
that read back equal, row by row and column by column, to pyarrow's (and
datasets') reading of the source."""

from __future__ import annotations

import datetime
import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
feather = pytest.importorskip("pyarrow.feather")

import riffle

N = 3000


def table():
    """Columns of the kinds rows datasets hold: numbers, strings and
    binaries with nulls, lists, a struct, a zoned timestamp."""
    return pa.table({
        "i": pa.array(range(N), pa.int64()),
        "f": pa.array([i / 7 for i in range(N)], pa.float32()),
        "s": pa.array([("x" * (i % 37)) if i % 11 else None for i in range(N)]),
        "l": pa.array([list(range(i % 5)) for i in range(N)], pa.list_(pa.int32())),
        "st": pa.array([{"a": i, "b": str(i)} for i in range(N)]),
        "ts": pa.array([datetime.datetime(2020, 1, 1) + datetime.timedelta(seconds=i) for i in range(N)],
                       pa.timestamp("us", tz="UTC")),
        "bin": pa.array([bytes([i % 256]) * (i % 300) for i in range(N)]),
    })


def images(n: int):
    """n small PNGs and JPEGs as PIL images, of varied sizes."""
    from PIL import Image
    rng = np.random.default_rng(3)
    out = []
    for i in range(n):
        h, w = 40 + (i * 7) % 50, 50 + (i * 13) % 60
        out.append(Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)))
    return out


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """name -> (path, pyarrow's table of the source)."""
    import datasets
    d = tmp_path_factory.mktemp("rows")
    t = table()
    out = {}
    pq.write_table(t, d / "a.parquet", row_group_size=700)
    out["parquet"] = (d / "a.parquet", pq.read_table(d / "a.parquet"))
    feather.write_feather(t, d / "a.arrow", compression="uncompressed", chunksize=500)
    out["arrow"] = (d / "a.arrow", feather.read_table(d / "a.arrow"))
    with pa.OSFile(str(d / "s.arrows"), "wb") as f, pa.ipc.new_stream(f, t.schema) as w:
        for b in t.to_batches(max_chunksize=900):
            w.write_batch(b)
    out["stream"] = (d / "s.arrows", pa.ipc.open_stream(pa.OSFile(str(d / "s.arrows"))).read_all())
    feats = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=["a", "b", "c"]),
                               "text": datasets.Value("string")})
    ims = images(120)
    hf = datasets.Dataset.from_dict({"image": ims, "label": [i % 3 for i in range(len(ims))],
                                     "text": [f"row {i}" for i in range(len(ims))]}, features=feats)
    hf.save_to_disk(str(d / "hf"), num_shards=2)
    out["hf"] = (d / "hf", datasets.load_from_disk(str(d / "hf")).data.table)
    hf.to_parquet(str(d / "hf.parquet"), batch_size=50)
    out["hf-parquet"] = (d / "hf.parquet", pq.read_table(d / "hf.parquet"))
    return out


def pack(bin_path: str, src, out: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([bin_path, "pack", str(src), "--out", str(out), *extra], capture_output=True, text=True)


def read_all(path, **kw):
    """Every row in id order, as one pyarrow table, and the loader's info."""
    ld = riffle.Loader(str(path), batch_size=64, shuffle=False, **kw)
    batches, ids = [], []
    for b in ld:
        batches.append(b.data)
        ids += b.ids.tolist()
    assert ids == list(range(len(ids)))
    return pa.Table.from_batches(batches), ld.info()


@pytest.mark.parametrize("name", ["parquet", "arrow", "stream", "hf", "hf-parquet"])
def test_packed_rows_equal_pyarrows_reading(daemon, sources, tmp_path, bin_path, name):
    src, want = sources[name]
    out = tmp_path / "packed"
    r = pack(bin_path, src, out, "--shard-bytes", "32KiB")
    assert r.returncode == 0, r.stderr
    man = json.loads((out / "riffle-pack.json").read_text())
    assert man["complete"] and len(man["shards"]) > 1 and all(s["name"].endswith(".arrow") for s in man["shards"])
    got, info = read_all(out)
    assert got.num_rows == want.num_rows
    assert got.schema.names == want.schema.names
    for name_ in want.schema.names:
        assert got.schema.field(name_).type == want.schema.field(name_).type, name_
        assert got.column(name_).to_pylist() == want.column(name_).to_pylist(), name_
    # The shards are Arrow IPC files any Arrow library reads.
    direct = pa.concat_tables(feather.read_table(out / s["name"]) for s in man["shards"])
    assert direct.to_pylist() == got.to_pylist()
    if name.startswith("hf"):
        # The features go with the pack: Image and ClassLabel decode as from the source.
        assert info["features"]["label"]["names"] == ["a", "b", "c"]
        assert info["features"]["image"]["_type"] == "Image"


def test_a_killed_rows_pack_resumes(daemon, sources, tmp_path, bin_path):
    """A pack of rows whose last shards were lost (a pack killed half way)
    keeps its whole shards and writes the rest equal to a clean pack."""
    src, want = sources["parquet"]
    out = tmp_path / "out"
    assert pack(bin_path, src, out, "--shard-bytes", "32KiB").returncode == 0
    man = json.loads((out / "riffle-pack.json").read_text())
    keep = len(man["shards"]) // 2
    for s in man["shards"][keep:]:
        (out / s["name"]).unlink()
    man["shards"], man["complete"] = man["shards"][:keep], False
    (out / "riffle-pack.json").write_text(json.dumps(man))
    r = pack(bin_path, src, out, "--shard-bytes", "32KiB")
    assert r.returncode == 0, r.stderr
    assert f"{keep} found whole" in r.stdout
    got, _ = read_all(out)
    assert got.to_pylist() == want.to_pylist()


@pytest.mark.parametrize("name", ["parquet", "arrow", "hf"])
def test_opportunistic_rows_once_each_equal_a_solo_read(daemon, sources, name):
    """opportunistic=W on rows: each window's rows come once per epoch, cut
    into batches in the order they arrive, each row equal to a solo read."""
    src, _ = sources[name]
    solo, _ = read_all(src)
    want = solo.to_pylist()
    ld = riffle.Loader(str(src), batch_size=37, seed=4, opportunistic=4)
    seen = {}
    for b in ld:
        for i, row in zip(b.ids.tolist(), b.data.to_pylist()):
            assert i not in seen, f"row {i} twice in an epoch"
            seen[i] = row
    assert sorted(seen) == list(range(len(want)))
    assert all(seen[i] == want[i] for i in seen)
