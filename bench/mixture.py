"""A weighted mixture of many sources (issue 26) in riffle, in Hugging Face
`interleave_datasets` and in Mosaic Streaming `Stream`s, on the same
records, beside riffle's unmixed loader over all of them, both in one file
and as the same files in one dataset:

    /usr/bin/python3 bench/mixture.py                     # 1,000 sources, about 1.5 million records
    /usr/bin/python3 bench/mixture.py --sources 20 --records 2000 --loaders hf-first,mosaic

The data is written once under --data (never in the repository): source k
is one .npy of n_k rows of 16 int64 (128 bytes), row i = [k, i, 0, ...], n_k
drawn uniformly from [0.2, 1.8] x the mean; the same rows all in one .npy
for the unmixed loader (which also reads the sources' .npy as one dataset,
the same files as the mixture's); and, written by the peers' own writers in
their pinned environment (bench/peers/setup.sh torch), one Hugging Face dataset
per source (`Dataset.from_dict` of the rows' bytes, `save_to_disk`, read
back with `load_from_disk`, as a user keeps a corpus) and one Mosaic MDS
directory per source (`MDSWriter`). Source k's weight is n_k times a
random factor in [1, 2] (seeded): with weights that ignore size, a mixture
that stops at its first exhausted source would end after ~10^5 samples.

Each loader runs in its own process (riffle's client under this python,
the peers in the venv) over one mixture epoch, reading files the page
cache holds (each is read again just before its run). What every record
delivered says about itself, (source, index), is all that is measured:
samples/s, each source's share against its weight's over every window of
W samples (10^5 and 10^6, and the whole run), duplicates (a record twice
within one epoch of its source: a source's deliveries cut into runs of
n_k) and losses (records never delivered of a source delivered n_k times
or more). One JSON line per run, then a markdown table.
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

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE / "peers"))

from harness import warm_up  # noqa: E402
VENV_PYTHON = HERE / "peers" / ".venvs" / "torch" / "bin" / "python"
WIDTH = 16  # int64 per record: [source, index, 0, ...]

# loader: (interpreter, what it is, for the table)
LOADERS = {
    "riffle-unmixed": ("riffle", "riffle.Loader(all.npy): the same records, one file, no mixture"),
    "riffle-files": ("riffle", "riffle.Loader([s0000.npy, ..., s0999.npy]): the same 1,000 files as one dataset, "
                               "no mixture"),
    "riffle-first": ("riffle", 'riffle.Loader(mixture=[(path, w), ...], mixture_stop="first_exhausted")'),
    "riffle-all": ("riffle", 'riffle.Loader(mixture=..., mixture_stop="all_exhausted")'),
    "riffle-2ranks": ("riffle", 'riffle.Loader(mixture=..., "first_exhausted", rank=r, world_size=2), both ranks'),
    "hf-first": ("peer", 'load_from_disk(k).shuffle(seed) each, interleave_datasets(probabilities, seed, '
                         '"first_exhausted"), .iter(batch_size)'),
    "hf-all": ("peer", 'the same, stopping_strategy="all_exhausted"'),
    "hf-2ranks": ("peer", "to_iterable_dataset().shuffle(seed, buffer_size=1000) each, split_dataset_by_node(r, 2) "
                          'each, interleave_datasets(probabilities, seed, "first_exhausted"), both ranks'),
    "mosaic": ("peer", "StreamingDataset(streams=[Stream(local=k, proportion=w_k)], shuffle=True (py1e), "
                       "batch_size), StreamingDataLoader(num_workers=0)"),
}
RIFFLE_RUNS = [k for k, v in LOADERS.items() if v[0] == "riffle"]
# The unmixed baselines, against which a run's samples/s is given: the
# records in one file, and the same files as the mixture's in one dataset
# (which costs the kernel the same 1,000 files' reads as the mixture).
UNMIXED = ["riffle-unmixed", "riffle-files"]


# --- the data ---

def plan(sources: int, records: int, seed: int) -> dict:
    """Sizes and weights of the sources, a pure function of the arguments."""
    rng = np.random.default_rng(seed)
    mean = records / sources
    n = np.maximum(1, np.round(rng.uniform(0.2, 1.8, sources) * mean)).astype(np.int64)
    w = np.round(n * rng.uniform(1.0, 2.0, sources), 3)
    return {"sources": sources, "records": int(n.sum()), "seed": seed, "n": n.tolist(), "weights": w.tolist()}


def source_path(root: Path, form: str, k: int) -> Path:
    return root / form / (f"s{k:04d}.npy" if form == "npy" else f"s{k:04d}")


def make_npy(root: Path, p: dict) -> None:
    """Every source's .npy and all.npy, the same rows back to back."""
    if (root / "all.npy").exists():
        return
    (root / "npy").mkdir(parents=True, exist_ok=True)
    parts = []
    for k, n in enumerate(p["n"]):
        a = np.zeros((n, WIDTH), np.int64)
        a[:, 0], a[:, 1] = k, np.arange(n)
        np.save(source_path(root, "npy", k), a)
        parts.append(a)
    np.save(root / "all.tmp.npy", np.concatenate(parts))
    os.replace(root / "all.tmp.npy", root / "all.npy")


