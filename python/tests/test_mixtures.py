"""Weighted mixtures (issue 26): proportions, each source exactly once per
its own epoch, weights changed mid-run and kept in the state, resume on
another topology, and the refusals."""

from __future__ import annotations

import collections

import numpy as np
import pytest

import riffle
import riffle.torch as rt


def sources(tmp_path, lens=(300, 1000, 50)):
    """Sources of rows [source, index], one .npy each."""
    out = []
    for k, n in enumerate(lens):
        a = np.zeros((n, 2), dtype=np.int64)
        a[:, 0], a[:, 1] = k, np.arange(n)
        p = tmp_path / f"s{k}.npy"
        np.save(p, a)
        out.append(str(p))
    return out


def epoch_rows(ld) -> np.ndarray:
    return np.concatenate([b.data.copy() for b in ld])


def test_proportions_and_first_exhausted(daemon, tmp_path):
    paths = sources(tmp_path)
    w = [1.0, 2.0, 0.5]
    ld = riffle.Loader(mixture=list(zip(paths, w)), batch_size=64, seed=3, ordered=True)  # the order inside batches too
    assert ld.offsets == [0, 300, 1300]
    for e in range(2):
        rows = epoch_rows(ld)
        # Each source at most once, the one that ends the epoch (50 at a seventh) whole.
        assert len({tuple(r) for r in rows}) == len(rows)
        cnt = np.bincount(rows[:, 0], minlength=3)
        assert cnt[2] == 50
        share = np.array(w) / sum(w)
        assert np.all(np.abs(cnt - len(rows) * share) < 1), cnt
        # Every prefix of the epoch is within one draw of each source's quota: a schedule, not a coin.
        seen = np.zeros(3)
        for p, r in enumerate(rows, 1):
            seen[r[0]] += 1
            assert np.all(np.abs(seen - p * share) < 1), (p, seen)
        # Each source's rows are its own order's first: ids of one source never repeat across the
        # epoch and come from its records.
        assert all(0 <= i < n for (k, i), n in ((r, (300, 1000, 50)[r[0]]) for r in map(tuple, rows)))


