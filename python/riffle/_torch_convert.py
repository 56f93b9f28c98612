"""A batch as what a training loop takes: decoded (riffle.decode, PIL images, a datasets.Dataset's format), then
the user's transforms, an error in any naming the record, its file and offset."""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import torch
import torch.utils.data

from . import decode as _decode
from .batch import Batch
from .client import Loader
from .errors import RecordError
from ._torch_lend import _in_batch, _stack, _to_shared


def _columns(batch: Batch) -> dict[str, Any]:
    """A batch of rows as a dict of columns: numbers (without nulls) as
    tensors over the batch's memory, the rest as ``decode.columns`` gives
    them, for the user's ``batch_transform`` or ``transform``."""
    out = {}
    for name, col in _decode.columns(batch).items():
        if (isinstance(col, np.ndarray) and not isinstance(col, np.ma.MaskedArray)
                and col.dtype.kind in "biuf" and col.dtype.itemsize in (1, 2, 4, 8)):
            col = torch.from_numpy(_native(col))
        elif isinstance(col, np.ma.MaskedArray):
            col = [None if m else v for v, m in zip(col.data.tolist(), np.ma.getmaskarray(col))]
        elif isinstance(col, np.ndarray):
            col = col.tolist()  # DataLoader's conversion takes no other numpy array
        out[name] = col
    return out


def _field_tensor(a: np.ndarray):
    """A structured array's field as a tensor if it holds numbers (one copy:
    a field is strided), else as numpy."""
    if a.dtype.kind in "biuf" and a.dtype.itemsize in (1, 2, 4, 8):
        return torch.from_numpy(np.ascontiguousarray(_native(a)))
    return a.tolist()  # DataLoader's conversion takes no other numpy array


