"""Datasets of rows (Parquet, Arrow IPC, Hugging Face save_to_disk) with
share=True: jobs on one dataset sample dependently (one group), each
reads every row once per epoch equal to pyarrow's reading of it, and the
pages (compressed record batches) their rows lie in are read and decoded
once for all of them."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
feather = pytest.importorskip("pyarrow.feather")

import riffle

from conftest import Daemon, status


def cache_items(sock: str, deadline: float = 10.0) -> int:
    """The cache's items once the jobs closed (a close is not waited for):
    polled until none are left, or the deadline."""
    end = time.monotonic() + deadline
    while True:
        items = status(sock)["cache"]["items"]
        if items == 0 or time.monotonic() > end:
            return items
        time.sleep(0.05)

N = 6000


def table(n: int = N):
    rng = np.random.default_rng(5)
    return pa.table({
        "id": pa.array(range(n), pa.int64()),
        "payload": pa.array([rng.bytes(int(rng.integers(20, 200))) for _ in range(n)], pa.binary()),
        "text": pa.array([f"row {i}" if i % 7 else None for i in range(n)]),
        "label": pa.array([i % 10 for i in range(n)], pa.int32()),
    })


def write(kind: str, d):
    """A dataset of table()'s rows written by the real writer, and pyarrow's reading of it."""
    t = table()
    if kind == "parquet":
        # Several row groups of small pages (pyarrow starts a page every
        # write_batch_size values at most).
        p = d / "t.parquet"
        pq.write_table(t, p, row_group_size=1000, data_page_size=2048, write_batch_size=64)
        return p, pq.read_table(p)
    if kind == "feather-lz4":
        p = d / "t.arrow"
        feather.write_feather(t, p, chunksize=250)  # Feather v2's default: LZ4 buffers
        return p, feather.read_table(p)
    if kind == "arrow":
        p = d / "u.arrow"
        feather.write_feather(t, p, compression="uncompressed", chunksize=700)
        return p, feather.read_table(p)
    if kind == "hf":
        import datasets
        p = d / "hf"
        datasets.Dataset(t).save_to_disk(str(p), num_shards=3)
        return p, datasets.load_from_disk(str(p)).data.table
    raise ValueError(kind)


def run_together(paths, sock: str, jobs: int, epochs: int, batch_size: int = 64, **kw):
    """jobs loaders sharing paths, taking their batches at one pace (each its
    batch k, then waits for the others) over epochs epochs: per job, each
    epoch's rows by id. The group is checked while they run."""
    loaders = [riffle.Loader(str(paths), batch_size=batch_size, seed=k + 1, share=True, sampler="global",
                             socket=sock, autostart=False, **kw) for k in range(jobs)]
    for ld in loaders:
        assert ld.info()["shared"], "a job of rows with share=True is not shared"
    step = threading.Barrier(jobs, timeout=120)
    out = [[{} for _ in range(epochs)] for _ in range(jobs)]
    errors = []
    groups = []

    def run(k: int):
        try:
            for e in range(epochs):
                for b in loaders[k]:
                    for rid, row in zip(b.ids.tolist(), b.data.to_pylist()):
                        assert rid not in out[k][e], f"job {k}: row {rid} twice in epoch {e}"
                        out[k][e][rid] = row
                    step.wait()
                    if k == 0 and not groups:
                        groups.append(status(sock)["groups"])  # every job has had a batch: all are open
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)
            step.abort()

    threads = [threading.Thread(target=run, args=(k,)) for k in range(jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for ld in loaders:
        ld.close()
    if errors:
        raise errors[0]
    assert max(len(g["jobs"]) for g in groups[0]) == jobs, f"not one group of {jobs} jobs: {groups[0]}"
    return out


def check_rows(out, want):
    for k, epochs in enumerate(out):
        for e, rows in enumerate(epochs):
            assert sorted(rows) == list(range(len(want))), f"job {k} epoch {e}: not every row once"
            for rid, row in rows.items():
                assert row == want[rid], f"job {k} epoch {e} row {rid}: {row} != {want[rid]}"


@pytest.fixture
def own_daemon(tmp_path):
    """A daemon of the test's own, whose traffic is the test's."""
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    d = Daemon(str(run / "riffle.sock"))
    yield d
    d.stop()


@pytest.mark.parametrize("kind", ["parquet", "feather-lz4"])
def test_shared_jobs_read_each_block_once(own_daemon, tmp_path, kind):
    """Three jobs sharing a Parquet file of several row groups and small
    pages (a Feather file of LZ4 record batches) at one pace: each reads
    every row once per epoch, equal to pyarrow's reading of the file, and
    the file is read from storage about once for all three jobs and both
    epochs: each page (record batch) once, decoded once into the dataset's
    cache of decoded blocks, which they share."""
    p, t = write(kind, tmp_path)
    want = t.to_pylist()
    out = run_together(p, own_daemon.sock, jobs=3, epochs=2)
    check_rows(out, want)
    st = status(own_daemon.sock)
    ratio = st["read_bytes"] / p.stat().st_size
    served = st["served_bytes"] / p.stat().st_size
    print(f"{kind}: 3 shared jobs x 2 epochs read {ratio:.2f}x the file, served {served:.1f}x")
    assert ratio <= 1.1, f"read {st['read_bytes']} bytes of a file of {p.stat().st_size}"


@pytest.mark.parametrize("kind", ["arrow", "hf"])
def test_shared_jobs_of_arrow_rows(own_daemon, tmp_path, kind):
    """Uncompressed Arrow rows (a Feather file, a Hugging Face directory)
    shared by two jobs: one group, each row once per epoch, equal to
    pyarrow's (datasets') reading of it."""
    p, t = write(kind, tmp_path)
    out = run_together(p, own_daemon.sock, jobs=2, epochs=2, batch_size=100)
    check_rows(out, t.to_pylist())
    assert cache_items(own_daemon.sock) == 0, "record items left in the cache by jobs of rows"


def test_share_of_rows_with_a_subset_and_ranks(daemon, tmp_path):
    """Ranks of shared jobs over a subset of a Parquet file's rows: each
    rank's part comes once per epoch, the parts are the subset, every row
    equal to pyarrow's."""
    p, t = write("parquet", tmp_path)
    want = t.to_pylist()
    sub = list(range(100, 4100))
    seen = {}
    for rank in range(2):
        ld = riffle.Loader(str(p), batch_size=50, seed=3, share=True, sampler="global", rank=rank, world_size=2,
                           subset={"ranges": [[100, 4100]]})
        assert ld.info()["shared"]
        got = []
        for b in ld:
            for rid, row in zip(b.ids.tolist(), b.data.to_pylist()):
                assert row == want[rid]
                got.append(rid)
        assert len(got) == len(set(got)) == len(sub) // 2
        seen[rank] = set(got)
    assert seen[0] | seen[1] == set(sub) and not seen[0] & seen[1]


# --- transform= on rows ----------------------------------------------------

SIZE, CROP = 256, 224


def jpegs():
    """Pictures as users keep them in a Hugging Face Image column: JPEGs from
    Pillow of ImageNet's sizes (colour and grey, 4:4:4, progressive) and a
    PNG, each decoded by the daemon at full scale (none is twice the
    resize), so its output is torchvision's bytes exactly."""
    import io

    from PIL import Image
    rng = np.random.default_rng(5)
    out = []
    for i, (w, h) in enumerate([(500, 375), (375, 500), (433, 301), (300, 300), (512, 342), (420, 330), (380, 290),
                                (333, 257)]):
        yy, xx = np.mgrid[0:h, 0:w]
        fx, fy = rng.uniform(0.01, 0.06, 2)
        base = 128 + 60 * np.sin(xx * fx) * np.cos(yy * fy)
        img = np.stack([base, base * 0.7, 255 - base], -1) + rng.integers(-20, 20, (h, w, 3))
        im = Image.fromarray(img.clip(0, 255).astype(np.uint8))
        if i == 3:
            im = im.convert("L")
        b = io.BytesIO()
        if i == 4:
            im.save(b, format="PNG")
        else:
            im.save(b, format="JPEG", quality=90, **{5: {"subsampling": 0}, 6: {"progressive": True}}.get(i, {}))
        out.append(b.getvalue())
    return out


@pytest.fixture(scope="module")
def image_rows(tmp_path_factory):
    """A Hugging Face image classification dataset (Image, ClassLabel) as
    save_to_disk writes it, and as Dataset.to_parquet does; and its rows'
    picture bytes and labels."""
    import datasets
    d = tmp_path_factory.mktemp("images")
    pics = jpegs() * 3
    labels = [i % 4 for i in range(len(pics))]
    feats = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=list("abcd"))})
    ds = datasets.Dataset.from_dict({"image": [{"bytes": p, "path": None} for p in pics], "label": labels}, features=feats)
    ds.save_to_disk(str(d / "hf"), num_shards=2)
    ds.to_parquet(str(d / "hf.parquet"), batch_size=5)
    return {"hf": d / "hf", "hf-parquet": d / "hf.parquet"}, pics, labels


