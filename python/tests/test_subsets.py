"""Subsets without copying (issue 26): ids= (an array or a file), filter=
on label, size and file, dedup=, each exactly once per epoch, under DDP in
equal parts, with every record's bytes a solo read's; and the errors."""

from __future__ import annotations

import json

import numpy as np
import pytest

import riffle
import riffle.torch as rt
from conftest import epoch_records as epoch


def lines(tmp_path, n=500, dup_every=0):
    """A JSONL of n lines, line i of i % 50 + 1 padding bytes; with dup_every, every such line repeats the one
    before it."""
    p = tmp_path / "d.jsonl"
    with open(p, "w") as f:
        for i in range(n):
            j = i - 1 if dup_every and i % dup_every == 0 and i else i
            f.write(json.dumps({"i": j, "pad": "x" * (j % 50 + 1)}) + "\n")
    return str(p)


def solo(path, **kw) -> dict[int, bytes]:
    return {int(i): bytes(b.record(k)) for b in riffle.Loader(path, 64, sampler="sequential", **kw)
            for k, i in enumerate(b.ids)}




@pytest.mark.parametrize("form", ["list", "npy", "txt"])
def test_ids(daemon, tmp_path, form):
    path = lines(tmp_path)
    ref = solo(path)
    want = sorted(np.random.default_rng(1).choice(500, 137, replace=False).tolist())
    ids = want
    if form == "npy":
        ids = tmp_path / "ids.npy"
        np.save(ids, np.array(want, dtype=np.int32))
    elif form == "txt":
        ids = tmp_path / "ids.txt"
        ids.write_text("# the ids\n" + "\n".join(map(str, want)) + "\n\n")
    ld = riffle.Loader(path, 32, ids=ids, seed=2)
    orders = []
    for _ in range(2):
        got = epoch(ld)
        assert sorted(got) == want
        assert all(got[i] == ref[i] for i in got)
        orders.append(list(got))
    assert orders[0] != orders[1]  # a new shuffle each epoch


def test_subset_under_ddp(daemon, tmp_path):
    """Three ranks get equal parts of a subset of 137, as DistributedSampler gives (padded to 46 each), with
    workers."""
    path = lines(tmp_path)
    want = sorted(np.random.default_rng(1).choice(500, 137, replace=False).tolist())
    got = []
    for r in range(3):
        dl = rt.loader(path, 8, ids=want, seed=3, rank=r, world_size=3, num_workers=2, decode="bytes")
        assert len(dl.dataset) == 137
        mine = [i for b in dl for i in b_ids(b)]
        assert len(mine) == 46
        got += mine
    assert set(got) == set(want) and len(got) - len(want) == 1  # 3 x 46 = 138: one padding repeat


def b_ids(b):
    return [json.loads(bytes(r))["i"] for r in b]


def test_filters(daemon, tmp_path):
    # Sizes: lines of 'pad' 1..50 bytes.
    path = lines(tmp_path)
    ref = solo(path)
    small = {i for i, r in ref.items() if len(r) <= 30}
    got = epoch(riffle.Loader(path, 32, filter={"max_size": 30}))
    assert set(got) == small and all(got[i] == ref[i] for i in got)
    mid = {i for i, r in ref.items() if 25 <= len(r) <= 40}
    assert set(epoch(riffle.Loader(path, 32, filter={"min_size": 25, "max_size": 40}))) == mid
    # Labels and file names in a directory (ImageFolder).
    root = tmp_path / "tree"
    for i in range(60):
        d = root / f"c{i % 3}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{i:03d}.{'jpg' if i % 2 else 'png'}").write_bytes(b"%d" % i)
    tree = solo(str(root))
    names = {i: r.decode() for i, r in tree.items()}
    ld = riffle.Loader(str(root), 8, filter={"label": 1, "glob": "*.jpg"})
    got = epoch(ld)
    assert sorted(int(v) for v in (got[i].decode() for i in got)) == [i for i in range(60) if i % 3 == 1 and i % 2]
    assert set(epoch(riffle.Loader(str(root), 8, filter={"glob": "*/c2/*"}))) == {i for i, v in names.items() if int(v) % 3 == 2}
    # A filter on a subset: what is in both.
    assert set(epoch(riffle.Loader(path, 32, subset=range(100), filter={"max_size": 30}))) == {i for i in small if i < 100}


