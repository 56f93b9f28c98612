"""Each peer loader as its user would write it, run in the peer's own
environment by bench/peers/harness.py:

    python loaders.py PEER CONFIG MODE --data DIR --size BYTES [--seconds S]
                      [--seed N] [--rank R --world W] [--ids] [--image [center|rrc]]

CONFIG is "full" (the peer's fully shuffled configuration, or the closest
it has) or "fast" (its documented fast path). MODE is "speed" (load until
--seconds or one epoch), "resume" (save the iterator's state after three
batches, take the next batch, restore a new iterator from the state and
compare its next batch), "elastic" (one rank of one phase of an elastic
resume: --phase 1 takes three batches and rank 0 saves its state to
--state, --phase 2 loads it on another topology and ends the epoch), or "epoch" (one whole epoch, whatever happens: the
truncated-file probe). One JSON line goes to stdout. --image makes the
records JPEGs that the loader decodes and transforms: Resize(256) +
CenterCrop(224) ("center") or RandomResizedCrop(224) +
RandomHorizontalFlip() ("rrc").

Every record starts with its id (little-endian uint64); a loader's batch is
turned into ids by reading those bytes, which touches every sample. The
lines between "# user" and "# end user" in each builder are the code a
user writes for that loader (counted into the table).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import time

import numpy as np

BATCH = 256
WORKERS = 2  # the machine has 2 cores: the parallelism knob every peer gets


def ids_of_rows(rows) -> list[int]:
    """Ids of a batch given as bytes objects or a (B, size) uint8 array."""
    if isinstance(rows, np.ndarray) and rows.dtype == np.uint8 and rows.ndim == 2:
        return rows[:, :8].copy().view("<u8").ravel().tolist()
    return [int.from_bytes(bytes(r[:8]), "little") for r in rows]


def prep(b) -> np.ndarray:
    """Decode a JPEG, resize its shorter side to 256, crop the center
    224x224: torchvision's Resize(256) + CenterCrop(224), with Pillow."""
    import io

    from PIL import Image
    im = Image.open(io.BytesIO(bytes(b))).convert("RGB")
    w, h = im.size
    s = 256 / min(w, h)
    im = im.resize((max(256, round(w * s)), max(256, round(h * s))), Image.BILINEAR)
    w, h = im.size
    l, t = (w - 224) // 2, (h - 224) // 2
    return np.asarray(im.crop((l, t, l + 224, t + 224)))


def rrc_box(w: int, h: int, rnd, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)) -> tuple[int, int, int, int]:
    """The box (left, top, width, height) torchvision's
    RandomResizedCrop.get_params draws for a w x h image (torchvision 0.14):
    ten tries at a uniform area and a log-uniform aspect ratio, else the
    centre box of the nearest allowed ratio. rnd is a random.Random."""
    import math
    area = w * h
    lr = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target = area * rnd.uniform(scale[0], scale[1])
        ar = math.exp(rnd.uniform(lr[0], lr[1]))
        cw, ch = int(round(math.sqrt(target * ar))), int(round(math.sqrt(target / ar)))
        if 0 < cw <= w and 0 < ch <= h:
            return rnd.randint(0, w - cw), rnd.randint(0, h - ch), cw, ch
    if w / h < min(ratio):
        cw, ch = w, int(round(w / min(ratio)))
    elif w / h > max(ratio):
        cw, ch = int(round(h * max(ratio))), h
    else:
        cw, ch = w, h
    return (w - cw) // 2, (h - ch) // 2, cw, ch


_RANDOM: dict = {}  # per process: forked workers must not draw the same crops


