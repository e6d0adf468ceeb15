"""The dashboard's chart series at scale: what one :func:`ddptui.tui.model.chart_data` costs
once every rank's series is full (a long run), and what that is as a share of one core at
the rate the run screen builds it (every 2 s while events arrive).

``bench_scale.py`` runs 20 s windows, in which each rank's series holds a few hundred points;
a run of an hour holds :data:`ddptui.run.state.SERIES_LENGTH` per rank, and a cost that grows
with ranks x points shows only here. Measured in one process, no dashboard: the state is
filled through :meth:`RunState.apply` (as the dashboard's pump does), then the call is timed
``--repeat`` times (median and range printed), with and without the ranks' own loss lines
(the loss chart's per-rank mode, ``m``).

Prints numbers; it is not a test. Usage::

    python benchmarks/bench_charts.py                    # 256 ranks x 2,000 steps
    python benchmarks/bench_charts.py --ranks 8 --steps 500
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_scale import simulated_step  # noqa: E402

from ddptui import protocol  # noqa: E402
from ddptui.run.state import SERIES_LENGTH, RunState  # noqa: E402
from ddptui.tui.model import chart_data  # noqa: E402

#: The run screen builds the chart series at most this often (``RunScreen.chart_hz`` 0.5:
#: every other chart tick, each tick at twice that rate).
BUILDS_PER_S = 0.5


def filled_state(ranks: int, steps: int) -> tuple[RunState, float]:
    """A state with ``steps`` steps of every rank applied; the seconds the applying took."""
    state = RunState("bench", ranks)
    began = time.perf_counter()
    for step in range(1, steps + 1):
        for rank in range(ranks):
            fields = simulated_step(rank, step, 0.1)
            event = protocol.Step(run="bench", rank=rank, t=step * 0.1, seq=step - 1, **fields)
            state.apply(event, now=step * 0.1)
    return state, time.perf_counter() - began


def time_calls(state: RunState, per_rank: bool, repeat: int) -> list[float]:
    times = []
    for _ in range(repeat):
        began = time.perf_counter()
        chart_data(state, per_rank=per_rank)
        times.append(time.perf_counter() - began)
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=256)
    parser.add_argument("--steps", type=int, default=SERIES_LENGTH, help="steps per rank")
    parser.add_argument("--repeat", type=int, default=9)
    args = parser.parse_args(argv)
    if not (1 <= args.ranks <= 4096 and 1 <= args.steps <= 100_000 and 1 <= args.repeat <= 1000):
        parser.error("--ranks 1..4096, --steps 1..100000, --repeat 1..1000")
    state, applying = filled_state(args.ranks, args.steps)
    events = args.ranks * args.steps
    print(
        f"chart series: {args.ranks} ranks x {args.steps} steps "
        f"({min(args.steps, SERIES_LENGTH)} kept per rank); applying {events:,} step events "
        f"took {applying:.1f} s ({1e6 * applying / events:.1f} us each)"
    )
    for per_rank, label in ((False, "mean line (default)"), (True, "per-rank lines (m)")):
        times = time_calls(state, per_rank, args.repeat)
        median = statistics.median(times)
        print(
            f"  chart_data, {label}: median {1e3 * median:.1f} ms "
            f"[{1e3 * min(times):.1f}, {1e3 * max(times):.1f}] over {args.repeat} calls, "
            f"{100 * median * BUILDS_PER_S:.2f} % of one core at {BUILDS_PER_S:g} builds/s"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
