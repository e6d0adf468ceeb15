"""Where this process sits in the run: rank, world size and how to rendezvous.

Launchers describe a rank with the usual environment (``RANK``, ``LOCAL_RANK``,
``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``; torchrun adds ``MASTER_ADDR``/``MASTER_PORT``). Without
it the process is a world of one that still forms a real process group, so there is a single
code path.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

import torch
import torch.distributed as dist

from ddptui.rank.net import free_port

T = TypeVar("T")


@dataclass(frozen=True)
class DistContext:
    """This process's place in the process group."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    init_method: str
    launched: bool
    """True when a launcher set ``RANK``/``WORLD_SIZE``; False for a plain standalone run."""

    @property
    def is_main(self) -> bool:
        """Global rank 0: the rank that prints, downloads and saves."""
        return self.rank == 0


def context_from_env(
    init_method: str | None = None, environ: Mapping[str, str] | None = None
) -> DistContext:
    """Read the launcher's environment; ``init_method`` (``--init-method``) wins if given.

    Under a launcher without ``--init-method`` (torchrun) the rendezvous is ``env://``;
    standalone it is a free port on 127.0.0.1.
    """
    env = os.environ if environ is None else environ
    launched = "RANK" in env and "WORLD_SIZE" in env
    if launched:
        rank, world_size = int(env["RANK"]), int(env["WORLD_SIZE"])
        local_rank = int(env.get("LOCAL_RANK", rank))
        local_world_size = int(env.get("LOCAL_WORLD_SIZE", world_size))
        default_init = "env://"
    else:
        rank, world_size, local_rank, local_world_size = 0, 1, 0, 1
        default_init = None
    if not 0 <= rank < world_size:
        raise ValueError(f"RANK={rank} is outside WORLD_SIZE={world_size}")
    if not 0 <= local_rank < local_world_size:
        raise ValueError(f"LOCAL_RANK={local_rank} is outside LOCAL_WORLD_SIZE={local_world_size}")
    init = init_method or default_init or f"tcp://127.0.0.1:{free_port()}"
    return DistContext(rank, local_rank, world_size, local_world_size, init, launched)


def shard_indices(size: int, rank: int, world_size: int) -> range:
    """Rank ``rank``'s share of ``range(size)`` for evaluation: ``rank, rank+W, rank+2W, ...``.

    Unlike ``DistributedSampler`` there is no padding: over all ranks every index appears
    exactly once, and a rank may get nothing when ``size < world_size``.
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside world size {world_size}")
    return range(rank, size, world_size)


def rank_zero_first(prepare: Callable[[], T], ctx: DistContext, device: torch.device) -> T | None:
    """Run ``prepare`` (a download, say) on global rank 0 only, then let every rank continue.

    A failure on rank 0 is re-raised there and reported to the other ranks as a
    RuntimeError, instead of leaving them waiting at a barrier. Returns rank 0's result on
    rank 0 and None elsewhere.
    """
    result: T | None = None
    error: BaseException | None = None
    if ctx.is_main:
        try:
            result = prepare()
        except Exception as exc:  # reported to every rank below
            error = exc
    if ctx.world_size > 1:
        failed = torch.tensor([1.0 if error is not None else 0.0], device=device)
        dist.broadcast(failed, src=0)
        if failed.item() and error is None:
            raise RuntimeError("rank 0 failed to prepare the dataset (see rank 0's log)")
    if error is not None:
        raise error
    return result
