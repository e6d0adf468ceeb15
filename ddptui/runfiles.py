"""The run directory's layout: its file names and paths, and the atomic JSON write.

The one place that names what a run directory holds::

    config.json           the validated run options
    events.jsonl          every event received, one JSON object per line
    summary.json          how the run ended (written at the end of every run)
    rank-N.log            rank N's stdout and stderr
    launcher.log          the launcher's own output
    launcher-result.json  the first failing rank, as the launcher driver saw it
    checkpoint.pt         global rank 0's checkpoint after every epoch
    stacks-rank-N.txt     rank N's Python stacks, dumped on ddptui's signal (hang diagnosis)
    join-token            node 0 of a multi-node run, while it runs: the join token (0600),
                          for ``ddptui join RUN_DIR`` where the directory is shared

Stdlib only and below every package: the ranks write their logs and stacks here, the
launcher driver its result; reading a run back is :mod:`ddptui.run.rundir`.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

EVENTS_FILE = "events.jsonl"
CONFIG_FILE = "config.json"
SUMMARY_FILE = "summary.json"
LAUNCHER_LOG = "launcher.log"
RESULT_FILE = "launcher-result.json"
CHECKPOINT_FILE = "checkpoint.pt"
JOIN_TOKEN_FILE = "join-token"

_RUN_FILE = re.compile(r"(rank-\d+\.log|stacks-rank-\d+\.txt|\..*\.tmp)")


def is_run_file_name(name: str) -> bool:
    """Whether ``name`` is one of the files a run directory holds (or a temp file of one)."""
    fixed = (
        EVENTS_FILE,
        CONFIG_FILE,
        SUMMARY_FILE,
        LAUNCHER_LOG,
        RESULT_FILE,
        CHECKPOINT_FILE,
        JOIN_TOKEN_FILE,
    )
    return name in fixed or _RUN_FILE.fullmatch(name) is not None


def rank_log_name(rank: int | None) -> str:
    """``rank-N.log`` for a rank; ``launcher.log`` when no rank is known."""
    return LAUNCHER_LOG if rank is None else f"rank-{rank}.log"


def stacks_name(rank: int) -> str:
    """``stacks-rank-N.txt``: where rank N dumps its Python stacks when ddptui asks."""
    return f"stacks-rank-{rank}.txt"


#: Rank N's Flight Recorder trace in the run directory: ``fr-rank-N.json``.
TRACE_PREFIX, TRACE_SUFFIX = "fr-rank-", ".json"


def trace_name(rank: int) -> str:
    """``fr-rank-N.json``: rank N's Flight Recorder trace in the run directory."""
    return f"{TRACE_PREFIX}{rank}{TRACE_SUFFIX}"


class RunDir:
    """Paths of one run directory (nothing is created until something is written)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    @property
    def events(self) -> Path:
        return self.path / EVENTS_FILE

    @property
    def config(self) -> Path:
        return self.path / CONFIG_FILE

    @property
    def summary(self) -> Path:
        return self.path / SUMMARY_FILE

    @property
    def launcher_log(self) -> Path:
        return self.path / LAUNCHER_LOG

    @property
    def result(self) -> Path:
        return self.path / RESULT_FILE

    @property
    def checkpoint(self) -> Path:
        return self.path / CHECKPOINT_FILE

    @property
    def join_token(self) -> Path:
        return self.path / JOIN_TOKEN_FILE

    def rank_log(self, rank: int | None) -> Path:
        return self.path / rank_log_name(rank)

    def stacks(self, rank: int) -> Path:
        return self.path / stacks_name(rank)

    def has_traces(self) -> bool:
        """Whether a rank's Flight Recorder trace (``fr-rank-N.json``) is here."""
        try:
            return any(self.path.glob(f"{TRACE_PREFIX}*{TRACE_SUFFIX}"))
        except OSError:
            return False

    def holds_run(self) -> bool:
        """Whether a run was started here (its events file exists; any path that cannot hold
        one, too long or unreadable, is no run)."""
        try:
            return os.path.lexists(self.events)
        except (OSError, ValueError):
            return False


def _write_replacing(path: str | os.PathLike[str], text: str, mode: int) -> None:
    """Write ``text`` to ``path`` through a new temp file (never one planted at its name),
    created with ``mode`` (less the umask), and ``os.replace``: a reader sees the old file
    or the new one, never half of one."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    if os.path.lexists(tmp):
        os.unlink(tmp)  # one left by an earlier process with this pid (a symlink: removed)
    fd = os.open(tmp, flags, mode)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_private(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` to ``path`` for its owner's eyes only (mode 0600, whatever the umask)."""
    _write_replacing(path, text, 0o600)


def write_json_atomic(path: str | os.PathLike[str], data: object) -> None:
    """Write ``data`` as JSON to ``path`` through a temp file and ``os.replace``: a reader
    sees the old file or the new one, never half of one."""
    _write_replacing(path, json.dumps(data, indent=2, allow_nan=False) + "\n", 0o666)
