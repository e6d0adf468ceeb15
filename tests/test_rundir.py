"""The run directory: summary.json, the one outcome rule, hostile config.json, replay."""

import json

import pytest

from ddptui import protocol
from ddptui.cli import main
from ddptui.run import rundir
from ddptui.run.rundir import (
    EXIT_CODES,
    RunDirError,
    decide_outcome,
    load_run,
    read_config,
    read_summary,
    summarize,
    write_summary,
)
from ddptui.run.state import RankFailureInfo, RunState
from ddptui.runfiles import RunDir, write_json_atomic


@pytest.mark.parametrize(
    "failed, stopped, interrupted, outcome",
    [
        (False, False, False, "finished"),
        (True, False, False, "failed"),
        (False, True, False, "stopped"),
        (True, True, False, "stopped"),  # the user's stop, not a failure of the run
        (False, False, True, "interrupted"),
        (True, False, True, "interrupted"),
        (False, True, True, "interrupted"),
    ],
)
def test_one_rule_decides_the_outcome(failed, stopped, interrupted, outcome):
    assert decide_outcome(failed=failed, stopped=stopped, interrupted=interrupted) == outcome


def test_exit_codes_per_outcome():
    assert EXIT_CODES == {
        "finished": 0,
        "failed": 1,
        "stopped": 130,
        "interrupted": 130,
        "hung": 3,
    }


def _state():
    state = RunState("r1", 2, epochs=2)
    for rank in (0, 1):
        state.apply(
            protocol.Status(
                run="r1",
                rank=rank,
                seq=0,
                t=1.0,
                state="started",
                pid=100 + rank,
                host="h",
                device="cpu",
            )
        )
        state.apply(
            protocol.Step(run="r1", rank=rank, seq=1, t=2.0, step=1, epoch=1, loss=0.5, samples=32)
        )
        state.apply(
            protocol.Eval(
                run="r1", rank=rank, seq=2, t=3.0, epoch=1, accuracy=0.75, loss=0.4, count=100
            )
        )
    state.apply(protocol.Status(run="r1", rank=0, seq=3, t=4.0, state="finished"))
    state.apply(
        protocol.Status(run="r1", rank=1, seq=3, t=4.0, state="failed", error="ValueError: boom")
    )
    return state


def test_summary_of_a_failed_run_names_the_rank_and_why(tmp_path):
    state = _state()
    failure = RankFailureInfo(rank=1, exit_code=1, error="ValueError: boom")
    state.set_outcome("failed", failure)
    doc = summarize(state, "failed", failure, events={"received": 8})
    assert doc["outcome"] == "failed" and doc["exit_code"] == 1
    assert doc["final_accuracy"] == 0.75
    assert [(r["rank"], r["state"]) for r in doc["ranks"]] == [(0, "finished"), (1, "failed")]
    assert doc["failure"]["rank"] == 1 and doc["failure"]["error"] == "ValueError: boom"
    assert doc["failure"]["how"] == "rank 1 exited with code 1: ValueError: boom"
    write_summary(tmp_path, doc)
    assert json.loads(RunDir(tmp_path).summary.read_text()) == doc
    assert read_summary(tmp_path) == doc


def test_summary_has_each_ranks_mean_samples_per_s_over_its_steps_and_their_sum():
    """Three steps of 0.1 s and a last one of 2 s (an evaluation in it), 32 samples each:
    128 samples over 2.3 s a rank, not the last step's 16 samples/s."""
    from ddptui.headless import over_run

    state = RunState("r", 2)
    for rank in (0, 1):
        for i, took in enumerate((0.1, 0.1, 0.1, 2.0), start=1):
            step = protocol.Step(
                run="r",
                rank=rank,
                seq=i,
                t=float(i),
                step=i,
                samples=32,
                step_time=took,
                samples_per_s=32 / took,
            )
            state.apply(step)
        state.apply(protocol.Status(run="r", rank=rank, seq=9, t=9.0, state="finished"))
    doc = summarize(state, "finished")
    assert [r["samples_per_s"] for r in doc["ranks"]] == [pytest.approx(128 / 2.3)] * 2
    assert doc["samples_per_s"] == pytest.approx(2 * 128 / 2.3)
    assert over_run(state) == " at 111 samples/s over the run"
    json.dumps(doc, allow_nan=False)


def test_summary_has_no_rate_where_no_sample_was_counted():
    state = _state()  # steps with samples but without a step time: the latest rate (none)
    doc = summarize(state, "finished")
    assert doc["samples_per_s"] is None and doc["ranks"][0]["samples_per_s"] is None
    empty = RunState("r", 1)
    assert summarize(empty, "finished")["samples_per_s"] is None


def test_summary_keeps_json_strict_for_non_finite_accuracy():
    state = RunState("r", 1)
    state.apply(
        protocol.Eval(
            run="r", rank=0, seq=0, t=0.0, epoch=1, accuracy=float("nan"), loss=float("inf")
        )
    )
    doc = summarize(state, "finished")
    json.dumps(doc, allow_nan=False)  # would raise on nan/inf
    assert doc["final_accuracy"] is None and doc["final_eval"]["loss"] is None


def test_atomic_write_leaves_no_temp_file_and_refuses_nan(tmp_path):
    target = tmp_path / "x.json"
    write_json_atomic(target, {"a": 1})
    with pytest.raises(ValueError):
        write_json_atomic(target, {"a": float("nan")})
    assert json.loads(target.read_text()) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["x.json"]


