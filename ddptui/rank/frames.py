"""Where a Python thread is: its frames, the user's innermost frame, and whether it waits in a
collective. Pure and stdlib-only: the rank's heartbeat (live frames) and ddptui's hang
diagnosis (faulthandler dumps) read stacks with the same rules."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple


class Frame(NamedTuple):
    file: str
    line: int
    func: str

    @property
    def place(self) -> str:
        return f"{self.file.rsplit('/', 1)[-1]}:{self.line}"

    @property
    def short(self) -> str:
        return f"{self.func} ({self.place})"


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


#: DDP's own functions that communicate nothing themselves: the forward's plumbing around the
#: wrapped module's call (the buffer broadcast, the bucket rebuild and the join are elsewhere,
#: or run in C++ beneath ``_pre_forward``). Innermost, one says the rank is in a forward.
_DDP_PLUMBING = frozenset(
    {
        "forward",
        "_run_ddp_forward",
        "_post_forward",
        "_inside_ddp_forward",
        "_get_active_ddp_module",
        "_lazy_init",
        "_clear_grad_buffer",
        "_check_sync_bufs_pre_fwd",
        "_check_sync_bufs_post_fwd",
        "will_sync_module_buffers",
        "train",
        "to_kwargs",
        "scatter",
        "gather",
    }
)
#: DDP's functions that issue collectives of their own outside its reducer, by what they are
#: for (the broadcast helper beneath them, ``_distributed_broadcast_coalesced``, says nothing
#: of it): the buffers' broadcast before each forward, where a rank waits for a slower peer,
#: and the constructor's.
DDP_PURPOSES = {
    "_sync_buffers": "DDP buffers",
    "_sync_module_buffers": "DDP buffers",
    "_sync_module_states": "DDP setup",
    "_sync_params_and_buffers": "DDP setup",
    "_verify_param_shape_across_processes": "DDP setup",
}
#: DDP's functions that wait in C++ beneath them, innermost on a stack or in a recorded one, by
#: what they wait for: ``_pre_forward`` rebuilds the gradient buckets once, at the second
#: forward, broadcasting their order from rank 0 (hifi-gan's rank 1 waiting there while rank 0
#: validated read "in DDP _pre_forward").
DDP_NATIVE = {"_pre_forward": "DDP bucket rebuild"}
#: The file of DDP's Python code (its frames, on a stack or in a trace).
DDP_FILE = "torch/nn/parallel/distributed.py"
#: Code a collective's call passes through between its Python function and the wait (the
#: dispatcher of torch's functional collectives): skipped, as if not there.
_PASS_THROUGH = ("/torch/_ops.py",)
#: The function of ddptui's that stands for ``Work.wait`` (an async collective's wait, called by
#: the script: ``dist.all_reduce(t, async_op=True).wait()``), and its file: a frame of it,
#: innermost, is a wait in that collective (the wait itself is C++, no frame of its own).
ASYNC_WAIT = "async_collective_wait"
_ASYNC_WAIT_FILE = "/ddptui/rank/instrument.py"
#: What such a wait is called where no frame of torch's beneath it names its collective.
ASYNC_WAIT_LABEL = "an async collective's wait()"
#: Python's import machinery: a thread with its frames inside is importing a module (whose
#: top-level code may call helpers of torch.distributed), not waiting.
_IMPORTING = "<frozen importlib"
#: torch.compile's frame conversion (Dynamo's ``_compile``): its functions are on a stack only
#: while a frame is traced and compiled (a compiled frame run again passes through
#: ``eval_frame.py`` alone); its ``<module>`` is ``import torch._dynamo``, which a rank's first
#: optimizer does (torch's ``_disable_dynamo``), compiling nothing.
_COMPILING = "/torch/_dynamo/convert_frame.py"


def _collective(frame: Frame, path: str, ddp: bool = True) -> str | None:
    """The collective a frame of torch waits in, or None (any other frame). ``ddp`` False:
    the process holds no DDP module, so that its backward waits for no gradient all-reduce."""
    if "/torch/" not in path:
        return None
    if "/torch/distributed/" in path:
        return frame.func
    if path.endswith(DDP_FILE):
        if frame.func in DDP_NATIVE:
            return f"{DDP_NATIVE[frame.func]} broadcast"
        return None if frame.func in _DDP_PLUMBING else f"DDP {frame.func}"
    if "/torch/autograd/" in path and frame.func in ("_engine_run_backward", "backward"):
        return "DDP gradient all-reduce, in backward" if ddp else None
    if _COLLECTIVE_FUNC.search(frame.func):
        return frame.func
    return None


#: A traceback's frame line (``  File "/path/x.py", line 3, in f``): its file.
_TRACEBACK_FILE = re.compile(r'^\s*File "([^"]*)"', re.MULTILINE)


def traceback_files(text: str) -> list[str]:
    """The files of a formatted traceback's frames, outermost first, with ``/`` separators."""
    return [name.replace("\\", "/") for name in _TRACEBACK_FILE.findall(text)]


#: Where an installed module's path begins: after the last of these parts (the standard
#: library's ``lib/pythonX.Y/``, the packages' folders inside it or elsewhere).
_INSTALLED = re.compile(r"/lib/python3[^/]*/")
_PACKAGES = ("/site-packages/", "/dist-packages/")


