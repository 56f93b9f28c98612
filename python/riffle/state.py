"""Resume arithmetic: what a loader's state says of its place, on the topology that saved it or on another
(ranks, DataLoader workers), and what a shared order's loader keeps to rebuild its job's state.

Which orders resume how is the daemon's to say: its ``opened`` (and ``check``) reply's ``order`` (wire.OrderInfo,
read by ``_order``) says what the job's order is, and the arithmetic here follows it; nothing here works it out
again from a loader's options.
"""

from __future__ import annotations

import collections
import json
from typing import Sequence

import numpy as np

from . import spec
from .errors import DataChanged, RiffleError

# For messages: the kinds of order that are functions of position, which resume on any topology (the table's).
_POSITIONAL_KINDS = ", ".join(k for k, (positional, *_) in spec.SAMPLERS.items() if positional)


def _order(reply: dict) -> dict:
    """The order an ``opened`` or ``check`` reply says its job reads, as the daemon decided it (wire.OrderInfo: its
    ``kind``; ``positional``, a place in it is a position any topology resumes from; ``shared``, the plan shares it;
    ``rest``, "shared" or "opportunistic" if an epoch resumes on another topology from every part's places, else "";
    ``packed``; ``replay``, the client may rebuild a shared state from the records it delivered)."""
    order = reply.get("order")
    if not isinstance(order, dict) or not {"kind", "positional", "shared", "replay"} <= order.keys():
        raise RiffleError("the riffle daemon did not say what its job's order is (its opened reply has no order, or "
                          "an order of fewer fields): it is an older riffle serve than this client; stop it, and the "
                          "next loader starts this riffle's daemon")
    return dict(order, rest=order.get("rest") or "")


def _parts(order: dict) -> bool:
    """Whether a place in this order (an order reply's) is its part's own (rank, DataLoader worker), so a state says
    whose it is and resumes only that part, or, with every part's places, the rest of its epoch: a shared order,
    whose records each rank's group dealt it (a shared mixture's too, whose rest is the daemon's to refuse: it
    resumes on the topology that saved it), or an order whose epoch resumes on another topology as its rest."""
    return bool(order["shared"] or order["rest"])


def _rest(state: dict, world: int, workers: int | None = None) -> bool:
    """Whether a shared order's state resumes as the rest of its epoch: it is one already, or it was saved on
    another topology (ranks, or DataLoader workers: ``workers`` is this run's, None if not asked)."""
    def any_delivered(st: dict) -> bool:
        return bool(st.get("delivered") or st.get("rest")) or any(any_delivered(r) for r in (st.get("workers") or {}).values())
    if not (int(state.get("batch", 0)) or state.get("sampler_state") or state.get("skip") or "workers" in state
            or "ranks" in state or any_delivered(state)):
        return False  # an epoch's start: any topology begins it
    saved_workers = int(state.get("num_workers", 0)) if "workers" in state else 0
    return ("ranks" in state or any_delivered(state) or int(state.get("world", world)) != world
            or (workers is not None and max(1, saved_workers) != max(1, workers)))


def _own(state: dict, world: int, rank: int, workers: int | None = None) -> dict:
    """Of every rank's states merged, this rank's own, when the run goes on on the topology that saved them and
    not in the rest of an epoch: it resumes as it was. Any other state as it is."""
    if "ranks" not in state or int(state.get("world", world)) != world:
        return state
    own = state["ranks"].get(str(rank))
    if own is None or any(_rest(st, world, workers) for st in state["ranks"].values()):
        return state
    return own


