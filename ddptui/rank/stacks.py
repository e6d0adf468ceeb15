"""Every rank's Python stacks on demand, without ptrace: asked over the rank's Flight
Recorder socket, else ``faulthandler`` on a signal.

The rank entry calls :func:`register_stack_dump` before the target runs: on
:data:`STACK_SIGNAL` the rank's C-level faulthandler writes the stacks of all its threads to
``RUN_DIR/stacks-rank-N.txt`` (appending), even while the main thread is blocked inside a
collective in C++. That handler reads the other threads' frames without the GIL, while one of
them may be running and changing them: in a CI run a rank ended by SIGSEGV with its dump cut
off in the middle of a frame of its ZeroMQ sender thread. So ddptui asks first over the
rank's trace socket (``stacks``), whose thread writes the same dump holding the GIL
(:func:`dump_now`), where no other thread runs Python; the signal is for a rank that does
not answer (no socket, or a thread stuck holding the GIL: then no other thread runs either).
ddptui calls :func:`capture_stacks` to ask every rank and read what each wrote. Stdlib only
on the rank side (psutil only in :func:`capture_stacks`).
"""

from __future__ import annotations

import faulthandler
import os
import re
import signal
import time
from collections.abc import Callable
from pathlib import Path

from ddptui.constants import RUN_ID_ENV
from ddptui.runfiles import RunDir

#: The signal a rank dumps its stacks on. SIGUSR2 rather than SIGUSR1, which job schedulers
#: (Slurm ``--signal``) and training frameworks often claim for checkpoint-and-requeue.
STACK_SIGNAL = signal.SIGUSR2
#: Most bytes kept of one rank's dump: its end, where faulthandler writes the main thread.
MAX_STACK_BYTES = 64 * 1024
#: Most bytes read of one dump (faulthandler's own limits, 100 threads of 100 frames, keep a
#: dump under about 2 MB).
READ_LIMIT = 4 * 1024 * 1024
#: Where a thread's part of a dump begins.
_THREAD_HEAD = re.compile(r"^(?:Current thread|Thread) 0x", re.M)
#: A dump that does not end as a whole one does (see :func:`whole_dump`) is taken once its
#: file stopped growing for this long. A rank descheduled for a moment in the middle of its
#: dump (two cores shared by a dozen processes) once had its main thread cut off by a shorter
#: wait, and a rank waiting in the gradient all-reduce was named as hung outside any.
SETTLE_S = 1.0
#: How a whole dump ends: faulthandler lists the main thread last, and its outermost frame is
#: the program's (``<module>``; runpy's ``_run_module_as_main`` under ``python -m``), or
#: ``...`` when it is over faulthandler's 100 frames.
_WHOLE_END = re.compile(
    r'(?:  File "[^\n]*", line \d+ in (?:<module>|_run_module_as_main)|  \.\.\.)\n\Z'
)

_dump_file = None  # kept open for faulthandler (it writes to the file descriptor)
#: The line before a dump that names the thread that trains, when it is not the main thread
#: (see :func:`ddptui.rank.heartbeat.steps_thread`; a dump on the signal has none).
STEPS_THREAD_MARK = "ddptui: the steps' thread "


def register_stack_dump(run_dir: str | os.PathLike[str], rank: int) -> Path | None:
    """Dump this process's stacks to ``RUN_DIR/stacks-rank-N.txt`` on :data:`STACK_SIGNAL`.

    The file exists from now on: it is how ddptui knows the signal is safe to send (without
    the handler, the signal would end the process). Returns its path, or None when it cannot
    be opened (then nothing is registered).
    """
    global _dump_file
    path = RunDir(run_dir).stacks(rank)
    try:
        dump = open(path, "a", encoding="utf-8")  # append: every dump lands at the end
        faulthandler.register(STACK_SIGNAL, file=dump, all_threads=True, chain=False)
    except (OSError, ValueError, RuntimeError):
        return None
    if _dump_file is not None and _dump_file is not dump:
        try:
            _dump_file.close()
        except OSError:
            pass
    _dump_file = dump
    return path


