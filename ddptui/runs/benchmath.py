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


@dataclass(frozen=True)
class Spread:
    """Median, lowest and highest of repeated measurements."""

    median: float
    low: float
    high: float
    count: int

    @property
    def relative(self) -> float:
        """(highest - lowest) / median; 0 for a single measurement."""
        return (self.high - self.low) / self.median if self.median else 0.0


def spread(values: Iterable[float | None]) -> Spread | None:
    """Median and range of the measured (non-None, finite) values; None when there are none."""
    kept = [float(v) for v in values if v is not None and math.isfinite(v)]
    if not kept:
        return None
    return Spread(statistics.median(kept), min(kept), max(kept), len(kept))


def median(values: Iterable[float | None]) -> float | None:
    summary = spread(values)
    return None if summary is None else summary.median


def peak(values: Iterable[float | None]) -> float | None:
    """The largest known value, or None."""
    kept = [v for v in values if v is not None]
    return max(kept) if kept else None
