"""Room on the interpreter's frame stack for the script a rank runs, so that its calls never
pay for the stack's growing and shrinking.

CPython (3.11 on) keeps a thread's Python frames on a data stack made of chunks of 16 KiB,
each mapped from the system when a call needs one and unmapped as soon as the call that
opened it returns. Code that calls across a chunk's end again and again (an import of
hundreds of modules, each a few frames deeper than the last) maps, touches and unmaps a fresh
chunk at every crossing. Where the chunks end depends on how deep the calls started, so the
same script pays for it at one depth and not at another: ``import torch._dynamo`` (which
DDP's constructor does) took 0.86-0.87 s with about 24,000 page faults at most depths of
the caller, and up to 1.01 s with 42,700 at some (the sixty-fifth session). A rank under
ddptui runs its script a few frames deeper than ``python script.py`` does, and the hooks
on DDP's constructor add three more: on ``benchmarks/bench_startup.py``'s script that landed
on such a depth, 15,000 more page faults per rank and 0.08-0.1 s more to the first step.

:func:`with_headroom` gives a function's frame a large unused stack reservation: the chunk
opened for it is sized to hold that reservation and leaves as much again free after it, so
every frame called from it, to a depth of hundreds of kilobytes, stays in that one chunk.
The reservation is address space only (its pages are never touched); the chunk is 1 MiB, not
a size that a huge page would back.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TypeVar

F = TypeVar("F", bound=Callable[..., object])

#: The frame's stack reservation. CPython sizes a new chunk as the smallest power of two
#: (from 16 KiB) that holds the frame and a margin: for 512 KiB that is 1 MiB, and the other
#: half is free for the frames called from it.
RESERVED_BYTES = 512 * 1024
WORD = 8 if sys.maxsize > 2**32 else 4


def with_headroom(function: F) -> F:
    """``function`` itself, its code given :data:`RESERVED_BYTES` more of stack reservation
    (its behaviour, frames and tracebacks unchanged). Where the interpreter does not allow it,
    ``function`` as it was."""
    code = function.__code__
    try:
        function.__code__ = code.replace(co_stacksize=code.co_stacksize + RESERVED_BYTES // WORD)
    except (AttributeError, TypeError, ValueError):  # another interpreter: nothing to give
        pass
    return function
