"""What a script written for ``torch.utils.data.DataLoader`` hands riffle.torch, taken as riffle's options.

A script moved to ``riffle.torch.loader`` keeps the objects it built for
DataLoader: a torchvision ``ImageFolder`` or ``DatasetFolder``, a Hugging
Face ``datasets.Dataset`` (from ``load_from_disk``, formatted, transformed,
selected), a ``torch.utils.data.Subset`` of one of those (``random_split``),
and a sampler (``DistributedSampler``, built from the dataset before the
loader, as PyTorch's ImageNet example builds it). Each says what riffle
needs: the files it reads, which of their records, how a record is decoded
and transformed, and how the epoch is ordered and split over ranks. What
riffle cannot honour exactly (a custom loader, a weighted sampler, a table
changed in memory) is refused here, at construction, by name, with what to
do instead: riffle never reads other records, or decodes them otherwise,
than the object would have.
"""

from __future__ import annotations

import os
import sys
import weakref
from typing import Any, Callable, Sequence

import numpy as np

# What riffle.torch.loader takes where DataLoader takes a dataset, for the messages that refuse the rest.
TAKES = ("a path (a file, a glob, a directory of class folders), a list of paths, torchvision's ImageFolder or "
         "DatasetFolder, a Hugging Face datasets.Dataset whose rows are in files (load_from_disk), or a "
         "torch.utils.data.Subset of one of those")


class Taken:
    """A dataset object as riffle's options: the ``paths`` it reads, the options that pick and decode its records
    (``opts``), and its samples' record ids (``ids[j]`` is sample j's, as the object indexes them; None if sample
    j is record j), so that a Subset of it is the records its indices name."""

    def __init__(self, paths: Any, opts: dict, ids: np.ndarray | None, n: int, what: str):
        self.paths, self.opts, self.ids, self.n, self.what = paths, opts, ids, n, what

    def record(self, j: np.ndarray) -> np.ndarray:
        """The record ids of samples j."""
        return j if self.ids is None else self.ids[j]


def is_paths(obj: Any) -> bool:
    """Whether obj names files as riffle takes them: a path, or a list or tuple of paths."""
    if obj is None or isinstance(obj, (str, os.PathLike)):
        return True
    return isinstance(obj, (list, tuple)) and all(isinstance(p, (str, os.PathLike)) for p in obj)


def take_dataset(obj: Any, connect: dict) -> Taken:
    """A dataset object as riffle's options, or a TypeError or ValueError naming what riffle cannot take and the
    fix. ``connect`` are the loader's options that reach the daemon (ImageFolder's files are matched to riffle's
    records through it)."""
    import torch.utils.data as tud
    if isinstance(obj, tud.Subset):
        inner = take_dataset(obj.dataset, connect)
        idx = np.asarray(list(obj.indices), dtype=np.int64)
        if idx.size and (idx.min() < -inner.n or idx.max() >= inner.n):
            raise IndexError(f"riffle.torch: a Subset of {inner.what} names index {int(idx.max())}, and it holds "
                             f"{inner.n} samples")
        idx = np.where(idx < 0, idx + inner.n, idx)
        if len(np.unique(idx)) != len(idx):
            raise ValueError(f"riffle.torch: a Subset of {inner.what} names some of its samples twice: riffle reads "
                             "each record once an epoch; give each index once")
        ids = inner.record(idx)
        # Ids of the records the inner dataset's options list (its extensions'), in place of its own subset.
        opts = dict(inner.opts, subset=_subset(ids))
        return Taken(inner.paths, opts, ids, len(ids), f"a Subset of {inner.what}")
    if _is_folder(obj):
        return _folder(obj, connect)
    if _is_hf(obj):
        return _hf(obj)
    name = type(obj).__name__
    if isinstance(obj, (list, tuple)):
        odd = next(type(p).__name__ for p in obj if not isinstance(p, (str, os.PathLike)))
        raise TypeError(f"riffle.torch: paths is a {name} holding a {odd}: riffle takes {TAKES}")
    if isinstance(obj, tud.ConcatDataset):
        raise TypeError("riffle.torch: a ConcatDataset is not taken: riffle reads one dataset's files (give a "
                        "list of files, or a directory of class folders), or draws from several by weight "
                        "(mixture=[(path, weight), ...])")
    if isinstance(obj, (tud.Dataset, tud.IterableDataset)) or hasattr(obj, "__getitem__"):
        raise TypeError(f"riffle.torch: a {name} is not taken: riffle reads the files of a dataset itself, in its "
                        f"daemon, and cannot call a dataset's __getitem__; it takes {TAKES}. For data held in "
                        "memory, save it to files first (np.save of a fixed-dtype array, or datasets' save_to_disk)")
    raise TypeError(f"riffle.torch: paths is a {name}: riffle takes {TAKES}")