def test_dedup(daemon, tmp_path):
    path = lines(tmp_path, dup_every=5)  # 99 lines repeat the one before
    ref = solo(path)
    distinct: dict[bytes, int] = {}
    for i in sorted(ref):
        distinct.setdefault(ref[i], i)
    ld = riffle.Loader(path, 32, dedup=True, seed=4)
    got = epoch(ld)
    assert sorted(got) == sorted(distinct.values())  # the first of each, by id
    assert len(got) == 500 - 99
    assert len(epoch(ld)) == 401
    # The hashes were kept: a new loader finds them (the same records either way).
    assert sorted(epoch(riffle.Loader(path, 32, dedup=True, seed=5))) == sorted(got)


def test_bad_ids_and_filters(daemon, tmp_path):
    path = lines(tmp_path)
    bad = tmp_path / "bad.txt"
    bad.write_text("1\n2\nthree\n")
    with pytest.raises(riffle.InvalidSpec, match='bad.txt line 3: "three"'):
        riffle.Loader(path, 8, ids=bad)
    with pytest.raises(riffle.InvalidSpec, match="not in"):
        riffle.Loader(path, 8, ids=[1, 500])
    fl = tmp_path / "f.npy"
    np.save(fl, np.array([1.0, 2.0]))
    with pytest.raises(riffle.InvalidSpec, match="want integers"):
        riffle.Loader(path, 8, ids=fl)
    with pytest.raises(FileNotFoundError):
        riffle.Loader(path, 8, ids=tmp_path / "none.txt")
    with pytest.raises(ValueError, match="unknown test"):
        riffle.Loader(path, 8, filter={"colour": "red"})
    with pytest.raises(riffle.InvalidSpec, match="no labels"):
        riffle.Loader(path, 8, filter={"label": 1})
    with pytest.raises(riffle.InvalidSpec, match="holds no record"):
        riffle.Loader(path, 8, filter={"min_size": 1000})
    with pytest.raises(ValueError, match="both subset= and ids="):
        riffle.Loader(path, 8, subset=[1], ids=[2])


@pytest.mark.parametrize("fmt", ["arrow", "parquet"])
def test_filter_by_column(daemon, tmp_path, fmt):
    pa = pytest.importorskip("pyarrow")
    n = 3000
    langs = ["en", "de", "fr"]
    table = pa.table({"id": pa.array(range(n), pa.int64()),
                      "lang": pa.array([None if i % 97 == 0 else langs[i % 3] for i in range(n)]),
                      "score": pa.array([(i * 7919 % 1000) / 1000 for i in range(n)]),
                      "text": pa.array(["t" * (i % 50) for i in range(n)])})
    p = str(tmp_path / f"d.{fmt}")
    if fmt == "arrow":
        with pa.ipc.new_file(p, table.schema) as w:
            for b in table.to_batches(max_chunksize=500):
                w.write_batch(b)
    else:
        import pyarrow.parquet as pq
        pq.write_table(table, p, row_group_size=700, data_page_size=4096)

    def ids(**kw):
        got = [r["id"] for b in riffle.Loader(p, 256, columns=["id"], **kw) for r in b.data.to_pylist()]
        assert len(got) == len(set(got))
        return sorted(got)

    assert ids(filter={"column": "lang", "in": ["en", "fr"]}) == [i for i in range(n) if i % 97 and i % 3 != 1]
    assert ids(filter={"column": "score", "min": 0.25, "max": 0.5}) == [i for i in range(n) if 0.25 <= (i * 7919 % 1000) / 1000 <= 0.5]
    assert ids(filter={"column": "id", "in": [5, 7, 2999]}) == [5, 7, 2999]
    # With a subset and under DDP: equal parts of what passes.
    want = [i for i in range(1000) if i % 97 and i % 3 == 1]
    got = [ids(filter={"column": "lang", "in": "de"}, subset=range(1000), rank=r, world_size=2) for r in (0, 1)]
    assert len(got[0]) in (len(got[1]), len(got[1]) + 1, len(got[1]) - 1) and set(got[0]) | set(got[1]) == set(want)
    with pytest.raises(riffle.InvalidSpec, match="no_such"):
        riffle.Loader(p, 8, filter={"column": "no_such", "in": [1]})
    with pytest.raises(riffle.InvalidSpec, match="takes in, min or max"):
        riffle.Loader(p, 8, filter={"column": "lang"})
