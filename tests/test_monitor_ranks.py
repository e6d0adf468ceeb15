"""Joining ranks to GPUs by UUID, foreign processes, preflight warnings, history buffers."""

from __future__ import annotations

import pytest

from ddptui.monitor import (
    NA,
    GpuSource,
    History,
    HostSnapshot,
    ProcessSnapshot,
    RankInfo,
    SystemSnapshot,
    join_ranks,
    normalize_uuid,
    preflight,
)
from ddptui.protocol import Status
from tests.fake_nvml import FakeGpu, FakeNvml, GiB, MiB

UUID_A = "GPU-aaaaaaaa-1111-2222-3333-444444444444"
UUID_B = "GPU-bbbbbbbb-1111-2222-3333-444444444444"
UUID_C = "GPU-cccccccc-1111-2222-3333-444444444444"

HOST = HostSnapshot(
    cpu_percent=10.0,
    cpu_percent_per_core=(10.0,),
    cpu_count=1,
    load_average=(0.1, 0.1, 0.1),
    memory_total=8 * GiB,
    memory_used=GiB,
    memory_available=7 * GiB,
    memory_percent=12.5,
    swap_total=0,
    swap_used=0,
    swap_percent=0.0,
)


def proc(pid: int, root: int, cpu=1.0, rss=100 * MiB) -> ProcessSnapshot:
    return ProcessSnapshot(
        pid=pid,
        root=root,
        ppid=root,
        name="python",
        status="running",
        cpu_percent=cpu,
        rss=rss,
        num_threads=4,
    )


def snapshot(gpus: list[FakeGpu], processes=(), t: float = 0.0) -> SystemSnapshot:
    with GpuSource(FakeNvml(gpus)) as source:
        report = source.sample()
    return SystemSnapshot(time=t, monotonic=t, gpu=report, host=HOST, processes=tuple(processes))


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("GPU-8C7A0B1E-0000-1111-2222-333344445555", "8c7a0b1e-0000-1111-2222-333344445555"),
        ("8c7a0b1e-0000-1111-2222-333344445555", "8c7a0b1e-0000-1111-2222-333344445555"),
        ("gpu-8c7a0b1e-0000", "8c7a0b1e-0000"),
        ("  GPU-ABC \n", "abc"),
        ("MIG-1234-abcd", "mig-1234-abcd"),
        ("GPU-", None),
        ("", None),
        (None, None),
        (NA, None),
    ],
)
def test_normalize_uuid(raw, expected):
    assert normalize_uuid(raw) == expected


def test_ranks_join_gpus_by_uuid_not_index():
    # NVML index order (A, B, C) differs from the ranks' CUDA order: rank 0 runs on C,
    # rank 1 on A, rank 2 on B; torch-style UUIDs without the prefix, in upper case.
    gpus = [
        FakeGpu(uuid=UUID_A, name="A", util_gpu=11, processes={201: 2 * GiB, 999: GiB}),
        FakeGpu(uuid=UUID_B, name="B", util_gpu=22, processes={302: 3 * GiB}),
        FakeGpu(uuid=UUID_C, name="C", util_gpu=33, processes={100: GiB}),
    ]
    ranks = {
        0: RankInfo(pid=100, device_uuid=UUID_C.removeprefix("GPU-").upper()),
        1: RankInfo(pid=200, device_uuid=UUID_A),
        2: RankInfo(pid=300, device_uuid=UUID_B.lower()),
    }
    # 201 is rank 1's child (a DataLoader worker), 302 rank 2's grandchild.
    snap = snapshot(
        gpus,
        [
            proc(100, 100),
            proc(200, 200),
            proc(201, 200),
            proc(300, 300),
            proc(301, 300),
            proc(302, 300),
        ],
    )
    view = join_ranks(snap, ranks)

    expected = {0: ("C", 33, GiB), 1: ("A", 11, 2 * GiB), 2: ("B", 22, 3 * GiB)}
    for rank, (name, util, memory) in expected.items():
        r = view.rank(rank)
        assert r.gpu.name == name
        assert r.gpu_utilization == util
        assert r.gpu_memory == memory
        assert r.other_gpu_memory == 0
    assert [(g.gpu.name, g.ranks) for g in view.gpus] == [("A", (1,)), ("B", (2,)), ("C", (0,))]
    assert view.gpu(0).rank_memory(1) == 2 * GiB
    assert [(p.gpu_index, p.pid, p.used_memory) for p in view.foreign] == [(0, 999, GiB)]
    assert view.unmatched_ranks == ()


