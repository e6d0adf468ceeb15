"""The figures of a benchmark, from step events: steady-state throughput, scaling efficiency,
median and spread of repeats. Pure (no I/O, no clocks) and table-tested.

The warm-up rule. Each rank's first steps are slow for reasons that do not repeat (lazy
allocation, autotuning, the first all-reduce building its buckets, the data loader filling its
queue), so they are left out: a rank's first ``max(MIN_WARMUP_STEPS, ceil(WARMUP_FRACTION * n))``
steps of its ``n`` (all of them when it logged no more). Also left out is the first step of
every epoch after the first one, whose time includes the previous epoch's evaluation and
checkpoint, and any step without a positive, finite step time (the first step a rank logs has
none: there is no previous step to measure from).

A rank's steady-state samples/s is the samples of its counted steps divided by the sum of their
step times (a ratio of totals, not a mean of per-step rates, so one slow step weighs as much
as the time it took). A run's samples/s is the sum over its ranks: every rank trains on its own
samples at the same time.

How sure a figure is. Every samples/s comes with an interval (:class:`Spread`): over repeated
runs, a distribution-free interval for their median (:func:`median_interval`); for one run,
the same interval for the median of its rates in consecutive windows of its counted steps
(:func:`run_interval`), so a run that a neighbour slowed for a while shows it. A figure whose
interval reaches further than ``STABLE_SPREAD`` from it is unstable, and
:func:`efficiency_verdict` computes no efficiency from it, nor one above what the machine can
give; it says why instead.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from ddptui import protocol

#: Fraction of each rank's steps counted as warm-up.
WARMUP_FRACTION = 0.2
#: At least this many of each rank's first steps are warm-up.
MIN_WARMUP_STEPS = 5


@dataclass(frozen=True)
class StepPoint:
    """What the figures need from one ``step`` event."""

    rank: int
    step: int
    epoch: int | None
    samples: int
    step_time: float | None


def step_points(events: Iterable[protocol.AnyEvent]) -> list[StepPoint]:
    """The step events among ``events``, as :class:`StepPoint`."""
    return [
        StepPoint(e.rank, e.step, e.epoch, e.samples, e.step_time)
        for e in events
        if isinstance(e, protocol.Step)
    ]


def warmup_count(n_steps: int) -> int:
    """How many of a rank's ``n_steps`` first steps are warm-up (never more than it has)."""
    n = max(0, int(n_steps))
    return min(n, max(MIN_WARMUP_STEPS, math.ceil(WARMUP_FRACTION * n)))


def steps_for_interval() -> int:
    """The fewest steps a rank must run for one run's own interval: enough that what is left
    after its warm-up fills MIN_WINDOWS windows of WINDOW_STEPS steps (32 as set)."""
    n = MIN_WINDOWS * WINDOW_STEPS
    while n - warmup_count(n) < MIN_WINDOWS * WINDOW_STEPS:
        n += 1
    return n


def no_interval_line() -> str:
    """Why a run's figure has no interval of its own."""
    return (
        f"no interval: a single run's own takes at least {steps_for_interval()} steps a rank"
        f" ({MIN_WINDOWS * WINDOW_STEPS} after its warm-up, {MIN_WINDOWS} windows of"
        f" {WINDOW_STEPS})"
    )


def _timed(value: float | None) -> bool:
    return value is not None and math.isfinite(value) and value > 0


def counted_steps(steps: Sequence[StepPoint]) -> list[StepPoint]:
    """One rank's steps that count towards its steady-state figure (see the module's rule)."""
    ordered = sorted(steps, key=lambda p: p.step)
    skip = warmup_count(len(ordered))
    kept = []
    previous_epoch: object = object()
    for i, point in enumerate(ordered):
        epoch_start = i > 0 and point.epoch != previous_epoch
        previous_epoch = point.epoch
        if i < skip or epoch_start or not _timed(point.step_time) or point.samples <= 0:
            continue
        kept.append(point)
    return kept


def rank_rate(steps: Sequence[StepPoint]) -> float | None:
    """A rank's steady-state samples/s, or None when no step counts."""
    kept = counted_steps(steps)
    seconds = sum(p.step_time for p in kept)  # type: ignore[misc]
    if not kept or not seconds > 0:
        return None
    return sum(p.samples for p in kept) / seconds


def run_rate(steps_by_rank: Mapping[int, Sequence[StepPoint]]) -> float | None:
    """A run's steady-state samples/s: the sum of its ranks' (None if any rank has none)."""
    rates = [rank_rate(steps) for steps in steps_by_rank.values()]
    if not rates or any(r is None for r in rates):
        return None
    return sum(rates)  # type: ignore[arg-type]


def group_steps(
    points: Iterable[StepPoint], limit: int | None = None
) -> dict[int, list[StepPoint]]:
    """Points by rank, keeping steps numbered up to ``limit`` (all when None)."""
    by_rank: dict[int, list[StepPoint]] = {}
    for point in points:
        if limit is None or point.step <= limit:
            by_rank.setdefault(point.rank, []).append(point)
    return by_rank


