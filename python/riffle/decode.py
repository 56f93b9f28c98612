"""Decoders from a batch's record bytes to arrays and Python objects.

Each takes a :class:`riffle.client.Batch` and returns what a training loop
wants: fixed-size records as one ``(n, ...)`` array of a dtype (a view of the
shared batch memory, not a copy, when the records are packed); ``.npy`` rows;
LIBSVM lines as CSR arrays with labels, or dense; JSONL lines as dicts.
Malformed records raise :class:`DecodeError` naming the record id.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Sequence

import numpy as np


class DecodeError(ValueError):
    """A record could not be decoded; names the record id. ``index`` is the record's place in its batch, when one
    record is at fault, and ``reason`` what is wrong with it (the message without the record's id), so that a
    caller who can locate the record names its file and offset (riffle.torch's RecordError)."""

    def __init__(self, message: str, index: int | None = None, reason: str | None = None):
        super().__init__(message)
        self.index, self.reason = index, reason or message


def fixed(batch, dtype: Any = np.uint8, shape: Sequence[int] | None = None) -> np.ndarray:
    """Fixed-size records as an array of ``(n, *shape)`` of ``dtype``.

    Without ``shape`` each record is a flat row. A view of the batch's memory
    when the records are packed back to back, else one gathering copy.
    """
    dt = np.dtype(dtype)
    n = batch.n
    if n == 0:
        return np.empty((0,) + tuple(shape or (0,)), dt)
    size = int(batch.lens[0])
    if not (batch.lens == size).all():
        raise DecodeError("records of different sizes cannot form one array")
    if size % dt.itemsize:
        raise DecodeError(f"record of {size} bytes is not a whole number of {dt} items")
    if shape is None:
        shape = (size // dt.itemsize,)
    if math.prod(shape) * dt.itemsize != size:
        raise DecodeError(f"shape {tuple(shape)} of {dt} is not the {size}-byte record")
    raw = batch.raw
    if batch.packed:
        flat = raw[: n * size]
    else:
        idx = (batch.offs[:, None] + np.arange(size)[None, :]).reshape(-1)
        flat = raw[idx]
    return flat.view(dt).reshape((n,) + tuple(shape))


def npy_dtype(descr: str) -> np.dtype:
    """A ``.npy`` header's dtype: a dtype string, or a structured dtype's
    list of fields as numpy writes it (read with ``ast.literal_eval``)."""
    if descr.startswith("["):
        import ast

        # As numpy.load reads it: '' fields are padding, not fields.
        return np.lib.format.descr_to_dtype(ast.literal_eval(descr))
    return np.dtype(descr)


def npy(batch) -> np.ndarray:
    """Rows of a ``.npy`` array, with the file's dtype and row shape (a
    structured array for a structured dtype)."""
    info = batch.info
    return fixed(batch, npy_dtype(info["dtype"]), info.get("shape") or ())


def libsvm(batch, n_features: int | None = None, dense: bool = False, zero_based: bool = False,
           multilabel: bool = False):
    """LIBSVM/SVMlight lines as ``(labels, (indptr, indices, values))``.

    Indices are 1-based in the format and 0-based in the result unless
    ``zero_based`` says the file already is. With ``dense`` the features
    come as an ``(n, n_features)`` float32 array instead of CSR. With
    ``multilabel`` each label is a tuple of the comma-separated labels
    (possibly empty), as scikit-learn's ``load_svmlight_file(multilabel=True)``
    gives them; without it a comma in a label is an error.
    """
    labels: Any = [] if multilabel else np.empty(batch.n, np.float32)
    indptr = np.zeros(batch.n + 1, np.int64)
    indices: list[int] = []
    values: list[float] = []
    shift = 0 if zero_based else 1
    for i in range(batch.n):
        line = bytes(batch.record(i)).split(b"#", 1)[0].split()
        try:
            if multilabel:
                if line and b":" not in line[0]:
                    labels.append(tuple(float(x) for x in line[0].split(b",") if x))
                    line = line[1:]
                else:
                    labels.append(())
            else:
                if not line:
                    raise ValueError("empty line")
                if b"," in line[0]:
                    raise ValueError("a multilabel line (pass multilabel=True)")
                labels[i] = float(line[0])
                line = line[1:]
            for tok in line:
                if tok.startswith(b"qid:"):
                    continue
                k, v = tok.split(b":", 1)
                indices.append(int(k) - shift)
                values.append(float(v))
        except ValueError as e:
            why = f"malformed LIBSVM line {bytes(batch.record(i))[:80]!r}: {e}"
            raise DecodeError(f"record {batch.ids[i]}: {why}", i, why) from None
        indptr[i + 1] = len(indices)
    ind = np.asarray(indices, np.int64)
    val = np.asarray(values, np.float32)
    if n_features is None:
        n_features = int(ind.max()) + 1 if len(ind) else 0
    if len(ind) and (ind.min() < 0 or ind.max() >= n_features):
        bad = int(np.flatnonzero((ind < 0) | (ind >= n_features))[0])
        i = int(np.searchsorted(indptr, bad, side="right")) - 1  # the record whose features hold it
        why = f"feature index {int(ind[bad]) + shift} outside [{shift}, {n_features + shift})"
        raise DecodeError(f"record {batch.ids[i]}: {why}", i, why)
    if not dense:
        return labels, (indptr, ind, val)
    out = np.zeros((batch.n, n_features), np.float32)
    rows = np.repeat(np.arange(batch.n), np.diff(indptr))
    out[rows, ind] = val
    return labels, out


def jsonl(batch) -> list[dict]:
    """JSONL lines as parsed objects."""
    out = []
    for i in range(batch.n):
        try:
            out.append(json.loads(bytes(batch.record(i))))
        except ValueError as e:
            raise DecodeError(f"record {batch.ids[i]}: malformed JSON: {e}", i, f"malformed JSON: {e}") from None
    return out


def lines(batch, encoding: str = "utf-8") -> list[str]:
    """Text lines as strings."""
    out = []
    for i in range(batch.n):
        try:
            out.append(bytes(batch.record(i)).decode(encoding))
        except UnicodeDecodeError as e:
            raise DecodeError(f"record {batch.ids[i]}: not {encoding} text: {e}", i, f"not {encoding} text: {e}") from None
    return out


# --- rows of Arrow and Parquet files ---------------------------------------
#
# A batch of rows is one Arrow IPC record batch message in the batch's
# memory. With pyarrow it is read as a RecordBatch without a copy; without
# it, the node and buffer table the daemon sends beside it is enough to read
# the columns with numpy (docs/protocol.md). A daemon transform of rows
# (``transform="image:...,column=image"``) writes its outputs in its
# column's place: a fixed-size list column typed as Arrow's
# ``fixed_shape_tensor`` (pyarrow: ``to_numpy_ndarray()``), which
# ``columns`` gives as an ``(n, *shape)`` array.


def transformed_column(info: dict) -> str | None:
    """The column of rows whose values a daemon transform replaced with its
    outputs (the ``column=`` of the job's canonical transform), or None."""
    spec = info.get("transform") or ""
    if not info.get("columns") or "column=" not in spec:
        return None
    params = spec.rsplit("@", 1)[0].partition(":")[2]
    for kv in params.split(","):
        k, _, v = kv.partition("=")
        if k == "column":
            return v
    return None

_schemas: dict[bytes, Any] = {}


def _schema(info: dict):
    import base64

    import pyarrow as pa

    raw = info.get("schema") or ""
    key = raw.encode() if isinstance(raw, str) else bytes(raw)
    s = _schemas.get(key)
    if s is None:
        s = pa.ipc.open_stream(pa.py_buffer(base64.b64decode(raw))).schema
        _schemas[key] = s
    return s


def record_batch(batch):
    """The batch as a ``pyarrow.RecordBatch`` over the batch's memory (no copy)."""
    import pyarrow as pa

    return pa.ipc.read_record_batch(pa.py_buffer(batch.raw), _schema(batch.info))


def arrow(batch):
    """A ``pyarrow.RecordBatch`` if pyarrow is installed, else ``columns(batch)``."""
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        return columns(batch)
    return record_batch(batch)


def _item(col, i: int):
    """Element i of a decoded column as a Python value (None if null)."""
    if isinstance(col, np.ma.MaskedArray):
        return None if np.ma.getmaskarray(col)[i] else col.data[i].item()
    if isinstance(col, np.ndarray):
        v = col[i]
        return v.tolist() if isinstance(v, np.ndarray) else v.item()
    return col[i]


def columns(batch) -> dict[str, Any]:
    """The batch's columns with numpy alone: fixed-width columns as arrays
    (masked arrays where there are nulls, ``(n, size)`` arrays for fixed-size
    lists of numbers), strings and binary as lists of ``str``/``bytes``,
    lists and structs as lists of lists and dicts; nulls are ``None``.
    Arrays are views of the batch."""
    body, nodes, bufs = batch._table
    raw = batch.raw
    state = {"node": 0, "buf": 0}

    def take_node():
        n = nodes[state["node"]]
        state["node"] += 1
        return int(n[0]), int(n[1])

    def take_buf():
        off, length = bufs[state["buf"]]
        state["buf"] += 1
        return raw[body + int(off) : body + int(off) + int(length)]

    def bits(b, n):
        return np.unpackbits(np.asarray(b, np.uint8), count=n, bitorder="little").astype(bool)

    def read(col: dict):
        length, nulls = take_node()
        layout = col["layout"]
        if layout == "null":
            return [None] * length
        vb = take_buf()
        valid = bits(vb, length) if nulls and len(vb) else None

        def with_nulls(values: list) -> list:
            return values if valid is None else [v if ok else None for v, ok in zip(values, valid)]

        if layout == "fixed":
            arr = np.frombuffer(take_buf(), np.dtype(col["dtype"]), count=length)
            if col["type"].startswith("date32"):
                arr = arr.astype("datetime64[D]")  # numpy has no 32-bit dates: one copy
            return arr if valid is None else np.ma.masked_array(arr, mask=~valid)
        if layout == "bool":
            arr = bits(take_buf(), length)
            return arr if valid is None else np.ma.masked_array(arr, mask=~valid)
        if layout in ("binary", "utf8"):
            offs = np.frombuffer(take_buf(), "<i4" if col["width"] == 4 else "<i8", count=length + 1)
            data = take_buf()
            first = int(offs[0]) if length else 0
            vals = [bytes(data[int(a) - first : int(b) - first]) for a, b in zip(offs[:-1], offs[1:])]
            if layout == "utf8":
                vals = [v.decode("utf-8") for v in vals]
            return with_nulls(vals)
        if layout == "list":
            offs = np.frombuffer(take_buf(), "<i4" if col["width"] == 4 else "<i8", count=length + 1)
            child = read(col["children"][0])
            first = int(offs[0]) if length else 0
            return with_nulls([child[int(a) - first : int(b) - first] for a, b in zip(offs[:-1], offs[1:])])
        if layout == "fixed_list":
            size = col["size"]
            child = read(col["children"][0])
            if isinstance(child, np.ndarray) and not isinstance(child, np.ma.MaskedArray) and valid is None:
                return child.reshape(length, size)
            return with_nulls([child[i * size : (i + 1) * size] for i in range(length)])
        if layout == "struct":
            kids = {c["name"]: read(c) for c in col["children"]}
            rows = [{k: _item(v, i) for k, v in kids.items()} for i in range(length)]
            return with_nulls(rows)
        raise ValueError(f"column {col['name']}: layout {layout!r} unknown to this client")

    out = {c["name"]: read(c) for c in batch.info["columns"]}
    tc = transformed_column(batch.info)
    if tc in out and isinstance(out[tc], np.ndarray):
        # The transform's outputs: one (n, *shape) array of its dtype.
        info = batch.info
        out[tc] = out[tc].view(np.dtype(info.get("dtype") or "|u1")).reshape((len(out[tc]),) + tuple(info.get("shape") or ()))
    return out


# --- WebDataset tar shards -------------------------------------------------


# webdataset's split of a member name into its sample's key and extension.
_TAR_KEY = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")


def _octal(b: bytes) -> int:
    if b and b[0] & 0x80:  # GNU base-256
        return int.from_bytes(bytes([b[0] & 0x7F]) + b[1:], "big")
    s = b.strip(b" \x00")
    return int(s, 8) if s else 0


def tar_sample(rec, url: str | None = None) -> dict[str, Any]:
    """One WebDataset sample from its record's bytes (its members' headers
    and data, as the daemon reads them): ``{"__key__": key, "__url__":
    shard, ext: bytes, ...}``, as ``webdataset`` gives it, extensions
    lower-cased."""
    b = bytes(rec)
    out: dict[str, Any] = {}
    at, long_name = 0, None
    while at + 512 <= len(b):
        h = b[at : at + 512]
        if not any(h):
            break
        name = h[0:100].split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
        if h[257:262] == b"ustar":
            prefix = h[345:500].split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
            if prefix:
                name = prefix + "/" + name
        size, flag = _octal(h[124:136]), h[156:157]
        data = b[at + 512 : at + 512 + size]
        at += 512 + (size + 511) // 512 * 512
        if flag == b"L":
            long_name = data.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
            continue
        if flag == b"x":
            for line in data.decode("utf-8", "surrogateescape").splitlines():
                k, _, v = line.partition(" ")[2].partition("=")
                if k == "path":
                    long_name = v
            continue
        if long_name is not None:
            name, long_name = long_name, None
        if flag not in (b"0", b"\0", b"7"):
            continue
        if "/" not in name and name.startswith("__") and name.endswith("__"):
            continue
        m = _TAR_KEY.match(name)
        if m is None:
            continue
        key, ext = m.group(1), m.group(2).lower()
        if out.get("__key__", key) != key:
            raise ValueError(f"member {name!r} is not of sample {out['__key__']!r}")
        if ext in out:
            raise ValueError(f"sample {key!r} has two members .{ext}")
        out["__key__"] = key
        out[ext] = data
    if url is not None:
        out["__url__"] = url
    return out


def tar(batch) -> list[dict[str, Any]]:
    """A batch of WebDataset samples, each as ``tar_sample`` gives it."""
    return [tar_sample(batch.record(i)) for i in range(batch.n)]
