"""``ddptui bench``: the figures (warm-up excluded, efficiency), the matrix (skipped
configurations explained, never attempted), the outputs, and one real bench on CPU."""

from __future__ import annotations

import csv
import threading
from pathlib import Path

import pytest

from ddptui.run.machine import Machine
from ddptui.run.state import RunState
from ddptui.runs import bench, bench_report, benchmath
from ddptui.runs.benchmath import StepPoint

NO_CUDA = Machine(0, "no CUDA here (test)", 8)
TWO_GPUS = Machine(2, "", 32)


# -- the figures ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("steps", "warmup"),
    [(0, 0), (1, 1), (4, 4), (5, 5), (10, 5), (25, 5), (26, 6), (60, 12), (100, 20), (101, 21)],
)
def test_warmup_is_the_first_fifth_but_at_least_five_steps(steps, warmup):
    assert benchmath.warmup_count(steps) == warmup


def _rank(rank, n, fast=0.01, slow=1.0, samples=32, epoch_len=None):
    """n steps: the warm-up ones take ``slow`` seconds, the rest ``fast``; the first step has
    no step time (there is no step before it)."""
    warm = benchmath.warmup_count(n)
    points = []
    for i in range(n):
        epoch = 1 + i // epoch_len if epoch_len else 1
        step_time = None if i == 0 else (slow if i < warm else fast)
        points.append(StepPoint(rank, i + 1, epoch, samples, step_time))
    return points


def test_warmup_steps_are_excluded_from_samples_per_s():
    steps = _rank(0, 60, fast=0.01, slow=5.0)
    assert benchmath.rank_rate(steps) == pytest.approx(32 / 0.01)
    kept = benchmath.counted_steps(steps)
    assert [p.step for p in kept] == list(range(13, 61))  # the first 12 are warm-up


def test_first_step_of_each_later_epoch_is_excluded():
    # 3 epochs of 20 steps; each epoch's first step includes the previous evaluation (9 s).
    steps = [
        StepPoint(0, p.step, p.epoch, p.samples, 9.0 if p.step in (21, 41) else p.step_time)
        for p in _rank(0, 60, fast=0.02, slow=0.02, epoch_len=20)
    ]
    assert benchmath.rank_rate(steps) == pytest.approx(32 / 0.02)
    assert {21, 41}.isdisjoint(p.step for p in benchmath.counted_steps(steps))


def test_rate_is_a_ratio_of_totals_not_a_mean_of_rates():
    # After 5 warm-up steps: one step of 1 s and one of 3 s, 10 samples each: 20 / 4 s.
    steps = [StepPoint(0, i, 1, 10, 0.5) for i in range(1, 6)]
    steps += [StepPoint(0, 6, 1, 10, 1.0), StepPoint(0, 7, 1, 10, 3.0)]
    assert benchmath.rank_rate(steps) == pytest.approx(5.0)


def test_steps_without_a_usable_time_do_not_count():
    steps = [StepPoint(0, i, 1, 10, 0.1) for i in range(1, 8)]
    steps += [StepPoint(0, 8, 1, 10, None), StepPoint(0, 9, 1, 10, 0.0)]
    steps += [StepPoint(0, 10, 1, 10, float("nan")), StepPoint(0, 11, 1, 10, float("inf"))]
    assert benchmath.rank_rate(steps) == pytest.approx(100.0)
    assert benchmath.rank_rate(steps[:5]) is None  # nothing left after the warm-up


def test_run_rate_sums_the_ranks_and_needs_every_rank():
    by_rank = {0: _rank(0, 40, fast=0.01), 1: _rank(1, 40, fast=0.02)}
    assert benchmath.run_rate(by_rank) == pytest.approx(3200 + 1600)
    assert benchmath.run_rate({**by_rank, 2: _rank(2, 3)}) is None
    assert benchmath.run_rate({}) is None


def test_group_steps_keeps_steps_up_to_the_limit():
    points = _rank(0, 10) + _rank(1, 12)
    grouped = benchmath.group_steps(points, limit=8)
    assert {r: len(v) for r, v in grouped.items()} == {0: 8, 1: 8}


@pytest.mark.parametrize(
    ("rate", "world", "base", "expected"),
    [
        (100.0, 1, 100.0, 1.0),
        (150.0, 2, 100.0, 0.75),
        (400.0, 4, 100.0, 1.0),
        (90.0, 4, 100.0, 0.225),
        (None, 2, 100.0, None),
        (150.0, 2, None, None),
        (150.0, 2, 0.0, None),
    ],
)
def test_efficiency_is_rate_over_world_size_times_base(rate, world, base, expected):
    result = benchmath.efficiency(rate, world, base)
    assert result == (pytest.approx(expected) if expected is not None else None)


