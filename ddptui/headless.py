"""``ddptui --no-ui``: launch, collect, print progress lines, write the run directory.

Never imports Textual (a test proves it). Ctrl-C and SIGTERM at any moment stop every worker,
and the run still gets its ``summary.json``.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import sys
import time
from collections.abc import Iterable
from typing import TextIO

from ddptui import protocol
from ddptui.constants import PHASES
from ddptui.formatting import (
    amp_label,
    counted,
    error_summary,
    escaped,
    fmt_duration,
    fmt_epoch,
    fmt_eta,
    fmt_eval,
    fmt_first_step,
    fmt_num,
    fmt_per_s,
    fmt_rate,
    fmt_samples,
    printable,
)
from ddptui.monitor import SystemMonitor, preflight
from ddptui.run.diagnosis import Diagnosis
from ddptui.run.options import RunConfig, resume_command
from ddptui.run.rundir import RunDirError, tail_lines
from ddptui.run.session import RunSession
from ddptui.run.signals import Interrupted, signals_deferred, signals_interrupt
from ddptui.run.state import RunState
from ddptui.runfiles import rank_log_name

PRINT_EVERY_S = 5.0
BAR_EVERY_S = 0.5
#: While events flow, pumps at least this far apart: each takes a batch. Pumped as each
#: message came (8 ranks at 50 steps/s: hundreds of pumps a second), every pump came to its
#: code and data out of the CPU's caches (see ``tui/sources.py``): ``benchmarks/bench_tui.py
#: --headless`` measured 3.8 % of a core that way, 1.2–1.3 % so. A line waits at most this long.
PUMP_EVERY_S = 0.25
BAR_WIDTH = 24


#: Implausible seq jumps named in the summary (one line each).
MAX_JUMPS_SHOWN = 4
#: Lines of output shown for a run that finished without a step (see
#: HeadlessConsole._said_last).
STEPLESS_TAIL_LINES = 5


def phase_table(state: RunState) -> list[str]:
    """Each rank's recent phase breakdown (median share of the step), as aligned lines; empty
    when no rank sent phases."""
    history = state.phase_history
    ranks = history.ranks()
    if not ranks:
        return []
    width = max(len(p) for p in PHASES) + 1
    lines = [
        f"phases (median share of the step over the last {history.covered()} steps):",
        "rank  " + "".join(f"{p:>{width}}" for p in PHASES),
    ]
    for rank in ranks:
        shares = history.median_shares(rank)
        cells = "".join(f"{shares[p] * 100:>{width - 2}.0f} %" for p in PHASES)
        lines.append(f"{rank:>4}  {cells}")
    return lines


def over_run(state: RunState) -> str:
    """`` at 1,234 samples/s over the run`` (the ranks' samples over their steps' time), or nothing
    where :meth:`RunState.samples_per_s_over_run` knows none."""
    rate = state.samples_per_s_over_run()
    if rate is None:
        return ""
    return f" at {fmt_per_s(rate)} samples/s over the run" + fmt_first_step(
        rate, state.rate_after_first_step()
    )


def diagnosis_line(diagnosis: Diagnosis) -> str:
    label = "hang" if diagnosis.cause in ("hang", "collective") else "diagnosis"
    if diagnosis.cause == "desync":
        label = "desync"
    return f"{label}: {diagnosis.detail}"


def _busy_ranks(views: list) -> str:
    """Which ranks prepare (or evaluate), and where the one the others wait for is: one at
    work (not in a collective), seen where it is."""
    first = min(views, key=lambda v: (bool(v.waiting), not v.frame, v.rank))
    where = f" at {first.frame}" if first.frame else ""
    if first.waiting:
        where = f" waiting in {first.waiting}{where}"
    if first.spawned:
        where = f": spawned {counted(first.spawned, 'worker')}, waiting for their process group"
    who = f"rank {first.rank}" if len(views) == 1 else f"{len(views)} ranks, rank {first.rank}"
    return who + where


def progress_line(state: RunState, now: float) -> str:
    """One line of live status, shared by the periodic print and the terminal bar."""
    last = state.last_eval
    parts = [
        f"[{fmt_duration(state.elapsed(now)):>6}]",
        f"epoch {fmt_epoch(state, state.current_epoch)}",
        fmt_rate(state.live_samples_per_s(now), state.samples_counted),
        f"loss {fmt_num(state.mean_loss)}",
        fmt_eval(last),
        f"ETA {fmt_eta(state, now)}",
    ]
    if not state.outcome:
        for activity in ("preparing", "evaluating"):
            busy = [v for v in state.ranks.values() if v.activity == activity]
            if busy:
                parts.append(f"{activity} ({_busy_ranks(busy)})")
    problems = state.health(now)
    if problems:
        parts.append("; ".join(f"rank {r} {why}" for r, why in sorted(problems.items())))
    return "  ".join(parts)


class HeadlessConsole:
    """Turns events and state into console lines (a progress bar too when on a terminal)."""

    def __init__(self, out: TextIO, tty: bool | None = None, width: int | None = None) -> None:
        self.out = out
        self.tty = out.isatty() if tty is None else tty
        self._width = width
        self._last_line = 0.0
        self._last_bar = 0.0
        self._bar_shown = False
        self._announced: set[int] = set()
        self._shown_steps = 0  # the ranks' steps when the run's progress was last printed
        #: Where the run's events are recorded, said with an error printing them.
        self.run_dir: object = None
        self._failed = False  # an error printing the run was said (see failed)
        self._gone = False  # the output went away: nothing more is written to it

    def failed(self, exc: BaseException) -> None:
        """An error printing the run's lines (ddptui's own bug, or an output that went away:
        ``ddptui --no-ui … | head``): said once on standard error, never raised. Raised, it
        left the loop that drives the run, and ddptui stopped the run."""
        if self._failed:
            return
        self._failed = True
        where = f"; its events are recorded in {self.run_dir}" if self.run_dir else ""
        with contextlib.suppress(Exception):
            error = f"{type(exc).__name__}: {exc}"[:300]
            print(f"ddptui: error printing the run ({error}): the run goes on{where}",
                  file=sys.stderr, flush=True)  # fmt: skip

    def _write(self, text: str) -> None:
        if self._gone:
            return
        try:
            self.out.write(text)
            self.out.flush()
        except (OSError, ValueError) as exc:  # a closed pipe or file
            self._gone = True
            self.failed(exc)

    def line(self, text: str) -> None:
        """Print one line (clearing the progress bar first when it is shown), made printable:
        a rank's error or a host's name never moves the cursor or recolours the terminal."""
        if self._bar_shown:
            self._bar_shown = False
            self._write("\r\x1b[2K" + printable(text) + "\n")
        else:
            self._write(printable(text) + "\n")

    def width(self) -> int:
        """The terminal's width now (it may be resized during a run)."""
        if self._width is not None:
            return self._width
        return shutil.get_terminal_size((80, 24)).columns

    def on_events(self, state: RunState, events: list[protocol.AnyEvent], now: float) -> None:
        for event in events:
            if isinstance(event, protocol.Status):
                if event.state == "started" and event.rank not in self._announced:
                    self._announced.add(event.rank)
                    device = f", device {event.device}" if event.device else ""
                    self.line(f"rank {event.rank} started: pid {event.pid} on {event.host}{device}")
                elif event.state == "failed":
                    # its first line: a message of six lines, as torch.load's, printed whole
                    # by each failed rank and again at the end, buried the run's lines
                    self.line(f"rank {event.rank} failed: {error_summary(event.error or '')}")
            elif isinstance(event, protocol.Eval) and event.rank == min(state.ranks):
                count = f" ({event.count} samples)" if event.count is not None else ""
                accuracy = "" if event.accuracy is None else f"  accuracy {fmt_num(event.accuracy)}"
                # The run's rate over its steps so far, not the rate now: an evaluation comes
                # after a pause in the steps (the evaluation itself), and the rate now decays
                # through it (ignite's CIFAR-10: 197 samples/s against 215-241 while it
                # stepped, and 11 at its last evaluation, run after its last step).
                rate = fmt_rate(state.final_samples_per_s(), state.samples_counted)
                self.line(
                    f"epoch {fmt_epoch(state, event.epoch)}{accuracy}"
                    f"{count}  eval loss {fmt_num(event.loss)}  {rate} so far  "
                    f"elapsed {fmt_duration(state.elapsed(now))}"
                )

    def tick(self, state: RunState, now: float) -> None:
        if self.tty:
            if now - self._last_bar >= BAR_EVERY_S:
                self._last_bar = now
                self._write("\r\x1b[2K" + self.bar(state, now))
                self._bar_shown = True
        elif now - self._last_line >= PRINT_EVERY_S:
            self._last_line = now
            if state.status != "starting":
                self.progress(state, now)

    def progress(self, state: RunState, now: float) -> None:
        self._shown_steps = _steps(state)
        self.line(progress_line(state, now))

    def last_progress(self, state: RunState, now: float) -> None:
        """The run's progress at its end, where steps came after the last line that showed it
        (and always on a terminal, whose bar the summary clears): rasbt's DDP script trains
        its 6 steps within the first line's 5 s, and its loss was never shown."""
        steps = _steps(state)
        if steps and (self.tty or steps != self._shown_steps):
            self.progress(state, now)

    def bar(self, state: RunState, now: float) -> str:
        """The progress bar line, clipped to the terminal's width: a line that wraps cannot be
        redrawn in place and leaves debris."""
        progress = state.progress() or 0.0
        filled = int(progress * BAR_WIDTH)
        text = (
            "█" * filled
            + "░" * (BAR_WIDTH - filled)
            + f" {progress:4.0%} "
            + printable(progress_line(state, now), newlines=False)
        )
        room = max(1, self.width() - 1)  # the last column would wrap on some terminals
        return text if len(text) <= room else text[: room - 1] + "…"

    def restarts(self, session: RunSession, shown: int) -> int:
        """Print the session's restart lines after the first ``shown``; how many are shown."""
        lines = session.restart_lines
        for text in lines[shown:]:
            self.line(text)
        if len(lines) > shown:
            self._announced.clear()  # the ranks of the new attempt say where they run again
        return len(lines)

    def summary(self, session: RunSession, now: float) -> None:
        state = session.state
        stats = session.stats
        rejected = f", {stats.rejected} rejected" if stats.rejected else ""
        verdict = state.outcome or "ended"
        stepless = verdict == "finished" and not any(v.step for v in state.ranks.values())
        if stepless:
            verdict = "finished without a step"
        # Before any step no evaluation was to be had: saying how to report one is noise
        # (a script that failed at its start, or trained nothing).
        evaluated = state.last_eval is not None or state.first_step_at is not None
        self.line(
            f"run {verdict} after {fmt_duration(state.elapsed(now))}: "
            + (f"{eval_summary(state, bool(session.cfg.script))}; " if evaluated else "")
            + f"{fmt_samples(state)}"
            f"{over_run(state)}; {stats.received} events "
            f"({state.dropped} dropped{rejected})"
        )
        if stepless:
            self._said_last(session)
        for rank, before, after in state.seq_jumps[:MAX_JUMPS_SHOWN]:
            self.line(
                f"rank {rank}'s event seq jumped from {before:,} to {after:,}: not drops, a "
                "forged or corrupt event (counted as one gap)"
            )
        for line in phase_table(state):
            self.line(line)
        if state.outcome == "hung":
            captured = sorted(session.stacks)
            where = (
                f"the stacks of {'rank' if len(captured) == 1 else 'ranks'} "
                f"{', '.join(map(str, captured))} are in summary.json and stacks-rank-N.txt"
                if captured
                else "no rank's stack could be captured"
            )
            self.line(f"HUNG: the run was torn down (exit code 3); {where}")
        failure = state.failure
        if len(state.attempts) > 1:
            self.line(f"{len(state.attempts)} attempts ({len(state.attempts) - 1} restarts)")
        if state.outcome == "failed" and failure is not None:
            desync = next(
                (
                    d
                    for d in session.diagnoser.diagnoses
                    if d.cause == "desync" and d.rank is not None
                ),
                None,
            )
            set_off = (
                f", set off by rank {desync.rank}'s desync (see its line above)"
                if desync is not None and desync.rank != failure.rank
                else ""
            )
            # whole where no log tail follows (torch.load's advice); else its head: the tail ends
            # with the error (a DataLoader worker's traceback was printed twice)
            described = failure.describe(short=bool(failure.stderr_tail))
            self.line(f"FAILED: {described}{set_off}")
            if session.result is not None and session.result.exit_code == 0:
                # the script started its ranks itself and joined them without a look at how they
                # ended: plain torchrun exits 0 here, so the user is told why ddptui does not
                self.line(
                    "the script's own process exited 0 (it does not check how its workers "
                    "ended); ddptui exits 1: a rank failed"
                )
            if session.restart_refused:
                self.line(f"not restarted: {session.restart_refused}")
            if failure.stderr_tail:
                self._log_tail(failure.rank, failure.stderr_tail)
        self.line(f"run directory: {session.run_dir}")
        if state.outcome == "stopped" and session.files.checkpoint.is_file():
            self.line(f"to continue: ddptui --resume {session.run_dir}")
            self.line(f"         or: {resume_command(session.cfg)}")

    def _said_last(self, session: RunSession) -> None:
        """A run that ended well without a step: what its first rank with output said last.
        A script that decides not to train says why on its output (pytorch/examples'
        ``ddp/example.py`` without two GPUs: "Unable to locate sufficient 2 gpus to run this
        example. Exiting."), which plain torchrun shows and the run directory's logs keep."""
        for rank in sorted(session.state.ranks):
            lines = tail_lines(session.files.rank_log(rank), STEPLESS_TAIL_LINES)
            if lines:
                self._log_tail(rank, lines)
                return

    def _log_tail(self, rank: int | None, lines: Iterable[str]) -> None:
        """The last lines of a rank's log (the launcher's when no rank is known), quoted."""
        self.line(f"last lines of {rank_log_name(rank)}:")
        for text in lines:
            self.line(f"  | {text}")


