"""riffle.torch with real PyTorch: tensors, DataLoader workers, transforms,
and DDP sharding across two processes with gloo on loopback."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

import riffle
import riffle.torch as rt

from conftest import REPO, record, write_fixed


def test_tensors_hold_the_files_bytes(daemon, fixed_file):
    data = fixed_file.read_bytes()
    ds = rt.RiffleDataset(str(fixed_file), 100, record_size=64, seed=1)
    seen = []
    for t in torch.utils.data.DataLoader(ds, batch_size=None):
        assert t.dtype == torch.uint8 and t.shape[1] == 64
        ids = t[:, :8].contiguous().view(torch.int64).flatten().tolist()
        for row, rid in zip(t, ids):
            assert row.numpy().tobytes() == data[rid * 64 : (rid + 1) * 64]
        seen += ids
    assert sorted(seen) == list(range(1000))


def test_dtype_shape_and_no_copy(daemon, tmp_path):
    path = write_fixed(tmp_path / "r.bin", 20000, 64)
    captured = {}

    def keep(batch):
        arr = riffle.decode.fixed(batch, np.int64, (8,))
        captured["raw"], captured["packed"] = batch.raw.ctypes.data, batch.packed
        return torch.from_numpy(arr)

    for t in rt.RiffleDataset(str(path), 100, record_size=64, decode=keep, seed=1):
        if captured["packed"]:
            assert t.data_ptr() == captured["raw"], "the tensor is a copy of the shared batch"
            break
    else:
        raise AssertionError("no batch was packed")
    t2 = next(iter(rt.RiffleDataset(str(path), 100, record_size=64, dtype=np.int64, shape=(8,))))
    assert t2.shape == (100, 8) and t2.dtype == torch.int64


@pytest.mark.parametrize("workers", [0, 2])
def test_dataloader_workers_exactly_once(daemon, fixed_file, workers):
    dl = rt.loader(str(fixed_file), 64, record_size=64, dtype=np.int64, shape=(8,), num_workers=workers, seed=7)
    for epoch in range(2):
        dl.dataset.set_epoch(epoch)
        ids = [int(i) for t in dl for i in t[:, 0]]
        assert sorted(ids) == list(range(1000)), f"epoch {epoch}"


def test_set_epoch_changes_the_order(daemon, fixed_file):
    ds = rt.RiffleDataset(str(fixed_file), 1000, record_size=64, dtype=np.int64, shape=(8,), ordered=True)
    ds.set_epoch(0)
    a = next(iter(ds))[:, 0].tolist()
    ds.set_epoch(1)
    b = next(iter(ds))[:, 0].tolist()
    ds.set_epoch(0)
    c = next(iter(ds))[:, 0].tolist()
    assert a != b and a == c


def test_transforms(daemon, fixed_file):
    ds = rt.RiffleDataset(str(fixed_file), 50, record_size=64, dtype=np.int64, shape=(8,),
                          transform=lambda x: x[0] * 2, batch_transform=lambda t: t + 1)
    t = next(iter(ds))
    assert t.shape == (50,)
    assert ((t - 1) % 2 == 0).all()


def test_labels_from_image_folder(daemon, tmp_path):
    for name in ["a", "b"]:
        (tmp_path / name).mkdir()
        for i in range(3):
            (tmp_path / name / f"{i}").write_bytes(name.encode())
    data, labels = next(iter(rt.RiffleDataset(str(tmp_path), 6)))
    assert [bytes([ord("a") + int(l)]) for l in labels] == data


def test_state_dict_resume(daemon, fixed_file):
    ds = rt.RiffleDataset(str(fixed_file), 100, record_size=64, dtype=np.int64, shape=(8,), ordered=True, seed=2)
    whole = [t[:, 0].tolist() for t in ds]
    ds = rt.RiffleDataset(str(fixed_file), 100, record_size=64, dtype=np.int64, shape=(8,), ordered=True, seed=2)
    it = iter(ds)
    head = [next(it)[:, 0].tolist() for _ in range(3)]
    state = ds.state_dict()
    ds2 = rt.RiffleDataset(str(fixed_file), 100, record_size=64, dtype=np.int64, shape=(8,), ordered=True, seed=2)
    ds2.load_state_dict(state)
    assert head + [t[:, 0].tolist() for t in ds2] == whole


DDP = textwrap.dedent("""
    import json, os, sys
    sys.path.insert(0, {py!r})
    import numpy as np, torch, torch.distributed as dist
    import riffle.torch as rt
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:{port}", rank=int(os.environ["RANK"]), world_size=2)
    dl = rt.loader({path!r}, 32, record_size=64, dtype=np.int64, shape=(8,), seed=11)
    out = {{}}
    for epoch in range(2):
        dl.dataset.set_epoch(epoch)
        ids = [int(i) for t in dl for i in t[:, 0]]
        parts = [None, None]
        dist.all_gather_object(parts, ids)
        out[epoch] = parts
    if dist.get_rank() == 0:
        print(json.dumps(out))
    dist.destroy_process_group()
""")


def test_ddp_two_processes(daemon, tmp_path):
    path = write_fixed(tmp_path / "ddp.bin", 999, 64)  # odd: the last rank is padded
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    code = DDP.format(py=str(REPO / "python"), port=port, path=str(path))
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=dict(os.environ, RANK=str(r), WORLD_SIZE="2")) for r in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err
    result = json.loads(outs[0][0])
    orders = []
    for epoch, (r0, r1) in result.items():
        assert len(r0) == len(r1) == 500
        # DistributedSampler pads with the order's first record: one repeat, nothing else shared.
        assert len(set(r0) & set(r1)) <= 1
        assert set(r0) | set(r1) == set(range(999))
        orders.append(r0)
    assert orders[0] != orders[1]
