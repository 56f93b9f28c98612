"""Datasets of rows (Parquet, Arrow IPC, Hugging Face save_to_disk) with
share=True: jobs on one dataset sample dependently (one group), each
reads every row once per epoch equal to pyarrow's reading of it, and the
pages (compressed record batches) their rows lie in are read and decoded
once for all of them."""

from __future__ import annotations

import threading

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
feather = pytest.importorskip("pyarrow.feather")

import riffle

from conftest import Daemon, status

N = 6000


def table(n: int = N):
    rng = np.random.default_rng(5)
    return pa.table({
        "id": pa.array(range(n), pa.int64()),
        "payload": pa.array([rng.bytes(int(rng.integers(20, 200))) for _ in range(n)], pa.binary()),
        "text": pa.array([f"row {i}" if i % 7 else None for i in range(n)]),
        "label": pa.array([i % 10 for i in range(n)], pa.int32()),
    })


def write(kind: str, d):
    """A dataset of table()'s rows written by the real writer, and pyarrow's reading of it."""
    t = table()
    if kind == "parquet":
        # Several row groups of small pages (pyarrow starts a page every
        # write_batch_size values at most).
        p = d / "t.parquet"
        pq.write_table(t, p, row_group_size=1000, data_page_size=2048, write_batch_size=64)
        return p, pq.read_table(p)
    if kind == "feather-lz4":
        p = d / "t.arrow"
        feather.write_feather(t, p, chunksize=250)  # Feather v2's default: LZ4 buffers
        return p, feather.read_table(p)
    if kind == "arrow":
        p = d / "u.arrow"
        feather.write_feather(t, p, compression="uncompressed", chunksize=700)
        return p, feather.read_table(p)
    if kind == "hf":
        import datasets
        p = d / "hf"
        datasets.Dataset(t).save_to_disk(str(p), num_shards=3)
        return p, datasets.load_from_disk(str(p)).data.table
    raise ValueError(kind)


def run_together(paths, sock: str, jobs: int, epochs: int, batch_size: int = 64, **kw):
    """jobs loaders sharing paths, taking their batches at one pace (each its
    batch k, then waits for the others) over epochs epochs: per job, each
    epoch's rows by id. The group is checked while they run."""
    loaders = [riffle.Loader(str(paths), batch_size=batch_size, seed=k + 1, share=True, sampler="global",
                             socket=sock, autostart=False, **kw) for k in range(jobs)]
    for ld in loaders:
        assert ld.info()["shared"], "a job of rows with share=True is not shared"
    step = threading.Barrier(jobs, timeout=120)
    out = [[{} for _ in range(epochs)] for _ in range(jobs)]
    errors = []
    groups = []

    def run(k: int):
        try:
            for e in range(epochs):
                for b in loaders[k]:
                    for rid, row in zip(b.ids.tolist(), b.data.to_pylist()):
                        assert rid not in out[k][e], f"job {k}: row {rid} twice in epoch {e}"
                        out[k][e][rid] = row
                    if k == 0 and not groups:
                        groups.append(status(sock)["groups"])
                    step.wait()
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)
            step.abort()

    threads = [threading.Thread(target=run, args=(k,)) for k in range(jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for ld in loaders:
        ld.close()
    if errors:
        raise errors[0]
    assert max(len(g["jobs"]) for g in groups[0]) == jobs, f"not one group of {jobs} jobs: {groups[0]}"
    return out


def check_rows(out, want):
    for k, epochs in enumerate(out):
        for e, rows in enumerate(epochs):
            assert sorted(rows) == list(range(len(want))), f"job {k} epoch {e}: not every row once"
            for rid, row in rows.items():
                assert row == want[rid], f"job {k} epoch {e} row {rid}: {row} != {want[rid]}"


@pytest.fixture
def own_daemon(tmp_path):
    """A daemon of the test's own, whose traffic is the test's."""
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    d = Daemon(str(run / "riffle.sock"))
    yield d
    d.stop()


@pytest.mark.parametrize("kind", ["parquet", "feather-lz4"])
def test_shared_jobs_read_each_block_once(own_daemon, tmp_path, kind):
    """Three jobs sharing a Parquet file of several row groups and small
    pages (a Feather file of LZ4 record batches) at one pace: each reads
    every row once per epoch, equal to pyarrow's reading of the file, and
    the file is read from storage about once for all three jobs and both
    epochs: each page (record batch) once, decoded once into the dataset's
    cache of decoded blocks, which they share."""
    p, t = write(kind, tmp_path)
    want = t.to_pylist()
    out = run_together(p, own_daemon.sock, jobs=3, epochs=2)
    check_rows(out, want)
    st = status(own_daemon.sock)
    ratio = st["read_bytes"] / p.stat().st_size
    served = st["served_bytes"] / p.stat().st_size
    print(f"{kind}: 3 shared jobs x 2 epochs read {ratio:.2f}x the file, served {served:.1f}x")
    assert ratio <= 1.1, f"read {st['read_bytes']} bytes of a file of {p.stat().st_size}"


@pytest.mark.parametrize("kind", ["arrow", "hf"])
def test_shared_jobs_of_arrow_rows(own_daemon, tmp_path, kind):
    """Uncompressed Arrow rows (a Feather file, a Hugging Face directory)
    shared by two jobs: one group, each row once per epoch, equal to
    pyarrow's (datasets') reading of it."""
    p, t = write(kind, tmp_path)
    out = run_together(p, own_daemon.sock, jobs=2, epochs=2, batch_size=100)
    check_rows(out, t.to_pylist())
    assert status(own_daemon.sock)["cache"]["items"] == 0, "record items left in the cache by jobs of rows"


def test_share_of_rows_with_a_subset_and_ranks(daemon, tmp_path):
    """Ranks of shared jobs over a subset of a Parquet file's rows: each
    rank's part comes once per epoch, the parts are the subset, every row
    equal to pyarrow's."""
    p, t = write("parquet", tmp_path)
    want = t.to_pylist()
    sub = list(range(100, 4100))
    seen = {}
    for rank in range(2):
        ld = riffle.Loader(str(p), batch_size=50, seed=3, share=True, sampler="global", rank=rank, world_size=2,
                           subset={"ranges": [[100, 4100]]})
        assert ld.info()["shared"]
        got = []
        for b in ld:
            for rid, row in zip(b.ids.tolist(), b.data.to_pylist()):
                assert row == want[rid]
                got.append(rid)
        assert len(got) == len(set(got)) == len(sub) // 2
        seen[rank] = set(got)
    assert seen[0] | seen[1] == set(sub) and not seen[0] & seen[1]