def efficiency(rate: float | None, world_size: int, base_rate: float | None) -> float | None:
    """Scaling efficiency: ``rate / (world_size * base_rate)``, where ``base_rate`` is the same
    configuration's samples/s with one rank (1.0 is perfect linear scaling)."""
    if rate is None or base_rate is None or not base_rate > 0 or world_size < 1:
        return None
    return rate / (world_size * base_rate)


#: A figure whose interval reaches further than this from its value, on either side, is
#: unstable: shown marked, and no efficiency is computed from it.
STABLE_SPREAD = 0.10
#: Confidence of the interval around a median (distribution-free, from order statistics).
CONFIDENCE = 0.90
#: A run's own interval: its counted steps cut into windows of at least this many steps...
WINDOW_STEPS = 5
#: ...at least this many windows (fewer: the run is too short to say how steady it was)...
MIN_WINDOWS = 5
#: ...and at most this many.
MAX_WINDOWS = 10
#: An efficiency this far above what the machine can give is not a result (it is noise, or
#: ranks that shared cores with something else while the one-rank figure was taken).
SUPERLINEAR_TOLERANCE = 0.05

#: Where an interval comes from.
FROM_REPEATS = "repeats"
FROM_STEPS = "steps"
#: A single figure with nothing to say how far it may be off.
FROM_NOTHING = "none"


@dataclass(frozen=True)
class Spread:
    """A figure with its interval: ``median`` (the value), ``low`` and ``high`` (the interval),
    ``count`` (repeats, or windows of one run) and ``source`` (one of ``FROM_*``)."""

    median: float
    low: float
    high: float
    count: int
    source: str = FROM_REPEATS

    @property
    def relative(self) -> float:
        """(highest - lowest) / median; 0 for a single measurement."""
        return (self.high - self.low) / self.median if self.median else 0.0

    @property
    def half_width(self) -> float | None:
        """How far the interval reaches from the value, the farther side, as a fraction of the
        value; None when there is no interval (a single figure, or a value of 0)."""
        if self.source == FROM_NOTHING or not self.median > 0:
            return None
        return max(self.high - self.median, self.median - self.low, 0.0) / self.median

    def is_stable(self, threshold: float = STABLE_SPREAD) -> bool:
        """True when the interval exists and reaches no further than ``threshold``."""
        width = self.half_width
        return width is not None and width <= threshold

    @property
    def stable(self) -> bool:
        return self.is_stable()


#: How an unstable figure is marked wherever it is shown (the bench's table, its dashboard
#: and bench.md, ``ddptui compare``).
UNSTABLE = "unstable"


def rate_text(figure: Spread | None) -> str:
    """``1,500 ±4%``; an unstable figure says so (``209 ±37% unstable``); a figure with no
    interval at all says that (``209 no interval unstable``); ``--`` for none."""
    if figure is None:
        return "--"
    text = f"{figure.median:,.0f}"
    width = figure.half_width
    text += " no interval" if width is None else f" ±{width:.0%}"
    return text if figure.stable else f"{text} {UNSTABLE}"


def any_without_interval(figures: Iterable[Spread | None]) -> bool:
    """Whether any of ``figures`` is one run's with no interval of its own (too short)."""
    return any(f is not None and f.source == FROM_NOTHING for f in figures)


def difference_text(figure: Spread | None, base: Spread | None) -> str:
    """How ``figure`` differs from ``base``, and whether that can be acted on: ``+38%``
    where their intervals are apart, ``+17% (intervals overlap)`` where they are not (the
    difference is within what either run swung), ``(no interval)`` where one has none;
    ``--`` without both figures."""
    if figure is None or base is None or not base.median > 0:
        return "--"
    text = f"{figure.median / base.median - 1:+.0%}"
    if figure.half_width is None or base.half_width is None:
        return f"{text} (no interval)"
    if figure.low <= base.high and base.low <= figure.high:
        return f"{text} (intervals overlap)"
    return text


def spread(values: Iterable[float | None]) -> Spread | None:
    """Median and range of the measured (non-None, finite) values; None when there are none."""
    kept = [float(v) for v in values if v is not None and math.isfinite(v)]
    if not kept:
        return None
    return Spread(statistics.median(kept), min(kept), max(kept), len(kept))


def _binomial_cdf(k: int, n: int) -> float:
    """P(X <= k) for X ~ Binomial(n, 1/2)."""
    return sum(math.comb(n, i) for i in range(k + 1)) / 2**n


