"""Writes one peer's native format from the source file of fixed-size
records (each starting with its id), with that peer's own writer, in that
peer's environment:

    python write.py FORMAT SRC RECORD_SIZE OUT_DIR [SHARDS]

FORMAT: tfrecord (tf.io.TFRecordWriter), arrow (datasets' save_to_disk),
tar (WebDataset shards, tarfile), mds (Mosaic's MDSWriter), arrayrecord
(ArrayRecordWriter, Grain's random-access format), parquet (pyarrow, for
Ray Data), jpeg-* read the JPEG directory as is."""

from __future__ import annotations

import io
import os
import sys
import tarfile
from pathlib import Path


def jpegs(src: str) -> list[str]:
    """The files of an ImageFolder directory, in a stable order."""
    return sorted(str(p) for p in Path(src).rglob("*") if p.is_file())


def count(src: str, size: int) -> int:
    return len(jpegs(src)) if os.path.isdir(src) else os.path.getsize(src) // size


def records(src: str, size: int, lo: int = 0, hi: int | None = None):
    """Records lo..hi of the source: fixed-size records of a file, or the
    files of a JPEG directory (each file's bytes one record)."""
    hi = count(src, size) if hi is None else hi
    if os.path.isdir(src):
        for f in jpegs(src)[lo:hi]:
            with open(f, "rb") as fh:
                yield fh.read()
        return
    with open(src, "rb") as f:
        f.seek(lo * size)
        for _ in range(lo, hi):
            yield f.read(size)


def shards(n: int, k: int):
    per = -(-n // k)
    return [(i * per, min(n, (i + 1) * per)) for i in range(k) if i * per < n]


def main() -> None:
    fmt, src, size, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), Path(sys.argv[4])
    k = int(sys.argv[5]) if len(sys.argv) > 5 else 16
    n = count(src, size)
    tmp = out.with_name(out.name + ".tmp")
    if tmp.exists():
        import shutil
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    if fmt == "tfrecord":
        import tensorflow as tf
        for i, (lo, hi) in enumerate(shards(n, k)):
            with tf.io.TFRecordWriter(str(tmp / f"part-{i:03d}.tfrecord")) as w:
                for r in records(src, size, lo, hi):
                    w.write(r)
    elif fmt == "arrow":
        import datasets
        feats = datasets.Features({"data": datasets.Value("binary")})
        ds = datasets.Dataset.from_generator(lambda: ({"data": r} for r in records(src, size)), features=feats,
                                             cache_dir=str(tmp / "cache"))
        ds.save_to_disk(str(tmp / "ds"), num_shards=k)
        import shutil
        shutil.rmtree(tmp / "cache", ignore_errors=True)
    elif fmt == "tar":
        for i, (lo, hi) in enumerate(shards(n, k)):
            with tarfile.open(tmp / f"part-{i:03d}.tar", "w") as t:
                for j, r in enumerate(records(src, size, lo, hi), lo):
                    ti = tarfile.TarInfo(f"{j:010d}.bin")
                    ti.size = len(r)
                    t.addfile(ti, io.BytesIO(r))
    elif fmt == "mds":
        from streaming import MDSWriter
        with MDSWriter(out=str(tmp), columns={"data": "bytes"}, size_limit=64 << 20) as w:
            for r in records(src, size):
                w.write({"data": r})
    elif fmt == "arrayrecord":
        from array_record.python.array_record_module import ArrayRecordWriter
        for i, (lo, hi) in enumerate(shards(n, k)):
            w = ArrayRecordWriter(str(tmp / f"part-{i:03d}.array_record"), "group_size:1")
            for r in records(src, size, lo, hi):
                w.write(r)
            w.close()
    elif fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq
        for i, (lo, hi) in enumerate(shards(n, k)):
            t = pa.table({"data": pa.array(list(records(src, size, lo, hi)), pa.binary())})
            pq.write_table(t, tmp / f"part-{i:03d}.parquet", row_group_size=max(1, (1 << 20) // max(size, 1 << 17)))
    else:
        raise SystemExit(f"unknown format {fmt}")
    os.sync()
    if out.exists():
        import shutil
        shutil.rmtree(out)
    tmp.rename(out)


if __name__ == "__main__":
    main()
