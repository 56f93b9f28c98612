"""riffle's client-daemon protocol, version 2: a line-by-line mirror of the
Go package ``wire`` (see docs/protocol.md).

A frame is a 4-byte little-endian length, that many bytes of a JSON header,
then ``payload`` bytes if the header says so. On a Unix socket the daemon
passes a job's shared-memory arena as a file descriptor (SCM_RIGHTS) along
the ``opened`` frame, and batch headers say where in it a batch lies.
"""

from __future__ import annotations

import json
import math
import numbers
import struct
from typing import Any

VERSION = 2
# A request's header, which the daemon reads from any client; a reply's, which a client reads from its own daemon
# (an "opened" lists every file of its dataset, and a glob may name a million).
MAX_HEADER = 16 << 20
MAX_REPLY = 1 << 30

OP_HELLO = "hello"
OP_OPEN = "open"
OP_OPENED = "opened"
OP_NEXT = "next"
OP_BATCH = "batch"
OP_END = "end"
OP_RELEASE = "release"
OP_CLOSE = "close"
OP_CLOSED = "closed"
OP_STATS = "stats"
OP_STATUS = "status"
OP_LOCATE = "locate"
OP_STATE = "state"
OP_ERROR = "error"
OP_CHECK = "check"

# Error kinds: what an error frame is about.
KIND_SPEC = "spec"
KIND_NOT_FOUND = "not_found"
KIND_DATA = "data"
KIND_CHANGED = "changed"
KIND_CLOSED = "closed"
KIND_MEMORY = "memory"
KIND_INTERNAL = "internal"

_LEN = struct.Struct("<I")


class FrameError(Exception):
    """A malformed frame: the peer is not speaking this protocol."""


class FieldError(ValueError):
    """A field of a message JSON cannot carry (NaN, an infinity, an object of no JSON type): ``field`` is its path,
    as the daemon names one ("spec.seed", "spec.mixture[1].weight")."""

    def __init__(self, field: str, why: str):
        super().__init__(f"{field}: {why}")
        self.field, self.why = field, why


def _number(o: Any) -> int | float:
    """A number of another type (numpy's int64, float32) as the JSON number it is."""
    if isinstance(o, numbers.Integral):
        return int(o)
    if isinstance(o, numbers.Real):
        return float(o)
    raise TypeError(f"{type(o).__name__} is not a JSON type")


def _unsendable(v: Any, path: str) -> tuple[str, str] | None:
    """The path of the first value in ``v`` that JSON cannot carry, and why."""
    if isinstance(v, dict):
        for k, x in v.items():
            if not isinstance(k, (str, int, float, bool)) and k is not None:
                return path, f"a key {k!r} is not a string"
            found = _unsendable(x, f"{path}.{k}" if path else str(k))
            if found:
                return found
    elif isinstance(v, (list, tuple)):
        for i, x in enumerate(v):
            found = _unsendable(x, f"{path}[{i}]")
            if found:
                return found
    elif isinstance(v, bool) or v is None or isinstance(v, str):
        return None
    elif isinstance(v, numbers.Real):
        if not isinstance(v, numbers.Integral) and not math.isfinite(float(v)):
            return path, f"{v!r} is not a finite number"
    else:
        return path, f"{type(v).__name__} {v!r:.80} is not a number, string, list or mapping"
    return None


def encode(msg: dict[str, Any]) -> bytes:
    """Return ``msg``'s frame header: length and JSON. A value JSON cannot carry is a :class:`FieldError` naming
    it: sent as Python writes it (NaN), the daemon could not read the frame at all."""
    try:
        body = json.dumps(msg, separators=(",", ":"), allow_nan=False, default=_number).encode()
    except (ValueError, TypeError) as e:
        field, why = _unsendable(msg, "") or ("", str(e))
        raise FieldError(field, why) from None
    return _LEN.pack(len(body)) + body


def header_length(prefix: bytes, limit: int = MAX_HEADER) -> int:
    """Return the JSON length a frame's 4-byte prefix announces, at most ``limit``."""
    (n,) = _LEN.unpack(prefix)
    if n > limit:
        raise FrameError(f"header of {n} bytes, at most {limit}")
    return n


def decode(body: bytes) -> dict[str, Any]:
    """Parse a frame's JSON header."""
    try:
        msg = json.loads(body)
    except ValueError as e:
        raise FrameError(str(e)) from e
    if not isinstance(msg, dict) or not msg.get("op"):
        raise FrameError("no op")
    return msg
