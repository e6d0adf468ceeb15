"""Reading and writing a run directory: how a run ended (``summary.json``), its saved
options, its events, the launcher's failure record and log tails, and a whole run loaded back
into a :class:`~ddptui.run.state.RunState`. The file names are :mod:`ddptui.runfiles`.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime
from pathlib import Path

from ddptui import protocol, safeio
from ddptui.argv import config_script_epochs
from ddptui.run.state import AttemptRecord, RankFailureInfo, RunState
from ddptui.runfiles import RunDir, write_json_atomic

#: Most bytes of config.json read back.
MAX_CONFIG_BYTES = 1024 * 1024
#: Most bytes of summary.json (or launcher-result.json) read back.
MAX_SUMMARY_BYTES = 16 * 1024 * 1024
#: Longest line of events.jsonl read back (longer lines are skipped, like malformed ones).
MAX_EVENT_LINE = 4 * 1024 * 1024


def require_events(run_dir: str | os.PathLike[str]) -> None:
    """Raise :class:`RunDirError` (one line) unless ``run_dir`` holds a regular events.jsonl."""
    path = RunDir(run_dir).events
    try:
        with safeio.open_regular(path):
            pass
    except (FileNotFoundError, NotADirectoryError):
        raise RunDirError(
            f"not a run directory (no events.jsonl): {safeio.shown(run_dir)}"
        ) from None
    except OSError as exc:
        raise RunDirError(f"cannot read {safeio.shown(path)}: {exc.strerror or exc}") from None


# -- the launcher's failure record and log tails ------------------------------------------
#: Lines of a failing rank's log shown with its failure.
STDERR_TAIL_LINES = 15


def tail_lines(path: Path, n: int = STDERR_TAIL_LINES, max_bytes: int = 64 * 1024) -> list[str]:
    """Last ``n`` lines of a text file (reads at most ``max_bytes`` from its end)."""
    try:
        with safeio.open_regular(path) as f:  # a FIFO or device in its place: nothing to show
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            data = f.read()
    except OSError:
        return []
    lines = data.decode("utf-8", "replace").splitlines()
    return list(deque((ln for ln in lines if ln.strip()), maxlen=n))


def read_failure(run_dir: Path) -> RankFailureInfo | None:
    """The first failing rank as the driver recorded it in the run directory, with the tail
    of that rank's log; None when the driver recorded no rank failure."""
    try:
        info = safeio.read_json(RunDir(run_dir).result, MAX_SUMMARY_BYTES)
    except (OSError, ValueError):
        return None
    if not isinstance(info, dict):
        return None

    def typed(key: str, kind: type):
        value = info.get(key)
        return value if isinstance(value, kind) and not isinstance(value, bool) else None

    rank = typed("rank", int)
    return RankFailureInfo(
        rank=rank,
        exit_code=typed("exit_code", int),
        signal=typed("signal", str),
        error=typed("error", str),
        stderr_tail=tuple(tail_lines(RunDir(run_dir).rank_log(rank))) if rank is not None else (),
        pid=typed("pid", int),
    )


# -- how a run ended -------------------------------------------------------------------------
#: Every way a run can end (``hung``: ddptui found a hang and tore the run down).
OUTCOMES = ("finished", "failed", "stopped", "interrupted", "hung")
#: ddptui's exit code for each outcome (``ddptui --no-ui`` returns it).
EXIT_CODES = {"finished": 0, "failed": 1, "stopped": 130, "interrupted": 130, "hung": 3}
#: Version of the summary.json layout.
SUMMARY_VERSION = 1
#: Longest error / traceback text kept in summary.json.
MAX_TEXT = 20_000


class RunDirError(Exception):
    """A run directory that cannot be read or written; ``str()`` is a one-line message."""


def decide_outcome(
    *, failed: bool, stopped: bool = False, interrupted: bool = False, hung: bool = False
) -> str:
    """The one rule for how a run ended.

    ``interrupted`` (Ctrl-C or SIGTERM to ddptui), ``hung`` (ddptui tore a hung run down) and
    ``stopped`` (the user's stop) win over a failure that the teardown itself caused;
    otherwise any failing rank or non-zero launcher exit makes the run ``failed``.
    """
    if interrupted:
        return "interrupted"
    if hung:
        return "hung"
    if stopped:
        return "stopped"
    return "failed" if failed else "finished"


def _text(value: object) -> str | None:
    if value is None:
        return None
    text = str(value)
    return text if len(text) <= MAX_TEXT else "…" + text[-MAX_TEXT:]


