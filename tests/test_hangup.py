"""The terminal going away (SIGHUP: an ssh session dropped, a tmux server killed) tears a run
down as SIGTERM does, where its default ended ddptui at once: no ``summary.json``, the trace
sockets' folder left in /tmp. ``nohup`` (SIGHUP ignored) is respected."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import signal
import subprocess
import sys
import termios
import textwrap

import pytest

from ddptui.run.signals import DEFERRED, teardown_signals
from tests.helpers import USER_SCRIPT, processes_of_run, wait_for_steps


def test_sighup_tears_down_unless_ignored():
    before = signal.getsignal(signal.SIGHUP)
    try:
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
        assert teardown_signals() == (*DEFERRED, signal.SIGHUP)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # started under nohup
        assert teardown_signals() == DEFERRED
    finally:
        signal.signal(signal.SIGHUP, before)


def test_after_a_hangup_the_streams_that_were_the_terminal_write_nowhere(tmp_path):
    """A hung-up terminal fails every write with EIO (and ``isatty`` says it is none):
    the teardown's lines must not end it. A stream to a file keeps its file."""
    child = textwrap.dedent(
        f"""
        import os, pty
        from ddptui.run.signals import quiet_lost_terminal
        master, slave = pty.openpty()
        os.dup2(slave, 1)
        log = os.open({str(tmp_path / "err")!r}, os.O_WRONLY | os.O_CREAT)
        os.dup2(log, 2)
        os.close(master)  # the terminal goes away
        try:
            os.write(1, b"x")
            raise SystemExit("wrote to a hung-up terminal")
        except OSError:
            pass
        quiet_lost_terminal()
        os.write(1, b"teardown line\\n")  # to /dev/null now
        os.write(2, b"kept\\n")
        """
    )
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "err").read_text() == "kept\n"


def _controlling_terminal() -> None:
    """In the child: the pty on fd 0 becomes its terminal, and SIGHUP is taken as a user at a
    terminal has it (a suite run under ``nohup`` hands its children SIGHUP ignored, which
    ddptui respects: it would outlive the hangup by design)."""
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


@pytest.mark.slow
def test_headless_run_whose_terminal_hangs_up_is_torn_down_with_its_summary(tmp_path):
    """``ddptui --no-ui`` in a terminal that goes away mid-run: exit 129, the run
    ``interrupted`` in summary.json, every rank gone, nothing left in its temporary folder."""
    run_dir, tmp = tmp_path / "run", tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp), "XDG_RUNTIME_DIR": str(tmp)}
    cmd = [
        sys.executable, "-m", "ddptui.cli", "--no-ui", "--world-size", "1",
        "--script", str(USER_SCRIPT), "--run-dir", str(run_dir),
        "--", "--steps", "100000", "--sleep", "0.01",
    ]  # fmt: skip
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        cmd,
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env=env,
        start_new_session=True,
        preexec_fn=_controlling_terminal,
    )
    os.close(slave)
    run_id = None
    try:
        run_id = wait_for_steps(run_dir, 5)
        os.close(master)  # the terminal goes away: SIGHUP to its session's leader
        master = None
        assert proc.wait(timeout=60) == 128 + signal.SIGHUP
    finally:
        if master is not None:
            os.close(master)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for left in processes_of_run(run_id) if run_id else ():
            left.kill()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["outcome"], summary["exit_code"]) == ("interrupted", 129)
    assert processes_of_run(run_id) == []
    assert [p.name for p in tmp.iterdir() if p.name.startswith("ddptui-")] == []
