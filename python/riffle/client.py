"""The :class:`Loader`: riffle's client, a job in the daemon read as batches.

A :class:`Loader` is an iterable of :class:`Batch` objects, one epoch per
``iter()``: a fresh global shuffle of ``seed`` and the epoch each time. The
daemon (``riffle serve``) reads each batch's records straight into shared
memory; a :class:`Batch` here is a view of that memory, not a copy. Its bytes
stay valid while anything refers to the batch or to an array made from it
(``batch.raw``, ``decode.fixed(batch)``, ``torch.from_numpy`` of those):
only when the last reference goes is the region given back to the daemon
for a later batch.

The client's other parts: ``errors`` (an exception per error kind),
``daemon`` (finding and starting the daemon), ``connection`` (a connection
to it), ``batch``, ``options`` (keywords as the daemon takes them),
``mixture`` (a mixture's weights by epoch) and ``state`` (resume
arithmetic). Their public names are importable from here too.
"""

from __future__ import annotations

import base64
import collections
import gc
import mmap
import os
import struct
import time
import warnings
import weakref
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from . import spec, wire
from .batch import Batch, _give_back
from .connection import DEFAULT_TIMEOUT, OPEN_TIMEOUT, Connection, _forget, connect
from .daemon import default_socket, find_binary, private_dir, start_daemon, wait_for_socket
from .errors import (DaemonGone, DataChanged, DataError, InvalidSpec, JobClosed, MemoryBudget, PathNotFound,
                     RiffleError, UnsafeSocket, error_from)
from .mixture import _mixture, _mixture_at, _segments, _state_weights, _weight, _weights_state, _with_weights
from .options import _ORDER_KEYS, _abspath, _check_args, _check_sendable, _filter, _ids, _subset
from .state import (_POSITIONAL_KINDS, _check_dataset, _check_ordering, _check_rank, _order, _ordering, _own, _parts,
                    _rest, _rest_places, _Taken, merge_states)

# The client's parts live in the modules above; their public names are this module's too.
__all__ = ["Batch", "Connection", "DEFAULT_TIMEOUT", "DaemonGone", "DataChanged", "DataError", "InvalidSpec",
           "JobClosed", "Loader", "MemoryBudget", "OPEN_TIMEOUT", "PathNotFound", "RiffleError", "UnsafeSocket",
           "connect", "default_socket", "error_from", "find_binary", "merge_states", "private_dir", "start_daemon",
           "wait_for_socket"]


class _Job:
    """An open job: its connection, shared memory and place."""

    def __init__(self, conn: Connection, reply: dict, mm: mmap.mmap | None, epoch: int, batch: int, start: int = 0,
                 fd: int | None = None):
        self.conn, self.reply, self.mm = conn, reply, mm
        # The arena's descriptor, kept to lend batches to another process
        # (Loader.lend); the batches lent, by seq: what gives each back.
        self.fd = fd
        self.lent: dict[int, tuple] = {}
        self.returns: int | None = None  # the pipe's read end the borrower gives seqs back through
        self.key: str | None = None
        self.id = reply["job"]
        self.epoch, self.batch = epoch, batch  # the next batch it delivers
        self.start = start  # the epoch's positions delivered before it, if it is the rest of one
        self.rest = bool(reply.get("delivered"))  # the rest of a shared order's epoch, without what others delivered
        # Batches it delivers of its first epoch from where it opened, then
        # of each whole epoch: the daemon's counts, never worked out here
        # (the stride of a shared job is the daemon's to decide).
        self.left_first = int(reply.get("left", 0))
        self.per_epoch = int(reply.get("batches", 0))
        self.opened_at = (epoch, batch)
        # The daemon keeps a growing sampler state to itself; ask for it.
        self.stream = bool(reply.get("stream"))
        # Its order as it opened: the place it opened at decides whether its shared state may be rebuilt from the
        # records it delivers (replay: not of the rest of an epoch).
        self.order = _order(reply)
        self.weights: tuple[int, int] | None = None  # a mixture's: the loader's change count, and the epoch's weights
        # The last epoch the job delivers: the daemon says when it reads fewer than asked (a mixture's weights
        # change after them, best_fit's samples are each epoch's own), and the next is a job of its own.
        self.through = epoch + int(reply["epochs"]) - 1 if reply.get("epochs") else float("inf")

    def state(self, epoch: int, batch: int) -> dict:
        """The job's state at a place it delivered lately (sampler state included)."""
        reply, _, _ = self.conn.request({"op": wire.OP_STATE, "job": self.id, "epoch": epoch, "index": batch})
        return reply.get("state") or {}

    def close(self) -> None:
        try:
            self.conn.drop(self.conn.send({"op": wire.OP_CLOSE, "job": self.id}))
        except RiffleError:
            pass
        # The mmap stays mapped while any batch's arrays refer to it; a
        # borrower's mapping of the arena stays valid too (the daemon keeps
        # the pages of batches not given back), and its later give-backs
        # find the pipe closed.
        for fd in (self.fd, self.returns):
            if fd is not None:
                os.close(fd)
        self.fd = self.returns = None


def _close_job(job: _Job | None) -> None:
    if job is not None:
        job.close()


