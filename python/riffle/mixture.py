"""A mixture's sources and its weights by place (an epoch, a position of its order): what a job opens with, and what
a state keeps, so that weights changed at any step carry every source on from where the old ones left it."""

from __future__ import annotations

import math
import os
from typing import Sequence

import numpy as np

from .options import _abspath, _check_args


def _mixture(mixture, prefixes: bool = False) -> list[dict]:
    """A mixture as the daemon takes it, [{"paths": [...], "weight": w}, ...], from [(paths, weight), ...]; with
    prefixes (token corpora), a path may be a Megatron corpus's prefix."""
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
        _check_args(paths, 1, prefixes)
        out.append({"paths": [_abspath(p) for p in paths], "weight": _weight(w, f"mixture source {k}")})
    return out


def _weight(w, what: str) -> float:
    if isinstance(w, bool) or not isinstance(w, (int, float, np.integer, np.floating)) or not (w > 0 and math.isfinite(w)):
        raise ValueError(f"{what}: weight {w!r}, want a positive finite number")
    return float(w)


# A mixture's weights are segments (epoch, position, weights): the weights from that place of the epoch's order
# (positions over every rank, so a place is the same on any topology) to the next segment's.
Segments = list[tuple[int, int, list[float]]]


def _segments(mixture: list[dict], history: Sequence[dict] | None, schedule: Sequence | None = None,
              global_batch: int = 1) -> Segments:
    """A mixture's weights as segments: its history's, its own, then its schedule's ((epoch, step, weights) or
    (step, weights) of epoch 0, each step a global batch of ``global_batch`` positions)."""
    segs, start = [], (0, 0)
    for h in history or []:
        segs.append((start[0], start[1], [float(w) for w in h["weights"]]))
        start = (int(h["until"]), int(h.get("position", 0)))
    segs.append((start[0], start[1], [s["weight"] for s in mixture]))
    for c in _schedule(schedule):
        segs = _with_weights(segs, c["weights"], c["epoch"], c["step"] * global_batch, len(mixture))
    return segs


def _schedule(schedule: Sequence | None) -> list[dict]:
    """A schedule of weights as the daemon takes it, [{"epoch": e, "step": s, "weights": [...]}, ...], from
    [(step, weights), ...], [(epoch, step, weights), ...] or dicts."""
    out = []
    for k, c in enumerate(schedule or []):
        if isinstance(c, dict):
            e, st, ws = c.get("epoch", 0), c["step"], c["weights"]
        elif len(c) == 2:
            (st, ws), e = c, 0
        elif len(c) == 3:
            e, st, ws = c
        else:
            raise ValueError(f"mixture_schedule entry {k}: want (step, weights) or (epoch, step, weights), got {c!r}")
        if int(e) < 0 or int(st) < 0:
            raise ValueError(f"mixture_schedule entry {k}: epoch {e} step {st}, want neither negative")
        out.append({"epoch": int(e), "step": int(st), "weights": [_weight(w, f"mixture_schedule entry {k}") for w in ws]})
    return out


def _with_weights(segs: Segments, weights: Sequence[float], epoch: int, position: int, n: int) -> Segments:
    """segs with weights from position ``position`` of epoch on: the weights before stay, so every source goes on
    from where they had left it; a change at the place of the last replaces it."""
    ws = [_weight(w, f"source {k}") for k, w in enumerate(weights)]
    if len(ws) != n:
        raise ValueError(f"{len(ws)} weights for a mixture of {n} sources")
    place, last = (int(epoch), int(position)), (segs[-1][0], segs[-1][1])
    if place < last:
        raise ValueError(f"weights from epoch {epoch} position {position}, before the last change, at epoch {last[0]} "
                         f"position {last[1]}")
    new = (place[0], place[1], ws)
    return segs[:-1] + [new] if place == last else segs + [new]


def _mixture_at(spec: dict, segs: Segments) -> dict:
    """spec with the mixture's weights: every segment (the daemon reads each from its place), the last as the
    sources' weights and those before as the history."""
    spec = dict(spec, mixture=[dict(s, weight=w) for s, w in zip(spec["mixture"], segs[-1][2])])
    spec.pop("mixture_history", None)
    spec.pop("mixture_schedule", None)  # the segments hold it, in positions
    if len(segs) > 1:
        spec["mixture_history"] = _history(segs)
    return spec


def _history(segs: Segments) -> list[dict]:
    """The weights before the last segment's, as the daemon takes them: each until the place the next begins."""
    return [{"until": segs[i + 1][0], "position": segs[i + 1][1], "weights": segs[i][2]} for i in range(len(segs) - 1)]


def _weights_state(segs: Segments) -> list[list]:
    """A mixture's weights as a state keeps them: [from epoch, weights] each from an epoch's start (as states kept
    them before weights changed at a step), [from epoch, from position, weights] each from inside one."""
    return [[e, list(ws)] if p == 0 else [e, p, list(ws)] for e, p, ws in segs]


def _state_weights(state: dict, n: int) -> Segments:
    """A state's mixture weights, checked ([epoch, weights] each, as states before positions kept them, or
    [epoch, position, weights])."""
    segs = []
    for seg in state["mixture_weights"]:
        e, p, ws = (seg[0], 0, seg[1]) if len(seg) == 2 else seg
        segs.append((int(e), int(p), [_weight(w, "a state's mixture") for w in ws]))
    if not segs or segs[0][:2] != (0, 0) or any(len(ws) != n for _, _, ws in segs):
        raise ValueError(f"this state's mixture weights are not of a mixture of {n} sources from epoch 0")
    return segs
