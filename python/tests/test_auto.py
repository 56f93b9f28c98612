"""sampler="auto": the daemon picks the order from the device's measured
rate and the randomization level asked; the choice is pinned for the
loader's life and recorded in its state, so a resume reads the same order
whatever the device measures next time."""

from __future__ import annotations

import numpy as np
import pytest

import riffle
from conftest import epoch_records, status


def ids_of(ld) -> list[int]:
    return [int(i) for b in ld for i in b.ids]


def test_auto_chooses_and_pins(daemon, fixed_file):
    ld = riffle.Loader(fixed_file, batch_size=64, record_size=64, sampler="auto", min_randomness=0.5, seed=4)
    a = ld.auto
    assert a is not None and a["sampler"] in ("global", "block") and a["rl"] >= 0.5 and a["rate"] > 0
    assert ld.spec["auto_order"] == {k: a[k] for k in ("sampler", "block_size", "window") if a.get(k)}
    it = iter(ld)
    first = next(it)
    jobs = [j for g in status(daemon.sock).get("groups") or [] for j in g["jobs"]]
    assert any(j.get("auto") == a for j in jobs), f"no job in status with auto {a}: {jobs}"
    ids = [int(i) for i in first.ids] + [int(i) for b in it for i in b.ids]
    assert sorted(ids) == list(range(len(ids)))
    st = ld.state_dict()
    assert st["order"] == {k: a[k] for k in ("sampler", "block_size", "window") if a.get(k)}


def test_resume_reads_the_states_order(daemon, fixed_file):
    """A state names the order auto chose then: a new loader with
    sampler="auto" reads that one, not its own choice; a loader naming
    another order refuses the state."""
    order = {"sampler": "block", "block_size": 8192, "window": 16}
    want = riffle.Loader(fixed_file, batch_size=64, record_size=64, seed=4, **order)
    it = iter(want)
    for _ in range(3):
        next(it)
    st = want.state_dict()
    st["order"] = order
    rest = [int(i) for b in it for i in b.ids]
    ld = riffle.Loader(fixed_file, batch_size=64, record_size=64, sampler="auto", min_randomness=0.1, seed=4)
    ld.load_state_dict(st)
    assert ld.spec["auto_order"] == order
    assert ids_of(ld) == rest
    assert ld.auto["sampler"] == "block" and ld.state_dict()["order"] == order
    other = riffle.Loader(fixed_file, batch_size=64, record_size=64, seed=4)
    with pytest.raises(ValueError, match="auto"):
        other.load_state_dict(st)


def test_auto_needs_one_choice_for_all_ranks(daemon, fixed_file):
    with pytest.raises(ValueError, match="world_size"):
        riffle.Loader(fixed_file, batch_size=64, record_size=64, sampler="auto", rank=0, world_size=2)
    with pytest.raises(riffle.RiffleError, match="min_randomness"):
        riffle.Loader(fixed_file, batch_size=64, record_size=64, sampler="auto", min_randomness=2).info()


def test_auto_through_torch_with_workers(daemon, fixed_file):
    """riffle.torch pins the choice before its workers start: each worker
    reads the one order, every record once an epoch, and the state names it."""
    import riffle.torch as rt
    dl = rt.loader(str(fixed_file), 32, record_size=64, sampler="auto", min_randomness=0.5, seed=2, num_workers=2)
    seen = []
    for x in dl:
        seen.extend(int(v) for v in np.asarray(x[:, :8]).copy().view("<u8").ravel())
    assert sorted(seen) == list(range(len(seen)))
    assert dl.state_dict()["order"]["sampler"] in ("global", "block")


def test_torch_resume_reads_the_states_order(daemon, fixed_file):
    """riffle.torch with sampler="auto" takes the order a state names (its
    check of the state's order compares only how samples are cut), and a
    loader naming another order refuses the state by the auto rule."""
    import riffle.torch as rt
    order = {"sampler": "block", "block_size": 8192, "window": 16}
    want = rt.loader(str(fixed_file), 64, record_size=64, seed=4, **order)
    it = iter(want)
    for _ in range(3):
        next(it)
    st = want.state_dict()
    st["order"] = order
    rest = [int(v) for x in it for v in np.asarray(x[:, :8]).copy().view("<u8").ravel()]
    ld = rt.loader(str(fixed_file), 64, record_size=64, sampler="auto", min_randomness=0.1, seed=4)
    ld.load_state_dict(st)
    got = [int(v) for x in ld for v in np.asarray(x[:, :8]).copy().view("<u8").ravel()]
    assert got == rest
    other = rt.loader(str(fixed_file), 64, record_size=64, seed=4)
    with pytest.raises(ValueError, match="auto"):
        other.load_state_dict(st)