def test_all_exhausted_cycles_each_source(daemon, tmp_path):
    lens = (300, 1000, 50)
    paths = sources(tmp_path, lens)
    # ordered: a batch may hold the end of one of a source's epochs and the start of its next.
    ld = riffle.Loader(mixture=[(p, 1) for p in paths], batch_size=50, seed=4, mixture_stop="all_exhausted", ordered=True)
    rows = np.concatenate([epoch_rows(ld) for _ in range(3)])
    for k, n in enumerate(lens):
        mine = rows[rows[:, 0] == k, 1]
        assert len(mine) >= 3 * 300 if k == 0 else True
        # Its own epochs one after another, each exactly once.
        for e in range(len(mine) // n):
            assert sorted(mine[e * n:(e + 1) * n]) == list(range(n)), (k, e)
        assert len(set(mine[(len(mine) // n) * n:])) == len(mine) % n
    first = rows[:len(rows) // 3]
    assert all(set(first[first[:, 0] == k, 1]) == set(range(n)) for k, n in enumerate(lens))


def test_weights_change_and_resume(daemon, tmp_path):
    paths = sources(tmp_path)
    mix = [(p, 1) for p in paths]

    def run(stop_at: int | None):
        ld = riffle.Loader(mixture=mix, batch_size=32, seed=5, mixture_stop="all_exhausted", ordered=True)
        out = [epoch_rows(ld)]
        ld.set_weights([4, 1, 1])  # from epoch 1
        it = iter(ld)
        head = [next(it).data.copy() for _ in range(stop_at or 0)]
        if stop_at is None:
            rest = [b.data.copy() for b in it]
        else:
            st = ld.state_dict()
            assert st["mixture_weights"] == [[0, [1.0, 1.0, 1.0]], [1, [4.0, 1.0, 1.0]]]
            ld.close()
            ld = riffle.Loader(mixture=mix, batch_size=32, seed=5, mixture_stop="all_exhausted", ordered=True)
            ld.load_state_dict(st)  # the state brings the weights
            rest = [b.data.copy() for b in ld]
        out.append(np.concatenate(head + rest))
        out.append(epoch_rows(ld))
        return out

    whole, resumed = run(None), run(5)
    for a, b in zip(whole, resumed):
        assert np.array_equal(a, b)
    # The new weights: source 0 at four sixths of epoch 1.
    cnt = np.bincount(whole[1][:, 0], minlength=3)
    assert abs(cnt[0] - len(whole[1]) * 4 / 6) < 1
    # Every source went on from where the old weights left it: over the three epochs each source's rows are
    # its own epochs in turn.
    rows = np.concatenate(whole)
    for k, n in enumerate((300, 1000, 50)):
        mine = rows[rows[:, 0] == k, 1]
        for e in range(len(mine) // n):
            assert sorted(mine[e * n:(e + 1) * n]) == list(range(n))


def test_elastic_resume_with_workers(daemon, tmp_path):
    """2 ranks x 2 workers stop mid-epoch; 3 ranks x 1 worker go on from rank 0's state: the epoch is delivered
    once, plus DistributedSampler's padding."""
    paths = sources(tmp_path)
    mix = [(p, w) for p, w in zip(paths, (1, 2, 0.5))]
    heads, states = [], []
    for r in range(2):
        dl = rt.loader(mixture=mix, batch_size=16, seed=6, rank=r, world_size=2, num_workers=2)
        it = iter(dl)
        heads.append(torch_rows([next(it) for _ in range(5)]))
        states.append(dl.state_dict())
        del it
    rest = []
    for r in range(3):
        dl = rt.loader(mixture=mix, batch_size=16, seed=6, rank=r, world_size=3, num_workers=1)
        dl.load_state_dict(states[0])
        rest.append(torch_rows(list(dl)))
    got = np.concatenate(heads + rest)
    whole = epoch_rows(riffle.Loader(mixture=mix, batch_size=64, seed=6))
    keys = {tuple(r) for r in whole}
    assert {tuple(r) for r in got} == keys
    assert len(got) - len(keys) <= 2


def torch_rows(batches) -> np.ndarray:
    return np.concatenate([b.numpy() for b in batches]) if batches else np.zeros((0, 2), np.int64)


def test_refusals(daemon, tmp_path):
    paths = sources(tmp_path)
    with pytest.raises(ValueError, match="both paths and mixture"):
        riffle.Loader(paths[0], 8, mixture=[(paths[1], 1)])
    with pytest.raises(ValueError, match="weight"):
        riffle.Loader(mixture=[(paths[0], 0)], batch_size=8)
    with pytest.raises(ValueError, match=r"\(paths, weight\)"):
        riffle.Loader(mixture=[paths[0]], batch_size=8)
    with pytest.raises(FileNotFoundError):
        riffle.Loader(mixture=[(str(tmp_path / "none.npy"), 1)], batch_size=8)
    with pytest.raises(ValueError, match="sampler"):
        riffle.Loader(mixture=[(paths[0], 1)], batch_size=8, sampler="bogus")
    ld = riffle.Loader(mixture=[(p, 1) for p in paths], batch_size=8)
    with pytest.raises(ValueError, match="3 sources"):
        ld.set_weights([1, 2])
    with pytest.raises(ValueError, match="no mixture"):
        riffle.Loader(paths[0], 8).set_weights([1])
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    pq.write_table(pa.table({"x": list(range(10))}), str(tmp_path / "t.parquet"))
    with pytest.raises(ValueError, match="rows mixes only with rows"):
        riffle.Loader(mixture=[(paths[0], 1), (str(tmp_path / "t.parquet"), 1)], batch_size=8)


def test_shared_mixtures(daemon, tmp_path):
    """Two jobs with different mixtures over a source they share read it once for both (dependent sampling in the
    source's group), each still every source's epochs whole, each record once; and a shared mixture resumes from
    its state."""
    from conftest import status
    lens = (300, 1000, 50)
    paths = sources(tmp_path, lens)
    a = riffle.Loader(mixture=[(paths[0], 1), (paths[1], 1)], batch_size=50, seed=7, share=True,
                      mixture_stop="all_exhausted", ordered=True)
    b = riffle.Loader(mixture=[(paths[1], 2), (paths[2], 1)], batch_size=50, seed=8, share=True,
                      mixture_stop="all_exhausted", ordered=True)
    got = {0: [], 1: []}
    for _ in range(2):
        # In step, as two trainers at one pace, each to its epoch's end (zip would drop a batch of the longer).
        its = {0: iter(a), 1: iter(b)}
        while its:
            for k in list(its):
                x = next(its[k], None)
                if x is None:
                    del its[k]
                else:
                    got[k].append(x.data.copy())
    st = status(daemon.sock)
    saved = sum(g["saved"] for g in st["groups"] if "s1.npy" in g["source"])
    assert saved > 0, st["groups"]
    for k in (0, 1):
        own_epochs(np.concatenate(got[k]), lens)
    # A resume mid-epoch from the state (the members' delivered sets): the rest is each record once.
    it = iter(a)
    head = [next(it).data.copy() for _ in range(3)]
    state = a.state_dict()
    a.close()
    c = riffle.Loader(mixture=[(paths[0], 1), (paths[1], 1)], batch_size=50, seed=7, share=True,
                      mixture_stop="all_exhausted", ordered=True)
    c.load_state_dict(state)
    rest = [x.data.copy() for x in c]
    assert len(rest) > 10
    own_epochs(np.concatenate(got[0] + head + rest), lens)


@pytest.mark.parametrize("workers", [None, 2])
def test_shared_first_exhausted_states(daemon, tmp_path, workers):
    """A shared mixture whose sources do not run out together (first_exhausted): the others are left part read
    when an epoch ends, and the job reads on into the next: every batch's state is still asked for and given (it
    was an error past the epoch's first batches), each epoch has each record at most once and the source that
    ends it whole, with DataLoader workers too."""
    lens, w = (300, 1000, 50), [1.0, 2.0, 0.5]
    mix = list(zip(sources(tmp_path, lens), w))
    if workers is None:
        ld = riffle.Loader(mixture=mix, batch_size=24, seed=9, share=True)
        epochs = [[b.data.copy() for b in ld if ld.state_dict()] for _ in range(2)]
    else:
        ld = rt.loader(mixture=mix, batch_size=24, seed=9, share=True, num_workers=workers, persistent_workers=True)
        epochs = [[b.numpy().copy() for b in ld if ld.state_dict()] for _ in range(2)]
    for batches in epochs:
        rows = np.concatenate(batches)
        assert len({tuple(r) for r in rows}) == len(rows)
        assert np.bincount(rows[:, 0], minlength=3)[2] == 50


def own_epochs(rows: np.ndarray, lens) -> None:
    """Each source's rows, in the order delivered, are its own epochs in turn, each every record once."""
    for s, n in enumerate(lens):
        mine = rows[rows[:, 0] == s, 1]
        for e in range(len(mine) // n):
            assert sorted(mine[e * n:(e + 1) * n]) == list(range(n)), (s, e)


@pytest.mark.parametrize("fmt", ["parquet", "arrow"])
def test_mixture_of_rows(daemon, tmp_path, fmt):
    """Sources of rows (Parquet, Arrow) of one schema mix: read as one dataset of their files, each row its
    writer's, each source's share kept and its rows at most once, split over ranks; another schema, or records
    beside rows, is refused."""
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq
    lens, paths = (300, 1000, 150), []
    for k, n in enumerate(lens):
        t = pa.table({"src": pa.array([k] * n, pa.int64()), "i": pa.array(range(n), pa.int64()),
                      "text": pa.array([f"s{k}-" + "t" * (i % 40) for i in range(n)])})
        p = str(tmp_path / f"s{k}.{fmt}")
        if fmt == "parquet":
            pq.write_table(t, p, row_group_size=97, data_page_size=1024)
        else:
            with pa.ipc.new_file(p, t.schema) as w:
                for b in t.to_batches(max_chunksize=64):
                    w.write_batch(b)
        paths.append(p)
    w = [1, 2, 0.5]
    mix = list(zip(paths, w))
    ld = riffle.Loader(mixture=mix, batch_size=64, seed=3)
    assert ld.offsets == [0, 300, 1300]
    got = []
    for b in ld:
        for rid, r in zip(b.ids.tolist(), b.data.to_pylist()):
            k = max(j for j, off in enumerate(ld.offsets) if off <= rid)
            assert (r["src"], r["i"]) == (k, rid - ld.offsets[k]) and r["text"] == f"s{k}-" + "t" * (r["i"] % 40)
            got.append((r["src"], r["i"]))
    assert len(set(got)) == len(got)
    cnt = np.bincount([s for s, _ in got], minlength=3)
    assert cnt[2] == 150 and all(abs(cnt[k] - len(got) * w[k] / 3.5) < 1 for k in range(3)), cnt
    # Two ranks split the epoch.
    parts = [{(r["src"], r["i"]) for b in riffle.Loader(mixture=mix, batch_size=64, seed=3, rank=r, world_size=2)
              for r in b.data.to_pylist()} for r in (0, 1)]
    assert parts[0] | parts[1] == set(got) and len(parts[0] & parts[1]) <= 1
    other = str(tmp_path / f"other.{fmt}")
    t = pa.table({"x": pa.array([1.5, 2.5])})
    if fmt == "parquet":
        pq.write_table(t, other)
    else:
        with pa.ipc.new_file(other, t.schema) as wr:
            wr.write_table(t)
    with pytest.raises(riffle.RiffleError):
        riffle.Loader(mixture=[(paths[0], 1), (other, 1)], batch_size=8)
    npy = sources(tmp_path)[0]
    with pytest.raises(riffle.InvalidSpec, match="rows mixes only with rows"):
        riffle.Loader(mixture=[(paths[0], 1), (npy, 1)], batch_size=8)


def test_torch_set_weights_with_workers(daemon, tmp_path):
    """riffle.torch: set_weights takes effect at the next epoch, in every worker, and travels in the state."""
    paths = sources(tmp_path, (600, 600, 600))
    mix = [(p, 1) for p in paths]
    dl = rt.loader(mixture=mix, batch_size=50, seed=2, num_workers=2, mixture_stop="all_exhausted")
    first = torch_rows(list(dl))
    dl.set_weights([4, 1, 1])
    second = torch_rows(list(dl))
    c1, c2 = (np.bincount(r[:, 0], minlength=3) for r in (first, second))
    assert abs(c1[0] - len(first) / 3) < 50 and abs(c2[0] - len(second) * 4 / 6) < 50, (c1, c2)
    st = dl.state_dict()
    assert st["mixture_weights"] == [[0, [1.0, 1.0, 1.0]], [1, [4.0, 1.0, 1.0]]]
    again = rt.loader(mixture=mix, batch_size=50, seed=2, num_workers=2, mixture_stop="all_exhausted")
    again.load_state_dict(st)
    third = torch_rows(list(again))
    assert abs(np.bincount(third[:, 0], minlength=3)[0] - len(third) * 4 / 6) < 50


def hf_source(root, name, lens, features=None, shards=1, split=None):
    """A Hugging Face dataset written by datasets.save_to_disk, rows {src, i, text, label}: a Dataset directory, or
    with split a DatasetDict of that split and a "test" one."""
    import datasets
    feats = features or datasets.Features({"src": datasets.Value("int64"), "i": datasets.Value("int64"),
                                           "text": datasets.Value("string"),
                                           "label": datasets.ClassLabel(names=["neg", "pos", "mid"])})
    src, n = lens

    def rows(m):
        return datasets.Dataset.from_dict({"src": [src] * m, "i": list(range(m)), "text": [f"s{src}-" + "t" * (i % 40) for i in range(m)],
                                           "label": [i % 3 for i in range(m)]}, features=feats)
    d = root / name
    if split:
        datasets.DatasetDict({split: rows(n), "test": rows(7)}).save_to_disk(str(d), num_shards={split: shards, "test": 1})
    else:
        rows(n).save_to_disk(str(d), num_shards=shards)
    return str(d)


def hf_rows(ld) -> tuple[np.ndarray, list[int]]:
    """Each delivered row's (src, i), checked against its id and its text; and the ids."""
    got, ids = [], []
    for b in ld:
        for rid, r in zip(b.ids.tolist(), b.data.to_pylist()):
            k = max(j for j, off in enumerate(ld.offsets) if off <= rid)
            assert (r["src"], r["i"]) == (k, rid - ld.offsets[k]), (rid, r)
            assert r["text"] == f"s{k}-" + "t" * (r["i"] % 40) and r["label"] == r["i"] % 3
            got.append((r["src"], r["i"]))
            ids.append(rid)
    return np.array(got, dtype=np.int64).reshape(-1, 2), ids


def test_mixture_of_hf_directories(daemon, tmp_path):
    """Hugging Face save_to_disk directories mix, as their Arrow files read as one dataset: each row its writer's,
    each source's share kept, each at most once per epoch (first_exhausted) and every source's own epochs whole and
    each once (all_exhausted); the directories' features (ClassLabel names) stay the mixture's."""
    pytest.importorskip("datasets")
    lens = (300, 1000, 150)
    paths = [hf_source(tmp_path, f"hf{k}", (k, n), shards=1 + k % 2) for k, n in enumerate(lens)]
    w = [1, 2, 0.5]
    mix = list(zip(paths, w))
    ld = riffle.Loader(mixture=mix, batch_size=64, seed=3)
    assert ld.offsets == [0, 300, 1300]
    assert ld.info()["features"]["label"]["names"] == ["neg", "pos", "mid"]
    rows, _ = hf_rows(ld)
    assert len({tuple(r) for r in rows}) == len(rows)
    cnt = np.bincount(rows[:, 0], minlength=3)
    assert cnt[2] == 150 and all(abs(cnt[k] - len(rows) * w[k] / 3.5) < 1 for k in range(3)), cnt
    # all_exhausted over two mixture epochs: each source's rows are its own epochs in turn, each every row once.
    ld = riffle.Loader(mixture=mix, batch_size=50, seed=4, mixture_stop="all_exhausted", ordered=True)
    rows = np.concatenate([hf_rows(ld)[0] for _ in range(2)])
    own_epochs(rows, lens)
    assert all((rows[:, 0] == k).sum() >= 2 * n for k, n in enumerate(lens))
    # A torch loader over them: label names as a Dataset's.
    assert rt.loader(mixture=mix, batch_size=50).dataset.classes == ["neg", "pos", "mid"]


def test_mixture_of_hf_splits_and_arrow_files(daemon, tmp_path):
    """DatasetDicts mix by the split named once for all; a directory mixes with Arrow files of its schema (its own
    files are Arrow); another schema, or Parquet beside it, is refused with the source and the reason."""
    pa = pytest.importorskip("pyarrow")
    import datasets
    a = hf_source(tmp_path, "dd0", (0, 200), split="train", shards=2)
    b = hf_source(tmp_path, "dd1", (1, 400), split="train")
    ld = riffle.Loader(mixture=[(a, 1), (b, 1)], batch_size=32, seed=5, split="train")
    assert ld.offsets == [0, 200]
    rows, _ = hf_rows(ld)
    assert len({tuple(r) for r in rows}) == len(rows) and np.bincount(rows[:, 0]).tolist() == [200, 200]

    hf = hf_source(tmp_path, "hf0", (0, 300))
    # The same columns written by pyarrow, as an Arrow file: label is the ClassLabel's int64.
    n = 500
    t = pa.table({"src": pa.array([1] * n, pa.int64()), "i": pa.array(range(n), pa.int64()),
                  "text": pa.array([f"s1-" + "t" * (i % 40) for i in range(n)]), "label": pa.array([i % 3 for i in range(n)], pa.int64())})
    arrow = str(tmp_path / "s1.arrow")
    with pa.ipc.new_file(arrow, t.schema) as wr:
        wr.write_table(t, max_chunksize=64)
    ld = riffle.Loader(mixture=[(hf, 1), (arrow, 1)], batch_size=32, seed=6, mixture_stop="all_exhausted", ordered=True)
    rows, _ = hf_rows(ld)
    own_epochs(rows, (300, 500))
    assert set(map(tuple, rows[rows[:, 0] == 1])) == {(1, i) for i in range(n)}

    other = hf_source(tmp_path, "other", (1, 50), features=datasets.Features({
        "src": datasets.Value("int64"), "i": datasets.Value("int32"), "text": datasets.Value("string"),
        "label": datasets.Value("int64")}))
    with pytest.raises(riffle.InvalidSpec, match=r"source 1, .*other.*: its columns \[src int64, i int32"):
        riffle.Loader(mixture=[(hf, 1), (other, 1)], batch_size=8)
    pq = pytest.importorskip("pyarrow.parquet")
    pq.write_table(t, str(tmp_path / "s1.parquet"))
    with pytest.raises(riffle.InvalidSpec, match=r"source 1, .*s1.parquet \(parquet\), with source 0.*\(hf\).*one format"):
        riffle.Loader(mixture=[(hf, 1), (str(tmp_path / "s1.parquet"), 1)], batch_size=8)


def within_one_of_shares(sources: np.ndarray, weights) -> None:
    """Each source's count over every prefix of ``sources`` (each sample's source, in order) is within one sample of
    its share of the prefix."""
    share = np.array(weights, float) / sum(weights)
    seen = np.zeros(len(weights))
    for p, k in enumerate(sources, 1):
        seen[k] += 1
        assert np.all(np.abs(seen - p * share) < 1), f"{p} samples after the change: {seen}"


@pytest.mark.parametrize("workers,persistent", [(0, False), (1, False), (2, False), (2, True)])
def test_torch_set_weights_at_the_next_step(daemon, tmp_path, workers, persistent):
    """riffle.torch: set_weights between steps of an epoch takes effect at the next step, with 0, 1 or 2 DataLoader
    workers (whose batches fetched ahead are dropped): every batch, from the change to the epoch's end and in the
    next epoch, is the one of a run with mixture_schedule=[(k, weights)]; from the change each source is within one
    sample of its share; each sample at most once an epoch; len() is the epoch's batches under the change; the
    state keeps the change, at position k x batch_size."""
    lens, K, new = (300, 1000, 50), 4, [4, 1, 1]
    mix = [(p, 1) for p in sources(tmp_path, lens)]
    kw = dict(mixture=mix, batch_size=16, seed=3, num_workers=workers, ordered=True)
    if persistent:
        kw["persistent_workers"] = True
    ref = rt.loader(mixture_schedule=[(K, new)], **kw)
    want = [[b.numpy().copy() for b in ref] for _ in range(2)]
    dl = rt.loader(**kw)
    before = len(dl)
    got, lens_seen = [], []
    for step, b in enumerate(dl):
        got.append(b.numpy().copy())
        if step + 1 == K:
            dl.set_weights(new)  # from the next step: the 5th batch on
            lens_seen.append(len(dl))
    assert len(got) == len(want[0]) and all(np.array_equal(a, b) for a, b in zip(got, want[0])), \
        "set_weights at step k is not mixture_schedule=[(k, weights)]"
    assert len(want[0]) != before and lens_seen == [len(want[0])], "len() is not the epoch's batches under the change"
    rows = np.concatenate(got)
    assert len({tuple(r) for r in rows}) == len(rows) and np.bincount(rows[:, 0], minlength=3)[2] == 50
    within_one_of_shares(rows[K * 16:, 0], new)
    assert dl.state_dict()["mixture_weights"] == [[0, [1.0, 1.0, 1.0]], [0, K * 16, [4.0, 1.0, 1.0]]]
    nxt = [b.numpy().copy() for b in dl]
    assert len(nxt) == len(want[1]) and all(np.array_equal(a, b) for a, b in zip(nxt, want[1])), \
        "the next epoch is not the schedule's"


def test_torch_set_weights_resumes_on_another_topology(daemon, tmp_path):
    """2 ranks x 2 workers change the weights at step 3 (each rank, as DDP code does) and save after step 5
    (position 80); 3 ranks x 1 worker resume from rank 0's state (80 is no multiple of their global batch of 24: the
    rest of the epoch from there) and change them again after 2 steps of theirs (position 128, step 8 of the first
    run): the first run's steps and the rest are the uninterrupted run's samples (mixture_schedule=[(3, weights),
    (8, weights')]), each once but DistributedSampler's padding, and epoch 1 too."""
    lens, K, new, again = (300, 1000, 50), 3, [4, 1, 1], [1, 1, 2]
    mix = [(p, 1) for p in sources(tmp_path, lens)]
    whole = riffle.Loader(mixture=mix, batch_size=16, seed=6, mixture_schedule=[(K, new), (8, again)], ordered=True)
    e0 = [b.data.copy() for b in whole]
    e1 = {tuple(r) for b in whole for r in b.data.tolist()}
    heads, state = [[] for _ in range(5)], None
    for r in range(2):
        dl = rt.loader(mixture=mix, batch_size=8, seed=6, rank=r, world_size=2, num_workers=2)
        it = iter(dl)
        for step in range(5):
            heads[step] += [tuple(x) for x in next(it).tolist()]
            if step + 1 == K:
                dl.set_weights(new)
        state = state or dl.state_dict()
        del it
    for step in range(5):
        assert set(heads[step]) == {tuple(x) for x in e0[step].tolist()}, f"step {step} is not the uninterrupted run's"
    assert state["mixture_weights"] == [[0, [1.0, 1.0, 1.0]], [0, K * 16, [4.0, 1.0, 1.0]]]
    rest, later = [], []
    for r in range(3):
        dl = rt.loader(mixture=mix, batch_size=8, seed=6, rank=r, world_size=3, num_workers=1)
        dl.load_state_dict(state)
        for step, b in enumerate(dl, 1):
            rest += [tuple(x) for x in b.tolist()]
            if step == 2:
                dl.set_weights(again)
        assert dl.state_dict()["mixture_weights"] == [[0, [1.0, 1.0, 1.0]], [0, 48, [4.0, 1.0, 1.0]],
                                                      [0, 128, [1.0, 1.0, 2.0]]]
        later += [tuple(x) for b in dl for x in b.tolist()]
    want = {tuple(r) for b in e0 for r in b.tolist()}
    got = collections.Counter([x for h in heads for x in h] + rest)
    assert set(got) == want, f"{len(want - set(got))} samples lost, {len(set(got) - want)} not the run's"
    assert sum(c - 1 for c in got.values()) <= 2
    assert set(later) == e1 and len(later) - len(e1) <= 2, "epoch 1 is not the uninterrupted run's"


def test_torch_set_weights_in_other_places(daemon, tmp_path):
    """set_weights at the next step of a RiffleDataset iterated by itself; twice at one step (the last wins); after
    the epoch's last batch (from the next epoch's start); and at the next step of an iteration then left unfinished
    (the next iteration is the next epoch, as it would be, under the new weights)."""
    mix = [(p, 1) for p in sources(tmp_path)]
    kw = dict(mixture=mix, batch_size=16, seed=3, ordered=True)

    def ref(schedule, epochs=1):
        ld = riffle.Loader(mixture_schedule=schedule, **kw)
        return [[b.data.copy() for b in ld] for _ in range(epochs)]

    def same(a, b) -> bool:
        return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))
    ds = rt.RiffleDataset(**kw)
    got = []
    for step, b in enumerate(ds, 1):
        got.append(b.numpy().copy())
        if step == 4:
            ds.set_weights([4, 1, 1])
    assert same(got, ref([(4, [4, 1, 1])])[0]), "a RiffleDataset's own iteration"
    for workers in (0, 2):
        dl = rt.loader(num_workers=workers, **kw)
        got = []
        for step, b in enumerate(dl, 1):
            got.append(b.numpy().copy())
            if step == 3:
                dl.set_weights([9, 1, 1])
                dl.set_weights([4, 1, 1])
        assert same(got, ref([(3, [4, 1, 1])])[0]), f"twice at one step, {workers} workers"
        dl = rt.loader(num_workers=workers, **kw)
        n, got = len(dl), []
        for step, b in enumerate(dl, 1):
            got.append(b.numpy().copy())
            if step == n:
                dl.set_weights([4, 1, 1])
        nxt = [b.numpy().copy() for b in dl]
        want = ref([(1, 0, [4, 1, 1])], 2)
        assert same(got, want[0]) and same(nxt, want[1]), f"after the last batch, {workers} workers"
        dl = rt.loader(num_workers=workers, **kw)
        it = iter(dl)
        next(it), next(it)
        dl.set_weights([4, 1, 1])
        del it
        nxt = [b.numpy().copy() for b in dl]
        want = riffle.Loader(mixture_schedule=[(2, [4, 1, 1])], epoch=1, **kw)
        assert same(nxt, [b.data.copy() for b in want]), f"an unfinished iteration, {workers} workers"


def test_torch_set_weights_refusals(daemon, tmp_path):
    """Ranks that changed the weights at different steps are refused when their states are merged; weights from the
    start of an epoch already begun are refused, and at the next step of a shared order (whose places are not
    positions); set_weights(w, epoch=e) of a later epoch goes on as before."""
    mix = [(p, 1) for p in sources(tmp_path)]
    states = []
    for r, k in ((0, 2), (1, 3)):
        dl = rt.loader(mixture=mix, batch_size=8, seed=6, rank=r, world_size=2)
        it = iter(dl)
        for step in range(4):
            next(it)
            if step + 1 == k:
                dl.set_weights([4, 1, 1])
        states.append(dl.state_dict())
        with pytest.raises(ValueError, match="has begun epoch 0"):
            dl.set_weights([1, 1, 1], epoch=0)
        dl.set_weights([1, 2, 1], epoch=1)
        assert dl.state_dict()["mixture_weights"][-1] == [1, [1.0, 2.0, 1.0]]
        del it
    with pytest.raises(ValueError, match="every rank must call set_weights at the same step"):
        riffle.merge_states(states)
    dl = rt.loader(mixture=mix, batch_size=8, seed=6, share=True)
    it = iter(dl)
    next(it)
    with pytest.raises(ValueError, match="only from its parts' places"):
        dl.set_weights([4, 1, 1])
    dl.set_weights([4, 1, 1], epoch=1)
    del it