def test_rank_cpu_and_rss_sum_over_its_tree():
    snap = snapshot(
        [FakeGpu(uuid=UUID_A)],
        [proc(10, 10, cpu=90.0), proc(11, 10, cpu=5.0), proc(20, 20, cpu=NA)],
    )
    view = join_ranks(
        snap, {0: RankInfo(10, UUID_A), 1: RankInfo(20, UUID_A), 2: RankInfo(30, UUID_A)}
    )
    assert view.rank(0).cpu_percent == pytest.approx(95.0)
    assert view.rank(0).rss == 200 * MiB
    assert view.rank(1).cpu_percent is NA  # first sample of that pid: unknown, not 0
    assert view.rank(2).processes == () and view.rank(2).cpu_percent is NA
    assert view.gpu(0).ranks == (0, 1, 2)


@pytest.mark.parametrize(
    ("info", "gpu_name", "unmatched"),
    [
        (RankInfo(10, None), None, ()),  # a CPU (gloo) rank
        (RankInfo(10, "GPU-not-on-this-machine"), None, (0,)),
        (RankInfo(None, UUID_A), "A", ()),
    ],  # no pid yet: still joined by UUID
)
def test_ranks_without_a_matching_gpu(info, gpu_name, unmatched):
    view = join_ranks(snapshot([FakeGpu(uuid=UUID_A, name="A")]), {0: info})
    r = view.rank(0)
    assert (r.gpu.name if r.gpu else None) == gpu_name
    assert r.gpu_memory is NA and r.gpu_utilization is (NA if gpu_name is None else 50)
    assert view.unmatched_ranks == unmatched


def test_rank_not_yet_on_its_gpu_has_unknown_memory():
    view = join_ranks(snapshot([FakeGpu(uuid=UUID_A)]), {0: RankInfo(10, UUID_A)})
    assert view.rank(0).gpu_memory is NA


def test_stray_context_on_another_gpu_is_counted_separately():
    # Rank 1 forgot torch.cuda.set_device and also holds memory on GPU 0.
    gpus = [
        FakeGpu(uuid=UUID_A, processes={10: 5 * GiB, 20: 500 * MiB}),
        FakeGpu(uuid=UUID_B, processes={20: 4 * GiB}),
    ]
    view = join_ranks(snapshot(gpus), {0: RankInfo(10, UUID_A), 1: RankInfo(20, UUID_B)})
    assert view.rank(1).gpu_memory == 4 * GiB
    assert view.rank(1).other_gpu_memory == 500 * MiB
    assert view.foreign == ()
    assert [(p.pid, p.rank) for p in view.gpu(0).processes] == [(10, 0), (20, 1)]


def test_unknown_process_memory_propagates_as_na():
    view = join_ranks(
        snapshot([FakeGpu(uuid=UUID_A, processes={10: None})]), {0: RankInfo(10, UUID_A)}
    )
    assert view.rank(0).gpu_memory is NA


def test_gpu_without_process_list_has_no_processes():
    gpus = [FakeGpu(uuid=UUID_A, unsupported={"nvmlDeviceGetComputeRunningProcesses"})]
    view = join_ranks(snapshot(gpus), {0: RankInfo(10, UUID_A)})
    assert view.gpu(0).processes == () and view.rank(0).gpu_memory is NA


# (GPU processes, rank pids, tracked processes (pid, root)) -> foreign pids
FOREIGN_CASES = [
    ({1: GiB}, [1], [], []),
    ({1: GiB, 2: GiB}, [1], [], [2]),
    ({5: GiB}, [1], [(1, 1), (5, 1)], []),  # a rank's descendant is not foreign
    ({5: GiB}, [1], [(5, 7)], [5]),  # descends from something that is not a rank
    ({5: GiB, 6: None}, [], [], [5, 6]),
    ({}, [1, 2], [], []),
]


@pytest.mark.parametrize(("gpu_procs", "rank_pids", "tracked", "foreign"), FOREIGN_CASES)
def test_foreign_processes(gpu_procs, rank_pids, tracked, foreign):
    snap = snapshot(
        [FakeGpu(uuid=UUID_A, processes=gpu_procs)], [proc(pid, root) for pid, root in tracked]
    )
    ranks = {i: RankInfo(pid, UUID_A) for i, pid in enumerate(rank_pids)}
    view = join_ranks(snap, ranks)
    assert [p.pid for p in view.foreign] == foreign
    assert all(p.foreign == (p.pid in foreign) for p in view.gpus[0].processes)


