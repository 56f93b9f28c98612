"""Jobs sharing one daemon (issue 12): dependent sampling, the RefCnt cache
and shared decoding, against the same jobs loading independently and
against PyTorch DataLoaders, with real clients, cold.

  speeds   four jobs over a 4 GiB file of 4 KiB records, started 5 s apart,
           consuming at 1x, 1x, 2x and 4x a base rate, the daemon in a
           memory cgroup that cannot hold the file: device bytes against one
           job's epoch, and each job's samples/s against its target
  overlap  two jobs whose subsets overlap by half: device bytes against
           |D1 u D2|, and how often a round gave both one record, against
           Joader's bound |I| / max(|D1|, |D2|)
  decode   the image transform (decode, resize, crop) over a directory of
           JPEGs: CPU seconds for four sharing jobs against one job
  joader   2, 4 and 6 jobs decoding the JPEGs at once: total time, shared
           against independent (Joader's Table 1, in spirit)
  speeds-jsonl, speeds-dir, speeds-fixed
           speeds over records of variable size (issue 22): a JSONL file of
           lines of 100 B to 8 KiB, and an ImageFolder tree of files of
           1 to 64 KiB, each larger than the daemon's cgroup; every client
           checks every record it gets (its id and a CRC32 it carries) and
           that it got each record once, and reports the wrong ones;
           speeds-fixed is the control, 4 KiB records at the same scale

    sudo /usr/bin/python3 bench/share.py --parts speeds,overlap,decode,joader
    sudo /usr/bin/python3 bench/share.py --parts speeds-fixed,speeds-jsonl
    sudo /usr/bin/python3 bench/share.py --parts speeds-dir --var-memory 1.25GiB --var-cache 256MiB
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

from common import (REPO, Daemon, GroupWatch, cpu_seconds, device_of, drop_caches, make_file, make_jpegs, make_jsonl,
                    make_tree, parse_size, process_read_bytes, read_bytes)

RIFFLE = """
import sys, time, json
sys.path.insert(0, {py!r})
import riffle
ld = riffle.Loader({path!r}, batch_size=256, seed={seed}, share={share}, autostart=False, timeout=600, **{kw!r})
ld.info()
print("ready", flush=True)
sys.stdin.readline()
start = time.time(); n = 0
for b in ld:
    n += b.n
    if {rate}:
        ahead = start + n / {rate} - time.time()
        if ahead > 0:
            time.sleep(ahead)
print(json.dumps({{"n": n, "s": time.time() - start}}), flush=True)
"""

# A riffle client that checks every record against what it must be: its
# bytes carry its id and a CRC32 (common.make_jsonl, make_tree), and the id a
# batch names must be the one the bytes carry (for a tree, through the file
# ld.locate names). Counts wrong records, and records given twice or never.
CHECKED = """
import sys, time, json
sys.path.insert(0, {bench!r})
from common import check_fixed, check_jsonl, check_tree, tree_number
import riffle
ld = riffle.Loader({path!r}, batch_size=256, seed={seed}, share={share}, autostart=False, timeout=600, **{kw!r})
N = ld.info()["records"]
if {kind!r} == "dir":
    want = []
    for lo in range(0, N, 50000):
        want += [tree_number(p) for p, _ in ld.locate(range(lo, min(N, lo + 50000)))]
    check = lambda rec, i: check_tree(rec, want[i])
elif {kind!r} == "fixed":
    check = lambda rec, i: check_fixed(rec, i, 4096)
else:
    check = check_jsonl
seen = bytearray(N)
print("ready", flush=True)
sys.stdin.readline()
start = time.time(); n = bad = twice = 0
for b in ld:
    for k, i in enumerate(b.ids.tolist()):
        twice += seen[i]
        seen[i] = 1
        if not check(b.record(k), i):
            bad += 1
    n += b.n
    if {rate}:
        ahead = start + n / {rate} - time.time()
        if ahead > 0:
            time.sleep(ahead)
print(json.dumps({{"n": n, "s": time.time() - start, "bad": bad, "twice": twice, "never": seen.count(0)}}), flush=True)
"""

TORCH = """
import sys, os, time, json
import numpy as np, torch
class Records(torch.utils.data.Dataset):
    def __init__(self, path, size):
        self.path, self.size, self.fd = path, size, None
        self.n = os.path.getsize(path) // size
    def __len__(self):
        return self.n
    def __getitem__(self, i):
        if self.fd is None:
            self.fd = os.open(self.path, os.O_RDONLY)
        return np.frombuffer(os.pread(self.fd, self.size, i * self.size), np.uint8)
