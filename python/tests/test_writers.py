"""Files as their writers mean them (issue 23): Arrow and Parquet written by
pyarrow, Polars, DuckDB, fastparquet and Hugging Face's datasets (structs,
maps, lists of structs, images), TFRecords written compressed, .npy object
arrays. What riffle reads equals, row by row over a shuffled epoch,
what pyarrow reads; what it cannot read yet is refused whole, with an error
that names the column and the way around it, never left out unseen."""

from __future__ import annotations

import datetime
import gzip
import zlib

import numpy as np
import pyarrow as pa
import pyarrow.compute
import pyarrow.ipc
import pyarrow.parquet as pq
import pytest

import riffle
from conftest import tfrecord_frames

polars = pytest.importorskip("polars")


def one_epoch(path, seed: int = 3, **kw) -> tuple[pa.Schema, dict[int, dict]]:
    """Every row of a dataset, by id, read through the daemon in a shuffled
    order, and the schema of its batches."""
    ld = riffle.Loader(str(path), batch_size=7, seed=seed, sampler="global", **kw)
    rows: dict[int, dict] = {}
    schema = None
    for b in ld:
        schema = b.data.schema
        for rid, row in zip(b.ids.tolist(), b.data.to_pylist()):
            assert rid not in rows, f"row {rid} twice"
            rows[rid] = row
    return schema, rows


def assert_rows_equal(got: dict[int, dict], want: list[dict]) -> None:
    assert sorted(got) == list(range(len(want)))
    for i, w in enumerate(want):
        assert got[i] == w, f"row {i}"


def refused(path, *must: str, **kw) -> str:
    with pytest.raises(riffle.RiffleError) as e:
        riffle.Loader(str(path), batch_size=4, **kw).info()
    msg = str(e.value)
    for m in must:
        assert m in msg, msg
    return msg


# 1. Parquet columns of several leaves (structs, maps, lists of structs) read
# as pyarrow reads them; a column riffle cannot read yet refuses the dataset,
# by name.

def nested_table(n: int, seed: int) -> pa.Table:
    """Structs, maps and lists of structs with a null at each level: the
    column, a struct's field, a map's value, a list's element."""
    import random
    r = random.Random(seed)

    def maybe(v, p=6):
        return None if r.randrange(p) == 0 else v

    words = ["", "a", "riffle", "ünïcode", "x" * 300]
    people = pa.list_(pa.struct([("name", pa.string()), ("age", pa.int32()),
                                 ("scores", pa.list_(pa.float64()))]))
    return pa.table({
        "id": pa.array(range(n), pa.int64()),
        "image": pa.array([maybe({"bytes": maybe(bytes([i % 256]) * r.randrange(0, 900)), "path": maybe(f"{i}.png")})
                           for i in range(n)], pa.struct([("bytes", pa.binary()), ("path", pa.string())])),
        "meta": pa.array([maybe({"a": maybe(r.randrange(100)),
                                 "inner": maybe({"x": maybe(r.random()), "y": maybe([maybe(r.choice(words))
                                                                                     for _ in range(r.randrange(3))])})})
                          for _ in range(n)],
                         pa.struct([("a", pa.int32()), ("inner", pa.struct([("x", pa.float64()),
                                                                            ("y", pa.list_(pa.string()))]))])),
        "tags": pa.array([maybe([(r.choice(words) + "k", maybe(r.randrange(9))) for _ in range(r.randrange(4))])
                          for _ in range(n)], pa.map_(pa.string(), pa.int32())),
        "people": pa.array([maybe([maybe({"name": maybe(r.choice(words)), "age": maybe(r.randrange(99)),
                                          "scores": maybe([r.random() for _ in range(r.randrange(3))])})
                                   for _ in range(r.randrange(4))]) for _ in range(n)], people),
        "text": pa.array([maybe(r.choice(words)) for _ in range(n)]),
    })


@pytest.mark.parametrize("version,dictionary,codec", [("1.0", True, "snappy"), ("2.0", False, "zstd"),
                                                      ("2.0", True, "none")])
def test_parquet_nested_equals_pyarrow(daemon, tmp_path, version, dictionary, codec):
    p = tmp_path / "nested.parquet"
    pq.write_table(nested_table(300, 5), p, row_group_size=70, data_page_size=512, data_page_version=version,
                   use_dictionary=dictionary, compression=codec)
    schema, got = one_epoch(p, seed=1)
    want = pq.read_table(p)
    assert schema.names == want.column_names
    assert_rows_equal(got, want.to_pylist())
    # A column of several leaves alone, and beside one of one leaf.
    _, got = one_epoch(p, seed=1, columns=["people", "text"])
    assert_rows_equal(got, pq.read_table(p, columns=["people", "text"]).to_pylist())


