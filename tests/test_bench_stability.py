"""How sure the bench is of its figures: every samples/s has an interval (from the repeats, or
from one run's own step times), figures with a wide one are marked unstable, an efficiency is
printed only from two stable figures and never above what the machine can give, and
``--until-stable`` repeats what is unstable. Synthetic step times, no processes."""

from __future__ import annotations

import csv
import dataclasses
import random

import pytest

from ddptui.runs import bench, bench_report, benchmath
from ddptui.runs.benchmath import Spread, StepPoint


def _steps(times, ranks=2, samples=8):
    """Step points of ``ranks`` ranks, each with these step times (step 1 first)."""
    return {
        r: [StepPoint(r, i + 1, 1, samples, t) for i, t in enumerate(times)] for r in range(ranks)
    }


def _tight(n=100, seed=0):
    rng = random.Random(seed)
    return [0.01 * (1 + rng.uniform(-0.02, 0.02)) for _ in range(n)]


def _noisy(n=100, seed=0):
    """A shared machine: each step's time drawn from a wide lognormal."""
    rng = random.Random(seed)
    return [0.01 * rng.lognormvariate(0.0, 0.8) for _ in range(n)]


def _bursty(n=100):
    """Steady steps, then a neighbour takes the cores for a third of the run."""
    return [0.03 if n // 3 <= i < 2 * n // 3 else 0.01 for i in range(n)]


def _pm(value, pm, source="steps"):
    return Spread(value, value * (1 - pm), value * (1 + pm), 8, source)


# -- the interval of one run, from its step times ------------------------------------------------
@pytest.mark.parametrize(
    ("times", "stable", "source"),
    [
        (_tight(), True, "steps"),
        (_tight(40), True, "steps"),
        ([0.01] * 100, True, "steps"),
        (_noisy(), False, "steps"),
        (_noisy(seed=7), False, "steps"),
        (_bursty(), False, "steps"),
        (_tight(20), False, "none"),  # 15 counted steps: too few windows to say anything
    ],
)
def test_a_runs_interval_comes_from_its_own_step_times(times, stable, source):
    figure = benchmath.run_interval(_steps(times))
    assert figure.median == pytest.approx(benchmath.run_rate(_steps(times)))
    assert figure.low <= figure.median <= figure.high
    assert (figure.stable, figure.source) == (stable, source)


def test_window_rates_sum_the_ranks_and_need_enough_steps():
    rates = benchmath.window_rates(_steps([0.01] * 100, ranks=2))
    assert len(rates) == benchmath.MAX_WINDOWS
    assert rates == pytest.approx([2 * 8 / 0.01] * benchmath.MAX_WINDOWS)
    short = benchmath.MIN_WINDOWS * benchmath.WINDOW_STEPS - 1 + benchmath.MIN_WARMUP_STEPS
    assert benchmath.window_rates(_steps([0.01] * short)) == []
    assert benchmath.window_rates({}) == []


# -- the interval over repeats --------------------------------------------------------------------
@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ([], None),
        ([5.0, None], (5.0, 5.0, 5.0, "none")),  # one figure: no interval
        ([10.0, 12.0], (11.0, 10.0, 12.0, "repeats")),  # under five: the whole range
        ([3.0, 1.0, 2.0, float("nan")], (2.0, 1.0, 3.0, "repeats")),
        ([float(v) for v in range(1, 11)], (5.5, 2.0, 9.0, "repeats")),  # 2nd..9th of 10
        ([float(v) for v in range(1, 21)], (10.5, 6.0, 15.0, "repeats")),  # 6th..15th of 20
    ],
)
def test_median_interval_is_distribution_free(values, expected):
    got = benchmath.median_interval(values)
    if expected is None:
        assert got is None
    else:
        assert (got.median, got.low, got.high, got.source) == pytest.approx(expected)


def test_a_single_figure_with_no_interval_is_never_stable():
    only = benchmath.median_interval([100.0])
    assert only.half_width is None and not only.stable


def test_repeats_replace_the_runs_own_intervals():
    one = benchmath.figure([_pm(100.0, 0.5)])
    assert one.source == "steps" and not one.stable
    three = benchmath.figure([_pm(100.0, 0.5), _pm(104.0, 0.5), _pm(98.0, 0.5)])
    assert (three.median, three.low, three.high, three.source) == (100.0, 98.0, 104.0, "repeats")
    assert three.stable
    assert benchmath.figure([]) is None


