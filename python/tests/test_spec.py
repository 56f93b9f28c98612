"""The Python client takes the daemon's one table of job options (riffle/spec.py, generated from Go's job.Options)."""

from __future__ import annotations

import inspect

import riffle
import riffle.torch as rt
from riffle import spec

# Keywords that are the client's own (the connection, the view of batches), not job options.
CLIENT_ONLY = {"self", "paths", "socket", "address", "token", "timeout", "autostart", "dtype", "shape", "pipeline",
               "reconnect"}
# Options a client sets itself, from its place and its epochs, not from keywords.
PLACE = {"epochs", "sampler_state", "skip", "batch", "start"}


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
