"""Arrow IPC files (file and stream format) written by pyarrow, read back
through a real daemon in a shuffled order: every row equals what pyarrow
reads for it, zero-copy as a RecordBatch and with numpy alone; bad files
are errors naming the file and offset."""

from __future__ import annotations

import datetime
import decimal
import random

import numpy as np
import pyarrow as pa
import pyarrow.ipc
import pytest

import riffle
from riffle import decode


def table(n: int, seed: int) -> pa.Table:
    r = random.Random(seed)

    def maybe(v):
        return None if r.random() < 0.15 else v

    words = ["", "a", "riffle", "shuffle", "ünïcode", "x" * 300]
    cols = {
        "id": pa.array(range(n), pa.int64()),
        "i8": pa.array([maybe(r.randint(-128, 127)) for _ in range(n)], pa.int8()),
        "u32": pa.array([maybe(r.randint(0, 2**32 - 1)) for _ in range(n)], pa.uint32()),
        "f16": pa.array([maybe(np.float16(r.random())) for _ in range(n)], pa.float16()),
        "f32": pa.array([maybe(r.random()) for _ in range(n)], pa.float32()),
        "f64": pa.array([r.gauss(0, 1) for _ in range(n)], pa.float64()),
        "flag": pa.array([maybe(r.random() < 0.5) for _ in range(n)], pa.bool_()),
        "text": pa.array([maybe(r.choice(words)) for _ in range(n)], pa.string()),
        "big": pa.array([r.choice(words) + str(i) for i in range(n)], pa.large_string()),
        "blob": pa.array([maybe(bytes(r.randrange(256) for _ in range(r.randint(0, 40)))) for _ in range(n)], pa.binary()),
        "fsb": pa.array([maybe(bytes([i % 256, 1, 2])) for i in range(n)], pa.binary(3)),
        "day": pa.array([maybe(datetime.date(2000, 1, 1) + datetime.timedelta(days=r.randint(0, 9000))) for _ in range(n)], pa.date32()),
        "ts": pa.array([datetime.datetime(2020, 1, 1) + datetime.timedelta(seconds=r.randint(0, 10**8)) for _ in range(n)], pa.timestamp("us")),
        "dur": pa.array([maybe(r.randint(0, 10**9)) for _ in range(n)], pa.duration("ms")),
        "dec": pa.array([maybe(decimal.Decimal(r.randint(-10**9, 10**9)) / 1000) for _ in range(n)], pa.decimal128(20, 3)),
        "ints": pa.array([maybe([maybe(r.randint(-5, 5)) for _ in range(r.randint(0, 5))]) for _ in range(n)], pa.list_(pa.int32())),
        "floats": pa.array([[r.random() for _ in range(r.randint(0, 4))] for _ in range(n)], pa.large_list(pa.float64())),
        "words": pa.array([maybe([maybe(r.choice(words)) for _ in range(r.randint(0, 3))]) for _ in range(n)], pa.list_(pa.string())),
        "nested": pa.array([maybe([[r.randint(0, 9) for _ in range(r.randint(0, 3))] for _ in range(r.randint(0, 3))]) for _ in range(n)],
                           pa.list_(pa.list_(pa.int64()))),
        "vec": pa.array([maybe([r.random() for _ in range(3)]) for _ in range(n)], pa.list_(pa.float32(), 3)),
        "rec": pa.array([maybe({"a": maybe(r.randint(0, 100)), "b": maybe(r.choice(words))}) for _ in range(n)],
                        pa.struct([("a", pa.int32()), ("b", pa.string())])),
        "kv": pa.array([maybe([(r.choice(words) + "k", r.randint(0, 9)) for _ in range(r.randint(0, 3))]) for _ in range(n)],
                       pa.map_(pa.string(), pa.int32())),
        "cat": pa.array([maybe(r.choice(["cat", "dog", "bird"])) for _ in range(n)], pa.string()).dictionary_encode(),
        "nothing": pa.nulls(n),
    }
    return pa.table(cols)


@pytest.fixture(scope="module")
def arrow_files(tmp_path_factory):
    """The same table as an IPC file and an IPC stream, in record batches of
    uneven sizes, an empty one among them, sharing one dictionary."""
    d = tmp_path_factory.mktemp("arrow")
    t = table(500, 1)
    whole = t.combine_chunks().to_batches(max_chunksize=10**9)[0]
    files = []
    for stream in (False, True):
        p = d / ("s.arrows" if stream else "f.arrow")
        opener = pa.ipc.new_stream if stream else pa.ipc.new_file
        with pa.OSFile(str(p), "wb") as f, opener(f, t.schema) as w:
            at = 0
            for size in [120, 0, 7, 300, 73]:
                w.write_batch(whole.slice(at, size))
                at += size
        files.append(p)
    return files, t


def pyarrow_rows(path) -> list[dict]:
    """What pyarrow's own reader gives for each row, in file order."""
    with pa.memory_map(str(path)) as src:
        try:
            tab = pa.ipc.open_file(src).read_all()
        except pa.ArrowInvalid:
            src.seek(0)
            tab = pa.ipc.open_stream(src).read_all()
    tab = tab.cast(pa.schema([f.with_type(f.type.value_type) if pa.types.is_dictionary(f.type) else f for f in tab.schema]))
    return tab.to_pylist()


