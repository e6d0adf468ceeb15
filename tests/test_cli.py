"""Command line: bad input is refused in one line with exit code 2, before anything starts."""

import subprocess
import sys
from pathlib import Path

import pytest

from ddptui import cli
from ddptui.run.machine import Machine

ENV_NO_GPU = {"CUDA_VISIBLE_DEVICES": ""}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--no-ui", "--world-size", "0"], "--world-size must be at least 1"),
        (["--no-ui", "--world-size", "abc"], "--world-size must be a whole number"),
        (["--no-ui", "--backend", "mpi"], "unknown backend 'mpi'"),
        (["--no-ui", "--amp", "int8"], "unknown amp 'int8'"),
        (["--no-ui", "--launcher", "mpirun"], "unknown launcher 'mpirun'"),
        (["--no-ui", "--trainer", "nope"], "unknown trainer 'nope'"),
        (["--no-ui", "--backend", "nccl"], "backend nccl needs a CUDA GPU"),
        (["--no-ui", "--amp", "fp16"], "AMP fp16 needs a CUDA GPU"),
        (["--no-ui", "--epochs", "0"], "--epochs must be at least 1"),
        (["--no-ui", "--batch-size", "0"], "--batch-size must be at least 1"),
        (["--no-ui", "--script", "/no/such/train.py"], "script not found: /no/such/train.py"),
        (["--no-ui", "--resume", "/no/such.pt"], "cannot read resume checkpoint: /no/such.pt"),
        (["--no-ui", "--bogus-flag"], "unrecognized arguments: --bogus-flag"),
        (
            ["--no-ui", "--trainer", "mnist", "--data-dir", "/no/data"],
            "MNIST not found in /no/data",
        ),
        (["monitor", "--interval", "0.01"], "argument --interval/-i: must be at least 0.1 s"),
        (["monitor", "--count", "zero"], "argument --count/-n: must be a whole number"),
        (["replay", "/no/such/run"], "not a run directory"),
        # issue 7 defects 2 and 3, issue 12 item 5
        (["--no-ui", "--world-size", "100000"], "world size 100000 is more than"),
        (["--no-ui", "--world-size", "100000", "--oversubscribe"], "more than the 1024 ranks"),
        (["--no-ui", "--world-size", "9" * 5000], "--world-size must be a whole number"),
        (["--no-ui", "--model", "nonsense"], "unknown model 'nonsense' for the synthetic trainer"),
        (["--no-ui", "--init-method", "tcp://127.0.0.1:99999"], "port must be a number from 1"),
        (["--no-ui", "--init-method", "tcp://"], "has no host"),
        (["--no-ui", "--init-method", "tcp://:29500"], "has no host"),
        (["--no-ui", "--init-method", "file:///no/such/dir/x"], "/no/such/dir does not exist"),
        (["--no-ui", "--epochs", "10000000000"], "--epochs must be at most 1000000"),
        (["--no-ui", "--seed", str(2**64)], "--seed must be at most 4294967295"),
        (["--no-ui", "--lr", "inf"], "--lr must be a finite number"),
        (["--no-ui", "--lr", "1e400"], "--lr must be a finite number"),
        (["--no-ui", "--lr", "nan"], "--lr must be a finite number"),
        (["--no-ui", "--batch-size", "99999999999"], "--batch-size must be at most 1048576"),
        (["--no-ui", "--workers", "-1"], "--workers must be at least 0"),
        (["--no-ui", "--workers", "100000"], "--workers must be at most 64"),
        (["--no-ui", "--device", "tpu"], "unknown device 'tpu'"),
        (["--no-ui", "--device", "cuda"], "--device cuda needs a CUDA GPU"),
        (["--no-ui", "--run-dir", "r/" + "x" * 256], "--run-dir has a name longer than 255"),
        (["--no-ui", "--run-dir", "r" * 5000], "--run-dir has a name longer than 255"),
        (["--no-ui", "--run-dir", "a/" * 2100], "--run-dir is longer than 4095 bytes"),
        (["--no-ui", "--run-dir", "a\x00b"], "--run-dir contains a NUL byte"),
        (["--no-ui", "--resume", "y" * 300], "--resume has a name longer than 255"),
        (["--no-ui", "--resume", "\x00"], "--resume contains a NUL byte"),
        (["--no-ui", "--script", "z" * 300 + ".py"], "--script has a name longer than 255"),
        (["--no-ui", "--", "--epochs", "x"], "the synthetic trainer refuses its arguments"),
        (["--no-ui", "--", "--bogus"], "unrecognized arguments: --bogus"),
        (["monitor", "--interval", "inf"], "argument --interval/-i: must be at least 0.1 s"),
        (["monitor", "--interval", "1e308"], "at most 86400 s, got '1e308'"),
        (["monitor", "--interval", "nan"], "argument --interval/-i"),
        (["monitor", "--interval", "-1"], "argument --interval/-i"),
        (["monitor", "--count", "9" * 30], "argument --count/-n: must be at least 1 and at most"),
        (["monitor", "--bogus"], "unrecognized arguments: --bogus"),
        (["replay"], "the following arguments are required: RUN_DIR"),
        (["replay", "r" * 300], "cannot open run directory"),
        (["replay", "a\x00"], "cannot open run directory"),
        (["bogus"], "unknown command 'bogus'"),
    ],
)
def test_bad_input_one_line_exit_2(argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("ddptui: error: ")
    assert message in err and len(err) < 400
    assert list(tmp_path.iterdir()) == []  # nothing was started or written


def _files(path):
    return sorted(p.relative_to(path) for p in path.rglob("*"))


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda d: d.joinpath("c.pt").write_bytes(b""), "is an empty file, not a checkpoint"),
        (lambda d: d.joinpath("c.pt").write_bytes(b"junk" * 99), "is not a checkpoint"),
    ],
)
def test_resume_of_a_file_that_is_no_checkpoint(make, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    make(tmp_path)
    assert cli.main(["--no-ui", "--resume", "c.pt"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err
    assert _files(tmp_path) == [Path("c.pt")]


def test_script_that_is_not_python(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_bytes(bytes(range(256)))
    assert cli.main(["--no-ui", "--script", "train.py"]) == 2
    assert "script train.py is not Python" in capsys.readouterr().err
    assert _files(tmp_path) == [Path("train.py")]


def test_more_cuda_ranks_than_gpus_refused_from_the_cli(capsys, tmp_path, monkeypatch):
    """A faked one-GPU machine: the default (auto) device and backend refuse 2 ranks at once,
    naming the GPU count and --device cpu; --device cpu is accepted (not launched here)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(Machine, "detect", classmethod(lambda cls: Machine(1, "", 16)))
    assert cli.main(["--no-ui", "--world-size", "2"]) == 2
    err = capsys.readouterr().err
    assert "world size 2 is more than the 1 GPU(s) visible here" in err and "--device cpu" in err
    cfg = cli.build_config({"device": "cpu", "world_size": "2"})
    assert (cfg.device, cfg.backend, cfg.world_size) == ("cpu", "gloo", 2)


def test_real_process_prints_no_traceback(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "ddptui.cli", "--no-ui", "--world-size", "-3"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert proc.returncode == 2
    assert proc.stderr == "ddptui: error: --world-size must be at least 1, got -3\n"
    assert proc.stdout == ""


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--no-ui", "--world-size", "100000"], "world size 100000 is more than"),
        (["--no-ui", "--model", "nonsense"], "unknown model 'nonsense'"),
        (["--no-ui", "--lr", "1e400"], "--lr must be a finite number"),
        (["--no-ui", "--init-method", "tcp://127.0.0.1:99999"], "port must be a number"),
        (["--no-ui", "--resume", "garbage.pt"], "is not a checkpoint"),
        (["--no-ui", "--", "--epochs", "x"], "the synthetic trainer refuses its arguments"),
        (["monitor", "--interval", "1e308"], "argument --interval/-i"),
        (["replay", "x" * 300], "cannot open run directory"),
    ],
)
@pytest.mark.slow
def test_real_process_refusals_start_nothing(argv, message, tmp_path):
    (tmp_path / "garbage.pt").write_bytes(b"\x00garbage" * 100)
    before = _files(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-m", "ddptui.cli", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("ddptui: error: ") and proc.stderr.count("\n") == 1
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert proc.stdout == ""
    assert _files(tmp_path) == before  # no run directory, no events


def test_monitor_has_one_parser_for_both_entry_points(capsys):
    from ddptui.monitor import cli as monitor_cli

    for argv in (["--interval", "inf"], ["--count", "0"], ["--interval", "x"]):
        assert cli.main(["monitor", *argv]) == 2
        via_ddptui = capsys.readouterr().err
        assert monitor_cli.main(argv) == 2
        assert capsys.readouterr().err == via_ddptui
    assert cli.main(["monitor", "--help"]) == 0
    via_ddptui = capsys.readouterr().out
    with pytest.raises(SystemExit) as info:  # python -m ddptui.monitor.cli --help
        monitor_cli.main(["--help"])
    assert info.value.code == 0 and capsys.readouterr().out == via_ddptui
    for flag in ("--interval", "--count", "--json", "--no-ui"):
        assert flag in via_ddptui


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--help"], ["--device", "--workers", "--oversubscribe", "ddptui monitor"]),
        (["run", "--help"], ["--device", "--world-size"]),
        (["replay", "--help"], ["RUN_DIR", "--no-ui"]),
    ],
)
def test_help_still_works(argv, expected, capsys):
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert all(text in out for text in expected)


@pytest.mark.parametrize("name", sorted(cli.COMMANDS))
def test_every_commands_help_prints_its_options(name, capsys):
    """``ddptui bench --help`` died with a traceback: a help text's ``%`` (``±10%)``) is a
    format character to argparse."""
    if not cli.COMMANDS[name].available():
        pytest.skip(f"ddptui {name} is not part of this installation")
    assert cli.main([name, "--help"]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("usage: ddptui ") and "--" in captured.out
    assert "Traceback" not in captured.err


def test_headless_path_never_imports_textual():
    """The runtime half of the import-linter contract (pyproject.toml): headless, runs, run and
    monitor never import Textual, statically; cli imports it only inside the functions that
    open a dashboard, so importing cli and building a config must load none of it."""
    code = (
        "import sys\n"
        "import ddptui.cli\n"
        "from ddptui.run.config import build_config, Machine\n"
        "build_config({}, Machine(0, 'none', 2))\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('textual', 'textual_plotext')"
        " or m.startswith('ddptui.tui'))\n"
        "print(bad)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_help_lists_every_run_option(capsys):
    with pytest.raises(SystemExit) as info:
        cli.run_parser().parse_args(["--help"])
    assert info.value.code == 0
    text = capsys.readouterr().out
    for flag in (
        "--trainer",
        "--script",
        "--launcher",
        "--backend",
        "--amp",
        "--world-size",
        "--epochs",
        "--batch-size",
        "--lr",
        "--seed",
        "--data-dir",
        "--run-dir",
        "--resume",
        "--init-method",
        "--sync-bn",
        "--device",
        "--workers",
        "--oversubscribe",
        "--no-ui",
        "--start",
    ):
        assert flag in text


def test_run_directory_that_cannot_be_created_is_one_line_not_a_traceback(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "ddptui.cli", "--no-ui", "--run-dir", "/proc/ddptui-test/run"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith("ddptui: error: cannot write /proc/ddptui-test")
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
