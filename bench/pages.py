"""A job alone on data larger than its page cache: the pages its steward
keeps against the kernel's LRU and reads past the cache.

Each run is `riffle load FILE --epochs E` in a memory cgroup (v1) of
--memory, the page cache dropped first, a seed of its own. Each epoch's
device bytes are read from /sys/block/DEV/stat as its line is printed.
Runs are interleaved in rounds, each round in another order. Configurations
are NAME=BINARY[:FLAGS], e.g.

    sudo PATH=/usr/local/go/bin:$PATH /usr/bin/python3 bench/pages.py \\
        --file /var/tmp/riffle-bench/r4GiB.bin --memory 3GiB --epochs 4 \\
        --run steward=/tmp/new/riffle --run lru=/tmp/old/riffle:--direct=false --run direct=/tmp/old/riffle \\
        --prewarm

It prints, per configuration, the medians over rounds of each epoch's
samples/s and device bytes over the file's, and the CPU seconds a run.
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from common import device_of, drop_caches, parse_size, read_bytes  # noqa: E402

CG = Path("/sys/fs/cgroup/memory/riffle-pages")
EPOCH = re.compile(r"^epoch (\d+): (\d+) samples in ([\d.]+) s, ([\d.]+) samples/s, (\d+) repeated")


def run(binary: str, flags: list[str], args, seed: int, dev: str) -> dict:
    CG.mkdir(exist_ok=True)
    (CG / "memory.limit_in_bytes").write_text(str(parse_size(args.memory)))
    drop_caches()
    cmd = [binary, "load", args.file, "--record-size", str(args.record_size), "--epochs", str(args.epochs),
           "--seed", str(seed), *flags]
    before = read_bytes(dev)
    t0 = time.monotonic()
    p = subprocess.Popen(["sh", "-c", 'echo $$ > "$0" && exec "$@"', str(CG / "cgroup.procs"), *cmd],
                         stdout=subprocess.PIPE, text=True)
    epochs = []
    last = before
    for line in p.stdout:
        m = EPOCH.match(line)
        if not m:
            continue
        now = read_bytes(dev)
        epochs.append({"rate": float(m.group(4)), "bytes": now - last, "repeated": int(m.group(5)),
                       "samples": int(m.group(2))})
        last = now
    _, status, ru = os.wait4(p.pid, 0)
    if status != 0 or len(epochs) != args.epochs:
        raise SystemExit(f"{' '.join(cmd)}: exit status {status}, {len(epochs)} epochs")
    return {"epochs": epochs, "cpu": ru.ru_utime + ru.ru_stime, "seconds": time.monotonic() - t0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--file", required=True)
    ap.add_argument("--record-size", type=int, default=4096)
    ap.add_argument("--memory", default="3GiB", help="the cgroup's memory limit")
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--run", action="append", required=True, help="NAME=BINARY[:FLAGS] (flags comma-separated)")
    ap.add_argument("--prewarm", action="store_true",
                    help="read the file once with O_DIRECT first: a VM's disk backed by the host's memory is then warm "
                         "there for every run, not for the later runs only")
    args = ap.parse_args()
    size = os.path.getsize(args.file)
    records = size // args.record_size
    dev = device_of(Path(args.file))
    configs = []
    for r in args.run:
        name, rest = r.split("=", 1)
        binary, _, flags = rest.partition(":")
        configs.append((name, binary, [f for f in flags.split(",") if f]))
    results = {name: [] for name, _, _ in configs}
    if args.prewarm:
        subprocess.run(["dd", f"if={args.file}", "of=/dev/null", "bs=16M", "iflag=direct", "status=none"], check=True)
    seed = int(time.time())
    try:
        rounds(args, configs, results, seed, dev, size, records)
    finally:
        if CG.exists():
            CG.rmdir()  # empty once its runs have exited
    report(args, configs, results, size, records)


def rounds(args, configs, results, seed, dev, size, records) -> None:
    for k in range(args.rounds):
        order = configs[k % len(configs):] + configs[:k % len(configs)]
        for name, binary, flags in order:
            seed += 1
            r = run(binary, flags, args, seed, dev)
            for e in r["epochs"]:
                if e["samples"] != records or e["repeated"] != 0:
                    raise SystemExit(f"{name}: an epoch of {e['samples']} samples, {e['repeated']} repeated; want {records}, 0")
            results[name].append(r)
            print(f"round {k + 1} {name}: " + ", ".join(
                f"{e['rate']:,.0f}/s {e['bytes'] / size:.2f}x" for e in r["epochs"]) + f"; {r['cpu']:.1f} CPU s", flush=True)


def report(args, configs, results, size, records) -> None:
    print(f"\n{args.file}: {records} records of {args.record_size} bytes, {size / 2**30:.2f} GiB, cgroup {args.memory}, "
          f"{args.epochs} epochs, {args.rounds} rounds (medians; device bytes per epoch over the file's)")
    head = " | ".join(f"epoch {e + 1}" for e in range(args.epochs))
    print(f"| run | {head} | epochs 2-{args.epochs}: samples/s | device bytes | CPU s a run |")
    print("|---|" + "---|" * args.epochs + "---:|---:|---:|")
    for name, _, _ in configs:
        rs = results[name]
        cells = []
        for e in range(args.epochs):
            rate = statistics.median(r["epochs"][e]["rate"] for r in rs)
            by = statistics.median(r["epochs"][e]["bytes"] for r in rs) / size
            cells.append(f"{rate:,.0f}/s, {by:.2f}x")
        later = statistics.median(statistics.mean(e["rate"] for e in r["epochs"][1:]) for r in rs)
        later_by = statistics.median(statistics.mean(e["bytes"] for e in r["epochs"][1:]) for r in rs) / size
        cpu = statistics.median(r["cpu"] for r in rs)
        print(f"| {name} | " + " | ".join(cells) + f" | {later:,.0f} | {later_by:.2f}x | {cpu:.1f} |")


if __name__ == "__main__":
    main()
