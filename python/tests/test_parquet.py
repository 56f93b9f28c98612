"""Parquet files written by pyarrow.parquet (each codec, data pages v1 and
v2, several row groups, small pages, lists, nulls, dictionary-encoded
columns, structs and maps) read back through a real daemon in a shuffled
order: every row equals what pyarrow reads for it; columns are projected; a
corrupt page is an error naming the file and offset."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import riffle
from conftest import Daemon
from test_arrow import table

SINGLE_LEAF = ["id", "i8", "u32", "f16", "f32", "f64", "flag", "text", "big", "blob", "fsb", "day", "ts", "dur", "dec",
               "ints", "floats", "words", "nested", "vec", "cat", "nothing"]


def parquet_table(n: int, seed: int) -> pa.Table:
    """test_arrow's table, as Parquet writers take it: a fixed-size list's
    null rows have no values there, so that column has no nulls."""
    t = table(n, seed)
    vec = pa.array([[float(i), 0.5, -1.0] for i in range(n)], pa.list_(pa.float32(), 3))
    return t.set_column(t.column_names.index("vec"), "vec", vec)


def rows_of(path, columns=None) -> list[dict]:
    t = pq.read_table(path, columns=columns)
    t = t.cast(pa.schema([f.with_type(f.type.value_type) if pa.types.is_dictionary(f.type) else f for f in t.schema]))
    return t.to_pylist()


@pytest.mark.parametrize("codec,version", [("snappy", "1.0"), ("zstd", "2.0"), ("gzip", "1.0"), ("none", "2.0")])
def test_every_row_equals_pyarrow(daemon, tmp_path, codec, version):
    p = tmp_path / f"t-{codec}.parquet"
    t = parquet_table(700, 2)
    pq.write_table(t, p, compression=codec, row_group_size=300, data_page_size=2048, data_page_version=version)
    want = rows_of(p)
    # Every column, rec (a struct of two leaves) and kv (a map) among them.
    ld = riffle.Loader(str(p), batch_size=64, seed=1, sampler="global")
    info = ld.info()
    assert [c["name"] for c in info["columns"]] == t.column_names
    assert {"rec", "kv"} <= set(t.column_names) - set(SINGLE_LEAF)
    seen = []
    for b in ld:
        got = b.data.to_pylist()
        for i, rid in enumerate(b.ids.tolist()):
            assert got[i] == want[rid], f"row {rid}"
        seen += b.ids.tolist()
    assert sorted(seen) == list(range(700))


def test_projection_and_several_leaves(daemon, tmp_path):
    p = tmp_path / "p.parquet"
    pq.write_table(parquet_table(200, 3), p, row_group_size=64)
    b = next(iter(riffle.Loader(str(p), batch_size=50, columns=["text", "id"])))
    assert b.data.schema.names == ["text", "id"]
    # A column of several leaves is projected as any other.
    want = rows_of(p, ["kv", "rec"])
    ld = riffle.Loader(str(p), batch_size=30, seed=4, sampler="global", columns=["kv", "rec"])
    seen = 0
    for b in ld:
        assert b.data.schema.names == ["kv", "rec"]
        for rid, row in zip(b.ids.tolist(), b.data.to_pylist()):
            assert row == want[rid], f"row {rid}"
            seen += 1
    assert seen == 200


def status(sock: str) -> dict:
    c = riffle.client.Connection(sock, autostart=False)
    try:
        return c.request({"op": "status"})[0]["status"]
    finally:
        c.close()


def test_default_order_reads_each_page_once(tmp_path):
    """The block-aware default takes a page's rows together: each page is
    read from storage once per epoch (BENCHMARKS.md has what a global
    shuffle costs over a file larger than the decoded pages kept)."""
    p = tmp_path / "b.parquet"
    pq.write_table(parquet_table(3000, 4).select(["id", "text", "big"]), p, row_group_size=1000, data_page_size=8192)
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    d = Daemon(str(run / "riffle.sock"))
    try:
        ld = riffle.Loader(str(p), batch_size=100, seed=2, socket=d.sock, autostart=False)
        ids = [i for b in ld for i in b.ids.tolist()]
        assert sorted(ids) == list(range(3000))
        ratio = status(d.sock)["read_bytes"] / p.stat().st_size
    finally:
        d.stop()
    assert ratio <= 1.1, ratio


def test_default_order_reads_a_struct_row_group_once(tmp_path):
    """A column of several leaves (an image as Hugging Face stores it) is
    read a row group at a time: the block-aware default reads each row
    group from storage once per epoch, and every row has its bytes."""
    p = tmp_path / "images.parquet"
    n = 600
    img = [{"bytes": bytes([i % 251]) * (20000 + i), "path": f"{i}.png"} for i in range(n)]
    pq.write_table(pa.table({"image": pa.array(img, pa.struct([("bytes", pa.binary()), ("path", pa.string())])),
                             "label": pa.array([i % 10 for i in range(n)], pa.int64())}),
                   p, row_group_size=100, compression="none")
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    d = Daemon(str(run / "riffle.sock"))
    try:
        ld = riffle.Loader(str(p), batch_size=32, seed=2, socket=d.sock, autostart=False)
        seen = 0
        for b in ld:
            for rid, row in zip(b.ids.tolist(), b.data.to_pylist()):
                assert row == {"image": img[rid], "label": rid % 10}, f"row {rid}"
                seen += 1
        assert seen == n
        ratio = status(d.sock)["read_bytes"] / p.stat().st_size
    finally:
        d.stop()
    assert ratio <= 1.1, ratio


def test_corrupt_page_names_file_and_offset(daemon, tmp_path):
    p = tmp_path / "c.parquet"
    pq.write_table(pa.table({"x": pa.array(["word %d" % i for i in range(5000)])}), p, compression="snappy",
                   row_group_size=5000, data_page_size=4096, use_dictionary=False)
    md = pq.ParquetFile(p).metadata.row_group(0).column(0)
    data = bytearray(p.read_bytes())
    at = md.data_page_offset + 200
    data[at : at + 64] = bytes(64)
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(bytes(data))
    with pytest.raises(riffle.RiffleError) as e:
        for _ in riffle.Loader(str(bad), batch_size=100):
            pass
    assert "bad.parquet" in str(e.value) and "offset" in str(e.value), str(e.value)


def test_a_file_of_no_rows_among_others(daemon, tmp_path):
    """pyarrow writes an empty table as a row group of no rows whose chunks point at offset 0: among other files it
    adds no rows (as pyarrow reads the directory), opened from its index too; alone it is an empty dataset."""
    pq.write_table(pa.table({"k": pa.array(["x", "y"]), "v": pa.array([1, 2])}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"k": pa.array([], pa.string()), "v": pa.array([], pa.int64())}), tmp_path / "b.parquet")
    want = pq.read_table(tmp_path).to_pylist()
    for _ in range(2):  # scanned, then from the index kept
        rows = [r for b in riffle.Loader(str(tmp_path / "*.parquet"), 4, shuffle=False) for r in b.data.to_pylist()]
        assert rows == want
    with pytest.raises(riffle.InvalidSpec, match="no records"):
        riffle.Loader(str(tmp_path / "b.parquet"), 4)