def test_spread_of_repeats():
    s = benchmath.spread([120.0, None, 100.0, 110.0])
    assert (s.median, s.low, s.high, s.count) == (110.0, 100.0, 120.0, 3)
    assert s.relative == pytest.approx(20 / 110)
    assert benchmath.spread([None, float("nan")]) is None


# -- rows, table, CSV ------------------------------------------------------------------------------
def _planned(ws, amp="off", backend="gloo", launcher="spawn", skip=None):
    return bench.Planned(ws, launcher, backend, amp, cfg=None if skip else object(), skip=skip)


def _m(rate, ttfs=2.0, rss=(100, 110), outcome="stopped", problem=None, accuracy=None, pm=0.02):
    """A run measured at ``rate`` samples/s, its own interval ±``pm`` (None: no interval)."""
    mib = bench_report.MiB
    interval = None
    if rate is not None and pm is not None:
        interval = benchmath.Spread(rate, rate * (1 - pm), rate * (1 + pm), 8, "steps")
    return bench.Measurement(
        Path(f"/runs/{rate}"),
        outcome=outcome,
        samples_per_s=rate,
        time_to_first_step=ttfs,
        rss={i: v * mib for i, v in enumerate(rss)},
        accuracy=accuracy,
        steps=60,
        problem=problem,
        interval=interval,
    )


def _results():
    return [
        bench.ConfigResult(_planned(1), [_m(1000.0, rss=(100,))]),
        bench.ConfigResult(_planned(2), [_m(1500.0)]),
        bench.ConfigResult(_planned(1, "bf16"), [_m(500.0, rss=(90,))]),
        bench.ConfigResult(_planned(2, "bf16"), [_m(900.0, ttfs=3.0), _m(880.0), _m(920.0)]),
        bench.ConfigResult(_planned(1, backend="nccl", skip="backend nccl needs a CUDA GPU")),
        bench.ConfigResult(_planned(4), [_m(None, outcome="failed", problem="failed: rank 3")]),
    ]


def test_rows_efficiency_against_the_same_options_at_world_size_one():
    rows = bench.build_rows(_results())
    by_label = {r.planned.label: r for r in rows}
    assert by_label["x1 spawn gloo amp off"].efficiency == pytest.approx(1.0)
    assert by_label["x2 spawn gloo amp off"].efficiency == pytest.approx(0.75)
    bf16 = by_label["x2 spawn gloo amp bf16"]
    assert bf16.rate.median == 900.0 and (bf16.rate.low, bf16.rate.high) == (880.0, 920.0)
    assert bf16.rate.source == "repeats" and bf16.stable
    assert bf16.efficiency == pytest.approx(900 / (2 * 500))
    assert bf16.time_to_first_step == 2.0  # median of 3.0, 2.0, 2.0
    assert [r.planned.label for r in rows if r.fastest] == ["x2 spawn gloo amp off"]
    assert by_label["x1 spawn nccl amp off"].status == "skipped"
    failed = by_label["x4 spawn gloo amp off"]
    assert failed.status == "failed" and failed.reason == "failed: rank 3"
    assert failed.efficiency is None


def test_table_marks_the_fastest_and_explains_the_rest():
    lines = bench_report.format_table(bench.build_rows(_results()))
    table = "\n".join(lines)
    assert lines[0].split()[:2] == ["configuration", "samples/s"]
    measured = [ln for ln in lines if ln.startswith("x") and "spawn" in ln]
    assert len(measured) == 4
    assert next(ln for ln in measured if ln.startswith("x2 spawn gloo amp off *"))
    assert "900 ±2%" in table  # median of repeats, and their range
    assert "1,500 ±2%" in table  # one run: its own interval
    assert "75%" in table and "unstable" not in table
    assert "x1 spawn nccl amp off: skipped: backend nccl needs a CUDA GPU" in table
    assert "x4 spawn gloo amp off: failed: failed: rank 3" in table


