"""The daemon's image transforms against torchvision on a PIL image: the
centre crop of Resize + CenterCrop, and RandomResizedCrop +
RandomHorizontalFlip with riffle's draws (seed, epoch, record). `riffle
transform` says which box a record's draw took; torchvision's output for
that box is the reference."""

from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest

import riffle
from conftest import riffle_bin

SIZE = 224


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    """A class directory of images as users have them: JPEGs of ImageNet's
    sizes from Pillow (colour and grey), a PNG, and a large JPEG that the
    decoder shrinks while decoding (DCT scaling)."""
    from PIL import Image
    root = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(5)
    files = {}
    for i, (w, h) in enumerate([(500, 375), (375, 500), (433, 301), (640, 480), (300, 300), (512, 342), (420, 330),
                                (380, 290)]):
        yy, xx = np.mgrid[0:h, 0:w]
        fx, fy = rng.uniform(0.01, 0.06, 2)
        base = 128 + 60 * np.sin(xx * fx) * np.cos(yy * fy)
        img = np.stack([base, base * 0.7, 255 - base], -1) + rng.integers(-20, 20, (h, w, 3))
        im = Image.fromarray(img.clip(0, 255).astype(np.uint8))
        d = root / f"c{i % 2}"
        d.mkdir(exist_ok=True)
        if i == 4:
            im = im.convert("L")
        ext = "png" if i == 5 else "jpg"
        # 6: no chroma subsampling (4:4:4); 7: progressive.
        extra = {6: {"subsampling": 0}, 7: {"progressive": True}}.get(i, {})
        im.save(d / f"{i}.{ext}", quality=90, **extra)
        files[d / f"{i}.{ext}"] = "png" if ext == "png" else "full"
    yy, xx = np.mgrid[0:1200, 0:1600]
    big = 128 + 60 * np.sin(xx * 0.01) * np.cos(yy * 0.013)
    img = np.stack([big, big * 0.8, 255 - big], -1) + rng.integers(-20, 20, (1200, 1600, 3))
    Image.fromarray(img.clip(0, 255).astype(np.uint8)).save(root / "c0" / "big.jpg", quality=90)
    files[root / "c0" / "big.jpg"] = "scaled"
    return root, files


