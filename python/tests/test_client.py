"""The Python client against a real daemon: exactly-once, bytes, formats,
resuming, held batches, errors."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import riffle
from riffle import decode

from conftest import record, write_fixed


def epoch_ids(loader) -> list[int]:
    ids: list[int] = []
    for b in loader:
        ids += b.ids.tolist()
    return ids


def test_exactly_once_every_epoch(daemon, fixed_file):
    ld = riffle.Loader(fixed_file, batch_size=64, record_size=64, seed=3)
    orders = []
    for e in range(3):
        ids = epoch_ids(ld)
        assert sorted(ids) == list(range(1000)), f"epoch {e}"
        orders.append(ids)
    assert ld.epoch == 3
    assert orders[0] != orders[1] != orders[2]


def test_same_seed_same_batches(daemon, fixed_file):
    a = [sorted(b.ids.tolist()) for b in riffle.Loader(fixed_file, batch_size=100, record_size=64, seed=9)]
    b = [sorted(b.ids.tolist()) for b in riffle.Loader(fixed_file, batch_size=100, record_size=64, seed=9)]
    c = [sorted(b.ids.tolist()) for b in riffle.Loader(fixed_file, batch_size=100, record_size=64, seed=10)]
    assert a == b
    assert a != c


def test_batch_bytes_are_the_files_bytes(daemon, fixed_file):
    data = fixed_file.read_bytes()
    for b in riffle.Loader(fixed_file, batch_size=128, record_size=64, seed=1):
        arr = decode.fixed(b)
        assert arr.shape == (b.n, 64)
        for i, rid in enumerate(b.ids):
            assert arr[i].tobytes() == data[rid * 64 : (rid + 1) * 64]


def test_fixed_is_a_view_of_shared_memory(daemon, tmp_path):
    # Records that touch in the file share a read and land together. In the
    # batch's own order (unordered, the default when shuffling) the daemon
    # delivers them as they lie: every batch is one array in shared memory.
    # Kept in the sampler's order (ordered=True), a batch with touching
    # records is not laid out in that order: decode.fixed gathers it (one copy).
    p = write_fixed(tmp_path / "r.bin", 20000, 64)
    for ordered in (False, True):
        packed = gathered = touched = 0
        for b in riffle.Loader(p, batch_size=128, record_size=64, seed=3, ordered=ordered):
            arr = decode.fixed(b, np.uint64, (8,))
            assert (arr[:, 0] == b.ids).all()
            touching = len(set(b.ids.tolist()) & set((b.ids + 1).tolist())) > 0
            touched += touching
            if not (ordered and touching):
                assert b.packed
            if b.packed:
                assert arr.ctypes.data == b.raw.ctypes.data, "decode.fixed copied a packed batch"
                packed += 1
            else:
                gathered += 1
        assert packed > 0 and touched > 0 and (gathered > 0) == ordered


def test_sequential_order(daemon, fixed_file):
    ld = riffle.Loader(fixed_file, batch_size=100, record_size=64, shuffle=False, ordered=True)
    assert epoch_ids(ld) == list(range(1000))


def test_drop_last_and_len(daemon, fixed_file):
    ld = riffle.Loader(fixed_file, batch_size=300, record_size=64, drop_last=True)
    assert len(ld) == 3
    assert len(epoch_ids(ld)) == 900


def test_jsonl(daemon, tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_text("".join(json.dumps({"id": i, "text": "x" * (i % 17)}) + "\n" for i in range(333)))
    seen = []
    for b in riffle.Loader(p, batch_size=50, seed=2):
        for i, obj in enumerate(decode.jsonl(b)):
            assert obj["id"] == b.ids[i]
            seen.append(obj["id"])
    assert sorted(seen) == list(range(333))


def test_libsvm_csr_and_dense(daemon, tmp_path):
    p = tmp_path / "d.svm"
    lines = [f"{i % 2} {i % 5 + 1}:{i}.5 {i % 5 + 7}:1" for i in range(200)]
    p.write_text("\n".join(lines) + "\n")
    for b in riffle.Loader(p, batch_size=64, seed=1):
        y, (indptr, ind, val) = decode.libsvm(b)
        ydense, x = decode.libsvm(b, n_features=12, dense=True)
        for i, rid in enumerate(b.ids):
            assert y[i] == rid % 2 == ydense[i]
            assert ind[indptr[i] : indptr[i + 1]].tolist() == [rid % 5, rid % 5 + 6]
            assert val[indptr[i]] == pytest.approx(rid + 0.5)
            assert x[i, rid % 5] == pytest.approx(rid + 0.5) and x[i, rid % 5 + 6] == 1


def test_malformed_libsvm_line_names_the_record(daemon, tmp_path):
    p = tmp_path / "bad.svm"
    p.write_text("1 1:2\n0 x:y\n")
    b = next(iter(riffle.Loader(p, batch_size=2, shuffle=False, ordered=True)))
    with pytest.raises(decode.DecodeError, match="record 1"):
        decode.libsvm(b)


def test_npy_rows(daemon, tmp_path):
    arr = np.arange(50 * 6, dtype=np.float32).reshape(50, 2, 3)
    p = tmp_path / "a.npy"
    np.save(p, arr)
    ld = riffle.Loader(p, batch_size=16, seed=4)
    assert ld.info()["dtype"] == "<f4" and ld.info()["shape"] == [2, 3]
    for b in ld:
        rows = decode.npy(b)
        assert rows.shape == (b.n, 2, 3)
        np.testing.assert_array_equal(rows, arr[b.ids])


def test_image_folder_labels(daemon, tmp_path):
    root = tmp_path / "tree"
    for c, name in enumerate(["dog", "cat"]):
        (root / name).mkdir(parents=True)
        for i in range(5):
            (root / name / f"{i}.jpg").write_bytes(f"{name}-{i}".encode())
    ld = riffle.Loader(root, batch_size=4, seed=1)
    assert ld.info()["classes"] == ["cat", "dog"]
    n = 0
    for b in ld:
        for i in range(b.n):
            name = bytes(b.record(i)).decode().split("-")[0]
            assert ["cat", "dog"][b.labels[i]] == name
            n += 1
    assert n == 10


def test_resume_from_state_dict(daemon, fixed_file):
    whole = [b.ids.tolist() for b in riffle.Loader(fixed_file, batch_size=64, record_size=64, seed=5, ordered=True)]
    ld = riffle.Loader(fixed_file, batch_size=64, record_size=64, seed=5, ordered=True)
    it = iter(ld)
    first = [next(it).ids.tolist() for _ in range(6)]
    state = ld.state_dict()
    it.close()
    assert state == {"epoch": 0, "batch": 6, "seed": 5, "world": 1, "position": 6 * 64, "dataset": ld._version,
                     "ordering": ld.ordering}
    again = riffle.Loader(fixed_file, batch_size=64, record_size=64, seed=5, ordered=True)
    again.load_state_dict(state)
    rest = [b.ids.tolist() for b in again]
    assert first + rest == whole
    with pytest.raises(riffle.RiffleError, match="seed"):
        riffle.Loader(fixed_file, batch_size=64, record_size=64, seed=6).load_state_dict(state)


def test_held_batch_unchanged(daemon, tmp_path):
    p = write_fixed(tmp_path / "r.bin", 4000, 256)
    ld = riffle.Loader(p, batch_size=100, record_size=256, seed=1, memory=1 << 20, prefetch=2)
    it = iter(ld)
    held = next(it)
    arr = decode.fixed(held)
    snapshot = arr.copy()
    count = 0
    for b in it:  # 39 more batches through an arena of 2 MiB: regions are reused
        count += 1
    assert count == 39
    np.testing.assert_array_equal(arr, snapshot)
    for i, rid in enumerate(held.ids):
        assert arr[i].tobytes() == record(int(rid), 256)


def test_holding_all_memory_is_an_error_not_a_hang(daemon, tmp_path):
    p = write_fixed(tmp_path / "r.bin", 4000, 256)
    ld = riffle.Loader(p, batch_size=100, record_size=256, memory=100 * 256 * 3)
    kept = []
    with pytest.raises(riffle.RiffleError, match="still referenced"):
        for b in ld:
            kept.append(b)


def test_bad_input_names_file_and_offset(daemon, tmp_path):
    p = tmp_path / "odd.bin"
    p.write_bytes(b"\0" * 1000)
    with pytest.raises(riffle.RiffleError) as e:
        next(iter(riffle.Loader(p, batch_size=10, record_size=64)))
    assert e.value.path == str(p) and e.value.offset == 960
    assert "offset 960" in str(e.value)


def test_missing_file(daemon, tmp_path):
    # When the loader is built, as ImageFolder raises: a FileNotFoundError naming the path.
    with pytest.raises(FileNotFoundError, match="No such file") as e:
        riffle.Loader(tmp_path / "nope.bin", batch_size=10, record_size=64)
    assert isinstance(e.value, riffle.RiffleError) and e.value.filename == str(tmp_path / "nope.bin")
    # A glob that matches nothing, which only the daemon expands.
    with pytest.raises(FileNotFoundError, match="matches no file"):
        riffle.Loader(str(tmp_path / "*.nothing"), batch_size=10, record_size=64)


@pytest.mark.parametrize("bad", [0, -1, None, 2.5, True])
def test_bad_batch_size_is_a_value_error_at_once(daemon, fixed_file, bad):
    with pytest.raises(ValueError, match="batch_size should be a positive integer"):
        riffle.Loader(fixed_file, batch_size=bad, record_size=64)


def test_bad_option_is_a_value_error_at_once(daemon, fixed_file):
    # Checked by the daemon, in one place, when the loader is built: no batch is asked for.
    with pytest.raises(ValueError, match="sampler"):
        riffle.Loader(fixed_file, batch_size=10, record_size=64, sampler="bogus")
    with pytest.raises(ValueError, match="memory_bytes"):
        riffle.Loader(fixed_file, batch_size=10, record_size=64, memory=1)


def test_last_line_without_newline_is_a_record(daemon, tmp_path):
    # As sklearn, libsvm and every JSON-lines reader take it.
    p = tmp_path / "last.jsonl"
    p.write_bytes(b'{"a": 1}\n\n{"a": 2}')
    objs = [o for b in riffle.Loader(p, batch_size=10) for o in decode.jsonl(b)]
    assert sorted(o["a"] for o in objs) == [1, 2]


def test_batch_data_natural_types(daemon, fixed_file, tmp_path):
    b = next(iter(riffle.Loader(fixed_file, batch_size=10, record_size=64)))
    assert b.data.shape == (10, 64) and b.data.dtype == np.uint8
    b = next(iter(riffle.Loader(fixed_file, batch_size=10, record_size=64, dtype=np.uint64, shape=(2, 4))))
    assert b.data.shape == (10, 2, 4) and (b.data[:, 0, 0] == b.ids).all()
    arr = np.arange(40, dtype=np.int16).reshape(10, 4)
    np.save(tmp_path / "a.npy", arr)
    b = next(iter(riffle.Loader(tmp_path / "a.npy", batch_size=10)))
    np.testing.assert_array_equal(b.data, arr[b.ids])
    p = tmp_path / "t.txt"
    p.write_text("".join(f"line {i}\n" for i in range(5)))
    b = next(iter(riffle.Loader(p, batch_size=5)))
    assert sorted(bytes(m).decode() for m in b.data) == [f"line {i}" for i in range(5)]


@pytest.mark.parametrize("kw", [
    {"sampler": "block", "block_size": 1024},
    {"sampler": "block", "block_size": 1024, "window": 4},
    {"sampler": "buffered", "buffer": 50},
    {"sampler": "reservoir", "reservoir": 100},
    {"opportunistic": 3},
])
def test_cheaper_orders_exactly_once(daemon, fixed_file, kw):
    data = fixed_file.read_bytes()
    ld = riffle.Loader(fixed_file, batch_size=64, record_size=64, seed=2, **kw)
    for epoch in range(2):
        ids = []
        for b in ld:
            arr = b.data
            for i, rid in enumerate(b.ids):
                assert arr[i].tobytes() == data[rid * 64 : (rid + 1) * 64]
            ids += b.ids.tolist()
        assert sorted(ids) == list(range(1000)), f"epoch {epoch}"


def test_block_batches_hold_whole_blocks(daemon, fixed_file):
    # 64-byte records in 4 KiB blocks (a block never ends inside a page, so a
    # smaller block size would give the same): 64 consecutive records per
    # block, so a batch of 64 spans at most two blocks.
    for b in riffle.Loader(fixed_file, batch_size=64, record_size=64, sampler="block", block_size=4096):
        blocks = {int(i) // 64 for i in b.ids}
        assert len(blocks) <= 2, f"batch {b.index} touches {len(blocks)} blocks"


def test_unknown_sampler(daemon, fixed_file):
    with pytest.raises(riffle.RiffleError, match='sampler "magic"'):
        next(iter(riffle.Loader(fixed_file, batch_size=8, record_size=64, sampler="magic")))


def test_block_sharded_keeps_blocks_whole(daemon, fixed_file):
    parts = []
    for rank in range(2):
        ids = []
        for b in riffle.Loader(fixed_file, batch_size=64, record_size=64, sampler="block", block_size=4096,
                               rank=rank, world_size=2):
            assert len({int(i) // 64 for i in b.ids}) <= 2, "a rank's batch scatters blocks"
            ids += b.ids.tolist()
        parts.append(ids)
    assert len(parts[0]) == len(parts[1])
    assert set(parts[0]) | set(parts[1]) == set(range(1000))
    # Runs of a batch of each global batch, the last (partial) one split in
    # halves: 500 records each, none twice (DistributedSampler pads 1000
    # records over 2 ranks with none).
    assert len(parts[0]) + len(parts[1]) == 1000
    assert not set(parts[0]) & set(parts[1])
