"""``ddptui export``: CSV rows match events.jsonl; TensorBoard scalars read back with
tensorboard's own reader (when the optional extra is installed)."""

from __future__ import annotations

import csv
import json
import shutil
import sys
from collections import Counter

import pytest

from ddptui import protocol
from ddptui.runs import export
from tests.data_fixtures.record import RUNS
from tests.tui_fixtures.fakes import FAILED_RUN

RUN = RUNS / "amp-off"


def _kinds(run_dir) -> Counter:
    lines = (run_dir / "events.jsonl").read_text().splitlines()
    return Counter(json.loads(line)["kind"] for line in lines if line.strip())


def _read_csv(path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize("run_dir", [RUN, FAILED_RUN])
def test_csv_has_one_row_per_step_and_eval_event(run_dir, tmp_path, capsys):
    target = tmp_path / "out.csv"
    assert export.main([str(run_dir), "--csv", str(target)]) == 0
    rows = _read_csv(target)
    kinds = _kinds(run_dir)
    assert Counter(r["kind"] for r in rows) == +Counter(step=kinds["step"], eval=kinds["eval"])
    assert f"{kinds['step'] + kinds['eval']} rows" in capsys.readouterr().out
    assert tuple(rows[0]) == export.CSV_COLUMNS


def test_csv_values_round_trip(tmp_path):
    target = tmp_path / "out.csv"
    assert export.main([str(RUN), "--csv", str(target)]) == 0
    rows = _read_csv(target)
    events = [json.loads(line) for line in (RUN / "events.jsonl").read_text().splitlines()]
    steps = [e for e in events if e["kind"] == "step"]
    first = next(r for r in rows if r["kind"] == "step")
    assert float(first["loss"]) == steps[0]["loss"]
    assert int(first["step"]) == steps[0]["step"] and int(first["rank"]) == steps[0]["rank"]
    last_eval = [r for r in rows if r["kind"] == "eval"][-1]
    assert float(last_eval["accuracy"]) == 0.975 and last_eval["step"] == ""


def test_csv_to_stdout(capsys):
    assert export.main([str(RUN), "--csv", "-"]) == 0
    lines = capsys.readouterr().out.splitlines()
    kinds = _kinds(RUN)
    assert len(lines) == 1 + kinds["step"] + kinds["eval"]


def test_a_running_run_skips_its_half_written_last_line(tmp_path):
    run = tmp_path / "live"
    shutil.copytree(RUN, run)
    (run / "summary.json").unlink()
    lines = (run / "events.jsonl").read_text().splitlines(keepends=True)
    kinds = _kinds(run)
    step_line = next(line for line in reversed(lines) if '"kind": "step"' in line)
    with open(run / "events.jsonl", "a") as f:
        f.write(step_line[: len(step_line) // 2])  # the writer is mid-line
    target = tmp_path / "out.csv"
    assert export.main([str(run), "--csv", str(target)]) == 0
    assert len(_read_csv(target)) == kinds["step"] + kinds["eval"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["/no/such/run", "--csv", "x.csv"], "not a run directory (no events.jsonl)"),
        ([str(RUN)], "one of the arguments --csv --tensorboard is required"),
        ([str(RUN), "--csv", "a", "--tensorboard", "b"], "not allowed with argument"),
        ([str(RUN), "--csv", "/no/such/dir/x.csv"], "cannot write /no/such/dir/x.csv"),
    ],
)
def test_bad_input_one_line_exit_2(argv, message, capsys):
    assert export.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("ddptui: error: ")
    assert message in err


def test_csv_into_a_directory_is_refused(tmp_path, capsys):
    assert export.main([str(RUN), "--csv", str(tmp_path)]) == 2
    assert "--csv names a directory" in capsys.readouterr().err


def _expected_scalar_counts(run_dir) -> dict[str, int]:
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    steps = [e for e in events if e["kind"] == "step"]
    expected: Counter = Counter()
    for e in steps:
        for name in ("loss", "samples_per_s", "step_time"):
            if e[name] is not None:
                expected[f"rank{e['rank']}/{name}"] += 1
        for name, value in e["metrics"].items():
            if isinstance(value, int | float):
                expected[f"rank{e['rank']}/{name}"] += 1
    expected["global/loss"] = len({e["step"] for e in steps if e["loss"] is not None})
    expected["global/samples_per_s"] = len(
        {e["step"] for e in steps if e["samples_per_s"] is not None}
    )
    epochs = {e["epoch"] for e in events if e["kind"] == "eval"}
    expected["global/eval_accuracy"] = expected["global/eval_loss"] = len(epochs)
    return dict(+expected)


@pytest.mark.parametrize("run_dir", [RUN, FAILED_RUN])
def test_tensorboard_scalars_per_rank_and_global(run_dir):
    """The scalars handed to the writer (no tensorboard needed)."""
    scalars = list(export.tensorboard_scalars(export.run_events(run_dir)))
    counts = Counter(tag for tag, *_ in scalars)
    assert dict(counts) == _expected_scalar_counts(run_dir)
    assert {"rank0/loss", "rank1/loss", "global/loss", "global/samples_per_s"} <= set(counts)
    if run_dir == FAILED_RUN:  # the user's script logs lr=0.1 as an extra metric
        assert counts["rank0/lr"] == counts["rank0/loss"]
        return
    accuracy = [(step, value) for tag, value, step, _ in scalars if tag == "global/eval_accuracy"]
    assert accuracy == [(1, 0.9475), (2, 0.965), (3, 0.975)]


def test_an_event_of_several_steps_says_how_many_and_gives_one_steps_time(tmp_path):
    """A very fast script's steps, sent a few at a time by the hooks: the CSV row says how
    many (``steps``) beside their summed time; TensorBoard's step time is one step's."""
    fields = {"run": "r", "rank": 0, "epoch": 0, "samples_per_s": 8 / 0.001}
    events = [
        protocol.Step(**fields, seq=0, t=1.0, step=1, samples=8, step_time=0.001),
        protocol.Step(**fields, seq=1, t=2.0, step=5, samples=32, step_time=0.004, steps=4),
    ]
    target = tmp_path / "out.csv"
    with open(target, "w") as out:
        export.write_csv(events, out)
    rows = _read_csv(target)
    assert [(r["step"], r["steps"], r["samples"], r["step_time"]) for r in rows] == [
        ("1", "1", "8", "0.001"), ("5", "4", "32", "0.004"),
    ]  # fmt: skip
    times = [value for tag, value, *_ in export.tensorboard_scalars(events) if "step_time" in tag]
    assert times == pytest.approx([0.001, 0.001])


def test_tensorboard_scalars_keep_each_evaluation_of_an_epoch():
    """Evaluating every N steps: each evaluation once (every rank reports it), at its epoch."""
    events = [
        protocol.Eval(run="r", rank=rank, seq=seq, t=float(seq), epoch=0, loss=loss)
        for seq, loss in enumerate((5.6, 5.5))
        for rank in (0, 1)
    ]
    scalars = list(export.tensorboard_scalars(events))
    assert [(tag, value, step) for tag, value, step, _ in scalars] == [
        ("global/eval_loss", 5.6, 0),
        ("global/eval_loss", 5.5, 0),
    ]


def test_tensorboard_eval_is_rank_0s_and_the_latest_attempts_as_on_the_dashboard():
    """A figure not all-reduced (Lightning's ``self.log`` without ``sync_dist``) is rank 0's,
    whichever rank's arrived first; a restarted attempt's evaluation of an epoch replaces the
    earlier attempt's; an evaluation without an epoch keeps its place."""
    events = [
        protocol.Eval(run="r", rank=1, seq=0, t=1.0, epoch=0, loss=0.7),
        protocol.Eval(run="r", rank=0, seq=0, t=1.1, epoch=0, loss=0.6),
        protocol.Eval(run="r", rank=1, seq=1, t=2.0, epoch=None, loss=0.5),
        protocol.Eval(run="r", rank=1, seq=2, t=3.0, epoch=1, loss=0.4),
        protocol.Eval(run="r", rank=1, seq=0, t=4.0, epoch=1, loss=0.3, attempt=1),
        protocol.Eval(run="r", rank=0, seq=3, t=4.1, epoch=1, loss=0.9),  # the old attempt's
    ]
    scalars = list(export.tensorboard_scalars(events))
    assert [(tag, value, step) for tag, value, step, _ in scalars] == [
        ("global/eval_loss", 0.6, 0),
        ("global/eval_loss", 0.5, 2),
        ("global/eval_loss", 0.3, 1),
    ]


def test_tensorboard_missing_is_one_line(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import fails
    assert export.main([str(RUN), "--tensorboard", str(tmp_path / "tb")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pip install 'ddptui[tensorboard]'" in err


def test_tensorboard_export_reads_back(tmp_path, capsys):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    target = tmp_path / "tb"
    assert export.main([str(RUN), "--tensorboard", str(target)]) == 0
    acc = EventAccumulator(str(target))
    acc.Reload()
    expected = _expected_scalar_counts(RUN)
    assert set(acc.Tags()["scalars"]) == set(expected)
    for tag, count in expected.items():
        assert len(acc.Scalars(tag)) == count, tag
    assert acc.Scalars("global/eval_accuracy")[-1].value == pytest.approx(0.975)
    assert f"{sum(expected.values())} scalars" in capsys.readouterr().out


def test_tensorboard_export_goes_through_summary_writer(monkeypatch, tmp_path, capsys):
    """The writer's calls, with a stand-in for torch.utils.tensorboard (no tensorboard needed)."""
    import types

    calls = []

    class Writer:
        def __init__(self, log_dir):
            calls.append(("open", log_dir))

        def add_scalar(self, tag, scalar_value, global_step=None, walltime=None):
            calls.append((tag, scalar_value, global_step, walltime))

        def close(self):
            calls.append(("close",))

    module = types.ModuleType("torch.utils.tensorboard")
    module.SummaryWriter = Writer
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", module)
    assert export.main([str(RUN), "--tensorboard", str(tmp_path / "tb")]) == 0
    assert calls[0] == ("open", str(tmp_path / "tb")) and calls[-1] == ("close",)
    scalars = calls[1:-1]
    assert Counter(c[0] for c in scalars) == Counter(_expected_scalar_counts(RUN))
    assert all(isinstance(c[2], int) and c[3] > 1e9 for c in scalars)
    assert f"{len(scalars)} scalars" in capsys.readouterr().out


def test_lines_that_are_no_event_are_left_out_and_said_on_stderr(tmp_path, capsys):
    """The rows of every readable line, and on stderr (never inside a CSV on stdout) how many
    lines were left out: a crash's cut-short last line, say."""
    run_dir = tmp_path / "run"
    shutil.copytree(RUN, run_dir)
    events = run_dir / "events.jsonl"
    whole = _kinds(run_dir)
    events.write_bytes(events.read_bytes() + b'{"kind": "step", "ra')
    assert export.main([str(run_dir), "--csv", "-"]) == 0
    captured = capsys.readouterr()
    rows = list(csv.DictReader(captured.out.splitlines()))
    assert Counter(r["kind"] for r in rows) == +Counter(step=whole["step"], eval=whole["eval"])
    assert captured.err == (
        "ddptui: events.jsonl: 1 line not readable as events, left out (a crash can cut the "
        "last one short)\n"
    )
