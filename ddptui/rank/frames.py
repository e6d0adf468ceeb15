"""Where a Python thread is: its frames, the user's innermost frame, and whether it waits in a
collective. Pure and stdlib-only: the rank's heartbeat (live frames) and ddptui's hang
diagnosis (faulthandler dumps) read stacks with the same rules."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import NamedTuple


class Frame(NamedTuple):
    file: str
    line: int
    func: str

    @property
    def short(self) -> str:
        return f"{self.func} ({self.file.rsplit('/', 1)[-1]}:{self.line})"


@dataclass(frozen=True)
class StackInfo:
    """Where one rank's main thread is: in a collective (and which), or elsewhere."""

    in_collective: bool
    #: The collective (``all_reduce``, ``barrier``, ``DDP gradient all-reduce``…) or None.
    collective: str | None
    #: The innermost frame of the script (or, without one, the innermost frame).
    where: str
    frames: tuple[Frame, ...] = field(default=(), repr=False)


_COLLECTIVE_FUNC = re.compile(
    r"all_?reduce|barrier|broadcast|all_?gather|gather|scatter|reduce_?scatter|all_?to_?all"
    r"|^wait|_wait$|^recv|^send|isend|irecv|monitored_barrier|_sync_buffers|sync_module_states"
    r"|_verify_param_shape",
    re.I,
)
#: Path parts of code that is not the user's: torch, installed packages, the standard library.
_LIBRARY = ("/torch/", "/site-packages/", "/dist-packages/", "/lib/python3")
#: ddptui's own package, where this copy of it lives (its rank entry, hooks and heartbeat are
#: in every rank's stack). Its place, not a "/ddptui/" path part: a user's project in a
#: folder named ddptui (a clone of this repository, say) is the user's code.
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_OWN = tuple({os.path.join(_PACKAGE, ""), os.path.join(os.path.realpath(_PACKAGE), "")})


def is_library(file: str) -> bool:
    """torch, installed packages, the standard library, ddptui, and code without a file."""
    path = file.replace("\\", "/")
    return (
        path.startswith("<")
        or any(part in path for part in _LIBRARY)
        or any(file.startswith(own) for own in _OWN)
    )


def classify(frames: list[Frame] | tuple[Frame, ...]) -> StackInfo:
    """Whether a thread (frames innermost first) sits in a collective, and where the user's
    code is.

    Walks from the innermost frame outwards up to the first frame of the script: a frame of
    ``torch/distributed/``, DDP's own (buffer broadcast, bucket rebuild), autograd's backward
    (where DDP waits for the gradient all-reduce) or a function named like a collective
    (``all_reduce``, ``barrier``, ``broadcast``, ``wait``…) in torch means a collective.
    """
    if not frames:
        return StackInfo(False, None, "no Python stack")
    user = next((f for f in frames if not is_library(f.file)), None)
    # without a frame of the script (torch still importing, say): the innermost real file
    shown = user or next((f for f in frames if not f.file.startswith("<")), frames[0])
    where = shown.short
    for frame in frames:
        if frame is user:
            break
        path = frame.file.replace("\\", "/")
        if "/torch/" not in path:
            continue
        if "/torch/distributed/" in path:
            return StackInfo(True, frame.func, where, tuple(frames))
        if path.endswith("torch/nn/parallel/distributed.py"):
            return StackInfo(True, f"DDP {frame.func}", where, tuple(frames))
        if "/torch/autograd/" in path and frame.func in ("_engine_run_backward", "backward"):
            return StackInfo(True, "DDP gradient all-reduce, in backward", where, tuple(frames))
        if _COLLECTIVE_FUNC.search(frame.func):
            return StackInfo(True, frame.func, where, tuple(frames))
    return StackInfo(False, None, where, tuple(frames))