def test_polars_parquet_structs_equal_pyarrow(daemon, tmp_path):
    t = nested_table(150, 6).select(["id", "image", "meta", "people"])
    p = tmp_path / "polars-nested.parquet"
    polars.from_arrow(t).write_parquet(p, row_group_size=40)
    _, got = one_epoch(p, seed=1)
    assert_rows_equal(got, pq.read_table(p).to_pylist())


def image_bytes(i: int, fmt: str) -> bytes:
    import io

    from PIL import Image
    im = Image.new("RGB", (8 + i % 5, 6 + i % 3), (i * 7 % 256, i * 13 % 256, i * 29 % 256))
    buf = io.BytesIO()
    im.save(buf, format=fmt)
    return buf.getvalue()


@pytest.mark.parametrize("batch_size", [None, 64])
def test_hf_image_dataset_equals_pyarrow(daemon, tmp_path, batch_size):
    """A Hugging Face image dataset in Parquet (datasets.Dataset.to_parquet,
    as the Hub's files are written): its Image feature is
    struct<bytes: binary, path: string>, and riffle serves each row with its
    image's bytes."""
    datasets = pytest.importorskip("datasets")
    pytest.importorskip("PIL")
    n = 230
    images = [None if i % 17 == 5 else {"bytes": image_bytes(i, "PNG" if i % 2 else "JPEG"),
                                          "path": None if i % 3 else f"img/{i}.png"} for i in range(n)]
    ds = datasets.Dataset.from_dict(
        {"image": images, "label": [i % 4 for i in range(n)]},
        features=datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(num_classes=4)}))
    p = tmp_path / "train-00000-of-00001.parquet"
    ds.to_parquet(str(p), batch_size=batch_size)  # a row group a batch
    t = pq.read_table(p)
    assert t.schema.field("image").type == pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    assert pq.ParquetFile(p).metadata.num_row_groups == (1 if batch_size is None else 4)
    schema, got = one_epoch(p, seed=1)
    assert schema.names == ["image", "label"]
    assert_rows_equal(got, t.to_pylist())
    for i, im in enumerate(images):
        assert got[i]["image"] == im, f"row {i}"
    import io

    from PIL import Image
    assert Image.open(io.BytesIO(got[1]["image"]["bytes"])).format == "PNG"
    assert Image.open(io.BytesIO(got[2]["image"]["bytes"])).format == "JPEG"


@pytest.mark.parametrize("name", ["list<run_end_encoded", "dense_union", "sparse_union"])
def test_arrow_types_not_read_yet_are_refused_by_name(daemon, tmp_path, name):
    v = {"list<run_end_encoded": lambda: pa.ListArray.from_arrays(
             pa.array([0, 2, 2, 2], pa.int32()), pa.compute.run_end_encode(pa.array([1, 1], pa.int64())),
             mask=pa.array([False, False, True])),
         "dense_union": lambda: pa.UnionArray.from_dense(pa.array([0, 1, 0], pa.int8()), pa.array([0, 0, 1], pa.int32()),
                                                         [pa.array([1, 2]), pa.array(["a"])]),
         "sparse_union": lambda: pa.UnionArray.from_sparse(pa.array([0, 1, 0], pa.int8()),
                                                           [pa.array([1, 2, 3]), pa.array(["a", "b", "c"])])}[name]()
    t = pa.table({"id": pa.array([0, 1, 2], pa.int64()), "v": v})
    p = tmp_path / "unread.arrow"
    with pa.ipc.new_file(p, t.schema) as w:
        w.write_table(t)
    refused(p, f'column "v" ({name}', 'pass columns=["id"] to read the others')
    _, got = one_epoch(p, columns=["id"])
    assert_rows_equal(got, t.select(["id"]).to_pylist())


def views_table(n: int) -> pa.Table:
    words = [None if i % 7 == 3 else ("ünï" * (i % 9)) for i in range(n)]  # inline (<= 12 bytes) and not
    return pa.table({
        "id": pa.array(range(n), pa.int64()),
        "s": pa.array(words, pa.string_view()),
        "b": pa.array([None if w is None else w.encode() + b"\0" for w in words], pa.binary_view()),
        "rec": pa.array([{"v": w} for w in words], pa.struct([("v", pa.string_view())])),
        "tags": pa.array([None if i % 11 == 5 else [words[(i + k) % n] for k in range(i % 4)] for i in range(n)],
                         pa.list_(pa.string_view())),
        "blobs": pa.array([[{"b": (w or "").encode()} for w in words[i:i + i % 3]] for i in range(n)],
                          pa.large_list(pa.struct([("b", pa.binary_view())]))),
        "lv": pa.array([[w for w in words[i:i + i % 3]] for i in range(n)], pa.list_view(pa.string_view())),
    })


