"""Snapshot tests of the dashboard's screens, from recorded runs, fake GPUs, a fake machine
and a frozen clock (``--snapshot-update`` regenerates the baselines)."""

from __future__ import annotations

import os

import pytest

from tests.helpers import ROOT
from tests.tui_fixtures.fakes import (
    FAILED_RUN,
    FINISHED_RUN,
    GPU_HOST,
    MID_RUN,
    RUNS,
    fake_deps,
    idle_and_busy_snapshots,
    no_gpu_snapshots,
    primed_app,
    replay,
)

SIZE = (120, 40)
#: Recent runs are listed newest first: give the recordings a fixed order.
RUN_ORDER = ("rec-syn", "rec-fail", "rec-ok", "rec-mid")


@pytest.fixture(autouse=True)
def _fixed_run_times(monkeypatch):
    monkeypatch.chdir(ROOT)  # the form resolves relative script paths like the CLI does
    for i, name in enumerate(reversed(RUN_ORDER)):
        os.utime(RUNS / name / "events.jsonl", (1_700_000_000 + i, 1_700_000_000 + i))


async def _settle(pilot) -> None:
    await pilot.app.workers.wait_for_complete()
    await pilot.pause()
    await pilot.pause()


def test_launch_screen(snap_compare):
    app = primed_app("run", raw={})
    assert snap_compare(app, terminal_size=SIZE, run_before=_settle)


def test_launch_screen_explains_bad_choices(snap_compare):
    """nccl and fp16 without CUDA, and a bad world size, are explained next to the field."""
    app = primed_app("run", raw={"backend": "nccl", "amp": "fp16", "world_size": "0", "lr": "fast"})
    assert snap_compare(app, terminal_size=SIZE, run_before=_settle)


def test_launch_screen_with_gpus(snap_compare):
    app = primed_app(
        "run",
        raw={"script": "tests/scripts/user_ddp.py", "script_args": ("--steps", "10")},
        deps=fake_deps(host=GPU_HOST),
        host_info=GPU_HOST,
    )
    assert snap_compare(app, terminal_size=SIZE, run_before=_settle)


def test_run_screen_mid_run(snap_compare):
    source = replay(MID_RUN, now_offset=0.5)
    source.note = ""  # shown as a live run caught mid-way
    app = primed_app("replay", replay_source=source)
    assert snap_compare(app, terminal_size=SIZE, run_before=_settle)


def test_run_screen_failed(snap_compare):
    app = primed_app("replay", replay_source=replay(FAILED_RUN), snapshots=no_gpu_snapshots())
    assert snap_compare(app, terminal_size=SIZE, run_before=_settle)


def test_run_screen_finished_per_rank_loss(snap_compare):
    app = primed_app("replay", replay_source=replay(FINISHED_RUN))

    async def per_rank(pilot):
        await _settle(pilot)
        await pilot.press("m")
        await pilot.pause()

    assert snap_compare(app, terminal_size=SIZE, run_before=per_rank)


def test_monitor_screen(snap_compare):
    assert snap_compare(primed_app("monitor"), terminal_size=SIZE, run_before=_settle)


def test_monitor_screen_without_gpu(snap_compare):
    app = primed_app("monitor", snapshots=no_gpu_snapshots())
    assert snap_compare(app, terminal_size=SIZE, run_before=_settle)


def test_monitor_screen_fixed_scales_few_samples(snap_compare):
    """Six samples: six columns at the right of each sparkline (none stretched); the idle GPU
    draws a floor at 0 %, a steady low line at 42 C, a dot for its one missing sample; the
    busy one draws full bars at 100 % and near its power limit."""
    app = primed_app("monitor", snapshots=idle_and_busy_snapshots())
    assert snap_compare(app, terminal_size=SIZE, run_before=_settle)


def test_run_screen_two_nodes(snap_compare):
    """Two nodes of two ranks: a summary line per node above its ranks (node 1 first: its
    rank 3 straggles), the node column, and the system panel's per-node block (node 1 has
    sent a sample, node 0 has not)."""
    from ddptui.monitor.snapshot import to_dict
    from tests.tui_fixtures.fakes import gpu_snapshots
    from tests.tui_fixtures.nodes import multi_node_source

    source = multi_node_source(2, 2, slow=(3,))
    sample = to_dict(gpu_snapshots(1)[0])
    sample["time"] = None  # no age: the snapshot must not depend on the wall clock
    source.state.node_samples[1] = sample
    app = primed_app("replay", replay_source=source, snapshots=no_gpu_snapshots())
    assert snap_compare(app, terminal_size=SIZE, run_before=_settle)