@pytest.mark.parametrize("which", [0, 1], ids=["file", "stream"])
def test_every_row_equals_pyarrow(daemon, arrow_files, which):
    files, _ = arrow_files
    want = pyarrow_rows(files[which])
    ld = riffle.Loader(str(files[which]), batch_size=64, seed=3)
    seen = []
    for b in ld:
        rb = b.data
        assert isinstance(rb, pa.RecordBatch)
        got = rb.to_pylist()
        for i, rid in enumerate(b.ids.tolist()):
            assert got[i] == want[rid], f"row {rid}"
        seen += b.ids.tolist()
    assert sorted(seen) == list(range(len(want)))
    assert seen != sorted(seen), "not shuffled"


def test_record_batch_is_zero_copy(daemon, arrow_files):
    files, _ = arrow_files
    b = next(iter(riffle.Loader(str(files[0]), batch_size=64, seed=1, columns=["f64"])))
    rb = decode.record_batch(b)
    buf = rb.column(0).buffers()[1]
    start = b.raw.__array_interface__["data"][0]
    assert start <= buf.address < start + len(b.raw), "the column's data is not in the batch's shared memory"


def plain(x):
    """numpy values as the Python values pyarrow's to_pylist gives."""
    if isinstance(x, np.ma.MaskedArray):
        return [None if m else plain(v) for v, m in zip(x.data, np.ma.getmaskarray(x))]
    if isinstance(x, np.ndarray):
        return [plain(v) for v in x]
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, list):
        return [plain(v) for v in x]
    if isinstance(x, dict):
        return {k: plain(v) for k, v in x.items()}
    return x


def test_numpy_path_equals_pyarrow(daemon, arrow_files):
    """Without pyarrow: decode.columns reads the same values."""
    files, _ = arrow_files
    want = pyarrow_rows(files[1])
    for b in riffle.Loader(str(files[1]), batch_size=100, seed=5):
        cols = {k: plain(v) for k, v in decode.columns(b).items()}
        for i, rid in enumerate(b.ids.tolist()):
            for name, col in cols.items():
                g, w = col[i], want[rid][name]
                if g is None or w is None:
                    assert g is None and w is None, f"{name} row {rid}: {g!r} != {w!r}"
                elif name == "dec":  # 16 raw bytes: the unscaled integer
                    assert decimal.Decimal(int.from_bytes(g, "little", signed=True)).scaleb(-3) == w
                elif name == "kv":
                    assert [(e["key"], e["value"]) for e in g] == w
                elif name in ("f16", "f32", "vec"):
                    assert g == pytest.approx(w, rel=1e-3)
                else:
                    assert g == w, f"{name} row {rid}: {g!r} != {w!r}"


def test_columns_read_only_what_is_asked(daemon, arrow_files):
    files, _ = arrow_files
    full = riffle.Loader(str(files[0]), batch_size=500, seed=1)
    small = riffle.Loader(str(files[0]), batch_size=500, seed=1, columns=["id", "i8"])
    b = next(iter(small))
    assert b.data.schema.names == ["id", "i8"]
    assert len(b.raw) < len(next(iter(full)).raw) / 10
    with pytest.raises(riffle.RiffleError, match='no column "nope"'):
        next(iter(riffle.Loader(str(files[0]), batch_size=10, columns=["nope"])))


def test_truncated_stream_names_file_and_offset(daemon, arrow_files, tmp_path):
    files, _ = arrow_files
    data = files[1].read_bytes()
    cut = tmp_path / "cut.arrows"
    cut.write_bytes(data[: len(data) * 2 // 3])
    with pytest.raises(riffle.RiffleError) as e:
        next(iter(riffle.Loader(str(cut), batch_size=10)))
    assert "cut.arrows" in str(e.value) and "offset" in str(e.value), str(e.value)


def test_corrupt_footer_names_file_and_offset(daemon, arrow_files, tmp_path):
    files, _ = arrow_files
    data = bytearray(files[0].read_bytes())
    n = int.from_bytes(data[-10:-6], "little")
    for i in range(len(data) - 10 - n, len(data) - 10):
        data[i] ^= 0x5A
    bad = tmp_path / "bad.arrow"
    bad.write_bytes(bytes(data))
    with pytest.raises(riffle.RiffleError) as e:
        next(iter(riffle.Loader(str(bad), batch_size=10)))
    assert "bad.arrow" in str(e.value) and "offset" in str(e.value), str(e.value)


def test_torch_gets_tensors_of_numeric_columns(daemon, arrow_files):
    import torch

    import riffle.torch as rt

    files, _ = arrow_files
    dl = rt.loader(str(files[0]), 50, columns=["id", "f64", "vec", "text"], num_workers=0)
    b = next(iter(dl))
    assert isinstance(b["id"], torch.Tensor) and b["id"].dtype == torch.int64 and len(b["id"]) == 50
    assert isinstance(b["f64"], torch.Tensor)
    assert isinstance(b["text"], list)


def test_compressed_file_reads_as_it_is_and_converted(daemon, tmp_path, bin_path):
    import subprocess
    t = table(300, 9)
    src = tmp_path / "z.arrow"
    with pa.OSFile(str(src), "wb") as f, pa.ipc.new_file(f, t.schema, options=pa.ipc.IpcWriteOptions(compression="zstd")) as w:
        w.write_table(t, max_chunksize=70)
    dst = tmp_path / "plain.arrow"
    subprocess.run([bin_path, "convert", str(src), "--out", str(dst)], check=True, capture_output=True)
    want = pyarrow_rows(src)
    for path in (src, dst):
        seen = []
        for b in riffle.Loader(str(path), batch_size=64, seed=2, sampler="global"):
            for i, rid in enumerate(b.ids.tolist()):
                assert b.data.to_pylist()[i] == want[rid]
                seen.append(rid)
        assert sorted(seen) == list(range(300))
