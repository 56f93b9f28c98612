#!/usr/bin/python3
"""riffle.torch against riffle's Go loader in process, warm, in one run.

The question (issue 27, part 2): how much of the rate a Go program gets by
running a job in its own process does a PyTorch training loop get through
the daemon? For each dataset the same job (the spec riffle.torch sends,
given to bench/goload as it is) is measured, interleaved and repeated:

* Go: ``bench/goload``, the job in process, each batch taken and released;
* riffle.torch with ``num_workers=0``: the main process's client;
* riffle.torch with ``num_workers=2`` (persistent workers): batches cross
  DataLoader's worker hop.

Datasets: fixed 4 KiB records (batch 256, and 1024), and a directory of small JPEGs
through the daemon's ``image:size=256,crop=224`` transform (batch 64;
150 KB outputs). Every measurement is warm: the files are read into the
page cache right before it. Each reports samples/s, the ratio to the Go
run of its round, and CPU per batch: the Go process's; the daemon's
(/proc/PID/stat) and the Python processes' (main and workers) for
riffle.torch. Prints a Markdown table; BENCHMARKS.md records one.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python"))

import torch  # noqa: E402

import riffle.torch as rt  # noqa: E402
from riffle.client import Loader, wait_for_socket  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def proc_cpu(pid: int) -> float:
    """CPU seconds (user + system) process pid has used."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def make_records(path: Path, size: int, total: int) -> None:
    """Fixed-size records, each starting with its id (little-endian uint64)."""
    if path.exists() and path.stat().st_size == total // size * size:
        return
    n, per = total // size, (64 << 20) // size
    with open(path, "wb") as f:
        for lo in range(0, n, per):
            k = min(per, n - lo)
            block = np.zeros((k, size), np.uint8)
            block[:, :8] = np.arange(lo, lo + k, dtype="<u8").view(np.uint8).reshape(k, 8)
            f.write(block.tobytes())


def make_jpegs(root: Path, n: int, classes: int = 10) -> None:
    """Small JPEGs (about 320x256, quality 85) of smooth colour and noise, in class folders."""
    if root.exists() and sum(1 for _ in root.rglob("*.jpg")) == n:
        return
    from PIL import Image
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:256, 0:320]
    for i in range(n):
        d = root / f"c{i % classes:02d}"
        d.mkdir(parents=True, exist_ok=True)
        fx, fy, ph = rng.uniform(0.01, 0.08, 3)
        base = 128 + 60 * np.sin(xx * fx + ph) * np.cos(yy * fy)
        img = np.stack([base, base * rng.uniform(0.6, 1), 255 - base], -1) + rng.integers(-20, 20, (256, 320, 3))
        Image.fromarray(img.clip(0, 255).astype(np.uint8)).save(d / f"{i:06d}.jpg", quality=85)


def warm(path: Path) -> None:
    """Read path (a file, or every file under a directory) into the page cache."""
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    for p in files:
        with open(p, "rb") as f:
            while f.read(1 << 24):
                pass


def go_run(goload: str, spec: dict, seconds: float, skip: int, index_dir: str, arena: bool) -> dict:
    out = subprocess.run([goload, "-spec", json.dumps(spec), "-seconds", str(seconds), "-skip", str(skip),
                          "-index-dir", index_dir] + (["-arena"] if arena else []),
                         check=True, capture_output=True, text=True).stdout
    r = json.loads(out)
    return {"rate": r["records"] / r["seconds"], "cpu_go": r["cpu_seconds"] / r["batches"]}


