"""A mixture's sources and its weights by epoch: what a job opens with at an epoch, and what a state keeps, so
that weights changed at an epoch carry every source on from where the old ones left it."""

from __future__ import annotations

import math
import os
from typing import Sequence

import numpy as np

from .options import _abspath, _check_args


def _mixture(mixture) -> list[dict]:
    """A mixture as the daemon takes it, [{"paths": [...], "weight": w}, ...], from [(paths, weight), ...]."""
    if isinstance(mixture, (str, bytes, os.PathLike)) or not isinstance(mixture, Sequence) or not mixture:
        raise ValueError(f"mixture: want a list of (paths, weight), got {mixture!r}")
    out = []
    for k, src in enumerate(mixture):
        try:
            paths, w = (src["paths"], src["weight"]) if isinstance(src, dict) else src
        except (TypeError, ValueError, KeyError):
            raise ValueError(f"mixture source {k}: want (paths, weight), got {src!r}") from None
        if isinstance(paths, (str, os.PathLike)):
            paths = [paths]
        _check_args(paths, 1)
        out.append({"paths": [_abspath(p) for p in paths], "weight": _weight(w, f"mixture source {k}")})
    return out


def _weight(w, what: str) -> float:
    if isinstance(w, bool) or not isinstance(w, (int, float, np.integer, np.floating)) or not (w > 0 and math.isfinite(w)):
        raise ValueError(f"{what}: weight {w!r}, want a positive finite number")
    return float(w)


def _segments(mixture: list[dict], history: Sequence[dict] | None) -> list[tuple[int, list[float]]]:
    """A mixture's weights as (first epoch, weights) segments: its history's, then its own."""
    segs, start = [], 0
    for h in history or []:
        segs.append((start, [float(w) for w in h["weights"]]))
        start = int(h["until"])
    segs.append((start, [s["weight"] for s in mixture]))
    return segs


def _with_weights(segs: list[tuple[int, list[float]]], weights: Sequence[float], epoch: int, n: int) -> list[tuple[int, list[float]]]:
    """segs with weights from epoch on: the weights of the epochs before stay, so every source goes on from where
    they had left it."""
    ws = [_weight(w, f"source {k}") for k, w in enumerate(weights)]
    if len(ws) != n:
        raise ValueError(f"{len(ws)} weights for a mixture of {n} sources")
    if epoch < segs[-1][0]:
        raise ValueError(f"weights from epoch {epoch}, before the last change, at epoch {segs[-1][0]}")
    return segs[:-1] + [(epoch, ws)] if epoch == segs[-1][0] else segs + [(epoch, ws)]


def _mixture_at(spec: dict, segs: list[tuple[int, list[float]]], epoch: int) -> tuple[dict, int]:
    """spec with the mixture's weights of epoch, and which segment that is: a job opens with the weights of its
    epoch and those before them."""
    k = max(i for i, (start, _) in enumerate(segs) if start <= epoch)
    spec = dict(spec, mixture=[dict(s, weight=w) for s, w in zip(spec["mixture"], segs[k][1])])
    spec.pop("mixture_history", None)
    if k:
        spec["mixture_history"] = _history(segs[:k + 1])
    return spec, k


def _history(segs: list[tuple[int, list[float]]]) -> list[dict]:
    """The weights before the last segment's, as the daemon takes them: each until the epoch the next begins."""
    return [{"until": segs[i + 1][0], "weights": segs[i][1]} for i in range(len(segs) - 1)]


def _weights_state(segs: list[tuple[int, list[float]]]) -> list[list]:
    """A mixture's weights as a state keeps them: [from epoch, weights] each."""
    return [[start, list(ws)] for start, ws in segs]


def _state_weights(state: dict, n: int) -> list[tuple[int, list[float]]]:
    """A state's mixture weights, checked."""
    segs = [(int(start), [_weight(w, "a state's mixture") for w in ws]) for start, ws in state["mixture_weights"]]
    if not segs or segs[0][0] != 0 or any(len(ws) != n for _, ws in segs):
        raise ValueError(f"this state's mixture weights are not of a mixture of {n} sources from epoch 0")
    return segs
