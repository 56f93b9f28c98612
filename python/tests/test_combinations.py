"""Features combined: a property test that draws cases from format x sampler
(sampler="auto" too) x share (1-3 concurrent jobs) x a subset (ids=) x
DataLoader workers (0-3) x ranks (1-3, by environment or by mp.spawn) x a
stop and resume at a random batch with another worker count and another
number of ranks (elastic: from rank 0's state, or, for a shared order, from
every rank's, gathered by state_dict(all_ranks=True) under mp.spawn and by
riffle.merge_states otherwise) x transform (libsvm_dense; over JPEGs the
image transform and random_resized_crop, whose crops are functions of
seed, epoch and record) x direct= (unset: read with O_DIRECT when shuffled,
by this module's daemon's rule; asked; refused) x where a one-file dataset
lives (a local file, or an object of a real S3-compatible server), runs each
as a user would (real processes, the real daemon), and checks that every
delivered record's bytes equal a solo read's and that every epoch is exactly
once across the ranks.

RIFFLE_COMBINATIONS sets how many cases are drawn (default 8, so CI stays
within minutes) and RIFFLE_COMBINATIONS_SEED which. A failing draw is kept
in combinations.json beside this file and runs first from then on.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

import numpy as np
import pytest

import riffle
from conftest import REPO, Daemon, S3Server, free_port, status, tfrecord_frames

N = 600  # records: a multiple of every world size drawn, so no rank is padded
EPOCHS = 2
REGRESSIONS = Path(__file__).with_name("combinations.json")

FORMATS = ("fixed", "lines", "dir", "arrow", "parquet", "tar", "libsvm", "mixture", "mixture_short", "jpeg", "npy",
           "tfrecord")
# mixture_short's sources, equally weighted: the first runs out first, so an epoch (first_exhausted) is its
# records each once and as many of each other source's, the rest of theirs left for their next epochs.
SHORT = (100, 200, 300)
SAMPLERS = ("global", "block", "buffered", "reservoir", "sequential", "opportunistic", "auto")
# Orders that are functions of (seed, epoch, position): they resume on any number of workers.
POSITIONAL = ("global", "block", "sequential", "buffered", "reservoir", "auto")
# direct= as a user gives it: unset (the module's daemon counts 1 KiB of a job's files as kept in the page cache, so
# a shuffle of any file but the smallest reads with O_DIRECT: job/direct.go), asked, or refused.
DIRECT = (None, True, False)
# Where a one-file dataset lives: a local file, or an object of a real S3-compatible server on loopback, read by
# ranged GETs through a disk cache smaller than the dataset (Belady's eviction).
WHERE = ("local", "local", "s3")
ONE_FILE = ("fixed", "lines", "npy", "tfrecord", "libsvm", "tar", "arrow", "parquet")
# A fixed-size file's record sizes drawn: many records a page, and one.
RECORD_SIZES = (64, 4096)
# The transforms drawn for a format (None: none).
TRANSFORMS = {"libsvm": "libsvm_dense:n_features=20", "jpeg": ("image:size=40,crop=32", "random_resized_crop:size=32")}


def draw(rng: random.Random) -> dict:
    """One case; combinations the loader refuses by design are drawn again."""
    while True:
        c = {
            "format": rng.choice(FORMATS),
            "sampler": rng.choice(SAMPLERS),
            "jobs": rng.choice((1, 1, 2, 3)),
            "share": rng.random() < 0.5,
            "workers": rng.randint(0, 3),
            "world": rng.randint(1, 3),
            "launch": rng.choice(("env", "spawn")),
            "stop": rng.randint(1, 4),
            "transform": rng.random() < 0.5,
            "batch": rng.choice((16, 50, 64)),
            "subset": rng.random() < 0.3,
        }
        elastic = elastic_case(c)
        c["resume_workers"] = rng.randint(0, 3) if elastic else c["workers"]
        c["resume_world"] = rng.randint(1, 3) if elastic else c["world"]
        t = TRANSFORMS.get(c["format"]) if c["transform"] else None
        c["transform"] = rng.choice(t) if isinstance(t, tuple) else bool(t)
        if c["sampler"] == "auto" and (c["share"] or (c["launch"] == "env" and max(c["world"], c["resume_world"]) > 1)
                                       or c["format"] == "parquet"):
            # auto's ranks agree on rank 0's choice through a process group; a shared order is global; a Parquet
            # file's pages make its order, and auto refuses it (asking for the window).
            continue
        if c["format"].startswith("mixture") and c["subset"]:
            continue  # a mixture's epoch of a subset is not each record once
        if not c["share"]:
            c["jobs"] = 1
        if c["jobs"] * max(c["world"], c["resume_world"]) > 4:
            continue  # two cores
        # Drawn from the case, not from rng: the draws before this
        # dimension came stay as they were.
        c["direct"] = random.Random(json.dumps(c, sort_keys=True)).choice(DIRECT)
        if c["format"] == "fixed":
            # A page of 64 records is the kernel's to keep; one a page is the steward's (job/steward.go).
            c["record_size"] = random.Random(json.dumps(c, sort_keys=True)).choice(RECORD_SIZES)
        if c["format"] in ONE_FILE:
            c["where"] = random.Random(json.dumps(c, sort_keys=True)).choice(WHERE)
        return c


def restable(c: dict) -> bool:
    """Whether a case's order resumes on another topology from every rank's places: a shared global order, or an
    opportunistic one (of one dataset: a mixture's resumes on its own topology, or from its position)."""
    return (c["share"] and c["sampler"] in ("global", "opportunistic") or c["sampler"] == "opportunistic") \
        and not c["format"].startswith("mixture")


def elastic_case(c: dict) -> bool:
    """Whether a case's state resumes on another topology: an order that is a function of position (from rank 0's
    state), or one that resumes from every rank's places."""
    return restable(c) or (c["sampler"] in POSITIONAL and not c["share"])


def make_data(fmt: str, root: Path, record_size: int = RECORD_SIZES[0]) -> str:
    rng = np.random.default_rng(11)
    root.mkdir(parents=True, exist_ok=True)
    if fmt == "jpeg":
        from PIL import Image
        for i in range(N):
            d = root / "jpegs" / f"c{i % 3}"
            d.mkdir(parents=True, exist_ok=True)
            w, h = (int(k) for k in rng.integers(36, 90, 2))
            px = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
            Image.fromarray(px).save(d / f"{i:04d}.jpg", quality=85)
        return str(root / "jpegs")
    if fmt.startswith("mixture"):
        # Three sources, equally weighted, ids one source after another.
        # Of a third of the records each, every source's last draw is at
        # the same priority, so an epoch is each record once; of SHORT's
        # sizes, the first runs out first, the others left part read.
        sizes = SHORT if fmt == "mixture_short" else (N // 3,) * 3
        rng_ = np.random.default_rng(12)
        lines = root / "m.jsonl"
        with open(lines, "w") as f:
            for i in range(sizes[0]):
                f.write(json.dumps({"id": i, "text": "m" * int(rng_.integers(1, 300))}) + "\n")
        for i in range(sizes[1]):
            d = root / "mtree" / f"c{i % 2}"
            d.mkdir(parents=True, exist_ok=True)
            (d / f"{i:04d}.bin").write_bytes(rng_.integers(0, 256, int(rng_.integers(20, 600)), dtype=np.uint8).tobytes())
        arr = root / "m.npy"
        np.save(arr, rng_.integers(0, 256, (sizes[2], 64), dtype=np.uint8))
        return [[str(lines), 1], [str(root / "mtree"), 1], [str(arr), 1]]
    if fmt == "fixed":
        p = root / "d.bin"
        p.write_bytes(rng.integers(0, 256, N * record_size, dtype=np.uint8).tobytes())
        return str(p)
    if fmt == "npy":
        # Rows of a structured dtype, as numpy writes it: 40-byte records that straddle pages.
        p = root / "d.npy"
        rows = np.zeros(N, [("x", "<f4", (8,)), ("id", "<i8")])
        rows["x"], rows["id"] = rng.random((N, 8)), np.arange(N)
        np.save(p, rows)
        return str(p)
    if fmt == "tfrecord":
        p = root / "d.tfrecord"
        p.write_bytes(tfrecord_frames([rng.integers(0, 256, int(rng.integers(0, 700)), dtype=np.uint8).tobytes()
                                       for _ in range(N)]))
        return str(p)
    if fmt == "lines":
        p = root / "d.jsonl"
        with open(p, "w") as f:
            for i in range(N):
                f.write(json.dumps({"id": i, "text": "x" * int(rng.integers(1, 400))}) + "\n")
        return str(p)
    if fmt == "libsvm":
        p = root / "d.svm"
        with open(p, "w") as f:
            for i in range(N):
                feats = sorted(set(int(k) for k in rng.integers(1, 20, int(rng.integers(1, 8)))))
                f.write(f"{i % 3} " + " ".join(f"{k}:{rng.random():.4f}" for k in feats) + "\n")
        return str(p)
    if fmt == "dir":
        for i in range(N):
            d = root / "tree" / f"c{i % 3}"
            d.mkdir(parents=True, exist_ok=True)
            (d / f"{i:04d}.bin").write_bytes(rng.integers(0, 256, int(rng.integers(20, 600)), dtype=np.uint8).tobytes())
        return str(root / "tree")
    if fmt == "tar":
        p = root / "d.tar"
        with tarfile.open(p, "w") as t:
            for i in range(N):
                for ext, n in (("cls", 2), ("bin", int(rng.integers(10, 900)))):
                    data = str(i % 5).encode() if ext == "cls" else rng.integers(0, 256, n, dtype=np.uint8).tobytes()
                    info = tarfile.TarInfo(f"s{i:05d}.{ext}")
                    info.size = len(data)
                    import io
                    t.addfile(info, io.BytesIO(data))
        return str(p)
    if fmt == "arrow":
        pa = pytest.importorskip("pyarrow")
        p = root / "d.arrow"
        table = pa.table({"id": pa.array(range(N), pa.int64()),
                          "text": pa.array(["y" * int(k) for k in rng.integers(0, 300, N)]),
                          "v": pa.array(rng.random(N))})
        with pa.ipc.new_file(str(p), table.schema) as w:
            for b in table.to_batches(max_chunksize=97):
                w.write_batch(b)
        return str(p)
    if fmt == "parquet":
        pa = pytest.importorskip("pyarrow")
        pq = pytest.importorskip("pyarrow.parquet")
        p = root / "d.parquet"
        table = pa.table({"id": pa.array(range(N), pa.int64()),
                          "text": pa.array(["z" * int(k) for k in rng.integers(0, 300, N)]),
                          "v": pa.array(rng.random(N))})
        # Small pages in four row groups: the default order reads many pages, a few per batch.
        pq.write_table(table, str(p), row_group_size=150, data_page_size=2048)
        return str(p)
    raise ValueError(fmt)


# The ids= of a case with a subset: three in five records, by a hash of the id.
SUBSET = [i for i in range(N) if (i * 2654435761) % 5 < 3]


def options(c: dict) -> dict:
    kw: dict = {}
    if c.get("subset"):
        kw["ids"] = SUBSET
    if c["format"] == "fixed":
        kw["record_size"] = c.get("record_size", RECORD_SIZES[0])
    if c["transform"]:
        kw["transform"] = c["transform"] if isinstance(c["transform"], str) else TRANSFORMS[c["format"]]
    s = c["sampler"]
    if s == "opportunistic":
        kw.update(sampler="global", opportunistic=2)
    elif s == "block" and c["format"] == "parquet":
        kw.update(sampler="block", window=4)  # over the file's own pages
    elif s == "block":
        kw.update(sampler="block", block_size=4096, window=4)
    elif s == "buffered":
        kw.update(sampler="buffered", block_size=4096, buffer=128)
    elif s == "reservoir":
        kw.update(sampler="reservoir", reservoir=128)
    else:
        kw["sampler"] = s
    if c["share"]:
        kw["share"] = True
    if c.get("direct") is not None and c.get("where") != "s3":
        kw["direct"] = c["direct"]  # an object is read by ranged GETs: direct= is about local files
    return kw


def digest(b: bytes) -> str:
    return hashlib.blake2b(b, digest_size=8).hexdigest()


def source(path) -> dict:
    """The loader keywords naming a case's data: its paths, or a mixture's sources."""
    return {"mixture": path} if isinstance(path, list) else {"paths": path}


def reference(path, c: dict, seed: int = 0, epoch: int = 0) -> dict[int, str]:
    """Each record's digest from a solo, sequential read of one job alone (of each source alone, for a mixture,
    its ids after the sources before it); for a random transform, the one of that seed's epoch."""
    kw = {k: v for k, v in options(c).items() if k in ("record_size", "transform")}
    out: dict[int, str] = {}
    first = 0
    for p in ([s for s, _ in path] if isinstance(path, list) else [path]):
        for b in riffle.Loader(p, 64, sampler="sequential", seed=seed, epoch=epoch, **kw):
            for i, d in zip(b.ids, digests(b)):
                out[first + int(i)] = d
        first = len(out)
    return out


def random_transform(c: dict) -> bool:
    return isinstance(c["transform"], str) and c["transform"].startswith("random_")


def digests(b) -> list[str]:
    if b.rows:
        return [digest(json.dumps(r, sort_keys=True).encode()) for r in b.data.to_pylist()]
    return [digest(bytes(b.record(i))) for i in range(b.n)]


RANK = textwrap.dedent("""
    import hashlib, json, os, sys
    sys.path.insert(0, {py!r})
    sys.path.insert(0, {tests!r})
    import torch
    import riffle
    import riffle.torch as rt
    from test_combinations import POSITIONAL, digests, restable, source

    def decode(b):
        return [(int(i), d) for i, d in zip(b.ids, digests(b))]

    def unlabel(batch):
        # (records, labels) where the dataset has labels; DataLoader may make the pair a list.
        if len(batch) == 2 and isinstance(batch[1], torch.Tensor):
            batch = batch[0]
        return [(int(i), str(d)) for i, d in batch]

    def run(rank, world, out, phase):
        case, path, opts, seed = json.load(open({case!r}))
        if case["launch"] == "spawn" and world > 1:
            import torch.distributed as dist
            dist.init_process_group("gloo", init_method="tcp://127.0.0.1:{port}", rank=rank, world_size=world)
        kw = dict(opts, seed=seed, decode=decode, rank=rank, world_size=world)
        if phase == 1:
            dl = rt.loader(batch_size=case["batch"], num_workers=case["workers"], **source(path), **kw)
            head, n0 = [], len(dl)
            it = iter(dl)
            for _ in range(case["stop"]):
                try:
                    head.append(unlabel(next(it)))
                except StopIteration:
                    break
            # A shared order's ranks each know only their own records: under
            # mp.spawn they gather every rank's (a collective), else each
            # saves its own and the resume merges them.
            gather = restable(case) and case["launch"] == "spawn" and world > 1
            with open(f"{{out}}.head.{{rank}}", "w") as f:
                json.dump({{"head": head, "state": dl.state_dict(all_ranks=gather), "done": len(head) >= n0}}, f)
            if case["launch"] == "spawn" and world > 1:
                dist.destroy_process_group()
            return
        # Resumed as after a kill: a new loader, maybe with other worker and
        # rank counts; an elastic order from rank 0's state, as users save it,
        # a shared one from every rank's.
        if restable(case) and case["world"] > 1 and (case["world"] != world or case["workers"] != case["resume_workers"]
                                                      or case["launch"] == "spawn"):
            # Every rank's state, merged (gathered already under mp.spawn):
            # every rank resumes at its epoch, done when all were.
            heads = [json.load(open(f"{{out}}.head.{{r}}")) for r in range(case["world"])]
            state = heads[0]["state"]
            if "ranks" not in state:
                state = riffle.merge_states([h["state"] for h in heads])
            saved = {{"state": state, "done": all(h["done"] for h in heads)}}
        else:
            mine = 0 if (case["sampler"] in POSITIONAL and not case["share"]) or case["world"] == 1 else rank
            saved = json.load(open(f"{{out}}.head.{{mine}}"))
        dl = rt.loader(batch_size=case["batch"], num_workers=case["resume_workers"], **source(path), **kw)
        dl.load_state_dict(saved["state"])
        epochs = [[], []]
        # A stop after the epoch's last batch resumes at the next epoch.
        for e in range(1 if saved["done"] else 0, 2):
            for batch in dl:
                epochs[e].append(unlabel(batch))
        with open(f"{{out}}.{{rank}}", "w") as f:
            json.dump(epochs, f)
        if case["launch"] == "spawn" and world > 1:
            dist.destroy_process_group()  # gloo's threads abort the process if it exits with them

    if __name__ == "__main__":
        case = json.load(open({case!r}))[0]
        phase = int(sys.argv[1])
        world = case["world"] if phase == 1 else case["resume_world"]
        if case["launch"] == "spawn" and world > 1:
            import torch.multiprocessing as mp
            mp.spawn(run, args=(world, {out!r}, phase), nprocs=world)
        else:
            run(int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)), {out!r}, phase)
""")


def run_case(c: dict, tmp: Path, s3: S3Server) -> None:
    local = tmp / "data"
    if c.get("where") == "s3":
        local = s3.bucket / tmp.name  # an object is a file of the server's back end
    path = make_data(c["format"], local, c.get("record_size", RECORD_SIZES[0]))
    # The reference reads the file the server serves, not through it.
    ref = reference(path, c)
    if c.get("where") == "s3":
        path = "s3://bkt/" + str(Path(path).relative_to(s3.bucket))
    assert len(ref) == N
    # A random transform's outputs are functions of (seed, epoch, record): each job's epoch has its own reference.
    refs = {(job, e): reference(path, c, 100 + job, e) if random_transform(c) else ref
            for job in range(c["jobs"]) for e in range(EPOCHS)}
    outs = []
    for phase, world in ((1, c["world"]), (2, c["resume_world"])):
        procs = []
        for job in range(c["jobs"]):
            case = tmp / f"case{job}.json"
            case.write_text(json.dumps([c, path, options(c), 100 + job]))
            out = str(tmp / f"out{job}")
            script = tmp / f"job{job}-{phase}.py"
            script.write_text(RANK.format(py=str(REPO / "python"), tests=str(Path(__file__).parent), case=str(case),
                                          port=free_port(), out=out))
            if phase == 1:
                outs.append(out)
            if c["launch"] == "spawn" and world > 1:
                procs.append(subprocess.Popen([sys.executable, str(script), str(phase)], stdout=subprocess.PIPE,
                                              stderr=subprocess.PIPE, text=True))
            else:
                for r in range(world):
                    procs.append(subprocess.Popen([sys.executable, str(script), str(phase)], stdout=subprocess.PIPE,
                                                  stderr=subprocess.PIPE, text=True,
                                                  env=dict(os.environ, RANK=str(r), WORLD_SIZE=str(world))))
        for p in procs:
            _, err = p.communicate(timeout=600)
            assert p.returncode == 0, f"{c}: phase {phase}: {err[-3000:]}"
    for job, out in enumerate(outs):
        for e in range(EPOCHS):
            seen: dict[int, int] = {}
            batches = []
            if e == 0:
                batches += [(r, b) for r in range(c["world"]) for b in json.load(open(f"{out}.head.{r}"))["head"]]
            batches += [(r, b) for r in range(c["resume_world"]) for b in json.load(open(f"{out}.{r}"))[e]]
            for r, batch in batches:
                for rid, d in batch:
                    assert d == refs[job, e][rid], f"{c}: job {job} epoch {e} rank {r}: record {rid}'s bytes are not a solo read's"
                    seen[rid] = seen.get(rid, 0) + 1
            repeats = sum(k - 1 for k in seen.values())
            want = set(SUBSET if c.get("subset") else range(N))
            assert set(seen) <= want, f"{c}: job {job} epoch {e}: records outside the subset"
            lost = sorted(want - set(seen))
            # The rest of an epoch resumed on another number of ranks is
            # padded as DistributedSampler pads: at most ranks-1 repeats.
            # A shared order's rest, resumed from every rank's places on
            # any topology, deals its ranks equal parts the same way.
            pad = c["resume_world"] - 1 if e == 0 and (c["resume_world"] != c["world"] or restable(c)) else 0
            if c["format"] == "mixture_short":
                # The first source's records each once; as many of each other's, each at most once.
                lost = sorted(set(range(SHORT[0])) - set(seen))
                ends = np.cumsum(SHORT)
                per = [sum(k for rid, k in seen.items() if (ends[i] - SHORT[i]) <= rid < ends[i]) for i in range(3)]
                assert all(SHORT[0] <= n <= SHORT[0] + pad for n in per), f"{c}: job {job} epoch {e}: {per} a source"
            assert repeats <= pad and not lost, f"{c}: job {job} epoch {e}: {repeats} repeated, {len(lost)} lost"


def cases() -> list[dict]:
    kept = json.loads(REGRESSIONS.read_text()) if REGRESSIONS.exists() else []
    rng = random.Random(int(os.environ.get("RIFFLE_COMBINATIONS_SEED", "22")))
    return kept + [draw(rng) for _ in range(int(os.environ.get("RIFFLE_COMBINATIONS", "8")))]


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    server = S3Server(tmp_path_factory.mktemp("s3"))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def daemon(tmp_path_factory, bin_path, s3):
    """This module's daemon: it counts 1 KiB of a job's files as what the page cache keeps, so that a job leaving
    direct= unset reads a shuffled file with O_DIRECT as it would one many times larger than memory; it reaches
    the module's S3 server and keeps its objects' blocks in 1 MiB of disk, less than a case's dataset."""
    with pytest.MonkeyPatch.context() as mp:
        for k, v in s3.env.items():
            mp.setenv(k, v)
        d = Daemon(str(tmp_path_factory.mktemp("sock") / "riffle.sock"), "--page-cache", "1KiB",
                   "--cache-dir", str(tmp_path_factory.mktemp("blocks")), "--cache-dir-bytes", "1MiB")
    yield d
    d.stop()


@pytest.mark.parametrize("case", cases(), ids=lambda c: "-".join(f"{v}" for v in c.values()))
def test_combination(daemon, s3, tmp_path, case):
    try:
        run_case(case, tmp_path, s3)
    except Exception:
        kept = json.loads(REGRESSIONS.read_text()) if REGRESSIONS.exists() else []
        if case not in kept and not os.environ.get("CI"):
            REGRESSIONS.write_text(json.dumps(kept + [case], indent=1) + "\n")
        raise


def test_direct_is_the_daemons_choice(daemon, tmp_path):
    """With direct= unset the daemon decides, and says so: a shuffle of a file many times what it counts the page
    cache keeping (64x) is read with O_DIRECT; file order, a file of 6x (whose pages, of 64 records each, the cache
    would answer 1 read in 6), and direct=False are read through the cache."""
    from conftest import write_fixed
    big, small = write_fixed(tmp_path / "big.bin", 1000, 64), write_fixed(tmp_path / "small.bin", 100, 64)
    ld = riffle.Loader(str(big), 64, record_size=64)
    assert ld.direct is True
    it = iter(ld)
    next(it)  # the job is open: status says how it reads
    jobs = [j for g in status(daemon.sock).get("groups") or [] if str(big) in g["source"] for j in g["jobs"]]
    assert [j.get("direct") for j in jobs] == [True], jobs
    del it
    assert riffle.Loader(str(big), 64, record_size=64, direct=False).direct is False
    assert riffle.Loader(str(big), 64, record_size=64, shuffle=False).direct is False
    assert riffle.Loader(str(small), 64, record_size=64).direct is False
    assert riffle.Loader(str(small), 64, record_size=64, shuffle=False, direct=True).direct is True


def test_draws_cover_every_value():
    """The draw reaches every value of every dimension (over enough draws)."""
    rng = random.Random(1)
    seen: dict[str, set] = {}
    for _ in range(2000):
        for k, v in draw(rng).items():
            seen.setdefault(k, set()).add(v)
    assert seen["format"] == set(FORMATS) and seen["sampler"] == set(SAMPLERS)
    assert seen["jobs"] == {1, 2, 3} and seen["workers"] == {0, 1, 2, 3} and seen["world"] == {1, 2, 3}
    assert seen["resume_world"] == {1, 2, 3}
    assert seen["share"] == {True, False} and seen["launch"] == {"env", "spawn"}
    assert seen["transform"] == {True, False, *TRANSFORMS["jpeg"]}
    assert seen["direct"] == set(DIRECT)
    assert seen["where"] == set(WHERE)
