"""PyTorch adapter: an ``IterableDataset`` of whole batches and ``loader()``.

Replace::

    loader = DataLoader(dataset, batch_size=256, shuffle=True, num_workers=4)

with::

    import riffle.torch
    loader = riffle.torch.loader(dataset, batch_size=256, shuffle=True, num_workers=4)

where ``dataset`` is a torchvision ``ImageFolder`` or ``DatasetFolder``, a
Hugging Face ``datasets.Dataset`` in files (``load_from_disk``), a
``Subset`` of one, or the path of files riffle reads
(``riffle.torch.loader("train.bin", batch_size=256, record_size=3072,
dtype="uint8", shape=(3, 32, 32))``); a ``sampler=DistributedSampler(...)``
is taken too (see :class:`RiffleDataset`).

Each item is a batch, its records in a random order: a tensor (fixed-size
and ``.npy`` records, made with ``torch.from_numpy``, no copy), images
(``decode="image"``), or ``(data, labels)`` when the dataset has labels.
Each new iteration is the next epoch, as with ``DataLoader(shuffle=True)``;
``set_epoch`` (``loader.set_epoch``, ``loader.sampler.set_epoch``, or a
DistributedSampler's the loader was given) sets it, as DistributedSampler's
does; after ``load_state_dict``, ``set_epoch`` of the loaded state's epoch
goes on from the loaded place. Rank and world size come from
``torch.distributed`` when it is initialized, else from RANK and
WORLD_SIZE. DataLoader workers split each rank's batches between them
without padding: an epoch holds the same samples for any ``num_workers``.
``loader.state_dict()`` and ``load_state_dict()`` resume exactly, workers
included; ``len(loader)`` is what the rank delivers of the epoch it reads.

How long a batch's memory is valid: a tensor of fixed-size records or of
the daemon's transform outputs is a view of the shared memory the daemon
loaded the batch into, with or without workers (a worker lends its batch
to the main process: no copy crosses). It stays valid, and is never
overwritten, while the tensor or anything made from it (views, slices,
``.numpy()``) is alive; when the last goes, the batch's region goes back to
the daemon for a later batch. Holding batches holds the job's memory
(``memory=``). What a ``transform`` or ``batch_transform`` makes is the
user's own memory.
"""

from __future__ import annotations

import collections
import multiprocessing
import os
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch
import torch.utils.data

from . import ported as _ported
from . import spec
from .batch import Batch
from .client import Loader
from .errors import RecordError, RiffleError  # noqa: F401  (RecordError: riffle.torch's as before)
from .mixture import _history, _mixture, _segments, _weights_state, _with_weights
from .state import merge_states  # noqa: F401  (riffle.torch's as before)
# The dataset's parts: its places, its conversion of batches, the lending of shared memory, the ranks' agreement.
from ._torch_convert import _Convert, _first
from ._torch_dist import _agree_order, _dist, _draw_seed
from ._torch_lend import _borrowed, _lent, _Lent  # noqa: F401  (_borrowed, _Lent: riffle.torch's as before)
from ._torch_places import _at_start, _Places, _position

DECODERS = ("auto", "image", "bytes", "fixed", "npy", "libsvm", "jsonl", "text", "tar")

# torchvision's ImageFolder takes only these (torchvision.datasets.folder.IMG_EXTENSIONS).
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


# A batch and the place after it, from a worker, for the loader's state;
# with the positions of its epoch delivered before its job's batch 0 (the
# rest of an epoch resumed on another topology), and whether it is the
# rank's last batch of the epoch.
_Stamped = collections.namedtuple("_Stamped", "data worker state epoch index start last")