def test_rank_info_from_status_event():
    event = Status(run="r", rank=3, t=0.0, seq=0, state="started", pid=4242, device_uuid=UUID_B)
    assert RankInfo.from_status(event) == RankInfo(pid=4242, device_uuid=UUID_B)


def test_preflight_warns_about_processes_already_on_a_gpu():
    gpus = [
        FakeGpu(
            name="NVIDIA H100",
            uuid=UUID_A,
            memory_used=11 * GiB,
            processes={1234: int(10.2 * GiB), 77: None},
        ),
        FakeGpu(name="NVIDIA H100", uuid=UUID_B, memory_used=GiB // 2),  # idle
        FakeGpu(name="NVIDIA A100", uuid=UUID_C, memory_used=30 * GiB),  # other container
    ]
    warnings = preflight(snapshot(gpus))
    assert warnings == [
        "GPU 0 (NVIDIA H100): pid 1234 holds 10.2 GiB — another job?",
        "GPU 0 (NVIDIA H100): pid 77 holds an unknown amount of memory — another job?",
        "GPU 2 (NVIDIA A100): 30.0 GiB in use by processes not visible here — another job?",
    ]
    assert preflight(snapshot(gpus), ignore_pids=[1234, 77]) == warnings[2:]


def test_preflight_is_quiet_without_gpus_or_with_idle_gpus():
    snap = snapshot([FakeGpu(memory_used=300 * MiB)])
    assert preflight(snap) == []
    with GpuSource(FakeNvml(init_error=FakeNvml.NVMLError_DriverNotLoaded)) as source:
        none = SystemSnapshot(time=0, monotonic=0, gpu=source.sample(), host=HOST)
    assert preflight(none) == []


def test_history_is_bounded_and_keeps_na_as_none():
    history = History(maxlen=3)
    ranks = {0: RankInfo(10, UUID_A)}
    for t in range(5):
        unsupported = {"nvmlDeviceGetTemperature"} if t == 4 else set()
        snap = snapshot(
            [
                FakeGpu(
                    uuid=UUID_A, util_gpu=10 * t, unsupported=unsupported, processes={10: t * GiB}
                )
            ],
            [proc(10, 10, cpu=float(t))],
            t=float(t),
        )
        history.record(snap, join_ranks(snap, ranks))
    g = history.gpus[0]
    assert list(g.time) == [2.0, 3.0, 4.0]
    assert list(g.utilization) == [20.0, 30.0, 40.0]
    assert list(g.temperature) == [45.0, 45.0, None]
    assert list(g.memory_percent) == pytest.approx([12.5] * 3)
    r = history.ranks[0]
    assert list(r.cpu_percent) == [2.0, 3.0, 4.0]
    assert list(r.gpu_memory) == [2 * GiB, 3 * GiB, 4 * GiB]
    assert list(r.gpu_utilization) == [20.0, 30.0, 40.0]
    history.clear()
    assert history.gpus == {} and history.ranks == {}


def test_history_without_ranks_and_sizes():
    history = History()
    history.record(snapshot([FakeGpu()]))
    assert len(history.gpus[0].utilization) == 1 and history.ranks == {}
    assert History().maxlen == 300
    assert History.for_window(seconds=60, interval=0.5).maxlen == 120
    with pytest.raises(ValueError, match="at least 1"):
        History(0)


def test_rank_labels_come_from_the_rank_processes_environment():
    import os
    import subprocess
    import sys

    from ddptui.monitor import rank_labels_from_environment

    base = {k: v for k, v in os.environ.items() if k not in ("RANK", "DDPTUI_RUN_ID")}
    code = "import time; time.sleep(30)"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code], env={**base, "RANK": "1", "DDPTUI_RUN_ID": "run-x"}
        ),
        subprocess.Popen([sys.executable, "-c", code], env={**base, "RANK": "0"}),
        subprocess.Popen([sys.executable, "-c", code], env=base),
    ]
    try:
        labels = rank_labels_from_environment([p.pid for p in procs] + [2**22 + 7])
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert labels == {procs[0].pid: "rank 1 · run run-x", procs[1].pid: "rank 0"}
