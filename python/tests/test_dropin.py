"""DataLoader's idioms as a script ported to riffle.torch meets them: each
taken as DataLoader takes it, or refused at construction by name with the
fix, never a TypeError from deep inside."""

from __future__ import annotations

import pytest
import torch.utils.data

import riffle


def test_a_daemon_that_fails_at_start_fails_the_client_with_its_log(tmp_path, fixed_file, monkeypatch):
    """A daemon that exits at start (here: its socket's path is longer than a Unix socket's may be, so it cannot
    listen) fails the client as soon as it exits, with its exit status and the last lines of its log; it waited
    30 s and then said only "did not start"."""
    d = tmp_path / "s"
    d.mkdir(mode=0o700)
    sock = str(d / ("x" * 120 + ".sock"))
    monkeypatch.setenv("RIFFLE_SOCKET", sock)
    with pytest.raises(riffle.RiffleError) as e:
        riffle.Loader(str(fixed_file), 10, record_size=64)
    msg = str(e.value)
    assert "exited with status 1 before it answered" in msg, msg
    assert "bind: invalid argument" in msg, msg  # the daemon's own last words, from its log


# --- loader.set_epoch and loader.sampler, as DDP code reaches for them ---

def ids_of(t) -> list[int]:
    return [int(i) for i in t[:, 0]]


def fixed_loader(path, **kw):
    import numpy as np
    import riffle.torch as rt
    return rt.loader(str(path), 50, record_size=64, dtype=np.int64, shape=(8,), **kw)


def epoch_of(path, epoch, **kw) -> list[list[int]]:
    dl = fixed_loader(path, **kw)
    dl.dataset.set_epoch(epoch)
    return [ids_of(t) for t in dl]


def test_loader_set_epoch_and_sampler(daemon, fixed_file):
    """loader.set_epoch and loader.sampler.set_epoch are the dataset's set_epoch; loader.sampler says what a
    DistributedSampler says (len is this rank's samples)."""
    dl = fixed_loader(fixed_file, seed=3, rank=1, world_size=2)
    dl.set_epoch(2)
    assert [ids_of(t) for t in dl] == epoch_of(fixed_file, 2, seed=3, rank=1, world_size=2)
    dl.sampler.set_epoch(5)
    assert dl.sampler.epoch == 5
    assert [ids_of(t) for t in dl] == epoch_of(fixed_file, 5, seed=3, rank=1, world_size=2)
    s = dl.sampler
    assert (len(s), s.rank, s.num_replicas, s.seed, s.shuffle, s.drop_last, s.total_size) == (500, 1, 2, 3, True,
                                                                                             False, 1000)
    with pytest.raises(TypeError, match="yields no indices"):
        iter(s)


def test_a_loader_keeps_its_loaded_place_through_set_epoch(daemon, fixed_file):
    """riffle.Loader's set_epoch keeps the rule riffle.torch's has: of the loaded state's epoch, the loaded place;
    of the epoch a state after its last batch ended, nothing; of another epoch, its beginning."""
    def ids(ld):
        return [[int(i) for i in b.ids] for b in ld]
    whole = ids(riffle.Loader(str(fixed_file), 100, record_size=64, seed=2, epoch=1))
    ld = riffle.Loader(str(fixed_file), 100, record_size=64, seed=2, epoch=1)
    it = iter(ld)
    head = [[int(i) for i in next(it).ids] for _ in range(4)]
    state = ld.state_dict()
    del it
    ld = riffle.Loader(str(fixed_file), 100, record_size=64, seed=2)
    ld.load_state_dict(state)
    assert ld.left() == 6
    ld.set_epoch(1)
    assert head + ids(ld) == whole
    ld.load_state_dict(state)
    ld.set_epoch(2)
    assert ld.left() == 10 and len(ids(ld)) == 10
    # After the last batch: the state is epoch 2's start; set_epoch(1) delivers nothing, then epoch 2 is whole.
    ld = riffle.Loader(str(fixed_file), 100, record_size=64, seed=2, epoch=1)
    for _ in ld:
        pass
    end = ld.state_dict()
    assert (end["epoch"], end["batch"]) == (2, 0)
    ld = riffle.Loader(str(fixed_file), 100, record_size=64, seed=2)
    ld.load_state_dict(end)
    ld.set_epoch(1)
    assert ld.left() == 0 and ids(ld) == []
    ld.set_epoch(2)
    assert ids(ld) == ids(riffle.Loader(str(fixed_file), 100, record_size=64, seed=2, epoch=2))