dl = torch.utils.data.DataLoader(Records({path!r}, {rs}), batch_size=256, shuffle=True, num_workers=2)
print("ready", flush=True)
sys.stdin.readline()
start = time.time(); n = 0
for b in dl:
    n += len(b)
    if {rate}:
        ahead = start + n / {rate} - time.time()
        if ahead > 0:
            time.sleep(ahead)
print(json.dumps({{"n": n, "s": time.time() - start}}), flush=True)
"""


def client(code: str, env: dict) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    line = p.stdout.readline()
    if line.strip() != "ready":
        raise SystemExit(f"a client did not start: {line}{p.communicate()[0]}")
    return p


def run_jobs(d: Daemon, codes: list[str], starts: list[float], dev: str, count_open: bool = False) -> dict:
    """Start clients at their offsets (all ready first), wait, and report.
    count_open drops the cache and starts counting before the clients open
    their jobs, so what the daemon reads ahead while they wait is counted."""
    if count_open:
        drop_caches()
        dev0, cpu0, own0 = read_bytes(dev), d.cpu(), process_read_bytes(d.proc.pid)
    procs = [client(c, d.env) for c in codes]
    watch = GroupWatch(d)
    if not count_open:
        drop_caches()
        dev0, cpu0, own0 = read_bytes(dev), d.cpu(), process_read_bytes(d.proc.pid)
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.time()
    for p, at in sorted(zip(procs, starts), key=lambda x: x[1]):
        time.sleep(max(0, t0 + at - time.time()))
        p.stdin.write("go\n")
        p.stdin.flush()
    res = []
    for p in procs:
        out, _ = p.communicate()
        if p.returncode != 0:
            raise SystemExit(f"a client failed: {out}")
        res.append(json.loads(out.strip().splitlines()[-1]))
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"wall": time.time() - t0, "device": read_bytes(dev) - dev0, "daemon_read": process_read_bytes(d.proc.pid) - own0,
            "jobs": res, "groups": watch.totals(),
            "daemon_cpu": d.cpu() - cpu0, "client_cpu": ru.ru_utime + ru.ru_stime - ru0.ru_utime - ru0.ru_stime}


def riffle_code(path, seed, share, rate=0, **kw) -> str:
    return RIFFLE.format(py=str(REPO / "python"), path=str(path), seed=seed, share=share, kw=kw, rate=rate)


def part_speeds(args) -> None:
    path = Path(args.dir) / "r4g.bin"
    rs = 4096
    make_file(path, parse_size("4GiB"), rs)
    n = path.stat().st_size // rs
    dev = device_of(path)
    rates = [args.rate * k for k in (1, 1, 2, 4)]
    starts = [0, 5, 10, 15]
    print(f"\nspeeds: {path} ({n} records of {rs} bytes), cold, daemon cgroup {args.memory}, cache {args.cache}; "
          f"rates {rates} samples/s, started {starts} s", flush=True)
    rows = []
    for mode in ("shared", "independent", "torch", "alone 4x"):
        if mode == "torch":
            codes = [TORCH.format(path=str(path), rs=rs, rate=r) for r in rates]
            d = Daemon(parse_size(args.memory), parse_size(args.cache))
            try:
                r = run_jobs(d, codes, starts, dev)
            finally:
                d.stop()
        else:
            d = Daemon(parse_size(args.memory), parse_size(args.cache))
            try:
                if mode == "alone 4x":
                    r = run_jobs(d, [riffle_code(path, 4, False, rates[3], record_size=rs)], [0], dev)
                else:
                    codes = [riffle_code(path, i, mode == "shared", rate, record_size=rs) for i, rate in enumerate(rates)]
                    r = run_jobs(d, codes, starts, dev)
            finally:
                d.stop()
        each = [j["n"] / j["s"] for j in r["jobs"]]
        want = rates if mode != "alone 4x" else rates[3:]
        rows.append((mode, r["wall"], r["device"] / (n * rs), each, [e / w for e, w in zip(each, want)]))
        print(f"  {mode:<12} wall {r['wall']:6.1f}s  device {r['device'] / 2**30:6.2f} GiB = {r['device'] / (n * rs):4.2f}x one epoch  "
              f"samples/s {' '.join(f'{e:7.0f}' for e in each)}  of target {' '.join(f'{e / w:4.2f}' for e, w in zip(each, want))}",
              flush=True)


def part_speeds_var(args, kind: str) -> None:
    """speeds over variable-size records: shared, independent, and the 4x job alone, in one run."""
    kw = {}
    if kind == "fixed":
        # The control: the fixed-size records of "speeds", at this scale.
        path = Path(args.dir) / f"r{args.jsonl_size}.bin"
        make_file(path, parse_size(args.jsonl_size), 4096)
        epoch = path.stat().st_size
        n, kw = epoch // 4096, {"record_size": 4096}
        what, base = f"{path} ({n} records of 4096 B)", args.jsonl_rate
    elif kind == "jsonl":
        path = Path(args.dir) / f"lines{args.jsonl_size}.jsonl"
        n = make_jsonl(path, parse_size(args.jsonl_size))
        epoch = path.stat().st_size
        what, base = f"{path} ({n} lines of 100 B to 8 KiB, mean {epoch / n:.0f} B)", args.jsonl_rate
    else:
        path = Path(args.dir) / f"tree{args.files}"
        epoch = make_tree(path, args.files)
        n = args.files
        what, base = f"{path} ({n} files of 1 to 64 KiB, mean {epoch / n:.0f} B)", args.files_rate
    # Daemon starts the daemon inside its cgroup, so it splits the limit
    # itself (server/budget.go) and keeps its Go heap's limit at what its
    # jobs' shared memory leaves.
    speeds_var(args, kind, path, n, epoch, what, base, kw)


def speeds_var(args, kind: str, path: Path, n: int, epoch: int, what: str, base: int, kw: dict) -> None:
    """part_speeds_var's runs over n records of epoch bytes in all at path."""
    dev = device_of(path)
    rates = [base * k for k in (1, 1, 2, 4)]
    starts = [0, 5, 10, 15]
    mem, cache = parse_size(args.var_memory), parse_size(args.var_cache)
    print(f"\nspeeds-{kind}: {what}, {epoch / 2**30:.2f} GiB, cold, daemon cgroup {args.var_memory}, "
          f"cache {args.var_cache}; rates {rates} samples/s, started {starts} s; "
          f"every record checked", flush=True)

    def code(seed, share, rate):
        return CHECKED.format(bench=str(REPO / "bench"), path=str(path), seed=seed, share=share, kind=kind, rate=rate, kw=kw)

    # Index the file first (riffle keeps the index in its cache directory),
    # so that what the runs count is reading records.
    d = Daemon(mem, cache)
    try:
        subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(REPO / 'python')!r}); import riffle; "
                        f"riffle.Loader({str(path)!r}, autostart=False, timeout=600, **{kw!r}).info()"], check=True, env=d.env)
    finally:
        d.stop()
    alone = None
    for mode in ("alone 4x", "shared", "independent"):
        if mode != "alone 4x" and mode not in args.modes.split(","):
            continue
        d = Daemon(mem, cache)
        try:
            if mode == "alone 4x":
                r = run_jobs(d, [code(4, False, rates[3])], [0], dev, count_open=True)
            else:
                r = run_jobs(d, [code(i, mode == "shared", rate) for i, rate in enumerate(rates)], starts, dev, count_open=True)
        finally:
            d.stop()
        each = [j["n"] / j["s"] for j in r["jobs"]]
        want = rates if mode != "alone 4x" else rates[3:]
        # The daemon's own reads (/proc/PID/io): the machine is shared, and
        # whatever else runs re-reads what the cache drop evicted, so the
        # whole device's count is shown too but is an upper bound.
        own = r["daemon_read"]
        if mode == "alone 4x":
            alone = (own, each[0])
        bad = sum(j["bad"] for j in r["jobs"])
        twice = sum(j["twice"] for j in r["jobs"])
        never = sum(j["never"] for j in r["jobs"])
        print(f"  {mode:<12} wall {r['wall']:6.1f}s  daemon read {own / 2**30:5.2f} GiB = {own / epoch:4.2f}x one epoch's bytes "
              f"= {own / alone[0]:4.2f}x the job alone's reads (whole device {r['device'] / epoch:4.2f}x)  samples/s "
              f"{' '.join(f'{e:7.0f}' for e in each)}  of target {' '.join(f'{e / w:4.2f}' for e, w in zip(each, want))}  "
              f"4x job of alone {each[-1] / alone[1]:4.2f}  records {sum(j['n'] for j in r['jobs'])}, "
              f"wrong {bad}, given twice {twice}, never given {never}", flush=True)
        if mode == "shared":
            g = r["groups"]
            print(f"{'':14}group: {g['rounds']} rounds gave {g['given']} records, {g['shared']} of them to several jobs at once, "
                  f"saving {g['saved']} reads (given counts what the jobs' next epochs were given before they closed); "
                  f"record cache: {g.get('cache_hits', 0)} hits, {g.get('cache_misses', 0)} misses, "
                  f"{g.get('cache_evictions', 0)} evictions", flush=True)


