"""A RiffleDataset's places: its state after each batch (per DataLoader worker), and a loaded state as the place
this run's ranks and workers resume from, on the topology that saved it or on another."""

from __future__ import annotations

from typing import Any

from .mixture import _mixture, _segments, _state_weights, _weights_state
from .options import _ORDER_KEYS
from .state import _POSITIONAL_KINDS, _check_dataset, _check_ordering, _check_rank, _own, _parts, _rest, _rest_places, merge_states


def _at_start(state: dict) -> bool:
    """Whether a loaded place (this dataset's form of a state) is its epoch's start, nothing of the epoch delivered
    by this rank (or, of every rank's states merged, by any rank)."""
    if (int(state.get("batch", 0) or 0) or state.get("start") or state.get("position") or state.get("sampler_state")
            or state.get("skip") or state.get("rest") or state.get("delivered")):
        return False
    ranks = (state.get("ranks") or {}).values()
    return all(int(st["epoch"]) == int(state["epoch"]) and _at_start(st) for st in ranks)


def _position(state: dict, glob: int) -> int:
    """A state's place as a position of its epoch's order: its own, or, of an order whose places are not positions,
    its batches of ``glob`` (world_size x batch_size) samples after the epoch's start."""
    if state.get("position") is not None:
        return int(state["position"])
    return int(state.get("start", 0) or 0) + int(state.get("batch", 0) or 0) * glob


