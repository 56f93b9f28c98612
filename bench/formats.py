"""Formats people already have (issue 13), each loader on the same files in
the same run, cold (page cache dropped) and warm:

  hf       Rinas's experiment: a Hugging Face dataset of text and an int
           label made with `datasets` (save_to_disk, several shards).
           riffle's global shuffle against load_from_disk().shuffle() +
           DataLoader, with_format("torch") + DataLoader(shuffle=True),
           and sequential scans (riffle's, pyarrow's).
  parquet  the same rows as Parquet (snappy, row groups of 100k): riffle's
           page-block order and its global shuffle against pyarrow reading
           row groups in a shuffled order.
  wds      the same rows as WebDataset tar shards: riffle's global shuffle
           against webdataset's shard shuffle and shuffle buffer; samples/s
           and how random each delivered order is (riffle quality --ids).

Each loader runs in its own process for at most --seconds (or one epoch),
touching every sample; samples/s is samples over wall time. Three runs
each: cold (page cache dropped), warm, and limited (cold, with the loader
and the daemon in a --memory cgroup smaller than the data: the regime
riffle is for). riffle's one-time index scan is done, and timed, first.

    sudo .venv/bin/python bench/formats.py --parts hf,parquet,wds
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from common import REPO, Daemon, device_of, drop_caches, parse_size, read_bytes

PY = sys.executable

MAKE = """
import datasets, random, sys
n, out = int(sys.argv[1]), sys.argv[2]
words = [w.strip() for w in open("/usr/share/dict/words")] if False else ["w%d" % i for i in range(5000)]
def gen():
    r = random.Random(0)
    for i in range(n):
        k = r.randint(100, 400)
        yield {"text": " ".join(r.choice(words) for _ in range(k)), "label": r.randint(0, 9), "idx": i}
ds = datasets.Dataset.from_generator(gen, features=datasets.Features({"text": datasets.Value("string"),
     "label": datasets.Value("int64"), "idx": datasets.Value("int64")}))
ds.save_to_disk(out, num_shards=8)
"""

RUNNERS = {
    "riffle": """
import riffle, time, sys, json
ld = riffle.Loader({path!r}, batch_size=256, seed=0, columns=["text", "label", "idx"], timeout=600, **{kw!r})
t0 = time.time(); n = 0; first = None; ids = []
for b in ld:
    rb = b.data
    n += rb.num_rows
    ids += rb.column(2).to_pylist()
    if first is None: first = time.time() - t0
    if time.time() - t0 > {secs}: break
print(json.dumps({{"n": n, "s": time.time() - t0, "first": first, "ids": ids if {keep} else None}}))
""",
    "hf_shuffle": """
import datasets, torch, time, json
ds = datasets.load_from_disk({path!r}).shuffle(seed=0)
dl = torch.utils.data.DataLoader(ds, batch_size=256, num_workers=2, collate_fn=lambda b: b)
t0 = time.time(); n = 0; first = None; ids = []
for b in dl:
    n += len(b); ids += [r["idx"] for r in b]
    if first is None: first = time.time() - t0
    if time.time() - t0 > {secs}: break
print(json.dumps({{"n": n, "s": time.time() - t0, "first": first, "ids": ids if {keep} else None}}))
""",
    "hf_torch": """
import datasets, torch, time, json
ds = datasets.load_from_disk({path!r}).with_format("torch")
dl = torch.utils.data.DataLoader(ds, batch_size=256, shuffle=True, num_workers=2)
t0 = time.time(); n = 0; first = None; ids = []
for b in dl:
    n += len(b["label"]); ids += b["idx"].tolist()
    if first is None: first = time.time() - t0
    if time.time() - t0 > {secs}: break
print(json.dumps({{"n": n, "s": time.time() - t0, "first": first, "ids": ids if {keep} else None}}))
""",
    "pyarrow_scan": """
