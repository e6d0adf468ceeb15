"""Children start with the signal mask they would have had without ddptui: nothing that ddptui
does around a launch (holding Ctrl-C back until the process is remembered) leaks into the
driver, torchrun's agent or the ranks, and a script's own SIGTERM handler runs."""

import os
import re
import signal
import subprocess
import sys

import pytest

from ddptui.run.signals import signals_deferred
from tests.helpers import ROOT, processes_of_run

PROBE = ROOT / "tests" / "scripts" / "signal_probe.py"


def own_mask() -> str:
    with open("/proc/self/status") as status:
        return next(line.split()[1] for line in status if line.startswith("SigBlk:"))


def test_deferred_signal_is_delivered_after_the_start_and_the_mask_stays_clear():
    got = []
    old = signal.signal(signal.SIGTERM, lambda s, f: got.append(s))
    try:
        with signals_deferred():
            mask = own_mask()
            child = subprocess.run(
                ["grep", "SigBlk", "/proc/self/status"], capture_output=True, text=True
            )
            os.kill(os.getpid(), signal.SIGTERM)
            assert got == []  # held back while starting
        assert got == [signal.SIGTERM]  # delivered once the start is over
    finally:
        signal.signal(signal.SIGTERM, old)
    assert int(mask, 16) & (1 << (signal.SIGTERM - 1)) == 0
    assert child.stdout.split()[1] == mask


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["torchrun", "spawn"])
def test_ranks_and_launchers_inherit_no_blocked_signals(tmp_path, launcher):
    """Also, from the same run (one run per launcher serves both): a rank that returned
    normally leaves without native teardown (which could abort it with SIGABRT after it
    finished) and loses nothing it wrote: a file never flushed nor closed, and its atexit."""
    run_dir = tmp_path / "run"
    out = tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OUT_DIR": str(out)}
    cmd = [sys.executable, "-m", "ddptui.cli", "--no-ui", "--script", str(PROBE)]
    cmd += ["--world-size", "2", "--launcher", launcher, "--run-dir", str(run_dir)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    finally:
        run_id = (run_dir / "config.json").read_text().split('"run_id": "')[1].split('"')[0]
        for leftover in processes_of_run(run_id):
            leftover.kill()
    log = (run_dir / "rank-0.log").read_text()
    assert proc.returncode == 0, proc.stdout + proc.stderr + log
    line = next(line for line in log.splitlines() if line.startswith("SIGBLK"))
    masks = dict(item.split("=") for item in line.split()[1:])
    # the rank, and its parent (the agent or the driver), and the driver under torchrun
    pids = list(masks)[: 3 if launcher == "torchrun" else 2]
    clear = own_mask()
    for pid in pids:
        assert masks[pid] == clear, f"{line} (expected {clear})"
    assert re.search(r"^SIGTERM handled$", log, re.M), log
    for rank in (0, 1):  # the fast exit kept what each rank wrote, and ran its atexit
        assert (out / f"rank{rank}").read_text() == "kept\n"
        assert (out / f"atexit{rank}").exists()