def crop_of(spec: str, path, seed=0, epoch=0, id=0, count=1, out=None) -> list[dict]:
    cmd = [riffle_bin(), "transform", spec, str(path), "--seed", str(seed), "--epoch", str(epoch), "--id", str(id),
           "--count", str(count)]
    if out:
        cmd += ["--out", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return [json.loads(line) for line in r.stdout.splitlines()]


def close(got: np.ndarray, ref: np.ndarray, kind: str) -> None:
    """The tolerance, by how the image was decoded: a PNG, and a JPEG
    decoded at full scale (only the box's region, with a margin that keeps
    libjpeg's chroma upsampling the same as a whole decode's), are
    torchvision's bytes exactly; a JPEG shrunk while decoding (DCT scaling,
    for boxes at least twice the output) is a smoothed copy, within 2
    levels on average."""
    d = np.abs(got.astype(np.int32) - ref.astype(np.int32))
    if kind in ("png", "full"):
        assert d.max() == 0, f"{kind}: {int((d > 0).sum())} values differ from torchvision's, by up to {d.max()}"
    else:
        assert d.mean() <= 2.0 and d.max() <= 32, (d.max(), d.mean())


def test_center_crop_equals_torchvision(daemon, images):
    from PIL import Image
    import torchvision.transforms as T
    root, files = images
    tv = T.Compose([T.Resize(256), T.CenterCrop(SIZE)])
    ld = riffle.Loader(root, batch_size=len(files), transform="image", shuffle=True, seed=2)
    b = next(iter(ld))
    assert b.data.shape == (len(files), SIZE, SIZE, 3) and b.data.dtype == np.uint8
    for i, (path, _) in enumerate(ld.locate(b.ids.tolist())):
        ref = np.asarray(tv(Image.open(path).convert("RGB")))
        close(b.data[i], ref, files[next(p for p in files if str(p) == path)])


def test_random_resized_crop_equals_torchvision(daemon, images, tmp_path):
    """Each record's output is its draw's: the box `riffle transform` names
    for (seed, epoch, id), cut and resized by torchvision to within the
    tolerance, mirrored when the draw says so; the draws change with the
    epoch and the seed."""
    from PIL import Image
    import torchvision.transforms.functional as F
    root, files = images
    spec = f"random_resized_crop:size={SIZE}"
    seen = {}
    for seed in (7, 8):
        ld = riffle.Loader(root, batch_size=3, transform=spec, shuffle=True, seed=seed)
        for epoch in range(2):
            for b in ld:
                assert b.epoch == epoch
                for i, (path, _) in enumerate(ld.locate(b.ids.tolist())):
                    rid = int(b.ids[i])
                    rep, = crop_of(spec, path, seed, epoch, rid, out=tmp_path / "o.rgb")
                    mine = np.fromfile(tmp_path / "o.rgb", np.uint8).reshape(SIZE, SIZE, 3)
                    assert np.array_equal(b.data[i], mine), f"record {rid} epoch {epoch}: not its draw's output"
                    c = rep["crop"]
                    top, left = int(c["y0"]), int(c["x0"])
                    h, w = int(c["y1"]) - top, int(c["x1"]) - left
                    im = F.resized_crop(Image.open(path).convert("RGB"), top, left, h, w, [SIZE, SIZE])
                    if c["flip"]:
                        im = F.hflip(im)
                    kind = files[next(p for p in files if str(p) == path)]
                    if kind == "scaled" and min(w, h) < 2 * SIZE:
                        kind = "full"
                    close(b.data[i], np.asarray(im), kind)
                    seen[(seed, epoch, rid)] = (top, left, h, w, c["flip"])
    n = len(files)
    assert len(seen) == 4 * n
    for rid in range(n):
        boxes = {seen[(s, e, rid)] for s in (7, 8) for e in range(2)}
        assert len(boxes) >= 3, f"record {rid}: the same crop in {4 - len(boxes) + 1} of 4 (seed, epoch) draws"


def test_shared_random_crops_are_solo_crops(daemon, images, tmp_path):
    """Two jobs sharing the records' reads and decodes (share=True, other
    seeds) each get their own draws' outputs, byte for byte what `riffle
    transform` gives the record alone."""
    root, files = images
    spec = f"random_resized_crop:size={SIZE}"
    a = riffle.Loader(root, batch_size=2, transform=spec, share=True, seed=21)
    b = riffle.Loader(root, batch_size=2, transform=spec, share=True, seed=22)
    got = {}
    for _ in range(2):
        for ba, bb in zip(a, b):
            for seed, batch, ld in ((21, ba, a), (22, bb, b)):
                for i, (path, _) in enumerate(ld.locate(batch.ids.tolist())):
                    got[(seed, batch.epoch, int(batch.ids[i]))] = (path, batch.data[i].copy())
    assert len(got) == 2 * 2 * len(files)
    for (seed, epoch, rid), (path, data) in got.items():
        crop_of(spec, path, seed, epoch, rid, out=tmp_path / "o.rgb")
        solo = np.fromfile(tmp_path / "o.rgb", np.uint8).reshape(SIZE, SIZE, 3)
        assert np.array_equal(data, solo), f"seed {seed} epoch {epoch} record {rid}: not its solo output"


def test_random_resized_crop_draws_like_torchvision(images):
    """riffle's boxes follow torchvision's RandomResizedCrop.get_params and
    RandomHorizontalFlip: the same distribution of area, aspect ratio,
    position and flips (two-sample Kolmogorov-Smirnov at 0.1%, both sides
    seeded, so the test is deterministic)."""
    import torch
    import torchvision.transforms as T
    from PIL import Image
    root, files = images
    path = next(p for p, k in files.items() if k == "full")
    w, h = Image.open(path).size
    n = 4000
    reps = crop_of(f"random_resized_crop:size={SIZE}", path, seed=11, count=n)
    ours = np.array([[r["crop"]["x0"], r["crop"]["y0"], r["crop"]["x1"] - r["crop"]["x0"],
                      r["crop"]["y1"] - r["crop"]["y0"]] for r in reps])
    flips = np.array([r["crop"]["flip"] for r in reps])
    torch.manual_seed(11)
    img = Image.new("RGB", (w, h))
    theirs = np.array([[j, i, cw, ch] for i, j, ch, cw in (T.RandomResizedCrop.get_params(
        img, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)) for _ in range(n))])

    def ks(a, b):
        grid = np.sort(np.concatenate([a, b]))
        return np.abs(np.searchsorted(np.sort(a), grid, "right") / len(a) -
                      np.searchsorted(np.sort(b), grid, "right") / len(b)).max()
    bound = 1.95 * np.sqrt(2 / n)
    for name, f in [("area", lambda x: x[:, 2] * x[:, 3]), ("log aspect", lambda x: np.log(x[:, 2] / x[:, 3])),
                    ("centre x", lambda x: x[:, 0] + x[:, 2] / 2), ("centre y", lambda x: x[:, 1] + x[:, 3] / 2)]:
        assert ks(f(ours), f(theirs)) < bound, f"{name}: KS {ks(f(ours), f(theirs)):.3f} >= {bound:.3f}"
    assert ((ours[:, 2] >= 1) & (ours[:, 0] + ours[:, 2] <= w) & (ours[:, 1] + ours[:, 3] <= h)).all()
    assert abs(flips.mean() - 0.5) < 4 * np.sqrt(0.25 / n), flips.mean()


def test_random_transform_refused_by_pack(tmp_path, images):
    root, _ = images
    r = subprocess.run([riffle_bin(), "pack", str(root), "--out", str(tmp_path / "p"), "--transform",
                        "random_resized_crop"], capture_output=True, text=True)
    assert r.returncode != 0 and "per job and epoch" in r.stderr, r.stderr


def test_bad_image_names_the_file(daemon, tmp_path):
    """A truncated JPEG is an error naming its file, in both transforms, never a grey-padded image."""
    from PIL import Image
    d = tmp_path / "bad" / "c"
    d.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for i in range(4):
        Image.fromarray(rng.integers(0, 255, (200, 260, 3), dtype=np.uint8)).save(d / f"{i}.jpg", quality=90)
    data = (d / "2.jpg").read_bytes()
    (d / "2.jpg").write_bytes(data[: len(data) // 2])
    for spec in ("image", "random_resized_crop"):
        with pytest.raises(riffle.RiffleError, match="2.jpg"):
            for _ in riffle.Loader(tmp_path / "bad", batch_size=4, transform=spec):
                pass