def _finite(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    value = float(value)
    return value if value == value and abs(value) != float("inf") else None


def summarize(
    state,
    outcome: str,
    failure=None,
    exit_code: int | None = None,
    events: dict[str, int] | None = None,
    duration_s: float | None = None,
) -> dict:
    """The ``summary.json`` document for a run: ``state`` is its :class:`~ddptui.run.state.RunState`
    (read only), ``failure`` a :class:`~ddptui.run.state.RankFailureInfo` or None."""
    if outcome not in OUTCOMES:
        raise ValueError(f"unknown outcome {outcome!r}")
    last = state.last_eval
    ranks = []
    for rank, view in sorted(state.ranks.items()):
        rate = state.rank_rate_over_run(view) if view.samples_total else None
        ranks.append(
            {
                "rank": rank,
                "state": view.state,
                "host": view.host,
                "pid": view.pid,
                "device": view.device,
                "steps": view.step,
                "samples": view.samples_total,
                # its mean over its steps (samples over summed step times, under DDP without
                # its waits for the other ranks; None: not counted)
                "samples_per_s": _finite(rate),
                # the same without each attempt's first step (the run's warm-up)
                "samples_per_s_after_first_step": _finite(state.rank_rate_after_first_step(view)),
                "error": _text(view.error),
            }
        )
    failure_doc = None
    if failure is not None:
        view = state.ranks.get(failure.rank) if failure.rank is not None else None
        failure_doc = {
            "rank": failure.rank,
            "host": view.host if view is not None else None,
            "how": failure.describe(),
            "exit_code": failure.exit_code,
            "signal": failure.signal,
            "error": _text(failure.error or (view.error if view is not None else None)),
            "traceback": _text(
                getattr(failure, "traceback", None)
                or (getattr(view, "traceback", None) if view else None)
            ),
        }
    attempts = [_attempt_doc(record) for record in getattr(state, "attempts", ())]
    over_run = state.samples_per_s_over_run()
    return {
        "version": SUMMARY_VERSION,
        "run_id": state.run_id,
        "outcome": outcome,
        "exit_code": EXIT_CODES[outcome] if exit_code is None else exit_code,
        "final_accuracy": _finite(last.accuracy) if last else None,
        "final_eval": None
        if last is None
        else {
            "epoch": last.epoch,
            "accuracy": _finite(last.accuracy),
            "loss": _finite(last.loss),
            "count": last.count,
        },
        "world_size": state.world_size,
        "epochs": state.epochs,
        "duration_s": _finite(duration_s),
        "samples": state.samples_total,
        # the ranks' means over their steps (None: no sample counted, or no rate known)
        "samples_per_s": _finite(over_run),
        # the same after each attempt's first step (its warm-up: CUDA's, cuDNN's autotuning,
        # torch.compile's compilation), and that first step's seconds; None where unknown
        **_after_first_step(state, over_run),
        "events": _events_doc(state, events),
        "ranks": ranks,
        "failure": failure_doc,
        "attempts": attempts,
        "restarts": max(0, len(attempts) - 1),
        "restart_refused": getattr(state, "restart_refused", None),
    }


def _after_first_step(state, over_run: float | None) -> dict:
    """summary.json's ``samples_per_s_after_first_step`` and ``first_step_s`` (none where the
    run's rate over its steps, ``over_run``, is unknown)."""
    after = state.rate_after_first_step() if over_run is not None else None
    rate, first = after if after is not None else (None, None)
    return {"samples_per_s_after_first_step": _finite(rate), "first_step_s": _finite(first)}


def _events_doc(state, events: dict[str, int] | None) -> dict:
    """summary.json's ``events``: the counts given, and any implausible seq jump by name."""
    doc: dict = dict(events or {})
    jumps = getattr(state, "seq_jumps", [])
    if jumps:
        doc["seq_jumps"] = [{"rank": r, "from": a, "to": b} for r, a, b in jumps[:100]]
    return doc


def _attempt_doc(record) -> dict:
    """One entry of summary.json's ``attempts`` (a :class:`~ddptui.run.state.AttemptRecord`)."""
    started = _finite(record.started_at)
    failure = record.failure
    return {
        "attempt": record.attempt,
        "started_at": None
        if started is None
        else datetime.fromtimestamp(started, UTC).isoformat(timespec="seconds"),
        "outcome": record.outcome,
        "failure": None
        if failure is None
        else {
            "rank": failure.rank,
            "how": failure.describe(),
            "exit_code": failure.exit_code,
            "signal": failure.signal,
        },
        "resumed_from": record.resumed_from,
        "resumed_from_epoch": record.resumed_from_epoch,
    }


def _restore_attempts(state, summary: dict, config: dict) -> None:
    """summary.json's ``attempts`` back onto a replayed state (malformed entries skipped)."""

    restarts = config.get("max_restarts")
    if isinstance(restarts, int) and not isinstance(restarts, bool) and 0 <= restarts <= 1000:
        state.max_restarts = restarts
    if isinstance(summary.get("restart_refused"), str):
        state.restart_refused = _text(summary["restart_refused"])
    attempts = summary.get("attempts")
    if not isinstance(attempts, list):
        return
    for doc in attempts[:1000]:
        if not isinstance(doc, dict) or not isinstance(doc.get("attempt"), int):
            continue
        try:
            started = datetime.fromisoformat(str(doc.get("started_at"))).timestamp()
        except ValueError:
            started = 0.0
        failure = doc.get("failure")
        info = None
        if isinstance(failure, dict):
            rank = failure.get("rank")
            info = RankFailureInfo(
                rank=rank if isinstance(rank, int) else None,
                exit_code=failure.get("exit_code")
                if isinstance(failure.get("exit_code"), int)
                else None,
                signal=failure.get("signal") if isinstance(failure.get("signal"), str) else None,
            )
        epoch = doc.get("resumed_from_epoch")
        state.attempts.append(
            AttemptRecord(
                doc["attempt"],
                started,
                resumed_from=_text(doc.get("resumed_from")),
                resumed_from_epoch=epoch if isinstance(epoch, int) else None,
                outcome=doc.get("outcome") if doc.get("outcome") in OUTCOMES else None,
                failure=info,
            )
        )


def write_summary(run_dir: str | os.PathLike[str], summary: dict) -> Path:
    """Write ``summary.json`` atomically; returns its path."""
    path = RunDir(run_dir).summary
    write_json_atomic(path, summary)
    return path


def read_summary(run_dir: str | os.PathLike[str]) -> dict | None:
    """``summary.json`` if present and well-formed (else None: derive it from the events)."""
    path = RunDir(run_dir).summary
    try:
        doc = safeio.read_json(path, MAX_SUMMARY_BYTES)
    except (OSError, ValueError):  # missing, not a regular file, too large or deep, not JSON
        return None
    if not isinstance(doc, dict) or doc.get("outcome") not in OUTCOMES:
        return None
    if not isinstance(doc.get("exit_code"), int) or isinstance(doc.get("exit_code"), bool):
        return None
    failure = doc.get("failure")
    if failure is not None and not isinstance(failure, dict):
        return None
    return doc


# -- the run's options, as saved -------------------------------------------------------------
#: Most ranks a saved run may claim; replay also bounds it by the ranks its events name.
MAX_WORLD_SIZE = 65_536


def read_config(run_dir: str | os.PathLike[str]) -> dict:
    """``config.json`` of a run directory, checked: a JSON object with a sane world size.

    Raises :class:`RunDirError` (one line) when the file is missing, too big, not JSON,
    not an object, or its world size is not a whole number in 1..MAX_WORLD_SIZE.
    """
    path = RunDir(run_dir).config
    shown = safeio.shown(path)
    try:
        doc = safeio.read_json(path, MAX_CONFIG_BYTES)
    except (FileNotFoundError, NotADirectoryError):
        where = safeio.shown(run_dir)
        raise RunDirError(f"not a run directory (no config.json): {where}") from None
    except OSError as exc:
        raise RunDirError(f"cannot read {shown}: {exc.strerror or exc}") from None
    except ValueError as exc:  # UnicodeDecodeError included
        raise RunDirError(f"{shown} is not valid JSON ({safeio.shown(exc, 200)})") from None
    if not isinstance(doc, dict):
        raise RunDirError(f"{shown} is not a JSON object")
    world = doc.get("world_size", 1)
    if isinstance(world, bool) or not isinstance(world, int) or not 1 <= world <= MAX_WORLD_SIZE:
        raise RunDirError(
            f"{shown}: world_size must be a whole number from 1 to "
            f"{MAX_WORLD_SIZE}, got {str(world)[:40]!r}"
        )
    run_id = doc.get("run_id")
    if run_id is not None and not isinstance(run_id, str):
        raise RunDirError(f"{shown}: run_id must be a string")
    epochs = doc.get("epochs")
    if epochs is not None and (
        isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1
    ):
        doc["epochs"] = None
    return doc


# -- reading a whole run back ----------------------------------------------------------------
#: Ranks a replay always shows (when config.json says so), even if they sent no event.
_SHOWN_WITHOUT_EVENTS = 1024


class EventLines:
    """The events of a run directory's ``events.jsonl`` (only run ``run_id``'s, when given),
    read as they are iterated; lines that do not parse are skipped (a crash may leave the last
    line half-written) and counted in :attr:`unread`."""

    def __init__(self, run_dir: str | os.PathLike[str], run_id: str | None = None) -> None:
        self.path = RunDir(run_dir).events
        self.run_id = run_id
        self.unread = 0

    def __iter__(self):
        try:
            with safeio.open_regular(self.path) as f:
                lines = safeio.read_lines(f, MAX_EVENT_LINE, self._skipped)
                yield from events_in(lines, self.run_id, self._skipped)
        except (FileNotFoundError, NotADirectoryError):
            return
        except OSError as exc:  # not a regular file (a FIFO, a device), unreadable
            shown = safeio.shown(self.path)
            raise RunDirError(f"cannot read {shown}: {exc.strerror or exc}") from None

    def _skipped(self) -> None:
        self.unread += 1


def events_in(
    lines: Iterable[bytes], run_id: str | None, unread: Callable[[], None]
) -> Iterator[protocol.AnyEvent]:
    """The events of ``events.jsonl`` lines (only run ``run_id``'s, when given): blank lines
    passed over, and ``unread`` called for each line that is no event."""
    for line in lines:
        if not line.strip():
            continue
        try:
            event = protocol.from_json(line)
        except protocol.InvalidEvent:
            unread()
            continue
        if run_id is None or event.run == run_id:
            yield event


def unread_note(lines: int) -> str:
    """What a replay says of the lines of ``events.jsonl`` it could not read."""
    what = "1 line" if lines == 1 else f"{lines:,} lines"
    return f"{what} not readable as events, left out (a crash can cut the last one short)"


def iter_events(run_dir: str | os.PathLike[str], run_id: str | None = None):
    """Events of a run directory's ``events.jsonl`` (see :class:`EventLines`)."""
    return iter(EventLines(run_dir, run_id))


def load_run(run_dir: str | os.PathLike[str]):
    """``(config, state, summary)`` of a finished, failed or crashed run directory.

    ``summary`` is ``summary.json`` when the run wrote one, else derived once from the
    events and the launcher's record (runs from before summary.json, or a ddptui that was
    killed). ``state`` carries the outcome and failure. Raises :class:`RunDirError`.
    """

    run_dir = Path(run_dir)
    config = read_config(run_dir)
    run_id = config.get("run_id") or run_dir.name
    top = -1
    for event in iter_events(run_dir, run_id):
        top = max(top, event.rank)
    world = min(int(config.get("world_size") or 1), max(top + 1, _SHOWN_WITHOUT_EVENTS))
    state = RunState(run_id, world, config.get("epochs"), config_script_epochs(config))
    lines = EventLines(run_dir, run_id)
    for event in lines:
        state.apply(event)
    state.lines_unread = lines.unread
    summary = read_summary(run_dir)
    if summary is not None:
        failure = None
        doc = summary.get("failure")
        if doc:
            rank = doc.get("rank") if isinstance(doc.get("rank"), int) else None
            failure = RankFailureInfo(
                rank=rank,
                exit_code=doc.get("exit_code") if isinstance(doc.get("exit_code"), int) else None,
                signal=doc.get("signal") if isinstance(doc.get("signal"), str) else None,
                error=doc.get("error") if isinstance(doc.get("error"), str) else None,
                stderr_tail=tuple(tail_lines(RunDir(run_dir).rank_log(rank))),
            )
        state.set_outcome(summary["outcome"], failure)
        _restore_attempts(state, summary, config)
        return config, state, summary
    failure = read_failure(run_dir)
    if failure is None:
        failed = [v for v in state.ranks.values() if v.state == "failed"]
        if failed:
            failure = RankFailureInfo(
                rank=failed[0].rank,
                error=failed[0].error,
                stderr_tail=tuple(tail_lines(RunDir(run_dir).rank_log(failed[0].rank))),
            )
    ended = [v.state for v in state.ranks.values()]
    complete = bool(ended) and all(s == "finished" for s in ended)
    outcome = decide_outcome(
        failed=failure is not None, interrupted=failure is None and not complete
    )
    state.set_outcome(outcome, failure)
    return config, state, summarize(state, outcome, failure)