# -- efficiency only from stable figures, never beyond the machine --------------------------------
@pytest.mark.parametrize(
    ("rate", "world", "base", "cores", "value", "reason"),
    [
        (_pm(1500, 0.02), 2, _pm(1000, 0.02), None, 0.75, ""),
        (_pm(2080, 0.02), 2, _pm(1000, 0.02), None, 1.04, ""),  # within the tolerance
        (_pm(1500, 0.3), 2, _pm(1000, 0.02), None, None, "x2 unstable (±30%)"),
        (_pm(1500, 0.02), 2, _pm(1000, 0.15), None, None, "x1 unstable (±15%)"),
        (_pm(1500, 0.02), 2, _pm(1000, 0.0, "none"), None, None, "x1 unstable (no interval)"),
        (_pm(1500, 0.02), 2, None, None, None, "no x1 figure"),
        (None, 2, _pm(1000, 0.02), None, None, "not measured"),
        # The README's old "836 %": a one-rank figure taken while the machine was busy.
        (_pm(3495, 0.02), 2, _pm(209, 0.02), 2, None, "836% is above the 100% this machine"),
        (_pm(1800, 0.02), 4, _pm(1000, 0.02), 2, 0.45, ""),  # 4 ranks on 2 cores: ≤ 50 %
        (_pm(2400, 0.02), 4, _pm(1000, 0.02), 2, None, "60% is above the 50% this machine"),
        (_pm(2400, 0.02), 4, _pm(1000, 0.02), None, 0.6, ""),  # on GPUs: cores do not bound
    ],
)
def test_efficiency_verdict(rate, world, base, cores, value, reason):
    got = benchmath.efficiency_verdict(rate, world, base, cores=cores)
    assert got.value == (pytest.approx(value) if value is not None else None)
    assert got.reason.startswith(reason) and (got.reason == "") == (value is not None)


# -- the whole bench output from noisy step times -------------------------------------------------
def _planned(ws, amp="bf16"):
    return bench.Planned(ws, "spawn", "gloo", amp, cfg=object())


def _measured(times, ranks):
    figure = benchmath.run_interval(_steps(times, ranks=ranks))
    m = bench.Measurement(bench.Path("/runs/x"), outcome="stopped", steps=len(times))
    m.interval, m.samples_per_s = figure, figure.median
    return m


def test_no_efficiency_is_printed_from_noisy_step_times(tmp_path):
    results = [
        bench.ConfigResult(_planned(1), [_measured(_noisy(seed=3), ranks=1)]),
        bench.ConfigResult(_planned(2), [_measured(_tight(), ranks=2)]),
        bench.ConfigResult(_planned(1, "off"), [_measured(_tight(seed=1), ranks=1)]),
        bench.ConfigResult(_planned(2, "off"), [_measured(_noisy(seed=4), ranks=2)]),
    ]
    rows = {r.planned.label: r for r in bench.build_rows(results, cores=2)}
    noisy_one, two = rows["x1 spawn gloo amp bf16"], rows["x2 spawn gloo amp bf16"]
    assert not noisy_one.stable and two.stable
    assert two.efficiency is None and two.efficiency_note.startswith("x1 unstable (±")
    assert rows["x2 spawn gloo amp off"].efficiency_note.startswith("x2 unstable (±")
    assert all(r.efficiency is None for r in rows.values() if r.planned.world_size == 2)

    table = "\n".join(bench_report.format_table(list(rows.values())))
    line = next(ln for ln in table.splitlines() if ln.startswith("x2 spawn gloo amp bf16"))
    assert "-- (x1 unstable (±" in line
    x1 = next(ln for ln in table.splitlines() if ln.startswith("x1 spawn gloo amp bf16"))
    assert "unstable" in x1

    csv_rows = {
        r["configuration"]: r
        for r in csv.DictReader(bench_report.csv_text(rows.values()).splitlines())
    }
    assert csv_rows["x1 spawn gloo amp bf16"]["stable"] == "false"
    assert float(csv_rows["x1 spawn gloo amp bf16"]["spread_pct"]) > 10
    assert csv_rows["x2 spawn gloo amp bf16"]["stable"] == "true"
    assert csv_rows["x2 spawn gloo amp bf16"]["efficiency"] == ""
    assert csv_rows["x2 spawn gloo amp bf16"]["efficiency_note"].startswith("x1 unstable")

    md = bench_report.markdown_text(list(rows.values()), "ddptui bench", ["about"])
    md_rows = [
        ln.split(" | ")
        for ln in md.splitlines()
        if ln.startswith("| **x2") or ln.startswith("| x2")
    ]
    assert len(md_rows) == 2 and all(cells[2].strip("*").startswith("-- (") for cells in md_rows)


@pytest.mark.parametrize(
    ("figure", "base", "text"),
    [
        (_pm(1380, 0.05), _pm(1000, 0.05), "+38%"),  # 1,311-1,449 against 950-1,050
        (_pm(1170, 0.1), _pm(1000, 0.1), "+17% (intervals overlap)"),  # 1,053 against 1,100
        (_pm(800, 0.02), _pm(1000, 0.02), "-20%"),
        (Spread(1200, 1200, 1200, 1, "none"), _pm(1000, 0.02), "+20% (no interval)"),
        (_pm(1000, 0.02), Spread(0, 0, 0, 1, "steps"), "--"),
        (None, _pm(1000, 0.02), "--"),
    ],
)
def test_a_difference_says_whether_the_intervals_are_apart(figure, base, text):
    assert benchmath.difference_text(figure, base) == text