@pytest.mark.parametrize(
    "text",
    [
        "",
        "[1, 2]",
        "{not json",
        '"a string"',
        '{"world_size": 1e9}',
        '{"world_size": "two"}',
        '{"world_size": true}',
        '{"world_size": -1}',
        '{"world_size": 1000000000}',
        '{"world_size": 2, "run_id": 5}',
        "\udcff".encode("utf-8", "surrogateescape").decode("latin-1"),
    ],
)
def test_hostile_config_json_is_one_line_error(tmp_path, text):
    RunDir(tmp_path).config.write_text(text, encoding="latin-1")
    with pytest.raises(RunDirError) as err:
        read_config(tmp_path)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("text", ['{"world_size": 1e9}', "[]", "{", '{"world_size": "x"}'])
def test_replay_of_hostile_config_exits_2_in_one_line(tmp_path, capsys, text):
    RunDir(tmp_path).config.write_text(text)
    RunDir(tmp_path).events.write_text("")
    assert main(["replay", "--no-ui", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ddptui: error: ") and err.count("\n") == 1


def test_replay_bounds_the_world_size_by_the_ranks_its_events_name(tmp_path):
    RunDir(tmp_path).config.write_text(json.dumps({"run_id": "a", "world_size": 65536}))
    RunDir(tmp_path).events.write_bytes(
        protocol.to_json(protocol.Step(run="a", rank=3, seq=0, t=0.0, step=1, samples=1)) + b"\n"
    )
    _, state, summary = load_run(tmp_path)
    assert len(state.ranks) <= 1024
    assert summary["outcome"] == "interrupted"  # no rank said it ended: ddptui was killed


def test_old_run_without_summary_is_derived_from_its_events(tmp_path):
    RunDir(tmp_path).config.write_text(json.dumps({"run_id": "a", "world_size": 1}))
    RunDir(tmp_path).events.write_bytes(
        b"".join(
            protocol.to_json(e) + b"\n"
            for e in (
                protocol.Eval(run="a", rank=0, seq=0, t=0.0, epoch=1, accuracy=0.5),
                protocol.Status(run="a", rank=0, seq=1, t=1.0, state="finished"),
            )
        )
    )
    _, state, summary = load_run(tmp_path)
    assert summary["outcome"] == "finished" and summary["final_accuracy"] == 0.5
    assert state.outcome == "finished"
    assert not RunDir(tmp_path).summary.exists()  # derived, not written


def test_written_summary_wins_over_the_events(tmp_path):
    RunDir(tmp_path).config.write_text(json.dumps({"run_id": "a", "world_size": 1}))
    RunDir(tmp_path).events.write_bytes(
        protocol.to_json(protocol.Status(run="a", rank=0, seq=0, t=1.0, state="finished")) + b"\n"
    )
    state = RunState("a", 1)
    write_summary(tmp_path, summarize(state, "interrupted", exit_code=143))
    _, replayed, summary = load_run(tmp_path)
    assert summary["outcome"] == "interrupted" and summary["exit_code"] == 143
    assert replayed.outcome == "interrupted"


@pytest.mark.parametrize("text", ["[]", '{"outcome": "won"}', '{"outcome": "finished"}', "{"])
def test_malformed_summary_is_ignored(tmp_path, text):
    RunDir(tmp_path).summary.write_text(text)
    assert read_summary(tmp_path) is None


def test_a_replay_says_how_many_lines_of_events_jsonl_it_left_out(tmp_path, capsys):
    """A malformed line, one too long to hold and a last line a crash cut short are left out,
    as before, and a replay now says so (it said nothing: the run looked whole)."""
    RunDir(tmp_path).config.write_text(json.dumps({"run_id": "a", "world_size": 1}))
    steps = [
        protocol.to_json(protocol.Step(run="a", rank=0, seq=i, t=float(i), step=i + 1, samples=4))
        for i in range(3)
    ]
    RunDir(tmp_path).events.write_bytes(
        steps[0] + b"\n{not an event\n"
        + b'{"kind": "log", "line": "' + b"x" * (rundir.MAX_EVENT_LINE + 10) + b'"}\n'
        + steps[1] + b"\n" + steps[2][:20]
    )  # fmt: skip
    _, state, _ = load_run(tmp_path)
    assert state.ranks[0].step == 2 and state.lines_unread == 3
    assert main(["replay", "--no-ui", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "events.jsonl: 3 lines not readable as events, left out" in out
    RunDir(tmp_path).events.write_bytes(steps[0] + b"\n" + steps[1] + b"\n")  # whole
    assert main(["replay", "--no-ui", str(tmp_path)]) == 0
    assert "events.jsonl" not in capsys.readouterr().out


def test_the_dashboards_replay_says_it_beside_replay(tmp_path):
    from ddptui.tui.sources import ReplaySource  # the dashboard's side (Textual)

    RunDir(tmp_path).config.write_text(json.dumps({"run_id": "a", "world_size": 1}))
    step = protocol.to_json(protocol.Step(run="a", rank=0, seq=0, t=0.0, step=1, samples=4))
    RunDir(tmp_path).events.write_bytes(step + b"\n" + step[:10])
    assert ReplaySource.load(tmp_path).note == (
        "replay · events.jsonl: 1 line not readable as events, left out (a crash can cut the "
        "last one short)"
    )
    RunDir(tmp_path).events.write_bytes(step + b"\n")
    assert ReplaySource.load(tmp_path).note == "replay"
