"""How fast this machine runs Python today: a fixed workload, timed beside a benchmark's runs.

The dashboard benchmarks measure CPU seconds of one process, and the same code read 9.3-9.7 %
(``bench_tui.py``) and 20.7-20.9 % (``bench_scale.py``) one day and 4.4-5.3 % and 9.5-11.2 %
two days later on a fresh machine of the same kind: the machine's day, not the code. This
workload does the kind of work the dashboard does per event (dict reads and writes, float
arithmetic, attribute stores, short lists, formatting), none of it ddptui's code, so that it
does not change when ddptui does: its time beside a figure says which day the figure comes
from, and two figures are comparable only with it. Best of several rounds (the least
disturbed), in milliseconds; smaller is faster.
"""

from __future__ import annotations

import time

#: Rounds per reading (the best is kept) and items per round (about 10 ms a round here).
ROUNDS = 7
ITEMS = 20_000


class _Row:
    __slots__ = ("count", "last", "total")

    def __init__(self) -> None:
        self.count, self.last, self.total = 0, 0.0, 0.0


def _workload(items: int = ITEMS) -> int:
    rows: dict[int, _Row] = {}
    recent: list[float] = []
    for i in range(items):
        key = (i * 7919) % 256
        row = rows.get(key)
        if row is None:
            row = rows[key] = _Row()
        value = (i % 97) * 0.013 + 0.5
        row.count += 1
        row.last = value
        row.total += value / (1.0 + key)
        recent.append(value)
        if len(recent) > 30:
            del recent[0]
    cells = [f"{r.count:,} {r.last:.3f} {r.total:.2f}" for r in rows.values()]
    return sum(map(len, sorted(cells)))


def reference_ms(rounds: int = ROUNDS) -> float:
    """The fixed workload's best time of ``rounds``, in milliseconds."""
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        _workload()
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


def line(readings: list[float]) -> str:
    """The readings taken beside a benchmark's runs, as one line."""
    if not readings:
        return ""
    low, high = min(readings), max(readings)
    span = f"{low:.1f}" if round(low, 1) == round(high, 1) else f"{low:.1f}-{high:.1f}"
    return (
        f"  this machine's day: a fixed Python workload (benchmarks/machine_ref.py) {span} ms "
        "(smaller is faster; compare figures across days only beside it)"
    )


if __name__ == "__main__":
    print(f"fixed Python workload: {reference_ms():.2f} ms (best of {ROUNDS})")
