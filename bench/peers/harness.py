"""riffle side by side with the loaders users would pick instead, in one
run on the same data: PyTorch's DataLoader, torchdata, Hugging Face
datasets, tf.data, Grain, WebDataset, Mosaic Streaming and Ray Data, each
in its own pinned environment (bench/peers/setup.sh) reading its own native
format, written from one source file by its own writer.

    sudo .venv/bin/python bench/peers/harness.py        # or: make bench-peers

For each record size (4 KiB and 128 KiB by default) and each loader in its
fully shuffled and its fast configuration: samples/s cold (page cache
dropped) and warm, peak RSS of all its processes (riffle's daemon
included), device bytes over record bytes, time to first batch. On a
smaller copy: one whole epoch's order (its randomization level and
neighbour co-occurrence from `riffle quality --ids`, and whether every
record came exactly once), two ranks sharding it, exact resume (does the
state saved mid-epoch restore to the same next batch?) and what the loader
does with a truncated file; and an elastic resume (rank 0's state of 2 ranks x 2
workers loaded by 3 ranks x 1 worker: records repeated and lost over the
epoch). A loader that delivers a wrong count or a
record twice is flagged in the table, never averaged in.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import numpy as np  # noqa: E402

from common import REPO, Daemon, device_of, drop_caches, parse_size, read_bytes  # noqa: E402

VENVS = HERE / ".venvs"
# peer: (environment, format, configurations)
PEERS = {
    "riffle": ("torch", "raw", ["full", "fast"]),
    "torch": ("torch", "raw", ["full", "fast"]),
    "torchdata": ("torch", "raw", ["fast"]),
    "hf": ("torch", "arrow", ["full", "fast"]),
    "tf": ("tf", "tfrecord", ["full", "fast"]),
    "grain": ("grain", "arrayrecord", ["full", "fast"]),
    "webdataset": ("torch", "tar", ["fast"]),
    "mosaic": ("torch", "mds", ["full", "fast"]),
    "ray": ("ray", "parquet", ["full", "fast"]),
}
WRITER_ENV = {"tfrecord": "tf", "arrow": "torch", "tar": "torch", "mds": "torch", "arrayrecord": "grain", "parquet": "ray"}
# What each configuration is, for the table.
CONFIGS = {
    ("riffle", "full"): "global shuffle, daemon's parallel reads",
    ("riffle", "fast"): "block-aware shuffle, 64 KiB blocks, window 8",
    ("torch", "full"): "shuffle=True, map-style pread, 0 workers",
    ("torch", "fast"): "shuffle=True, map-style pread, 2 workers",
    ("torchdata", "fast"): "StatefulDataLoader, shuffle=True, 2 workers",
    ("hf", "full"): "load_from_disk().shuffle(), random access",
    ("hf", "fast"): "to_iterable_dataset(64 shards).shuffle(1000), 2 workers",
    ("tf", "full"): "TFRecordDataset.shuffle(all records)",
    ("tf", "fast"): "interleave(8, AUTOTUNE).shuffle(10000).prefetch",
    ("grain", "full"): "ArrayRecord, MapDataset.shuffle, 16 threads",
    ("grain", "fast"): "ArrayRecord, MapDataset.shuffle, 2 processes",
    ("webdataset", "fast"): "shard shuffle + shuffle(1000), 2 workers",
    ("mosaic", "full"): "MDS, shuffle_algo=naive",
    ("mosaic", "fast"): "MDS, shuffle_algo=py1e, 2 workers",
    ("ray", "full"): "Parquet, random_shuffle()",
    ("ray", "fast"): "Parquet, shuffle=files, local buffer 10000",
}


def python(env: str) -> str:
    return str(VENVS / env / "bin" / "python")


# --- what is measured ---

class Peak:
    """Peak summed RSS of a process tree (and extra pids), polled."""

    def __init__(self, root: int, extra: list[int] = ()):
        self.root, self.extra, self.peak = root, list(extra), 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _tree(self) -> set[int]:
        kids: dict[int, list[int]] = {}
        for d in os.listdir("/proc"):
            if d.isdigit():
                try:
                    ppid = int(open(f"/proc/{d}/stat").read().rsplit(")", 1)[1].split()[1])
                except (OSError, IndexError, ValueError):
                    continue
                kids.setdefault(ppid, []).append(int(d))
        out, todo = set(), [self.root, *self.extra]
        while todo:
            p = todo.pop()
            if p not in out:
                out.add(p)
                todo += kids.get(p, [])
        return out

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            total = 0
            for p in self._tree():
                try:
                    for line in open(f"/proc/{p}/status"):
                        if line.startswith("VmRSS:"):
                            total += int(line.split()[1]) << 10
                except OSError:
                    pass
            self.peak = max(self.peak, total)

    def stop(self) -> int:
        self._stop.set()
        self._t.join()
        return self.peak


@dataclass
class Run:
    n: int = 0
    distinct: int = 0
    seconds: float = 0.0
    rate: float = 0.0
    first: float | None = None
    rss: int = 0
    device: int = 0
    error: str | None = None
    ids: list[int] = field(default_factory=list)


def flags(run: Run, expected: int | None = None) -> list[str]:
    """What is wrong with a run's delivery: records twice, a wrong count."""
    out = []
    if run.error:
        out.append(f"failed: {run.error}")
    if run.distinct != run.n:
        out.append(f"{run.n - run.distinct} records repeated")
    if expected is not None and run.error is None and run.n != expected:
        out.append(f"{run.n} records of {expected}")
    return out