def prep_rrc(b, box=None, flip=None) -> np.ndarray:
    """Decode a JPEG, take a random box and resize it to 224x224, mirrored
    with probability 0.5: torchvision's RandomResizedCrop(224) +
    RandomHorizontalFlip() on a PIL image (crop, then bilinear resize, then
    transpose), with Pillow. box and flip fix the draw (for tests)."""
    import io
    import random

    from PIL import Image
    rnd = _RANDOM.get(os.getpid()) or _RANDOM.setdefault(os.getpid(), random.Random())
    im = Image.open(io.BytesIO(bytes(b))).convert("RGB")
    l, t, w, h = box or rrc_box(*im.size, rnd)
    im = im.crop((l, t, l + w, t + h)).resize((224, 224), Image.BILINEAR)
    if flip if flip is not None else rnd.random() < 0.5:
        im = im.transpose(Image.FLIP_LEFT_RIGHT)
    return np.asarray(im)


# The image rows: --image's value -> the Pillow function of the peers that
# transform in their own map stage.
PREP = {"center": prep, "rrc": prep_rrc}


def files(d: str, pattern: str) -> list[str]:
    fs = sorted(glob.glob(os.path.join(d, pattern)))
    if not fs:
        raise SystemExit(f"no {pattern} under {d}")
    return fs


# --- builders: each returns (iterable of batches, ids_of, state, restore) ---

def riffle_(a):
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
    import riffle
    # The fast configuration is the block-aware shuffle (64 KiB blocks, 8
    # blocks spread over 8 batches): whole blocks at the device's
    # sequential rate, for a lower randomization level.
    kw = {"sampler": "block", "block_size": 65536, "window": 8} if a.config == "fast" else {}
    if a.image:
        kw = {"transform": {"center": "image:size=256,crop=224", "rrc": "random_resized_crop:size=224"}[a.image]}
    else:
        kw["record_size"] = a.size
    # user
    ld = riffle.Loader(a.data, batch_size=BATCH, seed=a.seed, rank=a.rank, world_size=a.world, **kw)
    # end user

    def restore(state):
        ld2 = riffle.Loader(a.data, batch_size=BATCH, seed=a.seed, rank=a.rank, world_size=a.world, **kw)
        ld2.load_state_dict(state)
        return iter(ld2)
    return ld, lambda b: b.ids.tolist(), lambda it: ld.state_dict(), restore


class _Records:
    """A map-style Dataset over the file of fixed-size records, with pread."""

    def __init__(self, path, size):
        self.path, self.size = path, size
        self.n = os.path.getsize(path) // size
        self.fd = None

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.fd is None:
            self.fd = os.open(self.path, os.O_RDONLY)
        b = os.pread(self.fd, self.size, i * self.size)
        if len(b) != self.size:
            raise IOError(f"{self.path}: record {i} is short ({len(b)} bytes)")
        return np.frombuffer(b, np.uint8)


def _collate(rows):
    return np.stack(rows)


def _dataset(a):
    if a.image:
        from torchvision import datasets, transforms
        if a.image == "rrc":
            tf = transforms.Compose([transforms.RandomResizedCrop(224), transforms.RandomHorizontalFlip(),
                                     transforms.PILToTensor()])
        else:
            tf = transforms.Compose([transforms.Resize(256), transforms.CenterCrop(224), transforms.PILToTensor()])
        return datasets.ImageFolder(a.data, transform=tf)
    return _Records(a.data, a.size)


def _collate_any(rows):
    if isinstance(rows[0], tuple):  # ImageFolder's (image, label)
        return [r[0] for r in rows]
    return np.stack(rows)


def torch_(a):
    import torch.utils.data as tud
    # user
    ds = _dataset(a)
    sampler = tud.DistributedSampler(ds, a.world, a.rank, seed=a.seed) if a.world > 1 else None
    dl = tud.DataLoader(ds, batch_size=BATCH, shuffle=sampler is None, sampler=sampler, collate_fn=_collate_any,
                        num_workers=WORKERS if a.config == "fast" else 0)
    # end user
    return dl, ids_of_rows, None, None


