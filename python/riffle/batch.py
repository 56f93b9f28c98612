"""A batch: a view of the shared memory the daemon read its records into, valid while anything refers to it."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from .client import Loader


class Batch:
    """One batch. Record ``i`` is ``ids[i]``; its bytes are ``record(i)``.

    ``raw`` is the batch's bytes as a uint8 array in shared memory; the
    region returns to the daemon only when no array or memoryview made from
    the batch is alive any more. ``state`` is the loader's place after this
    batch (what ``state_dict()`` returns then).
    """

    __slots__ = ("epoch", "index", "last", "n", "ids", "offs", "lens", "labels", "raw", "info", "packed", "_state",
                 "_dtype", "_shape", "_table", "_arrays", "_lease", "__weakref__")

    def __init__(self, epoch: int, index: int, last: bool, ids, offs, lens, labels, raw: np.ndarray, info: dict,
                 dtype=None, shape=None, state=None):
        self._dtype, self._shape = dtype, shape
        self.epoch, self.index, self.last = epoch, index, last
        self.n = len(ids)
        self.ids, self.offs, self.lens, self.labels = ids, offs, lens, labels
        self.raw = raw
        self.info = info
        self._state = state  # a dict, or a function giving one (asked of the daemon once)
        self._lease = None  # (job, seq, data_off, finalizer) of a batch in shared memory, for Loader.lend
        # A batch of rows (Arrow, Parquet): (body offset, nodes (n, 2), buffers (n, 2)) of its Arrow message;
        # internal: `data` is the batch as a pyarrow.RecordBatch.
        self._table: tuple[int, np.ndarray, np.ndarray] | None = None
        # A batch of a token corpus's samples: its arrays by name, views of raw (docs/tokens.md).
        self._arrays: dict[str, np.ndarray] | None = None
        # Packed: records back to back from offset 0 in their order, as
        # fixed-size records of a global shuffle read without O_DIRECT are.
        # (Each record ends where the next begins, the first at 0 and the last at the end.)
        if self.n == 0:
            self.packed = True
        else:
            ends = offs + lens
            self.packed = bool(offs[0] == 0 and ends[-1] == len(raw) and (offs[1:] == ends[:-1]).all())

    @property
    def rows(self) -> bool:
        """Whether the batch is of rows (Arrow, Parquet, Hugging Face): ``data`` is then a ``pyarrow.RecordBatch``
        (or, without pyarrow, ``decode.columns(batch)`` a dict of columns)."""
        return self._table is not None

    @property
    def arrays(self) -> dict[str, np.ndarray] | None:
        """A batch of a token corpus's samples (``seq_len``): its arrays over the batch's memory, by name
        (``input_ids``, ``labels``, ``position_ids``, ``loss_mask``, ``max_seqlen``, ``cu_seqlens``); else None."""
        return None if self._arrays is None else dict(self._arrays)

    @property
    def state(self) -> dict | None:
        """The loader's place after this batch, to resume there."""
        if callable(self._state):
            self._state = self._state()
        return self._state

    def record(self, i: int) -> memoryview:
        """Record ``i``'s bytes, a view of the batch."""
        o = int(self.offs[i])
        return memoryview(self.raw[o : o + int(self.lens[i])])

    def records(self) -> list[memoryview]:
        """Every record's bytes, as views of the batch."""
        return [self.record(i) for i in range(self.n)]

    @property
    def data(self):
        """The records as the dataset's natural type.

        A token corpus's samples: a dict of arrays (``arrays``). Fixed-size
        records: one ``(n, record_size)`` uint8 array, or of the
        loader's ``dtype``/``shape``; ``.npy`` rows: the file's dtype and row
        shape (a structured array for structured dtypes); rows of Arrow and
        Parquet files: a ``pyarrow.RecordBatch`` over the batch's memory if
        pyarrow is installed, else a dict of columns (``decode.columns``);
        anything else: a list of memoryviews. Arrays are views of the batch
        when its records are packed.
        """
        from . import decode
        fmt = self.info.get("format")
        if self._arrays is not None:
            return self.arrays
        if self._table is not None:
            return decode.arrow(self)
        if self.info.get("transform"):
            # The daemon's transform outputs: fixed-size, of the dtype and shape it reports.
            return decode.fixed(self, np.dtype(self.info["dtype"]), self.info.get("shape") or None)
        if fmt == "npy" and self._dtype is None:
            return decode.npy(self)
        if fmt in ("fixed", "npy"):
            return decode.fixed(self, self._dtype or np.uint8, self._shape)
        if fmt == "riffle" and self.info.get("record_size"):
            # A pack of fixed-size records (a transform's outputs among them).
            dt = self._dtype or (decode.npy_dtype(self.info["dtype"]) if self.info.get("dtype") else np.uint8)
            return decode.fixed(self, dt, self._shape or self.info.get("shape") or None)
        if fmt == "tar":
            return decode.tar(self)
        return self.records()

    def __len__(self) -> int:
        return self.n

    def __repr__(self) -> str:
        return f"<riffle.Batch epoch={self.epoch} index={self.index} n={self.n} bytes={len(self.raw)}>"


def _give_back(conn_ref, job: int, seq: int, loader: "Loader", size: int) -> None:
    """A batch's region goes back to the daemon (with the next request) and out of its loader's held bytes."""
    conn = conn_ref()
    if conn is not None:
        conn.queue_release(job, seq)
    loader._held -= size
