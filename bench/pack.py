"""Converting once (issue 14): persisted preprocessing and packed shards.

  jpeg    a directory of ImageNet-like JPEGs through decode-resize-crop
          (image:size=256,crop=224): epochs 2-5 with the outputs persisted
          by `riffle pack --transform` against riffle decoding every epoch,
          and against torchvision's ImageFolder + DataLoader(num_workers=2)
          with the same transform; samples/s and CPU seconds (every
          process: client, workers, daemon), warm
  packed  the block-aware shuffle over a JSONL file of variable-size lines
          against the same over its `riffle pack` shards, cold: device
          bytes over record bytes and samples/s (riffle bench)

    sudo .venv/bin/python bench/pack.py --parts jpeg,packed
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

from common import REPO, Daemon, make_jpegs, parse_size

RIFFLE = str(REPO / "bin" / "riffle")
TRANSFORM = "image:size=256,crop=224"


def cpu_self_children() -> float:
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def riffle_epochs(root: Path, daemon: Daemon, epochs: int) -> tuple[float, float, bool]:
    """Samples/s and CPU seconds (client and daemon) of epochs 2..epochs."""
    import riffle
    ld = riffle.Loader(str(root), batch_size=64, transform=TRANSFORM, seed=1, socket=daemon.sock, autostart=False,
                       timeout=600)
    persisted = bool(ld.info().get("persisted"))
    for b in ld:  # epoch 1: the same for all, not counted
        pass
    c0, d0, t0, n = cpu_self_children(), daemon.cpu(), time.time(), 0
    for _ in range(epochs - 1):
        for b in ld:
            n += b.n
    el = time.time() - t0
    cpu = cpu_self_children() - c0 + daemon.cpu() - d0
    ld.close()
    return n / el, cpu, persisted


def torchvision_epochs(root: Path, epochs: int) -> tuple[float, float]:
    import torch
    from torchvision import datasets, transforms
    tf = transforms.Compose([transforms.Resize(256), transforms.CenterCrop(224), transforms.PILToTensor()])
    ds = datasets.ImageFolder(str(root), transform=tf)
    dl = torch.utils.data.DataLoader(ds, batch_size=64, shuffle=True, num_workers=2)
    for _ in dl:
        pass
    c0, t0, n = cpu_self_children(), time.time(), 0
    for _ in range(epochs - 1):
        for x, y in dl:
            n += len(y)
    return n / (time.time() - t0), cpu_self_children() - c0


def part_jpeg(args) -> None:
    root = Path(args.dir) / "jpegs"
    make_jpegs(root, args.images)
    cache = Path(args.dir) / "riffle-cache"
    shutil.rmtree(cache, ignore_errors=True)
    os.environ["RIFFLE_CACHE_DIR"] = str(cache)
    subprocess.run(["cat"] + [str(p) for p in root.rglob("*.jpg")], stdout=subprocess.DEVNULL, check=True)  # warm
    d = Daemon(name="riffle-pack-bench")
    try:
        each = riffle_epochs(root, d, args.epochs)
    finally:
        d.stop()
    t0 = time.time()
    subprocess.run([RIFFLE, "pack", str(root), "--transform", TRANSFORM], check=True, stdout=subprocess.DEVNULL)
    pack_s = time.time() - t0
    d = Daemon(name="riffle-pack-bench")
    try:
        kept = riffle_epochs(root, d, args.epochs)
    finally:
        d.stop()
    tv = torchvision_epochs(root, args.epochs)
    print(f"\n{args.images} JPEGs (about 500x375), {TRANSFORM}, batch 64, epochs 2-{args.epochs}, warm; "
          f"riffle pack --transform took {pack_s:.1f}s")
    print(f"  {'loader':<52} {'samples/s':>10} {'CPU s':>8}")
    print(f"  {'riffle, persisted outputs (read, no decode)':<52} {kept[0]:>10.0f} {kept[1]:>8.1f}"
          + ("" if kept[2] else "  (NOT persisted)"))
    print(f"  {'riffle, decoding every epoch':<52} {each[0]:>10.0f} {each[1]:>8.1f}")
    print(f"  {'torchvision ImageFolder + DataLoader(num_workers=2)':<52} {tv[0]:>10.0f} {tv[1]:>8.1f}")


def write_jsonl(path: Path, size: int) -> None:
    if path.exists() and path.stat().st_size >= size:
        return
    import random
    rng = random.Random(0)
    with open(path, "w") as f:
        n, i = 0, 0
        while n < size:
            line = json.dumps({"id": i, "label": i % 10, "text": "x" * rng.randint(200, 1800)}) + "\n"
            f.write(line)
            n += len(line)
            i += 1


def part_packed(args) -> None:
    src = Path(args.dir) / "lines.jsonl"
    write_jsonl(src, parse_size(args.jsonl))
    out = Path(args.dir) / "lines-packed"
    if not out.exists():
        subprocess.run([RIFFLE, "pack", str(src), "--out", str(out)], check=True, stdout=subprocess.DEVNULL)
    for name, path in (("source JSONL", src), ("riffle pack shards", out)):
        print(f"\nblock-aware shuffle (64 KiB blocks) over the {name}, cold:", flush=True)
        subprocess.run([RIFFLE, "bench", str(path), "--sampler", "block", "--block-size", "65536", "--mode", "cold",
                        "--no-fio", "--duration", f"{args.seconds}s"], check=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="/var/tmp/riffle-pack-bench")
    ap.add_argument("--images", type=int, default=2000)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--jsonl", default="1GiB")
    ap.add_argument("--seconds", type=int, default=10)
    ap.add_argument("--parts", default="jpeg,packed")
    args = ap.parse_args()
    Path(args.dir).mkdir(parents=True, exist_ok=True)
    subprocess.run(["make", "-C", str(REPO), "build"], check=True, stdout=subprocess.DEVNULL)
    for p in args.parts.split(","):
        globals()["part_" + p](args)


if __name__ == "__main__":
    main()
