"""DataLoader's idioms as a script ported to riffle.torch meets them: each
taken as DataLoader takes it, or refused at construction by name with the
fix, never a TypeError from deep inside."""

from __future__ import annotations

import pytest
import torch.utils.data

import riffle


def test_a_daemon_that_fails_at_start_fails_the_client_with_its_log(tmp_path, fixed_file, monkeypatch):
    """A daemon that exits at start (here: its socket's path is longer than a Unix socket's may be, so it cannot
    listen) fails the client as soon as it exits, with its exit status and the last lines of its log; it waited
    30 s and then said only "did not start"."""
    d = tmp_path / "s"
    d.mkdir(mode=0o700)
    sock = str(d / ("x" * 120 + ".sock"))
    monkeypatch.setenv("RIFFLE_SOCKET", sock)
    with pytest.raises(riffle.RiffleError) as e:
        riffle.Loader(str(fixed_file), 10, record_size=64)
    msg = str(e.value)
    assert "exited with status 1 before it answered" in msg, msg
    assert "bind: invalid argument" in msg, msg  # the daemon's own last words, from its log


# --- loader.set_epoch and loader.sampler, as DDP code reaches for them ---

def ids_of(t) -> list[int]:
    return [int(i) for i in t[:, 0]]


def fixed_loader(path, **kw):
    import numpy as np
    import riffle.torch as rt
    return rt.loader(str(path), 50, record_size=64, dtype=np.int64, shape=(8,), **kw)


def epoch_of(path, epoch, **kw) -> list[list[int]]:
    dl = fixed_loader(path, **kw)
    dl.dataset.set_epoch(epoch)
    return [ids_of(t) for t in dl]


def test_loader_set_epoch_and_sampler(daemon, fixed_file):
    """loader.set_epoch and loader.sampler.set_epoch are the dataset's set_epoch; loader.sampler says what a
    DistributedSampler says (len is this rank's samples)."""
    dl = fixed_loader(fixed_file, seed=3, rank=1, world_size=2)
    dl.set_epoch(2)
    assert [ids_of(t) for t in dl] == epoch_of(fixed_file, 2, seed=3, rank=1, world_size=2)
    dl.sampler.set_epoch(5)
    assert dl.sampler.epoch == 5
    assert [ids_of(t) for t in dl] == epoch_of(fixed_file, 5, seed=3, rank=1, world_size=2)
    s = dl.sampler
    assert (len(s), s.rank, s.num_replicas, s.seed, s.shuffle, s.drop_last, s.total_size) == (500, 1, 2, 3, True,
                                                                                             False, 1000)
    with pytest.raises(TypeError, match="yields no indices"):
        iter(s)


def test_a_loader_keeps_its_loaded_place_through_set_epoch(daemon, fixed_file):
    """riffle.Loader's set_epoch keeps the rule riffle.torch's has: of the loaded state's epoch, the loaded place;
    of the epoch a state after its last batch ended, nothing; of another epoch, its beginning."""
    def ids(ld):
        return [[int(i) for i in b.ids] for b in ld]
    whole = ids(riffle.Loader(str(fixed_file), 100, record_size=64, seed=2, epoch=1))
    ld = riffle.Loader(str(fixed_file), 100, record_size=64, seed=2, epoch=1)
    it = iter(ld)
    head = [[int(i) for i in next(it).ids] for _ in range(4)]
    state = ld.state_dict()
    del it
    ld = riffle.Loader(str(fixed_file), 100, record_size=64, seed=2)
    ld.load_state_dict(state)
    assert ld.left() == 6
    ld.set_epoch(1)
    assert head + ids(ld) == whole
    ld.load_state_dict(state)
    ld.set_epoch(2)
    assert ld.left() == 10 and len(ids(ld)) == 10
    # After the last batch: the state is epoch 2's start; set_epoch(1) delivers nothing, then epoch 2 is whole.
    ld = riffle.Loader(str(fixed_file), 100, record_size=64, seed=2, epoch=1)
    for _ in ld:
        pass
    end = ld.state_dict()
    assert (end["epoch"], end["batch"]) == (2, 0)
    ld = riffle.Loader(str(fixed_file), 100, record_size=64, seed=2)
    ld.load_state_dict(end)
    ld.set_epoch(1)
    assert ld.left() == 0 and ids(ld) == []
    ld.set_epoch(2)
    assert ids(ld) == ids(riffle.Loader(str(fixed_file), 100, record_size=64, seed=2, epoch=2))