class _Convert:
    """RiffleDataset's conversion methods (a mixin: they read the dataset's decode, dtype, shape and transforms)."""

    def _convert(self, batch: Batch, ld: Loader, shared: bool) -> Any:
        if self._hf is not None:
            return self._convert_hf(batch, ld)
        if batch.arrays is not None and not callable(self.decode):
            return self._convert_tokens(batch)
        try:
            data = self._decode(batch, ld)
        except _decode.DecodeError as e:
            if e.index is None:
                raise
            raise self._record_error(ld, batch, e.index, "decoding", e.reason) from e
        row_labels = None
        column = _decode.transformed_column(batch.info) if batch.rows else None
        if isinstance(data, dict) and column in data and self.transform is None and not callable(self.decode):
            # The daemon's transform of a column of rows: its outputs (an
            # (n, *shape) tensor over the batch) are the batch, and the label
            # column its label, as with a per-row transform returning a tensor.
            row_labels = data.get("label")
            data = data[column]
        if isinstance(data, dict) and self.transform is not None:
            # Rows of columns: the transform takes each row as a dict (the
            # with_transform idiom). A label column stays the batch's label
            # if the transform returns no dict that carries it.
            names = list(data)
            if "label" in data:
                row_labels = data["label"]
            data = [{k: data[k][i] for k in names} for i in range(batch.n)]
        if isinstance(data, dict) and shared:
            data = {k: _to_shared(v) if isinstance(v, torch.Tensor) else v for k, v in data.items()}
        if self.transform is not None:
            samples = []
            for i, x in enumerate(data):
                try:
                    samples.append(self.transform(x))
                except Exception as e:
                    if _environmental(e):
                        raise  # the environment's failure, reported once as itself, not as a record's
                    raise self._record_error(ld, batch, i, "transform", f"{e}{_transform_hint(x, batch)}") from e
            if samples and isinstance(samples[0], torch.Tensor):
                data = _stack(samples, shared)
            else:
                # Dicts and tuples are collated as DataLoader's default_collate
                # does (in a worker, into shared memory); they carry their
                # labels themselves, if the transform kept them.
                data = _collate(samples) if samples and isinstance(samples[0], (dict, tuple, list)) else samples
                row_labels = None
        elif shared and isinstance(data, torch.Tensor) and not _in_batch(data, batch):
            # In a worker the batch must reach shared memory to cross to the
            # main process: put it there once, instead of DataLoader copying
            # it again (default_collate does the same in a worker). A view
            # of the batch itself is lent instead (_lent), unless a
            # batch_transform makes something else of it.
            data = _to_shared(data)
        if self.batch_transform is not None:
            data = self.batch_transform(data)
        labels = None if batch.labels is None else torch.from_numpy(batch.labels)
        if labels is None and row_labels is not None:
            labels = row_labels if isinstance(row_labels, torch.Tensor) else torch.as_tensor(row_labels)
        if labels is not None and self.target_transform is not None:
            targets = []
            for i, y in enumerate(labels.tolist()):
                try:
                    targets.append(self.target_transform(y))
                except Exception as e:
                    if _environmental(e):
                        raise
                    raise self._record_error(ld, batch, i, "target_transform", e) from e
            labels = _collate(targets)
        return data if labels is None else (data, labels)

    def _convert_tokens(self, batch: Batch) -> dict[str, Any]:
        """A batch of a token corpus's samples as a dict of tensors over the batch's memory (``input_ids``,
        ``labels``, ``position_ids``, ``loss_mask``, ``cu_seqlens``) and ``max_seqlen`` as an int, what
        flash-attention's variable-length functions take; then the user's ``batch_transform``. A worker lends
        the batch whole (_lent)."""
        if self.transform is not None or self.target_transform is not None:
            raise ValueError("transform= and target_transform= take one record; a token corpus's batch is arrays "
                             "of samples: pass batch_transform=, which takes the dict")
        data = {k: torch.from_numpy(v) if v.ndim else int(v) for k, v in batch.arrays.items()}
        return data if self.batch_transform is None else self.batch_transform(data)

    def _convert_hf(self, batch: Batch, ld: Loader) -> Any:
        """A batch of a datasets.Dataset's rows, as DataLoader makes one of it: each row formatted as the dataset
        formats ``dataset[i]`` (its format, or its with_transform function run on the batch, as datasets runs it:
        on a dict of lists), then riffle's ``transform`` of each row, if any, then collated as default_collate
        does (in a worker, into shared memory)."""
        import pyarrow as pa
        table = pa.Table.from_batches([batch.data])
        try:
            formatted = self._hf.batch(table)
            rows = self._hf.rows(formatted, batch.n)
        except Exception as e:
            if _environmental(e):
                raise
            ids = ", ".join(str(int(i)) for i in batch.ids[:8]) + (", ..." if batch.n > 8 else "")
            what = "its transform (with_transform or set_transform)" if self._hf.custom else f"its {self._hf.type} format"
            raise RecordError(f"a batch of records {ids} of the datasets.Dataset: {what} failed: "
                              f"{type(e).__name__}: {e}") from e
        if self.transform is not None:
            out = []
            for i, row in enumerate(rows):
                try:
                    out.append(self.transform(row))
                except Exception as e:
                    if _environmental(e):
                        raise
                    raise self._record_error(ld, batch, i, "transform", e) from e
            rows = out
        data = torch.utils.data.default_collate(rows) if rows else rows
        if self.batch_transform is not None:
            data = self.batch_transform(data)
        return data

    def _image(self, ld: Loader, batch: Batch, i: int, v: Any):
        """A Hugging Face Image cell ({bytes, path}) as a PIL image, as datasets decodes it (mode kept)."""
        if v is None:
            return None
        from PIL import Image
        try:
            if v.get("bytes") is not None:
                img = Image.open(io.BytesIO(v["bytes"]))
            else:
                img = Image.open(v["path"])
            img.load()
            return img
        except Exception as e:
            raise self._record_error(ld, batch, i, "image decoding", e) from e

    def _record_error(self, ld: Loader, batch: Batch, i: int, what: str, e: Exception | str) -> RecordError:
        rid = int(batch.ids[i])
        try:
            path, off = ld.locate([rid])[0]
        except Exception:
            path, off = None, None
        where = f" ({path} at offset {off})" if path else ""
        return RecordError(f"record {rid}{where}: {what} failed: {e}", rid, path, off)

    def _decode(self, batch: Batch, ld: Loader) -> Any:
        if callable(self.decode):
            return self.decode(batch)
        fmt = batch.info.get("format")
        kind = self.decode
        if kind in ("auto", "image") and batch.rows:
            # Rows: columns, and those whose Hugging Face feature is Image as
            # PIL images, as datasets gives them (Audio stays {bytes, path}).
            cols = _columns(batch)
            done = _decode.transformed_column(batch.info)  # a daemon transform's outputs, not images to decode
            images = [k for k, f in (batch.info.get("features") or {}).items()
                      if isinstance(f, dict) and f.get("_type") == "Image" and k in cols and k != done]
            if kind == "image" and not images:
                raise ValueError('decode="image": this dataset of rows has no column whose feature is Image '
                                 f"(its columns: {', '.join(cols)}); decode them with a transform")
            for k in images:
                cols[k] = [self._image(ld, batch, i, v) for i, v in enumerate(cols[k])]
            return cols
        if kind == "auto" and fmt == "riffle" and batch.info.get("record_size") and not batch.info.get("transform"):
            return torch.from_numpy(_native(batch.data))  # a pack of fixed-size records
        if kind == "auto" and batch.info.get("transform"):
            return torch.from_numpy(batch.data)  # the daemon's transform outputs
        if kind == "auto":
            kind = {"npy": "npy", "fixed": "fixed", "libsvm": "libsvm", "jsonl": "jsonl", "text": "text",
                    "csv": "text", "tar": "tar"}.get(fmt, "bytes")
            if fmt == "npy" and self.dtype is not None:
                kind = "fixed"
        if kind == "npy":
            rows = _decode.npy(batch)
            if rows.dtype.names:
                # A structured array: a dict of its fields, numbers as tensors.
                return {k: _field_tensor(rows[k]) for k in rows.dtype.names if k}
            return torch.from_numpy(_native(rows))
        if kind == "fixed":
            return torch.from_numpy(_native(_decode.fixed(batch, self.dtype or np.uint8, self.shape)))
        if kind == "libsvm":
            y, x = _decode.libsvm(batch, self.n_features, dense=self.n_features is not None)
            if self.n_features is None:
                indptr, ind, val = x
                n_feat = int(ind.max()) + 1 if len(ind) else 0
                x = torch.sparse_csr_tensor(torch.from_numpy(indptr), torch.from_numpy(ind), torch.from_numpy(val),
                                            size=(batch.n, n_feat))
            else:
                x = torch.from_numpy(x)
            return x, torch.from_numpy(y)
        if kind == "jsonl":
            return _decode.jsonl(batch)
        if kind == "tar":
            return _decode.tar(batch)
        if kind == "text":
            return _decode.lines(batch)
        if kind == "image":
            from PIL import Image
            out = []
            for i in range(batch.n):
                try:
                    img = Image.open(io.BytesIO(batch.record(i)))
                    out.append(img.convert("RGB"))
                except Exception as e:
                    raise self._record_error(ld, batch, i, "image decoding", e) from e
            return out
        return [bytes(r) for r in batch.records()]