def reference(pic: bytes) -> np.ndarray:
    import io

    import torchvision.transforms as T
    from PIL import Image
    tv = T.Compose([T.Resize(SIZE), T.CenterCrop(CROP)])
    return np.asarray(tv(Image.open(io.BytesIO(pic)).convert("RGB")))


@pytest.mark.parametrize("kind", ["hf", "hf-parquet"])
def test_image_transform_on_rows_equals_torchvision(daemon, image_rows, kind):
    """riffle.torch.loader(hf_dir, transform="image:size=256,crop=224,column=image")
    yields (images, labels): a uint8 tensor (N, 224, 224, 3), each image
    torchvision's Resize(256) + CenterCrop(224) of the PIL image decoded
    from the row's bytes, byte for byte, and the label column's tensor."""
    import riffle.torch as rt
    import torch
    paths, pics, labels = image_rows
    ld = rt.loader(str(paths[kind]), 5, transform=f"image:size={SIZE},crop={CROP},column=image", shuffle=False)
    at = 0
    for x, y in ld:
        assert isinstance(x, torch.Tensor) and x.dtype == torch.uint8 and x.shape == (len(y), CROP, CROP, 3)
        assert y.tolist() == labels[at:at + len(y)]
        for i in range(len(y)):
            ref = reference(pics[at + i])
            d = np.abs(x[i].numpy().astype(int) - ref.astype(int))
            assert d.max() == 0, f"row {at + i}: {int((d > 0).sum())} values differ from torchvision's, by up to {d.max()}"
        at += len(y)
    assert at == len(pics)