def write_form(root: Path, form: str) -> None:
    """The peers' forms of every source, by their own writers (in the venv)."""
    p = json.loads((root / "plan.json").read_text())
    out = root / form
    tmp = root / (form + ".tmp")
    if tmp.exists():
        import shutil
        shutil.rmtree(tmp)
    tmp.mkdir()
    for k in range(p["sources"]):
        rows = [r.tobytes() for r in np.load(source_path(root, "npy", k))]
        d = str(tmp / f"s{k:04d}")
        if form == "hf":
            import datasets
            datasets.disable_progress_bars()
            feats = datasets.Features({"data": datasets.Value("binary")})
            datasets.Dataset.from_dict({"data": rows}, features=feats).save_to_disk(d)
        elif form == "mds":
            from streaming import MDSWriter
            with MDSWriter(out=d, columns={"data": "bytes"}, size_limit=64 << 20) as w:
                for r in rows:
                    w.write({"data": r})
        else:
            raise SystemExit(f"unknown form {form}")
    os.replace(tmp, out)


def prepare(args) -> Path:
    """The data of these arguments, written if it is not there yet."""
    p = plan(args.sources, args.records, args.seed)
    root = Path(args.data) / f"{args.sources}x{args.records}-seed{args.seed}"
    root.mkdir(parents=True, exist_ok=True)
    if not (root / "plan.json").exists() or json.loads((root / "plan.json").read_text()) != p:
        (root / "plan.json").write_text(json.dumps(p))
    make_npy(root, p)
    forms = {"hf"} if any(l.startswith("hf") for l in args.loaders) else set()
    forms |= {"mds"} if "mosaic" in args.loaders else set()
    for form in sorted(forms):
        if not (root / form).exists():
            print(f"writing {root / form}", file=sys.stderr, flush=True)
            subprocess.run([str(VENV_PYTHON), __file__, "--write", form, "--root", str(root)], check=True)
    return root


def data_of(root: Path, loader: str) -> list[Path]:
    if loader == "riffle-unmixed":
        return [root / "all.npy"]
    if loader == "riffle-files":
        return [root / "npy"]
    return [root / {"riffle": "npy", "hf": "hf", "mosaic": "mds"}[loader.split("-")[0]]]


# --- the runs (each in its own process) ---

def rows_of(records) -> np.ndarray:
    """(source, index) of each record's bytes."""
    a = np.frombuffer(b"".join(records), "<i8").reshape(-1, WIDTH)
    return a[:, :2]