def _steps(state: RunState) -> int:
    return sum(view.step or 0 for view in state.ranks.values())


def eval_summary(state: RunState, script: bool) -> str:
    """The evaluation part of the run's last line: the final accuracy, or plainly that none
    was reported (and, for a script, how to report one)."""
    last = state.last_eval
    if last is not None:
        epoch = f" (epoch {fmt_epoch(state, last.epoch)})" if last.epoch is not None else ""
        return f"final {fmt_eval(last, 'accuracy')}{epoch}"
    if script:
        return "the script reports no evaluation (ddptui.log_eval(epoch=…, accuracy=…) adds it)"
    return "no evaluation received"


def gpu_preflight(cfg: RunConfig, nvml_module=None) -> list[str]:
    """Before an nccl run: GPUs that another job's processes already hold."""
    if cfg.backend != "nccl":
        return []
    with SystemMonitor(nvml_module, pcie=False) as monitor:
        return preflight(monitor.sample())


def _announce_nodes(console: HeadlessConsole, cfg: RunConfig, session: RunSession) -> None:
    """A multi-node run: where it waits, and the one line every other node runs."""
    if cfg.launcher == "slurm":
        console.line(
            f"slurm: {cfg.nnodes} node(s) x {cfg.nproc_per_node} rank(s), one agent per node "
            f"via srun; rendezvous {cfg.rdzv_endpoint}"
        )
        return
    console.line(
        f"node 0 of {cfg.nnodes}: {cfg.nproc_per_node} rank(s) per node, rendezvous "
        f"{cfg.rdzv_endpoint}; on each of the other {cfg.nnodes - 1} node(s) run:"
    )
    console.line(session.join_line or "")
    if session.join_shared_line:
        console.line(f"or, where this run directory is shared: {session.join_shared_line}")