class _Places:
    """RiffleDataset's state methods (a mixin: they read the dataset's options, order, epoch and workers)."""

    def state_dict(self, all_ranks: bool = False) -> dict[str, Any]:
        """The place after the last batch delivered: per worker with DataLoader workers.

        A shared order (``share=True``) under DDP reads on each rank the records its daemon chose, so one rank's
        state resumes only that rank. ``all_ranks=True`` gathers every rank's through torch.distributed (a
        collective: call it on every rank) into one state that any number of ranks and workers resumes from;
        ``riffle.merge_states`` does the same for states saved rank by rank.
        """
        st = self._state_dict()
        if all_ranks and self._where()[1] > 1:
            import torch.distributed as dist
            states: list = [None] * self._where()[1]
            dist.all_gather_object(states, st)
            st = merge_states(states)
        return st

    def _state_dict(self) -> dict[str, Any]:
        if self._workers:
            # A role that has delivered nothing this epoch is at its start.
            # DataLoader hands batches over in order, so what was delivered
            # is the rank's batches before `batch`: a place any number of
            # workers resumes from, for an order that is a function of
            # position.
            start = {"epoch": self.epoch, "batch": 0, "seed": self.seed}
            roles = {str(w): dict(self._states.get(w, start)) for w in range(self._workers)}
            place = dict(self._place or {"epoch": self.epoch, "batch": 0,
                                         "position": 0 if self._order["positional"] else None})
            # The epoch is over once every role is past it.
            first = min(int(st["epoch"]) for st in roles.values())
            if first > place["epoch"]:
                place = {"epoch": first, "batch": 0, "position": 0}
            out = {"epoch": place["epoch"], "batch": place["batch"], "seed": self.seed, "num_workers": self._workers,
                   "next_worker": self._next if place["batch"] else 0, "workers": roles, "world": self._where()[1],
                   "dataset": self._dataset_version}
            if place.get("position") is not None:
                out["position"] = place["position"]  # the rank's place, in positions of the epoch: any topology resumes it
            if _parts(self._order):
                out["rank"] = self._where()[0]  # whose part: merge_states puts every rank's together
                if not self._order["shared"]:
                    out.update(batch_size=self.batch_size, window=int(self.loader_kwargs["opportunistic"]))
            return self._with_weights(out)
        if self._resume is not None:
            # Loaded, not iterated yet: the loaded place, as the loader that resumes from it says it.
            return self._with_weights(self._loader().state_dict())
        if self._ld is not None:
            return self._with_weights(self._ld.state_dict())
        return self._with_weights({"epoch": self.epoch, "batch": 0, "seed": self.seed})

    def _with_weights(self, state: dict) -> dict:
        """state with the mixture's weights, if the dataset is one, the order sampler="auto" chose, and what its
        order and samples are (Loader.ordering)."""
        state["ordering"] = dict(self._ordering)
        if self._auto_order is not None:
            state["order"] = dict(self._auto_order)
        mix = self.loader_kwargs.get("mixture")
        if mix is not None and callable(self.loader_kwargs.get("mixture_schedule")):
            # A schedule function's changes through the state's epoch, as this dataset's loaders evaluate them.
            ld = self._new_loader(self.seed, self.loader_kwargs)
            try:
                ld._follow(int(state["epoch"]))
                state["mixture_weights"] = _weights_state(ld._weights)
                state["mixture_function"] = {"batch": ld._fn_batch, "through": ld._fn_through}
            finally:
                ld.close()
        elif mix is not None:
            segs = _segments(_mixture(mix, prefixes=True), self.loader_kwargs.get("mixture_history"),
                             self.loader_kwargs.get("mixture_schedule"), self.batch_size * self._where()[1])
            state["mixture_weights"] = _weights_state(segs)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at a place state_dict() returned: the next iteration continues there."""
        if state.get("seed", self.seed) != self.seed:
            if not self._seed_drawn:
                raise ValueError(f"state was saved with seed {state['seed']}, this dataset has seed {self.seed}")
            self.seed = int(state["seed"])  # a drawn seed follows the checkpoint
        if not self.loader_kwargs.get("refresh"):
            _check_dataset(state, self._dataset_version)
        # The order auto chose for the run that saved this, not another
        # choice on another measure of the device.
        order = state.get("order")
        if order and self._auto_order is None:
            mine = {k: self.loader_kwargs.get(k) for k in _ORDER_KEYS if self.loader_kwargs.get(k)}
            if mine != order:
                raise ValueError(f"this state was saved by a run whose sampler='auto' chose {order}; this "
                                 f"one reads {mine or 'the global order'}: give it sampler='auto' or that order")
        _check_ordering(state, self._ordering, adopts_order=bool(order) and self._auto_order is not None)
        if order and self._auto_order is not None:
            self._auto_order = dict(order)
            self.loader_kwargs["auto_order"] = self._auto_order
        if state.get("mixture_weights") and self.loader_kwargs.get("mixture") is not None:
            self._set_segments(_state_weights(state, len(self.loader_kwargs["mixture"])))
            if callable(self.loader_kwargs.get("mixture_schedule")):
                self._fn_state = dict(state, mixture_weights=_weights_state(_state_weights(
                    state, len(self.loader_kwargs["mixture"]))))
        rank, world = self._where()
        if _parts(self._order):
            state = _own(state, world, rank, self._workers)
        if _parts(self._order) and _rest(state, world, self._workers):
            # A shared order on another topology (ranks, workers), or the
            # rest of an epoch already: every role reads its part of the
            # rest, without the records the places of the run before
            # delivered.
            epoch, places = _rest_places(state, world, rank, self.rank_drop_last, self._order["shared"])
            state = {"epoch": epoch, "batch": 0, "seed": state.get("seed", self.seed), "world": world}
            if places:
                state.update(rest=places, rank=rank)
        elif _parts(self._order):
            _check_rank(state, rank)  # the same topology: each rank's own place
        elif "position" in state and self._order["positional"]:
            state = self._placed(state)
        elif int(state.get("world", self._where()[1])) != self._where()[1]:
            raise ValueError(f"this state was saved on {state['world']} ranks and this run has {self._where()[1]}: its "
                             "order (shared, or opportunistic) resumes only on as many; an order that is a function of position "
                             f"({_POSITIONAL_KINDS}) resumes on any number")
        if "workers" in state and int(state.get("num_workers", 0)) != max(1, self._workers):
            state = self._merged(state)
        self._epoch.value = int(state["epoch"])
        self._explicit = True
        self._resume = dict(state)
        self._over = None
        self._ld = None  # a loader of another seed, or place, is not this one
        self._place = None
        if "workers" in state:
            self._states = {int(w): dict(st) for w, st in state["workers"].items()}
            # DataLoader asks worker 0 first: give worker 0 the role whose batch is next.
            self._shift.value = int(state.get("next_worker", 0))
            self._place = {"epoch": int(state["epoch"]), "batch": int(state.get("batch", 0))}
        else:
            # One place for the rank: every role starts from it, and worker
            # 0 plays the role of its batch.
            self._states = {w: dict(state) for w in range(self._workers)}
            self._shift.value = int(state.get("batch", 0)) % max(1, self._workers)
            self._place = {"epoch": int(state["epoch"]), "batch": int(state.get("batch", 0)), "position": state.get("position")}
        self._next = self._shift.value

    def _placed(self, state: dict[str, Any]) -> dict[str, Any]:
        """A state's position as this rank's place: any number of ranks and workers resumes it.

        After b batches of each of W ranks, the ranks together have taken
        the order's first W*b*batch_size positions. A position on a boundary
        of this run's global batches (world_size x batch_size) is the batch
        an uninterrupted run of this topology would be at; any other starts
        the rest of the epoch from there, split over this run's ranks, and
        the epochs after it are this topology's own.
        """
        pos, glob = int(state["position"]), self._where()[1] * self.batch_size
        place = {"epoch": int(state["epoch"]), "seed": state.get("seed", self.seed), "position": pos}
        if pos % glob == 0:
            place["batch"] = pos // glob
        else:
            place.update(batch=0, start=pos)
        return place

    def _merged(self, state: dict[str, Any]) -> dict[str, Any]:
        """A state saved with other workers, as the rank's one place: for orders that are functions of position."""
        stream = any(st.get("sampler_state") or st.get("skip") for st in state["workers"].values())
        kw = self.loader_kwargs
        if stream or not self._order["positional"]:
            raise ValueError(
                f"this state was saved with {state.get('num_workers')} DataLoader workers, and this loader's order "
                "(shared, or opportunistic) resumes only with as many; an order that is a function of position "
                f"({_POSITIONAL_KINDS}) resumes with any number")
        if "batch" not in state:
            raise ValueError("this state was saved by an older riffle with DataLoader workers: resume with as many")
        epoch, batch = int(state["epoch"]), int(state["batch"])
        # The place after an epoch's last batch is the next epoch's start.
        probe = self._new_loader(int(state.get("seed", self.seed)), kw)
        if batch >= len(probe):
            epoch, batch = epoch + 1, 0
        return {"epoch": epoch, "batch": batch, "seed": state.get("seed", self.seed)}

    def _record(self, worker: int, state: dict, epoch: int, index: int, start: int = 0, last: bool = False) -> None:
        """Batch ``index`` of ``epoch`` from ``worker`` reached the user: its role's place is after it."""
        role = (worker + self._shift.value) % max(1, self._workers)
        self._states[role] = state
        self._next = (role + 1) % max(1, self._workers)
        # DataLoader hands batches over in order, so the rank's place is
        # after this batch: every rank's first index+1 batches, which are
        # the order's first (index+1) x world x batch_size positions after
        # the epoch's start (not 0 in the rest of an epoch resumed on
        # another topology). That start is the batch's job's: the state
        # after a role's last batch is the next epoch's, which has none.
        pos = None
        if self._order["positional"] and isinstance(state, dict):
            pos = start + (index + 1) * self._where()[1] * self.batch_size
        self._place = {"epoch": epoch, "batch": index + 1, "position": pos}
        if last and pos is not None:
            # The rank's last batch of the epoch: its place is the next
            # epoch's start, though a role given no batch of a short rest
            # (fewer batches than workers) is still in this one.
            self._place = {"epoch": epoch + 1, "batch": 0, "position": 0}
