"""The world the launcher gave this rank, and whether the rank trains in one. Runs inside
training processes; stdlib only, and nothing of ddptui's that sends (the reporter asks here at
a rank's first step; :mod:`ddptui.rank.spawned` reads the launched world when a group forms).

A script decides for itself whether it forms a process group: opacus's
``examples/cifar10.py`` forms one only when given ``--local_rank`` (default -1), which
torchrun does not pass. Under torchrun each of 2 ranks trained the whole dataset alone, and
the run read "finished". A rank launched into a world of several that takes its first
training step with no process group (nor an RPC agent) says so: an ``alone`` note.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from ddptui.constants import SPAWNED_ENV

#: The world size the launcher gave this rank, read before its script ran (see
#: :func:`note_launch`); None: not read (a worker the script started, a test).
launched: str | None = None
#: Whether this rank said it took a training step with no process group (``alone``).
alone_said = False


def note_launch() -> None:
    """In a launched rank, before its script runs: the world size the launcher gave it. A
    script may write its own into the environment before it forms its group (the world it
    computed from Slurm's variables): read then, the launcher's world was gone."""
    global launched
    launched = os.environ.get("WORLD_SIZE")


def first_step(note: Callable[..., None]) -> None:
    """This rank's first training step: where the launcher gave it a world of several and it
    has no process group (nor an RPC agent), it trains by itself, and ``note`` says so
    (``alone``). Never raises."""
    global alone_said
    try:
        size = launched
        if os.environ.get(SPAWNED_ENV) or not (size and size.isascii() and size.isdigit()):
            return  # a script's own worker (ranked by its group), or no world known
        if int(size) < 2:
            return
        dist = sys.modules.get("torch.distributed")
        if dist is None or not dist.is_available():
            return
        if dist.is_initialized():
            if _accelerate_single():
                note("accelerate_alone")
            return
        rpc = sys.modules.get("torch.distributed.rpc")
        if rpc is not None and rpc.is_available() and rpc.api._is_current_rpc_agent_set():
            return  # an RPC world (a parameter server's optimizer steps): not alone
        note("alone")
        alone_said = True
    except Exception:  # telemetry never changes how a rank runs
        pass


def _accelerate_single() -> bool:
    """Whether HF accelerate, imported, runs this process as one of its own
    (``DistributedType.NO``, one process) though it formed the world's process group: where
    it finds no GPU and is not told to use the CPU, accelerate 1.15 under torchrun does so on
    every rank (lucidrains/denoising-diffusion-pytorch's ``Trainer``: no DDP module, no data
    sharded, every rank its own main process, sampling and saving)."""
    state = sys.modules.get("accelerate.state")
    shared = getattr(getattr(state, "PartialState", None), "_shared_state", None)
    if not isinstance(shared, dict):
        return False
    kind = shared.get("distributed_type")
    return shared.get("num_processes") == 1 and getattr(kind, "value", kind) == "NO"


def formed_after_alone() -> bool:
    """Whether this rank, forming its process group now, said before that it trained alone
    (then it is to take that back, once)."""
    global alone_said
    said, alone_said = alone_said, False
    return said