def part_overlap(args) -> None:
    path = Path(args.dir) / "r1g.bin"
    rs = 4096
    make_file(path, parse_size("1GiB"), rs)
    n = path.stat().st_size // rs
    dev = device_of(path)
    a, b = [[0, 3 * n // 4]], [[n // 4, n]]
    d = Daemon(parse_size(args.memory), parse_size(args.cache))
    try:
        r = run_jobs(d, [riffle_code(path, 1, True, subset={"ranges": a}, record_size=rs),
                         riffle_code(path, 2, True, subset={"ranges": b}, record_size=rs)], [0, 0], dev)
    finally:
        d.stop()
    g = r["groups"]
    union = n * rs
    share = g["shared"] / max(1, g["rounds"])
    print(f"\noverlap: two jobs over [0, 3N/4) and [N/4, N) of {n} records, shared, cold: device {r['device'] / 2**20:.0f} MiB "
          f"= {r['device'] / union:.3f}x |D1 u D2|; rounds {g['rounds']}, both given one record in {share:.3f} of them "
          f"(bound |I|/max = {0.5 / 0.75:.3f} at the first round)", flush=True)


def part_decode(args) -> None:
    root = Path(args.dir) / "jpegs"
    make_jpegs(root, args.images)
    dev = device_of(root)
    tf = "image:size=256,crop=224"
    print(f"\ndecode: {args.images} JPEGs (about 500x375, q90), transform {tf}, cold", flush=True)
    for k in (1, 4):
        d = Daemon()
        try:
            r = run_jobs(d, [riffle_code(root, i, True, transform=tf) for i in range(k)], [0] * k, dev)
        finally:
            d.stop()
        total = r["daemon_cpu"] + r["client_cpu"]
        print(f"  {k} job{'s' if k > 1 else ' '} shared: wall {r['wall']:6.1f}s  CPU {total:6.1f}s "
              f"(daemon {r['daemon_cpu']:.1f}s, clients {r['client_cpu']:.1f}s)", flush=True)


def part_joader(args) -> None:
    root = Path(args.dir) / "jpegs"
    make_jpegs(root, args.images)
    dev = device_of(root)
    tf = "image:size=256,crop=224"
    print(f"\njoader: k jobs decoding {args.images} JPEGs at once, one epoch each, cold", flush=True)
    for k in (2, 4, 6):
        line = f"  {k} jobs:"
        times = {}
        for share in (True, False):
            d = Daemon()
            try:
                r = run_jobs(d, [riffle_code(root, i, share, transform=tf) for i in range(k)], [0] * k, dev)
            finally:
                d.stop()
            times[share] = r["wall"]
            line += f"  {'shared' if share else 'independent'} {r['wall']:6.1f}s"
        print(line + f"  shared / independent {times[True] / times[False]:.2f}x", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="/var/tmp/riffle-bench")
    ap.add_argument("--parts", default="speeds,overlap,decode,joader")
    ap.add_argument("--rate", type=int, default=8000, help="the 1x job's samples/s")
    ap.add_argument("--memory", default="3GiB", help="the daemon's cgroup memory limit")
    ap.add_argument("--cache", default="2GiB", help="the daemon's record cache")
    ap.add_argument("--images", type=int, default=2000)
    ap.add_argument("--jsonl-size", default="1.5GiB", help="speeds-jsonl: the JSONL file's size")
    ap.add_argument("--jsonl-rate", type=int, default=6000, help="speeds-jsonl: the 1x job's samples/s")
    ap.add_argument("--files", type=int, default=48000, help="speeds-dir: files in the tree")
    ap.add_argument("--files-rate", type=int, default=750, help="speeds-dir: the 1x job's samples/s")
    ap.add_argument("--var-memory", default="1.125GiB", help="speeds-jsonl, speeds-dir: the daemon's cgroup memory limit")
    ap.add_argument("--var-cache", default="768MiB", help="speeds-jsonl, speeds-dir: the daemon's record cache")
    ap.add_argument("--modes", default="shared,independent",
                    help="speeds-jsonl, speeds-dir: which runs beside the 4x job alone (the baseline)")
    args = ap.parse_args()
    subprocess.run(["make", "-C", str(REPO), "build"], check=True, stdout=subprocess.DEVNULL)
    for part in args.parts.split(","):
        {"speeds": part_speeds, "overlap": part_overlap, "decode": part_decode, "joader": part_joader,
         "speeds-jsonl": lambda a: part_speeds_var(a, "jsonl"),
         "speeds-dir": lambda a: part_speeds_var(a, "dir"), "speeds-fixed": lambda a: part_speeds_var(a, "fixed")}[part](args)


if __name__ == "__main__":
    main()
