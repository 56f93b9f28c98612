"""Hugging Face datasets directories, written by datasets.save_to_disk (a
DatasetDict of two splits, several shards), read through a real daemon:
every row equals what datasets.load_from_disk gives for it."""

from __future__ import annotations

import json

import datasets
import pytest

import riffle
import riffle.torch as rt


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("hf") / "dd"
    feats = datasets.Features({"text": datasets.Value("string"), "label": datasets.ClassLabel(names=["neg", "pos", "mid"]),
                               "tokens": datasets.Sequence(datasets.Value("int32")), "score": datasets.Value("float32")})
    def split(n, seed):
        return datasets.Dataset.from_dict({
            "text": [f"row {i} " + "word " * ((i * seed) % 17) for i in range(n)],
            "label": [(i * seed) % 3 for i in range(n)],
            "tokens": [list(range((i * 7 + seed) % 9)) for i in range(n)],
            "score": [i / 7.0 for i in range(n)],
        }, features=feats)
    dd = datasets.DatasetDict({"train": split(1000, 3), "test": split(150, 5)})
    dd.save_to_disk(str(d), num_shards={"train": 3, "test": 1})
    return d


@pytest.mark.parametrize("name", ["train", "test"])
def test_rows_equal_load_from_disk(daemon, hf_dir, name):
    ref = datasets.load_from_disk(str(hf_dir))[name]
    ld = riffle.Loader(str(hf_dir), batch_size=64, split=name, seed=2)
    info = ld.info()
    assert info["format"] == "hf" and info["records"] == len(ref)
    assert info["features"]["label"]["names"] == ["neg", "pos", "mid"]
    seen = []
    for b in ld:
        for i, row in zip(b.ids.tolist(), b.data.to_pylist()):
            want = ref[i]
            assert row["text"] == want["text"] and row["label"] == want["label"] and row["tokens"] == want["tokens"]
            assert row["score"] == pytest.approx(want["score"])
        seen += b.ids.tolist()
    assert sorted(seen) == list(range(len(ref)))


def test_a_datasetdict_needs_a_split(daemon, hf_dir):
    with pytest.raises(riffle.RiffleError, match="split"):
        riffle.Loader(str(hf_dir), batch_size=8).info()
    with pytest.raises(riffle.RiffleError, match="no split"):
        riffle.Loader(str(hf_dir), batch_size=8, split="../etc").info()


def test_columns_and_torch(daemon, hf_dir):
    import torch
    dl = rt.loader(str(hf_dir), 100, split="train", columns=["label", "score"], num_workers=2)
    n = 0
    for b in dl:
        assert set(b) == {"label", "score"} and b["label"].dtype == torch.int64
        n += len(b["label"])
    assert n == 1000


def test_classlabel_names_are_the_classes(daemon, hf_dir):
    """ClassLabel names fill classes and class_to_idx, as features["label"].names does."""
    ds = rt.loader(str(hf_dir), 100, split="train").dataset
    assert ds.classes == ["neg", "pos", "mid"] and ds.class_to_idx == {"neg": 0, "pos": 1, "mid": 2}


def _to_dict(row):
    return {"x": torch.tensor([row["score"]]), "label": row["label"], "text": row["text"]}


def _to_tuple(row):
    return torch.tensor([row["score"]]), row["label"]


def _to_tensor(row):
    return torch.tensor([row["score"]])


import torch  # noqa: E402


@pytest.mark.parametrize("workers", [0, 2])
def test_row_transforms_collate_as_dataloader(daemon, hf_dir, workers):
    """A per-row transform returning a dict or a tuple is collated as default_collate does; one returning a
    tensor keeps the label column as the batch's label."""
    ref = datasets.load_from_disk(str(hf_dir))["train"]
    def rows_of(x):  # score is id / 7: the rows a batch holds
        return [ref[round(float(v) * 7)] for v in x.reshape(-1)]
    b = next(iter(rt.loader(str(hf_dir), 64, split="train", transform=_to_dict, num_workers=workers)))
    assert b["x"].shape == (64, 1) and b["label"].dtype == torch.int64 and len(b["text"]) == 64
    rows = rows_of(b["x"])
    assert b["text"] == [r["text"] for r in rows] and b["label"].tolist() == [r["label"] for r in rows]
    x, y = next(iter(rt.loader(str(hf_dir), 64, split="train", transform=_to_tuple, num_workers=workers)))
    assert x.shape == (64, 1) and y.tolist() == [r["label"] for r in rows_of(x)]
    x, y = next(iter(rt.loader(str(hf_dir), 64, split="train", transform=_to_tensor, num_workers=workers)))
    assert x.shape == (64, 1) and y.dtype == torch.int64 and y.tolist() == [r["label"] for r in rows_of(x)]
