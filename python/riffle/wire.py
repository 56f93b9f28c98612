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

# --- generated from Go's package wire by `go generate ./wire` (wire/gen): do not edit until the end marker ---
# Version is the protocol version a hello carries.
VERSION = 2

# MaxHeader bounds the size of a request's header, which the daemon
# reads from any client; a larger length means a broken peer.
MAX_HEADER = 1 << 24

# MaxReply bounds the size of a reply's header, which a client reads from
# its own daemon: an "opened" lists every file of its dataset, and a glob
# may name a million.
MAX_REPLY = 1 << 30

# MaxHelloHeader bounds a header before the peer has authenticated: a
# hello is small, and an unauthenticated peer must not make the daemon
# hold memory.
MAX_HELLO_HEADER = 1 << 12

# Ops.
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
# OpCheck asks what an open would answer, without a job: the spec is
# checked and the dataset opened, and the reply is an "opened" with
# job 0 (or the error the open would give). A client checks its
# arguments when it is built, not at its first batch.
OP_CHECK = "check"

# Error kinds: what an error frame is about.
KIND_SPEC = "spec"  # the request asked for something invalid (a bad option, a bound)
KIND_NOT_FOUND = "not_found"  # a path names nothing
KIND_DATA = "data"  # the data is bad: corrupt, truncated, a CRC mismatch, a record a transform refused
KIND_CHANGED = "changed"  # the data changed since the job opened it
KIND_CLOSED = "closed"  # the job or the daemon is closing
KIND_MEMORY = "memory"  # the job does not fit the daemon's memory budget (now, or at all)
KIND_INTERNAL = "internal"  # anything else: the daemon's own failure

# Every message struct's JSON field names, in order: what a client sends and reads of each.
FIELDS: dict[str, tuple[str, ...]] = {
    "Array": ("name", "dtype", "shape", "off", "len"),
    "Arrow": ("body", "nodes", "buffers"),
    "AutoOrder": ("sampler", "block_size", "window", "rl", "rate", "sequential"),
    "CacheStatus": ("bytes", "budget", "items", "hits", "misses", "evictions"),
    "Column": ("name", "type", "layout", "dtype", "width", "size", "nullable", "children"),
    "DiskStatus": ("bytes", "blocks", "hits", "misses"),
    "Filter": ("labels", "min_size", "max_size", "glob", "column", "in", "min", "max"),
    "GroupStatus": ("source", "records", "jobs", "shared", "rounds", "given", "saved", "pages_kept", "pages_dropped",
        "records_passed"),
    "Info": ("format", "record_size", "dtype", "shape", "classes", "header", "paths", "transform", "shared", "offsets",
        "persisted", "columns", "schema", "features"),
    "JobSpec": ("paths", "format", "record_size", "header_bytes", "csv_header", "skip_crc", "drop_partial", "direct",
        "columns", "split", "extensions", "subset", "filter", "dedup", "refresh", "generations", "mixture",
        "mixture_stop", "mixture_history", "mixture_schedule", "transform", "seq_len", "packing", "pad_last", "eod",
        "vocab_size", "pad_id", "token_dtype", "token_column", "pack_window", "shuffle", "sampler", "block_size",
        "window", "min_randomness", "auto_order", "buffer", "reservoir", "opportunistic", "seed", "rank", "world",
        "rank_drop_last", "share", "batch_size", "drop_last", "prefetch", "depth", "memory_bytes", "ordered",
        "batch_stride", "batch_offset", "epoch", "start", "batch", "epochs", "sampler_state", "skip", "delivered"),
    "JobStatus": ("id", "subset", "epoch", "position", "samples_per_sec", "transform", "memory", "memory_full", "auto",
        "direct"),
    "MemoryStatus": ("limit", "cache", "heap", "decode", "jobs", "held", "holders", "bent", "waiting", "refused",
        "shrunk", "grown", "go_limit", "go_heap", "go_runtime", "decoding", "decode_peak", "rss", "rss_peak",
        "rss_anon", "rss_file", "rss_shmem"),
    "MemoryWait": ("bytes", "seconds"),
    "MixChange": ("epoch", "step", "weights"),
    "MixSource": ("paths", "weight"),
    "MixWeights": ("until", "position", "weights"),
    "Msg": ("op", "tag", "version", "token", "server", "spec", "job", "records", "positions", "batches", "left",
        "samples", "generations", "auto", "order", "direct", "delivered", "dataset_version", "info", "arena_size",
        "memory_bytes", "epochs", "tokens", "stream", "seqs", "seq", "epoch", "index", "last", "n", "data_off",
        "data_len", "meta_off", "labels", "payload", "arrow", "arrays", "state", "jobs", "clients", "status", "ids",
        "paths", "offsets", "message", "kind", "path", "offset"),
    "OrderInfo": ("kind", "positional", "shared", "rest", "packed", "replay"),
    "Part": ("rank", "world", "worker", "workers", "drop_last", "batch_size", "window"),
    "PeersStatus": ("node", "nodes", "local", "from_peers", "served", "fallbacks", "fetched", "bytes"),
    "RemoteStatus": ("gets", "bytes", "retries"),
    "State": ("epoch", "batch", "sampler_state", "skip", "part"),
    "Status": ("groups", "cache", "clients", "read_bytes", "served_bytes", "remote", "disk", "peers", "memory"),
    "Subset": ("ranges", "ids", "labels", "ids_file"),
    "Tokens": ("seq_len", "packing", "documents", "tokens", "dtype", "pad_id", "eod", "vocab_size", "padding", "cut",
        "dropped", "per_epoch", "arrays"),
}
# --- end of the generated block ---

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