def run_riffle(loader: str, root: Path, p: dict, a) -> list[tuple[float, float, list[np.ndarray]]]:
    sys.path.insert(0, str(REPO / "python"))
    import riffle
    mix = [(str(source_path(root, "npy", k)), w) for k, w in enumerate(p["weights"])]
    kw = dict(batch_size=a.batch, seed=a.seed, socket=a.socket, autostart=False)
    ranks = [0, 1] if loader == "riffle-2ranks" else [None]
    out = []
    for rank in ranks:
        t0 = time.perf_counter()
        if loader == "riffle-unmixed":
            ld = riffle.Loader(str(root / "all.npy"), **kw)
        elif loader == "riffle-files":
            ld = riffle.Loader([path for path, _ in mix], **kw)
        else:
            stop = "all_exhausted" if loader == "riffle-all" else "first_exhausted"
            more = {} if rank is None else {"rank": rank, "world_size": 2}
            ld = riffle.Loader(mixture=mix, mixture_stop=stop, **kw, **more)
        t1 = time.perf_counter()
        got, n, ids = [], 0, []
        for b in ld:
            got.append(np.array(b.data[:, :2]))
            ids.append(np.array(b.ids))
            n += b.n
            if a.samples and n >= a.samples:
                break
        out.append((t1 - t0, time.perf_counter() - t1, got))
        # The ids a batch names against the records' own (source, index):
        # offsets[k] + i, a mixture's offsets or, for the files as one
        # dataset, the records of the files before k.
        if got and loader != "riffle-unmixed":
            d = np.concatenate(got)
            offs = (np.concatenate([[0], np.cumsum(p["n"])[:-1]]) if loader == "riffle-files"
                    else np.asarray(ld.offsets))
            MISMATCH.append(int((np.concatenate(ids) != offs[d[:, 0]] + d[:, 1]).sum()))
        ld.close()
    return out


MISMATCH: list[int] = []  # riffle's ids that disagree with their records' bytes, per rank


def run_hf(loader: str, root: Path, p: dict, a) -> list[tuple[float, float, list[np.ndarray]]]:
    import datasets
    from datasets.distributed import split_dataset_by_node
    datasets.disable_progress_bars()
    w = np.asarray(p["weights"])
    probs = (w / w.sum()).tolist()
    dirs = [str(source_path(root, "hf", k)) for k in range(p["sources"])]
    ranks = [0, 1] if loader == "hf-2ranks" else [None]
    out = []
    for rank in ranks:
        t0 = time.perf_counter()
        if rank is None:
            # user
            dsets = [datasets.load_from_disk(d).shuffle(seed=a.seed) for d in dirs]
            mix = datasets.interleave_datasets(dsets, probabilities=probs, seed=a.seed,
                                               stopping_strategy="all_exhausted" if loader == "hf-all" else "first_exhausted")
            batches = mix.iter(batch_size=a.batch)
            # end user
        else:
            # user: each source split by node, then mixed (the pattern of datasets issue 7868)
            dsets = [split_dataset_by_node(datasets.load_from_disk(d).to_iterable_dataset()
                                           .shuffle(seed=a.seed, buffer_size=1000), rank, 2) for d in dirs]
            mix = datasets.interleave_datasets(dsets, probabilities=probs, seed=a.seed,
                                               stopping_strategy="first_exhausted")
            batches = mix.iter(batch_size=a.batch)
            # end user
        t1 = time.perf_counter()
        got, n = [], 0
        for b in batches:
            got.append(rows_of(b["data"]))
            n += len(b["data"])
            if a.samples and n >= a.samples:
                break
        out.append((t1 - t0, time.perf_counter() - t1, got))
    return out


def run_mosaic(loader: str, root: Path, p: dict, a) -> list[tuple[float, float, list[np.ndarray]]]:
    import streaming
    from streaming import Stream, StreamingDataLoader, StreamingDataset
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
    streaming.base.util.clean_stale_shared_memory()
    w = np.asarray(p["weights"])
    t0 = time.perf_counter()
    # user
    streams = [Stream(local=str(source_path(root, "mds", k)), proportion=float(w[k] / w.sum()))
               for k in range(p["sources"])]
    ds = StreamingDataset(streams=streams, shuffle=True, shuffle_seed=a.seed, batch_size=a.batch)
    dl = StreamingDataLoader(ds, batch_size=a.batch, num_workers=0, collate_fn=lambda rows: [r["data"] for r in rows])
    # end user
    t1 = time.perf_counter()
    got, n = [], 0
    for b in dl:
        got.append(rows_of(b))
        n += len(b)
        if a.samples and n >= a.samples:
            break
    return [(t1 - t0, time.perf_counter() - t1, got)]