import pyarrow as pa, glob, time, json
t0 = time.time(); n = 0; first = None
for f in sorted(glob.glob({path!r} + "/data-*.arrow")):
    with pa.memory_map(f) as m:
        for b in pa.ipc.open_stream(m):
            n += b.num_rows
            b.column(0).buffers()[2].to_pybytes()[:1]
            if first is None: first = time.time() - t0
    if time.time() - t0 > {secs}: break
print(json.dumps({{"n": n, "s": time.time() - t0, "first": first, "ids": None}}))
""",
    "pyarrow_rowgroups": """
import pyarrow.parquet as pq, numpy as np, time, json
pf = pq.ParquetFile({path!r})
rng = np.random.default_rng(0)
t0 = time.time(); n = 0; first = None; ids = []
for g in rng.permutation(pf.num_row_groups):
    t = pf.read_row_group(int(g))
    perm = rng.permutation(t.num_rows)
    for lo in range(0, t.num_rows, 256):
        b = t.take(perm[lo:lo + 256])
        n += b.num_rows; ids += b.column("idx").to_pylist()
        if first is None: first = time.time() - t0
    if time.time() - t0 > {secs}: break
print(json.dumps({{"n": n, "s": time.time() - t0, "first": first, "ids": ids if {keep} else None}}))
""",
    "webdataset": """
import webdataset as wds, torch, glob, time, json
urls = sorted(glob.glob({path!r} + "/*.tar"))
ds = wds.WebDataset(urls, shardshuffle=len(urls), empty_check=False).shuffle(1000).batched(256, collation_fn=lambda b: b)
dl = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)
t0 = time.time(); n = 0; first = None; ids = []
for b in dl:
    n += len(b); ids += [int(s["__key__"]) for s in b]
    if first is None: first = time.time() - t0
    if time.time() - t0 > {secs}: break
print(json.dumps({{"n": n, "s": time.time() - t0, "first": first, "ids": ids if {keep} else None}}))
""",
    "riffle_tar": """
import riffle, time, json
ld = riffle.Loader({path!r} + "/*.tar", batch_size=256, seed=0, timeout=600)
t0 = time.time(); n = 0; first = None; ids = []
for b in ld:
    for s in b.data:
        ids.append(int(s["__key__"]))
    n += b.n
    if first is None: first = time.time() - t0
    if time.time() - t0 > {secs}: break
