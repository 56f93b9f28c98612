"""Features combined the way PyTorch users combine them (issue 22's five
silent failures), each run as a user runs it, and every record's bytes
compared with a solo read of the file."""

from __future__ import annotations

import base64
import itertools
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

import riffle
import riffle.torch as rt
from conftest import REPO, free_port


def write_files(root, n: int = 2000, lo: int = 100, hi: int = 1000) -> dict[str, bytes]:
    """A directory of n files of lo to hi bytes in two class folders, each file's bytes its own."""
    rng = np.random.default_rng(7)
    out = {}
    for i in range(n):
        d = root / f"c{i % 2}"
        d.mkdir(parents=True, exist_ok=True)
        p = d / f"{i:05d}.bin"
        data = f"{i:05d}".encode() + rng.integers(0, 256, int(rng.integers(lo, hi + 1)) - 5, dtype=np.uint8).tobytes()
        p.write_bytes(data)
        out[str(p)] = data
    return out


SHARE_JOB = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, {py!r})
    import riffle
    ld = riffle.Loader({root!r}, batch_size=64, share=True, seed={seed})
    files = json.load(open({index!r}))
    wrong, counts = 0, []
    for epoch in range(3):
        seen = []
        for b in ld:
            where = ld.locate([int(i) for i in b.ids])
            for i in range(b.n):
                seen.append(int(b.ids[i]))
                if bytes(b.record(i)) != bytes.fromhex(files[where[i][0]]):
                    wrong += 1
        counts.append([len(seen), len(set(seen))])
    print(json.dumps({{"wrong": wrong, "counts": counts, "shared": ld.info().get("shared")}}))
