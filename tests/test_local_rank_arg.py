"""``--local-rank-arg``: the local rank passed to a script as an argument, as ``python -m
torch.distributed.launch`` passed it (Swin Transformer's ``main.py`` and its kin take
``--local_rank`` as a required argument): the option's values, the rank entry's argv, the
hint on a crash that asks for it, the command lines that carry it, and one real run."""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ddptui.cli import continue_run_dir
from ddptui.constants import LOCAL_RANK_ARG_ENV
from ddptui.rank import entry
from ddptui.rank.local_rank import local_rank_read, watch
from ddptui.run.config import build_config
from ddptui.run.diagnosis import local_rank_hint, local_rank_read_hint
from ddptui.run.machine import Machine
from ddptui.run.options import ConfigError, parse_local_rank_arg, resume_command
from ddptui.runfiles import RunDir
from tests.helpers import run_test_script

CPU = Machine(cuda_devices=0, cuda_reason="no CUDA device visible", cpu_count=2)
SCRIPTS = Path(__file__).parent / "scripts"


@pytest.mark.parametrize(
    ("given", "flag"),
    [
        ("--local_rank", "--local_rank"),
        ("local_rank", "--local_rank"),
        ("--local-rank", "--local-rank"),
        (" -local_rank ", "-local_rank"),
        ("gpu", "--gpu"),
    ],
)
def test_the_flag_is_an_option_name_with_its_dashes(given, flag):
    assert parse_local_rank_arg(given) == flag


@pytest.mark.parametrize(
    "given", ["", "--", "---local_rank", "--1st", "--local rank", "--local_rank=0", "--rang_é",
              "--" + "x" * 65, "--a\x00b", "$(id)"],
)  # fmt: skip
def test_anything_else_is_refused_in_one_line(given):
    with pytest.raises(ConfigError) as info:
        parse_local_rank_arg(given)
    assert info.value.field == "local_rank_arg"
    assert "\n" not in str(info.value) and "--local-rank-arg must name an option" in str(info.value)


