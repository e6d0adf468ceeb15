"""``ddptui compare``: runs side by side, the options that differ named, the dashboard's
overlaid curves."""

from __future__ import annotations

import json
import re
import shutil

import pytest

from ddptui.runs import compare
from tests.data_fixtures.record import RUNS
from tests.tui_fixtures.fakes import FAILED_RUN

AMP_OFF = RUNS / "amp-off"
AMP_BF16 = RUNS / "amp-bf16"


def test_two_runs_that_differ_in_amp_name_the_difference(capsys):
    assert compare.main(["--no-ui", str(AMP_OFF), str(AMP_BF16)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["amp-off", "amp-bf16"]
    rows = {line.split()[0]: line.split()[1:] for line in out[2:]}
    assert rows["--amp"] == ["off", "bf16"]
    # Only --amp differs: no other option is listed.
    assert [name for name in rows if name.startswith("--")] == ["--amp"]
    assert rows["outcome"] == ["finished", "finished"]
    assert rows["final"] == ["accuracy", "0.9750", "0.9725"]
    assert rows["best"] == ["accuracy", "0.9750", "(epoch", "3)", "0.9725", "(epoch", "3)"]
    assert rows["failure"] == ["--", "--"]
    # "steady samples/s": the bench's rule, not the mean, with the run's own interval
    steady = next(line for line in out if line.startswith("steady samples/s"))
    figures = re.findall(r"([\d,]+) ±(\d+)%( unstable)?", steady)
    assert len(figures) == 2 and all(int(f[0].replace(",", "")) > 0 for f in figures)
    assert all((int(f[1]) > 10) == bool(f[2]) for f in figures)  # wider than ±10 %: unstable
    assert not any(line.startswith("no interval") for line in out)
    # Against the first run: bf16's figure is within what either run swung (both ±20 % or more)
    versus = next(line for line in out if line.startswith("vs the first"))
    assert re.fullmatch(r"vs the first\s+--\s+[+-]\d+% \(intervals overlap\)", versus)


def test_a_run_too_short_for_its_own_interval_says_so(tmp_path, capsys):
    shutil.copytree(AMP_OFF, tmp_path / "short")
    events = (tmp_path / "short" / "events.jsonl").read_text().splitlines()
    steps = {0: 0, 1: 0}
    kept = []
    for line in events:
        event = json.loads(line)
        if event["kind"] == "step":
            steps[event["rank"]] += 1
            if steps[event["rank"]] > 31:  # one step fewer than an interval of its own needs
                continue
        kept.append(line)
    (tmp_path / "short" / "events.jsonl").write_text("\n".join(kept) + "\n")
    assert compare.main(["--no-ui", str(AMP_OFF), str(tmp_path / "short")]) == 0
    out = capsys.readouterr().out.splitlines()
    steady = next(line for line in out if line.startswith("steady samples/s"))
    assert steady.count("±") == 1 and steady.endswith(" no interval unstable")
    assert out[-1].startswith("no interval: a single run's own takes at least 32 steps a rank")


def test_a_failed_run_shows_its_failure(capsys):
    assert compare.main(["--no-ui", str(AMP_OFF), str(FAILED_RUN)]) == 0
    out = capsys.readouterr().out
    failure = next(line for line in out.splitlines() if line.startswith("failure"))
    assert "rank 1 exited with code 1" in failure
    assert "--launcher" in out and "--script" in out


def test_same_options_and_same_names_are_told_apart(tmp_path, capsys):
    for name in ("a", "b"):
        shutil.copytree(AMP_OFF, tmp_path / name / "run")
    assert compare.main(["--no-ui", str(tmp_path / "a/run"), str(tmp_path / "b/run")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "run (2)" in out[0]
    assert any(line.split()[:3] == ["options", "the", "same"] for line in out)


def test_a_run_without_summary_is_derived_from_its_events(tmp_path, capsys):
    shutil.copytree(AMP_BF16, tmp_path / "old")
    (tmp_path / "old" / "summary.json").unlink()
    assert compare.main(["--no-ui", str(AMP_OFF), str(tmp_path / "old")]) == 0
    rows = capsys.readouterr().out
    assert "finished" in next(line for line in rows.splitlines() if line.startswith("outcome"))


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([str(AMP_OFF)], "compare needs at least two run directories"),
        ([str(AMP_OFF), "/no/such/run"], "not a run directory (no events.jsonl): /no/such/run"),
        ([], "the following arguments are required: RUN_DIR"),
        ([str(AMP_OFF)] * 17, "compare takes at most 16 run directories"),
    ],
)
def test_bad_input_one_line_exit_2(argv, message, capsys):
    assert compare.main(["--no-ui", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("ddptui: error: ")
    assert message in err


def test_garbage_config_is_one_line(tmp_path, capsys):
    shutil.copytree(AMP_OFF, tmp_path / "bad")
    (tmp_path / "bad" / "config.json").write_text(json.dumps({"world_size": 1e400}))
    assert compare.main(["--no-ui", str(AMP_OFF), str(tmp_path / "bad")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "world_size must be a whole number" in err


def test_overlay_chart_snapshot(snap_compare):
    from ddptui.tui.screens.compare import CompareApp

    runs = compare.load_all([str(AMP_OFF), str(AMP_BF16)])
    assert snap_compare(CompareApp(runs), terminal_size=(120, 40))


def test_run_reports_usage_errors_itself_when_wired_into_another_parser(capsys):
    """The CLI builds its own parser with add_arguments and calls run(): errors stay one line."""
    import argparse

    parser = argparse.ArgumentParser()
    compare.add_arguments(parser)
    assert compare.run(parser.parse_args(["--no-ui", str(AMP_OFF)])) == 2
    assert capsys.readouterr().err == "ddptui: error: compare needs at least two run directories\n"


def test_a_run_whose_events_file_has_unreadable_lines_says_so(tmp_path, capsys):
    run_dir = tmp_path / "cut"
    shutil.copytree(AMP_OFF, run_dir)
    events = run_dir / "events.jsonl"
    events.write_bytes(events.read_bytes() + b"{not an event\n" + b'{"kind": "st')
    assert compare.main(["--no-ui", str(AMP_OFF), str(run_dir)]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("unread"))
    assert line.split()[2:] == ["--", "2", "left", "out"]
    assert compare.main(["--no-ui", str(AMP_OFF), str(AMP_OFF)]) == 0
    assert "unread" not in capsys.readouterr().out
