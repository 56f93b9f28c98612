"""riffle's client-daemon protocol, version 2: a line-by-line mirror of the
Go package ``wire`` (see docs/protocol.md).

A frame is a 4-byte little-endian length, that many bytes of a JSON header,
then ``payload`` bytes if the header says so. On a Unix socket the daemon
passes a job's shared-memory arena as a file descriptor (SCM_RIGHTS) along
the ``opened`` frame, and batch headers say where in it a batch lies.
"""

from __future__ import annotations

import json
import struct
from typing import Any

VERSION = 2
MAX_HEADER = 16 << 20

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


def encode(msg: dict[str, Any]) -> bytes:
    """Return ``msg``'s frame header: length and JSON."""
    body = json.dumps(msg, separators=(",", ":")).encode()
    return _LEN.pack(len(body)) + body


def header_length(prefix: bytes) -> int:
    """Return the JSON length a frame's 4-byte prefix announces."""
    (n,) = _LEN.unpack(prefix)
    if n > MAX_HEADER:
        raise FrameError(f"header of {n} bytes")
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