def _rest_places(state: dict, world: int, rank: int, drop_last: bool = False,
                 shared: bool = True) -> tuple[int, list[dict]]:
    """A shared or opportunistic order's state as the rest of its epoch: the epoch, and the places of every part
    (rank, worker) of the run that saved it, whose records the rest leaves out. A uniform permutation's rest, given
    the records before it, is a uniform permutation of the others, so any topology goes on from them exactly
    once. A shared part's place is the set it delivered; an opportunistic one's, its window less what it delivered
    of it (``skip``), in batches of its ``batch_size`` in windows of ``window``."""
    saved = int(state.get("world", world))
    if "ranks" in state:
        ranks = {int(r): st for r, st in state["ranks"].items()}
        if set(ranks) != set(range(saved)):
            raise ValueError(f"this merged state holds the states of ranks {sorted(ranks)} of {saved}: every rank's "
                             "is needed to resume a shared order")
        parts = list(ranks.values())
    elif saved != world and saved > 1:
        raise ValueError(f"this state is one rank's of {saved}, and this run has {world}: a shared or opportunistic "
                         "order's ranks deliver records whose place their own state alone says, so resuming on "
                         "another number of ranks needs every rank's state: save each (or state_dict(all_ranks=True) "
                         "in riffle.torch) and pass riffle.merge_states([...])")
    else:
        if saved == world:
            _check_rank(state, rank)
        parts = [state]  # of one rank: every rank's
    # Each role (a rank's DataLoader worker, or the rank) and whose part it is.
    roles = []
    for p in parts:
        whose = {"rank": int(p.get("rank", 0) or 0), "world": saved, "drop_last": bool(drop_last)}
        if not shared and p.get("batch_size") and p.get("window"):
            whose.update(batch_size=int(p["batch_size"]), window=int(p["window"]))
        if "workers" in p:
            k = int(p.get("num_workers", len(p["workers"])))
            roles += [(r, dict(whose, worker=int(w), workers=k)) for w, r in p["workers"].items()]
        else:
            roles.append((p, dict(whose, worker=0, workers=1)))
    epoch = min(int(r["epoch"]) for r, _ in roles)
    # A role handed the places of the run before a rest, not opened yet, holds them (``rest``); once opened, it
    # holds the rest's basis instead (``delivered``: one set, the daemon's), and its place is of the rest's run.
    # When any role opened, the run is the rest's: every role's place is of it, those not opened having delivered
    # none; when none did, the places handed are all there is. (A shared order's places are sets: any union of
    # them is what was delivered, so a shared role's handed places are kept too.)
    opened = any(r.get("delivered") for r, _ in roles)
    places, seen, progress = [], set(), False
    for r, part in roles:
        own = []
        moved = bool(int(r.get("batch", 0)) or r.get("skip") or r.get("sampler_state") or int(r["epoch"]) > epoch)
        unopened = bool(r.get("rest")) and not (opened and not shared)
        if int(r["epoch"]) > epoch:
            # Past the epoch: this part delivered all of its records of it, which only whose part it is names (of
            # a rest, dealt from what its run was opened without: the places it ended with say what).
            own = [{"epoch": int(r["epoch"]), "batch": 0, "part": part}] + list(r.get("ended") or [])
        elif r.get("sampler_state") or (not shared and not unopened):
            # An opportunistic part's place, even at its start: the rest needs every rank's.
            own = [{"epoch": int(r["epoch"]), "batch": int(r["batch"]), "skip": list(r.get("skip") or []),
                    "part": part}]
            if r.get("sampler_state"):
                own[0]["sampler_state"] = r["sampler_state"]
        elif moved:
            raise ValueError(f"a place in epoch {epoch} (batch {r['batch']}) without its sampler state: it was taken "
                             "after its job closed; call state_dict() while iterating")
        if own and not shared and "batch_size" not in part:
            raise ValueError("this state of an opportunistic order does not say its batch size and window (an older "
                             "riffle saved it): resume it on the topology that saved it")
        progress = progress or moved
        kept = list(r.get("delivered") or [])
        if not (opened and not shared):
            kept += list(r.get("rest") or [])
        for p in kept + own:
            key = json.dumps(p, sort_keys=True)
            if key not in seen:
                seen.add(key)
                places.append(p)
    if progress and saved > 1 and "ranks" not in state:
        # Every rank at the start of one rest (the same places) deals it alike; past it, each rank's own progress
        # is needed to deal the rest again.
        raise ValueError(f"this state is one rank's of {saved}, of a shared or opportunistic order on another number of DataLoader "
                         "workers (or in the rest of an epoch resumed so): the rest of its epoch is dealt to the "
                         "ranks from what every rank delivered, so it needs every rank's state: "
                         "state_dict(all_ranks=True) in riffle.torch, or riffle.merge_states([...])")
    return epoch, places


