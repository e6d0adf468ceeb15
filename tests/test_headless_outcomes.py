"""Honest outcomes of headless runs: a run directory that fails mid-run (summary.json of a
finished run: test_headless.py; signals during start-up: test_orphans.py)."""

import errno
import json
import time

import pytest

from ddptui.run.config import build_config
from ddptui.run.session import RunSession
from ddptui.runfiles import RunDir
from tests.helpers import processes_of_run, read_events

pytestmark = pytest.mark.slow


class _FillsUp:
    """A file that accepts ``room`` bytes, then fails like a full disk."""

    def __init__(self, real, room):
        self.real, self.room = real, room

    def append(self, data):
        if len(data) > self.room:
            raise OSError(errno.ENOSPC, "No space left on device")
        self.room -= len(data)
        return self.real.append(data)

    @property
    def size(self):  # what has been written, as a LineAppender says
        return self.real.size

    def deleted(self):
        return self.real.deleted()

    def close(self):
        self.real.close()


def test_full_disk_mid_run_stops_every_worker_and_keeps_what_was_written(tmp_path):
    cfg = build_config({"run_dir": str(tmp_path / "run"), "epochs": "2"})
    session = RunSession(cfg)
    try:
        session.start()
        session._events_file = _FillsUp(session._events_file, room=4000)
        deadline = time.monotonic() + 120
        while session.poll() is None and time.monotonic() < deadline:
            session.pump(0.1)
        assert session.result is not None
        assert session.fault is not None
        assert "events.jsonl" in session.fault and "ENOSPC" in session.fault
        assert "\n" not in session.fault
        assert processes_of_run(cfg.run_id) == []
    finally:
        session.close()
    kept = read_events(tmp_path / "run")  # every line on disk is a whole event
    assert kept and 0 < RunDir(tmp_path / "run").events.stat().st_size <= 4000
    summary = json.loads(RunDir(tmp_path / "run").summary.read_text())
    assert summary["outcome"] == "failed" and summary["exit_code"] == 1
    assert "ENOSPC" in summary["failure"]["error"]
