"""Stop with a checkpoint: every rank agrees on the step to stop at.

ddptui asks the ranks to stop by sending :data:`ddptui.constants.STOP_SIGNAL` to each of
them; the signals land at different moments, and a rank that stopped alone would hang the
others in their next all-reduce. So the ranks vote: every :data:`VOTE_EVERY` steps each rank
starts an asynchronous all-reduce (MAX) of its "stop asked" flag on a separate gloo group, and
reads the result at the next vote, ``VOTE_EVERY`` steps later (long done by then: the read
does not wait). Every rank runs the same number of steps, so round ``k`` holds every rank's
flag as of step ``k``, and every rank learns the same answer at the same step: a stop takes
effect within ``2 * VOTE_EVERY`` steps.

The vote never touches the training's device or its process group: a one-element CPU tensor
on its own gloo group, in flight while the next step computes. Without a process group (one
rank) the flag is read directly.
"""

from __future__ import annotations

import signal
import threading

import torch
import torch.distributed as dist

from ddptui.constants import STOP_SIGNAL

_requested = threading.Event()
#: Steps between two votes (one vote per step cost ~1 ms of gloo traffic on a busy CPU).
VOTE_EVERY = 8


def _on_stop_signal(signum: int, frame: object) -> None:
    _requested.set()


def install_stop_handler() -> None:
    """Remember the stop signal instead of dying of it (main thread only)."""
    sig = getattr(signal, STOP_SIGNAL)
    if threading.current_thread() is threading.main_thread():
        signal.signal(sig, _on_stop_signal)


def stop_requested_here() -> bool:
    """Whether this rank was asked to stop (its own view, before the vote)."""
    return _requested.is_set()


class StopVote:
    """The per-step vote; :meth:`agreed` once per training step on every rank."""

    def __init__(self) -> None:
        self._distributed = dist.is_initialized() and dist.get_world_size() > 1
        self._group = (
            dist.new_group(backend="gloo", group_desc="stop_vote") if self._distributed else None
        )
        self._flag = torch.zeros(1)
        self._work = None
        self._steps = 0

    def agreed(self) -> bool:
        """Call after every step: whether the ranks agreed to stop after this one."""
        if not self._distributed:
            return _requested.is_set()
        self._steps += 1
        if self._steps % VOTE_EVERY:
            return False
        if self._work is not None:
            self._work.wait()  # started a step ago on the CPU: normally long done
            self._work = None
            if self._flag.item() > 0:
                return True
        self._flag = torch.tensor([1.0 if _requested.is_set() else 0.0])
        self._work = dist.all_reduce(
            self._flag, op=dist.ReduceOp.MAX, group=self._group, async_op=True
        )
        return False

    def close(self) -> None:
        """Finish the round in flight (before the process group goes)."""
        if self._work is not None:
            self._work.wait()
            self._work = None
