"""A token corpus's samples through the daemon (issue 48, docs/tokens.md): concat equals a plain numpy reference over
the same document order; every sample's tokens once per epoch across ranks and DataLoader workers; a resume on
another topology equals the uninterrupted run."""

from __future__ import annotations

import collections
import struct

import numpy as np
import pytest
import torch

import riffle
import riffle.torch as rt

M64 = (1 << 64) - 1


# --- sampler.Global, ported: the document order of an epoch is its Feistel permutation (sampler/global.go) ---

def _mix(z: int) -> int:
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def _splitmix(x: int) -> int:
    return _mix((x + 0x9E3779B97F4A7C15) & M64)


def mix_key(seed: int, epoch: int) -> int:
    """sampler.Mix."""
    return _splitmix(_splitmix(seed) ^ _splitmix((epoch + 0x632BE59BD9B4E019) & M64))


def permutation(n: int, seed: int, epoch: int) -> list[int]:
    """sampler.Global{N: n, Seed: seed}'s order of epoch: a 12-round Feistel network with cycle walking."""
    key = mix_key(seed, epoch)
    k = max(2, (n - 1).bit_length())
    lo_bits = k // 2
    lo_mask, hi_mask = (1 << lo_bits) - 1, (1 << (k - lo_bits)) - 1
    keys = []
    for _ in range(12):
        key = _splitmix(key)
        keys.append(key)
    out = []
    for x in range(n):
        if n <= 1:
            out.append(x)
            continue
        while True:
            lo, hi = x & lo_mask, x >> lo_bits
            for r in range(0, 12, 2):
                lo ^= _mix(hi ^ keys[r]) & lo_mask
                hi ^= _mix(lo ^ keys[r + 1]) & hi_mask
            x = (hi << lo_bits) | lo
            if x < n:
                break
        out.append(x)
    return out


def document_order(docs: int, seed: int, epoch: int) -> list[int]:
    """An epoch's document order: the global shuffle under the seed's document key (job.documentSeed)."""
    return permutation(docs, mix_key(seed, 0xD0C), epoch)


# --- a corpus, written by Megatron's published layout ---

def write_megatron(prefix, docs: list[np.ndarray]) -> None:
    """PREFIX.bin and PREFIX.idx as megatron-core's IndexedDatasetBuilder writes them (uint16: dtype code 8)."""
    lens = np.array([len(d) for d in docs], np.int32)
    ptrs = np.concatenate([[0], np.cumsum(lens[:-1].astype(np.int64) * 2)]).astype(np.int64)
    with open(f"{prefix}.bin", "wb") as f:
        for d in docs:
            f.write(d.astype("<u2").tobytes())
    with open(f"{prefix}.idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + struct.pack("<B", 8))
        f.write(struct.pack("<QQ", len(docs), len(docs) + 1))
        f.write(lens.astype("<i4").tobytes() + ptrs.astype("<i8").tobytes())
        f.write(np.arange(len(docs) + 1, dtype="<i8").tobytes())


def make_docs(n: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 50000, int(rng.integers(1, 120)), dtype=np.int64) for _ in range(n)]


@pytest.fixture
def corpus(tmp_path):
    docs = make_docs(400)
    prefix = str(tmp_path / "corpus")
    write_megatron(prefix, docs)
    return prefix, docs


def concat_reference(docs, seed: int, epoch: int, S: int):
    """concat's samples of an epoch by its definition, in numpy: the documents in the epoch's order, one stream,
    sample i its tokens [i*S, i*S+S+1); labels the next token of the same document, else -100."""
    order = document_order(len(docs), seed, epoch)
    stream = np.concatenate([docs[d] for d in order])
    doc = np.concatenate([np.full(len(docs[d]), k) for k, d in enumerate(order)])
    n = (len(stream) - 1) // S
    ids, labels, pos = [], [], []
    for i in range(n):
        t, d = stream[i * S: i * S + S + 1], doc[i * S: i * S + S + 1]
        ids.append(t[:S])
        labels.append(np.where(d[1:] == d[:-1], t[1:], -100))
        starts = np.flatnonzero(np.concatenate([[True], d[1:S] != d[: S - 1]]))
        p = np.arange(S) - starts[np.searchsorted(starts, np.arange(S), side="right") - 1]
        pos.append(p)
    return np.array(ids), np.array(labels), np.array(pos)