def parse_run(stdout: str) -> dict:
    """The runner's JSON line (the last line that is one)."""
    for line in reversed(stdout.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            return json.loads(line)
    raise ValueError(f"no result in the runner's output: {stdout[-500:]!r}")


def riffle_env(peer: str) -> dict:
    """The environment of a run: riffle's clients start their own daemon."""
    return dict(os.environ)


def run_one(peer: str, config: str, mode: str, data: str, size: int, args, *, cold: bool = False, ids: bool = False,
            rank: int = 0, world: int = 1, timeout: float = 600, extra: list[str] = ()) -> Run:
    return run_ranks(peer, config, mode, data, size, args, cold=cold, ids=ids, ranks=[rank], world=world,
                     timeout=timeout, extra=extra)[0]


def run_ranks(peer: str, config: str, mode: str, data: str, size: int, args, *, cold: bool = False, ids: bool = False,
              ranks: list[int] = (0,), world: int = 1, timeout: float = 600, extra: list[str] = ()) -> list[Run]:
    """Runs ranks of a loader at once (DDP-like: one process per rank, on
    one machine, one riffle daemon for them all), each its own Run."""
    env_name = PEERS[peer][0]
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(29500 + os.getpid() % 1000), WORLD_SIZE=str(world))
    daemon = None
    if peer == "riffle":
        daemon = Daemon(name="riffle-peers")
        env.update(RIFFLE_SOCKET=daemon.sock)
    if cold:
        drop_caches()
    dev = device_of(Path(data))
    before = read_bytes(dev)
    procs = []
    for rank in ranks:
        cmd = [python(env_name), str(HERE / "loaders.py"), peer, config, mode, "--data", data, "--size", str(size),
               "--seconds", str(args.seconds), "--rank", str(rank), "--world", str(world), "--seed", "1"]
        if ids:
            cmd.append("--ids")
        cmd += list(extra)
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      env=dict(env, RANK=str(rank)), start_new_session=True))
    peaks = [Peak(p.pid, [daemon.proc.pid] if daemon else []) for p in procs]
    outs = []
    deadline = time.time() + timeout
    for p in procs:
        try:
            outs.append(p.communicate(timeout=max(1, deadline - time.time())))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, 9)
            p.communicate()
            outs.append(None)
        finally:
            try:
                os.killpg(p.pid, 9)  # workers the peer left behind
            except ProcessLookupError:
                pass
    device = read_bytes(dev) - before
    if daemon:
        daemon.stop()
    return [finish_run(p, o, pk.stop(), device, timeout) for p, o, pk in zip(procs, outs, peaks)]


