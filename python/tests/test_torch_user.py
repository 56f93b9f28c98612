"""riffle.torch as a PyTorch user meets it: batch order, epochs, workers,
resume, images, errors and DataLoader options, against real torch,
torchvision and Pillow."""

from __future__ import annotations

import io
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.utils.data

import riffle
import riffle.torch as rt

from conftest import REPO, write_fixed

PIL = pytest.importorskip("PIL.Image")


def ids_of(t: torch.Tensor) -> list[int]:
    return [int(i) for i in t[:, 0]]


def write_images(root, classes=("cat", "dog", "emu"), per=12, corrupt=None):
    from PIL import Image
    rng = np.random.default_rng(0)
    for c in classes:
        (root / c).mkdir(parents=True)
        for i in range(per):
            img = Image.fromarray(rng.integers(0, 255, (40 + i, 50, 3), dtype=np.uint8))
            img.save(root / c / f"{i:03d}.jpg", quality=90)
    if corrupt:
        (root / classes[0] / corrupt).write_bytes(b"\xff\xd8 this is not a jpeg")
    return root


def test_batches_are_not_sorted_by_class(daemon, tmp_path):
    # A directory dataset is laid out class by class; batches must not be.
    root = tmp_path / "tree"
    for c in range(3):
        (root / f"c{c}").mkdir(parents=True)
        for i in range(40):
            (root / f"c{c}" / f"{i}").write_bytes(bytes([c]) * 10)
    sorted_batches = 0
    n = 0
    for data, labels in rt.loader(str(root), 32, seed=1):
        n += 1
        lab = labels.tolist()
        if lab == sorted(lab):
            sorted_batches += 1
    assert n == 4 and sorted_batches == 0


@pytest.mark.parametrize("workers,persistent", [(0, False), (2, False), (2, True)])
def test_epochs_advance_without_set_epoch(daemon, fixed_file, workers, persistent):
    dl = rt.loader(str(fixed_file), 50, record_size=64, dtype=np.int64, shape=(8,), seed=3, num_workers=workers,
                   persistent_workers=persistent)
    orders = []
    for _ in range(3):
        ids = [i for t in dl for i in ids_of(t)]
        assert sorted(ids) == list(range(1000))
        orders.append(ids)
    assert orders[0] != orders[1] != orders[2]
    # The same three epochs as set by hand.
    for e in range(3):
        dl2 = rt.loader(str(fixed_file), 50, record_size=64, dtype=np.int64, shape=(8,), seed=3)
        dl2.dataset.set_epoch(e)
        assert [i for t in dl2 for i in ids_of(t)] == orders[e]


def test_set_epoch_reaches_persistent_workers(daemon, fixed_file):
    dl = rt.loader(str(fixed_file), 50, record_size=64, dtype=np.int64, shape=(8,), seed=3, num_workers=2,
                   persistent_workers=True)
    list(dl)
    dl.dataset.set_epoch(7)
    got = [i for t in dl for i in ids_of(t)]
    ref = rt.loader(str(fixed_file), 50, record_size=64, dtype=np.int64, shape=(8,), seed=3)
    ref.dataset.set_epoch(7)
    assert got == [i for t in ref for i in ids_of(t)]


@pytest.mark.parametrize("drop_last,want", [(False, 1001), (True, 960)])
def test_an_epoch_is_the_same_for_any_number_of_workers(daemon, tmp_path, drop_last, want):
    p = write_fixed(tmp_path / "n.bin", 1001, 64)
    seqs = []
    for workers in (0, 2, 3):
        dl = rt.loader(str(p), 64, record_size=64, dtype=np.int64, shape=(8,), seed=5, num_workers=workers,
                       drop_last=drop_last)
        batches = [ids_of(t) for t in dl]
        assert sum(map(len, batches)) == want, f"{workers} workers"
        assert len({i for b in batches for i in b}) == want
        seqs.append(batches)
    assert seqs[0] == seqs[1] == seqs[2], "workers changed the batches"


