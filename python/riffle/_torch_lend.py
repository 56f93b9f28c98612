"""Shared memory across processes: a DataLoader worker lends its batch's memory to the main process, which maps
the job's arena once and views the batch there, without a copy; what cannot be lent is put in shared memory once."""

from __future__ import annotations

import mmap
import os
import struct
import threading
import weakref
from typing import Any

import numpy as np
import torch

from .batch import Batch
from .client import Loader
from .errors import RiffleError


def _in_batch(t: torch.Tensor, batch: Batch) -> bool:
    """Whether tensor t is a view of the batch's own shared memory (fixed-size records, a transform's outputs)."""
    raw = batch.raw
    if batch._lease is None or t.device.type != "cpu":
        return False
    lo = raw.ctypes.data
    return lo <= t.data_ptr() < lo + raw.nbytes


class _Lent:
    """A batch tensor lent by a DataLoader worker to the main process: pickled, it is the arena's place
    and the tensor's shape, not its bytes (see _attach)."""

    __slots__ = ("args",)

    def __init__(self, args: tuple):
        self.args = args

    def __reduce__(self):
        return _attach, self.args


def _lent(ld: Loader, batch: Batch, out: Any) -> Any:
    """out, or, if it is a view of the batch's memory (with the batch's labels), the same as a _Lent that
    crosses to the main process without a copy: the worker's loader lends the batch (Loader.lend) and the
    main process maps the job's arena once and views the batch there (_attach). DataLoader would otherwise
    put the tensor in new shared memory and pass a descriptor for it, each batch."""
    if isinstance(out, dict) and batch.arrays is not None:
        return _lent_arrays(ld, batch, out)
    pair = isinstance(out, tuple) and len(out) == 2
    data, labels = out if pair else (out, None)
    if not isinstance(data, torch.Tensor) or not _in_batch(data, batch):
        return out
    lease = None
    if data.is_contiguous() and (labels is None or (isinstance(labels, torch.Tensor) and batch.labels is not None)):
        lease = ld.lend(batch)
    if lease is None:
        # As _convert does for what it cannot lend: into shared memory once.
        data = _to_shared(data)
        return (data, labels) if pair else data
    key, arena, returns, data_off, seq = lease
    at = data_off + (data.data_ptr() - batch.raw.ctypes.data)
    dtype = str(data.dtype).removeprefix("torch.")
    return _Lent((key, arena, returns, at, tuple(data.shape), dtype, seq,
                  None if labels is None else labels.numpy()))


class _LentArrays:
    """A batch of a token corpus's samples lent by a DataLoader worker: pickled, it is the arena's place and
    each array's place, dtype and shape in it (see _attach_arrays), and the values that are no arrays."""

    __slots__ = ("args",)

    def __init__(self, args: tuple):
        self.args = args

    def __reduce__(self):
        return _attach_arrays, self.args


def _lent_arrays(ld: Loader, batch: Batch, out: dict) -> Any:
    """A dict of the batch's arrays as tensors (and plain values), lent whole to the main process as _lent lends
    one tensor, or, if it cannot be, with its tensors put in shared memory once."""
    tensors = {k: v for k, v in out.items() if isinstance(v, torch.Tensor)}
    lease = None
    if all(_in_batch(t, batch) and t.is_contiguous() for t in tensors.values()):
        lease = ld.lend(batch)
    if lease is None:
        return {k: _to_shared(v) if isinstance(v, torch.Tensor) else v for k, v in out.items()}
    key, arena, returns, data_off, seq = lease
    base = batch.raw.ctypes.data
    places = [(k, t.data_ptr() - base, tuple(t.shape), str(t.dtype).removeprefix("torch.")) for k, t in tensors.items()]
    plain = {k: v for k, v in out.items() if k not in tensors}
    return _LentArrays((key, arena, returns, data_off, batch.raw.nbytes, seq, places, plain, list(out)))