class Loader:
    """An iterable of batches of a dataset in a global shuffle, one epoch per iteration.

    ``batch.data`` gives fixed-size records as an ``(n, ...)`` array, other
    records as memoryviews. ``state_dict()`` is the place of the next batch;
    pass it to ``load_state_dict()`` to resume exactly there. The daemon
    keeps one job for this loader across epochs, reading the next epoch
    ahead while this one ends; ``close()`` (or dropping the loader) ends it.

    The keywords come in the groups of the daemon's table of job options
    (``riffle.spec.GROUPS``; ``riffle.spec.OPTIONS`` gives each one's bounds,
    default and meaning), then the client's own: how batches are viewed, and
    how the daemon is reached. The signature lists them in that order.

    Dataset
    -------
    What the records are. ``paths`` is a file, a glob, a directory
    (ImageFolder) or a list of those; ``mixture=[(paths, weight), ...]``
    instead mixes datasets: each batch takes records from the sources in
    proportion to their weights, each source in its own shuffle;
    ``mixture_stop`` is ``"first_exhausted"`` (an epoch ends when the
    schedule names a source that is used up) or ``"all_exhausted"`` (when
    every source was used up, the others going on into their next epochs);
    ``set_weights`` changes the weights from the next step (or a place
    given), and ``mixture_schedule=[(step, weights), ...]`` (or ``(epoch,
    step, weights)``) changes them at global steps of this run: each
    source goes on from where it was, and from the change every source is
    within Webster's rounding of its share. ``mixture_schedule=f``, a
    function of the step (0 at each epoch's start) returning the weights,
    changes them wherever ``f``'s value changes, evaluated over each epoch
    as it opens; its steps are counted in the global batches of the run
    that began it, which the state keeps (docs/tokens.md). ``format``
    names the format when the file's extension does not; ``record_size`` and
    ``header_bytes`` shape a file of fixed-size records, ``drop_partial``
    drops its partial last record; ``csv_header`` says a CSV's first line is
    its header; ``skip_crc`` skips TFRecord CRCs; ``direct`` reads with
    O_DIRECT (by default, a shuffle the page cache would seldom answer
    does); ``columns`` and ``split`` pick a rows dataset's columns and a
    Hugging Face split; ``extensions`` the file endings a directory takes.
    ``subset`` reads part of the dataset: a ``range``, a list of ids, or
    ``{"ranges": [[lo, hi], ...], "ids": [...], "labels": [...]}``; ``ids``
    an array of ids or a file of them (an integer ``.npy``, or one id per
    line). ``filter`` keeps the records (of the subset) that pass every test
    given: ``{"label": 3}`` (or a list), ``{"min_size": n, "max_size": m}``
    bytes, ``{"glob": "*.jpg"}`` on the record's file, and on a dataset of
    rows ``{"column": "lang", "in": ["en", "de"]}`` or ``{"column": "score",
    "min": 0.5}`` on a column's values. ``dedup=True`` counts records of
    equal bytes once. Each is applied once, when the job opens: no byte of
    data is rewritten, and DDP ranks get equal parts of what is left.
    ``refresh="epoch"`` lets a glob or directory dataset grow: each epoch
    reads the files found by its start, new files' records after the old
    ones', whose ids stay; a state resumes an epoch with the files it read.
    ``transform`` names a transform the daemon runs on every record
    (``"image:size=256,crop=224"``, ``"libsvm_dense:n_features=N"``);
    ``batch.data`` is then its outputs as one array.

    ``seq_len`` makes ``paths`` a token corpus (Megatron ``.idx``/``.bin``
    prefixes or globs, flat token files with ``token_dtype``, 1-D token
    ``.npy`` files, an Arrow or Hugging Face tokenized ``token_column``)
    whose records are each epoch's samples of ``seq_len`` tokens:
    ``packing`` is ``"concat"`` (documents concatenated and cut, each
    sample sharing its last token with the next; ``pad_last`` keeps the
    last partial one), ``"best_fit"`` (documents packed best-fit over
    ``pack_window`` documents, padded) or ``"pad"`` (a document a sample).
    ``eod`` is the end-of-document token, ``vocab_size`` the vocabulary
    (a token at or above it is a DataError naming its file and offset),
    ``pad_id`` padding's input id. ``batch.data`` is then a dict of arrays
    over the batch's memory: ``input_ids``, ``labels``, ``position_ids``
    (n, seq_len), ``loss_mask`` and ``cu_seqlens`` (docs/tokens.md).

    Order
    -----
    Which records in which order each epoch: ``shuffle`` (a fresh global
    shuffle of ``seed`` and the epoch each time; False reads in file order).
    ``sampler`` picks a cheaper order than the global shuffle: ``"block"``
    (of ``block_size`` bytes, spread over ``window`` batches),
    ``"buffered"`` (``buffer`` records at a time), ``"reservoir"`` (of
    ``reservoir`` records), ``"sequential"``, or ``"auto"``: the global or
    block order of least device time whose randomization reaches
    ``min_randomness``. ``opportunistic=W`` makes each batch of whichever
    records of the next W batches arrive first. ``loader.order`` is the
    order as the daemon decided it: its ``kind`` (auto's choice too), and
    how a state resumes (``positional``: from a position, on any number of
    ranks and workers; ``shared``; ``rest``: as the rest of its epoch, from
    every rank's state, on any number).

    Sharing
    -------
    How an epoch is split and shared. ``rank``/``world_size`` split each
    epoch as DistributedSampler does; ``rank_drop_last`` is its
    ``drop_last`` (drop the tail so ranks get equal shares;
    ``shard_drop_last`` is its old name). ``batch_stride`` and
    ``batch_offset`` deliver only batches offset, offset+stride, ... (a
    DataLoader worker's turn). ``share=True`` lets the job sample
    dependently with the other sharing jobs on its source: each shared
    record is read (and transformed) once for all of them, and each job
    still sees each of its records once per epoch in a uniform order, though
    no longer one fixed by (seed, epoch).

    Batches
    -------
    ``batch_size`` records each; ``drop_last`` is DataLoader's (drop the
    last short batch). Records come in a random order inside each batch
    (``ordered=True`` keeps the sampler's). ``prefetch`` batches are read
    ahead, ``depth`` reads in flight (the daemon chooses both by default),
    and ``memory`` bounds the bytes of batches in flight and held.

    Place
    -----
    Where the loader starts: ``epoch``; ``mixture_history``, a mixture's
    weights before its current ones; ``auto_order``, the order an earlier
    ``sampler="auto"`` chose, read again. A state (``load_state_dict``)
    sets the rest.

    View
    ----
    How ``batch.data`` views fixed-size records: of ``dtype`` and
    per-record ``shape`` (``.npy``: the file's).

    Connection
    ----------
    The daemon at ``socket`` (by default the user's), or over TCP at
    ``address`` with ``token``; ``autostart`` starts one if none answers.
    ``timeout`` bounds each reply; ``reconnect`` is how long to wait for a
    daemon again after it went away mid-epoch; ``pipeline`` requests stay
    ahead of the user.
    """

    def __init__(self, paths: str | os.PathLike | Sequence[str | os.PathLike] | None = None,
                 batch_size: int = spec.DEFAULT_BATCH_SIZE, *,
                 # dataset
                 mixture: Sequence | None = None, mixture_stop: str | None = None,
                 mixture_schedule: Sequence | Callable[[int], Sequence[float]] | None = None, format: str | None = None,
                 record_size: int | None = None, header_bytes: int | None = None, csv_header: bool = False,
                 skip_crc: bool = False, drop_partial: bool = False, direct: bool | None = None,
                 columns: Sequence[str] | None = None, split: str | None = None, extensions: Sequence[str] | None = None,
                 subset: dict | None = None, ids: Any = None, filter: dict | None = None, dedup: bool = False,
                 refresh: str | None = None, transform: str | None = None,
                 seq_len: int | None = None, packing: str | None = None, pad_last: bool = False, eod: int | None = None,
                 vocab_size: int | None = None, pad_id: int | None = None, token_dtype: str | None = None,
                 token_column: str | None = None, pack_window: int | None = None,
                 # order
                 shuffle: bool = True, sampler: str | None = None, min_randomness: float | None = None,
                 block_size: int | None = None, window: int | None = None, buffer: int | None = None,
                 reservoir: int | None = None, opportunistic: int | None = None, seed: int = 0,
                 # sharing
                 rank: int = 0, world_size: int = 1, rank_drop_last: bool = False, shard_drop_last: bool | None = None,
                 share: bool | None = None, batch_stride: int | None = None, batch_offset: int | None = None,
                 # batches
                 drop_last: bool = False, prefetch: int | None = None, depth: int | None = None,
                 memory: int | None = None, ordered: bool | None = None,
                 # place
                 epoch: int = 0, mixture_history: Sequence[dict] | None = None, auto_order: dict | None = None,
                 # view
                 dtype=None, shape: Sequence[int] | None = None,
                 # connection
                 socket: str | None = None, address: str | None = None, token: str | None = None,
                 timeout: float | None = None, autostart: bool = True, reconnect: float = 60.0, pipeline: int = 8):
        if shard_drop_last is not None:
            # The old name: a "shard" is a pack's file of records, a rank's split of an epoch its part.
            warnings.warn("shard_drop_last is now rank_drop_last", DeprecationWarning, stacklevel=2)
            rank_drop_last = rank_drop_last or shard_drop_last
        if isinstance(paths, (str, os.PathLike)):
            paths = [paths]
        if mixture is not None:
            if paths:
                raise ValueError("both paths and mixture= given: a mixture names its sources' paths itself")
            _check_args(["."], batch_size)
            mixture = _mixture(mixture, prefixes=bool(seq_len))
        else:
            _check_args(paths, batch_size, prefixes=bool(seq_len))
        subset = _subset(subset)
        if ids is not None:
            if subset is not None:
                raise ValueError("both subset= and ids= given: pass one")
            subset = _ids(ids)
        filter = _filter(filter)
        # The options as the user gave them, by their spec names (spec.py,
        # generated from the daemon's one table): every default lives there.
        given = {spec.BY_KEYWORD[k]: v for k, v in (
            ("format", format), ("record_size", record_size), ("header_bytes", header_bytes),
            ("csv_header", csv_header), ("skip_crc", skip_crc), ("drop_partial", drop_partial), ("direct", direct),
            ("columns", list(columns) if columns is not None else None), ("split", split),
            ("extensions", [e if e.startswith(".") else "." + e for e in extensions] if extensions else None),
            ("subset", subset), ("filter", filter), ("dedup", dedup), ("refresh", refresh),
            ("transform", transform), ("seq_len", seq_len), ("packing", packing), ("pad_last", pad_last),
            ("eod", eod), ("vocab_size", vocab_size), ("pad_id", pad_id), ("token_dtype", token_dtype),
            ("token_column", token_column), ("pack_window", pack_window), ("rank", rank), ("world_size", world_size), ("drop_last", drop_last),
            ("rank_drop_last", rank_drop_last), ("prefetch", prefetch), ("depth", depth), ("memory", memory),
            ("ordered", ordered), ("sampler", sampler), ("block_size", block_size), ("window", window),
            ("buffer", buffer), ("reservoir", reservoir), ("opportunistic", opportunistic), ("share", share),
            ("batch_stride", batch_stride), ("batch_offset", batch_offset), ("min_randomness", min_randomness),
            ("auto_order", auto_order))}
        for k, v in dict(given, seed=seed, shuffle=shuffle).items():
            _check_sendable(k, v)
        self.spec = {"batch_size": batch_size, "shuffle": shuffle, "seed": seed}
        if mixture is None:
            self.spec["paths"] = [_abspath(p) for p in paths]
        else:
            self.spec["mixture"] = mixture
            if mixture_stop is not None:
                self.spec["mixture_stop"] = mixture_stop
        # None is unset; False is sent where the default may be true (direct, ordered).
        self.spec.update({k: v for k, v in given.items() if v is not None and not (v is False and spec.OPTIONS[k][4] == "false")})
        # A schedule given as a function of the step: evaluated over each epoch as the loader opens it (_follow),
        # its steps global batches of this run's (or of the run a loaded state began: _fn_batch); epochs through
        # _fn_through are evaluated, their changes in _weights.
        self._fn: Callable[[int], Sequence[float]] | None = None
        if callable(mixture_schedule):
            self._fn, mixture_schedule = mixture_schedule, None
        self._fn_batch, self._fn_through = batch_size * max(1, int(world_size or 1)), -1
        # A mixture's weights from each place on (set_weights adds to them): a schedule's steps are this run's
        # global batches, kept as positions of the epoch's order, the same on any topology.
        self._weights = (_segments(mixture, mixture_history, mixture_schedule, batch_size * max(1, int(world_size or 1)))
                         if mixture is not None else None)
        if mixture is None and (mixture_schedule or self._fn):
            raise ValueError("mixture_schedule without a mixture")
        self._weights_gen = 0
        # A growing dataset's (refresh): (epoch, generations of files it reads), from the daemon or a state.
        self._generations: tuple[int, int] | None = None
        self.memory = memory
        self.dtype, self.shape = dtype, shape
        self.pipeline = max(1, pipeline)
        self.reconnect = reconnect  # seconds to wait for a daemon again after it went away
        self._version: str | None = None
        self._records: int | None = None
        # The order sampler="auto" chose, once the daemon has said.
        self.auto: dict | None = None
        self.direct = False  # the daemon reads the files with O_DIRECT: known once it has said
        # What the job's order is, as the daemon decided it (wire.OrderInfo: kind, positional, shared, rest, packed,
        # replay): the check's answer, which every resume follows; the client never works it out from the options.
        self.order: dict = {}
        if sampler == "auto" and int(world_size or 1) > 1 and auto_order is None:
            raise ValueError("sampler='auto' with world_size > 1: ranks on other nodes measure other devices and could "
                             "choose other orders. riffle.torch agrees on rank 0's choice through torch.distributed; "
                             "with riffle.Loader, open one with world_size=1, read its .auto, and give every rank its "
                             "sampler, block_size and window")
        self.epoch = epoch
        self._batch = 0
        # Positions of this epoch's order delivered before its batch 0, by
        # ranks of another topology (an elastic resume): this epoch is the
        # rest of the order, a job of its own.
        self._start = 0
        # A shared order's epoch resumed on another topology: the places of
        # the parts of the run before (or, once open, what they delivered,
        # as the daemon put it in one), whose records this epoch's job, the
        # rest of it, leaves out.
        self._delivered: list[dict] | None = None
        self._handed = False  # _delivered are the places handed, not yet the rest's basis (its job not opened)
        # The places of a rest of an epoch this loader finished, which its
        # place at the next epoch's start still carries: the rest's parts
        # were dealt from what they leave out.
        self._ended: list[dict] | None = None
        self._sampler_state: bytes | None = None
        self._skip: list[int] | None = None
        self._unresolved = False  # the sampler state of this place is still the daemon's
        # A shared job's state is the daemon's, which a daemon killed takes
        # with it: the loader keeps what rebuilds it, the state its job
        # opened from and the ids of the batches delivered since (_kept).
        self._taken: _Taken | None = None
        self._conn_args = (socket, address, token, timeout, autostart)
        # Whether the place is one load_state_dict gave, not iterated from yet (set_epoch keeps it); and the epoch
        # set_epoch asked for that the loaded place is past the end of (the next iteration delivers nothing).
        self._loaded = False
        self._over: int | None = None
        self._meta: dict | None = None
        self._held = 0
        self._job: _Job | None = None
        self._finalizer = None
        self._check()

    # --- epochs and checkpoints ---
    def set_epoch(self, epoch: int) -> None:
        """Start the next iteration at ``epoch`` (as DistributedSampler.set_epoch).

        After ``load_state_dict(state)``, until the next iteration, ``set_epoch`` of the epoch the state is in keeps
        the loaded place: the next iteration is the rest of that epoch, as a training loop that calls
        ``set_epoch(epoch)`` at each epoch's start expects when it resumes at its checkpoint's epoch. A state taken
        after an epoch's last batch is at the start of the next and at the end of that one: ``set_epoch`` of the
        epoch it ended makes an iteration of no batches, nothing of it being left, and the next iteration is the
        state's epoch. Any other epoch starts at its beginning, and the loaded place is dropped.
        """
        epoch = int(epoch)
        if self._loaded and epoch == self.epoch:
            self._over = None
            return
        if self._loaded and epoch == self.epoch - 1 and self._at_start():
            self._over = epoch
            return
        self._loaded, self._over = False, None
        self._to_epoch(epoch)

    def _to_epoch(self, epoch: int) -> None:
        """Make the next iteration epoch ``epoch`` from its beginning."""
        if epoch != self.epoch or self._batch or self._start or self._delivered:
            self.epoch, self._batch, self._sampler_state, self._skip = epoch, 0, None, None
            self._start, self._unresolved, self._delivered, self._ended = 0, False, None, None

    def _at_start(self) -> bool:
        """Whether this loader's place is its epoch's start: nothing of the epoch delivered."""
        return not (self._batch or self._start or self._delivered or self._sampler_state or self._skip)

    def set_weights(self, weights: Sequence[float], epoch: int | None = None, step: int | None = None) -> None:
        """A mixture's new weights, from the next step this loader delivers by default: the next batch of every
        rank, a global step. ``epoch`` alone makes them from that epoch's start, ``step`` (of ``epoch``, by default
        this one) from that global step. Each source goes on from where the old weights left it, and from the
        change every source is within Webster's rounding of its share of the samples since; the change is in
        ``state_dict()``, as a position of the epoch's order, so a resume on any topology keeps it."""
        if self._weights is None:
            raise ValueError("set_weights: this loader reads no mixture")
        if self._fn is not None:
            raise ValueError("set_weights: this loader's weights follow its mixture_schedule function; change the "
                             "function's values instead (or give a list of (step, weights) and call set_weights)")
        glob = self._world() * int(self.spec["batch_size"])
        if epoch is None and step is None:
            if int(self.spec.get("batch_stride", 1) or 1) > 1:
                raise ValueError("set_weights at the next step: this loader delivers every batch_stride-th batch "
                                 "(a DataLoader worker's), so its next is not the run's: give epoch and step")
            epoch, position = self.epoch, self._start + self._batch * glob
        else:
            epoch = self.epoch if epoch is None else int(epoch)
            position = 0 if step is None else int(step) * glob
        self._weights = _with_weights(self._weights, weights, int(epoch), position, len(self.spec["mixture"]))
        self._weights_gen += 1

    @property
    def offsets(self) -> list[int]:
        """A mixture's first id of each source: source k's record i is id ``offsets[k] + i`` in batches."""
        if self._meta is None:
            self._open()
        return list((self._meta.get("info") or {}).get("offsets") or [0])

    def _follow(self, epoch: int) -> None:
        """Evaluate the mixture_schedule function over epoch (once): f(k) at each global step k of the epoch (0 at
        its start), k*_fn_batch its position, until the epoch ends under the weights so far; where f's value
        changes, the weights change from that position, as set_weights(f(k), epoch, k) would. The epoch's length
        is the daemon's (a check's samples), asked again after each change, which moves it."""
        if self._fn is None or epoch <= self._fn_through:
            return
        segs, n = self._weights, len(self.spec["mixture"])
        cur = [ws for e, p, ws in segs if (e, p) <= (epoch, 0)][-1]
        G = self._fn_batch

        def samples(segs) -> int:
            spec = _mixture_at(self.spec, segs)
            spec.update(epoch=epoch, batch=0, epochs=1)
            _, reply, fds = self._opening({"op": wire.OP_CHECK, "spec": spec})
            for fd in fds:
                os.close(fd)
            return int(reply.get("samples") or 0)
        total, k, changed = samples(segs), 0, False
        while k * G < total:
            ws = [_weight(w, f"mixture_schedule({k})") for w in self._fn(k)]
            if ws != cur:
                segs, cur, changed = _with_weights(segs, ws, epoch, k * G, n), ws, True
                total = samples(segs)
            k += 1
        self._weights, self._fn_through = segs, epoch
        if changed:
            self._weights_gen += 1

    def _at(self, epoch: int) -> tuple[dict, int]:
        """The spec of a job opening at epoch, and the mixture's weights' version it has (-1: no mixture)."""
        if self._weights is None:
            return dict(self.spec), -1
        return _mixture_at(self.spec, self._weights), self._weights_gen

    def state_dict(self) -> dict[str, Any]:
        """The place of the next batch: save it with the model's checkpoint."""
        if self._unresolved:
            self._resolve()
        st = {"epoch": self.epoch, "batch": self._batch, "seed": self.spec["seed"], "world": self._world()}
        if self._version:
            st["dataset"] = self._version  # the version of the files the place is in
        if self.order["positional"] and int(self.spec.get("batch_stride", 1) or 1) <= 1:
            # Where the epoch is for every rank, in positions of its order:
            # after b batches of each of W ranks, the ranks together hold
            # the order's first W*b*batch_size positions (DistributedSampler's
            # stride, or a block order's runs of a batch), so any topology
            # resumes from it.
            st["position"] = self._start + self._batch * self._world() * self.spec["batch_size"]
        if self._start:
            st["start"] = self._start
        st["ordering"] = self.ordering
        self._whose(st)
        if self._sampler_state:
            st["sampler_state"] = base64.b64encode(self._sampler_state).decode()
        if self._skip:
            st["skip"] = list(self._skip)
        if self._weights is not None:
            st["mixture_weights"] = _weights_state(self._weights)
        if self._fn is not None:
            # The steps the function is evaluated at, in positions, and the epochs it was: a resume on another
            # topology evaluates the later epochs at the same positions.
            st["mixture_function"] = {"batch": self._fn_batch, "through": self._fn_through}
        if self.auto is not None:
            st["order"] = dict(self.spec["auto_order"])
        if self._generations and self._generations[0] == self.epoch:
            st["generations"] = self._generations[1]  # the files this epoch reads, of a dataset that grows
        if self.spec.get("refresh"):
            st.pop("dataset", None)  # it grows by design; the daemon's log keeps each epoch's files
        return st

    def _whose(self, place: dict) -> None:
        """Put in a place of a shared or opportunistic order whose it is (and, opportunistic, in batches of which
        size, in windows of how many), and, of the rest of an epoch (or at the start of the epoch after one), the
        places it was opened from."""
        if not _parts(self.order):
            return
        place["rank"] = int(self.spec.get("rank", 0) or 0)  # merge_states puts every rank's together
        if not self.order["shared"]:
            place.update(batch_size=int(self.spec["batch_size"]), window=int(self.spec["opportunistic"]))
        if self._delivered:
            place["rest" if self._handed else "delivered"] = list(self._delivered)
        if self._ended and not self._batch:
            place["ended"] = list(self._ended)

    def _world(self) -> int:
        return max(1, int(self.spec.get("world", 1) or 1))

    def _resolve(self) -> None:
        # The place came with a batch of a job whose sampler state stays in
        # the daemon: fetch it while the job still has it, or rebuild it
        # from what this loader kept (its job closed, its daemon killed).
        j = self._job
        try:
            if j is None or os.getpid() != j.conn.pid:
                raise RiffleError(
                    "this loader's sampler state is kept by its job, which is closed: "
                    "call state_dict() while iterating (or before close())")
            st = j.state(self.epoch, self._batch)
        except RiffleError:
            if not self._take_kept():
                raise
            return
        ss = st.get("sampler_state")
        self._sampler_state = base64.b64decode(ss) if ss else None
        self._skip = st.get("skip") or None
        self._unresolved = False

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at a place ``state_dict()`` returned."""
        if state.get("seed", self.spec["seed"]) != self.spec["seed"]:
            raise RiffleError(f"state was saved with seed {state['seed']}, this loader has seed {self.spec['seed']}")
        if not self.spec.get("refresh"):
            _check_dataset(state, self._version)
        # The order sampler="auto" chose for the run that saved this: the
        # same, not a choice made again on another measure of the device.
        order = state.get("order")
        if order and self.auto is None:
            mine = {k: self.spec.get(k) for k in _ORDER_KEYS if self.spec.get(k)}
            if mine != order:
                raise ValueError(f"this state was saved by a loader whose sampler='auto' chose {order}; this "
                                 f"loader reads {mine or 'the global order'}: give it sampler='auto' or that order")
        _check_ordering(state, self.ordering, adopts_order=bool(order) and self.auto is not None)
        if order and self.auto is not None:
            self.auto = dict(self.auto, **order)
            self._pin(order)
        self._unresolved = False
        # set_epoch of the loaded place's epoch keeps it, until the next iteration (see set_epoch).
        self._loaded, self._over = True, None
        self.epoch, self._batch, self._start = int(state["epoch"]), int(state["batch"]), int(state.get("start", 0))
        self._delivered, self._ended = None, None
        world = int(state.get("world", self._world()))
        if _parts(self.order):
            state = _own(state, self._world(), int(self.spec.get("rank", 0) or 0))
        if _parts(self.order) and _rest(state, self._world()):
            # A shared or opportunistic order's epoch on another topology, or
            # the rest of one already: the rest of the epoch, without every
            # record the parts' places delivered (the daemon puts them
            # together).
            self.epoch, places = _rest_places(state, self._world(), int(self.spec.get("rank", 0) or 0),
                                              bool(self.spec.get("rank_drop_last")), self.order["shared"])
            self._batch, self._delivered, self._sampler_state, self._skip = 0, places or None, None, None
            self._handed = bool(places)
            self._generations = None
            return
        if _parts(self.order):
            _check_rank(state, int(self.spec.get("rank", 0) or 0))
        if "position" in state and self.order["positional"]:
            # Elastic: the place in this topology. A position on a boundary
            # of this topology's global batches is a batch of the whole
            # epoch's job, as if this run had got there itself; any other
            # is the rest of the epoch, from there, split over these ranks.
            pos, glob = int(state["position"]), self._world() * self.spec["batch_size"]
            self._batch, self._start = (pos // glob, 0) if pos % glob == 0 else (0, pos)
        elif world != self._world():
            raise ValueError(f"this state was saved on {world} ranks and this loader is one of {self._world()}: its "
                             "order (opportunistic over blocks) resumes only on as many; an order that is a function "
                             f"of position ({_POSITIONAL_KINDS}) resumes on any number, and a shared or "
                             "opportunistic global one from every rank's state (riffle.merge_states)")
        ss = state.get("sampler_state")
        self._sampler_state = base64.b64decode(ss) if ss else None
        self._skip = list(state["skip"]) if state.get("skip") else None
        self._generations = (self.epoch, int(state["generations"])) if state.get("generations") else None
        if state.get("mixture_weights") and self._weights is not None:
            self._weights = _state_weights(state, len(self.spec["mixture"]))
            self._weights_gen += 1
            if self._fn is not None:
                self._follow_state(state)

    def _follow_state(self, state: dict) -> None:
        """Take from a state the steps the mixture_schedule function is evaluated at and the epochs it was (a state
        without them: those its changes reach, in this run's steps)."""
        fn = state.get("mixture_function") or {}
        self._fn_batch = int(fn.get("batch") or self._fn_batch)
        self._fn_through = int(fn["through"]) if "through" in fn else max(e for e, _, _ in self._weights)

    # --- the job ---
    def _conn(self) -> Connection:
        return connect(*self._conn_args)

    def _opening(self, msg: dict) -> tuple[Connection, dict, list[int]]:
        """Send an open or a check, and its reply. The process's shared connection may be to a daemon that has
        since gone (restarted, say): an open is safe to make again on a new connection, which starts a daemon if
        none answers. An index may be built on the way, so the reply may take long."""
        conn = self._conn()
        try:
            reply, _, fds = conn.request(msg, timeout=conn.open_timeout)
        except DaemonGone:
            conn = self._conn()
            reply, _, fds = conn.request(msg, timeout=conn.open_timeout)
        return conn, reply, fds

    def _check(self) -> None:
        """Ask the daemon what opening this loader's job would answer: a bad option or path fails here, when the
        loader is built, as the exception a PyTorch user catches (ValueError, FileNotFoundError)."""
        spec, _ = self._at(self.epoch)
        spec.update(epoch=self.epoch, batch=self._batch, epochs=self._epochs())
        _, reply, fds = self._opening({"op": wire.OP_CHECK, "spec": spec})
        for fd in fds:
            os.close(fd)
        self._meta = reply
        self.order = _order(reply)
        # The loader is bound to the data as it was when it was built.
        self._version = reply.get("dataset_version")
        self._records = reply.get("records")
        # Whether the daemon reads the files with O_DIRECT: asked, or chosen for a shuffle of more than the page cache keeps.
        self.direct = bool(reply.get("direct"))
        if reply.get("auto") and self.spec.get("sampler") == "auto":
            # The order is chosen once, here: every epoch, and a resume from
            # this loader's state, reads the same one.
            self.auto = reply["auto"]
            self._pin(self.auto)

    def _pin(self, order: dict) -> None:
        """Read the order sampler="auto" chose (or a state recorded) from now on, without choosing again."""
        self.spec["auto_order"] = {k: order[k] for k in _ORDER_KEYS if order.get(k)}

    def _epochs(self) -> int:
        """Epochs a job opens for: all, unless the dataset grows (each epoch reads the files found by then). A job
        that reads fewer says so (its reply's epochs: _Job.through), and the next epoch opens a job of its own."""
        return 1 if self.spec.get("refresh") else -1

    def _place_spec(self, spec: dict) -> dict:
        """spec (of this loader's epoch) with the place a job opens at: this loader's."""
        spec.update(epoch=self.epoch, batch=self._batch, epochs=self._epochs())
        if self._generations and self._generations[0] == self.epoch:
            spec["generations"] = self._generations[1]
        if self._start:
            spec.update(start=self._start, epochs=1)  # the rest of one epoch: the next is a job of its own
        if self._delivered:
            spec.update(delivered=self._delivered, epochs=1)
        if self._sampler_state:
            spec["sampler_state"] = base64.b64encode(self._sampler_state).decode()
        if self._skip:
            spec["skip"] = self._skip
        return spec

    def left(self) -> int:
        """Batches this loader delivers from its place to its epoch's end, as the daemon counts them: the whole
        epoch's at its start, the rest of it after ``load_state_dict`` of a place inside it (``len()`` stays the
        whole epoch's)."""
        if self._over is not None:
            return 0
        if self._unresolved:
            self._resolve()  # the place's sampler state, which a check opens from
        j = self._job
        if j is not None and (j.epoch, j.batch) == (self.epoch, self._batch) and self._batch in (0, j.opened_at[1]):
            return self._left(j)
        self._follow(self.epoch)
        spec, _ = self._at(self.epoch)
        _, reply, fds = self._opening({"op": wire.OP_CHECK, "spec": self._place_spec(spec)})
        for fd in fds:
            os.close(fd)
        return int(reply.get("left") or 0)

    def _open(self) -> _Job:
        """The job at this loader's place: the one kept from the last epoch if it is there, else a new one."""
        j = self._job
        self._follow(self.epoch)
        spec, weights = self._at(self.epoch)
        if (j is not None and (j.epoch, j.batch, j.start, j.rest) == (self.epoch, self._batch, self._start, bool(self._delivered))
                and os.getpid() == j.conn.pid
                and j.weights == (self._weights_gen, weights) and (self._epochs() < 0 or j.opened_at[0] == self.epoch)
                and self.epoch <= j.through):
            return j
        if self._unresolved and j is not None and os.getpid() == j.conn.pid:
            self._resolve()  # the new job starts from the whole state
        self.close()
        spec = self._place_spec(spec)
        conn, reply, fds = self._opening({"op": wire.OP_OPEN, "spec": spec})
        mm, arena = None, None
        if reply.get("arena_size"):
            if not fds:
                raise RiffleError("the daemon sent no shared memory with the job")
            try:
                mm = mmap.mmap(fds[0], reply["arena_size"], mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
                arena = fds.pop(0)  # kept for lending batches (Loader.lend)
            finally:
                for fd in fds:
                    os.close(fd)
        if reply.get("delivered"):
            # What the places delivered, as one: the rest's states carry it.
            self._delivered = [{"epoch": self.epoch, "batch": 0, "sampler_state": reply["delivered"]}]
            self._handed = False
        self._job = _Job(conn, reply, mm, self.epoch, self._batch, self._start, arena)
        # A job of a mixture reads with one epoch's weights: at a change, the next epoch is a job of its own.
        self._job.weights = (self._weights_gen, weights)
        self._finalizer = weakref.finalize(self, _close_job, self._job)
        if reply.get("generations"):
            self._generations = (self.epoch, int(reply["generations"]))
        if self._version and reply.get("dataset_version") != self._version and not self.spec.get("refresh"):
            # The rule: a loader reads the data as it was when it was built.
            # Files added, removed or rewritten since change the samples
            # and, in an ImageFolder, the classes: say so, never go on.
            was, now = self._records, reply.get("records")
            self.close()
            raise DataChanged(f"the dataset changed since this loader was built ({was} records then, {now} now; "
                              "files were added, removed or rewritten): build a new loader to read it as it is now",
                              (self.spec.get("paths") or [None])[0])
        self._meta = reply
        return self._job

    def close(self) -> None:
        """End the daemon's job for this loader (a later iteration opens another)."""
        if self._finalizer is not None:
            self._finalizer()
            self._finalizer = None
        self._job = None

    def __enter__(self) -> "Loader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def info(self) -> dict:
        """The dataset's description: format, record size, dtype and shape, classes, paths; plus counts."""
        if self._meta is None:
            self._open()
        m = self._meta
        return dict(m.get("info") or {}, records=m.get("records", 0), positions=m.get("positions", 0),
                    batches=m.get("batches", 0), samples=m.get("samples", 0))

    @property
    def ordering(self) -> dict:
        """What a state of this loader records of its order and samples, and a loaded state must match: the order's
        kind and how its places resume (as the daemon said), a kind's sizes given, and a token corpus's seq_len,
        packing and pack_window. Another world size, number of workers or batch size is no mismatch."""
        return _ordering(self.order, self.spec, (self._meta or {}).get("tokens"))

    @property
    def tokens(self) -> dict | None:
        """Of a token corpus (``seq_len``), the daemon's description of it and its samples: ``seq_len``,
        ``packing``, ``documents``, ``tokens``, ``dtype``, ``pad_id``, ``eod``, and what the packing costs over
        epoch 0 of the seed: ``padding`` (the share of inputs that are padding), ``cut`` (of documents split across
        samples), ``dropped`` (of tokens in no sample). None for other data."""
        if self._meta is None:
            self._open()
        t = self._meta.get("tokens")
        return {k: v for k, v in t.items() if k != "arrays"} if t else None

    def __len__(self) -> int:
        """Batches per epoch for this loader (this rank, and this worker's share)."""
        return int(self.info()["batches"])

    def locate(self, ids: Sequence[int]) -> list[tuple[str, int]]:
        """Where records are: (file, byte offset) of each id, for naming a record in an error."""
        j = self._open()
        reply, _, _ = j.conn.request({"op": wire.OP_LOCATE, "job": j.id, "ids": [int(i) for i in ids]})
        return list(zip(reply.get("paths") or [], reply.get("offsets") or [0] * len(ids)))

    def _left(self, j: "_Job") -> int:
        """How many batches the job delivers from this loader's place to the epoch's end, as the daemon counts."""
        if (self.epoch, self._batch) == j.opened_at:
            return j.left_first
        if self._batch == 0:
            return j.per_epoch
        raise RiffleError(f"the job opened at {j.opened_at} cannot say how many batches follow "
                          f"epoch {self.epoch} batch {self._batch}")

    def __iter__(self) -> Iterator[Batch]:
        """The batches of this epoch (the loader's place to the epoch's end).

        If the daemon goes away mid-epoch (killed, restarted), the loader
        reconnects, starting a daemon if none answers, reopens its job at
        the place after the last batch it delivered and goes on: each
        record exactly once. A shared job's state, which was the daemon's,
        it rebuilds from the ids of the batches it delivered. It raises
        DaemonGone only when no daemon answers within ``reconnect`` seconds,
        or when its shared order's state went with the daemon and cannot be
        rebuilt from what the loader delivered (opportunistic windows, a
        mixture, the rest of an epoch on another topology).
        """
        if self._over is not None:
            self._over = None  # the epoch set_epoch asked for ended at the loaded place
            return
        self._loaded = False
        epoch = self.epoch
        while True:
            try:
                if (yield from self._batches()) and self.epoch == epoch:
                    continue  # a mixture's weights changed: the rest of the epoch is a job of the new ones
                return
            except DaemonGone as gone:
                if not self._recover(gone):
                    raise
                if self.epoch != epoch:
                    return  # the epoch's last batch was delivered before the daemon went

    def _recover(self, gone: DaemonGone) -> bool:
        """Reconnect after the daemon went; False if this loader cannot go on exactly."""
        self._job = None
        if self._unresolved and self.reconnect > 0:
            self._take_kept()
        if self._unresolved or self.reconnect <= 0:
            if self._unresolved:
                gone.args = (f"{gone}; this loader's shared order kept its state in the daemon, which went with it "
                             "(a shared order's opportunistic windows, mixture or rest of an epoch on another topology "
                             "are not rebuilt from what the loader delivered): resume from a checkpoint "
                             "(load_state_dict) to go on",)
            return False
        deadline = time.monotonic() + self.reconnect
        while True:
            try:
                self._open()
                return True
            except DaemonGone:
                if time.monotonic() >= deadline:
                    raise DaemonGone(f"the riffle daemon went away and none answered again within "
                                     f"{self.reconnect}s (Loader(reconnect=...))") from None
                time.sleep(0.1)

    def _kept(self, taken: _Taken | None = None, n: int = 0, epoch: int = 0) -> bytes | None:
        """The shared job's state at this place (or after the first n batches of taken, a place of epoch), as the
        loader kept it; b"" at an epoch's start; None if it kept none of the place."""
        if taken is None:
            taken, epoch = self._taken, self.epoch
            n = taken.count if taken is not None else 0
        positions = int((self._meta or {}).get("positions") or 0)  # the job's records an epoch: its member's
        if taken is None or taken.epoch != epoch or not positions:
            return None
        return taken.state(positions, n)

    def _take_kept(self) -> bool:
        """Make this place's state the one the loader kept (its daemon, or its job, went); False if it kept none."""
        kept = self._kept()
        if kept is None:
            return False
        self._sampler_state, self._skip, self._unresolved = kept or None, None, False
        return True

    def _batches(self) -> Iterator[Batch]:
        """The batches of the loader's job to its epoch's end; True (the generator's value) if it stopped early
        because a mixture's weights changed at the next step, whose rest is a job of its own."""
        j = self._open()
        if j.stream and j.order["replay"]:
            self._taken = _Taken(self.epoch, self._sampler_state if self._batch else None)
        else:
            self._taken = None
        conn, job, info = j.conn, j.id, j.reply.get("info") or {}
        conn_ref = weakref.ref(conn)
        # Up to `pipeline` requests stay ahead of the user, so the next
        # batches' round trips overlap the training step on this one; none
        # goes past this epoch, so the job stays at the next epoch's start.
        # They go `chunk` (half the pipeline) at a time, in one write with the releases queued
        # since the last: each write wakes the daemon, which costs more
        # than the bytes.
        left = self._left(j)
        changed = False
        chunk = max(1, self.pipeline // 2)
        nxt = {"op": wire.OP_NEXT, "job": job}
        tags: collections.deque[int] = collections.deque()
        size = 0  # bytes of the last batch: the estimate for those in flight
        done = False
        try:
            while left > 0 or tags:
                # Until a batch's size is known, one request at a time.
                cap = self.pipeline if size else 1
                if j.lent:
                    self._take_back(j)
                if not tags or len(tags) <= cap - chunk:
                    k = 0
                    while k < left and len(tags) + k < cap and self._room(size * (len(tags) + k + 1)):
                        k += 1
                    if k:
                        tags.extend(conn.send_many([nxt] * k))
                        left -= k
                if not tags:
                    self._wait_for_memory(size)  # raises: held batches fill the job's memory
                    continue
                try:
                    m, payload, _ = conn.receive(tags.popleft())
                except DaemonGone:
                    tags.clear()
                    _forget(conn)
                    self._job = None
                    raise
                if m["op"] == wire.OP_END:
                    break
                self._advance(m.get("state") or {}, m, j.stream)
                j.epoch, j.batch = self.epoch, self._batch
                batch = self._batch_from(m, payload, j.mm, info, conn_ref, job)
                size = max(size, m.get("data_len", 0))
                yield batch
                del batch
                if j.weights is not None and j.weights[0] != self._weights_gen:
                    # set_weights from the next step: the batches requested
                    # ahead are the old weights', dropped with this job.
                    changed = True
                    break
            done = True
        finally:
            if not done or tags:
                # Stopped mid-epoch: the daemon's place is ahead of ours.
                for tag in tags:
                    conn.drop(tag)
                if self._unresolved:
                    try:
                        self._resolve()  # the job holding the sampler state is closing
                    except (RiffleError, OSError):
                        pass
                self.close()
        return changed

    def _advance(self, st: dict, m: dict, stream: bool = False) -> None:
        epoch = self.epoch
        self.epoch, self._batch = int(st.get("epoch", m["epoch"])), int(st.get("batch", m["index"] + 1))
        if self.epoch != epoch:
            # The rest of an epoch was one epoch; the next one's start still says what it was dealt from.
            self._ended = self._delivered
            self._start, self._delivered = 0, None
        ss = st.get("sampler_state")
        self._sampler_state = base64.b64decode(ss) if ss else None
        self._skip = st.get("skip") or None
        self._unresolved = stream

    def _batch_from(self, m, payload, mm, info, conn_ref, job) -> Batch:
        n = m.get("n", 0)
        buf = mm if mm is not None else payload
        k = 4 if m.get("labels") else 3
        arrow = m.get("arrow")
        extra = 2 * (arrow["nodes"] + arrow["buffers"]) if arrow else 0
        meta = np.frombuffer(buf, np.int64, count=n * k + extra, offset=m.get("meta_off", 0)).copy()
        ids, offs, lens = meta[:n], meta[n : 2 * n], meta[2 * n : 3 * n]
        labels = meta[3 * n : 4 * n] if m.get("labels") else None
        if self._taken is not None:
            if self._taken.epoch != self.epoch:
                self._taken = _Taken(self.epoch, None)  # the place is the next epoch's start
            if m["epoch"] == self.epoch:
                self._taken.add(ids)
        size = m.get("data_len", 0)
        raw = np.frombuffer(buf, np.uint8, count=size, offset=m.get("data_off", 0))
        fin = None
        if mm is not None:
            self._held += size
            fin = weakref.finalize(raw, _give_back, conn_ref, job, m["seq"], self, size)
        state = self._place_state()
        b = Batch(m["epoch"], m["index"], bool(m.get("last")), ids, offs, lens, labels, raw, info, self.dtype,
                  self.shape, state)
        if fin is not None:
            b._lease = (self._job, m["seq"], m.get("data_off", 0), fin)
        if arrow:
            table = meta[n * k :].reshape(-1, 2)
            b._table = (int(arrow["body"]), table[: arrow["nodes"]], table[arrow["nodes"] :])
        if m.get("arrays"):
            # A batch of a token corpus's samples: its arrays, views of raw
            # (each keeps the batch's region alive), where the daemon says.
            b._arrays = {a["name"]: raw[a["off"]: a["off"] + a["len"]].view(np.dtype(a["dtype"])).reshape(a["shape"])
                         for a in m["arrays"]}
        return b

    def _place_state(self):
        """The state after the batch just received, or, if the daemon keeps its sampler state, a function asking for it."""
        if not self._unresolved:
            return self.state_dict()
        j, place = self._job, {"epoch": self.epoch, "batch": self._batch, "seed": self.spec["seed"]}
        self._whose(place)
        taken = self._taken
        n = taken.count if taken is not None else 0

        def ask() -> dict:
            try:
                st = j.state(place["epoch"], place["batch"])
            except DaemonGone:
                # The daemon went with the job's state: the one kept here.
                kept = self._kept(taken, n, place["epoch"]) if taken is not None else None
                if kept is None:
                    raise
                st = {"sampler_state": base64.b64encode(kept).decode() if kept else None}
            out = dict(place)
            if st.get("sampler_state"):
                out["sampler_state"] = st["sampler_state"]
            if st.get("skip"):
                out["skip"] = list(st["skip"])
            return out
        return ask

    # --- lending batches to another process ---
    def lend(self, batch: Batch) -> tuple[str, Any, Any, int, int] | None:
        """Hand ``batch``'s memory over to another process (a DataLoader worker's batch to the main process),
        without a copy: None if it cannot be (no shared memory, or the batch was already given back).

        Returns ``(key, arena, returns, data_off, seq)``: the other process maps the job's arena (``arena``,
        a ``multiprocessing.reduction.DupFd`` the first time a job lends, else None: the borrower keeps the
        mapping by ``key``) and views the batch at ``data_off``; when it is done with the batch it writes
        ``seq`` (8 bytes, little-endian) to ``returns`` (likewise a DupFd of a pipe the first time). From the
        lend on, the batch's region stays the daemon's to keep for the borrower, whatever this process drops:
        it is given back only when the borrower writes its seq, or when this process's job closes (the daemon
        then keeps the pages of batches not given back, so the borrower's view stays valid; a later give-back
        finds the pipe closed). This loader reads what came back before each request.
        """
        lease = getattr(batch, "_lease", None)
        if lease is None:
            return None
        j, seq, data_off, fin = lease
        if j is None or j.fd is None or not fin.alive:
            return None
        from multiprocessing.reduction import DupFd
        arena = returns = None
        if j.returns is None:
            r, w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
            j.returns, j.key = r, f"{os.getpid()}-{id(j)}-{os.urandom(4).hex()}"
            arena, returns = DupFd(j.fd), DupFd(w)  # each holds a duplicate until the borrower takes it
            os.close(w)
        _, _, args, _ = fin.detach()
        j.lent[seq] = args
        batch._lease = None
        return j.key, arena, returns, data_off, seq

    def _take_back(self, j: _Job) -> None:
        """Give back to the daemon the lent batches the borrower is done with."""
        if j.returns is None or not j.lent:
            return
        while True:
            try:
                got = os.read(j.returns, 8 << 10)
            except BlockingIOError:
                return
            if not got:
                return
            for (seq,) in struct.iter_unpack("<Q", got[: len(got) // 8 * 8]):
                args = j.lent.pop(seq, None)
                if args is not None:
                    _give_back(*args)

    def _bound(self) -> int | None:
        """The job's memory bound: ``memory=``, or the one the daemon chose (it says in its answer to the check)."""
        return self.memory or (self._meta or {}).get("memory_bytes") or None

    def _room(self, next_bytes: int) -> bool:
        bound = self._bound()
        return bound is None or self._held + next_bytes <= bound

    def _wait_for_memory(self, next_bytes: int) -> None:
        # The daemon cannot load a batch while held batches fill the job's
        # memory; say so instead of waiting forever.
        if self._room(next_bytes):
            return
        if self._job is not None and self._job.lent:
            # A borrower may have given batches back since the last request.
            deadline = time.monotonic() + 5.0
            while not self._room(next_bytes) and self._job.lent and time.monotonic() < deadline:
                self._take_back(self._job)
                if not self._room(next_bytes):
                    time.sleep(0.001)
            if self._room(next_bytes):
                return
        gc.collect()
        if not self._room(next_bytes):
            raise MemoryBudget(
                f"{self._held} bytes of batches are still referenced, the job's whole memory ({self._bound()} bytes): "
                "drop references to old batches, or raise memory=")
