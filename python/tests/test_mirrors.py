"""Every name the client shares with the daemon is generated from its Go source (wire.py's constants and FIELDS,
spec.py's options) or checked against it here: a field renamed or added in Go fails these, not a user's job."""

from __future__ import annotations

import inspect

import pytest

import riffle
import riffle.torch as rt
from riffle import client, decode, errors, options, state, wire


def test_every_error_kind_has_its_exception():
    kinds = {v for k, v in vars(wire).items() if k.startswith("KIND_")}
    assert set(errors._KINDS) == kinds
    for kind, cls in errors._KINDS.items():
        e = errors.error_from({"op": wire.OP_ERROR, "kind": kind, "message": "m", "path": "/p", "offset": 3})
        assert type(e) is cls and issubclass(cls, riffle.RiffleError) and (e.path, e.offset) == ("/p", 3)
    # Each kind its own class (internal: the base), each public in riffle.
    classes = [c for k, c in errors._KINDS.items() if k != wire.KIND_INTERNAL]
    assert len(set(classes)) == len(classes) and all(getattr(riffle, c.__name__) is c for c in classes)


def test_filter_keys_are_the_wire_filter():
    # Every test the client takes names a field of wire.Filter, and every field is reachable.
    assert set(options._FILTER_KEYS.values()) == set(wire.FIELDS["Filter"])
    assert options._filter({"label": 3, "min_size": 1, "glob": "*.jpg"}).keys() <= set(wire.FIELDS["Filter"])


def test_subset_keys_are_the_wire_subset():
    for s in (range(3, 9), range(0, 10, 2), [1, 2], {"ranges": [[0, 4]], "labels": [1]}):
        assert set(options._subset(s)) <= set(wire.FIELDS["Subset"])
    assert set(options._ids([1, 2])) <= set(wire.FIELDS["Subset"])
    assert set(options._ids(__file__)) <= set(wire.FIELDS["Subset"])


def test_order_keys_are_wire_auto_order_less_its_measures():
    assert set(wire.FIELDS["AutoOrder"]) - set(options._ORDER_KEYS) == {"rl", "rate", "sequential"}
    assert set(options._ORDER_KEYS) <= set(wire.FIELDS["AutoOrder"])


def test_places_a_rest_sends_are_wire_states_and_parts():
    # The places of every part of a run, as the client puts them in a spec's delivered: wire.State with a wire.Part.
    run = {"epoch": 1, "batch": 0, "seed": 0, "world": 2, "ranks": {
        "0": {"epoch": 1, "batch": 2, "seed": 0, "world": 2, "rank": 0, "batch_size": 8, "window": 4,
              "sampler_state": "AAA=", "skip": [1]},
        "1": {"epoch": 1, "batch": 1, "seed": 0, "world": 2, "rank": 1, "batch_size": 8, "window": 4,
              "num_workers": 2, "workers": {"0": {"epoch": 1, "batch": 1, "seed": 0}, "1": {"epoch": 2, "batch": 0}}}}}
    epoch, places = state._rest_places(run, 3, 0, shared=False)
    assert epoch == 1 and places
    for p in places:
        assert set(p) <= set(wire.FIELDS["State"]), p
        assert set(p["part"]) <= set(wire.FIELDS["Part"]), p


def test_spec_names_are_wire_jobspec():
    assert set(riffle.spec.OPTIONS) == set(wire.FIELDS["JobSpec"])


def test_decoders_are_decode_functions():
    """riffle.torch's decode= kinds are riffle.decode's functions, and each of those that makes a batch's records
    into values is a kind (or read by another: rows by "auto")."""
    own = {"auto", "image", "bytes"}  # riffle.torch's own: by the format, PIL images, the records' bytes
    named = {"text": "lines"}
    for kind in set(rt.DECODERS) - own:
        assert callable(getattr(decode, named.get(kind, kind))), kind
    # Functions of riffle.decode that are not decode= kinds: rows (auto decodes them), and helpers.
    not_kinds = {"arrow", "columns", "record_batch", "npy_dtype", "transformed_column", "tar_sample"}
    public = {n for n, f in vars(decode).items() if inspect.isfunction(f) and not n.startswith("_")
              and f.__module__ == decode.__name__}
    assert public == {named.get(k, k) for k in set(rt.DECODERS) - own} | not_kinds


@pytest.mark.parametrize("module, names", [
    (client, ["Batch", "Connection", "DEFAULT_TIMEOUT", "DaemonGone", "DataChanged", "DataError", "InvalidSpec",
              "JobClosed", "Loader", "MemoryBudget", "OPEN_TIMEOUT", "PathNotFound", "RiffleError", "UnsafeSocket",
              "connect", "default_socket", "error_from", "find_binary", "merge_states", "private_dir",
              "start_daemon", "wait_for_socket"]),
    (rt, ["DECODERS", "IMG_EXTENSIONS", "RecordError", "RiffleDataLoader", "RiffleDataset", "RiffleSampler", "loader",
          "Batch", "Loader", "RiffleError", "merge_states", "_lent", "_Lent", "_borrowed", "_record_paths"]),
])
def test_names_stay_where_they_were(module, names):
    """client.py and torch.py were split into modules of one idea each: every name they had is still theirs."""
    missing = [n for n in names if not hasattr(module, n)]
    assert not missing