@pytest.mark.parametrize("workers", [0, 2])
def test_a_checkpoint_taken_before_a_resumed_run_moves_is_the_loaded_place(daemon, fixed_file, workers):
    """A script that saves the loader's state right after loading it (a checkpoint at the resumed epoch's start, or
    at the end of an epoch a state after its last batch left nothing of) saves the loaded place, not the start of
    the epoch: resumed from it, no batch comes twice (without workers it was epoch 0's start: the epoch replayed)."""
    whole = [epoch_of(fixed_file, e, seed=3) for e in (0, 1)]
    dl = fixed_loader(fixed_file, seed=3, num_workers=workers)
    it = iter(dl)
    head = [ids_of(next(it)) for _ in range(4)]
    mid = dl.state_dict()
    rest = [ids_of(t) for t in it]
    end = dl.state_dict()
    for state, before in ((mid, head), (end, head + rest)):
        dl = fixed_loader(fixed_file, seed=3, num_workers=workers)
        dl.load_state_dict(state)
        dl.set_epoch(0)
        again = dl.state_dict()
        if state is end:
            assert [ids_of(t) for t in dl] == []  # nothing of epoch 0 is left: the checkpoint at its end
            again = dl.state_dict()
        dl = fixed_loader(fixed_file, seed=3, num_workers=workers)
        dl.load_state_dict(again)
        got = []
        for epoch in (0, 1):
            dl.set_epoch(epoch)
            got.append([ids_of(t) for t in dl])
        assert before + got[0] == whole[0] and got[1] == whole[1]


# --- samplers passed to riffle.torch.loader ---

def test_distributed_sampler_is_taken_and_followed(daemon, tmp_path):
    """A DistributedSampler built before the loader (as PyTorch's ImageNet example builds it, over the dataset)
    gives its rank, num_replicas, seed, shuffle and drop_last; the script's later set_epoch calls on it reach the
    loader, and after load_state_dict, its set_epoch of the state's epoch keeps the loaded place."""
    import torch.utils.data as tud
    from conftest import write_fixed
    p = write_fixed(tmp_path / "n.bin", 1001, 64)
    s = tud.DistributedSampler(range(1001), num_replicas=2, rank=1, seed=7, drop_last=True)
    dl = fixed_loader(p, sampler=s, shuffle=False)  # the example passes shuffle=(train_sampler is None)
    want = dict(seed=7, rank=1, world_size=2, rank_drop_last=True)
    assert [ids_of(t) for t in dl] == epoch_of(p, 0, **want)
    assert sum(len(b) for b in epoch_of(p, 0, **want)) == len(s) == 500
    s.set_epoch(4)
    assert s.epoch == 4 and [ids_of(t) for t in dl] == epoch_of(p, 4, **want)
    # A checkpoint in epoch 4, resumed as the script does: load, then set_epoch(4) on its own sampler.
    s.set_epoch(4)
    it = iter(dl)
    head = [ids_of(next(it)) for _ in range(3)]
    state = dl.state_dict()
    del it
    s2 = tud.DistributedSampler(range(1001), num_replicas=2, rank=1, seed=7, drop_last=True)
    dl2 = fixed_loader(p, sampler=s2)
    dl2.load_state_dict(state)
    s2.set_epoch(4)
    assert head + [ids_of(t) for t in dl2] == epoch_of(p, 4, **want)
    # A sampler whose epoch was set before the loader was built starts the loader there.
    s3 = tud.DistributedSampler(range(1001), num_replicas=2, rank=1, seed=7, drop_last=True)
    s3.set_epoch(6)
    assert [ids_of(t) for t in fixed_loader(p, sampler=s3)] == epoch_of(p, 6, **want)


