"""The diagnosis options (--hang-timeout, --on-hang, --no-instrument), the hung outcome, and
the probe's cgroup reading: no processes started."""

import pytest

from ddptui import cli
from ddptui.constants import NO_INSTRUMENT_ENV
from ddptui.run.config import build_config
from ddptui.run.diagnosis import MemoryState
from ddptui.run.machine import Machine
from ddptui.run.probe import RankProbe, read_cgroup_memory
from ddptui.run.rundir import EXIT_CODES, decide_outcome
from ddptui.run.session import RunSession, make_launcher
from ddptui.run.state import RunState

CPU = Machine(0, "no GPU", 2)


def config(tmp_path, **raw):
    return build_config({"run_dir": str(tmp_path / "run"), **raw}, CPU)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--hang-timeout", "-1"], "--hang-timeout must be 0 (off) or seconds up to"),
        (["--hang-timeout", "nan"], "--hang-timeout must be a finite number"),
        (["--hang-timeout", "1e400"], "--hang-timeout must be a finite number"),
        (["--hang-timeout", "soon"], "--hang-timeout must be a number"),
        (["--on-hang", "panic"], "unknown on hang 'panic' (choose from stop, keep)"),
    ],
)
def test_bad_diagnosis_options_are_one_line_exit_2(argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["--no-ui", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


@pytest.mark.parametrize(
    "raw, timeout, on_hang, instrument",
    [
        ({}, None, "stop", True),
        ({"hang_timeout": "0"}, 0.0, "stop", True),
        ({"hang_timeout": " 12.5 ", "on_hang": "KEEP"}, 12.5, "keep", True),
        ({"no_instrument": True}, None, "stop", False),
    ],
)
def test_diagnosis_options_reach_the_config(tmp_path, raw, timeout, on_hang, instrument):
    cfg = config(tmp_path, **raw)
    assert (cfg.hang_timeout, cfg.on_hang, cfg.instrument) == (timeout, on_hang, instrument)
    assert cfg.to_json_dict()["hang_timeout"] == timeout


def test_no_instrument_reaches_every_rank_through_the_environment(tmp_path):
    on = make_launcher(config(tmp_path), "tcp://127.0.0.1:5").environment()
    off = make_launcher(config(tmp_path, no_instrument=True), "tcp://127.0.0.1:5").environment()
    assert NO_INSTRUMENT_ENV not in on or on[NO_INSTRUMENT_ENV] != "1"
    assert off[NO_INSTRUMENT_ENV] == "1"


def test_the_session_takes_the_hang_options(tmp_path):
    session = RunSession(config(tmp_path, hang_timeout="7", on_hang="keep"))
    assert session.diagnoser.hang_timeout == 7.0 and session.on_hang == "keep"
    assert session.take_diagnoses() == []


def test_hung_is_an_outcome_with_exit_code_3():
    assert EXIT_CODES["hung"] == 3
    assert decide_outcome(failed=True, hung=True) == "hung"  # the teardown's failures
    assert decide_outcome(failed=False, hung=True, interrupted=True) == "interrupted"
    state = RunState("r", 2)
    state.ranks[0].state = "started"
    state.set_outcome("hung")
    assert state.ranks[0].state == "stopped" and state.status == "hung"


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_cgroup_v2_memory_and_oom_kills(tmp_path):
    write(tmp_path / "memory.current", "990\n")
    write(tmp_path / "memory.max", "1000\n")
    write(tmp_path / "memory.events", "low 0\nhigh 0\nmax 3\noom 1\noom_kill 2\n")
    assert read_cgroup_memory(tmp_path) == (990, 1000, 2)
    write(tmp_path / "memory.max", "max\n")
    assert read_cgroup_memory(tmp_path) == (990, None, 2)


def test_cgroup_v1_and_nothing_at_all(tmp_path):
    write(tmp_path / "memory" / "memory.usage_in_bytes", "5\n")
    write(tmp_path / "memory" / "memory.limit_in_bytes", str(1 << 62))
    write(tmp_path / "memory" / "memory.oom_control", "oom_kill_disable 0\noom_kill 4\n")
    assert read_cgroup_memory(tmp_path) == (5, None, 4)
    assert read_cgroup_memory(tmp_path / "absent") == (None, None, 0)


def test_probe_counts_only_oom_kills_during_the_run(tmp_path):
    write(tmp_path / "memory.current", "10\n")
    write(tmp_path / "memory.max", "1000\n")
    write(tmp_path / "memory.events", "oom_kill 5\n")
    probe = RankProbe(cgroup_root=tmp_path)
    assert probe.memory_state().oom_kills == 0
    write(tmp_path / "memory.events", "oom_kill 6\n")
    state = probe.memory_state()
    assert state.oom_kills == 1 and state.nearly_full() == "the cgroup counted 1 OOM kill(s)"


def test_probe_samples_a_live_process():
    import os

    probe = RankProbe()
    probe.sample({0: os.getpid(), 1: 2**31 - 1}, now=0.0)  # the second pid does not exist
    sum(i * i for i in range(200_000))
    probe.sample({0: os.getpid(), 1: 2**31 - 1}, now=1.0)
    assert probe.rss[0] > 0 and set(probe.rss) == {0}
    assert probe.cpu_percent()[0] >= 0
    assert isinstance(probe.memory_state(), MemoryState)


def test_a_rank_whose_process_changed_has_only_its_new_processes_cpu():
    """A spawner (rank 0 until its workers formed their group) idles: its samples must not
    make the worker that became rank 0 read as idle (the hang rule's evidence)."""
    import os
    from collections import deque

    probe = RankProbe()
    probe._cpu[0] = deque((float(t), 0.0) for t in range(10))  # the spawner's, idle
    probe.rss[0] = 1
    probe._io[0] = deque((float(t), 0) for t in range(10))  # the spawner's, still
    probe.sample({0: os.getpid()}, now=10.0)  # another pid: measurement starts afresh
    assert probe.cpu_percent() == {} and probe.rss == {}
    assert [at for at, _ in probe._io[0]] == [10.0]  # the new process's first reading
    sum(i * i for i in range(200_000))
    probe.sample({0: os.getpid()}, now=11.0)
    assert [at for at, _ in probe._cpu[0]] == [11.0]


def test_probe_measures_a_ranks_io_rate_from_its_own_readings():
    """ddptui's own evidence that a silent rank moves data: bytes a second over the window
    asked for, from /proc/<pid>/io of the rank (none with fewer than two readings)."""
    import os
    import tempfile
    from collections import deque

    probe = RankProbe()
    probe.sample({0: os.getpid()}, now=0.0)
    assert probe.io_rate() == {}  # one reading: no rate yet
    with tempfile.TemporaryFile() as f:
        f.write(bytes(4 << 20))  # 4 MiB written: this process's wchar
    probe.sample({0: os.getpid()}, now=2.0)
    assert probe.io_rate()[0] >= (4 << 20) / 2
    # rank 0 read 1 MB a second for 15 s, then nothing for 5 s
    probe._io[0] = deque((float(t), min(t, 15) * 1_000_000) for t in range(20))
    assert probe.io_rate()[0] == pytest.approx(15e6 / 19)
    assert probe.io_rate(4.0) == {0: 0.0}
    assert probe.io_rate(5.0)[0] == pytest.approx(1e6 / 5)
    probe._io[1] = deque([(3.0, 5), (4.0, 2)])  # a counter that went back: not negative
    assert probe.io_rate()[1] == 0.0


def test_probe_reads_cpu_over_the_window_asked_for():
    from collections import deque

    probe = RankProbe()
    # rank 0 busy for 15 s, then idle for 5 s (stopped); one sample a second
    probe._cpu[0] = deque((float(t), 100.0 if t < 15 else 0.0) for t in range(20))
    assert probe.cpu_percent()[0] == 75.0
    assert probe.cpu_percent(4.0) == {0: 0.0}  # samples at 15..19 s
    assert probe.cpu_percent(5.0)[0] == 100.0 / 6  # 14..19 s: one busy sample of six


def test_probe_looks_up_a_pid_that_is_not_here_once(monkeypatch):
    """A rank on another node: its pid means nothing here; not looked up every second."""
    import os

    import psutil

    looked = []
    real = psutil.Process

    def process(pid):
        looked.append(pid)
        return real(pid)

    monkeypatch.setattr(psutil, "Process", process)
    probe = RankProbe()
    absent = 2**22 + 7  # beyond the largest pid Linux gives
    for second in range(3):
        probe.sample({0: os.getpid(), 1: absent}, now=float(second))
    assert looked.count(absent) == 1 and looked.count(os.getpid()) == 1
    assert set(probe.rss) == {0}
    probe.sample({0: os.getpid(), 1: os.getpid()}, now=3.0)  # rank 1 restarted, here
    assert looked.count(os.getpid()) == 2