def torchdata_(a):
    import torch.utils.data as tud
    from torchdata.stateful_dataloader import StatefulDataLoader
    # user
    ds = _dataset(a)
    sampler = tud.DistributedSampler(ds, a.world, a.rank, seed=a.seed) if a.world > 1 else None
    dl = StatefulDataLoader(ds, batch_size=BATCH, shuffle=sampler is None, sampler=sampler, collate_fn=_collate_any,
                            num_workers=WORKERS if a.config == "fast" else 0)
    # end user

    def restore(state):
        dl2 = StatefulDataLoader(ds, batch_size=BATCH, shuffle=sampler is None, sampler=sampler, collate_fn=_collate_any,
                                 num_workers=WORKERS if a.config == "fast" else 0)
        dl2.load_state_dict(state)
        return iter(dl2)
    return dl, ids_of_rows, lambda it: dl.state_dict(), restore


def hf_(a):
    prep = PREP.get(a.image)  # the image row's map function (Pillow)
    import datasets
    datasets.disable_progress_bars()
    path = os.path.join(a.data, "ds")
    if a.config == "full":
        # user
        ds = datasets.load_from_disk(path)
        ds = ds.shard(a.world, a.rank) if a.world > 1 else ds
        ds = ds.shuffle(seed=a.seed)
        batches = ds.iter(batch_size=BATCH)
        # end user
        if a.image:
            batches = ([prep(x) for x in b["data"]] for b in batches)
            return batches, None, None, None
        return batches, lambda b: ids_of_rows(b["data"]), None, None
    import torch.utils.data as tud
    from datasets.distributed import split_dataset_by_node
    # user
    ids = datasets.load_from_disk(path).to_iterable_dataset(num_shards=64)
    ids = split_dataset_by_node(ids, a.rank, a.world) if a.world > 1 else ids
    ids = ids.shuffle(seed=a.seed, buffer_size=1000)
    dl = tud.DataLoader(ids, batch_size=BATCH, num_workers=WORKERS,
                        collate_fn=lambda rows: [prep(r["data"]) if a.image else r["data"] for r in rows])
    # end user
    return dl, ids_of_rows, None, None


def tf_(a):
    import tensorflow as tf
    fs = files(a.data, "*.tfrecord")
    ids = lambda b: tf.io.decode_raw(tf.strings.substr(b, 0, 8), tf.int64)[:, 0]  # noqa: E731

    def center(b):  # decode, Resize(256), CenterCrop(224)
        im = tf.io.decode_jpeg(b, channels=3)
        s = 256 / tf.cast(tf.minimum(tf.shape(im)[0], tf.shape(im)[1]), tf.float32)
        hw = tf.cast(tf.round(tf.cast(tf.shape(im)[:2], tf.float32) * s), tf.int32)
        im = tf.image.resize(im, tf.maximum(hw, 256))
        return tf.cast(tf.image.resize_with_crop_or_pad(im, 224, 224), tf.uint8)

    def rrc(b):
        # RandomResizedCrop(224) + RandomHorizontalFlip() as tf.image has
        # them, the way TensorFlow's own ImageNet input pipelines write it: a
        # box of 8-100% of the area and a ratio in [3/4, 4/3], decoding only
        # that box, then a bilinear resize to 224x224 and a random mirror.
        # (Where ten tries find no box it keeps the whole image, not
        # torchvision's centre box.)
        begin, size, _ = tf.image.sample_distorted_bounding_box(
            tf.io.extract_jpeg_shape(b), tf.constant([0.0, 0.0, 1.0, 1.0], shape=[1, 1, 4]), min_object_covered=0.0,
            aspect_ratio_range=(3 / 4, 4 / 3), area_range=(0.08, 1.0), max_attempts=10,
            use_image_if_no_bounding_boxes=True)
        window = tf.stack([begin[0], begin[1], size[0], size[1]])
        im = tf.io.decode_and_crop_jpeg(b, window, channels=3)
        im = tf.image.resize(im, [224, 224])
        return tf.cast(tf.image.random_flip_left_right(im), tf.uint8)

    decode = rrc if a.image == "rrc" else center

    if a.config == "full":
        # user
        ds = tf.data.TFRecordDataset(fs)
        ds = ds.shard(a.world, a.rank) if a.world > 1 else ds
        n = sum(os.path.getsize(f) for f in fs) // (a.size + 16)  # every record in the buffer
        ds = ds.shuffle(n, seed=a.seed)
        ds = ds.map(decode, num_parallel_calls=tf.data.AUTOTUNE) if a.image else ds
        ds = (ds.batch(BATCH) if a.image else ds.batch(BATCH).map(ids)).prefetch(tf.data.AUTOTUNE)
        # end user
    else:
        # user
        ds = tf.data.Dataset.from_tensor_slices(fs)
        ds = ds.shard(a.world, a.rank) if a.world > 1 else ds
        ds = ds.shuffle(len(fs), seed=a.seed).interleave(tf.data.TFRecordDataset, cycle_length=8,
                                                         num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)
        ds = ds.shuffle(10000, seed=a.seed)
        ds = ds.map(decode, num_parallel_calls=tf.data.AUTOTUNE) if a.image else ds
        ds = (ds.batch(BATCH) if a.image else ds.batch(BATCH).map(ids)).prefetch(tf.data.AUTOTUNE)
        # end user

    def state(it):
        ck = tf.train.Checkpoint(it=it)
        return ck.write(os.path.join(a.tmp, "tfck"))

    def restore(path):
        it = iter(ds)
        tf.train.Checkpoint(it=it).read(path).assert_consumed()
        return it
    return ds, lambda b: b.numpy().tolist(), state, restore