def test_the_steps_a_run_needs_for_its_own_interval_are_the_ones_it_needs():
    need = benchmath.steps_for_interval()
    assert need == 32  # 25 counted after a warm-up of 7
    assert benchmath.run_interval(_steps(_tight(need))).source == "steps"
    assert benchmath.run_interval(_steps(_tight(need - 1))).source == "none"


def test_a_figure_with_no_interval_says_how_to_get_one_and_one_with_an_interval_does_not():
    short = [bench.ConfigResult(_planned(1), [_measured(_tight(30), ranks=1)])]
    rows = bench.build_rows(short, cores=2)
    assert "no interval" in bench_report.table_cells(rows[0])[1]
    note = "(--steps 32 or more) or --repeat 2 or more"
    table = bench_report.format_table(rows)
    assert table[-1].startswith("no interval: a single run's own takes at least 32 steps a rank")
    assert table[-1].endswith(note)
    md = bench_report.markdown_text(rows, "ddptui bench", ["about"])
    line = next(line for line in md.splitlines() if line.startswith("no interval: "))
    assert f"\n\n{line}\n" in md and line.endswith(note)  # a paragraph of its own

    longer = [bench.ConfigResult(_planned(1), [_measured(_tight(32), ranks=1)])]
    rows = bench.build_rows(longer, cores=2)
    assert "no interval" not in "\n".join(bench_report.format_table(rows))
    assert "no interval" not in bench_report.markdown_text(rows, "ddptui bench", ["about"])


# -- --until-stable -------------------------------------------------------------------------------
def _runner(tmp_path, until_stable):
    plan = (_planned(1), _planned(2))
    opts = bench.BenchOptions(plan, tmp_path, 50, None, 1, "synthetic", "", until_stable)
    return bench.BenchRunner(opts)


def _drive(runner, figures, seconds_per_run=10.0):
    """Run the jobs with fake measurements (``figures[label]`` yields each run's figure)."""
    now = [0.0]
    done = []
    for res, repeat in runner.jobs(clock=lambda: now[0]):
        figure = next(figures[res.planned.label])
        m = bench.Measurement(bench.Path("/runs/x"), outcome="stopped", steps=50)
        m.interval, m.samples_per_s = figure, figure.median
        res.runs.append(m)
        done.append((res.planned.label, repeat))
        now[0] += seconds_per_run
    return done


def test_until_stable_repeats_only_the_unstable_until_it_is_stable(tmp_path):
    figures = {
        "x1 spawn gloo amp bf16": iter([_pm(1000, 0.02)]),
        "x2 spawn gloo amp bf16": iter([_pm(1500, 0.4), _pm(1520, 0.4), _pm(1490, 0.4)]),
    }
    done = _drive(_runner(tmp_path, 600.0), figures)
    assert done == [
        ("x1 spawn gloo amp bf16", 0),
        ("x2 spawn gloo amp bf16", 0),
        ("x2 spawn gloo amp bf16", 1),  # two repeats at 1500 and 1520: ±0.7 %, stable
    ]


def test_until_stable_stops_when_its_time_is_spent(tmp_path):
    swinging = iter([_pm(v, 0.4) for v in [500.0, 1500.0] * 50])
    figures = {
        "x1 spawn gloo amp bf16": iter([_pm(1000, 0.02)]),
        "x2 spawn gloo amp bf16": swinging,
    }
    done = _drive(_runner(tmp_path, 100.0), figures)
    extra = done[2:]
    assert len(extra) == 10 and {label for label, _ in extra} == {"x2 spawn gloo amp bf16"}
    assert [r for _, r in extra] == list(range(1, 11))


def test_without_until_stable_only_the_planned_runs(tmp_path):
    figures = {
        "x1 spawn gloo amp bf16": iter([_pm(1000, 0.5)]),
        "x2 spawn gloo amp bf16": iter([_pm(1500, 0.5)]),
    }
    assert len(_drive(_runner(tmp_path, None), figures)) == 2


@dataclasses.dataclass(frozen=True)
class _Cfg:
    run_dir: str = ""
    run_id: str = ""


def test_extra_repeats_get_their_own_run_directories(tmp_path, monkeypatch):
    runner = _runner(tmp_path, 60.0)
    names = []

    def fake_measure(cfg, steps, *, result, **kwargs):
        names.append(bench.Path(cfg.run_dir).name)
        return result

    monkeypatch.setattr(bench, "measure", fake_measure)
    res = runner.results[0]
    res.planned = dataclasses.replace(res.planned, cfg=_Cfg())
    runner.run_config(res, 0)
    runner.run_config(res, 1)
    assert names == ["01-w1-spawn-gloo-bf16", "01-w1-spawn-gloo-bf16-r2"]