class RiffleDataset(_Places, _Convert, torch.utils.data.IterableDataset):
    """An iterable of batches, for ``DataLoader(ds, batch_size=None)`` (``loader()`` makes one).

    ``paths`` is what riffle reads: a file, a glob, a directory (of class
    folders, as ImageFolder's root) or a list of those; or a dataset object
    a DataLoader script built, whose files riffle reads as it would
    (``riffle.ported``): torchvision's ``ImageFolder`` or ``DatasetFolder``
    (its root, samples, loader, transform and target_transform), a Hugging
    Face ``datasets.Dataset`` in files (``load_from_disk``; its columns,
    select/filter, format and transform), or a ``Subset`` of one of those.
    ``sampler`` is riffle's order by name (``"block"``, ...), or a torch
    sampler: a ``DistributedSampler`` gives its rank, num_replicas, seed,
    shuffle and drop_last (``rank_drop_last``), and its ``set_epoch`` calls
    reach this dataset; ``RandomSampler``, ``SequentialSampler`` and
    ``SubsetRandomSampler`` say shuffle (and ids); any other is refused.

    ``decode`` turns a :class:`riffle.Batch` into data: ``"auto"`` picks by
    format (fixed/npy: a tensor of ``dtype`` and per-record ``shape``;
    libsvm: a dense float tensor if ``n_features`` is given, else a sparse
    CSR tensor, with labels; jsonl: dicts; text: strings; a directory whose
    every file is an image: images, as ``"image"``; tfrecord and other
    directories: bytes), ``"image"`` opens each record with PIL as an RGB
    image (as ImageFolder does), or pass a callable. ``transform`` applies
    to each sample, one at a time (torchvision transforms after
    ``"image"``; of rows, one row as a dict), ``target_transform`` to each
    label, and ``batch_transform`` to the decoded batch. An error in any
    names the record, its file and offset. A ``transform`` given as a
    string names a transform the daemon runs instead
    (``"image:size=256,crop=224"``, ``"libsvm_dense:n_features=N"``), once
    for every sharing job: the batch is then its outputs, one uint8 or
    float32 tensor. A function written for ``datasets``' ``with_transform``
    takes a batch (a dict of lists), not a row: give riffle the dataset
    with it, ``load_from_disk(path).with_transform(f)``, which runs it as
    datasets does.
    """

    def __init__(self, paths: Any = None, batch_size: int = spec.DEFAULT_BATCH_SIZE, *, shuffle: bool | None = None,
                 seed: int | None = None, decode: str | Callable[[Batch], Any] = "auto", dtype: Any = None,
                 shape: Sequence[int] | None = None, n_features: int | None = None, transform: Callable | None = None,
                 target_transform: Callable | None = None, batch_transform: Callable | None = None,
                 rank: int | None = None, world_size: int | None = None, drop_last: bool = False,
                 rank_drop_last: bool | None = None, is_valid_file: Callable[[str], bool] | None = None,
                 **loader_kwargs: Any):
        super().__init__()
        if not callable(decode) and decode not in DECODERS:
            raise ValueError(f"decode={decode!r}: want a callable or one of {', '.join(DECODERS)}")
        connect = {k: v for k, v in loader_kwargs.items() if k in ("socket", "address", "token", "autostart")}
        # A torch sampler, as riffle's options; the DistributedSampler whose set_epoch calls this dataset follows.
        sampler = loader_kwargs.get("sampler")
        follows, said, sampler_source = None, {}, None
        if sampler is not None and not isinstance(sampler, str):
            loader_kwargs.pop("sampler")
            if shuffle:
                raise ValueError(f"riffle.torch: sampler={type(sampler).__name__} and shuffle=True given: the sampler "
                                 "says whether to shuffle (as DataLoader, which takes one or the other)")
            said, follows = _ported.take_sampler(sampler, None)
            sampler_source = getattr(sampler, "dataset", getattr(sampler, "data_source", None))
            for k, mine in (("rank", rank), ("world_size", world_size), ("seed", seed), ("rank_drop_last", rank_drop_last)):
                if k in said and mine is not None and mine != said[k]:
                    raise ValueError(f"riffle.torch: {k}={mine!r} given, and sampler={type(sampler).__name__} says "
                                     f"{said[k]!r}: give one")
            shuffle = said.get("shuffle", shuffle)
            rank, world_size = said.get("rank", rank), said.get("world_size", world_size)
            seed = said.get("seed", seed)
            rank_drop_last = said.get("rank_drop_last", rank_drop_last)
        shuffle = True if shuffle is None else shuffle
        rank_drop_last = bool(rank_drop_last)
        # A dataset object a DataLoader script built: its files, and the options that say its records and decode them.
        taken = None
        self._hf: _ported.HFRows | None = None
        if not _ported.is_paths(paths):
            if is_valid_file is not None:
                raise ValueError("riffle.torch: is_valid_file= given with a dataset object, whose samples say which "
                                 "files are records: give it to the dataset, or pass its root")
            taken = _ported.take_dataset(paths, connect)
            paths = taken.paths
            mine = {"decode": decode, "transform": transform, "target_transform": target_transform}
            for k, v in taken.opts.items():
                if k == "hf_rows":
                    self._hf = v
                elif k in mine:
                    if v is not None and mine[k] not in (None, "auto", v):
                        raise ValueError(f"riffle.torch: {k}= given, and {taken.what} has its own: keep one")
                    if v is not None:
                        mine[k] = v
                elif loader_kwargs.get(k) is not None:
                    raise ValueError(f"riffle.torch: {k}= given with {taken.what}, which says its own: drop {k}=")
                else:
                    loader_kwargs[k] = v
            decode, transform, target_transform = mine["decode"], mine["transform"], mine["target_transform"]
            if self._hf is not None and self._hf.custom and transform is not None:
                raise ValueError("riffle.torch: transform= given with a datasets.Dataset that has its own transform "
                                 "(with_transform or set_transform): keep one")
            if self._hf is not None and decode != "auto":
                raise ValueError("riffle.torch: decode= given with a datasets.Dataset, whose features and format "
                                 "decode its rows: drop decode=")
        if "ids" in said:
            # A SubsetRandomSampler's indices are the dataset's samples: their records.
            ids = taken.record(said["ids"]) if taken is not None else said["ids"]
            if loader_kwargs.get("subset") is not None or loader_kwargs.get("ids") is not None:
                if taken is None:
                    raise ValueError("riffle.torch: sampler=SubsetRandomSampler and subset= or ids= given: give one")
            loader_kwargs.pop("subset", None)
            loader_kwargs["ids"] = ids
        if decode == "image":
            try:
                import PIL.Image  # noqa: F401
            except ImportError:
                raise ValueError('decode="image" needs Pillow (pip install pillow)') from None
            # As ImageFolder: only image files are records (a labels.csv in
            # a class folder is not one), unless extensions= or
            # is_valid_file= says otherwise (or the dataset object's samples).
            if is_valid_file is None and taken is None:
                loader_kwargs.setdefault("extensions", IMG_EXTENSIONS)
        if is_valid_file is not None:
            if loader_kwargs.get("extensions"):
                raise ValueError("both extensions= and is_valid_file= given: pass one (as ImageFolder takes)")
            if loader_kwargs.get("subset") is not None:
                raise ValueError("both subset= and is_valid_file= given: pass one")
            loader_kwargs["subset"] = _valid_files(paths, is_valid_file, loader_kwargs)
        self.rank, self.world_size = rank, world_size
        # Rank and world size are resolved here, in the main process, and
        # again as each epoch begins there; DataLoader workers take them
        # from the main process (a worker of mp.spawn's rank sees no
        # process group and no RANK), as DistributedSampler reads them once.
        self._topology = (0, 1)
        self._where()
        # No seed: drawn from torch's default generator (torch.manual_seed
        # decides it), the same on every rank; state_dict() records it.
        self._seed_drawn = seed is None
        if seed is None:
            seed = _draw_seed(self._topology[1])
        self.paths, self.batch_size, self.shuffle, self.seed = paths, batch_size, shuffle, seed
        self.decode, self.dtype, self.shape, self.n_features = decode, dtype, shape, n_features
        self.transform, self.batch_transform = transform, batch_transform
        self.target_transform = target_transform
        self.drop_last, self.rank_drop_last = drop_last, rank_drop_last
        if isinstance(transform, str):
            loader_kwargs["transform"], transform = transform, None
            self.transform = None
        self.loader_kwargs = loader_kwargs
        # Loader's own checks, now: a misspelt option fails here, not at the first batch.
        probe = Loader(paths, batch_size, shuffle=shuffle, seed=seed, dtype=dtype, shape=shape, drop_last=drop_last,
                       rank_drop_last=rank_drop_last, **loader_kwargs)
        # The data as it is now is the dataset's: a state saved over other data is refused, and every loader made
        # for it (a DataLoader worker's, each epoch's) reads these files or says they changed (DataChanged).
        self._dataset_version, self._dataset_records = probe._version, probe._records
        # What the order is, as the daemon said of the probe's (its kind, and how a place in it resumes): every
        # loader of this dataset reads the same order, on any rank and worker, and its places follow it.
        self._order = dict(probe.order)
        # What its states record of the order and samples, and a loaded state must match (Loader.ordering).
        self._ordering = probe.ordering
        if sampler_source is not None and hasattr(sampler_source, "__len__"):
            samples = int(probe.info().get("samples") or probe._records or 0)
            if len(sampler_source) != samples:
                raise ValueError(f"riffle.torch: sampler={type(sampler).__name__} was built over a dataset of "
                                 f"{len(sampler_source)} samples, and riffle reads {samples} here: build it over the "
                                 "dataset given to riffle.torch.loader, or delete it")
        if (decode == "auto" and taken is None and not loader_kwargs.get("transform")
                and probe.info().get("format") == "dir" and _all_images(probe, paths, loader_kwargs)):
            # Every record is an image file (and the daemon transforms none): open them as ImageFolder does.
            self.decode = "image"
        self._auto_order: dict | None = None
        if probe.auto is not None:
            # sampler="auto" chose an order: every rank and worker reads the
            # one rank 0's daemon chose (another node measures another
            # device), and a state records it for the run that resumes.
            self._auto_order = _agree_order(probe.auto, self._topology[1])
            loader_kwargs["auto_order"] = self._auto_order
        # The epoch lives in shared memory, so persistent workers see set_epoch
        # too; so does the shift of workers' roles a resumed state asks for.
        self._epoch = multiprocessing.get_context().Value("q", 0, lock=False)
        self._shift = multiprocessing.get_context().Value("q", 0, lock=False)
        self._explicit = True  # the first iteration is epoch 0, or the one set
        self._iterated = False
        self._driven = False  # a RiffleDataLoader advances epochs and collects states
        self._resume: dict | None = None
        self._fn_state: dict | None = None  # a loaded state's mixture_function (Loader._follow_state)
        self._over: int | None = None  # the epoch set_epoch asked for that the loaded place is past the end of
        # The state the epoch being read resumed from (or went on from after a weight change), its count of
        # batches from there, and the batches the iteration handed over before it.
        self._resumed: list | None = None
        self._handed = 0
        # The iteration delivering batches in the main process (a token of its own), and whether set_weights
        # changed the weights at its next step: it goes on from the place the change loaded.
        self._live: object | None = None
        self._changed = False
        self._states: dict[int, dict] = {}
        self._workers = 0
        self._next = 0  # the role of the worker whose batch comes next
        self._place: dict | None = None  # the rank's place after the last batch delivered, with workers
        self._ld: Loader | None = None
        self._ld_owner: tuple[int, int] | None = None
        self._info: dict | None = None
        self._samples: list[tuple[str, int]] | None = None
        if follows is not None:
            # The script calls its DistributedSampler's set_epoch each epoch: so this dataset's is called.
            _ported.follow(follows, self)
            if int(follows.epoch):
                self.set_epoch(int(follows.epoch))

    def __getstate__(self):
        s = dict(self.__dict__)
        s["_ld"] = None  # a worker connects itself
        return s

    # --- epochs ---
    @property
    def epoch(self) -> int:
        return int(self._epoch.value)

    def set_weights(self, weights: Sequence[float], epoch: int | None = None) -> None:
        """A mixture's new weights, from the next global step by default, as the ``Loader``'s: called between steps
        of an epoch, the batch after the last one handed over is the new weights' (the batches DataLoader's workers
        fetched ahead are dropped, and the workers start again from that place); called between epochs, or before
        the first, the next epoch's first step is. ``epoch`` makes them from that epoch's start instead (not one this
        rank has begun). Each source goes on from where the old weights left it, and from the change every source is
        within one sample of its share of the samples since. The change is at a place of the epoch's order (global
        step k is position k x batch_size x world_size), as ``mixture_schedule=[(k, weights)]`` would put it, and
        ``state_dict()`` keeps it, so a resume on any topology reproduces it. An order whose places are not
        positions (``share=True``, opportunistic) takes new weights only from an epoch's start (``epoch=``).

        Under DDP every rank must call it at the same step, as a training loop does (``if step == k:
        loader.set_weights(w)`` on each): a rank that changes at another step reads samples of another schedule,
        and ``riffle.merge_states`` and ``state_dict(all_ranks=True)`` refuse ranks' states whose weights' histories
        disagree."""
        mix = self.loader_kwargs.get("mixture")
        if mix is None:
            raise ValueError("set_weights: this dataset reads no mixture")
        if callable(self.loader_kwargs.get("mixture_schedule")):
            raise ValueError("set_weights: this dataset's weights follow its mixture_schedule function")
        segs = _segments(_mixture(mix, prefixes=True), self.loader_kwargs.get("mixture_history"))
        inside = self._live or self._resume is not None  # the next step is a place inside an epoch, maybe
        if not inside:
            nxt = self._epoch.value + (1 if self._iterated and not self._explicit else 0)
            self._set_segments(_with_weights(segs, weights, nxt if epoch is None else int(epoch), 0, len(mix)))
            return
        # The place after the last batch handed over (or the loaded place): its epoch and position.
        st = self.state_dict()
        place = (int(st["epoch"]), _position(st, self._where()[1] * self.batch_size))
        if epoch is not None:
            if (int(epoch), 0) < place:
                raise ValueError(f"set_weights(epoch={epoch}): this rank has begun epoch {place[0]} (its next step is "
                                 f"position {place[1]}): give a later epoch, or no epoch for the next step")
            self._set_segments(_with_weights(segs, weights, int(epoch), 0, len(mix)))
            return
        if place[1] and not self._order["positional"]:
            raise ValueError(f"set_weights at the next step: this loader's order ({self._order['kind']}, shared or "
                             "opportunistic) resumes only from its parts' places, not from a position: give "
                             "epoch= (a later epoch's start)")
        segs = _with_weights(segs, weights, place[0], place[1], len(mix))
        self._set_segments(segs)
        if self._live and place[0] == self.epoch and place[1]:
            # Inside the epoch being read: its iterator goes on from the place, a job of the new weights.
            explicit = self._explicit
            self.load_state_dict(dict(st, mixture_weights=_weights_state(segs)))
            self._explicit = explicit  # still this iteration's epoch: the next iteration is the next epoch
            self._changed = True
            # len(): the batches handed over, and those left from the place under the new weights.
            self._resumed = [dict(self._resume), None, self._handed]

    def _set_segments(self, segs: list) -> None:
        """The mixture's weights from each place on, as the loaders' options: its last weights and the history."""
        mix = _mixture(self.loader_kwargs["mixture"], prefixes=True)
        self.loader_kwargs["mixture"] = [(s["paths"], w) for s, w in zip(mix, segs[-1][2])]
        self.loader_kwargs["mixture_history"] = _history(segs)
        if not callable(self.loader_kwargs.get("mixture_schedule")):
            self.loader_kwargs.pop("mixture_schedule", None)  # the segments hold it
        self._ld = None  # the next loader takes them

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration epoch ``epoch`` (each iteration is the next epoch without it), as
        DistributedSampler.set_epoch.

        After ``load_state_dict(state)``, until the next iteration, ``set_epoch`` of the epoch the state is in keeps
        the loaded place: the next iteration is the rest of that epoch, as a training loop that calls
        ``set_epoch(epoch)`` at each epoch's start expects when it resumes at its checkpoint's epoch. A state taken
        after an epoch's last batch is at the start of the next epoch, and so at the end of the one it ended:
        ``set_epoch`` of that one makes an iteration of no batches (nothing of it is left; ``len()`` is 0), and the
        next iteration is the state's epoch. Any other epoch starts at its beginning, and the loaded place is
        dropped.
        """
        epoch = int(epoch)
        res = self._resume
        self._explicit = True
        if res is not None and epoch == int(res["epoch"]):
            self._epoch.value, self._over = epoch, None
            return
        if res is not None and epoch == int(res["epoch"]) - 1 and _at_start(res):
            self._epoch.value, self._over = epoch, epoch
            return
        self._epoch.value, self._over = epoch, None
        self._resume = None

    def _begin(self) -> bool:
        """Start an iteration in the main process: the next epoch, unless one was set. False if the epoch set
        ended at the loaded place: the iteration delivers nothing, and the next is the place's epoch."""
        if self._over is not None:
            self._over = None
            self._explicit, self._iterated = False, True
            return False
        if self._changed:
            # A weight change at the next step of an iteration left unfinished: this iteration is the next epoch.
            self._changed, self._resume = False, None
        if self._iterated and not self._explicit:
            self._epoch.value += 1
        self._explicit, self._iterated = False, True
        self._where()
        # The count of batches a resumed epoch delivers, for len() while it is read (worked out when asked): those
        # handed over before the place, and those after it.
        self._resumed = [dict(self._resume), None, 0] if self._resume is not None else None
        self._handed = 0  # batches of this iteration handed over
        if self._resume is None:
            # A new epoch: every worker's role starts at its beginning, and
            # worker 0 plays role 0, as in a run never interrupted.
            self._states, self._shift.value, self._next, self._place = {}, 0, 0, None
        return True

    def _where(self) -> tuple[int, int]:
        """This rank and world size: resolved in the main process, carried to workers."""
        if torch.utils.data.get_worker_info() is None:
            r, w = _dist()
            self._topology = (r if self.rank is None else self.rank, w if self.world_size is None else self.world_size)
        return self._topology

    # --- loading ---
    def _new_loader(self, seed: int, kw: dict) -> Loader:
        """A Loader of this dataset's options for this rank, with kw (the loader's own options, a role's stride)."""
        rank, world = self._where()
        ld = Loader(self.paths, self.batch_size, shuffle=self.shuffle, seed=seed, rank=rank, world_size=world,
                    drop_last=self.drop_last, rank_drop_last=self.rank_drop_last, dtype=self.dtype,
                    shape=self.shape, **kw)
        if self._fn_state is not None:
            # A schedule function's evaluation as a loaded state says it: the steps' positions, the epochs done.
            ld._follow_state(self._fn_state)
        # Bound to the data the dataset was built over, not to what the files hold when a worker starts: a worker
        # that began its epoch after a file changed would read other records than its rank's others.
        ld._version, ld._records = self._dataset_version, self._dataset_records
        return ld

    def _loader(self) -> Loader:
        """This process's Loader at its role's place (a resumed role's may be past this epoch)."""
        info = torch.utils.data.get_worker_info()
        kw = dict(self.loader_kwargs)
        worker = 0
        if info is not None and info.num_workers > 1:
            # Workers take turns at this rank's batches: no padding, and
            # DataLoader's round robin puts them back in order. After a
            # resume, worker 0 plays the role whose batch is next.
            worker = (info.id + self._shift.value) % info.num_workers
            kw.update(batch_stride=info.num_workers, batch_offset=worker)
        ld = self._ld
        owner = (os.getpid(), worker)
        if ld is None or self._ld_owner != owner:
            # A forked worker inherits the main process's loader: it needs its own.
            ld = self._new_loader(self.seed, kw)
            self._ld, self._ld_owner = ld, owner
        epoch = self.epoch
        res = self._resume
        if res is not None and "workers" in res:
            if int(res.get("num_workers", 0)) != (info.num_workers if info is not None else 1):
                raise RiffleError(f"state was saved with {res.get('num_workers')} workers, this DataLoader has "
                                  f"{info.num_workers if info is not None else 0}: load it through riffle.torch.loader")
            res = res["workers"].get(str(worker))
        if res is not None and "batch" in res:
            ld.load_state_dict(res)
        else:
            ld._to_epoch(epoch)
        return ld

    def info(self) -> dict:
        """The dataset's description (format, classes, counts), from the daemon."""
        if self._info is None:
            self._info = self._loader().info()
        return self._info

    @property
    def classes(self) -> list[str]:
        """Class names: a directory dataset's, sorted, as ImageFolder's; a Hugging Face dataset's ClassLabel names
        (the ``label`` column's, else the first ClassLabel's), as ``features[...].names``."""
        if self._hf is not None:
            return list(self._hf.classes)
        info = self.info()
        if info.get("classes"):
            return list(info["classes"])
        feats = info.get("features") or {}
        labels = [(k, f) for k, f in feats.items() if isinstance(f, dict) and f.get("_type") == "ClassLabel"]
        labels.sort(key=lambda kf: kf[0] != "label")
        return list(labels[0][1].get("names") or []) if labels else []

    @property
    def class_to_idx(self) -> dict[str, int]:
        """Class name to label, as ImageFolder's."""
        return {c: i for i, c in enumerate(self.classes)}

    def __len__(self) -> int:
        """Samples per epoch, as ``len()`` of a map-style dataset: the dataset's records (its subset's), over every
        rank. ``len(loader)`` is the batches this rank delivers."""
        return int(self.info().get("samples") or self.info()["records"])

    def __getitem__(self, i: int) -> Any:
        """Sample ``i`` (a record id), decoded and transformed as the batches are: ``(x, label)`` when the dataset
        has labels, as ImageFolder's. One read of one record, for inspection; iterate for training."""
        n = len(self)
        if not isinstance(i, (int, np.integer)) or isinstance(i, bool):
            raise TypeError(f"dataset indices must be integers, not {type(i).__name__}")
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"index {i} is out of range for a dataset of {n} samples")
        kw = {k: v for k, v in self.loader_kwargs.items() if k not in ("subset", "share", "opportunistic", "sampler",
                                                                         "batch_stride", "batch_offset")}
        ld = Loader(self.paths, 1, shuffle=False, seed=self.seed, dtype=self.dtype, shape=self.shape, subset=[int(i)],
                    **kw)
        try:
            for batch in ld:
                out = self._convert(batch, ld, shared=False)
                if isinstance(out, tuple):
                    data, labels = out
                    return _first(data), int(labels[0])
                return _first(out)
        finally:
            ld.close()
        raise IndexError(f"sample {i} was not delivered")

    @property
    def samples(self) -> list[tuple[str, int]]:
        """(path, class index) of every record of a directory dataset, as ImageFolder's ``samples``."""
        info = self.info()
        if info.get("format") != "dir":
            raise AttributeError(f"samples: a directory (ImageFolder) dataset has them, not a {info.get('format')} one")
        if self._samples is None:
            root = os.path.abspath(info["paths"][0])
            idx = self.class_to_idx
            out = []
            for path in _record_paths(self._loader()):
                rel = os.path.relpath(path, root)
                out.append((path, idx.get(rel.split(os.sep, 1)[0], -1)))
            self._samples = out
        return self._samples

    @property
    def targets(self) -> list[int]:
        """Every record's class index, as ImageFolder's ``targets``."""
        return [c for _, c in self.samples]

    @property
    def imgs(self) -> list[tuple[str, int]]:
        return self.samples

    def _batches(self) -> int:
        """Batches this rank delivers in the epoch it reads (or reads next), all workers' together, as the daemon
        counts them: after a resume, those after the loaded place, until that epoch ends."""
        if torch.utils.data.get_worker_info() is not None:
            return len(self._loader())
        if self._over is not None:
            return 0
        if self._resume is not None and not self._changed:
            return self._left(self._resume)
        if self._resumed is not None and not self._explicit:
            if self._resumed[1] is None:
                self._resumed[1] = self._left(self._resumed[0])
            return self._resumed[2] + self._resumed[1]
        if not self._workers:
            return len(self._loader())
        # Each worker's share is its own job's count: the daemon's, for each
        # role (a shared job's roles are dealt records, not batches).
        total = 0
        for role in range(self._workers):
            ld = self._role_loader(role)
            total += len(ld)
            ld.close()
        return total

    def _left(self, state: dict) -> int:
        """Batches this rank delivers of the epoch from a loaded place (this dataset's form of it) to the end."""
        total = 0
        for role in range(max(1, self._workers)):
            st = state["workers"].get(str(role)) if "workers" in state else state
            ld = self._role_loader(role)
            try:
                if st is not None and "batch" in st:
                    ld.load_state_dict(st)
                else:
                    ld._to_epoch(int(state["epoch"]))
                # A role past the epoch delivered its last batch of it before the state was saved.
                total += 0 if ld.epoch > int(state["epoch"]) else ld.left()
            finally:
                ld.close()
        return total

    def _role_loader(self, role: int) -> Loader:
        """A loader of this rank's batches that worker ``role`` delivers (all of them without workers)."""
        kw = self.loader_kwargs
        if self._workers > 1:
            kw = dict(kw, batch_stride=self._workers, batch_offset=role)
        return self._new_loader(self.seed, kw)

    def __iter__(self) -> Iterator[Any]:
        info = torch.utils.data.get_worker_info()
        main = info is None and not self._driven  # iterated by itself, not by a RiffleDataLoader
        if main and not self._begin():
            return
        me = object()
        if main:
            self._live = me
        try:
            while True:
                ld = self._loader()
                self._resume = None
                if ld.epoch > self.epoch:
                    # This role delivered its last batch of the epoch before the
                    # state was saved (its place is the next epoch's start): it has
                    # nothing left of this epoch.
                    self._resumed = None
                    return
                stamp = info is not None and self._driven
                worker = info.id if info is not None else 0
                start = ld._start
                for batch in ld:
                    out = self._convert(batch, ld, shared=info is not None)
                    if info is not None:
                        out = _lent(ld, batch, out)
                    self._handed += main
                    yield (_Stamped(out, worker, batch.state, batch.epoch, batch.index, start, batch.last) if stamp
                           else out)
                    del batch, out
                    if main and self._changed:
                        break  # set_weights at the next step: the rest is a job of the new weights
                else:
                    break
                ld.close()
                self._changed = False
        finally:
            if self._live is me:
                self._live = None
        if main:
            self._resumed = None  # the resumed epoch is over: len() is the next's