def _check_rank(state: dict, rank: int) -> None:
    """Refuse another rank's state of a shared or opportunistic order: its ranks read other records, in windows of
    their own."""
    if state.get("rank") is not None and "ranks" not in state and int(state["rank"]) != rank:
        raise ValueError(f"this state is rank {state['rank']}'s, and this loader is rank {rank}: a shared or "
                         "opportunistic order's ranks deliver other records; load each rank's own state (or "
                         "riffle.merge_states of them all)")


def merge_states(states: Sequence[dict]) -> dict:
    """Every rank's ``state_dict()`` of one step as one state, which any number of ranks and DataLoader workers
    resumes from. An order that is a function of position needs only one rank's state; a shared order's ranks read
    records their daemons chose, so a resume on another number of ranks needs them all."""
    states = list(states)
    if not states:
        raise ValueError("merge_states: no states")
    world = int(states[0].get("world", 1))
    ranks = {}
    for k, st in enumerate(states):
        if int(st.get("world", 1)) != world or st.get("seed") != states[0].get("seed"):
            raise ValueError(f"merge_states: state {k} is of another run (world {st.get('world')}, seed {st.get('seed')})")
        if "ranks" in st:
            ranks.update({int(r): v for r, v in st["ranks"].items()})
            continue
        r = int(st.get("rank", k))
        if r in ranks:
            raise ValueError(f"merge_states: rank {r}'s state given twice")
        ranks[r] = st
    if set(ranks) != set(range(world)):
        raise ValueError(f"merge_states: the states of ranks {sorted(ranks)}, of a world of {world}: give every rank's")
    # Every rank reads one mixture schedule only if every rank changed the weights at the same step: their histories
    # agree through the epoch the merged state resumes (a rank already in the next may have evaluated a schedule
    # function over it).
    first = min(int(st["epoch"]) for st in ranks.values())
    weights = {r: [seg for seg in st.get("mixture_weights") or [] if int(seg[0]) <= first] for r, st in ranks.items()}
    if len({json.dumps(w) for w in weights.values()}) > 1:
        raise ValueError("merge_states: the ranks' states hold other histories of the mixture's weights ("
                         + "; ".join(f"rank {r}: {w}" for r, w in sorted(weights.items())) + "): every rank must call "
                         "set_weights at the same step")
    out = {k: v for k, v in states[0].items() if k not in ("sampler_state", "skip", "delivered", "rest", "workers", "rank",
                                                          "num_workers", "next_worker")}
    out["ranks"] = {str(r): ranks[r] for r in sorted(ranks)}
    out["epoch"] = first
    return out


# What a state's place means beyond its numbers: the order's kind and how its places resume (the daemon's order
# reply), the parameters of a kind that change its order, and how a token corpus's samples are cut. A place (a
# position, a batch, a sampler state) of one is another sample, or none, of another: loaded, it would repeat some
# samples and drop as many, silently. The topology (ranks, DataLoader workers, batch size) is not here: a
# positional place resumes on any (elastic resume), and the others refuse another by name as they load.
_ORDER_PARAMS = {"block": ("block_size", "window"), "buffered": ("buffer",), "reservoir": ("reservoir",)}


def _ordering(order: dict, opts: dict, tokens: dict | None) -> dict:
    """What a state of this loader records of its order and samples (``ordering``), from its order reply, its
    options (by spec name) and, of a token corpus, the daemon's description of its samples."""
    out = {k: order[k] for k in ("kind", "positional", "shared")}
    out["rest"] = order.get("rest") or ""
    for k in _ORDER_PARAMS.get(order["kind"], ()):
        if opts.get(k) is not None:
            out[k] = int(opts[k])
    if tokens:
        out.update(seq_len=int(tokens["seq_len"]), packing=tokens["packing"])
        if tokens["packing"] == "best_fit":
            out["pack_window"] = int(opts.get("pack_window") or spec.OPTIONS["pack_window"][4])
    return out


