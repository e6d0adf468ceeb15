"""The launcher-side child process: ``python -m ddptui.run.drivers spawn|torchrun …``.

It runs in its own session, starts the ranks as mp.spawn does (the standard library's spawn
context: the driver never imports torch) or with torch.distributed.run (torchrun), and on a
rank failure writes the first failing rank, its exit code and signal name to ``--result``
(JSON) before exiting 1.

It dies with ddptui, and its ranks die with it (see ``ddptui.rank.entry.die_with_parent``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from typing import Any

from ddptui.argv import add_target_arguments, split_passthrough, target_args
from ddptui.constants import LAUNCHERS, PARENT_PID_ENV
from ddptui.rank.cpus import threads_per_rank
from ddptui.rank.entry import die_with_parent, spawn_worker
from ddptui.rank.flight_recorder import SOCKET_DIR_ENV
from ddptui.rank.net import free_port
from ddptui.rank.quiet_import import import_quietly
from ddptui.run.prestart import PRESTARTED, PRESTARTED_NOTE
from ddptui.runfiles import write_json_atomic

if __name__ in ("__main__", "__mp_main__"):
    # First thing after these light imports, before torch: in the driver (its parent is
    # ddptui) and in each mp.spawn child, which imports this module as ``__mp_main__``
    # before it unpickles its function (and with it torch: seconds of start-up during which
    # the driver may die).
    die_with_parent()


def write_result(path: str | None, **result: object) -> None:
    if path:
        write_json_atomic(path, result)


def _parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(prog="ddptui-driver")
    parser.add_argument("kind", choices=LAUNCHERS)
    parser.add_argument("--nprocs", type=int, required=True)
    parser.add_argument("--run-dir")
    parser.add_argument("--result")
    # multi-node (torchrun's c10d rendezvous); absent: one node, --standalone
    parser.add_argument("--nnodes", type=int, default=1)
    parser.add_argument("--node-rank", type=int, default=0)
    parser.add_argument("--rdzv-endpoint")
    parser.add_argument("--rdzv-id")
    parser.add_argument("--rdzv-host", choices=("0", "1"), default="0")
    parser.add_argument("--local-addr")
    add_target_arguments(parser)
    own, rest = split_passthrough(argv)
    return parser.parse_args(own), rest


def run_spawn(opts: argparse.Namespace, args: list[str]) -> int:
    """mp.spawn's model with the standard library's spawn context: one fresh interpreter per
    rank, the first rank to fail ends the others. The driver itself never imports torch
    (seconds of CPU per run that only the ranks need)."""
    import multiprocessing
    from multiprocessing.connection import wait

    port = free_port()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    os.environ["OMP_NUM_THREADS"] = str(threads_per_rank(opts.nprocs))
    if opts.module and "--init-method" not in args:
        args = [*args, "--init-method", f"tcp://127.0.0.1:{port}"]
    context = multiprocessing.get_context("spawn")
    ranks = [
        context.Process(
            target=spawn_worker,
            args=(rank, opts.nprocs, opts.module, opts.script, args, opts.run_dir, opts.run_module),
            name=f"rank-{rank}",
        )
        for rank in range(opts.nprocs)
    ]
    failed: int | None = None
    try:
        for process in ranks:
            process.start()
        running = list(ranks)
        while running and failed is None:
            wait([p.sentinel for p in running], timeout=1.0)
            for process in list(running):
                if process.exitcode is None:
                    continue
                running.remove(process)
                if process.exitcode != 0 and failed is None:
                    failed = ranks.index(process)
        if failed is not None:
            _ask_survivors(ranks)
    finally:
        _end_ranks(ranks, grace=2.0)
    if failed is None:
        return 0
    code = ranks[failed].exitcode or 1
    write_result(
        opts.result,
        rank=failed,
        exit_code=code,
        signal=_signal_name(-code) if code < 0 else None,
        pid=ranks[failed].pid,
    )
    return 1


#: How long the ranks still running after a failure have to write their traces.
SURVIVOR_TRACE_S = 3.0


def _ask_survivors(ranks: list) -> None:
    """Before ending the ranks still running after one failed: ask each for its Flight
    Recorder trace (``fr-rank-N.json``). Where they were when a peer failed is what names
    a desync or the collective a killed rank left (a rank ended by SIGTERM inside a
    collective writes nothing itself). A no-op with the recorder off."""
    alive = [rank for rank, p in enumerate(ranks) if p.pid is not None and p.exitcode is None]
    _ask_ranks(alive)


def _ask_ranks(ranks: list[int] | None = None) -> None:
    """Ask ``ranks`` (None: every rank of this node with a trace socket) for their traces;
    a rank that has ended refuses at once."""
    directory = os.environ.get(SOCKET_DIR_ENV)
    if not directory:
        return
    if ranks is None:
        try:
            names = os.listdir(directory)
        except OSError:
            return
        ranks = [int(n[:-5]) for n in names if n.endswith(".sock") and n[:-5].isdigit()]
    if not ranks:
        return
    from ddptui.run.flight import request_traces  # only on this path: the driver stays light

    request_traces(directory, ranks, SURVIVOR_TRACE_S)


def _ask_before_stopping() -> None:
    """torchrun ends every rank of this node the moment it sees one has failed (its process
    context's poll records the failures, then closes the others): ask them for their traces
    first, as the spawn driver does. Only when a failure was recorded (a stop ddptui asked
    for, or a run that finished, closes without asking). torch's own class, wrapped in this
    process (the driver) only; the failures keep the order torch recorded them in."""
    try:
        from torch.distributed.elastic.multiprocessing.api import SubprocessContext
    except ImportError:  # pragma: no cover - another torch: the ranks' own traces only
        return
    close = getattr(SubprocessContext, "close", None)
    if close is None or getattr(close, "_ddptui_asks", False):
        return

    def asking_close(self: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(self, "_failures", None) and not getattr(self, "_ddptui_asked", False):
            self._ddptui_asked = True
            _ask_ranks()
        return close(self, *args, **kwargs)

    asking_close._ddptui_asks = True  # type: ignore[attr-defined]
    SubprocessContext.close = asking_close


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _end_ranks(ranks: list, grace: float) -> None:
    """SIGTERM every rank still running, SIGKILL the ones still there after ``grace``."""
    alive = [p for p in ranks if p.pid is not None and p.exitcode is None]
    for process in alive:
        process.terminate()
    deadline = time.monotonic() + grace
    for process in alive:
        process.join(max(0.0, deadline - time.monotonic()))
    for process in alive:
        if process.exitcode is None:
            process.kill()
            process.join(5.0)


def run_torchrun(opts: argparse.Namespace, args: list[str]) -> int:
    torchrun = import_quietly("torch.distributed.run")  # the prestarted driver has it already
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    target = ["-m", "ddptui.rank.entry"]
    target += ["--run-dir", opts.run_dir] if opts.run_dir else []
    target += target_args(opts.module, opts.script, opts.run_module)
    if opts.rdzv_endpoint:
        nodes = [
            "--nnodes",
            str(opts.nnodes),
            "--node-rank",
            str(opts.node_rank),
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            opts.rdzv_endpoint,
            "--rdzv-id",
            opts.rdzv_id or "ddptui",
            "--rdzv-conf",
            f"is_host={'true' if opts.rdzv_host == '1' else 'false'}",
        ]
        if opts.local_addr:
            nodes += ["--local-addr", opts.local_addr]
    else:
        nodes = ["--standalone", "--nnodes", "1"]
    # torchrun's own log directory (the ranks' error files, read when a rank fails): made
    # where torchrun makes it, and removed when the run ends, where torchrun leaves one in
    # /tmp for every launch (633 of them on a machine after a few days of runs).
    log_dir = tempfile.mkdtemp(prefix="torchelastic_")
    try:
        torchrun_args = torchrun.parse_args(
            [
                *nodes,
                "--log-dir",
                log_dir,
                "--nproc-per-node",
                str(opts.nprocs),
                "--max-restarts",
                "0",
                "--monitor-interval",
                "0.1",
                *target,
                "--",
                *args,
            ]
        )
        _ask_before_stopping()
        torchrun.run(torchrun_args)
    except ChildFailedError as exc:
        rank, failure = exc.get_first_failure()
        signal_name = failure.signal_name() if failure.exitcode < 0 else None
        message = failure.message if isinstance(failure.message, str) else None
        if message and message.startswith(("To enable traceback", "Signal ")):
            message = None
        write_result(
            opts.result,
            rank=rank,
            exit_code=failure.exitcode,
            signal=signal_name,
            pid=failure.pid,
            error=message,
        )
        return 1
    finally:
        shutil.rmtree(log_dir, ignore_errors=True)
    return 0


def prestarted() -> int:
    """``--prestarted`` (see :mod:`ddptui.run.prestart`): import torchrun's module while
    ddptui gets ready, then run the command line it sends on stdin, with its environment,
    logging to its log file. Ends at once when stdin closes without one."""
    try:
        import_quietly("torch.distributed.run")  # the seconds that overlap ddptui's start
    except Exception:
        pass  # run_torchrun imports it again; its error goes to the run's log then
    line = sys.stdin.buffer.readline()
    if not line.strip():
        return 0  # no run came (a usage error, or a headless run that is not torchrun)
    order = json.loads(line)
    log = os.open(order["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    me = os.environ.get(PARENT_PID_ENV, str(os.getpid()))  # die_with_parent set it: ours
    os.environ.clear()
    os.environ.update(order["env"])
    os.environ[PARENT_PID_ENV] = me  # the ranks follow this driver, not ddptui
    print(f"ddptui-driver: {PRESTARTED_NOTE}", flush=True)
    return main(list(order["argv"]))


def main(argv: list[str] | None = None) -> int:
    die_with_parent()  # ddptui gone → tear the run down (done already when run as a module)
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv == [PRESTARTED]:
        return prestarted()
    opts, args = _parse(argv)
    if opts.kind == "spawn":
        return run_spawn(opts, args)
    return run_torchrun(opts, args)


if __name__ == "__main__":
    sys.exit(main())
