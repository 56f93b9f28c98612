"""A state carries what its place means (``ordering``: the order's kind and how its places resume, a kind's sizes, a
token corpus's seq_len, packing and pack_window), and a loader of another order or other samples refuses it by
name at load_state_dict: loaded, its place would repeat some samples and drop as many, silently (a global shuffle's
state resumed in file order repeated 42 of 2,000 records and dropped 42; a concat state's position resumed under
seq_len 32 or best_fit names other samples' tokens). Another topology (ranks, DataLoader workers, batch size) is no
mismatch: that is elastic resume. A state saved before states said it loads as before."""

from __future__ import annotations

import collections

import pytest

import riffle
import riffle.torch as rt
from conftest import write_fixed
from test_tokens import make_docs, write_megatron

ORDERS = {
    "global": {},
    "sequential": dict(shuffle=False),
    "block": dict(sampler="block", block_size=4096),
    "block of other blocks": dict(sampler="block", block_size=8192),
    "buffered": dict(sampler="buffered", buffer=64),
    "opportunistic": dict(opportunistic=4),
    "shared": dict(share=True),
}


def state_after(ld: riffle.Loader, batches: int) -> tuple[list[int], dict]:
    it, got = iter(ld), []
    for _ in range(batches):
        got += next(it).ids.tolist()
    st = ld.state_dict()
    del it
    ld.close()
    return got, st


@pytest.mark.parametrize("saved,loaded", [(a, b) for a in ORDERS for b in ORDERS if a != b])
def test_a_state_of_another_order_is_refused(daemon, tmp_path, saved, loaded):
    path = write_fixed(tmp_path / "r.bin", 2000, 64)
    _, st = state_after(riffle.Loader(path, 16, record_size=64, seed=3, **ORDERS[saved]), 3)
    ld = riffle.Loader(path, 16, record_size=64, seed=3, **ORDERS[loaded])
    with pytest.raises(ValueError, match=r"this state was saved by a loader whose order and samples are .* and this "
                                         r"loader's are .*Resume with the options the state was saved with"):
        ld.load_state_dict(st)


@pytest.fixture
def corpus(tmp_path):
    prefix = str(tmp_path / "corpus")
    write_megatron(prefix, make_docs(300))
    return prefix


CUTS = {
    "concat 24": dict(seq_len=24),
    "concat 32": dict(seq_len=32),
    "best_fit 24": dict(seq_len=24, packing="best_fit"),
    "best_fit 24 of windows of 8": dict(seq_len=24, packing="best_fit", pack_window=8),
    "pad 24": dict(seq_len=24, packing="pad"),
    "shared concat 24": dict(seq_len=24, share=True),
}


@pytest.mark.parametrize("saved,loaded", [(a, b) for a in CUTS for b in CUTS if a != b])
def test_a_state_of_samples_cut_otherwise_is_refused(daemon, corpus, saved, loaded):
    _, st = state_after(riffle.Loader(corpus, 4, seed=3, **CUTS[saved]), 3)
    ld = riffle.Loader(corpus, 4, seed=3, **CUTS[loaded])
    with pytest.raises(ValueError, match="its place would name other samples here"):
        ld.load_state_dict(st)


def test_riffle_torch_refuses_another_order(daemon, corpus):
    """riffle.torch's states (with DataLoader workers) record it too, and its load_state_dict refuses."""
    dl = rt.loader(corpus, 4, seq_len=24, seed=3, num_workers=2)
    for k, _ in enumerate(dl):
        if k == 2:
            break
    st = dl.state_dict()
    assert st["ordering"]["seq_len"] == 24 and st["ordering"]["kind"] == "global"
    with pytest.raises(ValueError, match=r"packing='concat'.*packing='best_fit'"):
        rt.loader(corpus, 4, seq_len=24, packing="best_fit", seed=3, num_workers=2).load_state_dict(st)
    with pytest.raises(ValueError, match=r"shared=False.*shared=True"):
        rt.loader(corpus, 4, seq_len=24, seed=3, share=True).load_state_dict(st)


@pytest.mark.parametrize("packing", ["concat", "best_fit"])
def test_another_topology_is_no_mismatch(daemon, corpus, packing):
    """A state saved on 1 rank of batches of 4 resumes on 3 ranks of batches of 2, and through riffle.torch on
    2 workers: every sample of the epoch once (DistributedSampler's padding aside)."""
    kw = dict(seq_len=24, packing=packing, seed=5)
    head, st = state_after(riffle.Loader(corpus, 4, **kw), 6)
    n = riffle.Loader(corpus, 4, **kw).info()["samples"]
    rest = []
    for r in range(3):
        ld = riffle.Loader(corpus, 2, rank=r, world_size=3, **kw)
        ld.load_state_dict(st)
        rest += [s for b in ld for s in b.ids.tolist()]
    counts = collections.Counter(head + rest)
    assert set(counts) == set(range(n)) and sum(c - 1 for c in counts.values()) <= 2
    dl = rt.loader(corpus, 4, num_workers=2, **kw)
    dl.load_state_dict(st)
    assert sum(len(b["input_ids"]) for b in dl) == n - len(head)


def test_a_state_saved_before_states_said_it_loads(daemon, corpus):
    """An old state (no ordering) loads as before, into any loader: nothing to check it against."""
    head, st = state_after(riffle.Loader(corpus, 4, seq_len=24, seed=3), 3)
    st.pop("ordering")
    ld = riffle.Loader(corpus, 4, seq_len=24, seed=3)
    ld.load_state_dict(st)
    rest = [s for b in ld for s in b.ids.tolist()]
    assert sorted(head + rest) == list(range(ld.info()["samples"]))