# What of ``ordering`` says how samples are cut, not which order reads them.
_SAMPLE_KEYS = ("seq_len", "packing", "pack_window")


def _check_ordering(state: dict, mine: dict, adopts_order: bool = False) -> None:
    """Refuse a state whose place is in another order, or among samples cut otherwise, than this loader's: it would
    repeat and drop samples silently. A state saved before states recorded it (no ``ordering``) loads as before.
    adopts_order: this loader (sampler="auto") takes the state's order as its own, so only the samples must agree."""
    theirs = state.get("ordering")
    if not isinstance(theirs, dict):
        return
    keys = theirs.keys() & mine.keys()
    if adopts_order:
        keys &= set(_SAMPLE_KEYS)
    diff = sorted(k for k in keys if theirs[k] != mine[k])
    if not diff:
        return
    def say(o: dict) -> str:
        return ", ".join(f"{k}={o[k]!r}" for k in diff)
    raise ValueError(f"this state was saved by a loader whose order and samples are {say(theirs)}, and this loader's "
                     f"are {say(mine)}: its place would name other samples here, some repeated and some never read. "
                     "Resume with the options the state was saved with (seq_len, packing, pack_window, shuffle, "
                     "sampler and its sizes, share, opportunistic), or start the epoch anew without the state")


def _check_dataset(state: dict, version: str | None) -> None:
    """Refuse a state saved over other data: its place would name other records."""
    if state.get("dataset") and version and state["dataset"] != version:
        raise DataChanged("this state was saved for another dataset, or another version of its files (added, "
                          "removed or rewritten since): its place names records these files do not hold in that "
                          "order; resume with the data it was saved with, or start the epoch anew")


class _Taken:
    """What a loader of a shared order delivered of one epoch since its job opened, kept so that the job's state,
    which is the daemon's, outlives a daemon killed (share's RFBIT1): the state the job opened from, a bit a record
    delivered since, and the last batches' ids, to say the state after an earlier batch (a Batch's state asked
    late)."""

    RECENT = 256  # batches whose state can still be asked after later ones came

    MAGIC = b"RFBIT1\x00"

    def __init__(self, epoch: int, base: bytes | None):
        self.epoch, self.base = epoch, base
        self.bits = np.zeros(0, dtype=np.uint8)
        if base is not None and base.startswith(self.MAGIC):
            # Reopened from a state kept here (a daemon killed again): its
            # bits are ours, its base the base, so the state stays one set.
            head, rest = base[len(self.MAGIC):].split(b"\n", 1)
            n = int(head.split()[2])
            self.base, self.bits = rest[:n] or None, np.frombuffer(rest[n:], np.uint8).copy()
        self.count = 0  # batches kept
        self.recent: collections.deque[np.ndarray] = collections.deque(maxlen=self.RECENT)

    def add(self, ids: np.ndarray) -> None:
        if len(ids):
            need = (int(ids.max()) >> 3) + 1
            if need > len(self.bits):
                self.bits = np.concatenate([self.bits, np.zeros(max(need, 2 * len(self.bits)) - len(self.bits),
                                                                np.uint8)])
            np.bitwise_or.at(self.bits, ids >> 3, (1 << (ids & 7)).astype(np.uint8))
        self.count += 1
        self.recent.append(ids)

    def state(self, positions: int, n: int) -> bytes | None:
        """The state after the first n batches kept: b"" at the epoch's start, None if no longer known."""
        if self.base is None and n == 0 and not self.bits.any():
            return b""
        later = self.count - n
        if later > len(self.recent):
            return None
        bits = self.bits
        if later:
            bits = bits.copy()
            for ids in list(self.recent)[len(self.recent) - later:]:
                np.bitwise_and.at(bits, ids >> 3, ~(1 << (ids & 7)).astype(np.uint8))
        base = self.base or b""
        return self.MAGIC + b"%d %d %d\n" % (self.epoch, positions, len(base)) + base + bits.tobytes()
