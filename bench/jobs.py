"""Several jobs on one file through one daemon in a memory cgroup, cold.

Runs N jobs (real Python clients, one epoch each of a global shuffle) at
once and one after another, against a daemon whose memory cgroup (v1)
cannot hold the file, and reports per run: wall time, device MB/s, reads in
flight at the device and in the daemon's io_uring rings, the cgroup's
failcnt, and how many seconds ran below half the peak rate (the "slow
phase" of issue 17). The page cache is dropped before each run.

    sudo /usr/bin/python3 bench/jobs.py --file /var/tmp/riffle-bench/r3g.bin --size 3GiB --memory 1GiB --jobs 1,4
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DIRECT = False
sys.path.insert(0, str(REPO / "python"))

import numpy as np  # noqa: E402

from common import device_of, make_file, parse_size  # noqa: E402

CLIENT = """
import sys, time
sys.path.insert(0, {py!r})
import riffle
ld = riffle.Loader({path!r}, batch_size=256, record_size={rs}, seed={seed}, autostart=False, timeout=120, **{extra})
start = time.time()
n = 0
for b in ld:
    n += b.n
print(n, time.time() - start, flush=True)
"""


def read_sectors(dev: str) -> int:
    return int(open(f"/sys/block/{dev}/stat").read().split()[2])


def inflight(dev: str) -> int:
    return int(open(f"/sys/block/{dev}/inflight").read().split()[0])


def ring_inflight(pid: int) -> int:
    """Reads submitted and not yet completed in the daemon's io_uring rings."""
    total = 0
    for fd in glob.glob(f"/proc/{pid}/fd/*"):
        try:
            if "io_uring" not in os.readlink(fd):
                continue
            info = open(f"/proc/{pid}/fdinfo/{os.path.basename(fd)}").read()
        except OSError:
            continue
        v = {k: int(x) for k, x in re.findall(r"^(SqTail|CqHead|CqTail|SqHead):\s*(\d+)", info, re.M)}
        if v:
            total += (v.get("SqTail", 0) - v.get("CqTail", 0)) & 0xFFFFFFFF
    return total


class Monitor(threading.Thread):
    def __init__(self, dev: str, pid: int, cg: Path):
        super().__init__(daemon=True)
        self.dev, self.pid, self.cg = dev, pid, cg
        self.samples: list[tuple[float, int, int]] = []  # MB/s, device in flight, ring in flight
        self.stop = threading.Event()

    def run(self) -> None:
        last = read_sectors(self.dev)
        t0 = time.time()
        while not self.stop.wait(0.25):
            flights, rings = [], []
            for _ in range(4):
                flights.append(inflight(self.dev))
                rings.append(ring_inflight(self.pid))
                time.sleep(0.05)
            now = read_sectors(self.dev)
            t1 = time.time()
            self.samples.append(((now - last) * 512 / (t1 - t0) / 1e6, int(np.mean(flights)), int(np.mean(rings))))
            last, t0 = now, t1


