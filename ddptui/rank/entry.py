"""What every rank runs first, under either launcher: output to ``rank-N.log``, die with the
parent, CPU threads per rank, then the target (a built-in trainer module or the user's script).

Used as the mp.spawn worker function (:func:`spawn_worker`) and as torchrun's module
(``python -m ddptui.rank.entry``), so both launchers start ranks identically.

It runs the target, so it is the one place that knows how a rank ended: an uncaught exception
or a non-zero exit is reported to ddptui as ``failed`` with the error and the traceback (torch's
spawn wrapper turns an exception into ``sys.exit(1)``, which an exit handler alone would take
for success).

No orphans: a rank (and the driver) must not outlive the process that started it, whatever
killed that one. :func:`die_with_parent` asks the kernel for a signal when the parent dies,
then checks the parent is still the one it was started by (it may have died before the
request), and starts a watchdog thread that ends the process if a handler ignores the signal.
"""

from __future__ import annotations

import _io
import argparse
import atexit
import ctypes
import gc
import importlib
import multiprocessing
import os
import runpy
import signal
import sys
import threading
import time
import traceback
from collections.abc import Mapping
from pathlib import Path

from ddptui.argv import add_target_arguments, split_passthrough
from ddptui.constants import (
    ATTEMPT_ENV,
    ENDPOINT_ENV,
    LOCAL_RANK_ARG_ENV,
    PARENT_PID_ENV,
    RESTART_COUNT_ENV,
    RUN_DIR_ENV,
    THREADS_ENV,
)
from ddptui.rank import flight_recorder, heartbeat, spawned, world
from ddptui.rank.cpus import threads_per_rank
from ddptui.rank.headroom import with_headroom
from ddptui.rank.instrument import install
from ddptui.rank.local_rank import watch as watch_local_rank_option
from ddptui.rank.quiet_import import import_quietly
from ddptui.runfiles import RunDir

_PR_SET_PDEATHSIG = 1
#: How often the watchdog looks whether the parent is still there.
WATCH_INTERVAL_S = 0.5
#: After signalling itself, how long the watchdog waits before it ends the process outright.
WATCH_GRACE_S = 2.0
_following_in: int | None = None  # the pid of the process that called die_with_parent


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """End this process (``sig``, then exit) when its parent dies. Call it first thing.

    ``DDPTUI_PARENT_PID`` names the parent this process was started by; when the parent is
    already gone (it died before the kernel request was made) the process exits at once.
    Then the variable is set to this process's pid, for the processes it starts, and a
    watchdog thread follows the parent. Without the variable (run by hand) only the kernel
    request is made. Once per process.
    """
    global _following_in
    me = os.getpid()
    if _following_in == me:
        return
    _following_in = me
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    except (OSError, AttributeError):  # pragma: no cover - not Linux
        pass
    expected = os.environ.get(PARENT_PID_ENV, "")
    parent = os.getppid()
    if expected.isdigit() and int(expected) != parent:
        os._exit(128 + int(sig))  # orphaned before the request: the signal will never come
    os.environ[PARENT_PID_ENV] = str(me)
    if expected.isdigit():
        threading.Thread(
            target=_watch_parent, args=(parent, sig), name="ddptui-parent-watch", daemon=True
        ).start()


def _watch_parent(parent: int, sig: int) -> None:
    """Backstop for the parent-death signal (a handler may catch it and carry on)."""
    while os.getppid() == parent:
        time.sleep(WATCH_INTERVAL_S)
    os.kill(os.getpid(), sig)
    time.sleep(WATCH_GRACE_S)
    os._exit(128 + int(sig))


def prepare_rank(run_dir: str | None, rank: int, local_world_size: int) -> None:
    die_with_parent()  # a no-op when the spawn start-up hook has done it already
    if run_dir:
        log = RunDir(run_dir).rank_log(rank)
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        sys.stdout.reconfigure(line_buffering=True)
        sys.stderr.reconfigure(line_buffering=True)
    announce()  # before anything slow: the rank is seen (pid, host) from its first second
    spawned.note_agent_store()  # torchrun's store, before the script sets MASTER_* its way
    world.note_launch()  # the launcher's world, before the script sets WORLD_SIZE its way
    if os.environ.get(ATTEMPT_ENV):
        # torchrun sets its own restart count (0: ddptui starts a new torchrun per attempt);
        # the script is told ddptui's attempt number under torchrun's name.
        os.environ[RESTART_COUNT_ENV] = os.environ[ATTEMPT_ENV]
    threads = threads_per_rank(local_world_size)
    os.environ["OMP_NUM_THREADS"] = str(threads)
    os.environ[THREADS_ENV] = str(threads)
    # torch loads here, before the script imports it, on purpose: torch takes the rank's
    # threads, and the Flight Recorder's terminate handler (below) needs the C++ runtime torch
    # brings (without it, an innocent rank that gloo aborts leaves no trace to name the
    # culprit with). A script that imports torch pays nothing more for it.
    # Loaded with the collector paused, and then frozen out of its sight (quiet_import).
    if "torch" in sys.modules or importlib.util.find_spec("torch") is not None:
        import_quietly("torch").set_num_threads(threads)
    install()  # the zero-code hooks, unless switched off
    # Its stacks on a signal or request; its trace on request and on gloo's abort.
    flight_recorder.serve_rank(run_dir, rank)
    if flight_recorder.recording():
        heartbeat.set_collectives_source(flight_recorder.progress)  # progress in every beat


