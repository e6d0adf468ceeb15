"""``ddptui bench``: which world size, backend, AMP mode and launcher is fastest on this machine.

Runs a matrix of configurations one at a time with the normal engine (:class:`RunSession`),
each in its own run directory under the bench directory, and measures:

- steady-state samples/s, warm-up excluded (the rule is in :mod:`ddptui.runs.benchmath`);
- scaling efficiency against world size 1 with the same other options;
- time to first step (launch to the first step event);
- peak resident memory per rank (the rank's process tree, sampled with psutil) and, where
  NVML sees GPUs, peak GPU memory per rank;
- final accuracy, when ``--epochs`` is given.

With ``--steps N`` each run is stopped from outside once every rank has logged N steps (so it
works for any user script too); such a run ends ``stopped``, as expected. Configurations that
cannot run here (nccl or fp16 without CUDA, a world size over the machine's limits) are listed
as skipped with the reason, never attempted. Results go to ``bench.csv`` and ``bench.md``
(written by :mod:`ddptui.runs.bench_report`, which also prints them).

Headless: never imports Textual.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddptui import runfiles, safeio
from ddptui.commands import UsageError
from ddptui.constants import AMP_MODES, BACKEND_CHOICES, LAUNCHERS
from ddptui.monitor import RankInfo, Sampler, is_na, join_ranks
from ddptui.rank.cpus import usable_cpus
from ddptui.run.config import build_config
from ddptui.run.machine import Machine
from ddptui.run.options import ConfigError, parse_choice, parse_int, script_option_problem
from ddptui.run.rundir import iter_events
from ddptui.run.session import RunSession
from ddptui.runs import benchmath

#: The single-process ``torch.nn.DataParallel`` baseline (not a launcher of ranks).
DP = "dp"
BENCH_LAUNCHERS = (*LAUNCHERS, DP)
#: Steps per configuration when neither --steps nor --epochs is given.
DEFAULT_STEPS = 100
MAX_REPEAT = 100
MAX_CONFIGURATIONS = 256
#: Seconds --until-stable may add (a week).
MAX_UNTIL_STABLE_S = 7 * 24 * 3600
#: Seconds between memory samples of the ranks.
SAMPLE_INTERVAL_S = 0.25
CSV_FILE = "bench.csv"
#: Files that make a directory a run's: a bench never writes into one (or into one below it).
RUN_MARKERS = (runfiles.CONFIG_FILE, runfiles.EVENTS_FILE)
MD_FILE = "bench.md"


# -- the command line --------------------------------------------------------------------------
def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Run a matrix of configurations one at a time and measure which is fastest here. "
        "Arguments after '--' go to the trainer or your --script or --module."
    )
    p.add_argument("--no-ui", action="store_true", help="print to the console, no dashboard")
    m = p.add_argument_group("matrix (comma-separated lists)")
    m.add_argument("--world-size", help="world sizes, e.g. 1,2,4 (default 1,2)")
    m.add_argument("--backend", help=f"backends from {', '.join(BACKEND_CHOICES)} (default auto)")
    m.add_argument("--amp", help=f"AMP modes from {', '.join(AMP_MODES)} (default off)")
    m.add_argument(
        "--launcher",
        help=f"launchers from {', '.join(BENCH_LAUNCHERS)} (dp: single-process DataParallel "
        "baseline, needs more than one GPU; default: the run's default)",
    )
    length = p.add_mutually_exclusive_group()
    length.add_argument(
        "--steps", help=f"stop each run once every rank logged N steps (default {DEFAULT_STEPS})"
    )
    length.add_argument("--epochs", help="train N epochs per run (also reports final accuracy)")
    p.add_argument("--repeat", default="1", help="runs per configuration: median and spread")
    p.add_argument(
        "--until-stable",
        metavar="SECONDS",
        # "%%": argparse formats help texts with %, and "±10%)" made --help die
        help="after the planned runs, repeat each configuration whose samples/s is unstable "
        f"(interval wider than ±{benchmath.STABLE_SPREAD * 100:.0f}%%) until it is stable or "
        "SECONDS more have passed",
    )
    p.add_argument("--bench-dir", help="where to write (default runs/bench-<timestamp>)")
    g = p.add_argument_group("run options (the same for every configuration)")
    g.add_argument("--trainer", help="built-in trainer (default synthetic)")
    g.add_argument("--script", help="your own training script")
    g.add_argument(
        "--module",
        dest="script_module",
        metavar="NAME",
        help="your own training module, run as python -m NAME",
    )
    g.add_argument("--batch-size", help="batch size per rank")
    g.add_argument("--lr", help="learning rate")
    g.add_argument("--seed", help="random seed (default 0)")
    g.add_argument("--model", help="model for cifar10/imagefolder")
    g.add_argument("--data-dir", help="dataset directory")
    g.add_argument("--sync-bn", action="store_true", help="convert BatchNorm to SyncBatchNorm")


# -- planning the matrix ----------------------------------------------------------------------
@dataclass(frozen=True)
class Planned:
    """One configuration of the matrix: runnable (``cfg``) or skipped (``skip`` says why)."""

    world_size: int | None
    launcher: str
    backend: str
    amp: str
    cfg: Any = None  # RunConfig (run_dir and run_id are set per repeat)
    skip: str | None = None

    @property
    def label(self) -> str:
        ranks = f"x{self.world_size}" if self.world_size is not None else "x-"
        return f"{ranks} {self.launcher} {self.backend} amp {self.amp}"

    @property
    def slug(self) -> str:
        ranks = self.world_size if self.world_size is not None else "all"
        return f"w{ranks}-{self.launcher}-{self.backend}-{self.amp}"

    @property
    def group(self) -> tuple[str, str, str]:
        """Options other than the world size: runs with equal groups scale against each other."""
        return (self.launcher, self.backend, self.amp)


@dataclass(frozen=True)
class BenchOptions:
    plan: tuple[Planned, ...]
    bench_dir: Path
    steps: int | None
    epochs: int | None
    repeat: int
    target: str
    #: What ran the bench: GPUs, or why there were none.
    devices: str = ""
    #: Seconds of extra repeats for unstable configurations (--until-stable), or None.
    until_stable: float | None = None


def _split(name: str, text: str | None) -> list[str]:
    """The comma-separated values of ``--name``; an empty one (``1,,2``) is refused, not
    dropped: it is a typo, and the bench would silently run something else."""
    if text is None:
        return []
    parts = [part.strip() for part in str(text).split(",")]
    if any(parts) and not all(parts):
        raise UsageError(f"--{name} has an empty value in {safeio.shown(text, 60)!r}")
    return [part for part in parts if part]


def _choices(name: str, text: str | None, allowed: Sequence[str]) -> list[str | None]:
    values = _split(name, text)
    if text is not None and not values:
        raise UsageError(f"--{name} needs at least one value")
    return [parse_choice(name, v, list(allowed)) for v in values] or [None]


def default_world_sizes(cuda_devices: int) -> list[int]:
    """1 and 2 on CPU; with GPUs, 1, 2, 4, … up to every GPU."""
    if cuda_devices < 2:
        return [1, 2]
    sizes = [1]
    while sizes[-1] * 2 < cuda_devices:
        sizes.append(sizes[-1] * 2)
    return [*sizes, cuda_devices]


def dp_skip_reason(machine: Any) -> str | None:
    """Why the DataParallel baseline cannot run here (None: it could)."""
    if machine.cuda_devices < 2:
        found = (
            f"this machine has {machine.cuda_devices}"
            if machine.cuda_devices
            else f"none here: {machine.cuda_reason}"
        )
        return f"DataParallel baseline needs more than one GPU ({found})"
    return (
        "DataParallel baseline is not available yet: the built-in trainers have no "
        "single-process DataParallel mode"
    )


def plan_bench(args: argparse.Namespace, machine: Any = None) -> BenchOptions:
    """Validate the command line and expand the matrix. Bad values raise ConfigError or
    UsageError (exit 2, nothing started); configurations that cannot run here are skipped."""
    repeat = parse_int("repeat", args.repeat, 1)
    until_stable = None
    if getattr(args, "until_stable", None) is not None:
        until_stable = float(parse_int("until_stable", args.until_stable, 1))
        if until_stable > MAX_UNTIL_STABLE_S:
            raise UsageError(
                f"--until-stable must be at most {MAX_UNTIL_STABLE_S}, got {until_stable:.0f}"
            )
    if repeat > MAX_REPEAT:
        raise UsageError(f"--repeat must be at most {MAX_REPEAT}, got {repeat}")
    steps = None if args.steps is None else parse_int("steps", args.steps, 1)
    epochs = None if args.epochs is None else parse_int("epochs", args.epochs, 1)
    if steps is None and epochs is None:
        steps = DEFAULT_STEPS
    if steps is not None and steps > 10_000_000:
        raise UsageError(f"--steps must be at most 10000000, got {steps}")
    backends = _choices("backend", args.backend, BACKEND_CHOICES)
    amps = _choices("amp", args.amp, AMP_MODES)
    problem = script_option_problem({**vars(args), "amp": amps})
    if problem:
        raise UsageError(problem)
    launchers = _choices("launcher", args.launcher, BENCH_LAUNCHERS)
    if launchers == [DP] and (args.world_size is not None or args.backend is not None):
        raise UsageError(
            "--launcher dp runs one process on every GPU: it takes no --world-size or --backend"
        )
    sizes_text = _split("world-size", args.world_size)
    if args.world_size is not None and not sizes_text:
        raise UsageError("--world-size needs at least one value")
    sizes = [parse_int("world_size", v, 1) for v in sizes_text]
    if len(backends) * len(amps) * len(launchers) * max(1, len(sizes)) > MAX_CONFIGURATIONS:
        raise UsageError(f"the matrix has more than {MAX_CONFIGURATIONS} configurations")

    bench_dir = Path(args.bench_dir or Path("runs") / f"bench-{time.strftime('%Y%m%d-%H%M%S')}")
    try:
        bench_dir = bench_dir.expanduser().resolve()
        there = safeio.path_state(bench_dir)
        has_csv = os.path.lexists(bench_dir / CSV_FILE)
    except (OSError, ValueError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else str(exc)
        raise UsageError(f"--bench-dir {safeio.shown(args.bench_dir)}: {why}") from None
    if there is not None and not safeio.is_dir(bench_dir):
        raise UsageError(f"bench directory is a file: {safeio.shown(bench_dir)}")
    if any(safeio.is_file(d / name) for d in (bench_dir, bench_dir.parent) for name in RUN_MARKERS):
        raise UsageError(f"--bench-dir {safeio.shown(bench_dir)} is (inside) a run directory")
    if has_csv:
        raise UsageError(f"bench directory already holds a bench: {safeio.shown(bench_dir)}")

    machine = machine or Machine.detect()
    if not sizes:
        sizes = default_world_sizes(machine.cuda_devices)
    common = {
        "trainer": args.trainer,
        "script": args.script,
        "script_module": getattr(args, "script_module", None),
        "batch_size": args.batch_size,
        "lr": args.lr,
        "seed": args.seed,
        "model": args.model,
        "data_dir": args.data_dir,
        "sync_bn": bool(args.sync_bn),
        "epochs": epochs,
        "script_args": tuple(getattr(args, "script_args", None) or ()),
    }
    # Options that are wrong whatever the matrix (a missing script, a bad --lr) stop the bench.
    base = build_config(
        {**common, "world_size": 1, "backend": "gloo", "amp": "off", "run_dir": bench_dir / "x"},
        machine,
    )

    plan: list[Planned] = []
    seen: set[tuple] = set()
    for launcher in launchers:
        for amp in amps:
            if launcher == DP:
                key = (DP, amp)
                if key not in seen:
                    seen.add(key)
                    ngpu = machine.cuda_devices or None
                    plan.append(Planned(ngpu, DP, "-", amp or "off", skip=dp_skip_reason(machine)))
                continue
            for backend in backends:
                for size in sizes:
                    raw = {
                        **common,
                        "world_size": size,
                        "backend": backend,
                        "amp": amp,
                        "launcher": launcher,
                        "run_dir": bench_dir / "x",
                        "run_id": "bench",
                    }
                    try:
                        cfg = build_config(raw, machine)
                    except ConfigError as exc:
                        item = Planned(
                            size,
                            launcher or base.launcher,
                            backend or "auto",
                            amp or "off",
                            skip=str(exc),
                        )
                    else:
                        item = Planned(cfg.world_size, cfg.launcher, cfg.backend, cfg.amp, cfg)
                    key = (item.world_size, item.launcher, item.backend, item.amp)
                    if key not in seen:
                        seen.add(key)
                        plan.append(item)
    devices = (
        f"{machine.cuda_devices} CUDA GPU(s)"
        if machine.cuda_devices
        else f"no GPU ({machine.cuda_reason})"
    )
    return BenchOptions(
        tuple(plan),
        bench_dir,
        steps,
        epochs,
        repeat,
        base.target_label,
        devices,
        until_stable,
    )


# -- measuring one run ------------------------------------------------------------------------
class PeakTracker:
    """Peak resident memory and GPU memory per rank, from monitor snapshots.

    :meth:`take` runs on the sampler's thread; :meth:`set_ranks` on the bench's (it rebinds
    one dict, which the sampler reads whole).
    """

    def __init__(self) -> None:
        self._ranks: dict[int, Any] = {}
        self.rss: dict[int, int] = {}
        self.gpu: dict[int, int] = {}
        self.samples = 0

    def set_ranks(self, ranks: dict[int, Any]) -> None:
        self._ranks = dict(ranks)

    def take(self, snapshot: Any) -> None:
        ranks = self._ranks
        if not ranks:
            return
        self.samples += 1
        for view in join_ranks(snapshot, ranks).ranks:
            if not is_na(view.rss):
                self.rss[view.rank] = max(self.rss.get(view.rank, 0), int(view.rss))
            if not is_na(view.gpu_memory):
                self.gpu[view.rank] = max(self.gpu.get(view.rank, 0), int(view.gpu_memory))


@dataclass
class Measurement:
    """One run of one configuration."""

    run_dir: Path
    outcome: str | None = None
    samples_per_s: float | None = None
    time_to_first_step: float | None = None
    rss: dict[int, int] = field(default_factory=dict)
    gpu: dict[int, int] = field(default_factory=dict)
    accuracy: float | None = None
    steps: int = 0
    #: samples/s with the interval from this run's own step times (benchmath.run_interval).
    interval: benchmath.Spread | None = None
    #: Why the run does not count (it failed, or was interrupted), or None.
    problem: str | None = None
    #: Something worth saying that does not void the figures.
    note: str | None = None

    @property
    def ok(self) -> bool:
        return self.problem is None and self.samples_per_s is not None


def figures_from_run(
    run_dir: Path, run_id: str | None, steps: int | None
) -> tuple[benchmath.Spread | None, int]:
    """Steady-state samples/s with its interval from a run directory's step events (steps up
    to ``steps``; see :func:`benchmath.run_interval`), and the fewest steps any rank logged."""
    by_rank = benchmath.group_steps(benchmath.step_points(iter_events(run_dir, run_id)), steps)
    fewest = min((len(v) for v in by_rank.values()), default=0)
    return benchmath.run_interval(by_rank), fewest


class Cancelled(Exception):
    """The bench was asked to stop (from another thread, e.g. the dashboard)."""


def measure(
    cfg: Any,
    steps: int | None,
    *,
    on_progress: Callable[[Any], None] | None = None,
    cancelled: Callable[[], bool] = lambda: False,
    session_factory: Callable[[Any], Any] | None = None,
    sampler_factory: Callable[[Callable[[Any], None]], Any] | None = None,
    starting: Callable[[], Any] | None = None,
    tearing_down: Callable[[], Any] | None = None,
    result: Measurement | None = None,
) -> Measurement:
    """Run ``cfg`` once and measure it. Always tears the run down, also when interrupted
    (any exception, Ctrl-C included, stops every worker and writes summary.json).

    ``starting`` and ``tearing_down`` are context managers around the start and the teardown
    (the console holds signals back there, so none cuts either short)."""
    session = (session_factory or RunSession)(cfg)
    tracker = PeakTracker()
    sampler = (
        sampler_factory(tracker.take)
        if sampler_factory
        else Sampler(interval=SAMPLE_INTERVAL_S, callback=tracker.take, pcie=False)
    )
    known: dict[int, Any] = {}
    # Filled in on every way out, so an interrupted run is on record too.
    result = result if result is not None else Measurement(Path(cfg.run_dir))
    sampler_started = False
    try:
        with (starting or nullcontext)():
            session.start()
        sampler.start()
        sampler_started = True
        while session.poll() is None:
            session.pump(0.1)
            with session.locked():
                views = list(session.state.ranks.values())
            ranks = {v.rank: RankInfo(v.pid, v.device_uuid) for v in views if v.pid}
            if ranks != known:
                known = ranks
                tracker.set_ranks(ranks)
                sampler.set_pids([info.pid for info in ranks.values()])
            if on_progress is not None:
                on_progress(session.state)
            if cancelled():
                session.stop(interrupted=True)
                raise Cancelled
            if steps is not None and views and all(v.step >= steps for v in views):
                session.stop()
                break
    except BaseException:
        if session.result is None:
            session.stop(interrupted=True)
        raise
    finally:
        with (tearing_down or nullcontext)():
            if sampler_started:
                sampler.stop()
            session.close()
        state = session.state
        result.outcome = state.outcome
        result.rss = dict(tracker.rss)
        result.gpu = dict(tracker.gpu)
        if state.started_at is not None and state.first_step_at is not None:
            result.time_to_first_step = max(0.0, state.first_step_at - state.started_at)
        last = state.last_eval
        # Only a run trained to its end has a final accuracy (a --steps run is cut short).
        if steps is None and last is not None and last.accuracy is not None:
            result.accuracy = last.accuracy if math.isfinite(last.accuracy) else None
        result.interval, result.steps = figures_from_run(result.run_dir, cfg.run_id, steps)
        result.samples_per_s = None if result.interval is None else result.interval.median
        expected = "stopped" if steps is not None else "finished"
        if state.outcome == "failed":
            failure = state.failure
            result.problem = "failed: " + (failure.describe() if failure else "a rank failed")
        elif state.outcome not in (expected, "finished"):
            result.problem = f"run {state.outcome or 'did not end'}"
        elif steps is not None and result.steps < steps:
            result.note = f"ended after {result.steps} of {steps} steps"
        if result.problem is None and result.samples_per_s is None:
            result.problem = (
                f"too few steps to measure ({result.steps}; the first "
                f"{benchmath.MIN_WARMUP_STEPS} of each rank are warm-up)"
            )
        if session.fault:
            result.problem = session.fault
    return result


# -- results ---------------------------------------------------------------------------------
@dataclass
class ConfigResult:
    planned: Planned
    runs: list[Measurement] = field(default_factory=list)


@dataclass(frozen=True)
class Row:
    """One line of the bench table (figures over the repeats of one configuration)."""

    planned: Planned
    status: str  # measured | skipped | failed | interrupted | not run
    reason: str
    rate: benchmath.Spread | None
    efficiency: float | None
    time_to_first_step: float | None
    rss: dict[int, int]
    gpu: dict[int, int]
    accuracy: float | None
    steps: int | None
    run_dirs: tuple[Path, ...]
    fastest: bool = False
    #: Why there is no efficiency (a figure is unstable, superlinear noise, no x1), or "".
    efficiency_note: str = ""

    @property
    def stable(self) -> bool:
        """The samples/s figure has an interval within ``benchmath.STABLE_SPREAD``."""
        return self.rate is not None and self.rate.stable


def _run_figure(m: Measurement) -> benchmath.Spread | None:
    if m.interval is not None:
        return m.interval
    if m.samples_per_s is None:
        return None
    value = m.samples_per_s
    return benchmath.Spread(value, value, value, 1, benchmath.FROM_NOTHING)


def build_rows(results: Sequence[ConfigResult], cores: int | None = None) -> list[Row]:
    """Figures per configuration: medians over good repeats (or one run's own interval),
    efficiency against the same group's world size 1 where both figures are stable and it is
    no more than the machine can give (``cores``: usable CPU cores, for ranks on the CPU), and
    the fastest configuration marked."""
    rows: list[Row] = []
    for res in results:
        good = [m for m in res.runs if m.ok]
        bad = [m for m in res.runs if not m.ok]
        if res.planned.skip is not None:
            status, reason = "skipped", res.planned.skip
        elif not res.runs:
            status, reason = "not run", "the bench was interrupted first"
        elif bad and any(m.outcome == "interrupted" for m in bad) and not good:
            status, reason = "interrupted", bad[0].problem or ""
        elif not good:
            status, reason = "failed", bad[0].problem or "failed"
        else:
            status = "measured"
            notes = [m.problem for m in bad if m.problem] + [m.note for m in good if m.note]
            if bad:
                notes.insert(0, f"{len(bad)} of {len(res.runs)} repeats did not count")
            reason = "; ".join(dict.fromkeys(notes))
        rss: dict[int, int] = {}
        gpu: dict[int, int] = {}
        for m in good:
            for rank, value in m.rss.items():
                rss[rank] = max(rss.get(rank, 0), value)
            for rank, value in m.gpu.items():
                gpu[rank] = max(gpu.get(rank, 0), value)
        rows.append(
            Row(
                planned=res.planned,
                status=status,
                reason=reason,
                rate=benchmath.figure([f for f in map(_run_figure, good) if f is not None]),
                efficiency=None,
                time_to_first_step=benchmath.median(m.time_to_first_step for m in good),
                rss=rss,
                gpu=gpu,
                accuracy=benchmath.median(m.accuracy for m in good),
                steps=min((m.steps for m in good), default=None),
                run_dirs=tuple(m.run_dir for m in res.runs),
            )
        )
    base = {
        r.planned.group: r.rate
        for r in rows
        if r.rate is not None and r.planned.world_size == 1 and r.planned.launcher != DP
    }
    measured = [r for r in rows if r.rate is not None]
    best = max(measured, key=lambda r: r.rate.median) if measured else None  # type: ignore[union-attr]
    out = []
    for r in rows:
        eff = benchmath.Efficiency(None)
        if r.rate is not None and r.planned.world_size and r.planned.launcher != DP:
            on_cpu = getattr(r.planned.cfg, "device", "cpu") != "cuda"
            eff = benchmath.efficiency_verdict(
                r.rate,
                r.planned.world_size,
                base.get(r.planned.group),
                cores=cores if on_cpu else None,
            )
        out.append(
            dataclasses.replace(
                r, efficiency=eff.value, efficiency_note=eff.reason, fastest=r is best
            )
        )
    return out


# -- output ----------------------------------------------------------------------------------


# -- running the matrix ----------------------------------------------------------------------
class BenchRunner:
    """Runs every runnable configuration ``repeat`` times, one run at a time."""

    def __init__(self, opts: BenchOptions, **measure_kwargs: Any) -> None:
        self.opts = opts
        self.results = [ConfigResult(p) for p in opts.plan]
        self.measure_kwargs = measure_kwargs
        self.bench_id = opts.bench_dir.name

    @property
    def runnable(self) -> list[ConfigResult]:
        return [r for r in self.results if r.planned.cfg is not None]

    def run_config(self, res: ConfigResult, repeat: int) -> Measurement:
        planned = res.planned
        name = f"{self.results.index(res) + 1:02d}-{planned.slug}"
        if self.opts.repeat > 1 or repeat > 0:
            name += f"-r{repeat + 1}"
        cfg = dataclasses.replace(
            planned.cfg, run_dir=str(self.opts.bench_dir / name), run_id=f"{self.bench_id}-{name}"
        )
        measurement = Measurement(Path(cfg.run_dir))
        res.runs.append(measurement)
        return measure(cfg, self.opts.steps, result=measurement, **self.measure_kwargs)

    def jobs(
        self, clock: Callable[[], float] = time.monotonic
    ) -> Iterator[tuple[ConfigResult, int]]:
        """What to run next, as (configuration, repeat index): every runnable configuration
        ``repeat`` times, round-robin; then, with ``until_stable``, again each one whose
        figure is measured but unstable, round-robin, until all are stable, the budget (from
        the end of the planned runs) is spent, or a configuration has ``MAX_REPEAT`` runs."""
        for repeat in range(self.opts.repeat):
            for res in self.runnable:
                yield res, repeat
        if self.opts.until_stable is None:
            return
        deadline = clock() + self.opts.until_stable
        while clock() < deadline:
            rows = self.rows()
            unstable = [
                res
                for res, row in zip(self.results, rows, strict=True)
                if row.status == "measured" and not row.stable and len(res.runs) < MAX_REPEAT
            ]
            if not unstable:
                return
            for res in unstable:
                if clock() >= deadline:
                    return
                yield res, len(res.runs)

    def rows(self) -> list[Row]:
        return build_rows(self.results, cores=usable_cpus())
