"""PyTorch adapter: an ``IterableDataset`` of whole batches and ``loader()``.

Replace::

    loader = DataLoader(dataset, batch_size=256, shuffle=True, num_workers=4)

with::

    import riffle.torch
    loader = riffle.torch.loader("train.bin", batch_size=256, record_size=3072, dtype="uint8", shape=(3, 32, 32))

and call ``loader.dataset.set_epoch(epoch)`` each epoch as with
DistributedSampler. Each item is a batch: a tensor (fixed-size and ``.npy``
records, made with ``torch.from_numpy``, no copy), or ``(data, labels)`` when
the dataset has labels. Rank and world size come from ``torch.distributed``
when it is initialized, else from the RANK and WORLD_SIZE environment
variables; DataLoader workers split each rank's share further.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch
import torch.utils.data

from . import decode as _decode
from .client import Batch, Loader


def _dist() -> tuple[int, int]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


class RiffleDataset(torch.utils.data.IterableDataset):
    """An iterable of batches, for ``DataLoader(ds, batch_size=None)``.

    ``decode`` turns a :class:`riffle.Batch` into data: ``"auto"`` picks by
    format (fixed/npy: a tensor of ``dtype`` and per-record ``shape``;
    libsvm: a dense float tensor if ``n_features`` is given, else a sparse
    CSR tensor, with labels; jsonl: dicts; text: strings; tfrecord and dir:
    bytes), or pass a callable. ``transform`` applies to each sample and
    ``batch_transform`` to the decoded batch.
    """

    def __init__(self, paths: str | Sequence[str], batch_size: int = 256, *, shuffle: bool = True, seed: int = 0,
                 decode: str | Callable[[Batch], Any] = "auto", dtype: Any = None, shape: Sequence[int] | None = None,
                 n_features: int | None = None, transform: Callable | None = None,
                 batch_transform: Callable | None = None, rank: int | None = None, world_size: int | None = None,
                 drop_last: bool = False, **loader_kwargs: Any):
        super().__init__()
        self.paths, self.batch_size, self.shuffle, self.seed = paths, batch_size, shuffle, seed
        self.decode, self.dtype, self.shape, self.n_features = decode, dtype, shape, n_features
        self.transform, self.batch_transform = transform, batch_transform
        self.rank, self.world_size, self.drop_last = rank, world_size, drop_last
        self.loader_kwargs = loader_kwargs
        self.epoch = 0
        self._resume: dict | None = None
        self._last_state: dict | None = None

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self._resume = None

    def _loader(self) -> Loader:
        r, w = _dist()
        rank = r if self.rank is None else self.rank
        world = w if self.world_size is None else self.world_size
        info = torch.utils.data.get_worker_info()
        if info is not None and info.num_workers > 1:
            # Each worker process takes a disjoint share of this rank's share.
            rank, world = rank * info.num_workers + info.id, world * info.num_workers
        ld = Loader(self.paths, self.batch_size, shuffle=self.shuffle, seed=self.seed, rank=rank, world_size=world,
                    drop_last=self.drop_last, epoch=self.epoch, **self.loader_kwargs)
        if self._resume is not None:
            ld.load_state_dict(self._resume)
        return ld

    def __len__(self) -> int:
        return len(self._loader())

    def __iter__(self) -> Iterator[Any]:
        ld = self._loader()
        for batch in ld:
            self._last_state = ld.state_dict()
            yield self._convert(batch)
        self._resume = None
        self.epoch = ld.epoch

    def state_dict(self) -> dict[str, Any]:
        """The place after the last batch yielded (with num_workers=0)."""
        return dict(self._last_state or {"epoch": self.epoch, "batch": 0, "seed": self.seed})

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch = int(state["epoch"])
        self._resume = dict(state)

    def _convert(self, batch: Batch) -> Any:
        data = self._decode(batch)
        if self.transform is not None:
            samples = [self.transform(x) for x in data]
            data = torch.stack(samples) if samples and isinstance(samples[0], torch.Tensor) else samples
        if self.batch_transform is not None:
            data = self.batch_transform(data)
        labels = None if batch.labels is None else torch.from_numpy(batch.labels)
        return data if labels is None else (data, labels)

    def _decode(self, batch: Batch) -> Any:
        if callable(self.decode):
            return self.decode(batch)
        fmt = batch.info.get("format")
        if fmt == "npy" and self.dtype is None:
            return torch.from_numpy(_decode.npy(batch))
        if fmt in ("fixed", "npy"):
            return torch.from_numpy(_decode.fixed(batch, self.dtype or np.uint8, self.shape))
        if fmt == "libsvm":
            y, x = _decode.libsvm(batch, self.n_features, dense=self.n_features is not None)
            if self.n_features is None:
                indptr, ind, val = x
                n_feat = int(ind.max()) + 1 if len(ind) else 0
                x = torch.sparse_csr_tensor(torch.from_numpy(indptr), torch.from_numpy(ind), torch.from_numpy(val),
                                            size=(batch.n, n_feat))
            else:
                x = torch.from_numpy(x)
            return x, torch.from_numpy(y)
        if fmt == "jsonl":
            return _decode.jsonl(batch)
        if fmt in ("text", "csv"):
            return _decode.lines(batch)
        return [bytes(r) for r in batch.records()]


def loader(paths: str | Sequence[str], batch_size: int = 256, *, num_workers: int = 0, pin_memory: bool = False,
           **kwargs: Any) -> torch.utils.data.DataLoader:
    """A ``DataLoader`` over a :class:`RiffleDataset`; ``loader.dataset.set_epoch(e)`` each epoch."""
    ds = RiffleDataset(paths, batch_size, **kwargs)
    return torch.utils.data.DataLoader(ds, batch_size=None, num_workers=num_workers, pin_memory=pin_memory,
                                       persistent_workers=False)