def announce() -> None:
    """Tell ddptui this rank is alive (pid, host, local rank) and start its heartbeat, before
    the script's own code (and torch) loads; a no-op when nobody listens."""
    if not os.environ.get(ENDPOINT_ENV):
        return
    try:
        from ddptui.rank.reporter import get_reporter  # loaded on use: keeps the entry light

        reporter = get_reporter()
        reporter.started(guess_device=False)
        heartbeat.start(reporter)
    except Exception:  # pragma: no cover - telemetry never stops a rank from running
        pass


def _note(code: str, *, announce: bool = True, **numbers: int | bool | None) -> None:
    """Send a note of this rank's (a no-op when nobody listens); see ``Reporter.note``."""
    from ddptui.rank.reporter import get_reporter  # loaded on use: keeps the entry light

    get_reporter().note(code, announce=announce, **numbers)


def report_failure(error: str, trace: str | None) -> None:
    """Tell ddptui that this rank failed (once; a no-op when nobody listens), and leave its
    Flight Recorder trace in the run directory: after a crash it tells in which collective
    each rank was (a rank killed outright leaves none)."""
    run_dir = os.environ.get(RUN_DIR_ENV)
    if run_dir and flight_recorder.recording():
        try:
            flight_recorder.write_trace(run_dir, int(os.environ.get("RANK", "0")))
        except Exception:  # the trace is a bonus; the failure report is not
            pass
    try:
        # only a failing rank needs it here: the entry stays light (msgspec, the protocol)
        from ddptui.rank.reporter import get_reporter

        get_reporter().finished(error=error, traceback=trace)
    except Exception:  # pragma: no cover - telemetry never changes how a rank ends
        pass


def _exit_code(code: object) -> int:
    """The process exit code of ``return code`` / ``sys.exit(code)``, as Python computes it."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def local_rank_args(environ: Mapping[str, str] = os.environ) -> list[str]:
    """``[FLAG=LOCAL_RANK]`` where the run passes the local rank as an argument
    (:data:`LOCAL_RANK_ARG_ENV`, ``--local-rank-arg``), as ``torch.distributed.launch`` did;
    else (or without a ``LOCAL_RANK``) nothing."""
    flag, local_rank = environ.get(LOCAL_RANK_ARG_ENV), environ.get("LOCAL_RANK", "").strip()
    if not flag or not local_rank.isascii() or not local_rank.isdigit():
        return []
    return [f"{flag}={int(local_rank)}"]


@with_headroom  # the script's frames in one chunk of the frame stack, however deep
def run_target(
    module: str | None, script: str | None, args: list[str], run_module: str | None = None
) -> int:
    """Run a trainer module's ``main(args)``, the user's module as ``python -m`` runs it
    (``run_module``), or a script as ``__main__``; return its exit code.

    A non-zero exit and an uncaught exception are reported as this rank's failure (error and
    traceback); the exception propagates. A script or user module gets ``FLAG=LOCAL_RANK``
    before its arguments where ``--local-rank-arg`` asked for it (:func:`local_rank_args`).

    Its frame reserves room on the frame stack (:mod:`ddptui.rank.headroom`): the target's
    calls, at whatever depth, never map and unmap the stack's chunks as they go."""
    watched = None
    if not module:
        given = local_rank_args()
        args = [*given, *args]
        if not given and os.environ.get(ENDPOINT_ENV):  # its parser read, for a failure's hint
            watched = watch_local_rank_option(_note)
            heartbeat.set_before_beat(watched.settle)  # the script may set it itself

    def failed(error: str, trace: str | None) -> None:
        if watched is not None:  # the note as it stands now, before the failure it goes with
            watched.settle()
        report_failure(error, trace)

    try:
        if module:
            code = _exit_code(importlib.import_module(module).main(args))
        elif run_module:
            # As ``python -m``: the current directory first on sys.path, sys.argv[0] the
            # module's file (runpy sets it), the module (a package: its __main__) run as
            # __main__ with its package known, so that its relative imports work.
            sys.argv = [run_module, *args]
            if os.getcwd() not in sys.path[:1]:
                sys.path.insert(0, os.getcwd())
            runpy.run_module(run_module, run_name="__main__", alter_sys=True)
            code = 0
        else:
            assert script is not None
            sys.argv = [script, *args]
            sys.path.insert(0, str(Path(script).resolve().parent))
            runpy.run_path(script, run_name="__main__")
            code = 0
    except SystemExit as exc:
        code = _exit_code(exc.code)
        if code:
            detail = exc.code if isinstance(exc.code, str) else f"SystemExit: {exc.code}"
            failed(detail, traceback.format_exc())
        return code
    except BaseException as exc:
        failed(f"{type(exc).__name__}: {exc}", traceback.format_exc())
        raise
    finally:
        flight_recorder.remove_terminate_trace()  # native teardown aborts as it would
        if watched is not None:  # a last look, for another rank's failure to come
            watched.settle()
            watched.undo()
            heartbeat.set_before_beat(None)
    if code:
        failed(f"exited with code {code}", None)
    return code