print(json.dumps({{"n": n, "s": time.time() - t0, "first": first, "ids": ids if {keep} else None}}))
""",
}


CGROUP = Path("/sys/fs/cgroup/memory/riffle-formats")


def limit(pid: int, size: int | None) -> None:
    """Put a process (and the children it starts) in the memory cgroup, or
    take it out (size None)."""
    if size is None:
        Path("/sys/fs/cgroup/memory/cgroup.procs").write_text(str(pid))
        return
    CGROUP.mkdir(exist_ok=True)
    (CGROUP / "memory.limit_in_bytes").write_text(str(size))
    (CGROUP / "cgroup.procs").write_text(str(pid))


def run(name: str, path: str, args, mode: str, env: dict, kw: dict | None = None, keep: bool = False) -> dict:
    """One loader's run: cold (page cache dropped), warm, or limited (cold,
    the loader and the daemon in a memory cgroup smaller than the data)."""
    if mode in ("cold", "limited"):
        drop_caches()
    size = parse_size(args.memory) if mode == "limited" else None
    limit(args.daemon.proc.pid, size)
    dev = device_of(Path(path))
    before = read_bytes(dev)
    code = RUNNERS[name].format(path=path, secs=args.seconds, keep=keep, kw=kw or {})
    t0 = time.time()
    p = subprocess.Popen([PY, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    if size:
        limit(p.pid, size)
    out, err = p.communicate(timeout=3600)
    limit(args.daemon.proc.pid, None)
    if p.returncode != 0:
        raise SystemExit(f"{name} failed:\n{err[-3000:]}")
    r = json.loads(out.strip().splitlines()[-1])
    r["wall"] = time.time() - t0
    r["device"] = read_bytes(dev) - before
    return r


def index_first(path: str, env: dict, kw: dict | None = None) -> float:
    """Opens the data through the daemon once, so that its one-time index
    scan is not in the runs; returns how long that took."""
    code = f"import riffle, time; t = time.time(); riffle.Loader({path!r}, batch_size=256, timeout=3600, **{kw or {}!r}).info(); print(time.time() - t)"
    return float(subprocess.run([PY, "-c", code], capture_output=True, text=True, env=env, check=True).stdout.split()[-1])


def quality(ids: list[int], n: int, batch: int = 256) -> str:
    """riffle quality --ids over the delivered order (one epoch's worth)."""
    if not ids or len(ids) != n:
        return "-"
    p = Path("/tmp/riffle-bench-ids.txt")
    p.write_text(" ".join(map(str, ids)) + "\n")
    out = subprocess.run([str(REPO / "bin" / "riffle"), "quality", "--ids", str(p), "--batch-size", str(batch)],
                         capture_output=True, text=True, check=True).stdout
    nb = [l for l in out.splitlines() if l.startswith("neighbours")][0].split()[-1]
    ds = [l for l in out.splitlines() if l.startswith("displacement")][0].split()[-1]
    return f"neighbours {nb}, displacement {ds}"


MODES = ("cold", "warm", "limited")


def measure(label: str, name: str, path: str, args, env: dict, kw: dict | None = None) -> tuple:
    return (label, *[run(name, path, args, m, env, kw) for m in MODES])


def table(title: str, rows: list[tuple], record_bytes: float, memory: str) -> None:
    print(f"\n{title}; limited: loader and daemon in a {memory} memory cgroup, cold")
    print(f"  {'loader':<38} {'cold':>9} {'warm':>9} {'limited':>9}  samples/s   {'device/record bytes cold, limited':>33} {'first batch cold':>17}")
    for name, c, w, l in rows:
        ratio = c["device"] / max(1, c["n"] * record_bytes)
        lratio = l["device"] / max(1, l["n"] * record_bytes)
        print(f"  {name:<38} {c['n'] / c['s']:>9.0f} {w['n'] / w['s']:>9.0f} {l['n'] / l['s']:>9.0f}  {'':10} {ratio:>16.2f} {lratio:>16.2f} {c['first'] or 0:>16.2f}s", flush=True)


def part_hf(args, env) -> None:
    path = Path(args.dir) / "hf"
    if not (path / "state.json").exists():
        print(f"making {args.rows} rows with datasets into {path}", flush=True)
        subprocess.run([PY, "-c", MAKE, str(args.rows), str(path)], check=True, env=env, capture_output=True)
    size = sum(f.stat().st_size for f in path.glob("*.arrow"))
    rb = size / args.rows
    print(f"\nhf: {path}, {args.rows} rows, {size / 2**30:.2f} GiB in {len(list(path.glob('*.arrow')))} stream files, {args.seconds}s per run", flush=True)
    t = index_first(str(path), env, {"columns": ["text", "label", "idx"]})
    print(f"  riffle's index of the stream files (one scan of message headers and offsets, once): {t:.1f}s", flush=True)
    rows = []
    for label, name, kw in [("riffle global shuffle", "riffle", {}), ("HF load_from_disk().shuffle()", "hf_shuffle", None),
                            ("HF with_format(torch), shuffle=True", "hf_torch", None),
                            ("riffle sequential", "riffle", {"shuffle": False}), ("pyarrow sequential scan", "pyarrow_scan", None)]:
        rows.append(measure(label, name, str(path), args, env, kw))
    table("hf: samples/s (text ~1.5 KiB + label)", rows, rb, args.memory)


def part_parquet(args, env) -> None:
    src = Path(args.dir) / "hf"
    path = Path(args.dir) / "rows.parquet"
    if not path.exists():
        code = f"""
import pyarrow as pa, pyarrow.parquet as pq, glob
w = None
for f in sorted(glob.glob({str(src)!r} + "/data-*.arrow")):
    with pa.memory_map(f) as m:
        t = pa.ipc.open_stream(m).read_all()
    if w is None: w = pq.ParquetWriter({str(path)!r}, t.schema, compression="snappy")
    w.write_table(t, row_group_size=100000)
w.close()
"""
        subprocess.run([PY, "-c", code], check=True, env=env)
    rb = path.stat().st_size / args.rows
    print(f"\nparquet: {path}, {path.stat().st_size / 2**30:.2f} GiB, {args.seconds}s per run", flush=True)
    t = index_first(str(path), env, {"columns": ["text", "label", "idx"]})
    print(f"  riffle's index of the file (one scan, decoding every page once): {t:.1f}s", flush=True)
    rows = []
    for label, name, kw in [("riffle page blocks (default)", "riffle", {}), ("riffle global shuffle", "riffle", {"sampler": "global"}),
                            ("pyarrow row groups shuffled", "pyarrow_rowgroups", None)]:
        rows.append(measure(label, name, str(path), args, env, kw))
    table("parquet: samples/s", rows, rb, args.memory)


def part_wds(args, env) -> None:
    src = Path(args.dir) / "hf"
    path = Path(args.dir) / "wds"
    if not path.exists():
        path.mkdir()
        code = f"""
import pyarrow as pa, glob, webdataset as wds
k = 0; shard = 0; w = None
for f in sorted(glob.glob({str(src)!r} + "/data-*.arrow")):
    with pa.memory_map(f) as m:
        for b in pa.ipc.open_stream(m):
            for r in b.to_pylist():
                if w is None or k % {args.rows // 16} == 0:
                    if w: w.close()
                    w = wds.TarWriter({str(path)!r} + "/shard-%04d.tar" % shard); shard += 1
                w.write({{"__key__": "%09d" % r["idx"], "txt": r["text"], "cls": str(r["label"])}})
                k += 1
w.close()
"""
        subprocess.run([PY, "-c", code], check=True, env=env)
    size = sum(f.stat().st_size for f in path.glob("*.tar"))
    rb = size / args.rows
    print(f"\nwds: {path}, {size / 2**30:.2f} GiB in 16 shards; randomness of one whole epoch each (warm)", flush=True)
    t = index_first(str(path) + "/*.tar", env)
    print(f"  riffle's index of the shards (one scan of the tar headers, once): {t:.1f}s", flush=True)
    rows = []
    quals = {}
    for label, name in [("riffle global shuffle", "riffle_tar"), ("webdataset shard shuffle + buffer 1000", "webdataset")]:
        rows.append(measure(label, name, str(path), args, env))
        whole = argparse.Namespace(**dict(vars(args), seconds=10**6))
        q = run(name, str(path), whole, "warm", env, keep=True)
        quals[label] = quality(q["ids"], args.rows)
    table("wds: samples/s", rows, rb, args.memory)
    for k, v in quals.items():
        print(f"  order of {k}: {v}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default="/var/tmp/riffle-bench")
    ap.add_argument("--parts", default="hf,parquet,wds")
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--memory", default="1GiB", help="the memory cgroup of the limited runs")
    args = ap.parse_args()
    subprocess.run(["go", "build", "-o", "bin/riffle", "./cmd/riffle"], cwd=REPO, check=True)
    d = Daemon(name="riffle-formats")
    args.daemon = d
    env = dict(d.env, PYTHONPATH=str(REPO / "python"))
    try:
        for part in args.parts.split(","):
            {"hf": part_hf, "parquet": part_parquet, "wds": part_wds}[part](args, env)
    finally:
        d.stop()


if __name__ == "__main__":
    main()