# --- torchvision's folders ---

def _is_folder(obj: Any) -> bool:
    if "torchvision" not in sys.modules:
        return False
    from torchvision.datasets import DatasetFolder
    return isinstance(obj, DatasetFolder)


def _pil_loader(loader: Callable) -> bool:
    """Whether a folder's loader is torchvision's PIL loader (its default, or pil_loader itself): riffle's
    decode="image" opens each file as it does (PIL, converted to RGB)."""
    from torchvision import get_image_backend
    from torchvision.datasets import folder
    return loader is folder.pil_loader or (loader is folder.default_loader and get_image_backend() == "PIL")


def _folder(obj: Any, connect: dict) -> Taken:
    """An ImageFolder or DatasetFolder: its root, the records its samples are (riffle lists the root's files
    itself; the samples, which its extensions or is_valid_file chose, say which of them), images opened as its
    loader opens them, its transforms, and its labels, which must be riffle's (the class folders in sorted order)."""
    from torchvision.datasets import DatasetFolder
    name = type(obj).__name__
    if type(obj).__getitem__ is not DatasetFolder.__getitem__:
        raise TypeError(f"riffle.torch: {name} overrides __getitem__, which riffle cannot run (it reads and decodes "
                        "the files itself): pass its root with decode=, transform= and target_transform= that do "
                        "what its __getitem__ does")
    if not _pil_loader(obj.loader):
        what = getattr(obj.loader, "__qualname__", type(obj.loader).__name__)
        raise TypeError(f"riffle.torch: {name}(loader={what}) is not taken: riffle reads each file's bytes itself "
                        "and opens images as torchvision's default loader does (PIL, converted to RGB), not by "
                        "calling a loader with a path; pass the root with decode= a function of a riffle.Batch "
                        "(batch.record(i) is the bytes of its file i), or decode='bytes' and a transform of the bytes")
    from . import Loader, torch as rt
    root = os.path.abspath(obj.root)
    samples = [(os.path.abspath(p), int(t)) for p, t in obj.samples]
    exts = tuple(obj.extensions) if obj.extensions else None
    ld = Loader(root, 1, shuffle=False, extensions=exts, **connect)
    try:
        classes = list(ld.info().get("classes") or [])
        listed = list(rt._record_paths(ld))
    finally:
        ld.close()
    # Labels are riffle's: the class folders, sorted, as ImageFolder finds them; a find_classes of its own would
    # label other records otherwise.
    if dict(obj.class_to_idx) != {c: i for i, c in enumerate(classes)}:
        raise ValueError(f"riffle.torch: {name}'s class_to_idx is not its root's class folders in sorted order "
                         f"({classes[:5]}{'...' if len(classes) > 5 else ''}), which riffle labels records by: a "
                         "find_classes of its own, or folders riffle does not list (hidden ones)")
    for p, t in samples:
        first = os.path.relpath(p, root).split(os.sep, 1)[0]
        if obj.class_to_idx.get(first) != t:
            raise ValueError(f"riffle.torch: {name} labels {p} {t}, and riffle labels it by its class folder "
                             f"{first!r}: a make_dataset of its own is not taken")
    opts: dict[str, Any] = {"decode": "image", "transform": obj.transform, "target_transform": obj.target_transform}
    if sorted(listed) == sorted(p for p, _ in samples):
        ids = {p: i for i, p in enumerate(listed)}
        opts["extensions"] = exts  # every file riffle lists is a sample: no subset to send
    else:
        # The samples are some of the files (is_valid_file chose them): their records, of every file listed.
        ld = Loader(root, 1, shuffle=False, **connect)
        try:
            ids = {p: i for i, p in enumerate(rt._record_paths(ld))}
        finally:
            ld.close()
        missing = [p for p, _ in samples if p not in ids]
        if missing:
            raise ValueError(f"riffle.torch: {name}'s sample {missing[0]} is not a file riffle lists under {root} "
                             f"({len(missing)} such): riffle reads the files directly under each class folder's "
                             "tree; pass the root and riffle's own listing")
        opts["subset"] = _subset(np.array([ids[p] for p, _ in samples]))
    return Taken(root, opts, np.array([ids[p] for p, _ in samples], dtype=np.int64), len(samples),
                 f"{name}({obj.root!r})")