def test_drop_last_and_rank_drop_last_mean_what_torch_means(daemon, tmp_path):
    p = write_fixed(tmp_path / "n.bin", 1000, 64)
    for rank_drop_last in (False, True):
        ds = list(range(1000))
        for rank in range(3):
            ref = torch.utils.data.DistributedSampler(ds, num_replicas=3, rank=rank, shuffle=True,
                                                      drop_last=rank_drop_last)
            share = len(ref)  # 334 padded, 333 dropped
            for drop_last in (False, True):
                want = share // 64 * 64 if drop_last else share
                dl = rt.loader(str(p), 64, record_size=64, dtype=np.int64, shape=(8,), rank=rank, world_size=3, seed=4,
                               drop_last=drop_last, rank_drop_last=rank_drop_last)
                got = sum(len(t) for t in dl)
                assert got == want, f"rank {rank} rank_drop_last={rank_drop_last} drop_last={drop_last}"


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("sampler,buffer", [(None, None), ("buffered", 300), ("buffered", 20000)])
def test_state_dict_resumes_exactly(daemon, tmp_path, workers, sampler, buffer):
    # A buffer of 20000 is a state the daemon keeps until asked for.
    p = write_fixed(tmp_path / "n.bin", 2000, 64)
    kw = dict(record_size=64, dtype=np.int64, shape=(8,), seed=2, num_workers=workers)
    if sampler:
        kw.update(sampler=sampler, buffer=buffer)
    whole = [ids_of(t) for t in rt.loader(str(p), 64, **kw)]
    dl = rt.loader(str(p), 64, **kw)
    it = iter(dl)
    head = [ids_of(next(it)) for _ in range(7)]
    state = dl.state_dict()
    del it
    dl2 = rt.loader(str(p), 64, **kw)
    dl2.load_state_dict(state)
    assert head + [ids_of(t) for t in dl2] == whole


def test_images_like_image_folder(daemon, tmp_path):
    import torchvision
    root = write_images(tmp_path / "imgs")
    tf = torchvision.transforms.Compose([torchvision.transforms.Resize((32, 32)), torchvision.transforms.ToTensor()])
    ref = torchvision.datasets.ImageFolder(str(root), transform=tf)
    dl = rt.loader(str(root), 8, decode="image", transform=tf, seed=4)
    assert dl.dataset.classes == ref.classes and dl.dataset.class_to_idx == ref.class_to_idx
    by_label = {}
    for x, y in dl:
        assert x.shape == (len(y), 3, 32, 32) and x.dtype == torch.float32
        for img, lab in zip(x, y):
            by_label.setdefault(int(lab), []).append(img)
    ref_by_label = {}
    for img, lab in ref:
        ref_by_label.setdefault(lab, []).append(img)
    for lab, imgs in ref_by_label.items():
        assert len(by_label[lab]) == len(imgs)
        # Every image of the class came once: match each to one of torchvision's.
        left = list(imgs)
        for img in by_label[lab]:
            k = next(k for k, r in enumerate(left) if torch.equal(r, img))
            left.pop(k)


def test_a_corrupt_image_names_its_file(daemon, tmp_path):
    root = write_images(tmp_path / "imgs", per=4, corrupt="bad.jpg")
    with pytest.raises(rt.RecordError) as e:
        for _ in rt.loader(str(root), 4, decode="image"):
            pass
    assert e.value.path == str(root / "cat" / "bad.jpg")
    assert "bad.jpg" in str(e.value) and "image decoding" in str(e.value)


@pytest.mark.parametrize("fmt,bad,workers", [("jsonl", b'{"i": 30, oops}', 0), ("jsonl", b'{"i": 30, oops}', 2),
                                              ("libsvm", b"1 3:0.5 x:y", 0), ("libsvm", b"1 3:0.5 99:1", 2),
                                              ("text", b"\xff\xfe not utf-8", 0)])