""")


def test_share_variable_size_records_three_jobs(daemon, tmp_path):
    """Failure 1: three sharing jobs over files of 100 to 1000 bytes, at once."""
    files = write_files(tmp_path / "tree")
    index = tmp_path / "files.json"
    index.write_text(json.dumps({p: d.hex() for p, d in files.items()}))
    procs = [subprocess.Popen([sys.executable, "-c", SHARE_JOB.format(py=str(REPO / "python"), root=str(tmp_path / "tree"),
                                                                      seed=seed, index=str(index))],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for seed in (1, 2, 3)]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
        got = json.loads(out)
        assert got["shared"], "the job did not join the group"
        assert got["wrong"] == 0, got
        assert got["counts"] == [[len(files), len(files)]] * 3, got


def write_ids(path, n: int) -> str:
    np.save(path, np.arange(n, dtype=np.int64).reshape(n, 1))
    return str(path)


def epoch_ids(dl) -> list[int]:
    return [int(i) for t in dl for i in t.reshape(-1)]


def test_share_with_workers_delivers_every_record(daemon, tmp_path):
    """Failure 2: share=True with num_workers=2 delivers each of 1,000 ids once per epoch, and len() says how many batches."""
    path = write_ids(tmp_path / "ids.npy", 1000)
    dl = rt.loader(path, 100, num_workers=2, share=True, seed=3)
    for _ in range(2):
        batches = list(dl)
        ids = [int(i) for t in batches for i in t.reshape(-1)]
        assert sorted(ids) == list(range(1000))
        assert len(batches) == len(dl)


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_resume_with_workers_then_whole_epochs(daemon, tmp_path, workers):
    """Failure 3: 3 of 10 batches, state_dict, a new loader resumes: epochs hold 700, 1000, 1000 samples."""
    path = write_ids(tmp_path / "ids.npy", 1000)
    dl = rt.loader(path, 100, num_workers=workers, seed=5)
    it = iter(dl)
    head = [int(i) for _ in range(3) for i in next(it).reshape(-1)]
    state = dl.state_dict()
    del it
    dl2 = rt.loader(path, 100, num_workers=workers, seed=5)
    dl2.load_state_dict(state)
    rest = epoch_ids(dl2)
    assert len(rest) == 700 and sorted(head + rest) == list(range(1000))
    for _ in range(2):
        assert sorted(epoch_ids(dl2)) == list(range(1000))
    # The same with persistent workers, whose dataset copy must take the state too.
    dl3 = rt.loader(path, 100, num_workers=workers, seed=5, persistent_workers=True)
    epoch_ids(dl3)
    dl3.load_state_dict(state)
    rest3 = epoch_ids(dl3)
    assert sorted(head + rest3) == list(range(1000))
    assert sorted(epoch_ids(dl3)) == list(range(1000))


@pytest.mark.parametrize("sampler", ["global", "reservoir"])
def test_resume_at_every_batch_with_workers(daemon, tmp_path, sampler):
    """A checkpoint after any batch resumes exactly, with 2 workers: also after a worker's last batch of the
    epoch, when the other still has one (that worker's place is then the next epoch's start, and resumed it
    used to deliver the next epoch's batches inside this one)."""
    path = write_ids(tmp_path / "ids.npy", 500)
    kw = dict(num_workers=2, seed=9, sampler=sampler)
    if sampler == "reservoir":
        kw["reservoir"] = 64
    n = len(rt.loader(path, 100, **kw))
    for stop in range(1, n + 1):
        dl = rt.loader(path, 100, **kw)
        it = iter(dl)
        head = [int(i) for _ in range(stop) for i in next(it).reshape(-1)]
        state = dl.state_dict()
        del it
        dl2 = rt.loader(path, 100, **kw)
        dl2.load_state_dict(state)
        rest = epoch_ids(dl2) if stop < n else []
        assert sorted(head + rest) == list(range(500)), f"stop after batch {stop} of {n}"
        assert sorted(epoch_ids(dl2)) == list(range(500)), f"the epoch after a stop after batch {stop}"


SPAWN = textwrap.dedent("""
    import json, os, sys
    sys.path.insert(0, {py!r})
    import torch, torch.distributed as dist, torch.multiprocessing as mp
    import riffle.torch as rt

    def run(rank, world, port, path, out):
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{{port}}", rank=rank, world_size=world)
        torch.manual_seed(rank)  # per-rank seeds, as for augmentation: the drawn data seed is still shared
        dl = rt.loader(path, 50, num_workers=2)
        res = {{"len": len(dl), "epochs": []}}
        for epoch in range(2):
            batches = [[int(i) for i in t.reshape(-1)] for t in dl]
            res["epochs"].append(batches)
        with open(f"{{out}}.{{rank}}", "w") as f:
            json.dump(res, f)
        dist.destroy_process_group()

    if __name__ == "__main__":
        mp.spawn(run, args=(2, {port}, {path!r}, {out!r}), nprocs=2)
""")


def test_mp_spawn_ddp_with_workers(daemon, tmp_path):
    """Failure 4: DDP by mp.spawn with num_workers=2: each rank reads its half, and len() is what arrives."""
    path = write_ids(tmp_path / "ids.npy", 1000)
    out = str(tmp_path / "rank")
    script = tmp_path / "spawn.py"
    script.write_text(SPAWN.format(py=str(REPO / "python"), port=free_port(), path=path, out=out))
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    ranks = [json.load(open(f"{out}.{r}")) for r in range(2)]
    for e in range(2):
        parts = [[i for b in r["epochs"][e] for i in b] for r in ranks]
        assert len(parts[0]) == len(parts[1]) == 500
        assert sorted(parts[0] + parts[1]) == list(range(1000))
    for r in ranks:
        assert r["len"] == len(r["epochs"][0]) == 10


def test_seed_follows_torch_manual_seed(daemon, tmp_path):
    """Failure 5: with no seed=, torch.manual_seed decides the order; the drawn seed is in state_dict and follows it."""
    path = write_ids(tmp_path / "ids.npy", 1000)

    def first_epoch(s):
        torch.manual_seed(s)
        dl = rt.loader(path, 100)
        return epoch_ids(dl), dl

    a, dla = first_epoch(1)
    b, _ = first_epoch(1)
    c, _ = first_epoch(2)
    assert a == b and a != c
    assert sorted(c) == list(range(1000))
    st = dla.state_dict()
    assert st["seed"] == dla.dataset.seed
    # A resumed run seeded otherwise takes the checkpoint's seed: the next epoch is the same.
    torch.manual_seed(99)
    dlr = rt.loader(path, 100)
    dlr.load_state_dict(st)
    assert epoch_ids(dlr) == epoch_ids(dla)
    # An explicit seed that disagrees with the checkpoint is refused.
    with pytest.raises(ValueError):
        rt.loader(path, 100, seed=st["seed"] + 1).load_state_dict(st)


@pytest.mark.parametrize("before,after", [(2, 0), (2, 3), (0, 2), (3, 1), (1, 2)])
@pytest.mark.parametrize("sampler", ["global", "block", "sequential"])
def test_resume_on_another_worker_count(daemon, tmp_path, before, after, sampler):
    """A state saved with some DataLoader workers resumes with others: the epoch's rest exactly once, in the
    uninterrupted run's batches, then whole epochs."""
    path = write_ids(tmp_path / "ids.npy", 1000)
    kw = dict(seed=9, sampler=sampler, block_size=800 if sampler == "block" else None)
    kw = {k: v for k, v in kw.items() if v is not None}
    whole = [[int(i) for i in t.reshape(-1)] for t in rt.loader(path, 100, num_workers=after, **kw)]
    dl = rt.loader(path, 100, num_workers=before, **kw)
    it = iter(dl)
    head = [[int(i) for i in next(it).reshape(-1)] for _ in range(4)]
    state = dl.state_dict()
    del it
    dl2 = rt.loader(path, 100, num_workers=after, **kw)
    dl2.load_state_dict(state)
    rest = [[int(i) for i in t.reshape(-1)] for t in dl2]
    assert head + rest == whole
    assert sorted(epoch_ids(dl2)) == list(range(1000))


def test_resume_on_another_worker_count_for_shared(daemon, tmp_path):
    """A shared order's state saved with 2 workers resumes with 3 as the rest of the epoch: each record once."""
    path = write_ids(tmp_path / "ids.npy", 1000)
    dl = rt.loader(path, 100, num_workers=2, share=True, seed=3)
    it = iter(dl)
    head = [int(i) for i in next(it).reshape(-1)]
    state = dl.state_dict()
    del it
    dl2 = rt.loader(path, 100, num_workers=3, share=True, seed=3)
    dl2.load_state_dict(state)
    assert sorted(head + epoch_ids(dl2)) == list(range(1000))


def own_daemon(tmp_path, monkeypatch):
    """A daemon of the test's own, on a socket in a private directory, that the loaders use."""
    from conftest import Daemon
    sock_dir = tmp_path / "run"
    sock_dir.mkdir(mode=0o700)
    d = Daemon(str(sock_dir / "riffle.sock"))
    monkeypatch.setenv("RIFFLE_SOCKET", d.sock)
    return d


@pytest.mark.parametrize("workers", [0, 2])
def test_daemon_restart_mid_epoch_loses_nothing(tmp_path, monkeypatch, workers):
    """kill -9 of the daemon mid-epoch: the loader reconnects to the daemon started again, reopens its job where
    it was and goes on; the epoch holds every record once, and so does the next."""
    d = own_daemon(tmp_path, monkeypatch)
    sock = d.sock
    path = write_ids(tmp_path / "ids.npy", 1000)
    dl = rt.loader(path, 100, num_workers=workers, seed=4, autostart=False, reconnect=30.0)
    try:
        ids = []
        for k, t in enumerate(dl):
            ids += [int(i) for i in t.reshape(-1)]
            if k == 2:
                d.stop()  # SIGKILL
                d = type(d)(sock)  # a supervisor starts it again
        assert sorted(ids) == list(range(1000))
        assert sorted(epoch_ids(dl)) == list(range(1000))
    finally:
        d.stop()


@pytest.mark.parametrize("workers", [0, 2])
def test_shared_jobs_survive_a_daemon_restart(tmp_path, monkeypatch, workers):
    """kill -9 of the daemon under two jobs sharing an order, twice: the group was the daemon's, so each loader
    rebuilds its place from the ids it delivered and reopens into the new daemon's group; each job's epoch holds
    every record once (its bytes its id), and so does the next."""
    d = own_daemon(tmp_path, monkeypatch)
    sock = d.sock
    path = write_ids(tmp_path / "ids.npy", 1000)
    dl = rt.loader(path, 100, num_workers=workers, share=True, seed=4, autostart=False, reconnect=30.0)
    other = riffle.Loader(path, batch_size=40, share=True, seed=9, autostart=False, reconnect=30.0)
    try:
        ids, theirs = [], []
        them = iter(other)
        for k, t in enumerate(dl):
            ids += [int(i) for i in t.reshape(-1)]
            for b in itertools.islice(them, 2):
                assert b.ids.tolist() == [int(np.frombuffer(r, np.int64)[0]) for r in b.records()]
                theirs += b.ids.tolist()
            if k in (3, 6):
                d.stop()  # SIGKILL, twice: the second rebuilds from a state the first rebuilt
                d = type(d)(sock)  # a supervisor starts it again
        theirs += [i for b in them for i in b.ids.tolist()]
        assert sorted(ids) == list(range(1000))
        assert sorted(theirs) == list(range(1000))
        assert sorted(epoch_ids(dl)) == list(range(1000))
        assert sorted(i for b in other for i in b.ids.tolist()) == list(range(1000))
    finally:
        d.stop()


def test_shared_state_asked_after_the_daemon_went(tmp_path, monkeypatch):
    """A shared job's state is the daemon's, asked when a batch's state is: asked after the daemon was killed, the
    loader gives the state it kept of that batch's place (later batches came since), and a loader resuming from it
    in a new daemon delivers exactly the rest of the epoch."""
    d = own_daemon(tmp_path, monkeypatch)
    sock = d.sock
    path = write_ids(tmp_path / "ids.npy", 1000)
    ld = riffle.Loader(path, batch_size=30, share=True, seed=5, autostart=False, reconnect=0)
    it = iter(ld)
    head = []
    for _ in range(4):
        b = next(it)
        head += b.ids.tolist()
    later = [next(it) for _ in range(3)]
    d.stop()  # SIGKILL
    d = type(d)(sock)
    try:
        state = b.state
        assert state["batch"] == 4 and base64.b64decode(state["sampler_state"]).startswith(b"RFBIT1")
        del later, b
        ld.close()
        ld2 = riffle.Loader(path, batch_size=30, share=True, seed=5, autostart=False)
        ld2.load_state_dict(state)
        rest = [i for b in ld2 for i in b.ids.tolist()]
        assert sorted(head + rest) == list(range(1000))
    finally:
        d.stop()


def test_daemon_gone_for_good_raises_after_the_timeout(tmp_path, monkeypatch):
    d = own_daemon(tmp_path, monkeypatch)
    path = write_ids(tmp_path / "ids.npy", 1000)
    ld = riffle.Loader(path, 100, autostart=False, reconnect=0.5)
    it = iter(ld)
    next(it)
    d.stop()
    with pytest.raises(riffle.DaemonGone, match="within 0.5s"):
        for _ in it:
            pass


def test_data_changed_between_epochs_is_an_error(daemon, tmp_path):
    """Files removed after the loader was built: the next epoch says so and what to do, never runs on fewer."""
    root = tmp_path / "tree"
    files = write_files(root, n=300)
    ld = riffle.Loader(str(root), batch_size=50, seed=1)
    assert sum(b.n for b in ld) == 300
    for p in list(files)[:30]:
        os.remove(p)
    # The loader's job reads on into the next epoch: the change is found before its first batch.
    with pytest.raises(riffle.DataChanged, match="build a new loader"):
        for _ in ld:
            pass
    # A new job over the changed files: the loader says the data changed and what to do.
    with pytest.raises(riffle.DataChanged, match="build a new loader"):
        for _ in ld:
            pass
    assert sum(b.n for b in riffle.Loader(str(root), batch_size=50, seed=1)) == 270


@pytest.mark.parametrize("workers,persistent", [(0, False), (1, False), (2, True)])
def test_data_changed_with_workers_and_ranks_is_an_error(daemon, tmp_path, workers, persistent):
    """Lines appended after the loaders were built, between rank 0's epoch and rank 1's: with or without
    DataLoader workers (which build their loaders as each epoch starts), rank 1's epoch and then rank 0's next
    say the data changed and deliver nothing; no rank reads the grown file as another dataset than its others."""
    p = tmp_path / "a.jsonl"
    lines = [json.dumps({"i": i}) + "\n" for i in range(450)]
    p.write_text("".join(lines[:400]))
    kw = {"persistent_workers": True} if persistent else {}
    dls = [rt.loader(str(p), 32, seed=1, num_workers=workers, rank=r, world_size=2,
                     decode=lambda b: [int(i) for i in b.ids], **kw) for r in range(2)]
    assert sorted(i for dl in dls for b in dl for i in b) == list(range(400))
    mine = [i for b in dls[0] for i in b]  # rank 0's next epoch, before the change
    assert len(mine) == 200 and set(mine) < set(range(400))
    with open(p, "a") as f:
        f.write("".join(lines[400:]))
    got = []
    for dl in (dls[1], dls[0]):
        with pytest.raises(riffle.DataChanged, match="build a new loader"):
            for b in dl:
                got += b
    assert got == [], f"{len(got)} records delivered from changed data"


def test_workers_forked_while_another_thread_connects(daemon, tmp_path):
    """DataLoader forks its workers from whatever threads the user runs: a worker forked while another thread was
    inside connect() (holding its lock, as while a daemon starts) reads its epoch, never waits on the lock the
    fork copied held (DataLoader's timeout= would end the wait as an error)."""
    import threading
    from riffle import connection
    np.save(tmp_path / "a.npy", np.arange(4000, dtype=np.int64).reshape(1000, 4))
    dl = rt.loader(str(tmp_path / "a.npy"), 50, seed=1, num_workers=1, timeout=10)
    held, done = threading.Event(), threading.Event()

    def connecting():
        with connection._conn_lock:  # the module's: a fork rebinds it
            held.set()
            done.wait(30)  # past the DataLoader's timeout: a worker waiting on the lock fails

    t = threading.Thread(target=connecting)
    t.start()
    held.wait()
    try:
        rows = torch.cat([b for b in dl])  # not list(dl), whose len() would wait for the lock before the fork
    finally:
        done.set()
        t.join()
    assert sorted(rows[:, 0].tolist()) == list(range(0, 4000, 4))


def test_dataloader_where_code_checks(daemon, tmp_path):
    """len(dataset) is samples, len(loader) batches, loader.batch_size the batch size, dataset[i] one sample,
    and an ImageFolder tree has samples, targets and classes as ImageFolder's."""
    root = tmp_path / "tree"
    files = write_files(root, n=300)
    dl = rt.loader(str(root), 64, seed=2)
    assert len(dl.dataset) == 300 and len(dl) == 5 and dl.batch_size == 64
    assert dl.dataset.classes == ["c0", "c1"] and dl.dataset.class_to_idx == {"c0": 0, "c1": 1}
    samples = dl.dataset.samples
    assert len(samples) == 300 and sorted(p for p, _ in samples) == sorted(files)
    assert all(c == int(os.path.basename(os.path.dirname(p))[1:]) for p, c in samples)
    assert dl.dataset.targets == [c for _, c in samples]
    for i in (0, 17, 299, -1):
        x, y = dl.dataset[i]
        path, cls = samples[i]
        assert bytes(x) == files[path] and y == cls
    with pytest.raises(IndexError):
        dl.dataset[300]
    # With workers, len(loader) is what arrives.
    dlw = rt.loader(str(root), 64, seed=2, num_workers=2)
    assert len(list(dlw)) == len(dlw) == 5


def _numpy_gone(x):
    raise RuntimeError("Numpy is not available")


def test_environment_error_is_itself(daemon, tmp_path):
    """A transform that fails for the environment (numpy 2 under a torch for numpy 1) is reported as itself."""
    path = write_ids(tmp_path / "ids.npy", 100)
    dl = rt.loader(path, 10, seed=1, transform=_numpy_gone)
    with pytest.raises(RuntimeError, match="Numpy is not available") as e:
        next(iter(dl))
    assert not isinstance(e.value, rt.RecordError)


def test_imagefolder_takes_only_images(daemon, tmp_path):
    """A labels.csv inside a class folder is no record, as torchvision's ImageFolder takes only IMG_EXTENSIONS;
    extensions= chooses others; the samples equal torchvision's."""
    from PIL import Image
    from torchvision.datasets import ImageFolder
    root = tmp_path / "imgs"
    for c in ("cat", "dog"):
        (root / c).mkdir(parents=True)
        for i in range(5):
            Image.new("RGB", (8, 8), (i * 40, 10, 200)).save(root / c / f"{i}.png")
        (root / c / "labels.csv").write_text("a,b\n")
    want = ImageFolder(str(root))
    dl = rt.loader(str(root), 4, decode="image", seed=1)
    assert [(p, c) for p, c in dl.dataset.samples] == [(p, c) for p, c in want.samples]
    got = [img.size for batch, _ in dl for img in batch]
    assert len(got) == 10
    # The plain loader takes every file, or the endings asked for.
    assert riffle.Loader(str(root), 4).info()["records"] == 12
    assert riffle.Loader(str(root), 4, extensions=["csv"]).info()["records"] == 2


def test_imagefolder_is_valid_file(daemon, tmp_path):
    """is_valid_file= chooses the records as ImageFolder's does: the samples equal torchvision's."""
    from PIL import Image
    from torchvision.datasets import ImageFolder
    root = tmp_path / "imgs"
    for c in ("cat", "dog"):
        (root / c).mkdir(parents=True)
        for i in range(6):
            Image.new("RGB", (8, 8), (i * 40, 10, 200)).save(root / c / f"{i}.png")
    def keep(p):
        return p.endswith(".png") and int(os.path.basename(p)[0]) % 2 == 0
    want = ImageFolder(str(root), is_valid_file=keep)
    dl = rt.loader(str(root), 4, decode="image", seed=1, is_valid_file=keep)
    got = sorted(p for p, _ in (dl.dataset.samples[i] for i in dl.dataset.loader_kwargs["subset"]))
    assert got == sorted(p for p, _ in want.samples)
    assert sum(len(b) for b, _ in dl) == len(want) == 6
    assert len(dl.dataset) == 6
