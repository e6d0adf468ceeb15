"""``ddptui --no-ui``: launch, collect, print progress lines, write the run directory.

Never imports Textual (a test proves it).
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

from ddptui import protocol
from ddptui.config import RunConfig
from ddptui.formatting import fmt_duration, fmt_num
from ddptui.rundir import rank_log_name
from ddptui.session import RunSession
from ddptui.state import RunState

PRINT_EVERY_S = 5.0
BAR_EVERY_S = 0.5
BAR_WIDTH = 24


def progress_line(state: RunState, now: float) -> str:
    """One line of live status, shared by the periodic print and the terminal bar."""
    epoch = state.current_epoch
    epochs = f"{epoch or '-'}/{state.epochs or '?'}"
    last = state.last_eval
    parts = [
        f"[{fmt_duration(state.elapsed(now)):>6}]",
        f"epoch {epochs}",
        f"{state.global_samples_per_s():,.0f} samples/s",
        f"loss {fmt_num(state.mean_loss)}",
        f"acc {fmt_num(last.accuracy if last else None)}",
        f"ETA {fmt_duration(state.eta(now))}",
    ]
    problems = state.health(now)
    if problems:
        parts.append("; ".join(f"rank {r} {why}" for r, why in sorted(problems.items())))
    return "  ".join(parts)


class ConsoleReporter:
    """Turns events and state into console lines (a progress bar too when on a terminal)."""

    def __init__(self, out: TextIO, tty: bool | None = None) -> None:
        self.out = out
        self.tty = out.isatty() if tty is None else tty
        self._last_line = 0.0
        self._last_bar = 0.0
        self._bar_shown = False
        self._announced: set[int] = set()

    def _print(self, text: str) -> None:
        if self._bar_shown:
            self.out.write("\r\x1b[2K")
            self._bar_shown = False
        self.out.write(text + "\n")
        self.out.flush()

    def on_events(self, state: RunState, events: list[protocol.AnyEvent], now: float) -> None:
        for event in events:
            if isinstance(event, protocol.Status):
                if event.state == "started" and event.rank not in self._announced:
                    self._announced.add(event.rank)
                    self._print(
                        f"rank {event.rank} started: pid {event.pid} on {event.host}, "
                        f"device {event.device}"
                    )
                elif event.state == "failed":
                    self._print(f"rank {event.rank} failed: {event.error}")
            elif isinstance(event, protocol.Eval) and event.rank == min(state.ranks):
                epochs = f"/{state.epochs}" if state.epochs else ""
                count = f" ({event.count} samples)" if event.count is not None else ""
                self._print(
                    f"epoch {event.epoch}{epochs}  accuracy {fmt_num(event.accuracy)}"
                    f"{count}  eval loss {fmt_num(event.loss)}  "
                    f"{state.global_samples_per_s():,.0f} samples/s  "
                    f"elapsed {fmt_duration(state.elapsed(now))}"
                )

    def tick(self, state: RunState, now: float) -> None:
        if self.tty:
            if now - self._last_bar >= BAR_EVERY_S:
                self._last_bar = now
                progress = state.progress() or 0.0
                filled = int(progress * BAR_WIDTH)
                bar = "█" * filled + "░" * (BAR_WIDTH - filled)
                self.out.write(f"\r\x1b[2K{bar} {progress:4.0%} {progress_line(state, now)}")
                self.out.flush()
                self._bar_shown = True
        elif now - self._last_line >= PRINT_EVERY_S:
            self._last_line = now
            if state.status != "starting":
                self._print(progress_line(state, now))

    def summary(self, session: RunSession, now: float) -> None:
        state = session.state
        result = session.result
        stats = session.stats
        last = state.last_eval
        acc = (
            f"final accuracy {fmt_num(last.accuracy)} (epoch {last.epoch})"
            if last
            else "no evaluation received"
        )
        rejected = f", {stats.rejected} rejected" if stats.rejected else ""
        received = stats.received
        verdict = state.outcome or "ended"
        self._print(
            f"run {verdict} after {fmt_duration(state.elapsed(now))}: {acc}; "
            f"{state.samples_total:,} samples; {received} events "
            f"({state.dropped} dropped{rejected})"
        )
        if result is not None and result.failure is not None:
            failure = result.failure
            self._print(f"FAILED: {failure.describe()}")
            if failure.stderr_tail:
                where = rank_log_name(failure.rank)
                self._print(f"last lines of {where}:")
                for line in failure.stderr_tail:
                    self._print(f"  | {line}")
        self._print(f"run directory: {session.run_dir}")


def gpu_preflight(cfg: RunConfig, nvml_module=None) -> list[str]:
    """Before an nccl run: GPUs that another job's processes already hold."""
    if cfg.backend != "nccl":
        return []
    from ddptui.monitor import SystemMonitor, preflight

    with SystemMonitor(nvml_module, pcie=False) as monitor:
        return preflight(monitor.sample())


def run_headless(cfg: RunConfig, out: TextIO | None = None) -> int:
    """Run ``cfg`` to the end; 0 on success, 1 when a rank failed, 130 on Ctrl-C."""
    out = out or sys.stdout
    console = ConsoleReporter(out)
    session = RunSession(cfg)
    console._print(
        f"ddptui run {cfg.run_id}: {cfg.target_label} x{cfg.world_size} "
        f"({cfg.launcher}, {cfg.backend}, amp {cfg.amp}) -> {session.run_dir}"
    )
    for warning in gpu_preflight(cfg):
        console._print(f"warning: {warning}")
    interrupted = False
    try:
        try:
            session.start()
        except OSError as exc:  # e.g. a run directory that cannot be created
            print(
                f"ddptui: error: cannot start the run in {session.run_dir}: {exc.strerror or exc}",
                file=sys.stderr,
            )
            return 2
        while session.poll() is None:
            events = session.pump(0.1)
            now = time.monotonic()
            console.on_events(session.state, events, now)
            console.tick(session.state, now)
    except KeyboardInterrupt:
        interrupted = True
        console._print("interrupted: stopping every worker…")
        session.stop()
    finally:
        session.close()
    console.summary(session, time.monotonic())
    if interrupted:
        return 130
    result = session.result
    return 0 if result is not None and result.ok else 1