def grain_(a):
    prep = PREP.get(a.image)  # the image row's map function (Pillow)
    import grain
    fs = files(a.data, "*.array_record")

    def build():
        # user
        src = grain.sources.ArrayRecordDataSource(fs)
        ds = grain.MapDataset.source(src)
        ds = ds[a.rank::a.world] if a.world > 1 else ds
        ds = ds.shuffle(seed=a.seed).map(prep if a.image else lambda r: np.frombuffer(r, np.uint8)).batch(BATCH)
        it = ds.to_iter_dataset(grain.ReadOptions(num_threads=16, prefetch_buffer_size=500))
        if a.config == "fast":
            it = it.mp_prefetch(grain.MultiprocessingOptions(num_workers=WORKERS))
        # end user
        return it

    def restore(state):
        it = iter(build())
        it.set_state(state)
        return it
    return build(), ids_of_rows, lambda it: it.get_state(), restore


def wds_(a):
    prep = PREP.get(a.image)  # the image row's map function (Pillow)
    import webdataset as wds
    fs = files(a.data, "*.tar")
    # user
    ds = wds.WebDataset(fs, shardshuffle=len(fs), seed=a.seed, nodesplitter=wds.split_by_node, empty_check=False)
    ds = ds.shuffle(1000).to_tuple("bin")
    ds = (ds.map_tuple(prep) if a.image else ds).batched(BATCH)
    dl = wds.WebLoader(ds, batch_size=None, num_workers=WORKERS if a.config == "fast" else 0)
    # end user
    return dl, lambda b: ids_of_rows(b[0]), None, None


def mosaic_(a):
    prep = PREP.get(a.image)  # the image row's map function (Pillow)
    import streaming
    from streaming import StreamingDataLoader, StreamingDataset
    # The ranks share this machine: they are its local ranks too.
    os.environ.update(RANK=str(a.rank), WORLD_SIZE=str(a.world), LOCAL_RANK=str(a.rank), LOCAL_WORLD_SIZE=str(a.world))
    if a.world == 1:
        streaming.base.util.clean_stale_shared_memory()

    def build():
        # user
        ds = StreamingDataset(local=a.data, shuffle=True, shuffle_seed=a.seed, batch_size=BATCH,
                              shuffle_algo="naive" if a.config == "full" else "py1e")
        dl = StreamingDataLoader(ds, batch_size=BATCH, num_workers=WORKERS if a.config == "fast" else 0,
                                 collate_fn=lambda rows: {"data": [prep(r["data"]) if a.image else r["data"]
                                                                   for r in rows]})
        # end user
        return dl
    dl = build()

    def restore(state):
        dl2 = build()
        dl2.load_state_dict(state)
        return iter(dl2)
    return dl, lambda b: ids_of_rows(b["data"]), lambda it: dl.state_dict(), restore


