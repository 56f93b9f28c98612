"""riffle.torch's distributed helpers: this rank and world size, and rank 0's choices (a drawn seed, the order
sampler="auto" chose) agreed on every rank through torch.distributed."""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed

from .options import _ORDER_KEYS


def _dist() -> tuple[int, int]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def _draw_seed(world: int) -> int:
    """A seed from torch's default generator, as RandomSampler draws one, the same on every rank.

    ``torch.manual_seed`` then decides the data order, as it does for
    ``DataLoader(shuffle=True)``. Ranks must split one order, so with a
    process group rank 0's draw is broadcast to all (every rank builds its
    loader, as every rank builds its DistributedSampler). Without one there
    is no way to agree, and ranks that seeded torch differently would
    split different orders: a seed must then be given.
    """
    seed = int(torch.empty((), dtype=torch.int64).random_().item())
    return int(_rank0s(seed, world, "a drawn seed", "pass seed= (the same on every rank)"))


def _agree_order(auto: dict, world: int) -> dict:
    """The sampler, block_size and window sampler="auto" chose, rank 0's on every rank (as _draw_seed's seed)."""
    order = {k: auto[k] for k in _ORDER_KEYS if auto.get(k)}
    return dict(_rank0s(order, world, "rank 0's sampler='auto' choice", "name the sampler, block_size and window"))


def _rank0s(value: Any, world: int, what: str, instead: str) -> Any:
    """Rank 0's value on every rank, through the torch.distributed process group (with one rank, value)."""
    if world <= 1:
        return value
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        raise ValueError(f"riffle.torch: world_size is {world} but no torch.distributed process group is initialized "
                         f"to agree on {what}: {instead}, or build the loader after init_process_group")
    box = [value]
    torch.distributed.broadcast_object_list(box, src=0)
    return box[0]
