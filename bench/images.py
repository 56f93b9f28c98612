"""The daemon's image transforms against one thread's full decode of the
same JPEGs, in one run (issue 27's per-core target).

1. One thread, in Go, on the files in memory: a whole libjpeg-turbo decode
   (the baseline), the `image` transform (Resize(256) + CenterCrop(224))
   and `random_resized_crop` (RandomResizedCrop(224) + flip); `go test
   -bench Dir ./transform`.
2. The daemon on the same files, warm, through riffle.Loader: images/s
   on the machine's cores, and images per CPU second of the daemon (per
   core), against (1)'s decode. (1) and (2) alternate for --rounds, each
   round's ratio over its own (1); then one cold epoch (page cache
   dropped) per transform.

    make build && .venv/bin/python bench/images.py --images 2000 --rounds 5
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import time
from pathlib import Path

from common import REPO, Daemon, drop_caches, make_jpegs

TRANSFORMS = {"image": "image:size=256,crop=224", "random_resized_crop": "random_resized_crop:size=224"}


def one_thread(root: Path, seconds: float) -> dict[str, float]:
    """images/s of one thread for the decode and each transform."""
    tags = subprocess.run([str(REPO / "scripts" / "go-tags")], capture_output=True, text=True).stdout.strip()
    out = subprocess.run(["go", "test", "-tags", tags, "-cpu", "1", "-run", "^$", "-bench", "^BenchmarkDir$",
                          "-benchtime", f"{seconds}s", "./transform"], cwd=REPO, capture_output=True, text=True,
                         env=dict(os.environ, RIFFLE_IMAGES=str(root)), check=True).stdout
    rates = {m[1]: float(m[2]) for m in re.finditer(r"BenchmarkDir/(\w+)\s.*?([\d.]+) images/s", out)}
    if set(rates) != {"decode", *TRANSFORMS}:
        raise SystemExit(f"go test -bench gave {rates}:\n{out}")
    return rates


def daemon_run(root: Path, spec: str, cold: bool, batch: int, epochs: int = 1) -> tuple[float, float, int]:
    """Epochs through the daemon: (images/s, daemon CPU seconds, images).

    Warm, several: an epoch of 2,000 images is 2 s, which the daemon's
    start and the dataset's open (a walk of the tree) weigh on, and the
    CPU clock counts in hundredths of a second."""
    import riffle
    d = Daemon(name="riffle-images")
    try:
        os.environ["RIFFLE_SOCKET"] = d.sock
        if cold:
            drop_caches()
        else:
            for p in root.rglob("*.jpg"):
                p.read_bytes()
        cpu0 = d.cpu()
        t0 = time.perf_counter()
        n = 0
        ld = riffle.Loader(root, batch_size=batch, transform=spec, seed=1)
        for _ in range(epochs):
            for b in ld:
                n += b.n
        el = time.perf_counter() - t0
        return n / el, d.cpu() - cpu0, n
    finally:
        d.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default="/tmp/riffle-bench/jpeg/raw")
    ap.add_argument("--images", type=int, default=2000)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=5)
    ap.add_argument("--epochs", type=int, default=3, help="warm epochs through the daemon")
    ap.add_argument("--rounds", type=int, default=3,
                    help="rounds of (one thread, then the daemon warm); the machine drifts, so each "
                         "round's per-core ratio is over its own one-thread rate, and the median is reported")
    args = ap.parse_args()
    root = Path(args.data)
    make_jpegs(root, args.images)
    cores = os.cpu_count()
    per_round: dict[str, list[float]] = {k: [] for k in TRANSFORMS}
    warm_rates: dict[str, list[float]] = {k: [] for k in TRANSFORMS}
    one: dict[str, list[float]] = {k: [] for k in ("decode", *TRANSFORMS)}
    for r in range(args.rounds):
        rates = one_thread(root, args.seconds)
        for k, v in rates.items():
            one[k].append(v)
        line = []
        for name, spec in TRANSFORMS.items():
            warm, cpu, n = daemon_run(root, spec, False, args.batch, args.epochs)
            per_round[name].append(n / cpu / rates["decode"])
            warm_rates[name].append(warm)
            line.append(f"{name} {warm:.0f}/s, {n / cpu:.0f} per CPU s, {per_round[name][-1]:.2f}x")
        print(f"round {r + 1}: one thread: decode {rates['decode']:.0f}/s, "
              + ", ".join(f"{k} {rates[k]:.0f}/s" for k in TRANSFORMS) + "; daemon warm: " + "; ".join(line),
              flush=True)
    med = statistics.median
    print(f"\n{args.images} JPEGs in {root}; one thread (medians of {args.rounds}): full decode "
          f"{med(one['decode']):.0f}/s, " + ", ".join(
              f"{k} {med(one[k]):.0f}/s ({med(a / b for a, b in zip(one[k], one['decode'])):.2f}x)" for k in TRANSFORMS))
    print()
    print(f"| transform | one thread images/s | / full decode | daemon cold images/s ({cores} cores) "
          "| daemon warm images/s | warm per core / one thread's full decode (median, range) |")
    print("|---|---:|---:|---:|---:|---|")
    for name, spec in TRANSFORMS.items():
        cold, _, _ = daemon_run(root, spec, True, args.batch)
        pr = per_round[name]
        print(f"| {name} | {med(one[name]):.0f} | {med(a / b for a, b in zip(one[name], one['decode'])):.2f}x "
              f"| {cold:.0f} | {med(warm_rates[name]):.0f} | **{med(pr):.2f}x** ({min(pr):.2f}x-{max(pr):.2f}x) |")

if __name__ == "__main__":
    main()