@pytest.mark.parametrize("stream", [False, True])
def test_arrow_views_read_as_strings(daemon, tmp_path, stream):
    """string_view and binary_view (Polars' strings), alone and under
    lists, read row by row as pyarrow reads them; the batches hold them as
    string and binary."""
    t = views_table(500)
    p = tmp_path / ("v.arrows" if stream else "v.arrow")
    with (pa.ipc.new_stream if stream else pa.ipc.new_file)(p, t.schema) as w:
        for b in t.to_batches(max_chunksize=120):
            w.write_batch(b)
    schema, got = one_epoch(p)
    assert schema.field("s").type == pa.string() and schema.field("b").type == pa.binary()
    assert_rows_equal(got, t.to_pylist())


def test_views_under_a_list_across_data_buffers(daemon, tmp_path):
    """A list's views may lie in two data buffers (a writer starts a new one
    when one is full): such rows read; a row across three is an error
    naming it, never a wrong value."""
    parts = [pa.array([c * (13 + i) for i in range(5)], pa.string_view()) for c in "xyz"]
    child = pa.concat_arrays(parts)
    assert len(child.buffers()) == 5  # validity, views, three data buffers
    tags = pa.ListArray.from_arrays(pa.array([0, 3, 7, 12, 12, 15], pa.int32()), child)
    t = pa.table({"id": pa.array(range(5), pa.int64()), "tags": tags})
    p = tmp_path / "buffers.arrow"
    with pa.ipc.new_file(p, t.schema) as w:
        w.write_table(t)
    _, got = one_epoch(p, seed=1)
    assert_rows_equal(got, t.to_pylist())
    three = pa.table({"tags": pa.ListArray.from_arrays(pa.array([0, 15], pa.int32()), child)})
    p3 = tmp_path / "three.arrow"
    with pa.ipc.new_file(p3, three.schema) as w:
        w.write_table(three)
    refused(p3, "three.arrow", 'column "tags"', "data buffers 0, 1 and 2", "unsupported")


def test_polars_stream_of_string_views(daemon, tmp_path):
    p = tmp_path / "polars.arrows"
    df = polars.DataFrame({"n": [1, 2, 3, 4], "s": ["a", "a rather longer string", None, ""]})
    df.write_ipc_stream(p)
    assert pa.ipc.open_stream(p).schema.field("s").type == pa.string_view()  # as Polars writes strings
    _, got = one_epoch(p)
    assert_rows_equal(got, pa.ipc.open_stream(p).read_all().to_pylist())


@pytest.mark.parametrize("form", ["ipc", "stream", "feather"])
def test_polars_categorical_equals_pyarrow(daemon, tmp_path, form):
    """Polars' Categorical is dictionary<string_view>: its dictionary's values are views (inline up to 12 bytes,
    else in data buffers), read into a string column, every row as pyarrow reads it."""
    n = 600
    cats = ["a", "bb", "a category longer than twelve bytes", "", None, "zz" * 20]
    df = polars.DataFrame({"id": range(n), "c": polars.Series([cats[i % 6] for i in range(n)], dtype=polars.Categorical),
                           "v": [i * 0.5 for i in range(n)]})
    p = tmp_path / {"ipc": "cat.arrow", "stream": "cat.arrows", "feather": "cat.feather"}[form]
    if form == "stream":
        df.write_ipc_stream(p)
        read = lambda: pa.ipc.open_stream(p).read_all()  # noqa: E731
    else:
        df.write_ipc(p, compression="uncompressed" if form == "ipc" else "lz4")
        read = lambda: pa.ipc.open_file(p).read_all()  # noqa: E731
    assert str(read().schema.field("c").type) == "dictionary<values=string_view, indices=uint32, ordered=0>"
    _, got = one_epoch(p)
    want = [dict(r, c=None if r["c"] is None else str(r["c"])) for r in read().to_pylist()]
    assert_rows_equal(got, want)