def test_concat_equals_a_numpy_reference(daemon, corpus):
    prefix, docs = corpus
    S, seed, epoch = 32, 7, 2
    ids, labels, pos = concat_reference(docs, seed, epoch, S)
    ld = riffle.Loader(prefix, 8, seq_len=S, seed=seed, epoch=epoch)
    seen = set()
    for b in ld:
        a = b.data
        assert set(a) == {"input_ids", "labels", "position_ids", "loss_mask", "max_seqlen", "cu_seqlens"}
        assert a["input_ids"].dtype == np.int64 and a["loss_mask"].dtype == np.float32 and a["cu_seqlens"].dtype == np.int32
        for slot, i in enumerate(b.ids):
            i = int(i)
            seen.add(i)
            np.testing.assert_array_equal(a["input_ids"][slot], ids[i], err_msg=f"sample {i}")
            np.testing.assert_array_equal(a["labels"][slot], labels[i], err_msg=f"sample {i}")
            np.testing.assert_array_equal(a["position_ids"][slot], pos[i], err_msg=f"sample {i}")
            np.testing.assert_array_equal(a["loss_mask"][slot], (labels[i] != -100).astype(np.float32))
        # cu_seqlens, flattened over the batch: where position_ids restart, and the end.
        flat = a["position_ids"].reshape(-1)
        want = np.concatenate([np.flatnonzero(flat == 0), [flat.size]]).astype(np.int32)
        np.testing.assert_array_equal(a["cu_seqlens"], want)
        assert int(a["max_seqlen"]) == int(np.diff(want).max())
    assert seen == set(range(len(ids)))


def rows_of(dl) -> list[tuple]:
    out = []
    for b in dl:
        assert isinstance(b["input_ids"], torch.Tensor) and b["input_ids"].dtype == torch.int64
        assert isinstance(b["max_seqlen"], int) and b["cu_seqlens"].dtype == torch.int32
        out += [tuple(r) for r in b["input_ids"].tolist()]
    return out


@pytest.mark.parametrize("packing", ["concat", "best_fit", "pad"])
def test_each_sample_once_across_ranks_and_workers(daemon, corpus, packing):
    """2 ranks of 2 DataLoader workers each deliver every sample of the epoch once (its tokens: each input row
    once), as one process with no workers does."""
    prefix, _ = corpus
    kw = dict(seq_len=24, packing=packing, seed=3, rank_drop_last=True)
    whole = rows_of(rt.loader(prefix, 4, rank=0, world_size=1, **kw))
    parts = []
    rt._borrowed.clear()
    for r in range(2):
        parts += rows_of(rt.loader(prefix, 4, num_workers=2, rank=r, world_size=2, **kw))
    assert rt._borrowed, "the workers' batches were copied, not lent"
    counts = collections.Counter(parts)
    assert sum(c - 1 for c in counts.values()) <= 1, "more repeats than the 2 ranks' padding"
    assert set(counts) <= set(whole)
    assert len(counts) == len(whole) // 2 * 2  # the epoch cut to a multiple of the ranks