def _attach_arrays(key: str, arena, returns, data_off: int, size: int, seq: int, places: list, plain: dict,
                   names: list) -> dict:
    """In the main process: the arrays a worker lent, views of one mapping of its batch, which goes back to the
    worker's job when the last of them (or anything made from one) is gone."""
    a = _arena(key, arena, returns)
    flat = np.frombuffer(a.mm, np.uint8, count=size, offset=data_off)
    weakref.finalize(flat, a.give_back, seq)
    out = dict(plain)
    for k, off, shape, dtype in places:
        dt = np.dtype(dtype)
        n = int(np.prod(shape)) if shape else 1
        out[k] = torch.from_numpy(flat[off: off + n * dt.itemsize].view(dt).reshape(shape))
    return {k: out[k] for k in names}


# The arenas of the jobs whose workers lent batches to this (main) process,
# by lending key: what _attach maps them with, and how it gives batches back.
_borrowed: dict[str, "_Arena"] = {}
_borrowed_lock = threading.Lock()


def _after_fork() -> None:
    global _borrowed_lock
    _borrowed_lock = threading.Lock()  # as client's connections' lock: a child never waits on a parent thread's


os.register_at_fork(after_in_child=_after_fork)


class _Arena:
    """A worker's job arena mapped in the main process, and the pipe lent batches go back through."""

    def __init__(self, arena_fd: int, returns_fd: int):
        try:
            size = os.fstat(arena_fd).st_size
            self.mm = mmap.mmap(arena_fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(arena_fd)
        os.set_blocking(returns_fd, False)
        self.returns = returns_fd
        self.pid = 0
        weakref.finalize(self, os.close, returns_fd)

    def give_back(self, seq: int) -> None:
        """The main process is done with lent batch seq: tell its worker (8 bytes: atomic on a pipe)."""
        try:
            os.write(self.returns, struct.pack("<Q", seq))
        except OSError:
            pass  # the worker's job has closed: the daemon freed the region with it


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def _attach(key: str, arena, returns, at: int, shape: tuple, dtype: str, seq: int, labels):
    """In the main process: the tensor a worker lent, a view of its job's arena.

    Its bytes stay valid while the tensor, or anything made from it, is
    alive; when the last goes, the batch goes back to the worker's job and
    from there to the daemon."""
    a = _arena(key, arena, returns)
    dt = np.dtype(dtype)
    n = int(np.prod(shape)) if shape else 1
    flat = np.frombuffer(a.mm, dt, count=n, offset=at)
    weakref.finalize(flat, a.give_back, seq)
    data = torch.from_numpy(flat.reshape(shape))
    return data if labels is None else (data, torch.from_numpy(labels))


def _arena(key: str, arena, returns) -> "_Arena":
    """The arena a worker's job lends from, mapped in this process once (arena and returns: the DupFds of its
    first lend)."""
    with _borrowed_lock:
        a = _borrowed.get(key)
        if a is None:
            if arena is None:
                raise RiffleError(f"a DataLoader worker lent a batch of an arena this process never mapped ({key})")
            a = _Arena(arena.detach(), returns.detach())
            # Forget the arenas of this worker's earlier jobs and of workers
            # that have exited (DataLoader starts new ones each epoch unless
            # they persist): the batches still held keep their arenas alive,
            # and no more will come.
            pid = key.split("-", 1)[0]
            for k in list(_borrowed):
                other = k.split("-", 1)[0]
                if other == pid or not _alive(int(other)):
                    del _borrowed[k]
            _borrowed[key] = a
    return a


def _to_shared(t: torch.Tensor) -> torch.Tensor:
    out = torch.empty(t.shape, dtype=t.dtype).share_memory_()
    out.copy_(t)
    return out


def _stack(samples: list[torch.Tensor], shared: bool) -> torch.Tensor:
    if not shared:
        return torch.stack(samples)
    out = torch.empty((len(samples),) + tuple(samples[0].shape), dtype=samples[0].dtype).share_memory_()
    return torch.stack(samples, out=out)