def median_interval(
    values: Iterable[float | None], confidence: float = CONFIDENCE, source: str = FROM_REPEATS
) -> Spread | None:
    """The median of the measured values and a distribution-free interval for it: the k-th
    smallest and k-th largest values, with the largest k whose coverage is at least
    ``confidence`` (sign test). With fewer than five values no k reaches 90 %: the interval is
    then the whole range (the widest the values allow). One value: no interval
    (``FROM_NOTHING``). None when there are no values."""
    kept = sorted(float(v) for v in values if v is not None and math.isfinite(v))
    n = len(kept)
    if n == 0:
        return None
    if n == 1:
        return Spread(kept[0], kept[0], kept[0], 1, FROM_NOTHING)
    tail = (1.0 - confidence) / 2
    k = 1
    while k < n // 2 and _binomial_cdf(k, n) <= tail:
        k += 1  # the (k+1)-th order statistics still cover ``confidence``
    return Spread(statistics.median(kept), kept[k - 1], kept[n - k], n, source)


def window_rates(steps_by_rank: Mapping[int, Sequence[StepPoint]]) -> list[float]:
    """A run's samples/s in consecutive windows of its counted steps (the same cut on every
    rank, by position among its counted steps; each window's figure is the sum over ranks of
    samples / time, as :func:`run_rate`). Empty when the run is too short for
    ``MIN_WINDOWS`` windows of ``WINDOW_STEPS`` steps, or a rank has no counted step."""
    counted = [counted_steps(steps) for steps in steps_by_rank.values()]
    if not counted:
        return []
    fewest = min(len(c) for c in counted)
    windows = min(MAX_WINDOWS, fewest // WINDOW_STEPS)
    if windows < MIN_WINDOWS:
        return []
    rates = []
    for w in range(windows):
        total = 0.0
        for kept in counted:
            n = len(kept)
            part = kept[w * n // windows : (w + 1) * n // windows]
            seconds = sum(p.step_time for p in part)  # type: ignore[misc]
            if not seconds > 0:
                return []
            total += sum(p.samples for p in part) / seconds
        rates.append(total)
    return rates


def run_interval(steps_by_rank: Mapping[int, Sequence[StepPoint]]) -> Spread | None:
    """A run's steady-state samples/s (:func:`run_rate`) with an interval from its own step
    times: the median interval of its window rates (:func:`window_rates`). A run too short
    for windows gets its figure with no interval (``FROM_NOTHING``, never stable). None when
    the run has no figure."""
    rate = run_rate(steps_by_rank)
    if rate is None:
        return None
    around = median_interval(window_rates(steps_by_rank), source=FROM_STEPS)
    if around is None or around.source == FROM_NOTHING:
        return Spread(rate, rate, rate, 1, FROM_NOTHING)
    # The value stays the ratio of totals; the interval is where the window rates' median lies.
    return Spread(rate, min(around.low, rate), max(around.high, rate), around.count, FROM_STEPS)


def figure(runs: Sequence[Spread]) -> Spread | None:
    """One configuration's figure from its good runs: with two or more, their median and the
    median interval over them (``FROM_REPEATS``); with one, that run's own interval."""
    if not runs:
        return None
    if len(runs) == 1:
        return runs[0]
    return median_interval((r.median for r in runs), source=FROM_REPEATS)


@dataclass(frozen=True)
class Efficiency:
    """A scaling efficiency, or why there is none (``value`` None, ``reason`` says why)."""

    value: float | None
    reason: str = ""


def _pm(s: Spread) -> str:
    width = s.half_width
    return "no interval" if width is None else f"±{width:.0%}"


def efficiency_verdict(
    rate: Spread | None,
    world_size: int | None,
    base: Spread | None,
    *,
    cores: int | None = None,
    threshold: float = STABLE_SPREAD,
) -> Efficiency:
    """The scaling efficiency ``rate / (world_size * base)`` when it means something.

    Refused, with the reason, when either figure is missing or unstable (interval wider than
    ``threshold``), and when it is above what the machine can give: more than linear scaling,
    or, with ``cores`` (ranks on shared CPU cores), more than ``cores / world_size`` once the
    ranks outnumber the cores, by more than ``SUPERLINEAR_TOLERANCE``."""
    if rate is None or not world_size or world_size < 1:
        return Efficiency(None, "not measured")
    if base is None or not base.median > 0:
        return Efficiency(None, "no x1 figure")
    if not rate.is_stable(threshold):
        return Efficiency(None, f"x{world_size} unstable ({_pm(rate)})")
    if not base.is_stable(threshold):
        return Efficiency(None, f"x1 unstable ({_pm(base)})")
    value = rate.median / (world_size * base.median)
    ceiling = 1.0
    if cores is not None and cores > 0 and world_size > cores:
        ceiling = cores / world_size
    if value > ceiling * (1 + SUPERLINEAR_TOLERANCE):
        where = f" on {cores} cores" if cores else ""
        return Efficiency(
            None, f"{value:.0%} is above the {ceiling:.0%} this machine can give{where}: noise"
        )
    return Efficiency(value)


def median(values: Iterable[float | None]) -> float | None:
    summary = spread(values)
    return None if summary is None else summary.median


def peak(values: Iterable[float | None]) -> float | None:
    """The largest known value, or None."""
    kept = [v for v in values if v is not None]
    return max(kept) if kept else None