def test_a_sampler_and_what_contradicts_it_are_refused(daemon, fixed_file):
    import torch.utils.data as tud
    s = tud.DistributedSampler(range(1000), num_replicas=2, rank=0)
    with pytest.raises(ValueError, match="shuffle=True"):
        fixed_loader(fixed_file, sampler=s, shuffle=True)
    with pytest.raises(ValueError, match="seed=5 given, and sampler=DistributedSampler says 0"):
        fixed_loader(fixed_file, sampler=s, seed=5)
    with pytest.raises(ValueError, match="built over a dataset of 999 samples"):
        fixed_loader(fixed_file, sampler=tud.DistributedSampler(range(999), num_replicas=2, rank=0))


class Every(torch.utils.data.Sampler):
    def __init__(self, n):
        self.n = n

    def __iter__(self):
        return iter(range(self.n))

    def __len__(self):
        return self.n


def test_other_samplers_are_taken_or_refused_by_name(daemon, fixed_file):
    """RandomSampler is a shuffle (its generator's draw the seed, as it draws one), SequentialSampler file order,
    SubsetRandomSampler a shuffle of its indices; what riffle cannot do is refused by name with the fix, at
    construction: never the JSON TypeError a sampler object made deep in the client."""
    import torch
    import torch.utils.data as tud
    ids = sorted(i for t in fixed_loader(fixed_file, sampler=tud.RandomSampler(range(1000))) for i in ids_of(t))
    assert ids == list(range(1000))
    orders = [[ids_of(t) for t in fixed_loader(fixed_file, sampler=tud.RandomSampler(
        range(1000), generator=torch.Generator().manual_seed(9)))] for _ in range(2)]
    assert orders[0] == orders[1], "one generator seed, one order"
    seq = [i for t in fixed_loader(fixed_file, sampler=tud.SequentialSampler(range(1000))) for i in ids_of(t)]
    assert seq == list(range(1000))
    part = [i for t in fixed_loader(fixed_file, sampler=tud.SubsetRandomSampler(range(100, 300))) for i in ids_of(t)]
    assert sorted(part) == list(range(100, 300)) and part != sorted(part)
    refused = [
        (dict(sampler=tud.RandomSampler(range(1000), replacement=True)), ValueError, "replacement=True"),
        (dict(sampler=tud.WeightedRandomSampler([1.0] * 1000, 1000)), TypeError, "WeightedRandomSampler is not taken"),
        (dict(sampler=Every(1000)), TypeError, "sampler=Every is not taken"),
        (dict(batch_sampler=tud.BatchSampler(range(1000), 50, False)), TypeError, "batch_sampler=BatchSampler is not"),
    ]
    for kw, exc, msg in refused:
        with pytest.raises(exc, match=msg):
            fixed_loader(fixed_file, **kw)
    with pytest.raises(TypeError, match="sampler= takes a string .* not a DistributedSampler"):
        riffle.Loader(str(fixed_file), 50, record_size=64, sampler=tud.DistributedSampler(range(1000), 1, 0))


# --- dataset objects: torchvision's folders ---

def write_images(root, classes=("cat", "dog", "emu"), per=6, extra=None):
    import numpy as np
    from PIL import Image
    rng = np.random.default_rng(0)
    for c in classes:
        (root / c).mkdir(parents=True)
        for i in range(per):
            Image.fromarray(rng.integers(0, 255, (20 + i, 24, 3), dtype=np.uint8)).save(root / c / f"{i:03d}.jpg")
    for name, data in (extra or {}).items():
        (root / name).write_bytes(data)
    return root


def by_content(batches) -> list[tuple[int, bytes]]:
    """(label, image bytes) of every sample of an epoch, sorted: what identifies an image, whatever the order."""
    out = []
    for x, y in batches:
        out += [(int(lab), img.numpy().tobytes()) for img, lab in zip(x, y)]
    return sorted(out)