def test_csv_has_one_row_per_configuration():
    text = bench_report.csv_text(bench.build_rows(_results()))
    rows = list(csv.DictReader(text.splitlines()))
    assert len(rows) == 6
    assert tuple(rows[0]) == bench_report.CSV_COLUMNS
    two = next(r for r in rows if r["configuration"] == "x2 spawn gloo amp off")
    assert (two["samples_per_s"], two["efficiency"], two["time_to_first_step_s"]) == (
        "1500.0",
        "0.750",
        "2.000",
    )
    assert (two["spread_pct"], two["stable"], two["interval_from"]) == ("2.0", "true", "steps")
    assert two["peak_rss_mib_per_rank"] == "100 110" and two["fastest"] == "yes"
    skipped = next(r for r in rows if r["status"] == "skipped")
    assert skipped["samples_per_s"] == "" and "nccl" in skipped["reason"]


# -- planning ------------------------------------------------------------------------------------
def _args(argv):
    import argparse

    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    args = parser.parse_args(argv)
    args.script_args = ()
    return args


def test_plan_skips_what_cannot_run_here(tmp_path):
    argv = ["--world-size", "1,2", "--amp", "off,bf16,fp16", "--backend", "gloo,nccl,auto"]
    argv += ["--launcher", "spawn,dp", "--bench-dir", str(tmp_path / "b")]
    opts = bench.plan_bench(_args(argv), NO_CUDA)
    runnable = [p.label for p in opts.plan if p.cfg is not None]
    assert runnable == [
        "x1 spawn gloo amp off",
        "x2 spawn gloo amp off",
        "x1 spawn gloo amp bf16",
        "x2 spawn gloo amp bf16",
    ]  # auto is gloo here: not run twice
    skipped = {p.label: p.skip for p in opts.plan if p.skip}
    assert skipped["x1 spawn nccl amp off"].startswith("backend nccl needs a CUDA GPU")
    assert skipped["x2 spawn gloo amp fp16"].startswith("AMP fp16 needs a CUDA GPU")
    assert skipped["x- dp - amp off"].startswith("DataParallel baseline needs more than one GPU")
    assert len(opts.plan) == 4 + 2 * 3 + 2 * 2 + 3  # nccl, fp16 rows and dp per AMP mode
    assert opts.steps == bench.DEFAULT_STEPS and opts.repeat == 1
    assert not (tmp_path / "b").exists()  # planning writes nothing


def test_plan_with_gpus_defaults_and_dp(tmp_path):
    opts = bench.plan_bench(_args(["--bench-dir", str(tmp_path), "--launcher", "dp"]), TWO_GPUS)
    (dp,) = opts.plan
    assert dp.world_size == 2 and "no single-process DataParallel mode" in dp.skip
    assert bench.default_world_sizes(0) == [1, 2]
    assert bench.default_world_sizes(8) == [1, 2, 4, 8]
    assert bench.default_world_sizes(6) == [1, 2, 4, 6]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--amp", "int8"], "unknown amp 'int8'"),
        (["--backend", "gloo,mpi"], "unknown backend 'mpi'"),
        (["--launcher", "slurm"], "unknown launcher 'slurm'"),
        (["--world-size", "1,zero"], "--world-size must be a whole number"),
        (["--world-size", "0"], "--world-size must be at least 1"),
        (["--world-size", ","], "--world-size needs at least one value"),
        (["--repeat", "0"], "--repeat must be at least 1"),
        (["--repeat", "1000"], "--repeat must be at most 100"),
        (["--until-stable", "0"], "--until-stable must be at least 1"),
        (["--until-stable", "soon"], "--until-stable must be a whole number"),
        (["--until-stable", "99999999"], "--until-stable must be at most 604800"),
        (["--steps", "1e400"], "--steps must be a whole number"),
        (["--steps", "5", "--epochs", "2"], "not allowed with argument"),
        (["--trainer", "nope"], "unknown trainer 'nope'"),
        (["--script", "/no/such.py"], "script not found: /no/such.py"),
        (["--script", "x.py", "--amp", "off,bf16"], "--amp is for the built-in trainers"),
        (["--module", "no_such_module_here"], "no_such_module_here"),
        (["--module", "x", "--script", "x.py"], "give one of them"),
        (["--module", "x", "--lr", "0.1"], "--lr is for the built-in trainers"),
        (["--lr", "fast"], "--lr must be a number"),
    ],
)
def test_bad_input_one_line_exit_2(argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert bench_report.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("ddptui: error: ")
    assert message in err
    assert not (tmp_path / "runs").exists()


def test_a_bench_of_the_users_module_runs_it_as_python_m(tmp_path, monkeypatch):
    """``ddptui bench --module NAME``, as a run takes it: each configuration runs the
    module found from the current directory, its arguments after ``--``."""
    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "train.py").write_text("print('training')\n")
    monkeypatch.chdir(tmp_path)
    argv = ["--bench-dir", str(tmp_path / "b"), "--module", "mypkg.train", "--world-size", "1,2"]
    args = _args(argv)
    args.script_args = ("--lr", "3")  # what ddptui passes on after --
    opts = bench.plan_bench(args, NO_CUDA)
    assert [p.cfg.script_module for p in opts.plan] == ["mypkg.train"] * 2
    assert all(p.cfg.script == str(pkg / "train.py") for p in opts.plan)
    assert opts.plan[0].cfg.script_args == ("--lr", "3")
    assert "mypkg.train" in opts.target