def drop_caches() -> None:
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def run(jobs: int, together: bool, path: Path, rs: int, sock: str, dev: str, pid: int, cg: Path, py: str) -> dict:
    drop_caches()
    failcnt0 = int((cg / "memory.failcnt").read_text())
    mon = Monitor(dev, pid, cg)
    sectors0 = read_sectors(dev)
    start = time.time()
    mon.start()
    env = dict(os.environ, RIFFLE_SOCKET=sock)
    extra = {"direct": True} if DIRECT else {}
    code = lambda i: CLIENT.format(py=py, path=str(path), rs=rs, seed=i, extra=extra)  # noqa: E731
    times = []
    if together:
        procs = [subprocess.Popen([sys.executable, "-c", code(i)], stdout=subprocess.PIPE, text=True, env=env)
                 for i in range(jobs)]
        for p in procs:
            out, _ = p.communicate()
            times.append(float(out.split()[1]))
    else:
        for i in range(jobs):
            out = subprocess.run([sys.executable, "-c", code(i)], stdout=subprocess.PIPE, text=True, env=env,
                                 check=True).stdout
            times.append(float(out.split()[1]))
    wall = time.time() - start
    mon.stop.set()
    mon.join()
    mbs = [s[0] for s in mon.samples]
    peak = max(mbs) if mbs else 0
    return {
        "jobs": jobs, "mode": "together" if together else "one after another", "wall": wall,
        "job_times": times, "device_mb": (read_sectors(dev) - sectors0) * 512 / 1e6,
        "mb_s": statistics.mean(mbs) if mbs else 0, "peak": peak,
        "slow_s": sum(0.45 for m in mbs if m < peak / 2),
        "dev_inflight": statistics.mean(s[1] for s in mon.samples) if mon.samples else 0,
        "ring_inflight": statistics.mean(s[2] for s in mon.samples) if mon.samples else 0,
        "failcnt": int((cg / "memory.failcnt").read_text()) - failcnt0,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--file", default="/var/tmp/riffle-bench/r3g.bin")
    ap.add_argument("--size", default="3GiB")
    ap.add_argument("--record-size", type=int, default=4096)
    ap.add_argument("--memory", default="1GiB", help="the daemon's cgroup memory limit")
    ap.add_argument("--jobs", default="1,4")
    ap.add_argument("--bin", default=str(REPO / "bin" / "riffle"))
    ap.add_argument("--direct", action="store_true", help="jobs read with O_DIRECT")
    ap.add_argument("--python", default=str(REPO / "python"), help="the client package to run (another checkout's, to compare)")
    args = ap.parse_args()
    global DIRECT
    DIRECT = args.direct
    path = Path(args.file)
    make_file(path, parse_size(args.size), args.record_size)
    dev = device_of(path)
    cg = Path("/sys/fs/cgroup/memory/riffle-bench")
    cg.mkdir(exist_ok=True)
    (cg / "memory.limit_in_bytes").write_text(str(parse_size(args.memory)))
    run_dir = Path("/tmp/riffle-bench-run")
    run_dir.mkdir(mode=0o700, exist_ok=True)
    os.chmod(run_dir, 0o700)
    sock = str(run_dir / "riffle.sock")
    # Into the cgroup before it starts: the daemon reads its limit at start.
    d = subprocess.Popen(["sh", "-c", 'echo $$ > "$0" && exec "$@"', str(cg / "cgroup.procs"),
                          args.bin, "serve", "--socket", sock, "--quiet"])
    from riffle import client
    client.wait_for_socket(sock, 20)
    results = []
    try:
        for n in [int(x) for x in args.jobs.split(",")]:
            results.append(run(n, True, path, args.record_size, sock, dev, d.pid, cg, args.python))
            if n > 1:
                results.append(run(n, False, path, args.record_size, sock, dev, d.pid, cg, args.python))
    finally:
        d.kill()
        d.wait()
    print(f"\n{path} ({path.stat().st_size / 2**30:.1f} GiB, {args.record_size}-byte records), daemon cgroup {args.memory}, cold"
          + (", O_DIRECT" if DIRECT else ""))
    print(f"{'jobs':>4} {'mode':<19} {'wall s':>7} {'job s (each)':<28} {'dev MB':>8} {'MB/s':>6} {'peak':>6} "
          f"{'slow s':>6} {'dev q':>5} {'ring q':>6} {'failcnt':>9}")
    for r in results:
        each = " ".join(f"{t:.1f}" for t in r["job_times"])
        print(f"{r['jobs']:>4} {r['mode']:<19} {r['wall']:>7.1f} {each:<28} {r['device_mb']:>8.0f} {r['mb_s']:>6.0f} "
              f"{r['peak']:>6.0f} {r['slow_s']:>6.1f} {r['dev_inflight']:>5.0f} {r['ring_inflight']:>6.0f} {r['failcnt']:>9}")
    by = {(r["jobs"], r["mode"]): r for r in results}
    for n in {r["jobs"] for r in results if r["jobs"] > 1}:
        t, s = by.get((n, "together")), by.get((n, "one after another"))
        if t and s:
            print(f"{n} jobs together / one after another, wall: {t['wall'] / s['wall']:.2f}x")


if __name__ == "__main__":
    main()