def epochs_line(state: RunState) -> str | None:
    """Where ``epoch 1/3`` and its ETA come from when the script's own arguments said it
    (``epochs: 3, as the script's --epochs 3 says …``); None otherwise."""
    flag, epochs = state.epochs_flag, state.epochs
    if not flag:
        return None
    said = f"{flag}{epochs}" if flag.endswith("=") else f"{flag} {epochs}"
    return f"epochs: {epochs}, as the script's {said} says (ddptui --epochs N to differ)"


def run_headless(cfg: RunConfig, out: TextIO | None = None) -> int:
    """Run ``cfg`` to the end; the exit code of its outcome: 0 finished, 1 failed, 3 hung, 130
    after Ctrl-C, 143 after SIGTERM, 129 after SIGHUP (``summary.json`` in the run directory
    says the same)."""
    out = out or sys.stdout
    console = HeadlessConsole(out)
    session = RunSession(cfg)
    console.line(
        f"ddptui run {cfg.run_id}: {cfg.target_label} x{cfg.world_size} "
        f"({cfg.launcher}, {cfg.backend}, {amp_label(cfg.to_json_dict())}) -> {session.run_dir}"
    )
    said = epochs_line(session.state)
    if said:
        console.line(said)
    for warning in gpu_preflight(cfg):
        console.line(f"warning: {warning}")
    with signals_interrupt() as guard:
        try:
            try:
                with signals_deferred():
                    session.start()
            except RunDirError as exc:
                print(f"ddptui: error: {escaped(str(exc))}", file=sys.stderr)
                session.close()
                return 2
            if session.host is not None:
                _announce_nodes(console, cfg, session)
            shown = 0
            asked = False
            console.run_dir = session.run_dir
            while session.poll() is None:
                shown = console.restarts(session, shown)
                guard.gentle = not asked and session.can_stop_with_checkpoint()
                if guard.gentle_asked and not asked:
                    asked = True
                    if session.stop_with_checkpoint():
                        console.line(
                            "stopping after the current step with a checkpoint "
                            "(Ctrl-C again to stop at once)…"
                        )
                    else:
                        raise Interrupted(signal.SIGINT)
                if session.stop_overdue():
                    console.line("no progress while stopping: stopping every worker…")
                    session.stop()
                    break
                began = time.monotonic()
                events = session.pump(0.1)
                now = time.monotonic()
                try:
                    if session.host is not None:
                        for node in session.host.new_joins():
                            console.line(f"node {node.slot} joined (host {node.host})")
                    console.on_events(session.state, events, now)
                    for diagnosis in session.take_diagnoses():
                        console.line(diagnosis_line(diagnosis))
                    console.tick(session.state, now)
                except Exception as exc:  # noqa: BLE001 - the run must outlive the printing
                    console.failed(exc)
                if events:
                    pause = PUMP_EVERY_S - (time.monotonic() - began)
                    if pause > 0:
                        time.sleep(pause)
            console.restarts(session, shown)
        except Interrupted as exc:
            console.line(f"interrupted ({exc}): stopping every worker…")
            session.stop(interrupted=True, exit_code=128 + exc.signum)
        finally:
            guard.armed = False
            session.close()
    try:
        console.last_progress(session.state, time.monotonic())
        for diagnosis in session.take_diagnoses():  # found at the end: the crash's root cause
            console.line(diagnosis_line(diagnosis))
        console.summary(session, time.monotonic())
    except Exception as exc:  # noqa: BLE001 - the run has ended; its exit code still counts
        console.failed(exc)
    if session.fault:
        print(f"ddptui: error: {escaped(str(session.fault))}", file=sys.stderr)
    return session.exit_code