@pytest.mark.parametrize("packing", ["concat", "best_fit"])
def test_resume_on_another_topology(daemon, corpus, packing):
    """Rank 0's state after 3 steps of 2 ranks x 2 workers resumes on 3 ranks x 1 worker: the samples are the
    uninterrupted run's, each once (DistributedSampler's padding aside)."""
    prefix, _ = corpus
    kw = dict(seq_len=24, packing=packing, seed=11, epoch=1)
    whole = rows_of(rt.loader(prefix, 4, rank=0, world_size=1, **kw))
    head, state = [], None
    for r in range(2):
        dl = rt.loader(prefix, 4, num_workers=2, rank=r, world_size=2, **kw)
        for k, b in enumerate(dl):
            head += [tuple(x) for x in b["input_ids"].tolist()]
            if k + 1 == 3:
                break
        state = state or dl.state_dict()
    assert state["position"] == 3 * 2 * 4
    rest = []
    for r in range(3):
        dl = rt.loader(prefix, 4, num_workers=1, rank=r, world_size=3, **kw)
        dl.load_state_dict(state)
        rest += rows_of(dl)
    counts = collections.Counter(head + rest)
    assert set(counts) == set(whole), "samples lost, or not the uninterrupted run's"
    assert sum(c - 1 for c in counts.values()) <= 2


def test_vocab_is_checked(daemon, corpus):
    prefix, docs = corpus
    with pytest.raises(riffle.DataError, match=r"corpus\.bin.*outside the vocabulary"):
        for _ in riffle.Loader(prefix, 8, seq_len=16, vocab_size=1000):
            pass


def test_a_megatron_corpus_without_seq_len_is_refused(daemon, corpus):
    prefix, _ = corpus
    with pytest.raises(riffle.InvalidSpec, match="give seq_len"):
        riffle.Loader(prefix + ".idx", 8)


@pytest.fixture
def two_corpora(tmp_path):
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    write_megatron(a, make_docs(150, seed=1))
    write_megatron(b, make_docs(400, seed=2))
    return a, b


def test_mixture_weights_change_at_the_next_step_and_resume(daemon, two_corpora):
    """set_weights takes effect at the next step, as a schedule's change at that step does; from the change each
    source is within half a sample of its share (two sources); the state keeps the change as a position, and a resume
    on 3 ranks from rank 0's state delivers the uninterrupted run's samples, each once."""
    a, b = two_corpora
    kw = dict(mixture=[(a, 1), (b, 1)], seq_len=16, seed=4, ordered=True)
    # The change at position 40: step 10 of one rank's batches of 4, step 5 of two ranks'.
    sched = [s for bt in riffle.Loader(batch_size=4, mixture_schedule=[(10, [3, 1])], **kw) for s in bt.ids.tolist()]
    ld = riffle.Loader(batch_size=4, **kw)
    offsets = ld.offsets
    got, it = [], iter(ld)
    for _ in range(10):
        got += next(it).ids.tolist()
    ld.set_weights([3, 1])  # from the next step
    got += [s for bt in it for s in bt.ids.tolist()]
    assert got == sched, "set_weights at the next step is not the schedule's change at that step"
    n0 = 0
    for p, s in enumerate(got[40:]):
        n0 += s < offsets[1]
        assert abs(n0 - 0.75 * (p + 1)) <= 0.5 + 1e-9, f"{p + 1} samples after the change"
    head, state = [], None
    for r in range(2):
        ld = riffle.Loader(batch_size=4, rank=r, world_size=2, mixture_schedule=[(5, [3, 1])], **kw)
        it = iter(ld)
        for _ in range(7):
            head += next(it).ids.tolist()
        state = state or ld.state_dict()
        del it
    assert state["position"] == 56 and state["mixture_weights"] == [[0, [1.0, 1.0]], [0, 40, [3.0, 1.0]]]
    rest = []
    for r in range(3):
        ld = riffle.Loader(batch_size=4, rank=r, world_size=3, **kw)
        ld.load_state_dict(state)
        rest += [s for bt in ld for s in bt.ids.tolist()]
    counts = collections.Counter(head + rest)
    assert set(counts) == set(got), "samples lost, or not the uninterrupted run's"
    assert sum(c - 1 for c in counts.values()) <= 2


