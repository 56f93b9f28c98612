#!/usr/bin/python3
"""riffle.torch against torch.utils.data.DataLoader, side by side in one run.

For each record size, batch size and cache state (cold: page cache dropped
before each measurement; warm: file read into the cache first) it measures:

* DataLoader(shuffle=True, num_workers=0/2/4) over a map-style Dataset whose
  __getitem__ does os.pread of one record (the common baseline);
* riffle.torch.loader(...) yielding the same batches as tensors;
* riffle's Go loader in process (``riffle bench --json``) on the same file,
  so the Python client's overhead shows as a ratio.

Each measurement stops after --seconds or one epoch, whichever is first.
Prints a Markdown table; BENCHMARKS.md records one.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.utils.data

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python"))
import riffle.torch as rt  # noqa: E402

BIN = os.environ.get("RIFFLE_BIN", str(REPO / "bin" / "riffle"))


class PreadDataset(torch.utils.data.Dataset):
    """A map-style dataset reading one fixed-size record per __getitem__."""

    def __init__(self, path: str, size: int):
        self.path, self.size = path, size
        self.n = os.path.getsize(path) // size
        self.fd = None

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        if self.fd is None:  # opened in each worker
            self.fd = os.open(self.path, os.O_RDONLY)
        return torch.frombuffer(bytearray(os.pread(self.fd, self.size, i * self.size)), dtype=torch.uint8)


def drop_caches() -> None:
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def warm(path: str) -> None:
    with open(path, "rb") as f:
        while f.read(1 << 24):
            pass


def timed(it, limit_records: int, seconds: float, batch: int) -> float:
    n, start = 0, time.monotonic()
    for t in it:
        n += t.shape[0]
        if n >= limit_records or time.monotonic() - start >= seconds:
            break
    return n / (time.monotonic() - start)


def make_file(path: Path, size: int, total: int) -> None:
    if path.exists() and path.stat().st_size == total // size * size:
        return
    subprocess.run([BIN, "bench", str(path), "--create", str(total), "--record-size", str(size),
                    "--mode", "warm", "--duration", "1s", "--no-fio"], check=True, stdout=subprocess.DEVNULL)


def go_rate(path: Path, size: int, batch: int, mode: str, seconds: float) -> float:
    out = subprocess.run([BIN, "bench", str(path), "--record-size", str(size), "--batch-size", str(batch),
                          "--mode", mode, "--duration", f"{seconds}s", "--no-fio", "--json"],
                         check=True, capture_output=True, text=True).stdout
    for r in json.loads(out)[0]["results"]:
        if r["name"] == "riffle":
            return r["records"] / r["seconds"]
    raise RuntimeError("no riffle result")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default="/var/tmp/riffle-bench")
    ap.add_argument("--sizes", default="4096,16384,131072")
    ap.add_argument("--batches", default="64,256")
    ap.add_argument("--workers", default="0,2,4")
    ap.add_argument("--modes", default="cold,warm")
    ap.add_argument("--file-bytes", type=float, default=4 * 2**30)
    ap.add_argument("--seconds", type=float, default=6.0)
    a = ap.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    os.environ.setdefault("RIFFLE_SOCKET", os.path.join(a.dir, "bench.sock"))
    print("| record | batch | cache | DataLoader w=0 | w=2 | w=4 | riffle.torch | riffle / best DataLoader | riffle Go | Python / Go |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for size in map(int, a.sizes.split(",")):
        path = Path(a.dir) / f"torch-{size}.bin"
        make_file(path, size, int(a.file_bytes))
        n = path.stat().st_size // size
        for batch in map(int, a.batches.split(",")):
            for mode in a.modes.split(","):
                prep = drop_caches if mode == "cold" else (lambda: warm(str(path)))
                rates = []
                for w in map(int, a.workers.split(",")):
                    prep()
                    dl = torch.utils.data.DataLoader(PreadDataset(str(path), size), batch_size=batch, shuffle=True,
                                                     num_workers=w)
                    rates.append(timed(dl, n, a.seconds, batch))
                prep()
                # The first batch includes opening the job; so does DataLoader's first batch its workers' start.
                dl = rt.loader(str(path), batch, record_size=size, seed=1)
                r = timed(dl, n, a.seconds, batch)
                prep()
                g = go_rate(path, size, batch, mode, a.seconds)
                best = max(rates)
                print(f"| {size // 1024} KiB | {batch} | {mode} | " + " | ".join(f"{x:,.0f}" for x in rates)
                      + f" | {r:,.0f} | {r / best:.1f}x | {g:,.0f} | {r / g:.0%} |", flush=True)


if __name__ == "__main__":
    main()