@pytest.mark.parametrize("stream", [False, True])
def test_arrow_run_end_encoded_equals_pyarrow(daemon, tmp_path, stream):
    """pyarrow's run-end encoding (pyarrow.compute.run_end_encode, run ends
    of 16, 32 and 64 bits) of strings, numbers, booleans and timestamps,
    with null runs and under a struct: every row is its run's value, as
    pyarrow's to_pylist gives it."""
    n = 400
    ree = pa.compute.run_end_encode
    words = pa.array([None if i % 23 == 7 else "w%d" % (i // 9) for i in range(n)])
    t = pa.table({
        "id": pa.array(range(n), pa.int64()),
        "s": ree(words, run_end_type=pa.int32()),
        "n": ree(pa.array([None if i % 31 < 3 else i // 5 for i in range(n)], pa.int64()), run_end_type=pa.int16()),
        "f": ree(pa.array([(i // 7) % 2 == 0 for i in range(n)]), run_end_type=pa.int64()),
        "ts": ree(pa.array([datetime.datetime(2020, 1, 1 + i // 50) for i in range(n)], pa.timestamp("ms"))),
        "rec": pa.StructArray.from_arrays([ree(pa.array([float(i // 3) for i in range(n)]))], ["x"]),
    })
    p = tmp_path / "ree.arrow"
    with (pa.ipc.new_stream if stream else pa.ipc.new_file)(p, t.schema) as w:
        for b in t.to_batches(max_chunksize=90):
            w.write_batch(b)
    schema, got = one_epoch(p, seed=1)
    assert schema.field("s").type == pa.string() and schema.field("ts").type == pa.timestamp("ms")
    assert_rows_equal(got, t.to_pylist())


def test_arrow_list_views_equal_pyarrow(daemon, tmp_path):
    """pyarrow's list views of numbers, booleans, strings and structs
    holding lists, their rows anywhere in the child (out of order,
    overlapping, null), read as lists with the values to_pylist gives."""
    n = 300
    child = pa.array([None if k % 9 == 4 else k * 3 for k in range(60)], pa.int32())
    offsets = [(i * 7) % 50 for i in range(n)]
    sizes = [i % 6 for i in range(n)]
    v = pa.ListViewArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(sizes, pa.int32()), child,
                                     mask=pa.array([i % 8 == 3 for i in range(n)]))
    w = pa.LargeListViewArray.from_arrays(pa.array([(i * 5) % 55 for i in range(n)], pa.int64()),
                                          pa.array([i % 4 for i in range(n)], pa.int64()),
                                          pa.array([k % 3 == 0 for k in range(60)]))
    words = pa.array([None if k % 7 == 2 else "w" * (k % 5) + str(k) for k in range(60)])
    recs = pa.array([None if k % 11 == 3 else {"a": k, "tags": [str(k)] * (k % 3)} for k in range(60)],
                    pa.struct([("a", pa.int64()), ("tags", pa.list_(pa.string()))]))
    x = pa.ListViewArray.from_arrays(pa.array([(i * 11) % 52 for i in range(n)], pa.int32()),
                                     pa.array([i % 5 for i in range(n)], pa.int32()), words,
                                     mask=pa.array([i % 12 == 5 for i in range(n)]))
    y = pa.LargeListViewArray.from_arrays(pa.array([(i * 13) % 56 for i in range(n)], pa.int64()),
                                          pa.array([i % 4 for i in range(n)], pa.int64()), recs)
    t = pa.table({"id": pa.array(range(n), pa.int64()), "v": v, "w": w, "x": x, "y": y,
                  "s": pa.array([[float(i)] * (i % 3) for i in range(n)], pa.list_view(pa.float64()))})
    p = tmp_path / "list-views.arrow"
    with pa.ipc.new_file(p, t.schema) as wr:
        for b in t.to_batches(max_chunksize=128):
            wr.write_batch(b)
    schema, got = one_epoch(p, seed=1)
    assert schema.field("v").type == pa.list_(pa.int32()) and schema.field("w").type == pa.large_list(pa.bool_())
    assert_rows_equal(got, t.to_pylist())


# 2. An IPC file's schema is its footer's.

def polars_frame(n: int) -> "polars.DataFrame":
    rng = np.random.default_rng(5)
    return polars.DataFrame({
        "id": np.arange(n, dtype=np.int64),
        "x": rng.random(n).astype(np.float32),
        "word": [None if i % 7 == 0 else f"w{i}" * (i % 5) for i in range(n)],
        "ints": [[j for j in range(i % 4)] for i in range(n)],
        "words": [None if i % 9 == 4 else [f"word {i} {j}" * (j % 3) for j in range(i % 4)] for i in range(n)],
    })


def test_polars_ipc_file_equals_pyarrow(daemon, tmp_path):
    p = tmp_path / "polars.arrow"
    # The oldest compatibility level writes large strings riffle reads; the
    # file, like every Polars IPC file, has no schema message after its magic.
    polars_frame(300).write_ipc(p, compat_level=polars.CompatLevel.oldest())
    assert open(p, "rb").read(12)[8:12] != b"\xff\xff\xff\xff"
    want = pa.ipc.open_file(p).read_all()
    schema, got = one_epoch(p)
    assert schema.names == want.schema.names
    assert_rows_equal(got, want.to_pylist())


def test_polars_ipc_file_of_string_views(daemon, tmp_path):
    p = tmp_path / "polars-views.arrow"
    polars_frame(300).write_ipc(p)  # Feather v2, strings as views, no schema message
    want = pa.ipc.open_file(p).read_all()
    assert want.schema.field("word").type == pa.string_view()
    _, got = one_epoch(p)
    assert_rows_equal(got, want.to_pylist())


def test_pyarrow_ipc_file_still_reads(daemon, tmp_path):
    p = tmp_path / "pyarrow.arrow"
    t = polars_frame(50).to_arrow().cast(pa.schema([("id", pa.int64()), ("x", pa.float32()), ("word", pa.string()),
                                                     ("ints", pa.list_(pa.int64())),
                                                     ("words", pa.list_(pa.string()))]))
    with pa.ipc.new_file(p, t.schema) as w:
        w.write_table(t)
    _, got = one_epoch(p)
    assert_rows_equal(got, t.to_pylist())


# 3. A compressed TFRecord is refused as compressed.


@pytest.mark.parametrize("codec", ["GZIP", "ZLIB"])
def test_compressed_tfrecord_is_refused_as_compressed(daemon, tmp_path, codec):
    plain = tfrecord_frames([b"one", b"two", b"three" * 40])
    p = tmp_path / "data.tfrecord"
    p.write_bytes(gzip.compress(plain) if codec == "GZIP" else zlib.compress(plain))
    msg = refused(p, f"{codec}-compressed TFRecord", "no random access", "decompress it")
    assert "CRC" not in msg
    # Decompressed, it reads.
    q = tmp_path / "plain.tfrecord"
    q.write_bytes(plain)
    got = sorted(bytes(r) for b in riffle.Loader(str(q), batch_size=2) for r in b.records())
    assert got == sorted([b"one", b"two", b"three" * 40])


# 4. An object array is refused as one: what it holds, and what to save instead.

def test_object_npy_is_refused_as_pickled(daemon, tmp_path):
    p = tmp_path / "objects.npy"
    np.save(p, np.array([{"a": 1}, "text", None], dtype=object))
    refused(p, "object array", "pickled Python objects, which riffle does not unpickle", "no fixed size",
            "fixed-dtype array", "structured dtype", "one record per file")


# 6. Timestamps as pyarrow reads them.

def timestamps() -> pa.Table:
    base = datetime.datetime(2021, 3, 4, 5, 6, 7, 891011)
    return pa.table({
        "id": pa.array(range(5), pa.int64()),
        "naive": pa.array([base + datetime.timedelta(hours=i) if i != 2 else None for i in range(5)], pa.timestamp("ns")),
        "paris": pa.array([1_600_000_000_000_000_000 + i * 10**9 for i in range(5)], pa.timestamp("ns", tz="Europe/Paris")),
        "ny_s": pa.array([1_600_000_000 + i for i in range(5)], pa.timestamp("s", tz="America/New_York")),
        "ms": pa.array([1_600_000_000_000 + i for i in range(5)], pa.timestamp("ms")),
        "utc_list": pa.array([[1, 2], [], None, [3], [4]], pa.list_(pa.timestamp("us", tz="UTC"))),
        "tz_list": pa.array([[1, 2], [], None, [3], [4]], pa.list_(pa.timestamp("ns", tz="Asia/Tokyo"))),
        # Structs and maps of several leaves: each leaf keeps its own type.
        "rec": pa.array([None if i == 1 else {"at": 1_600_000_000_000_000_000 + i, "n": i, "when": [i, None]}
                         for i in range(5)],
                        pa.struct([("at", pa.timestamp("ns", tz="Europe/Paris")), ("n", pa.int32()),
                                   ("when", pa.list_(pa.timestamp("us")))])),
        "lrec": pa.array([[{"at": 1_600_000_000_000_000 + i}, None] for i in range(5)],
                         pa.list_(pa.struct([("at", pa.timestamp("us", tz="Asia/Tokyo"))]))),
        "m": pa.array([[("a", 1_600_000_000_000 + i)] for i in range(5)],
                      pa.map_(pa.string(), pa.timestamp("ms", tz="America/New_York"))),
    })


@pytest.mark.parametrize("how", ["int96", "coerce_us", "coerce_ms", "plain"])
def test_timestamps_equal_pyarrow(daemon, tmp_path, how):
    p = tmp_path / f"ts-{how}.parquet"
    kw = {"int96": dict(use_deprecated_int96_timestamps=True),
          "coerce_us": dict(coerce_timestamps="us", allow_truncated_timestamps=True),
          "coerce_ms": dict(coerce_timestamps="ms", allow_truncated_timestamps=True),
          "plain": {}}[how]
    pq.write_table(timestamps(), p, **kw)
    want = pq.read_table(p)
    schema, got = one_epoch(p)
    for f in want.schema:
        assert schema.field(f.name).type == f.type, f.name
    assert_rows_equal(got, want.to_pylist())


# 7. Parquet written by DuckDB and fastparquet.

def mixed_frame(n: int):
    import pandas as pd
    rng = np.random.default_rng(11)
    return pd.DataFrame({
        "id": np.arange(n, dtype=np.int64),
        "i32": rng.integers(-2**31, 2**31 - 1, n).astype(np.int32),
        "f64": rng.random(n),
        "f32": rng.random(n).astype(np.float32),
        "flag": rng.random(n) < 0.5,
        "word": [None if i % 9 == 0 else "w" * (i % 13) + str(i) for i in range(n)],
        "cat": pd.Categorical([["red", "green", "blue"][i % 3] for i in range(n)]),
        "when": pd.to_datetime(1_600_000_000 + np.arange(n) * 3600, unit="s"),
    })


def test_duckdb_parquet_equals_pyarrow(daemon, tmp_path):
    duckdb = pytest.importorskip("duckdb")
    p = tmp_path / "duck.parquet"
    con = duckdb.connect()
    con.execute(f"""COPY (SELECT i::BIGINT AS id, (i * 7 % 1000)::INTEGER AS i32, i / 3.0 AS f64,
                          (i % 5)::REAL AS f32, i % 2 = 0 AS flag,
                          CASE WHEN i % 11 = 0 THEN NULL ELSE repeat('d', i % 17) || i::VARCHAR END AS word,
                          [i, i + 1, i + 2][1:(i % 4)] AS ints,
                          TIMESTAMP '2024-01-01' + INTERVAL (i) MINUTE AS ts,
                          (i * 1.25)::DECIMAL(12, 2) AS price,
                          DATE '2020-01-01' + (i % 400)::INTEGER AS day
                   FROM range(2500) t(i))
                   TO '{p}' (FORMAT PARQUET, ROW_GROUP_SIZE 1000)""")
    want = pq.read_table(p)
    schema, got = one_epoch(p)
    for f in want.schema:
        assert schema.field(f.name).type == f.type, f.name
    assert_rows_equal(got, want.to_pylist())


def test_duckdb_nested_parquet_equals_pyarrow(daemon, tmp_path):
    duckdb = pytest.importorskip("duckdb")
    p = tmp_path / "duck-nested.parquet"
    duckdb.connect().execute(f"""COPY (SELECT i::BIGINT AS id,
                          CASE WHEN i % 9 = 0 THEN NULL ELSE {{'bytes': repeat('b', i % 40)::BLOB,
                               'path': CASE WHEN i % 4 = 0 THEN NULL ELSE i::VARCHAR || '.png' END}} END AS image,
                          CASE WHEN i % 7 = 0 THEN NULL ELSE MAP {{'k' || (i % 3)::VARCHAR: i, 'z': NULL}} END AS m,
                          CASE WHEN i % 5 = 0 THEN NULL
                               ELSE [{{'x': i, 'y': [i, NULL]}}, NULL, {{'x': NULL, 'y': NULL}}][1:(i % 4)] END AS l
                   FROM range(900) t(i))
                   TO '{p}' (FORMAT PARQUET, ROW_GROUP_SIZE 250)""")
    _, got = one_epoch(p, seed=1)
    assert_rows_equal(got, pq.read_table(p).to_pylist())


@pytest.mark.parametrize("compression", [None, "SNAPPY", "ZSTD"])
def test_fastparquet_equals_pyarrow(daemon, tmp_path, compression):
    fastparquet = pytest.importorskip("fastparquet")
    p = tmp_path / "fp.parquet"
    fastparquet.write(str(p), mixed_frame(1200), compression=compression, row_group_offsets=500)
    want = pq.read_table(p)
    want = want.cast(pa.schema([f.with_type(f.type.value_type) if pa.types.is_dictionary(f.type) else f
                                for f in want.schema]))
    # pandas' index, if fastparquet stored it, is a column like any other.
    schema, got = one_epoch(p)
    for f in want.schema:
        assert schema.field(f.name).type == f.type, f.name
    assert_rows_equal(got, want.to_pylist())


def _hf_image_dataset(tmp_path):
    import io

    import datasets
    from PIL import Image
    imgs = []
    for i in range(40):
        b = io.BytesIO()
        Image.new("RGB", (4 + i % 7, 5), (i, 2, 3)).save(b, format="PNG" if i % 2 else "JPEG")
        imgs.append(b.getvalue())
    feats = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=["a", "b"])})
    ds = datasets.Dataset.from_dict({"image": [{"bytes": x, "path": None} for x in imgs],
                                     "label": [i % 2 for i in range(40)]}, features=feats)
    ds.to_parquet(str(tmp_path / "img.parquet"))
    ds.save_to_disk(str(tmp_path / "img_dir"))
    return ds


@pytest.mark.parametrize("where", ["img.parquet", "img_dir"])
@pytest.mark.parametrize("decode", ["auto", "image"])
def test_hf_image_feature_decoded_as_datasets_does(daemon, tmp_path, where, decode):
    """An Image feature's column comes as PIL images equal to datasets' own, from Arrow files or Parquet; the
    ClassLabel names are the classes."""
    import numpy as np
    import riffle.torch as rt
    ds = _hf_image_dataset(tmp_path)
    dl = rt.loader(str(tmp_path / where), 8, seed=1, decode=decode)
    assert dl.dataset.classes == ["a", "b"]
    seen = 0
    for b in dl:
        for img, label in zip(b["image"], b["label"].tolist()):
            i = img.size[0] - 4  # not unique: find by pixels below
            matches = [k for k in range(40) if ds[k]["label"] == label and ds[k]["image"].size == img.size
                       and np.array_equal(np.asarray(ds[k]["image"]), np.asarray(img))]
            assert matches, f"an image of size {img.size} that datasets does not have (width class {i})"
            seen += 1
    assert seen == 40


def test_arrow_js_ipc_file_equals_pyarrow(daemon, tmp_path):
    """An IPC file from apache-arrow's JavaScript writer (no schema message after the magic: the footer holds
    it), row by row as pyarrow reads it over a shuffled epoch."""
    import shutil
    import subprocess
    from pathlib import Path
    js = Path(__file__).resolve().parents[2] / "scripts" / "js"
    if not shutil.which("node") or not (js / "node_modules" / "apache-arrow").exists():
        pytest.fail("apache-arrow's JavaScript writer is not installed: run scripts/install-deps.sh")
    p = tmp_path / "js.arrow"
    subprocess.run(["node", str(js / "write_arrow.mjs"), str(p), "500"], check=True)
    want = pa.ipc.open_file(str(p)).read_all().to_pylist()
    ld = riffle.Loader(str(p), batch_size=64, seed=1, sampler="global")
    seen = []
    for b in ld:
        for rid, row in zip(b.ids.tolist(), b.data.to_pylist()):
            assert row == want[rid], rid
            seen.append(rid)
    assert sorted(seen) == list(range(500))


# 5. Compressed Arrow IPC (LZ4_FRAME, ZSTD), as pyarrow's feather and IPC
# writers and Polars write it, reads as it is: each record batch is read and
# decompressed whole, once, and its rows gathered from it.

def compressed_table(n: int) -> pa.Table:
    rng = np.random.default_rng(11)
    words = ["", "a", "riffle", "ünïcode", "x" * 300]
    return pa.table({
        "id": pa.array(np.arange(n), pa.int64()),
        "x": pa.array([None if i % 6 == 0 else float(v) for i, v in enumerate(rng.random(n))], pa.float32()),
        "zeros": pa.array(np.zeros(n), pa.float64()),  # a buffer ZSTD makes an RLE block of
        "word": pa.array([None if i % 7 == 0 else words[i % 5] + str(i) for i in range(n)], pa.string()),
        "big": pa.array([words[i % 5] * (i % 3) for i in range(n)], pa.large_string()),
        "ints": pa.array([None if i % 9 == 3 else list(range(i % 5)) for i in range(n)], pa.list_(pa.int32())),
        "words": pa.array([[None if j == 1 else f"w{i}.{j}" for j in range(i % 4)] for i in range(n)], pa.list_(pa.string())),
        "cat": pa.array([None if i % 11 == 0 else ["cat", "dog", "bird"][i % 3] for i in range(n)]).dictionary_encode(),
    })


def ipc_rows(path) -> list[dict]:
    """What pyarrow's reader gives for each row (dictionaries as their
    values, as riffle delivers them), in file order."""
    try:
        t = pa.ipc.open_file(str(path)).read_all()
    except pa.ArrowInvalid:
        t = pa.ipc.open_stream(str(path)).read_all()
    return t.to_pylist()  # a dictionary column's values


def write_compressed(how: str, path, t: pa.Table) -> None:
    if how == "feather":  # the default compression of Feather v2 is LZ4
        import pyarrow.feather
        pyarrow.feather.write_feather(t, str(path), chunksize=90)
    elif how in ("zstd-file", "lz4-file"):
        opts = pa.ipc.IpcWriteOptions(compression=how.split("-")[0])
        with pa.ipc.new_file(str(path), t.schema, options=opts) as w:
            w.write_table(t, max_chunksize=70)
    elif how in ("zstd-stream", "lz4-stream"):
        opts = pa.ipc.IpcWriteOptions(compression=how.split("-")[0])
        with pa.ipc.new_stream(str(path), t.schema, options=opts) as w:
            w.write_table(t, max_chunksize=70)
    else:  # polars-lz4, polars-zstd (without the dictionary column: Polars writes a
        # categorical as dictionary<string_view>, which riffle does not read yet)
        polars.from_arrow(t.drop_columns(["cat"])).write_ipc(str(path), compression=how.split("-")[1], record_batch_size=80)


def ipc_batches(path) -> int:
    try:
        return pa.ipc.open_file(str(path)).num_record_batches
    except pa.ArrowInvalid:
        return sum(1 for _ in pa.ipc.open_stream(str(path)))


@pytest.mark.parametrize("how", ["feather", "zstd-file", "zstd-stream", "lz4-stream", "polars-lz4", "polars-zstd"])
def test_compressed_ipc_equals_pyarrow(daemon, tmp_path, how):
    import threading
    p = tmp_path / ("data.arrows" if how.endswith("stream") else "data.arrow")
    write_compressed(how, p, compressed_table(500))
    assert ipc_batches(p) >= 5
    want = ipc_rows(p)
    # The writer compressed it: its buffers are LZ4 or ZSTD frames.
    magic = bytes([0x28, 0xB5, 0x2F, 0xFD]) if "zstd" in how else bytes([0x04, 0x22, 0x4D, 0x18])
    assert p.read_bytes().count(magic) >= 5
    # One shuffled epoch, batches of 7 across record batches.
    schema, got = one_epoch(p)
    assert_rows_equal(got, want)
    # Loaders at once over the same file (batches of several sizes, the
    # default block order and a global shuffle), each row as pyarrow reads it.
    errors: list[BaseException] = []

    def read(bs: int, sampler: str | None, seed: int) -> None:
        try:
            seen = []
            for b in riffle.Loader(str(p), batch_size=bs, seed=seed, sampler=sampler):
                for rid, row in zip(b.ids.tolist(), b.data.to_pylist()):
                    assert row == want[rid], f"row {rid} (batch size {bs})"
                    seen.append(rid)
            assert sorted(seen) == list(range(len(want)))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    ts = [threading.Thread(target=read, args=a) for a in [(64, None, 1), (33, "global", 2), (100, None, 3), (7, "global", 4)]]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors


def test_corrupt_compressed_ipc_names_file_and_offset(daemon, tmp_path):
    p = tmp_path / "bad.arrow"
    write_compressed("zstd-file", p, compressed_table(200))
    b = bytearray(p.read_bytes())
    # The first ZSTD frame (magic 28 b5 2f fd), its magic damaged: the error
    # names the file and where the buffer starts (its length prefix).
    at = b.find(bytes([0x28, 0xB5, 0x2F, 0xFD]))
    assert at > 8
    b[at:at + 4] = b"\0\0\0\0"
    p.write_bytes(bytes(b))
    msg = refused(p, "bad.arrow", "ZSTD", "corrupt")
    assert f"offset {at - 8}" in msg, msg
