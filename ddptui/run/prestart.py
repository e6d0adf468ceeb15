"""A torchrun driver started before ddptui has loaded the rest of itself.

``ddptui --no-ui --script train.py`` spends about 0.1 s importing its front end, checking the
options and binding its socket before it can start the driver, whose first act is to import
``torch.distributed.run`` (a second and more). Plain torchrun starts that import at once. So
the ``ddptui`` command (:mod:`ddptui.console`) starts the driver first, with
``--prestarted``: it imports torch while ddptui gets ready, then reads its command line, its
environment and its log's path as one JSON line on stdin (:func:`take`, from
``Launcher.start``). A run that never comes (a usage error, a wrong guess) closes stdin, or
ddptui's exit kills the driver; it dies with ddptui in any case (``die_with_parent``).

Only a first attempt of a torchrun launch on this host takes it; every other start is a plain
``Popen`` as before.
"""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys
from collections.abc import Sequence

from ddptui.constants import PARENT_PID_ENV, PRESTARTED_BY_ENV

#: The driver's one argument in this mode.
PRESTARTED = "--prestarted"
#: What such a driver writes first in the run's launcher.log.
PRESTARTED_NOTE = "started before ddptui had loaded: torch.distributed.run was imported meanwhile"
_LAUNCHER = "--launcher"
_NOT_A_RUN = ("-h", "--help", "--version", "--print-sbatch")

_driver: subprocess.Popen[bytes] | None = None


def wanted(argv: Sequence[str]) -> bool:
    """Whether ``ddptui ARGV`` is, by its words, a headless torchrun run: ``--no-ui`` with
    ``--launcher torchrun``, or with ``--script`` or ``--module`` and no launcher named
    (torchrun is the default for a script). A wrong guess costs an idle driver that is killed
    at exit."""
    own = list(argv[: list(argv).index("--")] if "--" in argv else argv)
    if not own or not own[0].startswith("-") or "--no-ui" not in own:
        return False  # a subcommand (monitor, bench, join…), or the dashboard
    if any(word in _NOT_A_RUN for word in own):
        return False
    launcher = None
    for i, word in enumerate(own):
        if word == _LAUNCHER and i + 1 < len(own):
            launcher = own[i + 1]
        elif word.startswith(_LAUNCHER + "="):
            launcher = word.partition("=")[2]
    if launcher is not None:
        return launcher.strip() == "torchrun"
    return any(
        word in ("--script", "--module") or word.startswith(("--script=", "--module="))
        for word in own
    )


def start(argv: Sequence[str]) -> None:
    """Start the driver now when :func:`wanted` says so (once per process)."""
    global _driver
    if _driver is not None or not wanted(argv):
        return
    env = dict(os.environ)
    env[PARENT_PID_ENV] = str(os.getpid())  # the driver dies with this process
    # Its environment (in /proc) stays this one, without the run's id: name it by ddptui's
    # pid instead, for whoever sweeps a run's processes by their environment.
    env[PRESTARTED_BY_ENV] = str(os.getpid())
    env["PYTHONUNBUFFERED"] = "1"
    try:
        _driver = subprocess.Popen(
            [sys.executable, "-m", "ddptui.run.drivers", PRESTARTED],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
    except OSError:
        _driver = None  # the run starts its driver the usual way
        return
    atexit.register(cancel)


def take(
    argv: Sequence[str], env: dict[str, str], log: os.PathLike | str
) -> subprocess.Popen | None:
    """Hand the prestarted driver its command line (``argv``: what follows
    ``python -m ddptui.run.drivers``), environment and log file; returns its process, or
    None when there is none (or it has died): start one the usual way then."""
    global _driver
    proc, _driver = _driver, None
    if proc is None:
        return None
    order = {"argv": list(argv), "env": dict(env), "log": os.fspath(log)}
    try:
        if proc.poll() is not None:
            raise OSError("the prestarted driver has ended")
        assert proc.stdin is not None
        proc.stdin.write(json.dumps(order).encode() + b"\n")
        proc.stdin.close()
    except (OSError, ValueError):
        _kill(proc)
        return None
    return proc


def cancel() -> None:
    """No run came for the prestarted driver: end it."""
    global _driver
    proc, _driver = _driver, None
    if proc is not None:
        _kill(proc)


def _kill(proc: subprocess.Popen) -> None:
    try:
        proc.kill()  # nothing under it yet: it was waiting for its command line
        proc.wait(5)
    except (OSError, subprocess.TimeoutExpired):
        pass
    try:
        if proc.stdin is not None:
            proc.stdin.close()
    except OSError:
        pass