def _record_paths(ld: Loader) -> Iterator[str]:
    """The file of every record of ld's dataset, in id order: where the daemon says each lives, asked in chunks."""
    n = int(ld.info()["records"])
    for lo in range(0, n, 1 << 15):
        for path, _ in ld.locate(list(range(lo, min(n, lo + (1 << 15))))):
            yield path


def _all_images(probe: Loader, paths: Any, kw: dict) -> bool:
    """Whether every file of a directory dataset is an image file (by ImageFolder's extensions), so that
    decode="auto" opens its records as images: the records the daemon lists of image files alone are all of them."""
    if kw.get("extensions") or not probe._records:
        return False
    try:
        import PIL.Image  # noqa: F401
    except ImportError:
        return False
    try:
        ld = Loader(paths, 1, shuffle=False, extensions=IMG_EXTENSIONS,
                    **{k: v for k, v in kw.items() if k in ("format", "socket", "address", "token", "autostart")})
    except RiffleError:
        return False  # no image file at all
    try:
        return ld._records == probe._records
    finally:
        ld.close()


def _valid_files(paths: Any, is_valid_file: Callable[[str], bool], kw: dict) -> list[int]:
    """The records whose file is_valid_file takes, as ImageFolder's is_valid_file: a subset of ids, found
    once from where each record lives (the daemon's own listing, so the ids are its)."""
    probe = Loader(paths, 1, shuffle=False, **{k: v for k, v in kw.items() if k in ("format", "split", "socket",
                                                                                   "address", "token", "autostart")})
    try:
        ids = [i for i, path in enumerate(_record_paths(probe)) if is_valid_file(path)]
    finally:
        probe.close()
    if not ids:
        raise FileNotFoundError(f"is_valid_file took no file of {paths}")
    return ids