def runner(a) -> None:
    """One loader's run: writes the (source, index) it delivered, rank by
    rank, to --out and prints its timings as a JSON line."""
    root = Path(a.root)
    p = json.loads((root / "plan.json").read_text())
    fn = {"riffle": run_riffle, "hf": run_hf, "mosaic": run_mosaic}[a.run.split("-")[0]]
    res = fn(a.run, root, p, a)
    np.savez(a.out, **{f"rank{i}": np.concatenate(g).astype(np.int32) if g else np.zeros((0, 2), np.int32)
                       for i, (_, _, g) in enumerate(res)})
    print(json.dumps({"setup": [r[0] for r in res], "seconds": [r[1] for r in res], "id_mismatch": sum(MISMATCH)}),
          flush=True)


# --- what is measured ---

def window_error(src: np.ndarray, share: np.ndarray, width: int) -> tuple[float, float] | None:
    """(max relative error of a source's share, max deviation in samples)
    over every full window of `width` consecutive samples; None if the run
    has no full window."""
    k = len(share)
    nw = len(src) // width
    if nw == 0:
        return None
    win = np.arange(nw * width) // width
    counts = np.bincount(win * k + src[: nw * width], minlength=nw * k).reshape(nw, k)
    dev = np.abs(counts - width * share[None, :])
    return float((dev / (width * share[None, :])).max()), float(dev.max())