def test_an_existing_bench_is_not_overwritten(tmp_path, capsys):
    (tmp_path / "bench.csv").write_text("x")
    assert bench_report.main(["--bench-dir", str(tmp_path)]) == 2
    assert "already holds a bench" in capsys.readouterr().err


# -- measuring, without processes ----------------------------------------------------------------
class FakeSession:
    """Ranks that log one step per pump; records how it was stopped and closed."""

    def __init__(self, cfg, world=2, ends_after=None):
        self.cfg = cfg
        self.state = RunState(cfg.run_id, world)
        self.state.started_at = 0.0
        self.result = None
        self.fault = None
        self.calls = []
        self.ends_after = ends_after
        self._lock = threading.RLock()
        self._step = 0

    def start(self):
        self.calls.append("start")
        Path(self.cfg.run_dir).mkdir(parents=True, exist_ok=True)

    def pump(self, timeout):
        from ddptui import protocol

        self._step += 1
        with open(Path(self.cfg.run_dir) / "events.jsonl", "ab") as f:
            for rank in self.state.ranks:
                event = protocol.Step(
                    run=self.cfg.run_id,
                    rank=rank,
                    t=float(self._step),
                    seq=self._step,
                    step=self._step,
                    epoch=1,
                    samples=8,
                    step_time=0.01,
                )
                f.write(protocol.to_json(event) + b"\n")
                self.state.apply(event, float(self._step))

    def poll(self):
        if self.ends_after is not None and self._step >= self.ends_after and not self.result:
            self.result = "done"
            self.state.set_outcome("finished")
        return self.result

    def stop(self, interrupted=False, exit_code=None):
        self.calls.append("stop-interrupted" if interrupted else "stop")
        self.result = "stopped"
        self.state.set_outcome("interrupted" if interrupted else "stopped")
        return self.result

    def close(self):
        self.calls.append("close")

    def locked(self):
        return self._lock


class FakeSampler:
    def __init__(self, callback):
        self.calls = []

    def start(self):
        self.calls.append("start")

    def set_pids(self, pids):
        pass

    def stop(self):
        self.calls.append("stop")


def _cfg(tmp_path):
    from types import SimpleNamespace

    return SimpleNamespace(run_dir=str(tmp_path), run_id="fake")


def test_measure_stops_the_run_once_every_rank_logged_n_steps(tmp_path):
    sessions = []

    def factory(cfg):
        sessions.append(FakeSession(cfg))
        return sessions[-1]

    m = bench.measure(_cfg(tmp_path), 7, session_factory=factory, sampler_factory=FakeSampler)
    (session,) = sessions
    assert session.calls == ["start", "stop", "close"]
    assert session._step == 7 and m.outcome == "stopped"
    assert m.time_to_first_step == 1.0
    assert m.ok and m.steps == 7
    assert m.samples_per_s == pytest.approx(2 * 8 / 0.01)  # steps 6 and 7 of each rank


def test_measure_tears_down_on_any_error(tmp_path):
    sessions = []

    def factory(cfg):
        sessions.append(FakeSession(cfg))
        return sessions[-1]

    def boom(state):
        if state.ranks[0].step == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        bench.measure(
            _cfg(tmp_path),
            50,
            session_factory=factory,
            sampler_factory=FakeSampler,
            on_progress=boom,
        )
    assert sessions[0].calls == ["start", "stop-interrupted", "close"]


def test_a_run_that_ends_before_n_steps_says_so(tmp_path):
    m = bench.measure(
        _cfg(tmp_path),
        50,
        session_factory=lambda cfg: FakeSession(cfg, ends_after=20),
        sampler_factory=FakeSampler,
    )
    assert m.outcome == "finished" and m.ok
    assert m.note == "ended after 20 of 50 steps"
    assert m.samples_per_s == pytest.approx(1600)