def test_transformed_batch_layout(daemon, image_rows):
    """The batch is one Arrow record batch: the transformed column a
    fixed_shape_tensor of the transform's shape (pyarrow's
    to_numpy_ndarray, a view of the batch), the other columns as pyarrow
    reads them from the source; decode.columns gives the same outputs with
    numpy alone, and the image column is found by default (the dataset's
    only Image)."""
    from riffle import decode
    paths, pics, labels = image_rows
    ld = riffle.Loader(str(paths["hf"]), batch_size=7, transform=f"image:size={SIZE},crop={CROP}", seed=3)
    info = ld.info()
    assert info["transform"].startswith("image:column=image,") and info["shape"] == [CROP, CROP, 3]
    assert [c["name"] for c in info["columns"]] == ["image", "label"]
    seen = set()
    for b in ld:
        rb = b.data
        assert str(rb.schema.field("image").type) == "extension<arrow.fixed_shape_tensor[value_type=uint8, shape=[224,224,3]]>"
        x = rb.column("image").to_numpy_ndarray()
        assert x.shape == (b.n, CROP, CROP, 3)
        cols = decode.columns(b)
        assert np.array_equal(cols["image"], x) and cols["label"].tolist() == rb.column("label").to_pylist()
        for i, rid in enumerate(b.ids.tolist()):
            assert np.array_equal(x[i], reference(pics[rid])) and rb.column("label")[i].as_py() == labels[rid]
            seen.add(rid)
    assert seen == set(range(len(pics)))


def test_random_crop_on_rows_is_the_records(daemon, image_rows, tmp_path, bin_path):
    """random_resized_crop on rows draws as on records (seed, epoch, row):
    each row's output is what `riffle transform` gives for its picture and
    that draw."""
    import subprocess
    paths, pics, _ = image_rows
    spec = "random_resized_crop:size=64"
    ld = riffle.Loader(str(paths["hf-parquet"]), batch_size=6, transform=spec + ",column=image", seed=11)
    for epoch in range(2):
        for b in ld:
            x = b.data.column("image").to_numpy_ndarray()
            for i, rid in enumerate(b.ids.tolist()):
                f = tmp_path / "p.img"
                f.write_bytes(pics[rid])
                subprocess.run([bin_path, "transform", spec, str(f), "--seed", "11", "--epoch", str(epoch), "--id", str(rid),
                                "--out", str(tmp_path / "o.rgb")], check=True, capture_output=True)
                mine = np.fromfile(tmp_path / "o.rgb", np.uint8).reshape(64, 64, 3)
                assert np.array_equal(x[i], mine), f"row {rid} epoch {epoch}: not its draw's output"


@pytest.mark.parametrize("spec,column", [("image:column=label", "label"), ("image:column=nope", "nope"),
                                         ("image:column=text", "text")])
def test_transform_of_a_column_without_bytes_is_invalid(daemon, tmp_path, spec, column):
    """A transform of a column that is not there, or does not hold bytes, is
    an InvalidSpec (a ValueError) naming the column, when the loader is
    built."""
    p, _ = write("parquet", tmp_path)
    with pytest.raises(riffle.InvalidSpec, match=f'column="{column}"'):
        ld = riffle.Loader(str(p), batch_size=8, transform=spec)
        ld.info()