def _transform_hint(x: Any, batch: Batch) -> str:
    """What a transform that failed on sample x may have wanted instead: an image, or a batch of rows."""
    if isinstance(x, (bytes, memoryview)) and batch.info.get("format") == "dir":
        return ('. The records are the files\' bytes (not every file is an image, so decode="auto" left them so): '
                'to open images as ImageFolder does, pass decode="image", which reads only image files')
    if isinstance(x, dict):
        return (". transform= takes one row (a dict of its values); a function written for datasets' "
                "with_transform takes a batch (a dict of lists): give riffle the dataset with it, "
                "riffle.torch.loader(load_from_disk(path).with_transform(f), ...)")
    return ""


def _environmental(e: BaseException) -> bool:
    """An error of the environment, not of a record: a missing or broken module (numpy 2 under a torch built for
    numpy 1 says "Numpy is not available")."""
    return isinstance(e, (ImportError, MemoryError)) or (isinstance(e, RuntimeError) and "is not available" in str(e))


def _first(data: Any) -> Any:
    """The first sample of a decoded batch: a tensor's row, a list's item, a dict's row of columns."""
    if isinstance(data, dict):
        return {k: _first(v) for k, v in data.items()}
    return data[0]


def _native(a: np.ndarray) -> np.ndarray:
    """A big-endian array (a .npy from another machine) in native byte order: torch takes no other. One copy."""
    if a.dtype.byteorder not in ("=", "|") and a.dtype.byteorder != ("<" if np.little_endian else ">"):
        return a.astype(a.dtype.newbyteorder("="))
    return a


def _collate(samples: list) -> Any:
    """Samples that are dicts or tuples, collated as DataLoader's default_collate does; what it cannot stack
    (strings, PIL images) stays a list."""
    try:
        return torch.utils.data.default_collate(samples)
    except TypeError:
        if isinstance(samples[0], dict):
            return {k: _collate([s[k] for s in samples]) for k in samples[0]}
        if isinstance(samples[0], (tuple, list)):
            return type(samples[0])(_collate(list(col)) for col in zip(*samples))
        return samples
