"""A Hugging Face image dataset in Parquet: riffle.torch against datasets + DataLoader (issue 23).

One Parquet file written by ``datasets.Dataset.to_parquet`` (an ``Image()``
column of JPEGs, a ``ClassLabel`` label and an ``id``, 100 rows per row
group) is read for one epoch, batch 64, two DataLoader workers, by:

* riffle: ``riffle.torch.loader(path, 64, num_workers=2, seed=0,
  transform=row_fn)``, where riffle.torch hands each row's image over as a
  PIL image and row_fn resizes, crops and converts it;
* Hugging Face: ``load_dataset("parquet", ...)`` with ``with_transform``
  doing the same torchvision ops, in ``DataLoader(shuffle=True,
  num_workers=2)``.

Cold drops the page cache before each epoch; warm reads the files each one
reads into the cache first. Both are measured in the same run, alternating,
and each epoch is checked to deliver every id exactly once. Prints a
Markdown table and writes the figures as JSON.

    sudo .venv/bin/python bench/hfimages.py
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402  (puts REPO/python on sys.path)

import torch  # noqa: E402
import torch.utils.data  # noqa: E402
from torchvision import transforms as T  # noqa: E402

CLASSES = 10
ROWS_PER_GROUP = 100

# The same ops for both loaders: ImageNet's evaluation pipeline.
OPS = T.Compose([T.Resize(256), T.CenterCrop(224), T.PILToTensor()])


def make_image(rng: np.random.Generator) -> bytes:
    """A JPEG (quality 85) of 256-500 px a side: a colour gradient, a few
    filled shapes and Gaussian noise, so its size is a photograph's (about
    40 KiB) rather than a flat image's."""
    from PIL import Image, ImageDraw
    w, h = int(rng.integers(256, 501)), int(rng.integers(256, 501))
    a = (np.arange(w) / w)[None, :, None]
    c0, c1 = rng.uniform(0, 255, 3), rng.uniform(0, 255, 3)
    img = Image.fromarray(np.broadcast_to(c0 * (1 - a) + c1 * a, (h, w, 3)).astype(np.uint8))
    draw = ImageDraw.Draw(img)
    for _ in range(int(rng.integers(3, 9))):
        x0, y0 = int(rng.integers(0, w)), int(rng.integers(0, h))
        box = [x0, y0, x0 + int(rng.integers(20, w // 2)), y0 + int(rng.integers(20, h // 2))]
        fill = tuple(int(c) for c in rng.integers(0, 256, 3))
        (draw.ellipse if rng.random() < 0.5 else draw.rectangle)(box, fill=fill)
    px = np.asarray(img, np.int16) + rng.normal(0, 12, (h, w, 3)).astype(np.int16)
    out = io.BytesIO()
    Image.fromarray(px.clip(0, 255).astype(np.uint8)).save(out, "JPEG", quality=85)
    return out.getvalue()


def make_dataset(path: Path, n: int) -> None:
    """n rows (image, label, id) in Parquet, written by datasets itself; kept if it has n rows."""
    import pyarrow.parquet as pq
    if path.exists() and pq.ParquetFile(path).metadata.num_rows == n:
        return
    import datasets
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    done = common.timed(f"making {n} JPEGs")
    images = [{"bytes": make_image(rng), "path": None} for _ in range(n)]
    done()
    features = datasets.Features({
        "image": datasets.Image(),
        "label": datasets.ClassLabel(names=[f"c{k}" for k in range(CLASSES)]),
        "id": datasets.Value("int64"),
    })
    ds = datasets.Dataset.from_dict(
        {"image": images, "label": [int(x) for x in rng.integers(0, CLASSES, n)], "id": list(range(n))},
        features=features)
    tmp = path.with_suffix(".tmp")
    # to_parquet writes each batch as its own row group (datasets' own
    # default for image datasets is 100 rows, too).
    ds.to_parquet(str(tmp), batch_size=ROWS_PER_GROUP)
    os.replace(tmp, path)


def row_fn(row: dict) -> tuple:
    """riffle.torch's per-row transform: row["image"] is already a PIL image."""
    return OPS(row["image"].convert("RGB")), row["label"], row["id"]


def hf_fn(batch: dict) -> dict:
    """datasets' with_transform: a batch of columns, images already PIL."""
    return {"image": [OPS(im.convert("RGB")) for im in batch["image"]], "label": batch["label"], "id": batch["id"]}


def warm(paths: list[str]) -> None:
    for p in paths:
        with open(p, "rb") as f:
            while f.read(1 << 24):
                pass


def ceiling(path: Path, n: int = 400) -> float:
    """Samples/s one process gets decoding and transforming n images it
    already holds, times the machine's cores: what no loader can beat here."""
    import pyarrow.parquet as pq
    from PIL import Image
    cells = pq.read_table(path, columns=["image"]).slice(0, n).column("image").to_pylist()
    start = time.process_time()
    for c in cells:
        OPS(Image.open(io.BytesIO(c["bytes"])).convert("RGB"))
    return n / (time.process_time() - start) * os.cpu_count()


def cpu_now(daemon: common.Daemon) -> float:
    """CPU seconds so far of this process, its waited-for children (the
    DataLoader workers, once joined) and the daemon."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system + daemon.cpu()


def epoch(batches, n: int) -> tuple[float, int]:
    """Samples/s over one epoch (the loader's start included) and how many
    ids were not delivered exactly once."""
    seen = np.zeros(n, np.int64)
    start = time.monotonic()
    for b in batches:
        ids = b["id"] if isinstance(b, dict) else b[2]
        imgs = b["image"] if isinstance(b, dict) else b[0]
        assert imgs.shape[1:] == (3, 224, 224) and imgs.dtype == torch.uint8, (imgs.shape, imgs.dtype)
        np.add.at(seen, ids.numpy(), 1)
    rate = int(seen.sum()) / (time.monotonic() - start)
    return rate, int(np.count_nonzero(seen != 1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", default="/var/tmp/riffle-bench", help="where the dataset and HF's cache live")
    ap.add_argument("--rows", type=int, default=4000)
    ap.add_argument("--rounds", type=int, default=5, help="epochs of each loader in each state; the median is shown")
    ap.add_argument("--json", default=None, help="where the figures go (default: DIR/hfimages.json)")
    args = ap.parse_args()

    root = Path(args.dir)
    path = root / f"hfimages{args.rows}.parquet"
    make_dataset(path, args.rows)
    import pyarrow.parquet as pq
    meta = pq.ParquetFile(path).metadata
    size = path.stat().st_size
    print(f"{path}: {meta.num_rows} rows, {meta.num_row_groups} row groups, {size / 2**20:.0f} MiB "
          f"({size / meta.num_rows / 1024:.1f} KiB a row)", flush=True)

    import datasets
    import riffle.torch as rt
    datasets.disable_progress_bars()

    # One-time preparation of each, timed and kept out of the epochs:
    # datasets converts the Parquet file to Arrow files in its cache,
    # riffle's daemon indexes the file's pages.
    t = time.monotonic()
    hf = datasets.load_dataset("parquet", data_files=str(path), split="train", cache_dir=str(root / "hf-cache"))
    hf_prep = time.monotonic() - t
    hf_files = [f["filename"] for f in hf.cache_files]
    hf = hf.with_transform(hf_fn)

    d = common.Daemon(name="riffle-bench-hfimages")
    os.environ["RIFFLE_SOCKET"] = d.sock  # for the DataLoader workers, too
    try:
        t = time.monotonic()
        n_batches = len(rt.loader(str(path), 64, num_workers=2, seed=0, transform=row_fn))
        riffle_prep = time.monotonic() - t

        def riffle_epoch():
            return rt.loader(str(path), 64, num_workers=2, seed=0, transform=row_fn)

        def hf_epoch():
            return torch.utils.data.DataLoader(hf, batch_size=64, shuffle=True, num_workers=2)

        systems = {"riffle": (riffle_epoch, [str(path)]), "hf": (hf_epoch, hf_files)}
        rates: dict[str, dict[str, list[float]]] = {s: {"cold": [], "warm": []} for s in systems}
        cpu_ms: dict[str, list[float]] = {s: [] for s in systems}
        for state in ("cold", "warm"):
            for r in range(args.rounds):
                # Alternate who goes first, so neither always follows the other.
                for s in (list(systems) if r % 2 == 0 else list(systems)[::-1]):
                    make, files = systems[s]
                    if state == "cold":
                        common.drop_caches()
                    else:
                        warm(files)
                    cpu = cpu_now(d)
                    rate, wrong = epoch(make(), args.rows)
                    cpu_ms[s].append((cpu_now(d) - cpu) / args.rows * 1e3)
                    if wrong:
                        raise SystemExit(f"{s} {state}: {wrong} ids not delivered exactly once")
                    rates[s][state].append(rate)
                    print(f"  {s:6s} {state} round {r}: {rate:,.0f} samples/s, every id once, "
                          f"{cpu_ms[s][-1]:.2f} CPU ms a sample", flush=True)
        daemon_cpu = d.cpu()
    finally:
        d.stop()
    top = ceiling(path)

    med = {s: {st: statistics.median(v) for st, v in by.items()} for s, by in rates.items()}
    ratio = {st: med["riffle"][st] / med["hf"][st] for st in ("cold", "warm")}
    print()
    print("| loader | cold samples/s | warm samples/s |")
    print("|---|---|---|")
    print(f"| riffle.torch.loader, transform=row_fn | {med['riffle']['cold']:,.0f} | {med['riffle']['warm']:,.0f} |")
    print(f"| HF load_dataset + with_transform + DataLoader | {med['hf']['cold']:,.0f} | {med['hf']['warm']:,.0f} |")
    print(f"| riffle / HF | {ratio['cold']:.2f}x | {ratio['warm']:.2f}x |")
    cpu = {s: statistics.median(v) for s, v in cpu_ms.items()}
    print(f"\nCPU ms a sample (all processes, median): riffle {cpu['riffle']:.2f} (its daemon "
          f"{daemon_cpu / (2 * args.rounds * args.rows) * 1e3:.2f}), HF {cpu['hf']:.2f}; decode + transform alone "
          f"{os.cpu_count() / top * 1e3:.2f}, so at most {top:,.0f} samples/s on {os.cpu_count()} cores")
    print(f"\none-time preparation: HF's Arrow conversion {hf_prep:.1f} s, riffle's index {riffle_prep:.1f} s "
          f"({n_batches} batches an epoch)")

    out = Path(args.json) if args.json else root / "hfimages.json"
    out.write_text(json.dumps({
        "path": str(path), "rows": meta.num_rows, "row_groups": meta.num_row_groups, "bytes": size,
        "batch_size": 64, "num_workers": 2, "rounds": args.rounds,
        "samples_per_s": rates, "median": med, "ratio": ratio,
        "prep_seconds": {"hf": hf_prep, "riffle": riffle_prep},
        "cpu_ms_per_sample": cpu_ms, "daemon_cpu_seconds": daemon_cpu, "ceiling_samples_per_s": top,
        "versions": {"torch": torch.__version__, "datasets": datasets.__version__},
    }, indent=1) + "\n")
    print(f"figures: {out}")


if __name__ == "__main__":
    main()