def exit_after_success(code: int) -> None:
    """End a rank whose trainer or script has finished its work, skipping native teardown.

    At interpreter exit a native thread (gloo, c10d's store, OpenMP) still joinable can abort
    the process ("terminate called without an active exception", SIGABRT) after the rank
    reported ``finished``, turning a good run into a failed one; it was seen with user scripts
    under torchrun's c10d rendezvous too. Python's exit handlers still run (the reporter
    flushes its last events, a script's own ``atexit`` functions run), every file object still
    open is flushed, then the process ends without native destructors.
    """
    atexit._run_exitfuncs()
    gc.unfreeze()  # what the rank froze (torch's import, a script's gc.freeze) listed too
    for obj in gc.get_objects():  # what interpreter shutdown would have flushed
        # type(), not isinstance(): isinstance reads ``__class__``, which some objects compute
        # (torch's deprecated ``reduce_op`` warns when touched). The C base ``_io._IOBase``,
        # not the ABC ``io.IOBase``: shutdown flushes exactly its subclasses, and a plain
        # type's check is a walk of the mro where the ABC's missed its cache for each of a
        # torch process's thousands of types (0.3 s of CPU at every rank's exit).
        if issubclass(type(obj), _io._IOBase):
            try:
                if not obj.closed:
                    obj.flush()
            except Exception:  # a broken pipe, a file closed under us: nothing to keep
                pass
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def as_main_process() -> None:
    """Make the spawn launcher's rank, a child of the standard library's spawn, look to the
    script it runs as ``python script.py`` (or a torchrun rank) does.

    * No start method is set yet. The spawn child's bootstrap set spawn's: a script's own
      ``mp.set_start_method("spawn")`` raised "context has already been set"
      (harveyp123/Pytorch-DDP-Example's ``mnist_ddp.py``), and its processes and DataLoader
      workers were spawned where plain Python forks them (a script without a main guard
      failed at its first batch: its workers ran its top level again).
    * The process is ``MainProcess``, with no multiprocessing parent: scripts test
      ``mp.current_process().name == "MainProcess"`` or ``mp.parent_process() is None`` to
      know they are the program and not one of its workers (to run ``main()``, set up their
      logging, register signal handlers). The standard library has no setter for the parent:
      its module-level record is cleared (the rank's own parent watch reads ``getppid``).
    """
    multiprocessing.set_start_method(None, force=True)
    multiprocessing.current_process().name = "MainProcess"
    multiprocessing.process._parent_process = None  # what parent_process() returns


def spawn_worker(
    local_rank: int,
    nprocs: int,
    module: str | None,
    script: str | None,
    args: list[str],
    run_dir: str | None,
    run_module: str | None = None,
) -> None:
    """mp.spawn's function: one rank on this node (rank = local rank: a single node)."""
    os.environ.update(
        RANK=str(local_rank),
        LOCAL_RANK=str(local_rank),
        WORLD_SIZE=str(nprocs),
        LOCAL_WORLD_SIZE=str(nprocs),
        GROUP_RANK="0",
    )
    prepare_rank(run_dir, local_rank, nprocs)
    if module is None:
        as_main_process()
    try:
        code = run_target(module, script, args, run_module)
    except BaseException:
        traceback.print_exc()  # into rank-N.log
        sys.exit(1)  # the exit code tells the driver; the traceback is printed once
    if code:
        sys.exit(code)
    exit_after_success(0)


def main(argv: list[str] | None = None) -> int:
    """torchrun entry: ``python -m ddptui.rank.entry (--module M | --run-module M | --script S)
    -- …`` (:func:`ddptui.argv.target_args`)."""
    die_with_parent()  # before anything slow: the agent may already be going
    parser = argparse.ArgumentParser(prog="ddptui-rank")
    parser.add_argument("--run-dir")
    add_target_arguments(parser)
    argv = list(sys.argv[1:] if argv is None else argv)
    own, rest = split_passthrough(argv)
    opts = parser.parse_args(own)
    rank = int(os.environ.get("RANK", "0"))
    prepare_rank(opts.run_dir, rank, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    code = run_target(opts.module, opts.script, rest, opts.run_module)  # exceptions print
    if code == 0:
        exit_after_success(0)
    return code


if __name__ == "__main__":
    sys.exit(main())
