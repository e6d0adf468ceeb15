"""Command line: bad input is refused in one line with exit code 2, before anything starts."""

import subprocess
import sys

import pytest

from ddptui import cli

ENV_NO_GPU = {"CUDA_VISIBLE_DEVICES": ""}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--no-ui", "--world-size", "0"], "--world-size must be at least 1"),
        (["--no-ui", "--world-size", "abc"], "--world-size must be a whole number"),
        (["--no-ui", "--backend", "mpi"], "unknown backend 'mpi'"),
        (["--no-ui", "--amp", "int8"], "unknown amp 'int8'"),
        (["--no-ui", "--launcher", "slurm"], "unknown launcher 'slurm'"),
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
        (["monitor", "--interval", "0.01"], "--interval must be at least 0.1"),
        (["monitor", "--count", "zero"], "--count must be a whole number"),
        (["replay", "/no/such/run"], "not a run directory"),
    ],
)
def test_bad_input_one_line_exit_2(argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("ddptui: error: ")
    assert message in err
    assert not (tmp_path / "runs").exists()  # nothing was started or written


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


def test_headless_path_never_imports_textual():
    code = (
        "import sys\n"
        "import ddptui.cli, ddptui.headless, ddptui.session, ddptui.replay\n"
        "import ddptui.monitor.cli\n"
        "from ddptui.config import build_config, Machine\n"
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
    assert proc.stderr.startswith("ddptui: error: cannot start the run in /proc/ddptui-test/run")
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