def _subset(ids: np.ndarray) -> dict:
    """Record ids as the daemon takes a subset: runs of consecutive ids as ranges when that is shorter."""
    ids = np.sort(np.asarray(ids, dtype=np.int64))
    if not len(ids):
        return {"ids": []}
    runs = np.split(ids, np.flatnonzero(np.diff(ids) != 1) + 1)
    if 2 * len(runs) < len(ids):
        return {"ranges": [[int(r[0]), int(r[-1]) + 1] for r in runs]}
    return {"ids": [int(i) for i in ids]}


# --- Hugging Face datasets ---

def _is_hf(obj: Any) -> bool:
    if "datasets" not in sys.modules:
        return False
    import datasets
    if isinstance(obj, datasets.DatasetDict):
        raise TypeError(f"riffle.torch: a DatasetDict of splits {list(obj)} is not taken: pass one split "
                        f"(dd[{next(iter(obj), 'train')!r}])")
    if isinstance(obj, (datasets.IterableDataset, datasets.IterableDatasetDict)):
        raise TypeError("riffle.torch: a datasets.IterableDataset (streaming) is not taken: riffle reads files at "
                        "random: save_to_disk it (or download it) and pass load_from_disk(path), or its files")
    return isinstance(obj, datasets.Dataset)


# Formats of a datasets.Dataset whose rows DataLoader collates into torch batches (and riffle with it).
HF_FORMATS = (None, "python", "torch", "numpy", "custom")