def test_a_script_run_carries_it_to_every_rank_and_a_trainer_refuses_it(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    cfg = build_config({"script": str(script), "local_rank_arg": "local_rank"}, CPU)
    assert cfg.local_rank_arg == "--local_rank"
    assert cfg.rank_environment()[LOCAL_RANK_ARG_ENV] == "--local_rank"
    assert cfg.to_json_dict()["local_rank_arg"] == "--local_rank"
    assert LOCAL_RANK_ARG_ENV not in build_config({"script": str(script)}, CPU).rank_environment()
    with pytest.raises(ConfigError, match="--local-rank-arg is for your script"):
        build_config({"trainer": "synthetic", "local_rank_arg": "--local_rank"}, CPU)


def test_the_rank_entry_puts_it_before_the_scripts_own_arguments(tmp_path, monkeypatch):
    """The script sees ``--local_rank=N`` first, as torch.distributed.launch gave it; without
    the option, or without a LOCAL_RANK, its arguments are its own."""
    out = tmp_path / "argv.txt"
    script = tmp_path / "train.py"
    script.write_text(f"import sys\nopen({str(out)!r}, 'w').write(repr(sys.argv[1:]))\n")
    monkeypatch.setattr(sys, "argv", list(sys.argv))  # the entry sets the script's
    monkeypatch.setattr(sys, "path", list(sys.path))  # and puts its folder first
    monkeypatch.setenv(LOCAL_RANK_ARG_ENV, "--local-rank")
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert entry.run_target(None, str(script), ["--epochs", "2"]) == 0
    assert out.read_text() == repr(["--local-rank=3", "--epochs", "2"])
    for environ in ({LOCAL_RANK_ARG_ENV: "--local_rank"}, {"LOCAL_RANK": "1"},
                    {LOCAL_RANK_ARG_ENV: "--local_rank", "LOCAL_RANK": "x"}):  # fmt: skip
        assert entry.local_rank_args(environ) == []
    assert entry.local_rank_args({LOCAL_RANK_ARG_ENV: "--gpu", "LOCAL_RANK": " 7"}) == ["--gpu=7"]


def test_a_crash_that_asks_for_it_says_how_to_give_it():
    usage = [
        "usage: main.py [-h] --cfg FILE --local_rank LOCAL_RANK",
        "main.py: error: the following arguments are required: --cfg, --local_rank",
    ]
    assert local_rank_hint(usage).endswith(
        "(--local_rank), as python -m torch.distributed.launch passed it: add "
        "--local-rank-arg (the form's local rank arg: --local_rank)"
    )
    hyphen = ["x.py: error: the following arguments are required: --local-rank/--local_rank"]
    assert "add --local-rank-arg=--local-rank (" in local_rank_hint(hyphen)
    required = "error: the following arguments are required: "
    assert local_rank_hint([required + "--cfg"]) is None
    assert local_rank_hint([required + "--global_local_rank"]) is None
    assert local_rank_hint(["RuntimeError: --local_rank"]) is None


def test_the_command_lines_that_repeat_a_run_keep_it(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    run_dir = tmp_path / "run"
    cfg = build_config(
        {"script": str(script), "local_rank_arg": "--local_rank", "run_dir": str(run_dir)}, CPU
    )
    assert "--local-rank-arg=--local_rank" in shlex.split(resume_command(cfg))
    # --resume RUN_DIR takes the saved run's flag over
    run_dir.mkdir()
    files = RunDir(run_dir)
    files.config.write_text(json.dumps(cfg.to_json_dict()))
    files.checkpoint.write_bytes(b"x")
    assert continue_run_dir({"resume": str(run_dir)})["local_rank_arg"] == "--local_rank"
    # and --print-sbatch writes it so that its own parser reads it back
    proc = subprocess.run(
        [sys.executable, "-m", "ddptui.cli", "--launcher", "slurm", "--print-sbatch",
         "--script", str(script), "--local-rank-arg=--local-rank"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "--local-rank-arg=--local-rank" in proc.stdout


def test_the_crash_of_a_script_that_asks_for_it_carries_the_hint(tmp_path):
    """The session puts the hint on the crash of the rank whose log ends in argparse's
    refusal, only where the option was not given (a real run of it: the test below)."""
    from ddptui import protocol
    from ddptui.run.session import RunSession
    from ddptui.run.state import RankFailureInfo

    script = SCRIPTS / "launch_era.py"
    tail = ("usage: launch_era.py [-h] --local_rank LOCAL_RANK [--steps STEPS]",
            "launch_era.py: error: the following arguments are required: --local_rank")  # fmt: skip
    for given, hinted in ((None, True), ("--local_rank", False)):
        raw = {"script": str(script), "run_dir": str(tmp_path / f"r{hinted}")}
        session = RunSession(build_config({**raw, "local_rank_arg": given}, CPU))
        run = session.cfg.run_id
        for seq, state in enumerate(("started", "failed")):
            session.state.apply(
                protocol.Status(run=run, rank=0, t=1.0, seq=seq, state=state,
                                error="SystemExit: 2" if state == "failed" else None)
            )  # fmt: skip
        failure = RankFailureInfo(rank=0, exit_code=2, error="SystemExit: 2", stderr_tail=tail)
        session.state.set_outcome("failed", failure)
        session._diagnose_crash()
        crash = [d.detail for d in session.diagnoser.diagnoses if d.cause == "crash"]
        assert len(crash) == 1
        assert crash[0].endswith("add --local-rank-arg (the form's local rank arg: "
                                 "--local_rank)") is hinted  # fmt: skip


@pytest.mark.slow
def test_a_script_that_requires_its_local_rank_as_an_argument_runs_under_torchrun(tmp_path):
    """With the option every rank of the launch-era script gets its own local rank and the
    run finishes (without it, the script stops at its argument parser: the hint, above)."""
    run_dir = tmp_path / "run"
    proc = run_test_script(tmp_path, "launch_era.py", "--local-rank-arg", "--", "--steps", "6")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    logs = [RunDir(run_dir).rank_log(r).read_text() for r in (0, 1)]
    assert "local rank 0 of LOCAL_RANK 0" in logs[0]
    assert "local rank 1 of LOCAL_RANK 1" in logs[1]


# -- an optional local-rank option torchrun left at its default --------------------------------
def _parser(*flags, **kwargs):
    parser = argparse.ArgumentParser(prog="train.py")
    parser.add_argument(*flags, **kwargs)
    parser.add_argument("--epochs", type=int, default=1)
    return parser


@pytest.mark.parametrize(
    ("flags", "kwargs", "argv", "local_rank", "found"),
    [
        (("--local_rank",), {"type": int}, [], 0, {"read": None, "dashed": False}),
        (("--local_rank",), {"type": int, "default": 0}, ["--epochs", "2"], 1,
         {"read": 0, "dashed": False}),
        (("--local-rank", "--local_rank"), {"type": int, "default": -1}, [], 3,
         {"read": -1, "dashed": True}),
        (("--local_rank",), {"default": "0"}, [], 1, {"read": None, "dashed": False}),
        (("--local_rank",), {"type": int, "default": 10**30}, [], 1,
         {"read": None, "dashed": False}),
        (("--local_rank",), {"type": int, "default": 0}, [], 0, None),  # right on this rank
        (("--local_rank",), {"type": int}, ["--local_rank=1"], 1, None),  # given
        (("--local_rank",), {"type": int}, ["--local_rank", "1"], 1, None),
        (("--local-rank", "--local_rank"), {"type": int}, ["--local-rank=2"], 2, None),
        (("--local_ranks",), {"type": int}, [], 1, None),  # another option
        (("--gpu",), {"type": int}, [], 1, None),
    ],
)  # fmt: skip
def test_what_a_scripts_local_rank_option_read_where_torchrun_passed_none(
    flags, kwargs, argv, local_rank, found
):
    """MONAI's ``unet_training_ddp.py`` declares ``--local_rank`` (type int, no default):
    torchrun passes none, so it reads None on every rank. Noted (the numbers the note
    carries) where the option was not given and reads other than the rank's LOCAL_RANK; a
    default that is no whole number, or beyond the note's bounds, is sent as None."""
    parser = _parser(*flags, **kwargs)
    parsed = parser.parse_args(argv)
    expected = None if found is None else {"local_rank": local_rank, **found}
    assert local_rank_read(parser, argv, parsed, local_rank) == expected


def test_the_parsers_of_the_rank_are_looked_at_until_one_has_the_option(monkeypatch):
    """Every parser the script (or a library) makes parses as it did; the first one with a
    local-rank option is judged, once; undone, argparse is as it was. Without a whole-number
    LOCAL_RANK nothing is watched; a note that cannot be sent changes nothing."""
    before = argparse.ArgumentParser.__dict__["parse_known_args"]
    notes = []
    undo = watch(lambda code, **numbers: notes.append((code, numbers)), {"LOCAL_RANK": "1"}).undo
    try:
        assert argparse.ArgumentParser.__dict__["parse_known_args"] is not before
        monkeypatch.setattr(sys, "argv", ["train.py"])
        assert _parser("--lr", type=float).parse_args([]).epochs == 1
        assert _parser("--local_rank", type=int).parse_args(["--local_rank", "1"]).local_rank == 1
        sub = argparse.ArgumentParser()
        sub.add_subparsers(dest="cmd").add_parser("fit").add_argument("--local_rank", type=int)
        assert sub.parse_args(["fit"]).local_rank is None  # a subcommand's parser: judged
        assert _parser("--local_rank", type=int).parse_args([]).local_rank is None  # once
        assert notes == [("local_rank_arg", {"local_rank": 1, "read": None, "dashed": False})]
    finally:
        undo()
    assert argparse.ArgumentParser.__dict__["parse_known_args"] is before
    for environ in ({}, {"LOCAL_RANK": "x"}, {"LOCAL_RANK": "-1"}, {"LOCAL_RANK": "٣"},
                    {"LOCAL_RANK": "1" * 400}):  # fmt: skip
        watch(lambda *a, **k: notes.append(a), environ).undo()
        assert argparse.ArgumentParser.__dict__["parse_known_args"] is before

    def refuse(code, **numbers):
        raise OSError("no socket")

    undo = watch(refuse, {"LOCAL_RANK": "0"}).undo
    try:
        assert _parser("--local_rank", type=int).parse_args([]).local_rank is None
    finally:
        undo()


def test_a_note_is_taken_back_once_the_script_sets_the_option_to_its_local_rank():
    """timm's ``train.py``: ``--local_rank`` (default 0) parsed, then ``args.local_rank`` set
    from LOCAL_RANK by the script itself. The note sent at the parse is taken back (the same
    note, ``read`` equal to ``local_rank``, without announcing the rank again) once the
    namespace holds LOCAL_RANK; once only. A value still wrong, or a namespace gone, takes
    nothing back; nor does a note that could not be sent."""
    notes = []

    def note(code, announce=True, **numbers):
        notes.append((code, announce, numbers))

    watched = watch(note, {"LOCAL_RANK": "1"})
    try:
        args = _parser("--local_rank", type=int, default=0).parse_args([])
        wrong = {"local_rank": 1, "read": 0, "dashed": False}
        assert notes == [("local_rank_arg", True, wrong)]
        watched.settle()
        args.local_rank = 2  # still not its LOCAL_RANK
        watched.settle()
        args.local_rank = "1"  # nor a whole number
        watched.settle()
        assert len(notes) == 1
        args.local_rank = 1  # what timm's init_distributed_device does
        watched.settle()
        watched.settle()
        assert notes[1:] == [("local_rank_arg", False, {**wrong, "read": 1})]
    finally:
        watched.undo()

    notes.clear()
    watched = watch(note, {"LOCAL_RANK": "1"})
    try:
        args = _parser("--local-rank", type=int, default=0).parse_args([])
        del args  # the script let its namespace go
        watched.settle()
        assert [numbers for _, _, numbers in notes] == [
            {"local_rank": 1, "read": 0, "dashed": True}
        ]
    finally:
        watched.undo()

    def refuse(code, **numbers):
        raise OSError("no socket")

    watched = watch(refuse, {"LOCAL_RANK": "1"})
    try:
        args = _parser("--local_rank", type=int, default=0).parse_args([])
        args.local_rank = 1
        watched.settle()  # nothing was sent: nothing to take back, and no error
    finally:
        watched.undo()


def test_the_rank_entry_looks_again_before_the_failure_it_reports(tmp_path, monkeypatch):
    """In the rank: the look again comes before the failure's report, so that the session
    has the note as it stands when the failure arrives; the heartbeat looks before each beat
    while the script runs, and no longer once it has ended."""
    from ddptui.constants import ENDPOINT_ENV
    from ddptui.rank import heartbeat

    said = []
    monkeypatch.setattr(entry, "_note", lambda code, announce=True, **n: said.append(n["read"]))
    monkeypatch.setattr(entry, "report_failure", lambda error, trace: said.append(error))
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setenv(ENDPOINT_ENV, "ipc:///nowhere")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.delenv(LOCAL_RANK_ARG_ENV, raising=False)
    script, seen = tmp_path / "train.py", tmp_path / "checked.txt"
    for sets_it, expected in ((True, [0, 1, "ValueError: device_ids"]),
                              (False, [0, "ValueError: device_ids"])):  # fmt: skip
        said.clear()
        script.write_text(
            "import argparse, os, sys\n"
            "from ddptui.rank import heartbeat\n"
            "p = argparse.ArgumentParser()\n"
            "p.add_argument('--local_rank', type=int, default=0)\n"
            "args = p.parse_args()\n"
            f"if {sets_it}:\n"
            "    args.local_rank = int(os.environ['LOCAL_RANK'])\n"
            f"open({str(seen)!r}, 'w').write(str(heartbeat._before_beat is not None))\n"
            "raise ValueError('device_ids')\n"
        )
        with pytest.raises(ValueError):
            entry.run_target(None, str(script), [])
        assert said == expected
        assert seen.read_text() == "True"  # while it ran
        assert heartbeat._before_beat is None


def test_the_heartbeat_runs_its_check_before_each_beat_and_survives_its_error():
    from ddptui.rank import heartbeat

    order = []

    class Reporter:
        def beat(self, **values):
            order.append("beat")

    def check():
        order.append("check")
        raise RuntimeError("the script's namespace broke")

    heartbeat.set_before_beat(check)
    beat = heartbeat.Heartbeat(Reporter(), interval=0.01)
    try:
        beat.start()
        deadline = time.monotonic() + 10
        while order.count("beat") < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        beat.stop()
        heartbeat.set_before_beat(None)
        beat._thread.join(5)
    assert order[:4] == ["check", "beat", "check", "beat"]


def test_the_hint_names_the_option_and_what_it_read():
    assert local_rank_read_hint({}, 0) is None
    hint = local_rank_read_hint({1: (None, 1, False), 0: (None, 0, False)}, 0)
    assert hint == (
        "rank 0's script has a --local_rank option that no launcher passed it (python -m "
        "torch.distributed.launch did; torchrun does not): it kept its default where the rank's "
        "LOCAL_RANK is 0; add --local-rank-arg (the form's local rank arg: --local_rank)"
    )
    dashed = local_rank_read_hint({3: (-1, 3, True)}, None)
    assert "rank 3's script has a --local-rank option" in dashed
    assert "it read -1 where the rank's LOCAL_RANK is 3; add --local-rank-arg=--local-rank (" in (
        dashed
    )


def test_a_failed_run_whose_ranks_read_no_local_rank_says_so_on_its_headline(tmp_path):
    """The note alone says nothing (a script that reads LOCAL_RANK itself is healthy); beside
    a failure it is the hint, on the first crash line, unless the option was given."""
    from ddptui import protocol
    from ddptui.run.session import RunSession
    from ddptui.run.state import RankFailureInfo

    script = SCRIPTS / "launch_era_optional.py"
    for given, hinted in ((None, True), ("--local_rank", False)):
        raw = {"script": str(script), "run_dir": str(tmp_path / f"r{hinted}")}
        session = RunSession(build_config({**raw, "local_rank_arg": given}, CPU))
        run = session.cfg.run_id
        for rank in (0, 1):
            events = [
                protocol.Status(run=run, rank=rank, t=1.0, seq=0, state="started"),
                protocol.Note(run=run, rank=rank, t=1.0, seq=1, code="local_rank_arg",
                              local_rank=rank, read=None, dashed=False),
                protocol.Status(run=run, rank=rank, t=2.0, seq=2, state="failed",
                                error="ZeroDivisionError: division by zero"),
            ]  # fmt: skip
            for event in events:
                session.state.apply(event)
        assert session.diagnoser.notes(session.state) == []  # no finding by itself
        failure = RankFailureInfo(rank=1, exit_code=1, error="ZeroDivisionError", stderr_tail=())
        session.state.set_outcome("failed", failure)
        session._diagnose_crash()
        crash = [d.detail for d in session.diagnoser.diagnoses if d.cause == "crash"]
        assert crash[0].startswith("ranks 0 and 1 failed with the same error")
        assert ("rank 1's script has a --local_rank option" in crash[0]) is hinted
        assert not any("--local_rank option" in detail for detail in crash[1:])


def test_a_note_taken_back_gives_no_hint_to_another_ranks_failure(tmp_path):
    """timm's shape, its rank 0 failing alone (rank 1 stopped by torchrun, no failure of its
    own to report): rank 1's note stood beside rank 0's crash until rank 1 took it back."""
    from ddptui import protocol
    from ddptui.run.session import RunSession
    from ddptui.run.state import RankFailureInfo

    for taken_back, hinted in ((False, True), (True, False)):
        raw = {
            "script": str(SCRIPTS / "launch_era_optional.py"),
            "run_dir": str(tmp_path / f"r{hinted}"),
        }
        session = RunSession(build_config(raw, CPU))
        run = session.cfg.run_id
        note = dict(run=run, rank=1, code="local_rank_arg", local_rank=1, dashed=False)
        events = [
            protocol.Status(run=run, rank=0, t=1.0, seq=0, state="started"),
            protocol.Status(run=run, rank=1, t=1.0, seq=0, state="started"),
            protocol.Note(**note, t=1.0, seq=1, read=0),
            *([protocol.Note(**note, t=2.0, seq=2, read=1)] if taken_back else []),
            protocol.Status(run=run, rank=0, t=3.0, seq=1, state="failed",
                            error="RuntimeError: no data"),
        ]  # fmt: skip
        for event in events:
            session.state.apply(event)
        failure = RankFailureInfo(rank=0, exit_code=1, error="RuntimeError", stderr_tail=())
        session.state.set_outcome("failed", failure)
        session._diagnose_crash()
        crash = [d.detail for d in session.diagnoser.diagnoses if d.cause == "crash"]
        assert ("rank 1's script has a --local_rank option" in crash[0]) is hinted, crash


@pytest.mark.slow
def test_a_script_whose_optional_local_rank_torchrun_leaves_unset_fails_with_the_hint(tmp_path):
    """Run as published under torchrun, every rank of the MONAI-shaped script reads None,
    silences its output and fails on no data: the console says why and what to add."""
    proc = run_test_script(tmp_path, "launch_era_optional.py")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    first = next(line for line in proc.stdout.splitlines() if line.startswith("diagnosis:"))
    assert "failed with the same error: ZeroDivisionError" in first
    assert "script has a --local_rank option that no launcher passed it" in first
    assert first.endswith("add --local-rank-arg (the form's local rank arg: --local_rank)")


@pytest.mark.parametrize(
    ("field", "value"),
    [("local_rank", -1), ("local_rank", 10**9 + 1), ("local_rank", "0"), ("read", -(10**9) - 1),
     ("read", 2**63), ("read", 0.5), ("dashed", 1), ("dashed", "yes")],
)  # fmt: skip
def test_a_local_rank_note_out_of_bounds_is_refused(field, value):
    import msgspec

    from ddptui import protocol

    raw = {"kind": "note", "v": 1, "run": "r", "rank": 0, "t": 0.0, "seq": 1}
    raw.update(code="local_rank_arg", local_rank=1, read=None, dashed=False)
    (note,) = protocol.decode_batch(msgspec.msgpack.encode([raw]))
    assert (note.local_rank, note.read, note.dashed) == (1, None, False)
    raw[field] = value
    with pytest.raises(protocol.InvalidEvent):
        protocol.decode_batch(msgspec.msgpack.encode([raw]))
