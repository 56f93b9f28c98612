"""The client asks the daemon what a job's order is (issue 47): an opened or check reply's ``order``
(wire.OrderInfo: kind, positional, shared, rest, packed, replay) decides how a state is saved and how it resumes,
in riffle.Loader and riffle.torch alike, and nothing in the client works it out again from the options. Each order
a user names (and each case combinations.json keeps) is saved on two ranks and resumed on one: its state and its
resume's path are the ones its ``order`` says. States saved before the client asked (literal dicts, as the client
of 2026-11 wrote them) still load."""

from __future__ import annotations

import ast
import collections
import json
from pathlib import Path

import pytest

import riffle
import riffle.torch as rt
from conftest import record, write_fixed
from riffle import spec
from riffle.options import _ORDER_KEYS
from test_combinations import POSITIONAL, REGRESSIONS, SAMPLERS, make_data, options, restable, source

N = 600
BATCH = 16
SEED = 5
HEAD = 3  # batches each rank delivers before its state is taken

# Orders as users name them: loader keywords (a mixture's over two sources of N records each).
ORDERS = {
    "global": {},
    "sequential": {"shuffle": False},
    "block": {"sampler": "block", "block_size": 4096, "window": 4},
    "buffered": {"sampler": "buffered", "block_size": 4096, "buffer": 128},
    "reservoir": {"sampler": "reservoir", "reservoir": 64},
    "auto": {"sampler": "auto"},
    "opportunistic": {"sampler": "global", "opportunistic": 2},
    "opportunistic_block": {"sampler": "block", "block_size": 4096, "opportunistic": 2},
    "shared": {"share": True},
    "shared_subset": {"share": True, "ids": list(range(0, N, 2))},
    "shared_block": {"sampler": "block", "block_size": 4096, "share": True},  # reads alone: only a shuffle is shared
    "mixture": {"mixture": True},
    "shared_mixture": {"mixture": True, "share": True},
}

RIFFLE = Path(riffle.__file__).parent


def keys_read(path: Path):
    """(the name read from, the key, the line) of each constant key a module reads: x["k"] and x.get("k")."""
    for n in ast.walk(ast.parse(path.read_text())):
        if isinstance(n, ast.Subscript) and isinstance(n.slice, ast.Constant):
            target, key = n.value, n.slice.value
        elif (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "get" and n.args
              and isinstance(n.args[0], ast.Constant)):
            target, key = n.func.value, n.args[0].value
        else:
            continue
        yield getattr(target, "attr", None) or getattr(target, "id", None), key, n.lineno