def _hf(obj: Any) -> Taken:
    """A datasets.Dataset: the Arrow files its table maps (each block's file, its rows as the block's slices
    leave them), the rows its indices mapping selects (select, filter, shuffle, train_test_split), the columns it
    keeps, and its format and transform, which riffle runs as datasets does (HFRows)."""
    import pyarrow as pa
    from datasets.table import ConcatenationTable, MemoryMappedTable
    fmt = obj._format_type
    if fmt not in HF_FORMATS:
        raise TypeError(f"riffle.torch: a datasets.Dataset of format {fmt!r} is not taken: riffle.torch makes torch "
                        "batches, as DataLoader does of the python, numpy, torch or custom (with_transform) "
                        "formats: with_format('torch'), or reset_format()")
    table = obj._data
    blocks = table.blocks if isinstance(table, ConcatenationTable) else [[table]]
    files: list[str] = []
    ranges: list[tuple[int, int]] = []  # each block's rows: (first, count) of its file's
    first = 0
    for row in blocks:
        if len(row) != 1 or not isinstance(row[0], MemoryMappedTable):
            raise ValueError("riffle.torch: this datasets.Dataset holds rows in memory (from_dict, from_pandas, "
                             "keep_in_memory, add_column, concatenated along columns), which riffle cannot read: "
                             "save_to_disk(path) and pass load_from_disk(path)")
        t = row[0]
        if t.path in files:
            raise ValueError(f"riffle.torch: this datasets.Dataset reads {t.path} twice (concatenate_datasets of "
                             "a dataset with itself): riffle reads each record once an epoch")
        lo, n = 0, _arrow_rows(t.path)
        total = n
        for op, args, kwargs in t.replays:
            if op == "slice":
                off = int(args[0] if args else kwargs.get("offset", 0))
                length = args[1] if len(args) > 1 else kwargs.get("length")
                lo, n = lo + off, max(0, min(n - off, n if length is None else int(length)))
            elif op == "filter":
                raise ValueError("riffle.torch: this datasets.Dataset's table was filtered in memory: save_to_disk "
                                 "the result and pass load_from_disk of it")
        files.append(t.path)
        ranges.append((first + lo, n))
        first += total
    # Columns the dataset dropped (remove_columns, select_columns) are left out; any other change of the files'
    # columns (rename, cast to another type, flatten) is the dataset's own in memory, not the files'.
    saved = pa.ipc.open_stream(pa.memory_map(files[0])).schema
    for f in table.schema:
        if saved.get_field_index(f.name) < 0 or saved.field(f.name).type != f.type:
            raise ValueError(f"riffle.torch: this datasets.Dataset's column {f.name!r} ({f.type}) is not its "
                             "files' (rename_column, cast_column to another type, flatten change them in memory): "
                             "save_to_disk the dataset and pass load_from_disk of it")
    base = np.concatenate([np.arange(lo, lo + n, dtype=np.int64) for lo, n in ranges]) if ranges else \
        np.zeros(0, np.int64)
    ids = base
    if obj._indices is not None:
        ids = base[np.asarray(obj._indices.column(0).to_numpy(), dtype=np.int64)]
    whole = len(ids) == first and (ids == np.arange(first)).all()
    opts: dict[str, Any] = {"format": "arrow", "hf_rows": HFRows(obj)}
    if list(table.schema.names) != list(saved.names):
        opts["columns"] = list(table.schema.names)
    if not whole:
        opts["subset"] = _subset(ids)
    return Taken(files, opts, ids, len(ids), "a datasets.Dataset")


def _arrow_rows(path: str) -> int:
    """Rows of an Arrow stream file (datasets' data-*.arrow): its record batches' lengths, read through a mapping."""
    import pyarrow as pa
    with pa.memory_map(path) as src:
        return sum(b.num_rows for b in pa.ipc.open_stream(src))


class HFRows:
    """A datasets.Dataset's format and transform, run on a batch of its rows as datasets runs them: its formatter
    (python, numpy, torch, or the with_transform/set_transform function, which takes a batch, a dict of lists)
    formats the batch's table, as ``dataset[ids]`` does, and each row of the result is a sample, as
    ``dataset[i]`` gives it, for DataLoader's collate."""

    def __init__(self, obj: Any):
        self.features = obj.features.copy()
        self.type = obj._format_type
        self.kwargs = dict(obj._format_kwargs or {})
        self.columns = list(obj._format_columns) if obj._format_columns is not None else None
        self.all_columns = bool(obj._output_all_columns)
        self.custom = self.type == "custom"
        names = {k: f.names for k, f in obj.features.items() if type(f).__name__ == "ClassLabel"}
        # The classes, as riffle.torch's datasets name them: the label column's ClassLabel names, else the first's.
        self.classes = names.get("label") or next(iter(names.values()), [])

    def batch(self, table) -> dict:
        """The batch's table formatted as datasets formats ``dataset[ids]``."""
        from datasets.formatting import format_table, get_formatter
        formatter = get_formatter(self.type, features=self.features, **self.kwargs)
        return format_table(table, range(table.num_rows), formatter=formatter, format_columns=self.columns,
                            output_all_columns=self.all_columns)

    @staticmethod
    def rows(formatted: dict, n: int) -> list[dict]:
        """A formatted batch's rows, as ``dataset[i]`` gives each (datasets' __getitems__ splits them so)."""
        return [{k: v[i] for k, v in formatted.items()} for i in range(n)]