def ray_(a):
    prep = PREP.get(a.image)  # the image row's map function (Pillow)
    import logging

    import ray
    ray.init(num_cpus=WORKERS, include_dashboard=False, logging_level=logging.ERROR, log_to_driver=False)
    fs = files(a.data, "*.parquet")[a.rank::a.world]
    if a.config == "full":
        # user
        ds = ray.data.read_parquet(fs).random_shuffle(seed=a.seed)
        batches = ds.iter_batches(batch_size=BATCH, batch_format="numpy")
        # end user
    else:
        # user
        ds = ray.data.read_parquet(fs, shuffle="files")
        batches = ds.iter_batches(batch_size=BATCH, batch_format="numpy", local_shuffle_buffer_size=10000)
        # end user
    if a.image:
        batches = ([prep(x) for x in b["data"]] for b in batches)
        return batches, None, None, None
    return batches, lambda b: ids_of_rows(b["data"]), None, None


# --- elastic resume: 2 ranks x 2 workers onto 3 ranks x 1 worker ---
#
# Each builder takes (a, workers) and returns (loader, ids_of, save, load):
# the loader of rank a.rank of a.world through the peer's documented
# distributed API, save(loader) -> the state its user checkpoints, and
# load(loader, state) -> the loader resumed from it (raising if the peer
# refuses the state in this topology).

def _ids(b) -> list[int]:
    if hasattr(b, "numpy") and not isinstance(b, np.ndarray):
        b = b.numpy()
    if isinstance(b, dict):
        b = b["data"]
    if isinstance(b, np.ndarray) and b.dtype != np.uint8:
        return b.reshape(-1).tolist()
    return ids_of_rows(b)


def elastic_riffle(a, workers):
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
    import riffle.torch as rt
    dl = rt.loader(a.data, BATCH, num_workers=workers, seed=a.seed, rank=a.rank, world_size=a.world,
                   record_size=a.size)

    def load(dl, st):
        dl.load_state_dict(st)
        return dl
    return dl, _ids, lambda dl: dl.state_dict(), load


def elastic_torchdata(a, workers):
    import torch.utils.data as tud
    from torchdata.stateful_dataloader import StatefulDataLoader
    ds = _Records(a.data, a.size)
    sampler = tud.DistributedSampler(ds, a.world, a.rank, seed=a.seed)
    dl = StatefulDataLoader(ds, batch_size=BATCH, sampler=sampler, collate_fn=_collate, num_workers=workers)

    def load(dl, st):
        dl.load_state_dict(st)
        return dl
    return dl, _ids, lambda dl: dl.state_dict(), load


def elastic_hf(a, workers):
    import datasets
    from datasets.distributed import split_dataset_by_node
    from torchdata.stateful_dataloader import StatefulDataLoader
    datasets.disable_progress_bars()
    # datasets' documented way to resume an IterableDataset with workers:
    # StatefulDataLoader, which calls the dataset's state_dict in each worker.
    ds = datasets.load_from_disk(os.path.join(a.data, "ds")).to_iterable_dataset(num_shards=64)
    ds = split_dataset_by_node(ds, a.rank, a.world).shuffle(seed=a.seed, buffer_size=1000)
    dl = StatefulDataLoader(ds, batch_size=BATCH, num_workers=workers, collate_fn=lambda rows: [r["data"] for r in rows])

    def load(dl, st):
        dl.load_state_dict(st)
        return dl
    return dl, ids_of_rows, lambda dl: dl.state_dict(), load


