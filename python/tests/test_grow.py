"""Datasets that grow (issue 26): with refresh="epoch", files added between
epochs are read from the next epoch on, after the old files, whose ids keep
their meaning; a resume reads the files its epoch read; files that
disappear are an error."""

from __future__ import annotations

import json

import pytest

import riffle
import riffle.torch as rt
from conftest import epoch_records as epoch


def add_lines(path, first, n):
    with open(path, "w") as f:
        for i in range(first, first + n):
            f.write(json.dumps({"i": i, "pad": "y" * (i % 13)}) + "\n")




def test_glob_grows_between_epochs(daemon, tmp_path):
    add_lines(tmp_path / "b.jsonl", 100, 100)
    add_lines(tmp_path / "d.jsonl", 300, 50)
    ld = riffle.Loader(str(tmp_path / "*.jsonl"), 16, refresh="epoch", seed=1)
    first = epoch(ld)
    assert len(first) == 150
    # A file that sorts before the old ones: its records still come after them.
    add_lines(tmp_path / "a.jsonl", 0, 40)
    second = epoch(ld)
    assert len(second) == 190
    assert all(second[i] == first[i] for i in first)  # every old id, the same record
    assert sorted(json.loads(second[i])["i"] for i in range(150, 190)) == list(range(40))
    assert epoch(ld) == second


def test_resume_reads_the_epochs_files(daemon, tmp_path):
    add_lines(tmp_path / "a.jsonl", 0, 100)
    ld = riffle.Loader(str(tmp_path / "*.jsonl"), 10, refresh="epoch", seed=2)
    epoch(ld)
    add_lines(tmp_path / "b.jsonl", 100, 60)  # epoch 1 reads 160
    it = iter(ld)
    head = {int(i): bytes(b.record(k)) for b in [next(it) for _ in range(4)] for k, i in enumerate(b.ids)}
    st = ld.state_dict()
    ld.close()
    assert st["generations"] == 2
    add_lines(tmp_path / "c.jsonl", 160, 30)  # after the checkpoint: not in epoch 1
    ld2 = riffle.Loader(str(tmp_path / "*.jsonl"), 10, refresh="epoch", seed=2)
    ld2.load_state_dict(st)
    rest = epoch(ld2)
    assert not set(head) & set(rest) and set(head) | set(rest) == set(range(160))
    assert len(epoch(ld2)) == 190  # the next epoch reads every file


def test_image_folder_grows(daemon, tmp_path):
    root = tmp_path / "tree"
    for c in ("cat", "dog"):
        (root / c).mkdir(parents=True)
        for i in range(5):
            (root / c / f"{i}.jpg").write_bytes(f"{c}{i}".encode())
    dl = rt.loader(str(root), 4, refresh="epoch", num_workers=2, decode="bytes", seed=3)
    got = [(bytes(x), int(y)) for xs, ys in dl for x, y in zip(xs, ys)]
    assert sorted(got) == sorted((f"{c}{i}".encode(), k) for k, c in enumerate(("cat", "dog")) for i in range(5))
    (root / "dog" / "9.jpg").write_bytes(b"dog9")
    got = [(bytes(x), int(y)) for xs, ys in dl for x, y in zip(xs, ys)]
    assert len(got) == 11 and (b"dog9", 1) in got  # both workers read the same files: none twice
    (root / "ant").mkdir()
    (root / "ant" / "0.jpg").write_bytes(b"ant0")
    with pytest.raises(riffle.InvalidSpec, match="classes"):
        list(riffle.Loader(str(root), 4, refresh="epoch", epoch=5))


def test_a_file_that_disappears_is_an_error(daemon, tmp_path):
    add_lines(tmp_path / "a.jsonl", 0, 20)
    add_lines(tmp_path / "b.jsonl", 20, 20)
    ld = riffle.Loader(str(tmp_path / "*.jsonl"), 8, refresh="epoch")
    assert len(epoch(ld)) == 40
    (tmp_path / "a.jsonl").unlink()
    with pytest.raises(riffle.RiffleError, match="a.jsonl"):
        epoch(ld)