# --- samplers ---

def take_sampler(sampler: Any, n: int | None) -> tuple[dict, Any]:
    """A torch sampler as riffle's options, and the DistributedSampler whose set_epoch the loader follows (or
    None); refused by name with the fix if riffle cannot do what it says. ``n`` is the dataset's samples, which a
    sampler built over the same dataset has."""
    import torch
    import torch.utils.data as tud
    name = type(sampler).__name__
    source = getattr(sampler, "dataset", None) if isinstance(sampler, tud.DistributedSampler) else \
        getattr(sampler, "data_source", None)
    if n is not None and source is not None and hasattr(source, "__len__") and len(source) != n:
        raise ValueError(f"riffle.torch: sampler={name} was built over a dataset of {len(source)} samples, and this "
                         f"one holds {n}: build it over the dataset given to riffle.torch.loader (or delete it)")
    if type(sampler) is tud.DistributedSampler:
        # As DistributedSampler splits an epoch: riffle's rank, world_size, seed, shuffle and rank_drop_last.
        return {"rank": int(sampler.rank), "world_size": int(sampler.num_replicas), "seed": int(sampler.seed),
                "shuffle": bool(sampler.shuffle), "rank_drop_last": bool(sampler.drop_last)}, sampler
    if type(sampler) is tud.SequentialSampler:
        return {"shuffle": False}, None
    if type(sampler) is tud.RandomSampler:
        if sampler.replacement or sampler._num_samples is not None:
            raise ValueError(f"riffle.torch: sampler=RandomSampler(replacement={sampler.replacement}, "
                             f"num_samples={sampler._num_samples}) is not taken: riffle reads each record once an "
                             "epoch; delete the sampler (shuffle=True), or pass ids= for part of the dataset")
        opts: dict[str, Any] = {"shuffle": True}
        if sampler.generator is not None:
            # The order from its generator, as RandomSampler draws its seed from it.
            opts["seed"] = int(torch.empty((), dtype=torch.int64).random_(generator=sampler.generator).item())
        return opts, None
    if type(sampler) is tud.SubsetRandomSampler:
        opts = {"shuffle": True, "ids": np.asarray(list(sampler.indices), dtype=np.int64)}
        if sampler.generator is not None:
            opts["seed"] = int(torch.empty((), dtype=torch.int64).random_(generator=sampler.generator).item())
        return opts, None
    if isinstance(sampler, tud.WeightedRandomSampler):
        raise TypeError("riffle.torch: sampler=WeightedRandomSampler is not taken: it draws records with "
                        "replacement by weight, and riffle reads each record once an epoch; to weight whole "
                        "datasets, pass mixture=[(path, weight), ...]")
    raise TypeError(f"riffle.torch: sampler={name} is not taken: riffle orders the records and splits them over "
                    "ranks itself (a shuffle of the whole dataset each epoch, rank and world size from "
                    "torch.distributed, as DistributedSampler splits it); delete sampler=, or give riffle's own: "
                    "shuffle=, seed=, ids= (part of the dataset), sampler='block', 'buffered', ... (cheaper orders)")


def follow(sampler: Any, dataset: Any) -> None:
    """Make ``sampler.set_epoch(e)`` (a DistributedSampler the script built and calls each epoch) also the
    dataset's ``set_epoch(e)``, for as long as the dataset lives."""
    followers = sampler.__dict__.setdefault("_riffle_followers", [])
    followers.append(weakref.ref(dataset))
    if len(followers) > 1:
        return  # set_epoch already forwards to every follower
    own = type(sampler).set_epoch

    def set_epoch(epoch: int) -> None:
        own(sampler, epoch)
        for ref in list(followers):
            ds = ref()
            if ds is None:
                followers.remove(ref)
            else:
                ds.set_epoch(epoch)

    set_epoch.__doc__ = own.__doc__
    sampler.set_epoch = set_epoch
