"""The Python client takes the daemon's one table of job options (riffle/spec.py, generated from Go's job.Options)."""

from __future__ import annotations

import inspect

import pytest

import riffle
import riffle.torch as rt
from riffle import spec

# Keywords that are the client's own (the connection, the view of batches), not job options.
CLIENT_ONLY = {"self", "paths", "socket", "address", "token", "timeout", "autostart", "dtype", "shape", "pipeline",
               "reconnect", "shard_drop_last",  # shard_drop_last: rank_drop_last's old name
               "ids"}  # ids: the subset's ids, or its ids_file
# Options a client sets itself, from its place and its epochs, not from keywords.
PLACE = {"epochs", "sampler_state", "skip", "batch", "start", "generations", "delivered"}


def test_loader_keywords_are_the_table():
    params = set(inspect.signature(riffle.Loader.__init__).parameters) - CLIENT_ONLY
    table = {v[0] for k, v in spec.OPTIONS.items() if k not in PLACE and k != "paths"}
    assert params == table, (sorted(params - table), sorted(table - params))


def test_defaults_come_from_the_table():
    assert inspect.signature(riffle.Loader.__init__).parameters["batch_size"].default == spec.DEFAULT_BATCH_SIZE
    assert inspect.signature(rt.loader).parameters["batch_size"].default == spec.DEFAULT_BATCH_SIZE
    assert inspect.signature(rt.RiffleDataset.__init__).parameters["batch_size"].default == spec.DEFAULT_BATCH_SIZE


def test_spec_sends_the_table_names(daemon, fixed_file):
    ld = riffle.Loader(fixed_file, 10, record_size=64, world_size=2, rank=1, memory=1 << 20)
    assert ld.spec["world"] == 2 and ld.spec["memory_bytes"] == 1 << 20
    assert set(ld.spec) <= set(spec.OPTIONS)


def test_false_is_sent_where_the_default_may_be_true(daemon, fixed_file):
    """A keyword left out is unset (the daemon's default); False is sent only where that default is not false:
    ordered=False over file order (whose default is ordered), direct=False (whose default may be O_DIRECT)."""
    ld = riffle.Loader(fixed_file, 10, record_size=64, shuffle=False, ordered=False, direct=False, csv_header=False)
    assert ld.spec.get("ordered") is False and ld.spec.get("direct") is False and "csv_header" not in ld.spec
    assert "ordered" not in riffle.Loader(fixed_file, 10, record_size=64, shuffle=False).spec
    ids = [int(i) for b in ld for i in b.ids]
    # Each batch its file-order part, in whatever order its reads came in.
    assert all(sorted(ids[k:k + 10]) == list(range(k, k + 10)) for k in range(0, 1000, 10))


def test_shard_drop_last_is_rank_drop_last_old_name(daemon, tmp_path):
    """One noun, one idea: a rank's split of an epoch is its part, a shard a pack's file; the old keyword warns and works."""
    import numpy as np
    p = tmp_path / "ids.npy"
    np.save(p, np.arange(10, dtype=np.int64))
    with pytest.warns(DeprecationWarning, match="rank_drop_last"):
        old = riffle.Loader(str(p), 2, seed=1, rank=0, world_size=3, shard_drop_last=True)
    new = riffle.Loader(str(p), 2, seed=1, rank=0, world_size=3, rank_drop_last=True)
    assert [b.ids.tolist() for b in old] == [b.ids.tolist() for b in new]
    assert sum(b.n for b in new) == 3  # 10 records over 3 ranks, the tail dropped


# The client's own keywords, by the group they join or make: the job options' groups (spec.GROUPS), then its own.
CLIENT_GROUPS = {"dataset": {"ids"}, "sharing": {"shard_drop_last"}, "view": {"dtype", "shape"},
                 "connection": {"socket", "address", "token", "timeout", "autostart", "reconnect", "pipeline"}}


def test_loader_keywords_follow_their_groups():
    """The Loader's signature lists its keywords group by group, in the table's order of groups (spec.GROUPS, from
    job.Groups) and then the client's own; its docstring has a section for each group that names every keyword of
    it."""
    import re
    order = list(spec.GROUPS) + ["view", "connection"]
    group = {kw: g for g, (_, kws) in spec.GROUPS.items() for kw in kws}
    group.update({kw: g for g, kws in CLIENT_GROUPS.items() for kw in kws})
    params = [p for p in inspect.signature(riffle.Loader.__init__).parameters if p != "self"]
    assert params[:2] == ["paths", "batch_size"]  # positional, as DataLoader's dataset and batch_size
    seen = [order.index(group[p]) for p in params[2:]]
    assert seen == sorted(seen), [(p, group[p]) for p in params[2:]]
    doc = inspect.cleandoc(riffle.Loader.__doc__)
    heads = [(m.group(1).lower(), m.start()) for m in re.finditer(r"^(\w+)\n-+$", doc, re.M)]
    assert [h for h, _ in heads] == order
    for k, (g, at) in enumerate(heads):
        section = doc[at:heads[k + 1][1] if k + 1 < len(heads) else len(doc)]
        mine = [p for p in params if group[p] == g]
        missing = [p for p in mine if f"``{p}``" not in section and f"``{p}=" not in section]
        assert not missing, (g, missing)
