"""s3:// datasets through a real daemon and a real S3-compatible server
(versitygw on loopback, POSIX back end over a temporary directory): every
record once per epoch with the bytes of the object, the disk cache holding
the dataset from the second epoch on and across a daemon restart, a
missing or changed object an error naming it, and riffle.torch with
DataLoader workers."""

from __future__ import annotations

import os
import struct
import time

import pytest

import riffle
import riffle.torch as rt
from riffle import client

from conftest import Daemon, S3Server, record, status

REC = 4096


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    server = S3Server(tmp_path_factory.mktemp("s3"))
    (server.bucket / "fixed").mkdir()
    # Three objects of fixed-size records, written into the gateway's
    # back end (a bucket is a directory there).
    for k in range(3):
        with open(server.bucket / "fixed" / f"part-{k}.bin", "wb") as f:
            for i in range(k * 700, (k + 1) * 700):
                f.write(record(i, REC))
    yield {"root": server.root, "bucket": server.bucket, "env": server.env}
    server.stop()


@pytest.fixture
def s3_daemon(s3, tmp_path, monkeypatch):
    for k, v in s3["env"].items():
        monkeypatch.setenv(k, v)
    d = Daemon(str(tmp_path / "riffle.sock"), "--cache-dir", str(tmp_path / "blocks"), "--cache-dir-bytes", "64MiB")
    monkeypatch.setenv("RIFFLE_SOCKET", d.sock)
    yield d
    d.stop()


def epoch_ids(ld, first: int = 0) -> list[int]:
    """One epoch's ids, each record checked against the bytes written
    (record i of the dataset is record first+i of the objects)."""
    ids = []
    for b in ld:
        for i, rec in zip(b.ids.tolist(), b.data):
            assert bytes(rec) == record(first + i, REC), f"record {i} differs from the object's bytes"
            ids.append(i)
    return ids


def test_every_record_once_per_epoch_then_from_disk(s3_daemon):
    ld = riffle.Loader("s3://bkt/fixed/*.bin", 64, record_size=REC, seed=3)
    assert ld.info()["records"] == 2100
    first = epoch_ids(ld)
    assert sorted(first) == list(range(2100))
    after1 = status(s3_daemon.sock)
    assert after1["remote"]["bytes"] >= 2100 * REC
    second = epoch_ids(ld)
    assert sorted(second) == list(range(2100)) and second != first
    after2 = status(s3_daemon.sock)
    # The disk cache holds the whole dataset: epoch 2 takes at most 5% of
    # its bytes from the object store.
    assert after2["remote"]["bytes"] - after1["remote"]["bytes"] <= 0.05 * 2100 * REC
    assert after2["disk"]["hits"] > 0
    ld.close()


def test_disk_cache_survives_a_restart(s3, tmp_path, monkeypatch):
    for k, v in s3["env"].items():
        monkeypatch.setenv(k, v)
    blocks = str(tmp_path / "blocks")
    fetched = []
    for run in range(2):
        d = Daemon(str(tmp_path / f"r{run}.sock"), "--cache-dir", blocks, "--cache-dir-bytes", "64MiB")
        try:
            ld = riffle.Loader("s3://bkt/fixed/part-1.bin", 50, record_size=REC, seed=run, socket=d.sock)
            assert sorted(epoch_ids(ld, 700)) == list(range(700))
            fetched.append(status(d.sock).get("remote", {}).get("bytes", 0))
            ld.close()
        finally:
            d.stop()
    assert fetched[0] >= 700 * REC
    assert fetched[1] <= 0.05 * 700 * REC, fetched


def test_missing_object_names_it(s3_daemon):
    with pytest.raises(riffle.RiffleError, match="s3://bkt/nothing"):
        riffle.Loader("s3://bkt/nothing/*.bin", 8, record_size=REC).info()
    with pytest.raises(riffle.RiffleError, match="s3://bkt/fixed/absent.bin"):
        riffle.Loader("s3://bkt/fixed/absent.bin", 8, record_size=REC).info()


def test_replaced_object_is_an_error(s3, s3_daemon):
    path = s3["bucket"] / "fixed" / "changing.bin"
    with open(path, "wb") as f:
        for i in range(3000):
            f.write(record(i, REC))
    try:
        ld = riffle.Loader("s3://bkt/fixed/changing.bin", 16, record_size=REC, prefetch=1, depth=1)
        it = iter(ld)
        next(it)
        time.sleep(0.05)
        with open(path, "r+b") as f:  # replaced under the job
            f.write(b"x" * REC)
        os.utime(path, (time.time() + 5, time.time() + 5))
        with pytest.raises(riffle.RiffleError, match="changing.bin"):
            for _ in it:
                pass
        ld.close()
    finally:
        path.unlink()


def test_torch_workers_over_s3(s3_daemon):
    dl = rt.loader("s3://bkt/fixed/*.bin", 100, record_size=REC, num_workers=2, dtype="uint8")
    seen = []
    for x in dl:
        data = x[0] if isinstance(x, (tuple, list)) else x
        for row in data:
            seen.append(struct.unpack("<Q", bytes(row[:8].numpy()))[0])
    assert sorted(seen) == list(range(2100))
