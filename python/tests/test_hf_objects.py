"""A Hugging Face datasets.Dataset object where a path was (load_from_disk,
a DatasetDict's split, with_format, with_transform, set_transform, select,
filter, shuffle, remove_columns): riffle reads its Arrow files and formats
and transforms its rows as datasets does, so that every sample equals what
DataLoader over the same object gives for it; what riffle cannot honour is
refused by name with the fix."""

from __future__ import annotations

import io

import datasets
import numpy as np
import pytest
import torch
import torch.utils.data

import riffle.torch as rt

N = 60


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    from PIL import Image
    d = tmp_path_factory.mktemp("hfobj") / "dd"
    feats = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=["ant", "bee", "cow"]),
                               "n": datasets.Value("int32"), "text": datasets.Value("string"),
                               "score": datasets.Value("float64")})
    rng = np.random.default_rng(3)

    def png(i):
        b = io.BytesIO()
        Image.fromarray(rng.integers(0, 255, (6, 7, 3), dtype=np.uint8)).save(b, format="PNG")
        return {"bytes": b.getvalue(), "path": None}

    train = datasets.Dataset.from_dict({"image": [png(i) for i in range(N)], "label": [i % 3 for i in range(N)],
                                        "n": list(range(N)), "text": [f"row {i}" for i in range(N)],
                                        "score": [i / 8 for i in range(N)]}, features=feats)
    datasets.DatasetDict({"train": train, "test": train.select(range(10))}).save_to_disk(
        str(d), num_shards={"train": 3, "test": 1})
    return str(d)


def train(hf_dir):
    return datasets.load_from_disk(hf_dir)["train"]


def samples(batches) -> dict[int, dict]:
    """Every sample of an epoch by its n, its values as plain Python (tensors as lists, with their dtype)."""
    def plain(v):
        if isinstance(v, torch.Tensor):
            return (str(v.dtype), v.tolist())
        return v
    out: dict[int, dict] = {}
    for b in batches:
        ns = b["n"].tolist()
        for i, n in enumerate(ns):
            assert n not in out, f"sample {n} twice in an epoch"
            out[n] = {k: plain(v[i]) for k, v in b.items()}
    return out


def twin(ds, batch_size=8):
    return samples(torch.utils.data.DataLoader(ds, batch_size, shuffle=True))


def pixels(batch):
    """A with_transform function, as datasets calls it: on a batch (a dict of lists), images decoded to PIL."""
    return {"pixels": [torch.from_numpy(np.asarray(im.convert("RGB").resize((4, 4)))).float() / 255
                       for im in batch["image"]],
            "label": batch["label"], "n": batch["n"]}


@pytest.mark.parametrize("workers", [0, 2])
def test_formats_and_transforms_as_dataloader(daemon, hf_dir, workers):
    """The python format (an Image column left out, which DataLoader cannot collate), the torch format, and a
    with_transform or set_transform function run on each batch as datasets runs it: every sample as DataLoader
    over the same object gives it."""
    plain = train(hf_dir).remove_columns("image")
    torchy = train(hf_dir).with_format("torch")
    transformed = train(hf_dir).with_transform(pixels)
    in_place = train(hf_dir)
    in_place.set_transform(pixels, columns=["image", "label", "n"])
    for ds in (plain, torchy, transformed, in_place):
        got = samples(rt.loader(ds, 8, num_workers=workers))
        assert got == twin(ds) and len(got) == N


def test_selections_are_the_records_of_their_rows(daemon, hf_dir):
    """select, filter, shuffle, a contiguous select (datasets slices the table for it) and train_test_split read
    the rows they name, each once."""
    ds = train(hf_dir).with_format("torch", columns=["label", "n", "score"])
    parts = [ds.select([5, 1, 44, 30, 31]), ds.filter(lambda r: r["n"] % 4 == 1), ds.shuffle(seed=2),
             ds.select(range(15, 47))]
    split = ds.train_test_split(test_size=0.25, seed=1)
    parts += [split["train"], split["test"]]
    for part in parts:
        got = samples(rt.loader(part, 4))
        assert got == twin(part, 4) and len(got) == len(part)
        assert len(rt.loader(part, 4).dataset) == len(part)
    # A Subset of a datasets.Dataset is the rows its indices name.
    sub = torch.utils.data.Subset(parts[1], [3, 0, 9])
    assert samples(rt.loader(sub, 4)) == twin(sub, 4)


def test_the_classes_are_the_classlabel_names(daemon, hf_dir):
    ds = rt.loader(train(hf_dir).with_format("torch"), 8).dataset
    assert ds.classes == ["ant", "bee", "cow"] and ds.class_to_idx == {"ant": 0, "bee": 1, "cow": 2}


def test_what_riffle_cannot_honour_is_refused_by_name(daemon, hf_dir):
    dd = datasets.load_from_disk(hf_dir)
    with pytest.raises(TypeError, match=r"DatasetDict of splits \['train', 'test'\].*dd\['train'\]"):
        rt.loader(dd, 8)
    with pytest.raises(ValueError, match="column 'number'.*rename_column"):
        rt.loader(train(hf_dir).rename_column("n", "number"), 8)
    with pytest.raises(ValueError, match="holds rows in memory.*save_to_disk"):
        rt.loader(datasets.Dataset.from_dict({"n": [1, 2, 3]}), 8)
    with pytest.raises(TypeError, match="format 'pandas' is not taken"):
        rt.loader(train(hf_dir).with_format("pandas"), 8)
    with pytest.raises(ValueError, match="has its own transform.*keep one"):
        rt.loader(train(hf_dir).with_transform(pixels), 8, transform=lambda row: row)


def test_a_with_transform_function_given_as_transform_says_so(daemon, hf_dir):
    """riffle's transform= takes one row; a function written for with_transform takes a batch. Given one as the
    other, the error says so and what to pass (it failed with "'PngImageFile' object is not iterable")."""
    with pytest.raises(rt.RecordError, match=r"transform= takes one row.*with_transform\(f\)"):
        for _ in rt.loader(hf_dir, 8, split="train", transform=pixels):
            pass