def test_image_folder_object_is_read_as_dataloader_reads_it(daemon, tmp_path):
    """ImageFolder(root, transform, target_transform) where a path was: the same samples, images, transforms and
    labels as DataLoader over it (it failed with "expected str, bytes or os.PathLike object, not tuple")."""
    import torch
    import torchvision
    import torchvision.transforms as T
    import riffle.torch as rt
    root = write_images(tmp_path / "imgs", extra={"cat/notes.txt": b"not an image"})
    tf = T.Compose([T.Resize((16, 16)), T.ToTensor()])
    folder = torchvision.datasets.ImageFolder(str(root), tf, target_transform=lambda y: 10 * y)
    want = by_content(torch.utils.data.DataLoader(folder, 5, shuffle=True))
    dl = rt.loader(folder, 5, num_workers=2)
    assert by_content(dl) == want and len(dl.dataset) == len(folder) == 18
    assert dl.dataset.classes == folder.classes and dl.dataset.class_to_idx == folder.class_to_idx
    # is_valid_file picks samples: riffle reads those records, and no other.
    some = torchvision.datasets.ImageFolder(str(root), tf, is_valid_file=lambda p: p.endswith(".jpg") and "002" not in p)
    assert by_content(rt.loader(some, 4)) == by_content(torch.utils.data.DataLoader(some, 4)) and len(some) == 15
    # A Subset (random_split) is its samples' records.
    train, val = torch.utils.data.random_split(folder, [12, 6], generator=torch.Generator().manual_seed(1))
    for part in (train, val):
        assert by_content(rt.loader(part, 4)) == by_content(torch.utils.data.DataLoader(part, 4))
    with pytest.raises(ValueError, match="transform= given, and ImageFolder.* has its own"):
        rt.loader(folder, 4, transform=T.ToTensor())


def test_a_folder_riffle_cannot_honour_is_refused_by_name(daemon, tmp_path):
    import numpy as np
    import torchvision
    from torchvision.datasets.folder import pil_loader
    import riffle.torch as rt
    root = write_images(tmp_path / "imgs")
    np.save(tmp_path / "arr.npy", np.zeros(3))

    def my_loader(path):
        return pil_loader(path).convert("L")

    with pytest.raises(TypeError, match=r"ImageFolder\(loader=.*my_loader\) is not taken.*decode="):
        rt.loader(torchvision.datasets.ImageFolder(str(root), loader=my_loader), 4)
    # A DatasetFolder with torchvision's PIL loader is an image folder.
    df = torchvision.datasets.DatasetFolder(str(root), pil_loader, extensions=(".jpg",))
    assert sum(len(y) for _, y in rt.loader(df, 4)) == 18

    class Relabelled(torchvision.datasets.ImageFolder):
        def __getitem__(self, i):
            return super().__getitem__(i)[0], 0

    with pytest.raises(TypeError, match="Relabelled overrides __getitem__"):
        rt.loader(Relabelled(str(root)), 4)

    class Memory(torch.utils.data.Dataset):
        def __len__(self):
            return 3

        def __getitem__(self, i):
            return i

    with pytest.raises(TypeError, match="a Memory is not taken.*ImageFolder"):
        rt.loader(Memory(), 4)
    with pytest.raises(TypeError, match="a ConcatDataset is not taken"):
        rt.loader(torch.utils.data.ConcatDataset([Memory(), Memory()]), 4)
    with pytest.raises(TypeError, match="paths is a tuple holding a object"):
        rt.loader((str(root), object()), 4)


def test_an_image_folder_path_decodes_images_by_default(daemon, tmp_path):
    """A directory whose every file is an image is opened as ImageFolder opens it without decode="image"; one
    with other files gives bytes, and a transform failing on them says to pass decode="image"."""
    import torchvision.transforms as T
    import riffle.torch as rt
    root = write_images(tmp_path / "imgs")
    tf = T.Compose([T.Resize((16, 16)), T.ToTensor()])
    assert by_content(rt.loader(str(root), 5, transform=tf)) == by_content(
        rt.loader(str(root), 5, transform=tf, decode="image"))
    (root / "cat" / "labels.csv").write_text("a,b\n")
    with pytest.raises(rt.RecordError, match='transform failed.*pass decode="image"'):
        for _ in rt.loader(str(root), 5, transform=tf):
            pass