def elastic_mosaic(a, workers):
    import streaming
    from streaming import StreamingDataLoader, StreamingDataset
    # The ranks share this machine: they are its local ranks too. Every
    # rank clears the shared memory a previous phase left (a collective).
    # The process group is the training's, made once, as under DDP: each of
    # Mosaic's calls would otherwise make and tear down its own on one port.
    import torch.distributed as dist
    os.environ.update(RANK=str(a.rank), WORLD_SIZE=str(a.world), LOCAL_RANK=str(a.rank), LOCAL_WORLD_SIZE=str(a.world))
    dist.init_process_group("gloo", rank=a.rank, world_size=a.world)
    streaming.base.util.clean_stale_shared_memory()
    ds = StreamingDataset(local=a.data, shuffle=True, shuffle_seed=a.seed, batch_size=BATCH, shuffle_algo="py1e")
    # A dict batch: StreamingDataLoader counts the samples it yielded as
    # the length of a batch's first value (of a list batch, its first row's).
    dl = StreamingDataLoader(ds, batch_size=BATCH, num_workers=workers,
                             collate_fn=lambda rows: {"data": [r["data"] for r in rows]})

    def load(dl, st):
        dl.load_state_dict(st)
        return dl
    return dl, lambda b: ids_of_rows(b["data"]), lambda dl: dl.state_dict(), load


def elastic_grain(a, workers):
    import grain.python as gp
    src = gp.ArrayRecordDataSource(files(a.data, "*.array_record"))
    sampler = gp.IndexSampler(len(src), shard_options=gp.ShardOptions(a.rank, a.world, drop_remainder=False),
                              shuffle=True, num_epochs=1, seed=a.seed)

    class Ids(gp.MapTransform):
        def map(self, r):
            return np.frombuffer(r, np.uint8)
    dl = gp.DataLoader(data_source=src, sampler=sampler, operations=[Ids(), gp.Batch(BATCH)], worker_count=workers)

    class Resumable:
        """grain's DataLoader: the state is its iterator's get_state()."""

        def __init__(self):
            self.it = iter(dl)

        def __iter__(self):
            return self.it

    def load(r, st):
        r.it.set_state(st)
        return r
    return Resumable(), ids_of_rows, lambda r: r.it.get_state(), load


ELASTIC = {"riffle": elastic_riffle, "torchdata": elastic_torchdata, "hf": elastic_hf, "mosaic": elastic_mosaic,
           "grain": elastic_grain}


def elastic(a) -> None:
    """One rank of one phase. Phase 1 (2 ranks x 2 workers): take
    ELASTIC_BATCHES batches, rank 0 writes its state to a.state. Phase 2
    (3 ranks x 1 worker): load that state and finish the epoch. Prints the
    rank's ids; an exception of the resume is the run's error."""
    import pickle
    if a.peer not in ELASTIC:
        finish({"n": 0, "distinct": 0, "seconds": 0, "first": None, "error": "no elastic builder", "ids": []})
    t0 = time.time()
    dl, ids_of, save, load = ELASTIC[a.peer](a, a.workers)
    ids: list[int] = []
    err = None
    if a.phase == 1:
        it = iter(dl)
        for _ in range(ELASTIC_BATCHES):
            ids += ids_of(next(it))
        if a.rank == 0:
            with open(a.state + ".tmp", "wb") as f:
                pickle.dump(save(dl), f)
            os.rename(a.state + ".tmp", a.state)
    else:
        with open(a.state, "rb") as f:
            st = pickle.load(f)
        try:
            dl = load(dl, st)
            for b in dl:
                ids += ids_of(b)
        except Exception as e:  # the peer refused the state, or failed on it
            import traceback
            where = traceback.extract_tb(e.__traceback__)[-1]
            msg = " ".join(str(e).split()) or f"{os.path.basename(where.filename)}:{where.lineno}: {where.line}"
            err = f"{type(e).__name__}: {msg[:200]}"
    finish({"n": len(ids), "distinct": len(set(ids)), "seconds": time.time() - t0, "first": None, "error": err,
            "ids": ids})


ELASTIC_BATCHES = 3


PEERS = {"riffle": riffle_, "torch": torch_, "torchdata": torchdata_, "hf": hf_, "tf": tf_, "grain": grain_,
         "webdataset": wds_, "mosaic": mosaic_, "ray": ray_}


