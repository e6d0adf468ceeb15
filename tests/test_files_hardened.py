"""Issue 23: the files ddptui reads and writes hold up like its flags. Every hostile file or
path is answered in one line with the right exit code (2 usage, 1 a run's own failure), no
command hangs on a FIFO, and no output replaces a run's file."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ddptui import cli
from ddptui.run.state import MAX_SEQ_GAP, RunState
from ddptui.runfiles import RunDir
from ddptui.runs import export
from tests.data_fixtures.record import RUNS
from tests.test_safeio import small_tmpfs
from tests.tui_fixtures.fakes import FAILED_RUN

RUN = RUNS / "amp-off"
DEEP = "[" * 100_000 + "]" * 100_000
LONG = "x" * 5000


def _one_line(capsys, code: int, got: int, *needles: str) -> str:
    out, err = capsys.readouterr()
    assert got == code, (out, err)
    assert err.count("\n") == 1 and err.startswith("ddptui: error: "), err
    assert len(err) < 700 and "Traceback" not in out + err
    for needle in needles:
        assert needle in err, err
    return err


def _hostile(tmp_path: Path, name: str, how: str, src: Path = RUN) -> Path:
    """A copy of a recorded run whose file ``name`` is replaced by ``how``."""
    run = tmp_path / f"{how}-{name.replace('.', '_')}"
    shutil.copytree(src, run)
    (run / "checkpoint.pt").write_bytes(b"")
    target = run / name
    target.unlink(missing_ok=True)
    if how == "deep":
        target.write_text(DEEP if name == "config.json" else '{"outcome": ' + DEEP + "}")
    elif how == "zero":
        target.symlink_to("/dev/zero")
    elif how == "fifo":
        os.mkfifo(target)
    return run


# -- readers: deep JSON, /dev/zero, FIFOs (replay, compare, export, attach, --resume DIR) ---------
COMMANDS = {
    "replay": lambda run: ["replay", "--no-ui", str(run)],
    "compare": lambda run: ["compare", "--no-ui", str(run), str(RUN)],
    "export": lambda run: ["export", str(run), "--csv", "-"],
    "attach": lambda run: ["attach", str(run)],
    "resume": lambda run: ["--no-ui", "--resume", str(run)],
}


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize(
    ("name", "how", "needle"),
    [
        ("config.json", "deep", "nested more than 64 levels"),
        ("config.json", "zero", "a character device, not a regular file"),
        ("config.json", "fifo", "a FIFO, not a regular file"),
        ("events.jsonl", "zero", "events.jsonl: a character device, not a regular file"),
        ("events.jsonl", "fifo", "events.jsonl: a FIFO, not a regular file"),
    ],
)
def test_a_hostile_run_file_is_one_line(tmp_path, capsys, command, name, how, needle):
    run = _hostile(tmp_path, name, how)
    if command == "resume" and name == "events.jsonl":
        needle = "checkpoint.pt is an empty file"  # --resume reads config.json and checkpoint
    _one_line(capsys, 2, cli.main(COMMANDS[command](run)), needle)


@pytest.mark.parametrize("command", ["replay", "compare", "export"])
@pytest.mark.parametrize("how", ["deep", "zero", "fifo"])
def test_a_hostile_summary_is_ignored_and_the_run_derived(tmp_path, capsys, command, how):
    run = _hostile(tmp_path, "summary.json", how)
    assert cli.main(COMMANDS[command](run)) == 0
    out, err = capsys.readouterr()
    assert err == "" and out


def test_a_fifo_as_a_failed_runs_rank_log_does_not_hang_replay(tmp_path, capsys):
    run = _hostile(tmp_path, "rank-0.log", "fifo", src=FAILED_RUN)
    os.unlink(run / "rank-1.log")
    os.mkfifo(run / "rank-1.log")
    assert cli.main(["replay", "--no-ui", str(run)]) == 0
    assert "FAILED" in capsys.readouterr().out


def test_attach_lists_live_runs_and_notes_the_unreadable(tmp_path, capsys):
    root = tmp_path / "root"
    root.mkdir()
    for how in ("deep", "zero", "fifo"):
        run = _hostile(root, "config.json", how)
        RunDir(run).summary.unlink()
    assert cli.main(["attach", "--runs-root", str(root)]) == 0
    out = capsys.readouterr().out
    assert out.count("skipped: ") == 3 and "no live runs" in out


# -- outputs --------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["events.jsonl", "config.json", "summary.json", "checkpoint.pt"])
def test_export_never_replaces_a_file_of_a_run(tmp_path, capsys, name):
    run = tmp_path / "run"
    shutil.copytree(RUN, run)
    (run / "checkpoint.pt").write_bytes(b"weights")
    before = (run / name).read_bytes()
    _one_line(capsys, 2, export.main([str(run), "--csv", str(run / name)]), name, "refusing")
    assert (run / name).read_bytes() == before


def test_export_to_devices_and_fifos_streams(tmp_path, capsys):
    try:
        os.mknod(tmp_path / "null", 0o666 | 0o020000, os.makedev(1, 3))
        os.mknod(tmp_path / "full", 0o666 | 0o020000, os.makedev(1, 7))
    except PermissionError:
        pytest.skip("mknod needs root")
    assert export.main([str(RUN), "--csv", str(tmp_path / "null")]) == 0
    capsys.readouterr()
    _one_line(capsys, 1, export.main([str(RUN), "--csv", str(tmp_path / "full")]), "No space left")
    assert (tmp_path / "null").is_char_device() and (tmp_path / "full").is_char_device()


def test_export_from_a_read_only_directory_is_one_line(tmp_path, capsys, monkeypatch):
    with small_tmpfs(tmp_path / "ro", read_only=True) as ro:
        monkeypatch.chdir(ro)
        _one_line(capsys, 1, export.main([str(RUN), "--csv", "out.csv"]), "Read-only file system")


@pytest.mark.parametrize(
    "argv",
    [
        ["export", str(RUN), "--csv", f"/tmp/{LONG}"],
        ["export", str(RUN), "--tensorboard", f"/tmp/{LONG}"],
        ["export", f"/tmp/{LONG}", "--csv", "-"],
        ["attach", f"/tmp/{LONG}"],
        ["replay", "--no-ui", f"/tmp/{LONG}"],
        ["compare", "--no-ui", f"/tmp/{LONG}", str(RUN)],
        ["bench", "--no-ui", "--bench-dir", f"/tmp/{LONG}"],
    ],
)
def test_a_path_too_long_is_one_line(capsys, argv):
    got = cli.main(argv)
    err = _one_line(capsys, got, got)
    assert got in (1, 2) and "x" * 200 not in err  # the path is clipped where it is echoed


# -- run options ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--init-method", "tcp://[::1"], "an IPv6 host needs a closing ]"),
        (["--init-method", "file://[x/y"], "needs an absolute path"),
        (["--init-method", "tcp://256.256.256.256:29500"], "is not an IPv4 address"),
        (["--print-sbatch", "--launcher", "slurm", "--lr", "nan"], "--lr must be a finite"),
        (["--world-size", ""], "--world-size needs a value"),
        (["--lr", " "], "--lr needs a value"),
        (["--trainer", ""], "--trainer needs a value"),
        (["--script", ""], "--script needs a value"),
        (["--start"], "--start is for the dashboard"),
        (["--script", "x.py", "--trainer", "mnist"], "--trainer is for the built-in trainers"),
        (["--script", "x.py", "--model", "resnet50"], "--model is for the built-in trainers"),
        (["--script", "x.py", "--amp", "bf16"], "--amp is for the built-in trainers"),
        (["--script", "x.py", "--amp", "\x1b[2J" + "x" * 5000], "--amp is for the built-in"),
        # the trainers' options, which a script never reads: refused, not silently ignored
        (["--script", "x.py", "--lr", "0.1"], "--lr is for the built-in trainers"),
        (["--script", "x.py", "--batch-size", "64"], "--batch-size is for the built-in"),
        (["--script", "x.py", "--seed", "1"], "--seed is for the built-in trainers"),
        (["--script", "x.py", "--workers", "2"], "--workers is for the built-in trainers"),
        (["--script", "x.py", "--data-dir", "d"], "--data-dir is for the built-in trainers"),
        (["--script", "x.py", "--sync-bn"], "--sync-bn is for the built-in trainers"),
        (["--hang-timeout", "9" * 5000], "--hang-timeout must be"),
        (["--hang-timeout", "1" + "0" * 300], "--hang-timeout must be 0 (off)"),
    ],
)
def test_run_options_refused_in_one_line(capsys, argv, needle):
    _one_line(capsys, 2, cli.main(["--no-ui", *argv]), needle)


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--world-size", "1,,2"], "--world-size has an empty value in '1,,2'"),
        (["--backend", "gloo,"], "--backend has an empty value"),
        (["--launcher", "dp", "--world-size", "2"], "it takes no --world-size or --backend"),
        (["--launcher", "dp", "--backend", "gloo"], "it takes no --world-size or --backend"),
        (["--script", "x.py", "--lr", "0.1"], "--lr is for the built-in trainers"),
        (["--script", "x.py", "--sync-bn"], "--sync-bn is for the built-in trainers"),
    ],
)
def test_bench_options_refused_in_one_line(capsys, argv, needle):
    _one_line(capsys, 2, cli.main(["bench", "--no-ui", *argv]), needle)


@pytest.mark.parametrize("where", [".", "sub"])
def test_bench_never_writes_into_a_run_directory(tmp_path, capsys, where):
    run = tmp_path / "run"
    shutil.copytree(RUN, run)
    before = sorted(p.name for p in run.iterdir())
    got = cli.main(["bench", "--no-ui", "--bench-dir", str(run / where)])
    _one_line(capsys, 2, got, "is (inside) a run directory")
    assert sorted(p.name for p in run.iterdir()) == before


def test_a_bad_endpoint_is_echoed_clipped():
    env = {**os.environ, "DDPTUI_ENDPOINT": "9" * 5000}
    done = subprocess.run(
        [sys.executable, "-c", "import ddptui; ddptui.log(loss=1.0)"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "telemetry off" in done.stderr and max(map(len, done.stderr.splitlines())) < 300


# -- front ends without a terminal, narrow encodings ----------------------------------------------
def _ddptui(*argv: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ddptui.cli", *argv],
        env={**os.environ, **env},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_dashboard_without_a_terminal_says_so():
    done = _ddptui("replay", str(RUN), TERM="dumb")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip() == (
        "ddptui: error: the dashboard needs a terminal (stdin is not one); use --no-ui"
    )


def test_replay_prints_in_ascii():
    done = _ddptui("replay", "--no-ui", str(RUN), PYTHONIOENCODING="ascii")
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert "finished (exit code 0)" in done.stdout


# -- a forged sequence number ---------------------------------------------------------------------
def test_a_forged_seq_jump_is_one_gap_and_named(tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(RUN, run)
    RunDir(run).summary.unlink()
    events = [json.loads(x) for x in RunDir(run).events.read_text().splitlines()]
    forged = dict(next(e for e in events if e["kind"] == "step" and e["rank"] == 0))
    forged["seq"] = 1_000_000
    with open(RunDir(run).events, "a") as f:
        f.write(json.dumps(forged) + "\n")
    from ddptui.run.rundir import load_run

    _, state, summary = load_run(run)
    assert state.dropped <= 1
    assert summary["events"]["seq_jumps"] == [
        {"rank": 0, "from": state.ranks[0].seq_jump[0], "to": 1_000_000}
    ]


def test_plausible_gaps_still_count_every_drop():
    from ddptui import protocol

    state = RunState("r", 1)
    for seq in (0, 1, 50, 50 + MAX_SEQ_GAP + 2):
        state.apply(protocol.Step(run="r", rank=0, t=1.0, seq=seq, epoch=1, step=seq))
    assert state.dropped == 48 + 1
    assert state.seq_jumps == [(0, 50, 50 + MAX_SEQ_GAP + 2)]
