"""A loader's keywords as the daemon takes them: what can be checked without the daemon is checked here, with the
errors DataLoader and ImageFolder raise; every default is the daemon's (spec.py)."""

from __future__ import annotations

import json
import os
from typing import Any, Sequence

import numpy as np

from . import spec, wire
from .errors import PathNotFound, WrongType


# The fields of the order sampler="auto" chose (wire.AutoOrder) that name it: what a later open, or a resumed run,
# reads again instead of choosing (the others are its measures: rl, rate, sequential).
_ORDER_KEYS = ("sampler", "block_size", "window")


def _subset(s) -> dict | None:
    """A subset as the daemon takes it: a range, ids, or a dict of ranges, ids and labels."""
    if s is None or isinstance(s, dict):
        return s
    if isinstance(s, range):
        if s.step != 1:
            return {"ids": list(s)}
        return {"ranges": [[s.start, s.stop]]}
    return {"ids": [int(i) for i in s]}


def _ids(ids) -> dict:
    """ids= as a subset: an array of ids, or a file of them (an integer .npy, or one id per line) the daemon reads."""
    if isinstance(ids, (str, os.PathLike)):
        p = os.fspath(ids)
        if "://" not in p and not os.path.exists(p):
            raise PathNotFound(f"No such file or directory: {p!r}", p)
        return {"ids_file": _abspath(p)}
    a = np.asarray(ids)
    if a.ndim != 1 or (a.size and a.dtype.kind not in "iu"):
        raise ValueError(f"ids: want a one-dimensional array of integer ids, or a file of them; got {a.dtype} of shape {a.shape}")
    return {"ids": [int(i) for i in a]}


_FILTER_KEYS = {"label": "labels", "labels": "labels", "min_size": "min_size", "max_size": "max_size", "glob": "glob",
                "column": "column", "in": "in", "min": "min", "max": "max"}


def _filter(f) -> dict | None:
    """filter= as the daemon takes it: label(s), min_size, max_size, glob."""
    if f is None:
        return None
    if not isinstance(f, dict) or not f:
        raise ValueError(f"filter: want a dict of label, min_size, max_size, glob, or column with in, min or max; got {f!r}")
    out: dict[str, Any] = {}
    for k, v in f.items():
        if k not in _FILTER_KEYS:
            raise ValueError(f"filter: unknown test {k!r} (known: {', '.join(_FILTER_KEYS)})")
        if _FILTER_KEYS[k] == "labels":
            out["labels"] = [int(x) for x in (v if isinstance(v, (list, tuple, set, range, np.ndarray)) else [v])]
        elif k == "in":
            vals = v if isinstance(v, (list, tuple, set, np.ndarray)) else [v]
            out["in"] = [x.item() if isinstance(x, np.generic) else x for x in vals]
        elif k in ("min", "max"):
            out[k] = float(v)
        else:
            out[_FILTER_KEYS[k]] = v
    return out


def _check_args(paths: Sequence, batch_size: Any, prefixes: bool = False) -> None:
    """What can be checked without the daemon, with the errors DataLoader and ImageFolder raise. With prefixes (a
    token corpus), a path may be a Megatron corpus's prefix, its .idx beside it."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise ValueError(f"batch_size should be a positive integer value, but got batch_size={batch_size!r}")
    if not paths:
        raise ValueError("paths: none given")
    for p in paths:
        p = os.fspath(p)
        if "://" in p or any(c in p for c in "*?["):
            continue  # an object or a glob: the daemon says
        if not os.path.exists(p) and not (prefixes and os.path.exists(p + ".idx")):
            raise PathNotFound(f"No such file or directory: {p!r}", p)


def _check_sendable(name: str, value: Any) -> None:
    """Refuse an option's value of a type the daemon cannot be sent (a Python object where riffle takes a name or a
    number), naming the option: json.dumps would say only that some object is not serializable. The error is a
    ``TypeError``, as Python raises for an argument of the wrong type, and an :class:`InvalidSpec`, as the daemon's
    refusal of a value is. Numbers of any type (numpy's) are sent as the numbers they are (wire.encode); a value of
    the right type the daemon refuses (a NaN, a bound) is the daemon's, or wire's, to name."""
    try:
        json.dumps(value, default=wire._number)
    except TypeError:
        keyword, kind = spec.OPTIONS[name][0], spec.OPTIONS[name][1]
        hint = ""
        if name == "sampler":
            hint = (": riffle orders and shards the records itself (rank= and world_size= split each epoch as "
                    "DistributedSampler does); riffle.torch.loader takes a DistributedSampler, RandomSampler, "
                    "SequentialSampler or SubsetRandomSampler and reads what it says")
        what = type(value).__name__
        raise WrongType(f"invalid job spec: {name}: {what} is not a {kind}; {keyword}= takes a {kind} "
                        f"({spec.OPTIONS[name][5]}), not a {what}{hint}") from None


def _abspath(p) -> str:
    p = os.fspath(p)
    return p if "://" in p else os.path.abspath(p)
