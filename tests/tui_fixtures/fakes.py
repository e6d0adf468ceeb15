"""Deterministic stand-ins for the dashboard's outside world: the machine, the monitor's
Sampler (canned SystemSnapshots of two fake GPUs, or none), and recorded runs."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

from ddptui.monitor import (
    NA,
    GpuProcess,
    GpuReport,
    GpuSnapshot,
    HostSnapshot,
    ProcessSnapshot,
    SystemSnapshot,
)
from ddptui.run.machine import Machine
from ddptui.tui.app import Deps, create_app
from ddptui.tui.machine import HostInfo
from ddptui.tui.sources import ReplaySource

HERE = Path(__file__).resolve().parent
RUNS = HERE / "runs"
#: A run recorded mid-way (no evaluation yet), its ranks rewritten onto the fake GPUs.
MID_RUN = RUNS / "rec-mid"
#: A recorded run where rank 1 raised (``user_ddp.py --fail-rank 1``).
FAILED_RUN = RUNS / "rec-fail"
#: A recorded run of the synthetic trainer that finished (3 epochs, final accuracy 0.975).
FINISHED_RUN = RUNS / "rec-syn"

GiB = 1024**3
UUID_0 = "GPU-aaaaaaaa-0000-1111-2222-333333333333"
UUID_1 = "GPU-bbbbbbbb-0000-1111-2222-333333333333"
RANK_PIDS = (1001, 1002)
FOREIGN_PID = 4242

NO_CUDA_HOST = HostInfo(
    Machine(0, "torch has no CUDA support", 16), 64 * GiB, (), "NVML Shared Library Not Found"
)
GPU_HOST = HostInfo(
    Machine(2, "", 32), 256 * GiB, ("0: NVIDIA A100-SXM4-40GB", "1: NVIDIA A100-SXM4-40GB"), None
)


def _host(i: int) -> HostSnapshot:
    return HostSnapshot(
        cpu_percent=40.0 + 20 * math.sin(i / 4),
        cpu_percent_per_core=(),
        cpu_count=16,
        load_average=(3.0, 2.5, 2.0),
        memory_total=64 * GiB,
        memory_used=20 * GiB + i * 2**24,
        memory_available=44 * GiB,
        memory_percent=31.0 + i / 10,
        swap_total=0,
        swap_used=0,
        swap_percent=0.0,
    )


def _gpu(index: int, uuid: str, i: int, procs: tuple[GpuProcess, ...]) -> GpuSnapshot:
    return GpuSnapshot(
        index=index,
        name="NVIDIA A100-SXM4-40GB",
        uuid=uuid,
        pci_bus_id=f"0000:{index}7:00.0",
        utilization_gpu=int(60 + 35 * math.sin(i / 3 + index)),
        utilization_memory=30,
        memory_used=(12 + index * 6) * GiB + i * 2**26,
        memory_total=40 * GiB,
        temperature=55 + (i + index * 3) % 9,
        power_draw=180.0 + 60 * math.sin(i / 5 + index),
        power_limit=400.0,
        sm_clock=1410,
        pcie_rx=NA,
        pcie_tx=NA,
        processes=procs,
    )


def gpu_snapshots(count: int = 40) -> list[SystemSnapshot]:
    """``count`` samples, one second apart, of two A100s running ranks 0 and 1 (plus a
    foreign process on GPU 1)."""
    snaps = []
    for i in range(count):
        gpus = (
            _gpu(0, UUID_0, i, (GpuProcess(RANK_PIDS[0], 9 * GiB),)),
            _gpu(
                1, UUID_1, i, (GpuProcess(RANK_PIDS[1], 9 * GiB), GpuProcess(FOREIGN_PID, 3 * GiB))
            ),
        )
        procs = (
            ProcessSnapshot(
                RANK_PIDS[0], RANK_PIDS[0], 999, "python", "running", 98.5, 3 * GiB, 24
            ),
            ProcessSnapshot(
                1003, RANK_PIDS[0], RANK_PIDS[0], "pt_data_worker", "sleeping", 12.0, GiB // 2, 4
            ),
            ProcessSnapshot(
                RANK_PIDS[1], RANK_PIDS[1], 999, "python", "running", 97.0, 3 * GiB, 24
            ),
        )
        snaps.append(
            SystemSnapshot(
                time=1_700_000_000.0 + i,
                monotonic=1000.0 + i,
                gpu=GpuReport(True, None, "550.54.15", gpus),
                host=_host(i),
                processes=procs,
            )
        )
    return snaps


def idle_and_busy_snapshots(count: int = 6) -> list[SystemSnapshot]:
    """``count`` samples of an idle GPU (0 %, a steady 42 C, 60 W of 400 W, one sample with
    utilisation not available) and a GPU busy at 100 % near its power limit. Few samples:
    the sparklines show one column each, newest at the right, the rest empty."""
    snaps = []
    for i in range(count):
        idle = dataclasses.replace(
            _gpu(0, UUID_0, i, ()),
            utilization_gpu=NA if i == count // 2 else 0,
            memory_used=GiB // 2,
            temperature=42,
            power_draw=60.0,
        )
        busy = dataclasses.replace(
            _gpu(1, UUID_1, i, (GpuProcess(FOREIGN_PID, 30 * GiB),)),
            utilization_gpu=100,
            memory_used=36 * GiB,
            temperature=78 + i % 3,
            power_draw=390.0 - 5 * (i % 2),
        )
        snaps.append(
            SystemSnapshot(
                time=1_700_000_000.0 + i,
                monotonic=1000.0 + i,
                gpu=GpuReport(True, None, "550.54.15", (idle, busy)),
                host=_host(i),
                processes=(),
            )
        )
    return snaps


def no_gpu_snapshots(count: int = 20) -> list[SystemSnapshot]:
    return [
        SystemSnapshot(
            time=1_700_000_000.0 + i,
            monotonic=1000.0 + i,
            gpu=GpuReport.unavailable("NVML Shared Library Not Found"),
            host=_host(i),
            processes=(),
        )
        for i in range(count)
    ]


class FakeSampler:
    """The Sampler surface the dashboard uses; ``latest()`` is the last canned snapshot."""

    def __init__(self, snapshots: list[SystemSnapshot]) -> None:
        self.snapshots = snapshots
        self.pids: list[int] = []
        self.started = False
        self.stopped = False

    def start(self) -> FakeSampler:
        self.started = True
        return self

    def stop(self, timeout: float | None = None) -> None:
        self.stopped = True

    def latest(self) -> SystemSnapshot | None:
        return self.snapshots[-1] if self.snapshots else None

    def set_pids(self, pids) -> None:
        self.pids = list(pids)


def fake_deps(
    snapshots: list[SystemSnapshot] | None = None,
    host: HostInfo = NO_CUDA_HOST,
    runs_root: Path = RUNS,
    **kwargs,
) -> Deps:
    snaps = gpu_snapshots() if snapshots is None else snapshots
    return Deps(
        detect_host=lambda: host,
        make_sampler=lambda interval: FakeSampler(snaps),
        runs_root=runs_root,
        **kwargs,
    )


def primed_app(mode: str = "run", snapshots: list[SystemSnapshot] | None = None, **kwargs):
    """An app with fakes whose system history already holds every canned snapshot."""
    snaps = gpu_snapshots() if snapshots is None else snapshots
    deps = kwargs.pop("deps", None) or fake_deps(snaps, host=kwargs.pop("host", NO_CUDA_HOST))
    app = create_app(mode, deps=deps, host_info=kwargs.pop("host_info", NO_CUDA_HOST), **kwargs)
    app.feed.start()
    for snap in snaps:
        app.feed.take(snap)
    return app


def replay(run_dir: Path, now_offset: float = 0.0, live: bool | None = None) -> ReplaySource:
    """A recorded run with a frozen clock (``now_offset`` seconds after its last event).

    ``live`` (default: for the mid-run recording) shows the run as it looked while it was
    still going, instead of as the interrupted run its files say it is now.
    """
    if live if live is not None else Path(run_dir) == MID_RUN:
        from ddptui.run.rundir import iter_events, read_config
        from ddptui.run.state import RunState

        config = read_config(run_dir)
        state = RunState(config["run_id"], config["world_size"], epochs=config.get("epochs"))
        for event in iter_events(run_dir, config["run_id"]):
            state.apply(event)
        now = (state.last_event_at or 0.0) + now_offset
        return ReplaySource(config, state, Path(run_dir), now=now)
    source = ReplaySource.load(run_dir)
    now = (source.state.finished_at or source.state.last_event_at or 0.0) + now_offset
    return ReplaySource(source.config, source.state, source.run_dir, now=now)


class FakeSession:
    """A RunSession stand-in: plays a recorded run's events, starts no process.

    ``hold=True`` keeps the run "live" after the last event until :meth:`stop`.
    """

    def __init__(self, cfg, run_dir: Path = MID_RUN, per_pump: int = 4, hold: bool = True):
        import threading
        import time

        from ddptui.run.rundir import iter_events
        from ddptui.run.state import RunState

        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.clock = time.monotonic
        self.state = RunState(cfg.run_id, cfg.world_size, epochs=cfg.epochs)
        self._events = list(iter_events(self.run_dir))
        self._per_pump = per_pump
        self._hold = hold
        self._lock = threading.RLock()
        self.calls: list[str] = []
        #: Every call of the session's own surface (pump and poll included), with the name
        #: of the thread that made it: a RunSession's socket belongs to one thread.
        self.threads: list[tuple[str, str]] = []
        #: (interrupted, exit_code) of each stop: a signal to ddptui stops as interrupted
        self.stops: list[tuple[bool, int | None]] = []
        self.result = None

    def _record(self, name: str, listed: bool = True) -> None:
        import threading

        if listed:
            self.calls.append(name)
        self.threads.append((name, threading.current_thread().name))

    def start(self) -> None:
        self._record("start")
        self.state.started_at = self.clock()

    def pump(self, timeout: float = 0.1):
        import time

        self._record("pump", listed=False)
        batch, self._events = self._events[: self._per_pump], self._events[self._per_pump :]
        with self._lock:
            for event in batch:
                self.state.apply(event, self.clock())
        time.sleep(min(timeout, 0.02))
        return batch

    def poll(self):
        from ddptui.run.launcher import LaunchResult

        self._record("poll", listed=False)
        if self.result is None and not self._events and not self._hold:
            self.result = LaunchResult(0)
            with self._lock:
                self.state.set_outcome("finished", now=self.clock())
        return self.result

    def stop(self, interrupted: bool = False, exit_code: int | None = None):
        from ddptui.run.launcher import LaunchResult

        self._record("stop")
        self.stops.append((interrupted, exit_code))
        if self.result is None:
            self.result = LaunchResult(-15, stopped=True)
            with self._lock:
                self.state.set_outcome(
                    "interrupted" if interrupted else "stopped", now=self.clock()
                )
        return self.result

    def close(self) -> None:
        self._record("close")

    def locked(self):
        return self._lock
