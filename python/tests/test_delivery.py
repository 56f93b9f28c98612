"""How batches reach the user: packed in shared memory, and lent by
DataLoader workers to the main process without a copy. Every record's
bytes are compared with a solo read of the file, every epoch holds each
record once, and batches the user holds stay as they were."""

from __future__ import annotations

import gc

import numpy as np
import pytest
import torch

import riffle
import riffle.torch as rt

from conftest import record, write_fixed

N, SIZE = 4096, 512  # batches of 256 of 4096 records hold many neighbours: runs read by one read


def check_rows(t: torch.Tensor, data: bytes) -> list[int]:
    """The ids of a batch tensor's rows, each row checked against the file's bytes of its record."""
    a = t.numpy()
    ids = a[:, :8].copy().view("<u8").ravel().tolist()
    for row, rid in zip(a, ids):
        assert row.tobytes() == data[rid * SIZE : (rid + 1) * SIZE], f"record {rid}"
    return ids


@pytest.fixture
def records(tmp_path):
    return write_fixed(tmp_path / "r.bin", N, SIZE)


def test_unordered_fixed_batches_are_packed(daemon, records):
    # A run of neighbours read by one read is delivered where it lies: every
    # batch of a shuffle over fixed-size records is one array, no gather.
    data = records.read_bytes()
    ld = riffle.Loader(str(records), 256, record_size=SIZE, seed=3)
    seen = []
    for b in ld:
        assert b.packed, f"batch {b.index} is not packed: offsets {b.offs[:8]}..."
        arr = riffle.decode.fixed(b)
        assert np.shares_memory(arr, b.raw)
        for k, rid in enumerate(b.ids.tolist()):
            assert arr[k].tobytes() == data[rid * SIZE : (rid + 1) * SIZE] == record(rid, SIZE)
        seen += b.ids.tolist()
    assert sorted(seen) == list(range(N))


def test_ordered_batches_keep_the_samplers_order(daemon, records):
    got = [i for b in riffle.Loader(str(records), 256, record_size=SIZE, shuffle=False) for i in b.ids.tolist()]
    assert got == list(range(N))


@pytest.mark.parametrize("workers", [0, 2])
def test_every_record_once_with_its_bytes(daemon, records, workers):
    data = records.read_bytes()
    dl = rt.loader(str(records), 256, record_size=SIZE, num_workers=workers, seed=5)
    for epoch in range(2):
        ids = [i for t in dl for i in check_rows(t, data)]
        assert sorted(ids) == list(range(N)), f"epoch {epoch}"


@pytest.mark.parametrize("persistent", [False, True])
def test_held_batches_from_workers_stay_valid(daemon, records, persistent):
    # Batches lent by workers are views of the workers' jobs' memory: held
    # through the epoch, after the workers' jobs move on (and, without
    # persistent workers, after the workers exit), they hold their bytes.
    data = records.read_bytes()
    dl = rt.loader(str(records), 256, record_size=SIZE, num_workers=2, persistent_workers=persistent, seed=9)
    held = list(dl)
    second = [t.clone() for t in dl]  # the next epoch, through the same memory
    del dl
    gc.collect()
    ids = [i for t in held for i in check_rows(t, data)]
    assert sorted(ids) == list(range(N))
    assert sorted(i for t in second for i in check_rows(t, data)) == list(range(N))


def test_lent_batches_go_back(daemon, records):
    # A job's memory holds 4 batches; the main process drops each batch
    # before the next: if the batches lent by the workers never went back
    # to the daemon, the workers would run out of memory in the first epoch.
    data = records.read_bytes()
    dl = rt.loader(str(records), 64, record_size=SIZE, num_workers=2, persistent_workers=True, seed=2,
                   memory=4 * 64 * SIZE)
    for epoch in range(3):
        ids = []
        for t in dl:
            ids += check_rows(t, data)
            del t
        assert sorted(ids) == list(range(N)), f"epoch {epoch}"


def test_views_and_labels_from_workers(daemon, tmp_path):
    # Labels travel with the lent batch; a slice of a batch keeps it alive.
    from PIL import Image
    root = tmp_path / "imgs"
    for c in range(3):
        (root / f"c{c}").mkdir(parents=True)
        for i in range(12):
            Image.new("RGB", (20, 16), (c * 80, i * 20, 7)).save(root / f"c{c}" / f"{i}.png")
    want = {}
    for x, y in rt.loader(str(root), 6, transform="image:size=16,crop=16", shuffle=False):
        for img, label in zip(x, y):
            want.setdefault(int(label), []).append(img.clone())
    got: dict[int, list] = {}
    parts = []
    for x, y in rt.loader(str(root), 6, transform="image:size=16,crop=16", num_workers=2, seed=4):
        assert x.shape == (6, 16, 16, 3) or x.shape[1:] == want[0][0].shape
        parts.append((x[1:3], y[1:3]))  # views of the lent batch
        for img, label in zip(x, y):
            got.setdefault(int(label), []).append(img.clone())
    gc.collect()
    assert sorted(got) == sorted(want) and all(len(got[k]) == len(want[k]) for k in want)
    for k in want:
        w = sorted(t.numpy().tobytes() for t in want[k])
        assert sorted(t.numpy().tobytes() for t in got[k]) == w
    for x, y in parts:
        for img, label in zip(x, y):
            assert img.numpy().tobytes() in {t.numpy().tobytes() for t in want[int(label)]}


def test_main_forgets_arenas_of_exited_workers(daemon, records):
    # Without persistent workers each epoch has new workers, and new jobs:
    # the main process keeps the mapping of the live workers' arenas only.
    dl = rt.loader(str(records), 256, record_size=SIZE, num_workers=2, seed=6)
    for _ in range(4):
        for t in dl:
            del t
    assert len(rt._borrowed) <= 2