def test_torch_set_weights_of_a_token_mixture(daemon, two_corpora):
    """riffle.torch over a mixture of token corpora: set_weights in the training loop (``if step == k``), with 2
    DataLoader workers, gives the batches of mixture_schedule=[(k, weights)] from step k on, each source within half
    a sample of its share since the change (two sources). A run of 2 ranks x 2 workers saved at step 3 and resumed
    on 3 ranks x 1 worker, whose set_weights comes right after load_state_dict, changes them at the loaded place,
    global step 3 of the first run: every step of the rest is the uninterrupted run's, each sample once."""
    a, b = two_corpora
    kw = dict(mixture=[(a, 1), (b, 1)], seq_len=16, seed=4)
    K, new = 5, [3, 1]
    want = [r for bt in rt.loader(batch_size=4, num_workers=2, mixture_schedule=[(K, new)], ordered=True, **kw)
            for r in map(tuple, bt["input_ids"].tolist())]
    dl = rt.loader(batch_size=4, num_workers=2, ordered=True, **kw)
    got = []
    for step, bt in enumerate(dl, 1):
        got += [tuple(r) for r in bt["input_ids"].tolist()]
        if step == K:
            dl.set_weights(new)
    assert got == want, "set_weights at step k is not mixture_schedule=[(k, weights)]"
    ref = riffle.Loader(batch_size=8, mixture_schedule=[(3, new)], ordered=True, **kw)
    rows, n0 = [], 0
    for bt in ref:
        for r, i in zip(bt.data["input_ids"].tolist(), bt.ids.tolist()):
            rows.append(tuple(r))
            n0 += i < ref.offsets[1]
            if len(rows) > 24:
                assert abs(n0 - 24 * 0.5 - 0.75 * (len(rows) - 24)) <= 0.5 + 1e-9, f"{len(rows) - 24} after the change"
    head, state = [], None
    for r in range(2):
        dl = rt.loader(batch_size=4, num_workers=2, rank=r, world_size=2, **kw)
        for step, bt in enumerate(dl, 1):
            head += [tuple(x) for x in bt["input_ids"].tolist()]
            if step == 3:
                break
        state = state or dl.state_dict()
    assert set(head) == set(rows[:24])
    rest = collections.defaultdict(list)
    for r in range(3):
        dl = rt.loader(batch_size=4, num_workers=1, rank=r, world_size=3, **kw)
        dl.load_state_dict(state)
        dl.set_weights(new)  # from the loaded place: position 24
        assert dl.state_dict()["mixture_weights"] == [[0, [1.0, 1.0]], [0, 24, [3.0, 1.0]]]
        for step, bt in enumerate(dl):
            rest[step] += [tuple(x) for x in bt["input_ids"].tolist()]
    steps = [rest[k] for k in sorted(rest)]
    for k, s in enumerate(steps[:-1]):
        assert set(s) == set(rows[24 + 12 * k: 36 + 12 * k]), f"the resumed run's step {k} is not the uninterrupted's"
    counts = collections.Counter(head + [x for s in steps for x in s])
    assert set(counts) == set(rows) and sum(c - 1 for c in counts.values()) <= 2


def test_shared_jobs_at_different_paces_and_a_shared_rest(daemon, corpus):
    """Two loaders of one corpus cut alike share a group (share=True), one at twice the other's pace: each takes
    every sample of the epoch once. The slow one's state, taken mid-epoch, resumes on 2 ranks as the rest of its
    epoch: the samples it had not taken, each once (DistributedSampler's padding aside)."""
    prefix, _ = corpus
    kw = dict(seq_len=24, seed=3, share=True)
    a, b = riffle.Loader(prefix, 4, **kw), riffle.Loader(prefix, 4, **kw)
    n = a.info()["samples"]
    ita, itb = iter(a), iter(b)
    got_a, got_b = [], []
    for _ in range(3):
        got_a += next(ita).ids.tolist()
        for _ in range(2):
            got_b += next(itb).ids.tolist()
    state = a.state_dict()
    del ita
    got_b += [s for bt in itb for s in bt.ids.tolist()]
    assert sorted(got_b) == list(range(n)), "the fast loader's epoch is not every sample once"
    rest = []
    for r in range(2):
        ld = riffle.Loader(prefix, 4, rank=r, world_size=2, **kw)
        ld.load_state_dict(state)
        rest += [s for bt in ld for s in bt.ids.tolist()]
    counts = collections.Counter(got_a + rest)
    assert set(counts) == set(range(n)), f"{n - len(counts)} samples lost"
    assert sum(c - 1 for c in counts.values()) <= 1, "more repeats than the 2 ranks' padding"