def finish_run(p: subprocess.Popen, o: tuple | None, rss: int, device: int, timeout: float) -> Run:
    if o is None:
        return Run(rss=rss, device=device, error=f"hang: no end after {timeout:.0f}s")
    out, err = o
    r = Run(rss=rss, device=device)
    if p.returncode != 0 and '{"n"' not in out:
        last = [l for l in err.strip().splitlines() if l.strip()][-1:] or ["exit %d" % p.returncode]
        r.error = last[0][:200]
        return r
    j = parse_run(out)
    r.n, r.distinct, r.seconds, r.rate, r.first = j["n"], j["distinct"], j["seconds"], j.get("rate", 0), j["first"]
    r.error, r.ids = j.get("error"), j.get("ids", [])
    return r


def warm_up(path: str) -> None:
    """Reads every file of a peer's data, so that a warm run finds all of
    it in the page cache (a slow loader's own run would warm a part)."""
    p = Path(path)
    for f in ([p] if p.is_file() else sorted(x for x in p.rglob("*") if x.is_file())):
        with open(f, "rb") as fh:
            while fh.read(8 << 20):
                pass


def quality(ids: list[int], batch: int = 256) -> tuple[str, str]:
    """Neighbour co-occurrence (against a full shuffle's) and mean
    displacement (1 is a full shuffle's) of one delivered epoch."""
    p = Path("/tmp/riffle-peers-ids.txt")
    p.write_text(" ".join(map(str, ids)) + "\n")
    out = subprocess.run([str(REPO / "bin" / "riffle"), "quality", "--ids", str(p), "--batch-size", str(batch)],
                         capture_output=True, text=True)
    nb = ds = "-"
    for line in out.stdout.splitlines():
        if line.startswith("neighbours"):
            nb = line.split()[-1]
        if line.startswith("displacement"):
            ds = line.split()[-1]
    return nb, ds


# Configurations that shuffle in a buffer over a stream: their RL is that
# of riffle's buffered sampler with the same buffer (a lower bound: the
# shard shuffle in front adds a few bits). The others are full shuffles.
BUFFERED = {("hf", "fast"): 1000, ("tf", "fast"): 10000, ("webdataset", "fast"): 1000, ("ray", "fast"): 10000}


def rl(peer: str, cfg: str, n: int, size: int) -> str:
    """DeepIO's randomization level of a configuration's orders (a model)."""
    if (peer, cfg) == ("mosaic", "fast"):
        return "block (py1e)"
    if (peer, cfg) == ("riffle", "fast"):
        out = subprocess.run([str(REPO / "bin" / "riffle"), "quality", "--sampler", "block", "--block-size", "65536",
                              "--window", "8", "--record-size", str(size), "--records", str(n), "--epochs", "1"],
                             capture_output=True, text=True).stdout
        row = [w for l in out.splitlines() if l.startswith("block") for w in l.split() if w.endswith("%")]
        return row[0] if row else "-"
    if (peer, cfg) not in BUFFERED:
        return "100%"
    out = subprocess.run([str(REPO / "bin" / "riffle"), "quality", "--sampler", "buffered", "--buffer",
                          str(BUFFERED[(peer, cfg)]), "--records", str(n), "--epochs", "1"],
                         capture_output=True, text=True).stdout
    row = [l for l in out.splitlines() if l.startswith("buffered")]
    return "≥" + row[0].split()[2] if row else "-"


# --- data ---