def duplicates(d: np.ndarray, n: np.ndarray, batch: int = 1) -> int:
    """Records delivered twice within one epoch of their source: each
    source's deliveries, in order, are cut into its epochs of n_k. A batch
    is a set (a trainer takes it in one step, and riffle fills it in the
    order its reads complete), so within a batch the records not yet seen
    in the source's current epoch count as coming first."""
    if len(d) == 0:
        return 0
    s, i = d[:, 0].astype(np.int64), d[:, 1].astype(np.int64)
    order = np.argsort(s, kind="stable")
    s, i = s[order], i[order]
    first = np.searchsorted(s, s, side="left")  # where each source's run starts
    chunk = (np.arange(len(s)) - first) // n[s]
    key = (s * (chunk.max() + 1) + chunk) * (n.max() + 1) + i
    if len(key) == len(np.unique(key)) or batch == 1:
        return int(len(key) - len(np.unique(key)))
    # Again, batch by batch, for the sources with a repeat in delivery order.
    sk = np.sort(key)
    suspects = np.unique(sk[1:][np.diff(sk) == 0] // ((chunk.max() + 1) * (n.max() + 1)))
    b = order // batch
    dup = 0
    for k in suspects:
        lo, hi = np.searchsorted(s, k), np.searchsorted(s, k, side="right")
        seen: set[int] = set()
        filled = 0
        for grp in np.split(i[lo:hi], np.flatnonzero(np.diff(b[lo:hi])) + 1):
            new = list(dict.fromkeys(r for r in grp.tolist() if r not in seen))
            rest = grp.tolist()
            for r in new:
                rest.remove(r)
            for r in new + rest:
                if filled == n[k]:
                    seen, filled = set(), 0
                dup += r in seen
                seen.add(r)
                filled += 1
    return dup


def losses(d: np.ndarray, n: np.ndarray) -> int:
    """Records never delivered of the sources delivered n_k times or more
    (those whose epoch the run covered)."""
    counts = np.bincount(d[:, 0], minlength=len(n))
    full = counts >= n
    seen = np.unique(d[full[d[:, 0]]].astype(np.int64) @ np.array([n.max() + 1, 1]))
    return int(n[full].sum() - len(seen))


def same_order(d: np.ndarray, n: np.ndarray) -> int | None:
    """Of the sources that began a second epoch of their own, how many
    repeat their first epoch's order in it (None if none began one)."""
    src = d[:, 0]
    twice = [k for k in np.flatnonzero(np.bincount(src, minlength=len(n)) > n)]
    if not twice:
        return None
    same = 0
    for k in twice:
        i = d[src == k, 1]
        m = min(len(i) - n[k], n[k])
        same += bool(np.array_equal(i[:m], i[n[k]: n[k] + m]))
    return same


def measure(d: np.ndarray, p: dict, unmixed: bool, windows: list[int], batch: int = 1) -> dict:
    """What d, the (source, index) delivered in order in batches of
    `batch`, says: shares over windows of whole batches (at least W
    samples: a batch's records come in any order), duplicates, losses."""
    n = np.asarray(p["n"], np.int64)
    w = np.asarray(n if unmixed else p["weights"], np.float64)
    share = w / w.sum()
    bad = (d[:, 0] < 0) | (d[:, 0] >= len(n)) | (d[:, 1] < 0) | (d[:, 1] >= n[np.clip(d[:, 0], 0, len(n) - 1)])
    d = d[~bad]
    src = d[:, 0].astype(np.int64)
    counts = np.bincount(src, minlength=len(n))
    dev = np.abs(counts - len(d) * share)
    out = {"samples": int(len(d) + bad.sum()), "invalid": int(bad.sum()),
           "run_error": float((dev / (len(d) * share)).max()) if len(d) else None,
           "run_dev": float(dev.max()) if len(d) else None,
           "sources_used_up": int((counts >= n).sum()), "duplicates": duplicates(d, n, batch), "losses": losses(d, n),
           "same_order": same_order(d, n)}
    for W in windows:
        e = window_error(src, share, -(-W // batch) * batch)
        out[f"w{W}_error"], out[f"w{W}_dev"] = e if e else (None, None)
    return out


def floor(p: dict, width: int) -> float:
    """The error one sample more or less of the smallest share makes in a
    window: what a perfect schedule's rounding allows."""
    w = np.asarray(p["weights"], np.float64)
    return float(w.sum() / (width * w.min()))


def between_ranks(a: np.ndarray, b: np.ndarray, n: np.ndarray) -> int:
    """Records delivered by both ranks."""
    key = lambda d: np.unique(d.astype(np.int64) @ np.array([n.max() + 1, 1]))  # noqa: E731
    return int(len(np.intersect1d(key(a), key(b))))


# --- the whole benchmark ---

class Daemon:
    """riffle serve on a private socket, from --riffle (a binary of its own,
    so that a rebuild does not change what other benchmarks run)."""

    def __init__(self, binary: str):
        sys.path.insert(0, str(REPO / "python"))
        from riffle import client
        run = Path("/tmp/riffle-mixture-run")
        run.mkdir(mode=0o700, exist_ok=True)
        os.chmod(run, 0o700)
        self.sock = str(run / "riffle.sock")
        self.proc = subprocess.Popen([binary, "serve", "--socket", self.sock, "--quiet"])
        if not client.wait_for_socket(self.sock, 20):
            raise SystemExit("the daemon did not start")

    def cpu(self) -> float:
        """CPU seconds the daemon has used."""
        from common import cpu_seconds
        return cpu_seconds(self.proc.pid)

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


def run_one(loader: str, root: Path, a, daemon: Daemon | None) -> dict:
    """One loader's run in its own process; its JSON result."""
    daemon = daemon if LOADERS[loader][0] == "riffle" else None
    sock = daemon.sock if daemon else None
    kind = LOADERS[loader][0]
    py = sys.executable if kind == "riffle" else str(VENV_PYTHON)
    out = root / f"delivered-{loader}.npz"
    cap = a.samples
    rank_cap = a.hf_rank_samples if loader == "hf-2ranks" else a.rank_samples
    if loader.endswith("2ranks") and rank_cap:
        cap = min(cap or rank_cap, rank_cap)
    cmd = [py, __file__, "--run", loader, "--root", str(root), "--out", str(out), "--batch", str(a.batch),
           "--seed", str(a.seed), "--samples", str(cap)]
    if sock:
        cmd += ["--socket", sock]
    for path in data_of(root, loader):
        warm_up(str(path))
    cpu = daemon.cpu() if daemon else 0.0
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout)
    cpu = daemon.cpu() - cpu if daemon else None
    if r.returncode != 0:
        last = [l for l in r.stderr.strip().splitlines() if l.strip()][-1:] or [f"exit {r.returncode}"]
        return {"loader": loader, "error": last[0][:300]}
    t = json.loads([l for l in r.stdout.splitlines() if l.startswith("{")][-1])
    z = np.load(out)
    ranks = [z[f"rank{i}"] for i in range(len(z.files))]
    out.unlink()
    p = json.loads((root / "plan.json").read_text())
    wins = [W for W in a.windows]
    res = {"loader": loader, "sources": p["sources"], "records": p["records"], "batch": a.batch,
           "setup_s": round(sum(t["setup"]), 3), "seconds": round(sum(t["seconds"]), 3),
           "id_mismatch": t.get("id_mismatch", 0), "cap": cap, "daemon_cpu_s": cpu}
    if len(ranks) == 1:
        res |= measure(ranks[0], p, loader in UNMIXED, wins, a.batch)
    else:
        # The ranks' batches of one step are the step's global batch: the
        # mixture is measured over those, in step order. Losses are not
        # counted: first_exhausted promises no source's full pass.
        steps = [r[j: j + a.batch] for j in range(0, max(map(len, ranks)), a.batch) for r in ranks]
        res |= measure(np.concatenate(steps), p, False, wins, 2 * a.batch)
        res |= {"ranks": [len(r) for r in ranks], "losses": None,
                "both_ranks": between_ranks(ranks[0], ranks[1], np.asarray(p["n"]))}
    res["samples_per_s"] = round(res["samples"] / max(res["seconds"], 1e-9))
    if cpu is not None:
        res["daemon_us_per_sample"] = round(1e6 * cpu / max(1, res["samples"]), 2)
    return res


def pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.2f}%"


def table(results: list[dict], windows: list[int]) -> list[str]:
    """One row a run; samples/s also as a % of each unmixed baseline's
    (the median of its rows given)."""
    head = ("| loader | what it is | samples | setup s | samples/s | % of all.npy | % of the files unmixed | "
            "daemon CPU µs/sample | "
            + " | ".join(f"error over {W:,} (samples off)" for W in windows)
            + " | error over the run | sources used up | duplicates | losses | flags |")
    lines = [head, "|---|---|---:|---:|---:|---:|---:|---:|" + "---:|" * len(windows) + "---:|---:|---:|---:|---|"]
    base = {}
    for b in UNMIXED:
        ok = [r["samples_per_s"] for r in results if r["loader"] == b and "error" not in r]
        base[b] = float(np.median(ok)) if ok else None
    for r in results:
        what = LOADERS[r["loader"]][1]
        if "error" in r:
            lines.append(f"| {r['loader']} | {what} | - | - | - | - | - | - |" + " - |" * len(windows)
                         + f" - | - | - | - | failed: {r['error'][:200]} |")
            continue
        rate = f"{r['samples_per_s']:,}"
        of = ["-" if not base[b] or r["loader"] == b else f"{100 * r['samples_per_s'] / base[b]:.0f}%" for b in UNMIXED]
        cells = []
        for W in windows:
            e = r.get(f"w{W}_error")
            cells.append("- (run shorter)" if e is None else f"{pct(e)} ({r[f'w{W}_dev']:.0f})")
        flags = []
        if r.get("cap") and max(r.get("ranks") or [r["samples"]]) >= r["cap"]:
            flags.append(f"{'each rank ' if 'ranks' in r else ''}stopped after {r['cap']:,}")
        if r.get("id_mismatch"):
            flags.append(f"{r['id_mismatch']:,} ids not offsets[k] + i of their record")
        if r["invalid"]:
            flags.append(f"{r['invalid']} records not in the data")
        if "both_ranks" in r:
            flags.append(f"{r['both_ranks']:,} records on both ranks")
        if r.get("same_order"):
            flags.append(f"{r['same_order']:,} sources repeat their order in their next epoch")
        cpu = r.get("daemon_us_per_sample")
        lines.append(f"| {r['loader']} | {what} | {r['samples']:,} | {r['setup_s']:.1f} | {rate} | {of[0]} | {of[1]} | "
                     f"{'-' if cpu is None else f'{cpu:.2f}'} | "
                     + " | ".join(cells) + f" | {pct(r['run_error'])} ({r['run_dev']:.0f}) | {r['sources_used_up']:,} "
                     f"| {r['duplicates']:,} | {'-' if r['losses'] is None else format(r['losses'], ',')} | {'; '.join(flags) or 'ok'} |")
    return lines


def riffle_has_mixtures() -> bool:
    sys.path.insert(0, str(REPO / "python"))
    import inspect
    import riffle
    return "mixture" in inspect.signature(riffle.Loader).parameters


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default="/var/tmp/riffle-mixture", help="where the data is written (and kept)")
    ap.add_argument("--sources", type=int, default=1000)
    ap.add_argument("--records", type=int, default=1_500_000, help="about this many records in all")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--samples", type=int, default=0, help="stop a run after this many samples (0: one epoch)")
    ap.add_argument("--rank-samples", type=int, default=200_000,
                    help="stop each rank of riffle's 2-rank run after this many samples (0: its epoch)")
    ap.add_argument("--hf-rank-samples", type=int, default=1024,
                    help="the same for Hugging Face's: its interleave of iterable datasets costs time in "
                         "proportion to the sources for every sample (about 10 samples/s of 1,000 sources)")
    ap.add_argument("--windows", default="100000,1000000", help="window widths for the proportion error")
    ap.add_argument("--loaders", default=",".join(LOADERS))
    ap.add_argument("--repeat", type=int, default=5, help="runs of each riffle loader, alternated (median shown)")
    ap.add_argument("--riffle", default=str(REPO / "bin" / "riffle"), help="the daemon's binary")
    ap.add_argument("--timeout", type=float, default=900, help="seconds a run may take")
    ap.add_argument("--json", help="also write the JSON lines here")
    # internal: one run, or writing a peer's form
    ap.add_argument("--run", help=argparse.SUPPRESS)
    ap.add_argument("--write", help=argparse.SUPPRESS)
    ap.add_argument("--root", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--socket", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.write:
        return write_form(Path(a.root), a.write)
    if a.run:
        return runner(a)
    a.loaders = a.loaders.split(",")
    a.windows = [int(x) for x in a.windows.split(",")]
    want_riffle = [l for l in a.loaders if l in RIFFLE_RUNS]
    if want_riffle and not riffle_has_mixtures():
        print("riffle.Loader has no mixture= yet: its mixture runs are left out", file=sys.stderr)
        want_riffle = [l for l in want_riffle if l in UNMIXED]
    root = prepare(a)
    daemon = Daemon(a.riffle) if want_riffle else None
    results = []
    try:
        # riffle's runs alternate, so the machine's noise falls on all of them alike.
        order = [l for _ in range(a.repeat) for l in want_riffle] + [l for l in a.loaders if l not in RIFFLE_RUNS]
        for loader in order:
            r = run_one(loader, root, a, daemon)
            print(json.dumps(r), flush=True)
            if a.json:
                with open(a.json, "a") as f:
                    f.write(json.dumps(r) + "\n")
            results.append(r)
    finally:
        if daemon:
            daemon.stop()
    # One row a loader: for riffle's repeated runs, the run of median speed.
    rows = []
    for loader in [l for l in a.loaders if l in want_riffle or l not in RIFFLE_RUNS]:
        rs = [r for r in results if r["loader"] == loader]
        ok = sorted((r for r in rs if "error" not in r), key=lambda r: r["samples_per_s"])
        rows.append(ok[len(ok) // 2] if ok else rs[0])
    p = json.loads((root / "plan.json").read_text())
    n = np.asarray(p["n"])
    print()
    print(f"{p['sources']:,} sources of {n.min()}-{n.max()} records of {WIDTH * 8} bytes ({p['records']:,} in all), "
          f"weights n_k x U[1, 2] (seed {p['seed']}), batch {a.batch}; the smallest share's one-sample error: "
          + ", ".join(f"{pct(floor(p, W))} over {W:,}" for W in a.windows))
    print()
    print("\n".join(table(rows, a.windows)))


if __name__ == "__main__":
    main()