def schedule(step: int) -> list[float]:
    """A weight schedule as a function of the step: even, then 3:1 from step 6, then 1:2 from step 20."""
    return [1, 1] if step < 6 else [3, 1] if step < 20 else [1, 2]


def test_a_schedule_function_changes_the_weights_where_it_changes(daemon, two_corpora):
    """mixture_schedule=f is the list of (step, weights) where f's value changes: the same samples in the same
    order, each source within half a sample of its share since each change (two sources); the state keeps the
    changes as positions and the steps' global batch."""
    a, b = two_corpora
    kw = dict(mixture=[(a, 1), (b, 1)], seq_len=16, seed=4, ordered=True)
    want = [s for bt in riffle.Loader(batch_size=4, mixture_schedule=[(6, [3, 1]), (20, [1, 2])], **kw)
            for s in bt.ids.tolist()]
    ld = riffle.Loader(batch_size=4, mixture_schedule=schedule, **kw)
    got = [s for bt in ld for s in bt.ids.tolist()]
    assert got == want
    offsets = ld.offsets
    for start, end, share in ((24, 80, 0.75), (80, len(got), 1 / 3)):
        n0 = 0
        for p, s in enumerate(got[start:end]):
            n0 += s < offsets[1]
            assert abs(n0 - share * (p + 1)) <= 0.5 + 1e-9, f"{p + 1} samples after the change at {start}"
    st = ld.state_dict()
    assert st["mixture_weights"] == [[0, [1.0, 1.0]], [0, 24, [3.0, 1.0]], [0, 80, [1.0, 2.0]]]
    assert st["mixture_function"] == {"batch": 4, "through": 0}
    with pytest.raises(ValueError, match="follow its mixture_schedule function"):
        ld.set_weights([1, 1])


def epoch_ids(dl) -> list[int]:
    return [s for bt in dl for s in bt.ids.tolist()]


def test_a_schedule_function_resumes_on_another_topology(daemon, two_corpora):
    """Rank 0's state after 4 steps of 2 ranks of batches of 4 (steps of 8 samples), resumed on 3 ranks (steps of
    12) with the same function, delivers the uninterrupted run's samples: the rest of epoch 0, each once, and epoch
    1 whole, whose changes are at the first run's steps (a run begun on 3 ranks changes them elsewhere)."""
    a, b = two_corpora
    kw = dict(mixture=[(a, 1), (b, 1)], seq_len=16, seed=9, mixture_schedule=schedule)
    whole = riffle.Loader(batch_size=8, **kw)
    e0, e1 = epoch_ids(whole), epoch_ids(whole)
    head, state = [], None
    for r in range(2):
        ld = riffle.Loader(batch_size=4, rank=r, world_size=2, **kw)
        it = iter(ld)
        for _ in range(4):
            head += next(it).ids.tolist()
        state = state or ld.state_dict()
        del it
    assert state["mixture_function"] == {"batch": 8, "through": 0}
    rest, later = [], []
    for r in range(3):
        ld = riffle.Loader(batch_size=4, rank=r, world_size=3, **kw)
        ld.load_state_dict(state)
        rest += epoch_ids(ld)
        later += epoch_ids(ld)
    counts = collections.Counter(head + rest)
    assert set(counts) == set(e0) and sum(c - 1 for c in counts.values()) <= 2
    assert set(later) == set(e1) and len(later) - len(e1) <= 2, "epoch 1 is not the uninterrupted run's"
    fresh = []
    for r in range(3):
        fresh += epoch_ids(riffle.Loader(batch_size=4, rank=r, world_size=3, epoch=1, **kw))
    assert set(fresh) != set(e1), "the check cannot tell: a run begun on 3 ranks reads epoch 1 alike"
    # Through riffle.torch, on 3 ranks of 1 DataLoader worker each: the same.
    rest, later = [], []
    for r in range(3):
        dl = rt.loader(batch_size=4, rank=r, world_size=3, num_workers=1, **kw)
        dl.load_state_dict(state)
        rest += [tuple(x) for bt in dl for x in bt["input_ids"].tolist()]
        later += [tuple(x) for bt in dl for x in bt["input_ids"].tolist()]
    ref = riffle.Loader(batch_size=8, **kw)
    rows = lambda: [tuple(x) for bt in ref for x in bt.data["input_ids"].tolist()]  # noqa: E731
    r0, r1 = rows(), rows()
    head_rows = set(r0) - set(rest)
    assert len(head_rows) >= len(head) - 2 and set(rest) <= set(r0)
    assert set(later) == set(r1)