def test_a_malformed_line_names_its_file_and_offset(daemon, tmp_path, fmt, bad, workers):
    """A line the default decoding refuses, in the second file of a glob, with and without DataLoader workers: a
    RecordError naming the record, its file and the line's offset there, not the record's id alone."""
    good = {"jsonl": lambda i: b'{"i": %d}' % i, "libsvm": lambda i: b"%d 1:0.5 2:1" % (i % 2),
            "text": lambda i: b"line %d" % i}[fmt]
    ext = {"jsonl": "jsonl", "libsvm": "svm", "text": "txt"}[fmt]
    (tmp_path / f"a.{ext}").write_bytes(b"".join(good(i) + b"\n" for i in range(100)))
    lines = [good(i) for i in range(100, 200)]
    lines[30] = bad
    (tmp_path / f"b.{ext}").write_bytes(b"".join(x + b"\n" for x in lines))
    kw = {"n_features": 20} if fmt == "libsvm" else {}
    with pytest.raises(rt.RecordError) as e:
        for _ in rt.loader(str(tmp_path / f"*.{ext}"), 16, seed=2, num_workers=workers, **kw):
            pass
    assert e.value.record == 130 and e.value.path == str(tmp_path / f"b.{ext}")
    assert e.value.offset == sum(len(x) + 1 for x in lines[:30])
    assert f"b.{ext} at offset {e.value.offset}" in str(e.value) and "decoding failed" in str(e.value)


def test_unknown_decode_is_an_error_at_construction(daemon, fixed_file):
    with pytest.raises(ValueError, match="decode="):
        rt.RiffleDataset(str(fixed_file), 8, record_size=64, decode="imgae")


def test_misspelt_option_is_an_error_at_construction(daemon, fixed_file):
    with pytest.raises(TypeError):
        rt.RiffleDataset(str(fixed_file), 8, record_size=64, reocrd_size=3)


def test_dataloader_options(daemon, fixed_file):
    dl = rt.loader(str(fixed_file), 100, record_size=64, num_workers=2, prefetch_factor=4, persistent_workers=True,
                   timeout=60)
    assert sum(len(t) for t in dl) == 1000
    with pytest.raises(ValueError, match="num_workers"):
        rt.loader(str(fixed_file), 100, record_size=64, prefetch_factor=4)
    with pytest.raises(TypeError, match="collate_fn"):
        rt.loader(str(fixed_file), 100, record_size=64, collate_fn=None)


def test_big_endian_npy(daemon, tmp_path):
    arr = np.arange(60, dtype=">f4").reshape(20, 3)
    np.save(tmp_path / "be.npy", arr)
    got = {}
    for t in rt.loader(str(tmp_path / "be.npy"), 7):
        assert t.dtype == torch.float32
        for row in t:
            got[int(row[0]) // 3] = row.tolist()
    assert [got[i] for i in range(20)] == arr.astype("<f4").tolist()


def test_workers_lend_batches_or_build_them_in_shared_memory(daemon, fixed_file):
    ds = rt.RiffleDataset(str(fixed_file), 100, record_size=64, dtype=np.int64, shape=(8,))
    ld = ds._loader()
    it = iter(ld)  # the job stays open while its iteration does
    b = next(it)
    # A view of the batch is lent to the main process as it is (no copy) ...
    view = ds._convert(b, ld, shared=True)
    assert view.data_ptr() == b.raw.ctypes.data and not view.is_shared()
    assert isinstance(rt._lent(ld, b, view), rt._Lent)
    assert rt._lent(ld, b, view) is view  # lent once: a second lend has nothing to lend
    # ... what a transform made of it goes to shared memory once.
    ds.transform = lambda x: x * 2
    assert ds._convert(b, ld, shared=True).is_shared()
    assert not ds._convert(b, ld, shared=False).is_shared()  # the main process keeps its own


def test_example_imagefolder_runs(daemon, tmp_path):
    root = write_images(tmp_path / "imgs", per=6)
    r = subprocess.run([sys.executable, str(REPO / "examples" / "imagefolder.py"), str(root), "--epochs", "2"],
                       capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, PYTHONPATH=str(REPO / "python")))
    assert r.returncode == 0, r.stderr
    assert "epoch 1" in r.stdout and "18 images" in r.stdout