def make_source(path: Path, total: int, size: int) -> bool:
    """Fixed-size records of random bytes (nothing a peer's compression
    could shrink), each starting with its id; True if (re)written."""
    n = total // size
    if path.exists() and path.stat().st_size == n * size:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    per = max(1, (64 << 20) // size)
    with open(path, "wb") as f:
        for lo in range(0, n, per):
            k = min(per, n - lo)
            block = rng.integers(0, 256, (k, size), dtype=np.uint8)
            block[:, :8] = np.arange(lo, lo + k, dtype="<u8").view(np.uint8).reshape(k, 8)
            f.write(block.tobytes())
    return True


def prepare(args, size: int, total: int, tag: str, fmts=None) -> dict[str, str]:
    """The source file and every peer's format of it; returns format -> path.
    Each format remembers the source it was written from (a stamp), and is
    written again when the source changed."""
    root = Path(args.data) / f"{tag}-{size}"
    src = root / "raw" / "records.bin"
    make_source(src, total, size)
    return write_formats(root, src, size, f"{src.stat().st_size} {src.stat().st_mtime_ns}", fmts)


def write_formats(root: Path, src: Path, size: int, stamp: str, fmts=None) -> dict[str, str]:
    """Every peer's format of src under root (or those in fmts), each
    written by the peer's own writer unless it was written from this same
    source (stamp)."""
    paths = {"raw": str(src)}
    for fmt, env in WRITER_ENV.items():
        if fmts is not None and fmt not in fmts:
            continue
        out, mark = root / fmt, root / f".{fmt}.source"
        if not out.exists() or not mark.exists() or mark.read_text() != stamp:
            shutil.rmtree(out, ignore_errors=True)
            print(f"writing {out}", file=sys.stderr, flush=True)
            subprocess.run([python(env), str(HERE / "write.py"), fmt, str(src), str(size), str(out)], check=True)
            mark.write_text(stamp)
        paths[fmt] = str(out)
    return paths


def truncated_copy(fmt: str, path: str, size: int) -> str:
    """A copy of a peer's data whose first shard is cut in the middle of a record."""
    dst = Path(path + "-truncated")
    if dst.exists():
        shutil.rmtree(dst) if dst.is_dir() else dst.unlink()
    if fmt == "raw":
        shutil.copy(path, dst)
        victim = dst
    else:
        # (Hugging Face leaves cache-*.arrow files of its shuffles beside the data.)
        shutil.copytree(path, dst, ignore=shutil.ignore_patterns("cache-*"))
        cands = sorted(p for p in dst.rglob("*") if p.is_file() and p.suffix in
                       (".tfrecord", ".arrow", ".tar", ".mds", ".array_record", ".parquet"))
        victim = cands[0]
    n = victim.stat().st_size
    with open(victim, "r+b") as f:
        f.truncate(n - n // 3 - size // 2)
    return str(dst)


# The image rows of the jpeg part: --image-rows name -> (what every loader
# does to each JPEG, for the table's heading).
IMAGE_ROWS = {
    "center": "decode, Resize(256), CenterCrop(224)",
    "rrc": "decode, RandomResizedCrop(224), RandomHorizontalFlip()",
}


def image_rows(spec: str) -> list[str]:
    """The image rows a --image-rows value names, in its order."""
    rows = [r.strip() for r in spec.split(",") if r.strip()]
    bad = [r for r in rows if r not in IMAGE_ROWS]
    if bad or not rows:
        raise SystemExit(f"--image-rows: {', '.join(bad) or 'none'} (rows: {', '.join(IMAGE_ROWS)})")
    return rows


def part_jpeg(args, peers, emit, lines_of, raw) -> None:
    """A JPEG directory through each image row in every loader: riffle's
    daemon transform, torchvision's ImageFolder, tf.image, Pillow in the
    others' own map stages. A table per row."""
    from common import make_jpegs
    root = Path(args.data) / "jpeg"
    src = root / "raw"
    make_jpegs(src, args.images)
    files = [p for p in src.rglob("*.jpg")]
    mean = sum(p.stat().st_size for p in files) // len(files)
    paths = write_formats(root, src, 0, f"{len(files)} {mean}", {PEERS[p][1] for p in peers})
    for row in image_rows(args.image_rows):
        emit()
        emit(f"### {len(files)} JPEGs (about 500x375, mean {mean >> 10} KiB): {IMAGE_ROWS[row]}")
        emit()
        emit("| loader | configuration | cold samples/s | warm samples/s | peak RSS MiB | device/record bytes (cold) "
             "| first batch s (cold) | user lines | flags |")
        emit("|---|---|---:|---:|---:|---:|---:|---:|---|")
        for peer in peers:
            env, fmt, cfgs = PEERS[peer]
            for cfg in cfgs:
                if (peer, cfg) == ("riffle", "fast"):
                    continue  # the transform runs in the daemon either way
                cold = run_one(peer, cfg, "speed", paths[fmt], mean, args, cold=True, extra=["--image", row])
                warm_up(paths[fmt])
                warm = run_one(peer, cfg, "speed", paths[fmt], mean, args, extra=["--image", row])
                fl = flags(cold) + flags(warm)
                raw.append({"peer": peer, "config": cfg, "jpeg": row, "cold": cold.__dict__ | {"ids": []},
                            "warm": warm.__dict__ | {"ids": []}})
                f = lambda r: f"{r.n / max(r.seconds, 1e-9):.0f} ({r.rate:.0f})"  # noqa: E731
                emit(f"| {peer} | {CONFIGS[(peer, cfg)]} | {f(cold)} | {f(warm)} | {max(cold.rss, warm.rss) >> 20} "
                     f"| {cold.device / max(1, cold.n * mean):.2f} | {cold.first or 0:.2f} "
                     f"| {lines_of.get(peer, '-')} | {'; '.join(fl) or 'ok'} |")


# --- elastic resume ---

ELASTIC_PEERS = ["riffle", "torchdata", "hf", "mosaic", "grain"]
# What each peer's elastic run is, for the table.
ELASTIC_HOW = {
    "riffle": "riffle.torch.loader(rank=, world_size=, num_workers=), rank 0's state_dict()",
    "torchdata": "StatefulDataLoader + DistributedSampler, rank 0's state_dict()",
    "hf": "to_iterable_dataset(64 shards) + split_dataset_by_node + shuffle(1000), StatefulDataLoader, rank 0's state_dict()",
    "mosaic": "StreamingDataset(py1e) + StreamingDataLoader, rank 0's state_dict()",
    "grain": "grain.python.DataLoader, IndexSampler(ShardOptions), rank 0's iterator get_state()",
}


def elastic_counts(n: int, before: list[int], after: list[int]) -> tuple[int, int]:
    """(records delivered more than once, records never delivered) of one
    epoch of n records, over every rank of both phases."""
    seen = np.bincount(np.asarray(before + after, dtype=np.int64), minlength=n)[:n] if before or after else np.zeros(n)
    return int((seen > 1).sum()), int((seen == 0).sum())


def elastic_cell(n: int, phase1: list[Run], phase2: list[Run]) -> str:
    """The table's cell: the counts, or why there are none."""
    for r in phase1:
        if r.error:
            return f"error in phase 1 ({r.error[:120]})"
    for r in phase2:
        if r.error:
            return f"refused or failed ({r.error[:160]})"
    dup, lost = elastic_counts(n, [i for r in phase1 for i in r.ids], [i for r in phase2 for i in r.ids])
    return f"{dup} duplicates, {lost} lost"


def part_elastic(args, peers, emit) -> None:
    """Each peer saves rank 0's state after 3 batches of 2 ranks x 2
    workers, and 3 ranks x 1 worker load it and finish the epoch."""
    peers = [p for p in peers if p in ELASTIC_PEERS]
    size = int(args.sizes.split(",")[0])
    n = parse_size(args.elastic_bytes) // size
    small = prepare(args, size, parse_size(args.elastic_bytes), "elastic", {PEERS[p][1] for p in peers})
    emit()
    emit(f"### elastic resume: 2 ranks x 2 workers onto 3 ranks x 1 worker ({n} records of {size // 1024} KiB, "
         f"batch 256, 3 batches a rank before the save)")
    emit()
    emit("| loader | how | onto 3 ranks x 1 worker | onto 3 ranks x 2 workers (only the ranks change) |")
    emit("|---|---|---|---|")
    for peer in peers:
        env, fmt, _ = PEERS[peer]
        state = Path(args.data) / f"elastic-{peer}.state"
        for f in Path(args.data).glob(f"elastic-{peer}.state*"):
            f.unlink()
        common_ = ["--state", str(state)]
        one = run_ranks(peer, "fast", "elastic", small[fmt], size, args, ranks=[0, 1], world=2, timeout=300,
                        extra=common_ + ["--phase", "1", "--workers", "2"])
        if not state.exists() and not any(r.error for r in one):
            one[0].error = "rank 0 saved no state"
        cells = []
        for workers in (1, 2):  # the same state, loaded twice
            two = run_ranks(peer, "fast", "elastic", small[fmt], size, args, ranks=[0, 1, 2], world=3, timeout=300,
                            extra=common_ + ["--phase", "2", "--workers", str(workers)]) if state.exists() else []
            cells.append(elastic_cell(n, one, two))
        emit(f"| {peer} | {ELASTIC_HOW[peer]} | {' | '.join(cells)} |")


# --- the table ---

def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="/var/tmp/riffle-peers", help="where the data is written (and kept)")
    ap.add_argument("--bytes", default="1GiB", help="dataset size for the speed runs")
    ap.add_argument("--small", default="64MiB", help="dataset size for orders, ranks, resume and truncation")
    ap.add_argument("--sizes", default="4096,131072")
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--peers", default=",".join(PEERS))
    ap.add_argument("--parts", default="speed,order,ranks,resume,truncated,jpeg,elastic")
    ap.add_argument("--elastic-bytes", default="16MiB", help="dataset size for the elastic resume")
    ap.add_argument("--images", type=int, default=2000, help="JPEGs for the jpeg part")
    ap.add_argument("--image-rows", default=",".join(IMAGE_ROWS),
                    help="the jpeg part's rows: center (Resize(256) + CenterCrop(224)), "
                         "rrc (RandomResizedCrop(224) + RandomHorizontalFlip())")
    ap.add_argument("--out", default=str(HERE / "results.md"))
    args = ap.parse_args()
    peers = args.peers.split(",")
    parts = args.parts.split(",")
    image_rows(args.image_rows)  # a wrong name fails before anything runs
    subprocess.run(["make", "-C", str(REPO), "build"], check=True, stdout=subprocess.DEVNULL)
    lines = []

    def emit(s: str = "") -> None:
        print(s, flush=True)
        lines.append(s)

    raw: list[dict] = []
    lines_of = {}
    for peer in peers:
        r = subprocess.run([python(PEERS[peer][0]), str(HERE / "loaders.py"), peer, "full", "lines"],
                           capture_output=True, text=True)
        lines_of[peer] = parse_run(r.stdout)["lines"] if r.returncode == 0 else 0
    emit(f"machine: {os.cpu_count()} cores; each run at most {args.seconds:.0f}s or one epoch; batch 256; "
         f"samples/s over the run (first batch included), and after the first batch in parentheses")
    for size in (map(int, args.sizes.split(",")) if set(parts) - {"jpeg", "elastic"} else []):
        big = prepare(args, size, parse_size(args.bytes), "big") if "speed" in parts else None
        small = prepare(args, size, parse_size(args.small), "small")
        n_small = parse_size(args.small) // size
        emit()
        emit(f"### {size // 1024} KiB records: {parse_size(args.bytes) >> 20} MiB for speed, "
             f"{n_small} records for orders")
        emit()
        emit("| loader | configuration | cold samples/s | warm samples/s | peak RSS MiB | device/record bytes (cold) "
             "| first batch s (cold) | RL | neighbours | displacement | 2 ranks | resume | truncated file | user lines | flags |")
        emit("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---|---:|---|")
        for peer in peers:
            env, fmt, cfgs = PEERS[peer]
            for cfg in cfgs:
                row = {"flags": []}
                if big:
                    cold = run_one(peer, cfg, "speed", big[fmt], size, args, cold=True)
                    warm_up(big[fmt])
                    warm = run_one(peer, cfg, "speed", big[fmt], size, args)
                    row["flags"] += flags(cold) + flags(warm)
                    # Over the whole run, first batch included (what an epoch
                    # costs a user), and after the first batch (steady state).
                    row["cold"] = f"{cold.n / max(cold.seconds, 1e-9):.0f} ({cold.rate:.0f})"
                    row["warm"] = f"{warm.n / max(warm.seconds, 1e-9):.0f} ({warm.rate:.0f})"
                    raw.append({"peer": peer, "config": cfg, "size": size, "cold": cold.__dict__ | {"ids": []},
                                "warm": warm.__dict__ | {"ids": []}})
                    row["rss"] = max(cold.rss, warm.rss) >> 20
                    row["dev"] = cold.device / max(1, cold.n * size)
                    row["first"] = cold.first
                if "order" in parts:
                    o = run_one(peer, cfg, "epoch", small[fmt], size, args, ids=True)
                    row["flags"] += flags(o, n_small)
                    row["nb"], row["disp"] = quality(o.ids) if not flags(o, n_small) else ("-", "-")
                    row["rl"] = rl(peer, cfg, n_small, size)
                if "ranks" in parts:
                    rs = run_ranks(peer, cfg, "epoch", small[fmt], size, args, ids=True, ranks=[0, 1], world=2)
                    union = [x for r in rs for x in r.ids]
                    bad = [f for r in rs for f in flags(r)]
                    if bad:
                        row["ranks"] = "; ".join(bad)
                    elif len(union) != len(set(union)):
                        row["ranks"] = f"{len(union) - len(set(union))} records on both ranks"
                    elif len(set(union)) != n_small:
                        row["ranks"] = f"{n_small - len(set(union))} records on no rank"
                    else:
                        row["ranks"] = "each once"
                if "resume" in parts:
                    try:
                        out = subprocess.run([python(env), str(HERE / "loaders.py"), peer, cfg, "resume", "--data",
                                              small[fmt], "--size", str(size), "--seed", "1"],
                                             capture_output=True, text=True, timeout=120, start_new_session=True,
                                             env=riffle_env(peer))
                        row["resume"] = parse_run(out.stdout)["resume"] if '"resume"' in out.stdout else \
                            "error: " + (out.stderr.strip().splitlines() or ["?"])[-1][:120]
                    except subprocess.TimeoutExpired:
                        row["resume"] = "hang"
                if "truncated" in parts:
                    t = run_one(peer, cfg, "epoch", truncated_copy(fmt, small[fmt], size), size, args, timeout=120)
                    if t.error and t.error.startswith("hang"):
                        row["trunc"] = "hang"
                    elif t.error:
                        row["trunc"] = "error: " + t.error[:100]
                    elif t.n < n_small:
                        row["trunc"] = f"silent skip ({n_small - t.n} records lost)"
                    else:
                        row["trunc"] = "no effect"
                fmtv = lambda v, f: "-" if v is None else format(v, f)  # noqa: E731
                emit(f"| {peer} | {CONFIGS[(peer, cfg)]} | {row.get('cold', '-')} | {row.get('warm', '-')} "
                     f"| {fmtv(row.get('rss'), 'd')} | {fmtv(row.get('dev'), '.2f')} | {fmtv(row.get('first'), '.2f')} "
                     f"| {row.get('rl', '-')} | {row.get('nb', '-')} | {row.get('disp', '-')} | {row.get('ranks', '-')} | {row.get('resume', '-')} "
                     f"| {row.get('trunc', '-')} | {lines_of.get(peer, '-')} | {'; '.join(row['flags']) or 'ok'} |")
    if "elastic" in parts:
        part_elastic(args, peers, emit)
    if "jpeg" in parts:
        part_jpeg(args, peers, emit, lines_of, raw)
    Path(args.out).write_text("\n".join(lines) + "\n")
    Path(args.out).with_suffix(".json").write_text(json.dumps(raw, indent=1))


if __name__ == "__main__":
    main()