def imported(frames: list[Frame] | tuple[Frame, ...]) -> str | None:
    """The module a thread is importing (frames innermost first, up to the code that
    imports), or None: not importing, or not yet in a module's code (a slow filesystem
    searched). The outermost module run by the outermost import, by its dotted name
    (``pandas``; ``torch.utils.tensorboard`` imported late, once torch is loaded): a rank is
    seen in ``__init__.py`` of some package of ``torch`` or ``pandas`` for seconds at its
    start, and ``<module> (__init__.py:15)`` named neither."""
    imports = [i for i, f in enumerate(frames) if f.file.startswith(_IMPORTING)]
    if not imports:
        return None
    module = next(
        (
            f
            for f in reversed(frames[: imports[-1]])
            if f.func == "<module>" and not f.file.startswith("<")
        ),
        None,
    )
    if module is None:
        return None
    path = module.file.replace("\\", "/")
    starts = [m.end() for m in _INSTALLED.finditer(path)] + [
        path.rfind(part) + len(part) for part in _PACKAGES if part in path
    ]
    # elsewhere (a source checkout of torch): the module's own name, its package's for a
    # package's ``__init__.py``
    rest = path[max(starts) :] if starts else "/".join(path.rsplit("/", 2)[-2:])
    if not starts and not rest.endswith("/__init__.py"):
        rest = rest.rsplit("/", 1)[-1]
    rest = rest.removesuffix(".py").removesuffix("/__init__")
    return rest.replace("/", ".") or None


def ddp_purpose(funcs: Iterable[str]) -> str | None:
    """What a collective issued by DDP itself is for (:data:`DDP_PURPOSES`), from the names
    of the functions on its stack, innermost first; None: none of those."""
    return next((DDP_PURPOSES[f] for f in funcs if f in DDP_PURPOSES), None)


def classify(frames: list[Frame] | tuple[Frame, ...], ddp: bool = True) -> StackInfo:
    """Whether a thread (frames innermost first) sits in a collective, and where the user's
    code is.

    The innermost frame decides, up to the first frame of the script: a frame of
    ``torch/distributed/``, DDP's own that communicates (buffer broadcast, bucket rebuild),
    autograd's backward (where DDP waits for the gradient all-reduce) or a function named
    like a collective (``all_reduce``, ``barrier``, ``broadcast``, ``wait``…) in torch means a
    collective. Any other frame inside those is work they called: the model's layers, a
    hook (ddptui's own too), the standard library; there the rank is not waiting, whatever
    called it (a DDP forward around a model of torch's layers, a checkpoint written by
    ``torch.distributed.checkpoint``).

    ``ddp`` False says the process holds no DDP module: its backward is its own work, not a
    wait for the gradient all-reduce (pytorch/examples' ImageNet script on the CPU makes no
    DDP module, and its ranks in ``backward()`` read "DDP gradient all-reduce").
    """
    if not frames:
        return StackInfo(False, None, "no Python stack")
    user = next((f for f in frames if not is_library(f.file)), None)
    # without a frame of the script (torch still importing, say): the innermost real file
    shown = user or next((f for f in frames if not f.file.startswith("<")), frames[0])
    where = shown.short
    inner = frames[: frames.index(user)] if user is not None else frames
    if any(f.func != "<module>" and f.file.replace("\\", "/").endswith(_COMPILING) for f in inner):
        # torch.compile at work: seconds to minutes in its first forward, where the stack's
        # frame of the script (and the modules compiling imports) said nothing of it
        where = "torch.compile" + (f" ({user.place})" if user else "")
        return StackInfo(False, None, where, tuple(frames))
    if any(f.file.startswith(_IMPORTING) for f in inner):  # a module being imported
        module = imported(inner)
        if module is not None:
            where = f"import {module}" + (f" ({user.place})" if user else "")
        return StackInfo(False, None, where, tuple(frames))
    for i, frame in enumerate(inner):
        path = frame.file.replace("\\", "/")
        if frame.func == ASYNC_WAIT and path.endswith(_ASYNC_WAIT_FILE):
            # torch's code that called it (ZeroRedundancyOptimizer's) names the collective;
            # called by the script, the wait is what there is to say
            caller = inner[i + 1] if i + 1 < len(inner) else None
            named = caller and _collective(caller, caller.file.replace("\\", "/"), ddp)
            return StackInfo(True, named or ASYNC_WAIT_LABEL, where, tuple(frames))
        collective = _collective(frame, path, ddp)
        if collective is not None:
            if path.endswith(DDP_FILE):  # ``DDP buffers broadcast``, not its helper's name
                ddp_funcs = (
                    f.func for f in inner[i:] if f.file.replace("\\", "/").endswith(DDP_FILE)
                )
                purpose = ddp_purpose(ddp_funcs)
                collective = f"{purpose} broadcast" if purpose else collective
            return StackInfo(True, collective, where, tuple(frames))
        if not path.endswith(_PASS_THROUGH):
            break  # work the rank does, not a wait
    return StackInfo(False, None, where, tuple(frames))