def test_shared_jobs_with_a_transform_of_rows(own_daemon, image_rows):
    """Three jobs sharing a transform of a Hugging Face image column at one
    pace: one group; each row's output once per epoch, byte-equal to a job's
    reading it alone; the outputs of the rows they share are kept for the
    others (the group's shared rounds), and the cache is empty after."""
    paths, pics, labels = image_rows
    spec = "image:size=64,crop=48,column=image"
    solo = {}
    for b in riffle.Loader(str(paths["hf"]), batch_size=8, transform=spec, shuffle=False, socket=own_daemon.sock,
                           autostart=False):
        x = b.data.column("image").to_numpy_ndarray()
        for i, rid in enumerate(b.ids.tolist()):
            solo[rid] = x[i].copy()
    jobs = 3
    loaders = [riffle.Loader(str(paths["hf"]), batch_size=4, seed=k, share=True, transform=spec, socket=own_daemon.sock,
                             autostart=False) for k in range(jobs)]
    step = threading.Barrier(jobs, timeout=120)
    errors, groups = [], []

    def run(k):
        try:
            for epoch in range(2):
                seen = set()
                for b in loaders[k]:
                    x = b.data.column("image").to_numpy_ndarray()
                    for i, rid in enumerate(b.ids.tolist()):
                        assert rid not in seen, f"job {k}: row {rid} twice in epoch {epoch}"
                        seen.add(rid)
                        assert np.array_equal(x[i], solo[rid]), f"job {k} row {rid}: not a solo read's output"
                        assert b.data.column("label")[i].as_py() == labels[rid]
                    step.wait()
                    if k == 0:
                        groups.append(status(own_daemon.sock)["groups"])
                assert seen == set(range(len(pics))), f"job {k} epoch {epoch}: not every row"
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)
            step.abort()

    threads = [threading.Thread(target=run, args=(k,)) for k in range(jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for ld in loaders:
        ld.close()
    if errors:
        raise errors[0]
    shared = [g for g in groups[-1] if len(g["jobs"]) == jobs]
    assert shared and shared[0]["shared"] > 0, f"no group of the {jobs} jobs sharing rows: {groups[-1]}"
    assert cache_items(own_daemon.sock) == 0, f"outputs left in the cache: {status(own_daemon.sock)['cache']}"


def test_an_image_without_bytes_is_a_data_error(daemon, tmp_path):
    """An Image kept as a path alone (bytes null, as a datasets Image of a
    file not embedded) has no bytes to transform: a DataError naming the
    column and the row, not a batch with a hole."""
    pics = jpegs()[:3]
    img = pa.array([{"bytes": p, "path": None} for p in pics] + [{"bytes": None, "path": "elsewhere.jpg"}],
                   pa.struct([("bytes", pa.binary()), ("path", pa.string())]))
    p = tmp_path / "paths.arrow"
    feather.write_feather(pa.table({"image": img, "label": [0, 1, 2, 3]}), p, compression="uncompressed")
    ld = riffle.Loader(str(p), batch_size=4, transform="image:size=32,crop=24,column=image", shuffle=False)
    with pytest.raises(riffle.DataError, match='record 3 .*column "image" is null'):
        for _ in ld:
            pass


def test_a_float_transform_of_rows(daemon, tmp_path):
    """libsvm_dense of a binary column of LIBSVM lines: a float32 tensor
    column (n, 1 + n_features), each row's the record transform's output of
    the same line."""
    from riffle import decode
    lines = [f"{i % 3} 1:{i} {2 + i % 4}:0.25" for i in range(40)]
    p = tmp_path / "lines.arrow"
    feather.write_feather(pa.table({"line": pa.array([s.encode() for s in lines], pa.binary()), "k": list(range(40))}), p,
                          compression="uncompressed")
    (tmp_path / "lines.svm").write_text("\n".join(lines) + "\n")
    spec = "libsvm_dense:n_features=5"
    want = {}
    for b in riffle.Loader(str(tmp_path / "lines.svm"), batch_size=16, transform=spec, shuffle=False):
        for i, rid in enumerate(b.ids.tolist()):
            want[rid] = np.array(b.data[i])
    seen = 0
    for b in riffle.Loader(str(p), batch_size=16, transform=spec + ",column=line", seed=2):
        x = b.data.column("line").to_numpy_ndarray()
        assert x.dtype == np.float32 and x.shape == (b.n, 6)
        assert np.array_equal(decode.columns(b)["line"], x)
        for i, rid in enumerate(b.ids.tolist()):
            assert np.array_equal(x[i], want[rid]) and b.data.column("k")[i].as_py() == rid
            seen += 1
    assert seen == 40
