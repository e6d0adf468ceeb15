"""HostSource against the real machine and real child processes started here."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import namedtuple

import psutil
import pytest

from ddptui.monitor import NA, HostSource, RankInfo, SystemMonitor, join_ranks
from ddptui.monitor.host import _CpuMeter
from tests.fake_nvml import FakeGpu, FakeNvml

# A busy child that starts a sleeping grandchild and prints the grandchild's pid.
CHILD = """
import subprocess, sys, time
g = subprocess.Popen([sys.executable, "-c", "import time; print(1, flush=True); time.sleep(60)"],
                     stdout=subprocess.PIPE)
g.stdout.readline()
print(g.pid, flush=True)
end = time.monotonic() + 60
while time.monotonic() < end:
    pass
"""


@pytest.fixture
def tree():
    """(child pid, grandchild pid): a busy child and its sleeping grandchild; killed after."""
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True)
    grandchild = None
    try:
        grandchild = int(child.stdout.readline())
        yield child.pid, grandchild
    finally:
        for pid in (grandchild, child.pid):
            if pid is not None:
                try:
                    psutil.Process(pid).kill()
                except psutil.NoSuchProcess:
                    pass
        child.wait(10)
        child.stdout.close()


def test_host_snapshot_is_sane():
    source = HostSource()
    time.sleep(source.cpu_warmup_remaining())
    host, procs = source.sample()
    assert procs == ()
    assert host.cpu_count == psutil.cpu_count()
    assert host.cpu_percent is not NA and 0.0 <= host.cpu_percent <= 100.0
    assert len(host.cpu_percent_per_core) == host.cpu_count
    assert all(0.0 <= c <= 100.0 for c in host.cpu_percent_per_core)
    assert host.load_average is not NA and len(host.load_average) == 3
    assert 0 < host.memory_used <= host.memory_total
    assert host.memory_available <= host.memory_total
    assert 0 <= host.memory_percent <= 100
    assert 0 <= host.swap_used <= max(host.swap_total, 0) or host.swap_total == 0


def test_cpu_with_no_time_accounted_is_na_not_zero(monkeypatch):
    frozen = psutil.cpu_times(), psutil.cpu_times(percpu=True)
    monkeypatch.setattr(HostSource, "_read_cpu_times", staticmethod(lambda: frozen))
    host, _ = HostSource().sample()
    assert host.cpu_percent is NA and host.cpu_percent_per_core == ()


Times = namedtuple("Times", "user nice system idle iowait guest")


@pytest.mark.parametrize(
    ("readings", "expected"),
    [
        # (user, system, idle, iowait, guest) cumulative seconds, one reading per update
        ([(0, 0, 0, 0, 0)], [NA]),  # no time accounted yet: no answer, not 0
        ([(1, 0, 3, 0, 0)], [25.0]),
        ([(1, 1, 2, 0, 0), (2, 2, 4, 0, 0)], [50.0, 50.0]),
        ([(1, 0, 1, 0, 0), (1, 0, 1, 0, 0), (2, 0, 4, 0, 0)], [50.0, 50.0, 25.0]),  # stalled
        ([(0, 0, 1, 1, 0), (1, 0, 2, 0.5, 0)], [0.0, 50.0]),  # iowait went back: clamped
        ([(2, 0, 2, 0, 2)], [50.0]),  # guest time is already inside user time
        ([(0, 0, 0, 2, 0)], [0.0]),  # waiting on I/O is not busy
    ],
)
def test_cpu_meter(readings, expected):
    meter = _CpuMeter(Times(0, 0, 0, 0, 0, 0))
    got = [meter.update(Times(u, 0, s, i, w, g)) for u, s, i, w, g in readings]
    assert got == expected


def _cpu_seconds(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def _wait_for_cpu_time(pid: int, seconds: float, bound: float = 120.0) -> None:
    """Until ``pid`` has used ``seconds`` of CPU in all (``bound`` only stops a hang)."""
    deadline = time.monotonic() + bound
    while _cpu_seconds(pid) < seconds:
        assert time.monotonic() < deadline, "the busy child got no CPU at all"
        time.sleep(0.02)


def test_rank_trees_with_children(tree):
    child, grandchild = tree
    source = HostSource()
    first = {p.pid: p for p in source.sample([child])[1]}
    assert set(first) == {child, grandchild}
    assert first[child].root == child and first[grandchild].root == child
    assert first[grandchild].ppid == child
    # Seen for the first time: CPU has no window yet, so NA rather than a fake 0.
    assert first[child].cpu_percent is NA and first[grandchild].cpu_percent is NA
    # Wait for CPU time, not wall time: on a loaded machine the spinning child may get no
    # CPU for a while, so sample again only once it has been given at least 50 ms of CPU.
    _wait_for_cpu_time(child, _cpu_seconds(child) + 0.05)
    second = {p.pid: p for p in source.sample([child])[1]}
    busy, idle = second[child], second[grandchild]
    assert busy.cpu_percent is not NA and busy.cpu_percent > 0.0
    assert idle.cpu_percent is not NA and idle.cpu_percent < busy.cpu_percent
    assert idle.status in (psutil.STATUS_SLEEPING, psutil.STATUS_IDLE)
    assert busy.rss > 1024 * 1024 and busy.num_threads >= 1
    assert busy.name.startswith("python")


def test_zombies_gone_and_bogus_pids(tree):
    child, grandchild = tree
    source = HostSource()
    ghost = subprocess.Popen([sys.executable, "-c", "pass"])
    ghost.wait()
    procs = source.sample([child, ghost.pid, child])[1]  # duplicates are fine
    assert sorted(p.pid for p in procs) == sorted([child, grandchild])
    # The busy child never reaps its killed grandchild: a zombie, still reported as one.
    psutil.Process(grandchild).kill()
    deadline = time.monotonic() + 5
    while psutil.Process(grandchild).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    procs = {p.pid: p for p in source.sample([child])[1]}
    assert procs[grandchild].status == psutil.STATUS_ZOMBIE
    assert procs[child].cpu_percent is not NA
    psutil.Process(child).kill()
    psutil.Process(child).wait(5)
    assert source.sample([child])[1] == ()
    assert source._procs == {}  # nothing cached for processes no longer there


def test_trees_without_psutils_private_helper(tree, monkeypatch):
    child, grandchild = tree
    monkeypatch.delattr(psutil, "_ppid_map", raising=False)
    procs = HostSource().sample([child])[1]
    assert sorted(p.pid for p in procs) == sorted([child, grandchild])


def test_the_process_table_is_read_again_only_when_stale_or_the_trees_changed(tree, monkeypatch):
    """A scan of the whole process table a sample cost the dashboard 0.45 % of a core (76
    processes): it is kept TREE_RESCAN_S, read sooner for a new root or a process gone."""
    from ddptui.monitor import host

    child, grandchild = tree
    scans: list[dict[int, list[int]]] = []
    real = host._children_map

    def counted() -> dict[int, list[int]]:
        scans.append(real())
        # The first scan, taken before the grandchild was born as far as the source knows.
        return {} if len(scans) == 1 else scans[-1]

    monkeypatch.setattr(host, "_children_map", counted)
    now = [100.0]
    source = HostSource(clock=lambda: now[0])

    def pids(roots: list[int]) -> set[int]:
        return {p.pid for p in source.sample(roots)[1]}

    assert pids([child]) == {child} and len(scans) == 1
    now[0] += host.TREE_RESCAN_S - 0.5
    assert pids([child]) == {child} and len(scans) == 1  # the map kept: no new read
    now[0] += 0.5
    assert pids([child]) == {child, grandchild} and len(scans) == 2  # stale: read again
    assert pids([child]) == {child, grandchild} and len(scans) == 2
    assert pids([child, os.getpid()]) >= {child, grandchild, os.getpid()}  # a new root
    assert len(scans) == 3
    assert pids([child]) == {child, grandchild} and len(scans) == 3  # fewer roots: kept
    now[0] -= 60.0  # a clock gone backwards reads it again, never keeps a map for ever
    pids([child])
    assert len(scans) == 4
    # A process of the trees gone (a DataLoader worker at an epoch's end): read again at
    # the next sample, where its successor would be.
    me = os.getpid()
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        now[0] += host.TREE_RESCAN_S
        assert worker.pid in pids([me]) and len(scans) == 5
    finally:
        worker.kill()
        worker.wait(10)
    assert worker.pid not in pids([me]) and len(scans) == 5
    pids([me])
    assert len(scans) == 6


def test_own_process_is_reported():
    source = HostSource()
    source.sample([os.getpid()])
    (me,) = [p for p in source.sample([os.getpid()])[1] if p.pid == os.getpid()]
    assert me.status == psutil.STATUS_RUNNING and me.cpu_percent is not NA


def test_system_monitor_joins_real_rank_trees_to_fake_gpus(tree):
    child, grandchild = tree
    gpus = [
        FakeGpu(uuid="GPU-b", processes={grandchild: 1 << 30, 1: 1 << 20}),
        FakeGpu(uuid="GPU-a", processes={child: 2 << 30}),
    ]
    with SystemMonitor(FakeNvml(gpus)) as monitor:
        snap = monitor.sample(pids=[child])
    view = join_ranks(snap, {0: RankInfo(pid=child, device_uuid="a")})
    rank = view.rank(0)
    assert rank.gpu.uuid == "GPU-a" and rank.gpu_memory == 2 << 30
    assert rank.other_gpu_memory == 1 << 30  # its grandchild holds memory on GPU 0
    assert [p.pid for p in view.foreign] == [1]
