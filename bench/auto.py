"""sampler="auto" on the label-sorted training check and on the device
(issue 27's fourth target), in one run.

1. Training: `riffle train` on N synthetic examples sorted by label, the
   global shuffle, sampler auto at --min-randomness for each memory cap,
   and the sequential order: epochs to the global shuffle's loss (+ 0.01)
   and final accuracy.
2. Device: `riffle load` of a larger sorted file, cold (page cache
   dropped), in a memory cgroup smaller than the file (so the data is
   larger than memory), in the order auto picks and in a sequential read
   and a global shuffle: samples/s, and auto's against the sequential
   read's.

    make build && .venv/bin/python bench/auto.py
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
from pathlib import Path

from common import REPO, drop_caches

BIN = os.environ.get("RIFFLE_BIN", str(REPO / "bin" / "riffle"))


def riffle(*args: str, cgroup: Path | None = None) -> str:
    cmd = [BIN, *args]
    if cgroup is not None:
        cmd = ["sh", "-c", 'echo $$ > "$0" && exec "$@"', str(cgroup / "cgroup.procs"), *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout


def load_rate(path: Path, cgroup: Path, *args: str) -> tuple[float, str]:
    """Cold samples/s of one epoch of riffle load in cgroup, and what it said it opened."""
    drop_caches()
    out = riffle("load", str(path), "--format", "libsvm", "--epochs", "1", *args, cgroup=cgroup)
    rate = float(re.search(r"([\d.]+) samples/s", out)[1])
    return rate, out.splitlines()[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--examples", type=int, default=200000)
    ap.add_argument("--big", type=int, default=2000000, help="examples of the file the device part reads")
    ap.add_argument("--min-randomness", type=float, default=0.9)
    ap.add_argument("--memory", default="16777216,67108864")
    ap.add_argument("--dir", default="/tmp/riffle-bench/auto")
    ap.add_argument("--cgroup-memory", type=int, default=128 << 20, help="the device part's memory limit")
    ap.add_argument("--parts", default="train,device")
    ap.add_argument("--device-min-randomness", default="", help="the device part's levels (default --min-randomness)")
    args = ap.parse_args()
    Path(args.dir).mkdir(parents=True, exist_ok=True)
    if "train" in args.parts.split(","):
        train(args)
    if "device" in args.parts.split(","):
        device(args)


def train(args) -> None:
    print(f"## Training: {args.examples} examples sorted by label, min RL {args.min_randomness}\n")
    for mem in args.memory.split(","):
        # --page-cache 0: as if the data were larger than memory (the case
        # auto weighs orders for; data the page cache keeps is read in the
        # global shuffle).
        out = riffle("train", "--synthetic", str(args.examples), "--synthetic-dir", args.dir, "--sampler",
                     "global,auto,sequential", "--min-randomness", str(args.min_randomness), "--memory", mem,
                     "--page-cache", "0")
        print(f"memory {int(mem) >> 20} MiB:")
        print("\n".join("    " + line for line in out.splitlines() if line.strip()))
        print()


def device(args) -> None:
    big = Path(args.dir) / f"sorted-{args.big}.svm"
    if not big.exists():
        riffle("train", "--synthetic", str(args.big), "--synthetic-dir", args.dir, "--sampler", "sequential",
               "--max-epochs", "1", "--target", "1")
    cg = Path("/sys/fs/cgroup/memory/riffle-auto")
    cg.mkdir(exist_ok=True)
    (cg / "memory.limit_in_bytes").write_text(str(args.cgroup_memory))
    print(f"## Device: {big.name}, {big.stat().st_size >> 20} MiB, cold, in {args.cgroup_memory >> 20} MiB of memory\n")
    seq, _ = load_rate(big, cg, "--sampler", "sequential")
    glob, _ = load_rate(big, cg, "--sampler", "global")
    rows = [("sequential", seq, ""), ("global", glob, "")]
    print(f"sequential {seq:.0f}, global {glob:.0f} samples/s", flush=True)
    for level in (args.device_min_randomness or str(args.min_randomness)).split(","):
        for mem in args.memory.split(","):
            r, said = load_rate(big, cg, "--sampler", "auto", "--min-randomness", level, "--memory", mem)
            rows.append((f"auto, min RL {level}, memory {int(mem) >> 20} MiB", r, said.split("; ", 1)[-1]))
            print(f"{rows[-1][0]}: {r:.0f} samples/s, {r / seq:.2f}x; {rows[-1][2]}", flush=True)
    print()
    print("| order | cold samples/s | / sequential | auto's choice |\n|---|---:|---:|---|")
    for name, r, said in rows:
        print(f"| {name} | {r:.0f} | {r / seq:.2f}x | {said} |")


if __name__ == "__main__":
    main()