def test_the_client_works_out_no_order():
    """The rules the client once kept beside the daemon's (_positional, _shared, _restable, _keeps) are gone, and
    its resume arithmetic (state.py, riffle.torch's places) reads none of the options that make an order (share,
    sampler, shuffle): only the order the daemon said, whose every field the client reads is wire.OrderInfo's."""
    gone = {"_positional", "_shared", "_restable", "_keeps"}
    read = set()
    for path in RIFFLE.glob("*.py"):
        tree = ast.parse(path.read_text())
        named = {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        named |= {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        named |= {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
        named |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        assert not named & gone, f"{path.name}: {sorted(named & gone)}"
        for whose, key, line in keys_read(path):
            if path.name in ("state.py", "_torch_places.py"):
                assert key not in ("share", "sampler", "shuffle"), f"{path.name}:{line} reads {key!r}"
            if whose in ("order", "_order"):
                read.add(key)
    assert read and read <= set(riffle.wire.FIELDS["OrderInfo"]), read


def test_an_older_daemon_is_named():
    """A reply without the order (a riffle serve from before it said one) is a clear error, not a guess."""
    from riffle.state import _order
    with pytest.raises(riffle.RiffleError, match="older riffle serve"):
        _order({"op": "opened", "records": 3})
    with pytest.raises(riffle.RiffleError, match="older riffle serve"):
        _order({"op": "opened", "order": {"kind": "global", "positional": True}})
    assert _order({"order": {"kind": "global", "positional": True, "shared": False, "packed": True,
                             "replay": False}})["rest"] == ""


def test_kinds_are_the_daemons_table():
    """The sampler kinds Python names are the Go table's (spec.SAMPLERS, generated from sampler.Kinds): the
    combination test draws each (and opportunistic windows, and auto), its model of which resume by position
    names the table's positional kinds, and the Loader's docstring names each."""
    assert set(SAMPLERS) == set(spec.SAMPLERS) | {"opportunistic", "auto"}
    assert set(POSITIONAL) == {k for k, (positional, *_) in spec.SAMPLERS.items() if positional} | {"auto"}
    first, *others = spec.SAMPLERS
    doc = riffle.Loader.__doc__
    assert f"{first} shuffle" in doc and all(f'``"{k}"``' in doc for k in others)
    assert spec.OPTIONS["sampler"][5].startswith("the order: " + ", ".join(spec.SAMPLERS) + ";")


def write_sources(root: Path) -> tuple[str, list]:
    a = write_fixed(root / "a.bin", N, 64)
    b = root / "b.bin"
    b.write_bytes(b"".join(record(i, 64) for i in range(N, 2 * N)))
    return str(a), [[str(a), 1], [str(b), 1]]


def loader_kwargs(name: str, path: str, mixture: list) -> dict:
    kw = dict(ORDERS[name], record_size=64, seed=SEED)
    if kw.pop("mixture", None):
        kw["mixture"] = mixture
    else:
        kw["paths"] = path
    return kw


def ids_of(batches) -> list[int]:
    return [int(i) for b in batches for i in b.ids]


def take(ld, n: int) -> tuple[list[int], dict]:
    it, got = iter(ld), []
    for _ in range(n):
        got += [int(i) for i in next(it).ids]
    st = ld.state_dict()
    del it
    ld.close()
    return got, st


def check_follows(ld: riffle.Loader, kw: dict, world: int = 2) -> None:
    """Two ranks' states of ld's order (ld: a loader of it, opened), and a resume of them on one rank: each state
    and the resume's path are what ld.order says."""
    order = ld.order
    assert order["kind"] in spec.SAMPLERS, order
    if kw.get("sampler") == "auto":
        kw = dict(kw, auto_order={k: ld.auto[k] for k in _ORDER_KEYS if ld.auto.get(k)})
    full = ids_of(riffle.Loader(**kw, batch_size=BATCH))  # one epoch on one rank, from its start
    head, states = [], []
    for r in range(world):
        part = riffle.Loader(**kw, batch_size=BATCH, rank=r, world_size=world)
        assert part.order == order, "every rank's order is the one the daemon said"
        got, st = take(part, HEAD)
        head += got
        states.append(st)
        # The state says what the order needs of it: a position, or whose part it is.
        assert ("position" in st) == order["positional"], (order, st)
        assert ("rank" in st) == bool(order["shared"] or order["rest"]), (order, st)
        assert ("window" in st) == (order["rest"] == "opportunistic"), (order, st)
    again = riffle.Loader(**kw, batch_size=BATCH)
    if order["positional"]:
        # Rank 0's state alone: the rest from its position, on any number of ranks.
        again.load_state_dict(states[0])
        assert again._batch * BATCH + again._start == world * HEAD * BATCH
        rest = ids_of(again)
        assert collections.Counter(head + rest) == collections.Counter(full)
    elif order["rest"]:
        # Every rank's places: the rest of the epoch without what they delivered.
        again.load_state_dict(riffle.merge_states(states))
        assert again._delivered, "the rest of an epoch is dealt from every part's places"
        rest = ids_of(again)
        counts = collections.Counter(head + rest)
        assert set(counts) == set(full) and sum(c - 1 for c in counts.values()) <= world - 1
    elif order["shared"]:
        # A shared mixture's places are its ranks' own, and it resumes only on the topology that saved it.
        with pytest.raises(ValueError, match="this state is rank 0's, and this loader is rank 1"):
            riffle.Loader(**kw, batch_size=BATCH, rank=1, world_size=world).load_state_dict(states[0])
        with pytest.raises(ValueError, match="a mixture resumes on the topology it was saved on"):
            again.load_state_dict(riffle.merge_states(states))
            next(iter(again))
    else:
        # Opportunistic windows over blocks: only on as many ranks.
        with pytest.raises(ValueError, match=f"saved on {world} ranks and this loader is one of 1"):
            again.load_state_dict(states[0])
    again.close()


@pytest.mark.parametrize("name", list(ORDERS))
def test_a_resume_follows_the_daemons_order(daemon, tmp_path, name):
    """Each order a user names: the daemon's answer is what the client used to work out itself (a shuffle asked to
    share is shared, a mixture's too, and resumes from a position no longer; an opportunistic global order's rest
    is every rank's places), and its states and resumes follow it."""
    path, mixture = write_sources(tmp_path)
    kw = loader_kwargs(name, path, mixture)
    ld = riffle.Loader(**kw, batch_size=BATCH)
    want = {"shared": name.startswith("shared") and name != "shared_block",
            "rest": {"shared": "shared", "shared_subset": "shared", "opportunistic": "opportunistic"}.get(name, "")}
    want["positional"] = not (want["shared"] or name.startswith("opportunistic"))
    assert {k: ld.order[k] for k in want} == want, ld.order
    check_follows(ld, kw)


@pytest.mark.parametrize("case", json.loads(REGRESSIONS.read_text()),
                         ids=lambda c: "-".join(str(v) for v in c.values()))
def test_the_combination_cases_follow_the_daemons_order(daemon, tmp_path, case):
    """Each case combinations.json keeps: the combination test's model of its order agrees with the daemon's answer
    (the orders it resumes from every rank's places are those whose rest is; those it resumes from a position are
    positional: it resumes no shared case so, though a block or buffered order asked to share reads alone and is
    positional too), and a resume follows the answer."""
    path = make_data(case["format"], tmp_path / "data", case.get("record_size", 64))
    kw = dict(options(case), **source(path), seed=SEED)
    ld = riffle.Loader(**kw, batch_size=BATCH)
    assert bool(ld.order["rest"]) == restable(case), ld.order
    if case["sampler"] in POSITIONAL and not case["share"]:
        assert ld.order["positional"], ld.order
    check_follows(ld, kw)


def test_the_client_follows_the_answer_not_the_options(daemon, tmp_path):
    """Told another order than its options make, the client's places follow what it was told: the daemon's
    answer, not a rule of its own, decides them (riffle.Loader, and riffle.torch's places with workers)."""
    path, _ = write_sources(tmp_path)
    told = {"positional": False, "rest": "shared", "shared": True}
    for tell in (False, True):
        ld = riffle.Loader(path, BATCH, record_size=64, seed=SEED)
        if tell:
            ld.order = dict(ld.order, **told)
        _, st = take(ld, 1)
        assert ("position" in st, st.get("rank")) == ((False, 0) if tell else (True, None)), st
        dl = rt.loader(path, BATCH, record_size=64, seed=SEED, num_workers=2, decode=ids)
        if tell:
            dl.dataset._order = dict(dl.dataset._order, **told)
        it = iter(dl)
        next(it)
        st = dl.state_dict()
        del it
        assert ("position" in st, st.get("rank")) == ((False, 0) if tell else (True, None)), st


def ids(batch) -> list[int]:
    """riffle.torch's decode: a batch as its records' ids."""
    return [int(i) for i in batch.ids]


@pytest.mark.parametrize("name", ["global", "buffered", "opportunistic", "opportunistic_block", "shared",
                                  "shared_mixture"])
def test_torch_places_follow_the_daemons_order(daemon, tmp_path, name):
    """riffle.torch: a state with two DataLoader workers says what the probe's order says it needs, and resumes
    with one worker by the path that order takes: the rest of the epoch, each record once, or a refusal."""
    path, mixture = write_sources(tmp_path)
    kw = loader_kwargs(name, path, mixture)
    kw["paths"] = kw.pop("paths", None)
    dl = rt.loader(batch_size=BATCH, num_workers=2, decode=ids, **kw)
    order = dl.dataset._order
    assert order == riffle.Loader(**kw, batch_size=BATCH).order
    full = [i for b in rt.loader(batch_size=BATCH, decode=ids, **kw) for i in b]
    it, head = iter(dl), []
    for _ in range(HEAD):
        head += next(it)
    st = dl.state_dict()
    del it
    assert ("position" in st) == order["positional"] and ("rank" in st) == bool(order["shared"] or order["rest"])
    again = rt.loader(batch_size=BATCH, num_workers=1, decode=ids, **kw)
    if order["positional"] or order["rest"]:
        again.load_state_dict(st)
        rest = [i for b in again for i in b]
        assert sorted(head + rest) == sorted(full)
    elif order["shared"]:
        with pytest.raises(ValueError, match="a mixture resumes on the topology it was saved on"):
            again.load_state_dict(st)
            next(iter(again))
    else:
        with pytest.raises(ValueError, match="resumes only with as many"):
            again.load_state_dict(st)


# States as the client wrote them before it asked the daemon its order (2026-11), of a file of N records of 64
# bytes read with seed 5 in batches of 16: what each order's state records of it (a position, whose part, a window)
# is what a client of today reads.
OLD_STATES = {
    "global": ({}, {"epoch": 0, "batch": 3, "seed": 5, "world": 2, "position": 96}),
    "block": (ORDERS["block"], {"epoch": 0, "batch": 3, "seed": 5, "world": 1, "position": 48}),
    "sequential": ({"shuffle": False}, {"epoch": 0, "batch": 3, "seed": 5, "world": 2, "position": 96}),
    "auto": ({"sampler": "auto"}, {"epoch": 0, "batch": 3, "seed": 5, "world": 1, "position": 48,
                                   "order": {"sampler": "global"}}),
    "opportunistic": (ORDERS["opportunistic"], {"epoch": 0, "batch": 2, "seed": 5, "world": 1, "rank": 0,
                                                "batch_size": 16, "window": 2}),
    "shared": ({"share": True}, {"epoch": 1, "batch": 0, "seed": 5, "world": 2, "ranks": {
        "0": {"epoch": 1, "batch": 0, "seed": 5, "world": 2, "rank": 0},
        "1": {"epoch": 1, "batch": 0, "seed": 5, "world": 2, "rank": 1}}}),
    "torch_workers": ({}, {"epoch": 0, "batch": 3, "seed": 5, "num_workers": 2, "next_worker": 1, "workers": {
        "0": {"epoch": 0, "batch": 4, "seed": 5, "world": 1}, "1": {"epoch": 0, "batch": 3, "seed": 5, "world": 1}},
        "world": 1, "position": 48}),
}


@pytest.mark.parametrize("name", list(OLD_STATES))
def test_states_saved_before_the_order_was_asked_still_load(daemon, tmp_path, name):
    """Each older state resumes where it says: the rest of the order from its position (the records after it of
    an uninterrupted run), or, of every part's places, the rest of the epoch, each record once."""
    path, _ = write_sources(tmp_path)
    kw, state = OLD_STATES[name]
    kw = dict(kw, record_size=64, seed=SEED)
    # sampler="auto" reads the order the state says it chose.
    full = [[int(i) for i in b.ids] for b in riffle.Loader(path, BATCH, **dict(kw, auto_order=state.get("order")))]
    if name == "torch_workers":
        dl = rt.loader(path, BATCH, num_workers=2, decode=ids, **kw)
        dl.load_state_dict(state)
        rest = [i for b in dl for i in b]
        assert sorted(rest) == sorted(i for b in full[3:] for i in b)
        return
    ld = riffle.Loader(path, BATCH, **kw)
    ld.load_state_dict(state)
    rest = ids_of(ld)
    if "position" in state:
        assert sorted(rest) == sorted(i for b in full[state["position"] // BATCH:] for i in b)
    elif state["epoch"] == 1:
        assert sorted(rest) == list(range(N))
    else:
        assert sorted(rest) == sorted(i for b in full[state["batch"]:] for i in b)