def test_a_file_rewritten_is_an_error(daemon, tmp_path):
    add_lines(tmp_path / "a.jsonl", 0, 20)
    ld = riffle.Loader(str(tmp_path / "*.jsonl"), 8, refresh="epoch")
    assert len(epoch(ld)) == 20
    add_lines(tmp_path / "a.jsonl", 5, 20)
    add_lines(tmp_path / "b.jsonl", 50, 5)
    with pytest.raises(riffle.RiffleError, match="a.jsonl.*rewritten"):
        epoch(ld)


def test_refresh_refusals(daemon, tmp_path):
    add_lines(tmp_path / "a.jsonl", 0, 20)
    with pytest.raises(riffle.InvalidSpec, match="refresh"):
        riffle.Loader(str(tmp_path / "a.jsonl"), 8, refresh="always")


def test_parquet_glob_grows(daemon, tmp_path):
    """Files of rows grow the same way: the generations are read as one dataset of their files."""
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    def write(name, first, n):
        pq.write_table(pa.table({"i": pa.array(range(first, first + n), pa.int64())}), str(tmp_path / name),
                       row_group_size=50, data_page_size=512)

    write("b.parquet", 100, 200)
    ld = riffle.Loader(str(tmp_path / "*.parquet"), 32, refresh="epoch", seed=4)
    first = {i: r["i"] for b in ld for i, r in zip(b.ids.tolist(), b.data.to_pylist())}
    assert sorted(first.values()) == list(range(100, 300))
    write("a.parquet", 0, 100)  # sorts first, reads after
    second = {i: r["i"] for b in ld for i, r in zip(b.ids.tolist(), b.data.to_pylist())}
    assert all(second[i] == v for i, v in first.items()) and sorted(second[i] for i in range(200, 300)) == list(range(100))


def test_growing_mixture(daemon, tmp_path):
    """A mixture of growing globs: each source reads the files found by the epoch's start, and its records keep
    their ids after its offset (which moves as the sources before it grow)."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    add_lines(tmp_path / "a" / "1.jsonl", 0, 100)
    add_lines(tmp_path / "b" / "1.jsonl", 1000, 100)
    mix = [(str(tmp_path / "a" / "*.jsonl"), 1), (str(tmp_path / "b" / "*.jsonl"), 1)]
    ld = riffle.Loader(mixture=mix, batch_size=16, refresh="epoch", seed=5)
    first = epoch(ld)
    assert sorted(json.loads(r)["i"] for r in first.values()) == list(range(100)) + list(range(1000, 1100))
    add_lines(tmp_path / "a" / "2.jsonl", 100, 100)  # source 0 grows to 200
    second = epoch(ld)
    assert ld.offsets == [0, 200]
    new = [json.loads(r)["i"] for r in second.values()]
    # The schedule ends at source 1's 101st draw (priority 100.5): source 0 has drawn 101, the tie going to it.
    assert len(second) == 201 and len([i for i in new if i < 1000]) == 101
    for rid, r in second.items():
        i = json.loads(r)["i"]
        assert rid == (i if i < 1000 else 200 + i - 1000), (rid, i)


def test_growing_mixture_of_rows(daemon, tmp_path):
    """Sources of Parquet rows that grow mix too: each source's generations, all read as one dataset of their
    files; a source's rows keep their ids after its offset."""
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    def write(d, name, first, n):
        (tmp_path / d).mkdir(exist_ok=True)
        pq.write_table(pa.table({"i": pa.array(range(first, first + n), pa.int64())}), str(tmp_path / d / name),
                       row_group_size=40, data_page_size=512)

    write("a", "2.parquet", 0, 100)
    write("b", "1.parquet", 1000, 100)
    mix = [(str(tmp_path / "a" / "*.parquet"), 1), (str(tmp_path / "b" / "*.parquet"), 1)]
    ld = riffle.Loader(mixture=mix, batch_size=16, refresh="epoch", seed=6)

    def rows():
        out = {}
        for b in ld:
            for i, r in zip(b.ids.tolist(), b.data.to_pylist()):
                assert i not in out
                out[i] = r["i"]
        return out

    first = rows()
    assert sorted(first.values()) == list(range(100)) + list(range(1000, 1100))
    write("a", "1.parquet", 100, 100)  # sorts first, reads after
    second = rows()
    assert ld.offsets == [0, 200]
    for rid, i in second.items():
        assert rid == (i if i < 1000 else 200 + i - 1000), (rid, i)
    assert any(100 <= i < 200 for i in second.values())
