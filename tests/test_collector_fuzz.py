"""A real 2-rank run under a flood of hostile messages to its collector: the run finishes,
every legitimate event is recorded, nothing hostile is stored, ddptui's memory stays bounded."""

import subprocess
import sys
import time

import psutil
import pytest

from ddptui import protocol
from ddptui.run.config import build_config
from ddptui.run.machine import Machine
from ddptui.run.session import RunSession
from tests.helpers import ROOT, processes_of_run

pytestmark = pytest.mark.slow
CPU = Machine(0, "no CUDA", 2)
SENDER = ROOT / "tests" / "scripts" / "hostile_sender.py"
HOSTILE_MESSAGES = 10_000
#: ddptui's resident memory may grow by at most this much during the run.
RSS_GROWTH_LIMIT = 100 * 1024 * 1024


def test_hostile_messages_during_a_real_run_change_nothing(tmp_path):
    raw = {
        "run_dir": str(tmp_path / "run"),
        "trainer": "synthetic",
        "launcher": "spawn",
        "world_size": "2",
        "epochs": "1",
    }
    session = RunSession(build_config(raw, CPU))
    beats = []  # heartbeats: they repeat a rank's last seq, and events.jsonl keeps only some
    apply = session.state.apply

    def counting(event, now=None):
        if type(event) is protocol.Beat:
            beats.append(event)
        return apply(event, now)

    session.state.apply = counting
    me = psutil.Process()
    sender = None
    with session:
        session.start()
        rss_before = rss_max = me.memory_info().rss
        sender = subprocess.Popen(
            [
                sys.executable,
                str(SENDER),
                session.collector.endpoint,
                session.cfg.run_id,
                "2",
                "--min",
                str(HOSTILE_MESSAGES),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            deadline = time.monotonic() + 120
            while session.poll() is None and time.monotonic() < deadline:
                session.pump(0.1)
                rss_max = max(rss_max, me.memory_info().rss)
            assert session.result is not None, "the run did not end in time"
            sender.stdin.close()
            # Whatever the sender still has queued is read too, before the socket closes.
            while sender.poll() is None and time.monotonic() < deadline:
                session.pump(0.1)
            for _ in range(10):
                session.pump(0.05)
            rss_max = max(rss_max, me.memory_info().rss)
        finally:
            if sender.poll() is None:
                sender.kill()
            sent = int(sender.stdout.read() or 0)
            sender.wait()
    state, stats = session.state, session.stats
    assert session.result.ok, session.result
    assert sent >= HOSTILE_MESSAGES
    assert stats.rejected >= HOSTILE_MESSAGES
    # Every legitimate event: both ranks (no others), every step of the epoch, no seq gap.
    assert sorted(state.ranks) == [0, 1] and state.events_ignored == 0
    assert state.steps_per_epoch
    for view in state.ranks.values():
        assert view.state == "finished"
        assert view.step == state.steps_per_epoch and view.ended_epoch == 1
        assert view.gaps == 0 and view.reporter_dropped == 0
    assert stats.received == state.events_applied
    assert state.events_applied - len(beats) == sum(v.last_seq + 1 for v in state.ranks.values())
    # events.jsonl holds exactly those events (the beats of ranks that stepped left out).
    kept = [protocol.from_json(line) for line in session.events_path.read_bytes().splitlines()]
    kept_beats = sum(type(e) is protocol.Beat for e in kept)
    assert len(kept) - kept_beats == stats.received - len(beats)
    assert {e.rank for e in kept} == {0, 1}
    assert rss_max - rss_before < RSS_GROWTH_LIMIT, (rss_before, rss_max)
    print(
        f"hostile messages sent {sent}, rejected {stats.rejected}, "
        f"RSS {rss_before / 2**20:.0f} -> max {rss_max / 2**20:.0f} MiB"
    )
    assert processes_of_run(session.cfg.run_id) == []