def test_too_few_steps_to_measure_is_a_problem(tmp_path):
    m = bench.measure(
        _cfg(tmp_path),
        4,
        session_factory=lambda cfg: FakeSession(cfg),
        sampler_factory=FakeSampler,
    )
    assert not m.ok and m.problem.startswith("too few steps to measure (4;")


def test_peak_tracker_takes_rank_trees_and_gpu_memory():
    from ddptui.monitor import RankInfo
    from tests.tui_fixtures.fakes import RANK_PIDS, UUID_0, UUID_1, gpu_snapshots

    tracker = bench.PeakTracker()
    tracker.take(gpu_snapshots(1)[0])  # no ranks known yet: nothing recorded
    assert tracker.rss == {}
    tracker.set_ranks({0: RankInfo(RANK_PIDS[0], UUID_0), 1: RankInfo(RANK_PIDS[1], UUID_1)})
    for snap in gpu_snapshots(3):
        tracker.take(snap)
    gib = 1024**3
    assert tracker.rss == {0: 3 * gib + gib // 2, 1: 3 * gib}  # rank 0's tree has a worker
    assert tracker.gpu == {0: 9 * gib, 1: 9 * gib}  # the foreign process is not rank 1's


# -- one real bench ------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_bench_on_cpu_measures_two_configurations_and_skips_the_rest(tmp_path, monkeypatch, capsys):
    from tests.helpers import processes_of_run

    monkeypatch.setattr(Machine, "detect", classmethod(lambda cls: NO_CUDA))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.chdir(tmp_path)
    # Two measured runs (x1, x2) and six skipped: bf16 on CPU is measured by the trainers'
    # tests; here it only cost the suite seconds of a loaded machine (20-48 s for four runs).
    argv = ["--no-ui", "--world-size", "1,2", "--amp", "off,fp16"]
    argv += ["--backend", "gloo,nccl", "--steps", "30", "--bench-dir", "b"]
    code = bench_report.main(argv)
    out = capsys.readouterr().out
    assert code == 0, out
    table = out[out.index("configuration") :]
    measured = [ln for ln in table.splitlines() if ln.startswith("x") and "spawn gloo" in ln]
    assert len(measured) == 2, table
    assert sum(ln.endswith("*") or " * " in ln for ln in measured) == 1
    assert table.count(": skipped: backend nccl needs a CUDA GPU") == 4
    assert table.count(": skipped: AMP fp16 needs a CUDA GPU") == 2
    with open(tmp_path / "b" / "bench.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 8
    for column in ("samples_per_s", "efficiency", "time_to_first_step_s"):
        assert column in rows[0]
    done = [r for r in rows if r["status"] == "measured"]
    assert len(done) == 2
    for row in done:
        assert float(row["samples_per_s"]) > 0 and float(row["time_to_first_step_s"]) > 0
        assert row["steps_per_rank"] == "30" and row["stable"] in ("true", "false")
        # An efficiency is there only from stable figures (this machine may be busy).
        assert float(row["efficiency"]) > 0 if row["efficiency"] else row["efficiency_note"]
        assert float(row["peak_rss_mib_max"]) > 10
        run_dir = Path(row["run_dirs"])
        assert (run_dir / "summary.json").is_file()
    table = (tmp_path / "b" / "bench.md").read_text()
    for label in ("x1 spawn gloo amp off", "x2 spawn gloo amp off"):
        assert f"| {label} |" in table or f"| **{label}** \\* |" in table  # bold: the fastest
    assert table.count("\\* |") == 1
    for run_dir in (tmp_path / "b").iterdir():
        if run_dir.is_dir():
            assert not processes_of_run(f"b-{run_dir.name}")


def test_run_reports_usage_errors_itself_when_wired_into_another_parser(capsys):
    assert bench_report.run(_args(["--no-ui", "--repeat", "1000"])) == 2
    assert capsys.readouterr().err == "ddptui: error: --repeat must be at most 100, got 1000\n"


def test_markdown_marks_the_fastest_and_lists_the_rest():
    text = bench_report.markdown_text(bench.build_rows(_results()), "ddptui bench", ["about"])
    assert "| **x2 spawn gloo amp off** \\* | **1,500 ±2%** | **75%** |" in text
    assert "- x1 spawn nccl amp off: skipped: backend nccl needs a CUDA GPU" in text
