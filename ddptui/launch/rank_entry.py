"""What every rank runs first, under either launcher: output to ``rank-N.log``, die with the
parent, CPU threads per rank, then the target (a built-in trainer module or the user's script).

Used as the mp.spawn worker function (:func:`spawn_worker`) and as torchrun's module
(``python -m ddptui.launch.rank_entry``), so both launchers start ranks identically.
"""

from __future__ import annotations

import argparse
import atexit
import ctypes
import importlib
import os
import runpy
import signal
import sys
import traceback
from pathlib import Path

from ddptui.argv import split_passthrough
from ddptui.constants import THREADS_ENV
from ddptui.cpus import threads_per_rank
from ddptui.instrument import install_rank
from ddptui.rundir import RunDir

_PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Linux: get ``sig`` when the parent (spawn driver / torchrun agent) dies."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    except (OSError, AttributeError):  # pragma: no cover - not Linux
        pass


def prepare_rank(run_dir: str | None, rank: int, local_world_size: int) -> None:
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
    die_with_parent()
    threads = threads_per_rank(local_world_size)
    os.environ["OMP_NUM_THREADS"] = str(threads)
    os.environ[THREADS_ENV] = str(threads)
    if "torch" in sys.modules or importlib.util.find_spec("torch") is not None:
        import torch

        torch.set_num_threads(threads)
    install_rank(run_dir, rank)  # stack dump on a signal; zero-code hooks unless switched off


def run_target(module: str | None, script: str | None, args: list[str]) -> int:
    """Run a trainer module's ``main(args)`` or a script as ``__main__``; return its code."""
    try:
        if module:
            return int(importlib.import_module(module).main(args) or 0)
        assert script is not None
        sys.argv = [script, *args]
        sys.path.insert(0, str(Path(script).resolve().parent))
        runpy.run_path(script, run_name="__main__")
        return 0
    except SystemExit as exc:
        code = exc.code
        if code is None:
            return 0
        if isinstance(code, int):
            return code
        print(code, file=sys.stderr)
        return 1


def exit_after_success(code: int) -> None:
    """End a built-in trainer's rank that has finished its work, skipping native teardown.

    At interpreter exit a native thread (gloo, OpenMP) still joinable can abort the process
    ("terminate called without an active exception", SIGABRT) after the rank reported
    ``finished``, turning a good run into a failed one. Python's exit handlers still run (the
    reporter flushes its last events); then the process ends without native destructors.
    Only for the built-in trainers: a user's script keeps the ordinary exit.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    atexit._run_exitfuncs()
    os._exit(code)


def spawn_worker(
    local_rank: int,
    nprocs: int,
    module: str | None,
    script: str | None,
    args: list[str],
    run_dir: str | None,
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
    try:
        code = run_target(module, script, args)
    except BaseException:
        traceback.print_exc()  # into rank-N.log; mp.spawn only passes it to its parent
        raise
    if code:
        sys.exit(code)
    if module:
        exit_after_success(0)


def main(argv: list[str] | None = None) -> int:
    """torchrun entry: ``python -m ddptui.launch.rank_entry (--module M | --script S) -- …``."""
    parser = argparse.ArgumentParser(prog="ddptui-rank")
    parser.add_argument("--run-dir")
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--module")
    target.add_argument("--script")
    argv = list(sys.argv[1:] if argv is None else argv)
    own, rest = split_passthrough(argv)
    opts = parser.parse_args(own)
    rank = int(os.environ.get("RANK", "0"))
    prepare_rank(opts.run_dir, rank, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    try:
        code = run_target(opts.module, opts.script, rest)
    except BaseException:
        traceback.print_exc()
        raise
    if opts.module and code == 0:
        exit_after_success(0)
    return code


if __name__ == "__main__":
    sys.exit(main())