def py_run(make, workers: int, seconds: float, skip: int, daemon: int) -> dict:
    """riffle.torch over epochs until seconds have passed after skip batches."""
    dl = make(workers)
    it, n, nb, pids = None, 0, 0, []
    t0 = c0 = d0 = w0 = None

    def epochs():
        nonlocal it
        while True:
            it = iter(dl)
            yield from it

    for i, b in enumerate(epochs()):
        if i == skip:
            pids = [w.pid for w in getattr(getattr(dl, "_iterator", None), "_workers", None) or []]
            t0, c0, d0 = time.monotonic(), time.process_time(), proc_cpu(daemon)
            w0 = sum(proc_cpu(p) for p in pids)
        elif i > skip:
            x = b[0] if isinstance(b, (tuple, list)) else b
            n += x.shape[0]
            nb += 1
            if time.monotonic() - t0 >= seconds:
                break
    dt = time.monotonic() - t0
    out = {"rate": n / dt, "cpu_py": (time.process_time() - c0) / nb, "cpu_daemon": (proc_cpu(daemon) - d0) / nb,
           "cpu_workers": (sum(proc_cpu(p) for p in pids) - w0) / nb}
    del b
    it._shutdown_workers() if hasattr(it, "_shutdown_workers") else None
    return out


def breakdown(make, seconds: float, skip: int) -> dict[str, float]:
    """The main process's CPU per batch (thread time, so waiting costs nothing) by step, with 0 workers:
    receiving replies, making Batch objects, converting them to tensors, sending requests, and the rest
    (DataLoader, generators, giving batches back)."""
    import riffle.client as rc
    acc: dict[str, int] = {}
    saved = []

    def wrap(cls, name, label):
        f = getattr(cls, name)

        def timed(*args, **kw):
            t = time.thread_time_ns()
            try:
                return f(*args, **kw)
            finally:
                acc[label] = acc.get(label, 0) + time.thread_time_ns() - t
        saved.append((cls, name, f))
        setattr(cls, name, timed)

    wrap(rc.Connection, "receive", "receive (recvmsg, JSON)")
    wrap(rc.Loader, "_batch_from", "Batch from shared memory")
    wrap(rt.RiffleDataset, "_convert", "tensor")
    wrap(rc.Connection, "send_many", "send (requests, releases)")
    try:
        dl = make(0)
        it = (b for _ in iter(int, 1) for b in dl)
        for _ in range(skip):
            next(it)
        acc.clear()
        nb, t0, w0 = 0, time.thread_time_ns(), time.monotonic()
        while time.monotonic() - w0 < seconds:
            b = next(it)
            nb += 1
            del b
        total = time.thread_time_ns() - t0
    finally:
        for cls, name, f in saved:
            setattr(cls, name, f)
    out = {k: v / nb / 1e3 for k, v in acc.items()}
    out["rest (DataLoader, generators, give-backs)"] = (total - sum(acc.values())) / nb / 1e3
    out["total"] = total / nb / 1e3
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default="/var/tmp/riffle-torch-go")
    ap.add_argument("--file-bytes", type=float, default=2**30, help="bytes of 4 KiB records")
    ap.add_argument("--images", type=int, default=1000, help="small JPEGs")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--rows", default="4k,4k:1024,images", help="4k[:BATCH] (default batch 256), images")
    ap.add_argument("--bin", default=os.environ.get("RIFFLE_BIN", str(REPO / "bin" / "riffle")))
    ap.add_argument("--goload", default="", help="a built bench/goload (default: built from this tree)")
    a = ap.parse_args()
    root = Path(a.dir)
    root.mkdir(parents=True, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="riffle-torch-go-")
    os.chmod(tmp, 0o700)
    goload = a.goload
    if not goload:
        goload = os.path.join(tmp, "goload")
        subprocess.run(["go", "build", "-o", goload, "./bench/goload"], cwd=REPO, check=True)
    sock = os.path.join(tmp, "riffle.sock")
    os.environ["RIFFLE_SOCKET"] = sock
    daemon = subprocess.Popen([a.bin, "serve", "--socket", sock, "--quiet", "--idle-exit", "0"],
                              stdout=subprocess.DEVNULL, stderr=open(sock + ".log", "wb"))
    if not wait_for_socket(sock, 30) or daemon.poll() is not None:
        raise SystemExit(f"the daemon did not start (see {sock}.log)")
    index_dir = os.path.join(tmp, "index")
    try:
        rows = []
        for row in a.rows.split(","):
            if row.split(":")[0] == "4k":
                path = root / "r4k.bin"
                make_records(path, 4096, int(a.file_bytes))
                batch = int(row.split(":")[1]) if ":" in row else 256
                kw, skip = {"record_size": 4096}, 20
                label = f"4 KiB records, batch {batch}"
            elif row == "images":
                path = root / "jpegs"
                make_jpegs(path, a.images)
                batch, kw, skip = 64, {"transform": "image:size=256,crop=224"}, 2 * (a.images // 64 + 1)
                label = f"{a.images} small JPEGs, image:size=256,crop=224, batch 64"
            else:
                raise SystemExit(f"--rows: unknown row {row!r}")

            def make(workers: int, path=path, batch=batch, kw=kw):
                extra = {"num_workers": workers, "persistent_workers": True} if workers else {}
                return rt.loader(str(path), batch, seed=1, **kw, **extra)

            # The job riffle.torch opens, as goload takes it: every epoch, from the first.
            spec, _ = Loader(str(path), batch, seed=1, **kw)._at(0)
            spec.update(epoch=0, batch=0, epochs=-1)
            res: dict[str, list[dict]] = {"go": [], "w0": [], "w2": [], "arena": []}
            for _ in range(a.rounds):
                for name in ("go", "w0", "w2", "arena"):
                    warm(path)
                    if name in ("go", "arena"):
                        res[name].append(go_run(goload, spec, a.seconds, skip, index_dir, name == "arena"))
                    else:
                        res[name].append(py_run(make, int(name[1:]), a.seconds, skip, daemon.pid))
                print(f"{label}: round done", file=sys.stderr, flush=True)
            if row == "4k":
                warm(path)
                res["breakdown"] = [breakdown(make, a.seconds, skip)]
            rows.append((label, res))
        report(rows)
    finally:
        daemon.terminate()
        daemon.wait()


def report(rows) -> None:
    print("| data | Go in process | riffle.torch w=0 | / Go | riffle.torch w=2 | / Go | Go, batches in shared memory | w=0 / it | w=2 / it |")
    print("|---|---|---|---|---|---|---|---|---|")
    for label, res in rows:
        def med(name, key):
            return statistics.median(r[key] for r in res[name])

        def ratios(name, against="go"):
            rs = [p["rate"] / g["rate"] for p, g in zip(res[name], res[against])]
            return f"{statistics.median(rs):.0%} ({min(rs):.0%}-{max(rs):.0%})"
        print(f"| {label} | {med('go', 'rate'):,.0f} | {med('w0', 'rate'):,.0f} | {ratios('w0')} | "
              f"{med('w2', 'rate'):,.0f} | {ratios('w2')} | {med('arena', 'rate'):,.0f} | {ratios('w0', 'arena')} | "
              f"{ratios('w2', 'arena')} |", flush=True)
    print()
    print("CPU per batch, µs (medians): Go in process | Go, shared memory | w=0: daemon + Python | "
          "w=2: daemon + main + workers")
    print()
    us = lambda x: f"{x * 1e6:,.0f}"  # noqa: E731
    for label, res in rows:
        def med(name, key):
            return statistics.median(r[key] for r in res[name])
        print(f"* {label}: {us(med('go', 'cpu_go'))} | {us(med('arena', 'cpu_go'))} | "
              f"{us(med('w0', 'cpu_daemon'))} + {us(med('w0', 'cpu_py'))} | "
              f"{us(med('w2', 'cpu_daemon'))} + {us(med('w2', 'cpu_py'))} + {us(med('w2', 'cpu_workers'))}")
        if res.get("breakdown"):
            print("  * the main process's CPU per batch by step, 0 workers, µs: "
                  + ", ".join(f"{k} {v:.0f}" for k, v in res["breakdown"][0].items()))


if __name__ == "__main__":
    main()