# --- a tokenized column of Parquet (pyarrow's writer): a document a row, read from its pages unpacked ---

@pytest.fixture
def parquet_corpus(tmp_path, corpus):
    """The corpus fixture's documents as an input_ids column of a zstd Parquet file of several row groups and
    pages, beside its Megatron twin."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    prefix, docs = corpus
    path = str(tmp_path / "tokens.parquet")
    col = pa.array([d.astype(np.int32) for d in docs], type=pa.list_(pa.int32()))
    pq.write_table(pa.table({"input_ids": col}), path, compression="zstd", row_group_size=150, data_page_size=4096)
    return path, prefix, docs


def test_a_parquet_token_column_equals_a_numpy_reference(daemon, parquet_corpus):
    path, _, docs = parquet_corpus
    S, seed, epoch = 32, 7, 2
    ids, labels, _ = concat_reference(docs, seed, epoch, S)
    seen = set()
    for b in riffle.Loader(path, 8, seq_len=S, seed=seed, epoch=epoch):
        for slot, i in enumerate(b.ids):
            i = int(i)
            seen.add(i)
            np.testing.assert_array_equal(b.data["input_ids"][slot], ids[i], err_msg=f"sample {i}")
            np.testing.assert_array_equal(b.data["labels"][slot], labels[i], err_msg=f"sample {i}")
    assert seen == set(range(len(ids)))


@pytest.mark.parametrize("packing", ["concat", "best_fit", "pad"])
def test_a_parquet_token_column_reads_as_its_megatron_twin(daemon, parquet_corpus, packing):
    """Through riffle.torch on 2 ranks x 2 workers, and resumed on 3 ranks from rank 0's state after 3 steps, a
    Parquet token column's batches are those of the same documents as a Megatron corpus, tensor for tensor."""
    path, prefix, _ = parquet_corpus
    kw = dict(seq_len=24, packing=packing, seed=5, epoch=1)

    def run(p):
        out, state = [], None
        for r in range(2):
            dl = rt.loader(p, 4, num_workers=2, rank=r, world_size=2, **kw)
            for k, b in enumerate(dl):
                out.append({n: b[n].tolist() for n in ("input_ids", "labels", "position_ids", "loss_mask", "cu_seqlens")})
                if k + 1 == 3:
                    break
            state = state or dl.state_dict()
        for r in range(3):
            dl = rt.loader(p, 4, num_workers=1, rank=r, world_size=3, **kw)
            dl.load_state_dict(state)
            out += [{n: b[n].tolist() for n in ("input_ids", "labels", "position_ids", "loss_mask", "cu_seqlens")} for b in dl]
        return out

    got, want = run(path), run(prefix)
    assert len(got) == len(want) and got == want


def test_a_parquet_token_columns_vocab_is_checked(daemon, parquet_corpus):
    path, _, _ = parquet_corpus
    with pytest.raises(riffle.DataError, match=r"tokens\.parquet.*outside the vocabulary"):
        for _ in riffle.Loader(path, 8, seq_len=16, vocab_size=1000):
            pass