def user_lines(peer: str) -> int:
    """Lines of user code in the peer's builder (between the markers)."""
    import inspect
    src = inspect.getsource(PEERS[peer]).splitlines()
    n, on = 0, False
    for line in src:
        s = line.strip()
        if s == "# user":
            on = True
        elif s == "# end user":
            on = False
        elif on and s:
            n += 1
    return n


def finish(out: dict) -> None:
    """Prints the result and ends the run's whole process group: some
    peers' worker processes outlive their loader (and hold the pipe the
    harness reads) by seconds or for ever."""
    print(json.dumps(out), flush=True)
    sys.stderr.flush()
    if os.getpgid(0) == os.getpid():  # the harness made this process a group leader
        os.killpg(0, 9)
    os._exit(0)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("peer", choices=PEERS)
    p.add_argument("config", choices=["full", "fast"])
    p.add_argument("mode", choices=["speed", "resume", "epoch", "lines", "elastic"])
    p.add_argument("--data", default="")
    p.add_argument("--size", type=int, default=4096)
    p.add_argument("--seconds", type=float, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--world", type=int, default=1)
    p.add_argument("--ids", action="store_true")
    p.add_argument("--image", nargs="?", const="center", choices=list(PREP),
                   help="records are JPEGs: decode and Resize(256) + CenterCrop(224) (center, the default), "
                        "or RandomResizedCrop(224) + RandomHorizontalFlip() (rrc)")
    p.add_argument("--tmp", default="/tmp/riffle-peers-tmp")
    p.add_argument("--phase", type=int, default=1, help="elastic: 1 saves the state, 2 resumes from it")
    p.add_argument("--workers", type=int, default=WORKERS, help="elastic: DataLoader workers per rank")
    p.add_argument("--state", default="", help="elastic: the file rank 0's state goes to")
    a = p.parse_args()
    os.makedirs(a.tmp, exist_ok=True)
    if a.mode == "lines":
        print(json.dumps({"lines": user_lines(a.peer)}))
        return
    if a.mode == "elastic":
        elastic(a)
    t0 = time.time()
    loader, ids_of, state, restore = PEERS[a.peer](a)
    if a.image:
        # Images carry no id to check: count the decoded samples, and the
        # harness checks no order.
        def ids_of(b, counter=[0]):
            if hasattr(b, "ids"):
                k = len(b.ids)
            elif isinstance(b, dict):
                k = len(next(iter(b.values())))
            elif isinstance(b, (tuple, list)) and len(getattr(b[0], "shape", ())) == 4:
                k = b[0].shape[0]  # a collated batch of images, wrapped
            elif isinstance(b, tuple):
                k = len(b[0])
            else:
                k = len(b)
            counter[0] += k
            return list(range(counter[0] - k, counter[0]))
    if a.mode == "resume":
        if state is None:
            finish({"resume": "none"})
        it = iter(loader)
        for _ in range(3):
            next(it)
        st = state(it)
        want = ids_of(next(it))
        got = ids_of(next(restore(st)))
        finish({"resume": "exact" if got == want else "differs"})
    ids: list[int] = []
    first = None
    n_first = 0
    err = None
    try:
        for b in loader:
            ids += ids_of(b)
            if first is None:
                first, n_first = time.time() - t0, len(ids)
            if a.mode == "speed" and time.time() - t0 >= a.seconds:
                break
    except Exception as e:  # the truncated-file probe reports what the loader raised
        if a.mode != "epoch":
            raise
        err = f"{type(e).__name__}: {str(e)[:200]}"
    el = time.time() - t0
    steady = (len(ids) - n_first) / (el - first) if first is not None and el > first else 0.0
    out = {"n": len(ids), "seconds": el, "first": first, "rate": steady, "error": err, "distinct": len(set(ids))}
    if a.ids:
        out["ids"] = ids
    finish(out)


if __name__ == "__main__":
    main()