def dump_now() -> bool:
    """Append every thread's stack to the file :func:`register_stack_dump` opened, now, from
    the calling thread, which holds the GIL: no other thread runs Python (or changes its
    frames) while faulthandler reads them. False when there is no such file."""
    dump = _dump_file
    if dump is None:
        return False
    from ddptui.rank import heartbeat  # loaded with the rank entry

    try:
        trains = heartbeat.steps_thread()
        if trains is not None:  # which of the threads below trains (the main one otherwise)
            dump.write(f"{STEPS_THREAD_MARK}0x{trains:016x}\n")
            dump.flush()
        faulthandler.dump_traceback(file=dump, all_threads=True)
    except (OSError, ValueError, RuntimeError):
        return False
    return True


def _size(path: Path) -> int | None:
    try:
        return path.stat().st_size
    except OSError:
        return None


def _belongs(pid: int, run_id: str | None) -> bool:
    """Whether ``pid`` is a live process of run ``run_id`` (by its environment)."""
    if run_id is None:
        return True
    import psutil

    try:
        return psutil.Process(pid).environ().get(RUN_ID_ENV) == run_id
    except (psutil.Error, OSError):
        return False


def capture_stacks(
    pids_by_rank: dict[int, int],
    run_dir: str | os.PathLike[str],
    timeout: float = 5.0,
    run_id: str | None = None,
    ask: Callable[[list[int]], set[int]] | None = None,
) -> dict[int, str]:
    """Have every rank dump its stacks; return rank -> the text it wrote this time.

    Only ranks whose stacks file exists are asked (they registered the handler), and, with
    ``run_id``, only processes that carry this run's id. ``ask`` (ranks -> those that wrote
    their dump when asked over their trace socket; see :func:`dump_now`) goes first; the
    others are signalled. Waits at most ``timeout`` seconds in all after that; a rank that
    wrote nothing by then is left out.
    """
    files = RunDir(run_dir)
    found: dict[int, tuple[int, Path, int]] = {}
    for rank, pid in sorted(pids_by_rank.items()):
        path = files.stacks(rank)
        before = _size(path)
        if before is None or not isinstance(pid, int) or pid <= 0 or not _belongs(pid, run_id):
            continue
        found[rank] = (pid, path, before)
    answered = ask(sorted(found)) if ask is not None and found else set()
    asked: dict[int, tuple[Path, int]] = {}
    for rank, (pid, path, before) in found.items():
        if rank not in answered:
            try:
                os.kill(pid, STACK_SIGNAL)
            except (ProcessLookupError, PermissionError):
                continue
        asked[rank] = (path, before)
    stacks: dict[int, str] = {}
    deadline = time.monotonic() + timeout
    sizes: dict[int, tuple[int, float]] = {}
    while asked and time.monotonic() < deadline:
        now = time.monotonic()
        for rank, (path, before) in list(asked.items()):
            size = _size(path) or 0
            if size <= before:
                continue
            seen = sizes.get(rank)
            if seen is None or seen[0] != size:
                sizes[rank] = (size, now)
                if whole_dump(_tail(path, max(before, size - TAIL_BYTES))):
                    stacks[rank] = _read_from(path, before)
                    del asked[rank]
            elif now - seen[1] >= SETTLE_S:
                stacks[rank] = _read_from(path, before)
                del asked[rank]
        time.sleep(0.02)
    for rank, (path, before) in asked.items():  # grew but never settled: take what is there
        if (_size(path) or 0) > before:
            stacks[rank] = _read_from(path, before)
    return stacks


def whole_dump(text: str) -> bool:
    """Whether a faulthandler dump of all threads is whole: it ends with the main thread's
    outermost frame (see :data:`_WHOLE_END`)."""
    return _WHOLE_END.search(text) is not None


#: How much of a dump's end :func:`whole_dump` is asked about while it grows (its last line).
TAIL_BYTES = 8 * 1024


def _tail(path: Path, offset: int) -> str:
    """The file's text from ``offset`` to its end (at most :data:`TAIL_BYTES`)."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read(TAIL_BYTES).decode("utf-8", "replace")
    except OSError:
        return ""


def _read_from(path: Path, offset: int) -> str:
    """What was written from ``offset`` on; of a dump over :data:`MAX_STACK_BYTES` (a rank
    with dozens of threads), the threads that fit at its end, the main thread's last."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read(READ_LIMIT)
    except OSError:
        return ""
    text = data.decode("utf-8", "replace")
    if len(data) <= MAX_STACK_BYTES:
        return text
    tail = text[-MAX_STACK_BYTES:]
    head = _THREAD_HEAD.search(tail)
    return tail[head.start() :] if head else tail