# DataLoader's options riffle.torch.loader passes on, and those it refuses
# because riffle does their job (shuffle= and sampler= are riffle's own).
_PASSED = {"num_workers", "pin_memory", "timeout", "worker_init_fn", "multiprocessing_context", "prefetch_factor",
           "persistent_workers", "pin_memory_device", "generator"}
_REFUSED = {
    "batch_sampler": "riffle makes the batches, in an order of its own split over ranks as DistributedSampler splits "
                     "it: pass batch_size= and drop_last= (and shuffle=, seed=, ids= for what a sampler chose)",
    "collate_fn": "riffle makes the batches: pass decode=, transform= or batch_transform=",
}


class RiffleSampler:
    """``loader.sampler`` of a riffle loader: what DDP code reads of a DataLoader's DistributedSampler. riffle
    orders the records and splits them over ranks itself, in its daemon; this sampler says how, and its
    ``set_epoch`` is the dataset's (see :meth:`RiffleDataset.set_epoch`: after ``load_state_dict``, the epoch the
    state is in goes on from the loaded place). ``len()`` is this rank's samples per epoch, as DistributedSampler's
    ``num_samples``. It yields no indices: riffle's order is the daemon's, batch by batch."""

    def __init__(self, dataset: "RiffleDataset"):
        self.dataset = dataset

    def set_epoch(self, epoch: int) -> None:
        self.dataset.set_epoch(epoch)

    @property
    def epoch(self) -> int:
        return self.dataset.epoch

    @property
    def rank(self) -> int:
        return self.dataset._where()[0]

    @property
    def num_replicas(self) -> int:
        return self.dataset._where()[1]

    @property
    def seed(self) -> int:
        return self.dataset.seed

    @property
    def shuffle(self) -> bool:
        return self.dataset.shuffle

    @property
    def drop_last(self) -> bool:
        return self.dataset.rank_drop_last

    @property
    def num_samples(self) -> int:
        return int(self.dataset.info()["positions"])

    @property
    def total_size(self) -> int:
        return self.num_samples * self.num_replicas

    def __len__(self) -> int:
        return self.num_samples

    def __iter__(self):
        raise TypeError("riffle.torch: a riffle loader's sampler yields no indices: the daemon orders the records; "
                        "iterate the loader")


class RiffleDataLoader(torch.utils.data.DataLoader):
    """A DataLoader over a :class:`RiffleDataset` that advances the epoch each iteration and keeps a state per worker."""

    def __init__(self, dataset: RiffleDataset, **kwargs: Any):
        dataset._driven = True
        dataset._workers = int(kwargs.get("num_workers") or 0)
        self._sampler = RiffleSampler(dataset)
        super().__init__(dataset, batch_size=None, **kwargs)

    # DataLoader's own sampler of an IterableDataset (one that yields None for ever) drives its iterators;
    # ``sampler`` is what DDP code reads: set_epoch, len, rank, num_replicas.
    @property
    def sampler(self) -> RiffleSampler:
        return self._sampler

    @sampler.setter
    def sampler(self, value) -> None:
        self._dl_sampler = value  # DataLoader.__init__ sets its own; after it, DataLoader refuses any change

    @property
    def _index_sampler(self):
        return self._dl_sampler

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration epoch ``epoch``, as DistributedSampler.set_epoch (see RiffleDataset.set_epoch:
        after load_state_dict, the epoch the state is in goes on from the loaded place)."""
        self.dataset.set_epoch(epoch)

    # DataLoader keeps batch_size (None: riffle makes the batches); code that
    # computes steps from it reads the dataset's.
    @property
    def batch_size(self) -> int:
        return self.dataset.batch_size

    @batch_size.setter
    def batch_size(self, value) -> None:
        if value is not None:
            raise ValueError("riffle.torch: the batch size is the dataset's (riffle.torch.loader(..., batch_size=))")

    @property
    def drop_last(self) -> bool:
        return self.dataset.drop_last

    @drop_last.setter
    def drop_last(self, value) -> None:
        pass  # DataLoader's own drop_last is meaningless with batch_size=None; riffle's is the dataset's

    def __len__(self) -> int:
        """Batches this rank delivers in the epoch it reads (or reads next), as the daemon counts them: after
        load_state_dict, those left of the loaded place's epoch, until that epoch ends; then every epoch's."""
        return self.dataset._batches()

    def __iter__(self):
        ds = self.dataset
        if not ds._begin():
            return  # the epoch set ended at the loaded place: nothing of it is left
        me = object()
        ds._live = me
        try:
            while True:
                it = super().__iter__()
                if ds._workers:
                    # The workers started with the resume state, if any, by value;
                    # it is spent now, so the next workers start the next epoch.
                    ds._resume = None
                for item in it:
                    ds._handed += 1
                    if isinstance(item, _Stamped):
                        ds._record(item.worker, item.state, item.epoch, item.index, item.start, item.last)
                        yield item.data
                    else:
                        yield item
                    if ds._changed:
                        break  # set_weights at the next step: go on from the place after the last batch handed over
                else:
                    break
                # The workers, and the batches they fetched ahead under the old
                # weights, go; new ones start from the place (ds._resume).
                if hasattr(it, "_shutdown_workers"):
                    it._shutdown_workers()
                del it
                self._iterator = None
                ds._changed = False
        finally:
            if ds._live is me:
                ds._live = None
        ds._resumed = None  # the resumed epoch is over: len() is the next's

    def state_dict(self, all_ranks: bool = False) -> dict[str, Any]:
        """The place after the last batch delivered (the dataset's; see RiffleDataset.state_dict for all_ranks)."""
        return self.dataset.state_dict(all_ranks)

    def set_weights(self, weights: Sequence[float], epoch: int | None = None) -> None:
        """A mixture's new weights from the next global step, or from ``epoch``'s start (see
        RiffleDataset.set_weights: every rank must call it at the same step)."""
        self.dataset.set_weights(weights, epoch)
        self._iterator = None  # persistent workers hold the old ones

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at a place state_dict() returned."""
        self.dataset.load_state_dict(state)
        # Persistent workers hold the dataset as it was when they started:
        # new ones take the state.
        self._iterator = None


def loader(paths: str | Sequence[str] | None = None, batch_size: int = spec.DEFAULT_BATCH_SIZE, **kwargs: Any) -> RiffleDataLoader:
    """A DataLoader over a :class:`RiffleDataset`, called as DataLoader is: ``paths`` is the dataset (a path, or
    an ImageFolder, a datasets.Dataset, a Subset: see RiffleDataset), and ``sampler=`` may be the
    DistributedSampler a DDP script built. DataLoader's own options (num_workers, pin_memory, prefetch_factor,
    persistent_workers, ...) are passed on, the rest go to the dataset; ``batch_sampler`` and ``collate_fn`` are
    refused, saying what to pass instead."""
    for k, why in _REFUSED.items():
        if k in kwargs:
            raise TypeError(f"riffle.torch.loader: {k}={type(kwargs[k]).__name__} is not taken: {why}")
    dl = {k: kwargs.pop(k) for k in list(kwargs) if k in _PASSED}
    workers = int(dl.get("num_workers") or 0)
    for k in ("prefetch_factor", "persistent_workers"):
        if dl.get(k) and workers == 0:
            raise ValueError(f"riffle.torch.loader: {k}= needs num_workers > 0 (riffle reads ahead by itself; "
                             "drop it, or add workers)")
    ds = RiffleDataset(paths, batch_size, **kwargs)
    return RiffleDataLoader(ds, **dl)
