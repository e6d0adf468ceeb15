"""Many ranks on many nodes: grouping by node, node summaries, worst ranks first, the
per-node system lines, the failure headline, and the table at 64+ ranks in a real app."""

from __future__ import annotations

import math

import pytest

from ddptui import protocol
from ddptui.monitor.snapshot import to_dict
from ddptui.run.state import RunState
from ddptui.tui.model import (
    NODE_COLUMNS,
    RANK_COLUMNS,
    RANK_ORDER_MAX,
    node_summaries,
    run_frame,
    table_columns,
    table_lines,
)
from ddptui.tui.node_system import local_node, node_system_lines
from ddptui.tui.screens.run import LARGE_RUN_HZ, LARGE_RUN_RANKS
from ddptui.tui.widgets.failure import desync_line, others_label, rank_place
from tests.tui_fixtures.fakes import gpu_snapshots, idle_and_busy_snapshots, no_gpu_snapshots
from tests.tui_fixtures.nodes import Status, multi_node_source, multi_node_state


def test_status_node_fills_rank_view_before_and_after_the_protocol_has_it():
    state, _ = multi_node_state(2, 2, steps=1)
    assert [state.ranks[r].node for r in range(4)] == [0, 0, 1, 1]
    old, _ = multi_node_state(2, 2, steps=1, with_node=False)  # today's Status: no field
    assert [old.ranks[r].node for r in range(4)] == [None] * 4
    assert old.ranks[3].host == "node-1"


@pytest.mark.parametrize("bad", [True, -1, 10**9])
def test_status_node_ignores_nonsense(bad):
    state = RunState("r", 1)
    state.apply(Status(run="r", rank=0, t=0.0, seq=0, state="started", node=bad), now=0.0)
    assert state.ranks[0].node is None


def test_single_node_run_has_no_node_rows_and_keeps_rank_order():
    state, now = multi_node_state(1, 4, slow=(2,))
    frame = run_frame(state, now)
    assert frame.nodes == ()
    assert table_columns(frame) == RANK_COLUMNS
    assert [line.key for line in table_lines(frame)] == [0, 1, 2, 3]  # as it always was


def test_large_single_node_run_shows_the_worst_ranks_first():
    n = RANK_ORDER_MAX + 8
    state, now = multi_node_state(1, n, slow=(5,), silent=(11,), crashed=17)
    lines = table_lines(run_frame(state, now))
    assert [line.key for line in lines[:3]] == [17, 11, 5]
    assert [line.severity for line in lines[:3]] == ["failed", "silent", "straggler"]
    assert len(lines) == n


def test_grouped_by_node_with_summaries():
    state, now = multi_node_state(3, 4, slow=(6,))
    frame = run_frame(state, now)
    assert [n.node for n in frame.nodes] == [0, 1, 2]
    node1 = frame.nodes[1]
    assert node1.ranks == (4, 5, 6, 7) and node1.host == "node-1"
    assert node1.worst == "straggler" and node1.problems == 1
    times = [state.ranks[r].recent_step_time() for r in node1.ranks]
    assert math.isclose(node1.mean_step_time, sum(times) / 4)
    sps = sum(state.ranks[r].samples_per_s for r in (4, 5, 6, 7))
    assert math.isclose(node1.samples_per_s, sps)
    assert node1.min_loss == state.ranks[4].loss and node1.max_loss == state.ranks[7].loss
    assert frame.nodes[0].worst == "started" and frame.nodes[0].problems == 0

    lines = table_lines(frame)
    assert table_columns(frame) == NODE_COLUMNS
    assert len(lines) == 3 + 12
    # The node with a straggler first, its straggler right under its summary.
    assert (lines[0].kind, lines[0].key) == ("node", 1)
    assert (lines[1].kind, lines[1].key) == ("rank", 6)
    assert lines[0].cells[:2] == ("node 1", "4 ranks")
    assert lines[0].cells[6] == f"{node1.min_loss:.4f}-{node1.max_loss:.4f}"
    # Then the healthy nodes in node order, each followed by its own ranks.
    kinds = [(line.kind, line.key) for line in lines[5:]]
    assert kinds[0] == ("node", 0) and kinds[5] == ("node", 2)
    assert {k for kind, k in kinds[1:5]} == {0, 1, 2, 3}


def test_a_node_row_averages_the_step_times_its_rank_rows_show():
    """The rank rows show each rank's mean step time over its last 2 s; the node's summary
    row is their mean, not the mean of the ranks' medians of their last ten steps (a rank
    whose every fourth step is slow read 50 ms on its node's row beside its own 150 ms)."""
    state, _ = multi_node_state(2, 2, steps=5)
    seq = dict.fromkeys(range(4), 5)
    t = 1.0
    for _ in range(6):
        for step_time in (0.05, 0.05, 0.05, 0.45):
            t += step_time
            for rank in range(4):
                state.apply(
                    protocol.Step(
                        run="multi",
                        rank=rank,
                        t=t,
                        seq=seq[rank],
                        step=1,
                        epoch=1,
                        loss=1.0,
                        samples=32,
                        samples_per_s=32 / step_time,
                        step_time=step_time,
                    ),
                    now=t,
                )
                seq[rank] += 1
    frame = run_frame(state, t)
    node1 = frame.nodes[1]
    assert state.ranks[2].typical_step_time == pytest.approx(0.05)  # its median
    shown = [state.ranks[rank].recent_step_time() for rank in (2, 3)]
    assert shown[0] == pytest.approx(0.15, rel=0.2)  # the 2 s window's steps (some 0.45 s)
    assert node1.mean_step_time == pytest.approx(sum(shown) / 2)
    lines = table_lines(frame)
    node_line = next(line for line in lines if line.kind == "node" and line.key == 1)
    rank_lines = [line for line in lines if line.kind == "rank" and line.key in (2, 3)]
    assert {line.cells[8] for line in rank_lines} == {node_line.cells[8]}  # "step time"


def test_worst_first_failed_then_silent_then_straggler_then_slowest():
    state, now = multi_node_state(3, 8, slow=(3, 14), silent=(12,), crashed=9)
    frame = run_frame(state, now)
    assert set(frame.problems) == {3, 12, 14}
    lines = table_lines(frame)
    order = [(line.kind, line.key, line.severity) for line in lines]
    # Node 1 (failed, silent, straggler) first, then node 0 (a straggler), then node 2.
    assert order[:4] == [
        ("node", 1, "failed"),
        ("rank", 9, "failed"),
        ("rank", 12, "silent"),
        ("rank", 14, "straggler"),
    ]
    assert order[9:11] == [("node", 0, "straggler"), ("rank", 3, "straggler")]
    assert order[18][:2] == ("node", 2)
    # Healthy ranks: slowest first (the fixture makes higher ranks a little slower).
    assert [key for _, key, _ in order[19:]] == list(range(23, 15, -1))


def test_failed_run_marks_the_others_stopped_and_names_node_and_host():
    state, now = multi_node_state(2, 2, failed=3)
    frame = run_frame(state, now)
    row = next(r for r in frame.rows if r.rank == 3)
    assert rank_place(row, multi_node=True) == "on node 1 (node-1)"
    old, now = multi_node_state(2, 2, failed=3, with_node=False)
    row = next(r for r in run_frame(old, now).rows if r.rank == 3)
    assert rank_place(row, multi_node=True) == "on node-1"
    assert rank_place(row, multi_node=False) == ""  # one machine: nothing to say


def test_the_failure_panel_names_the_desync_that_set_the_failure_off():
    desync = (
        "rank 1 called all_reduce #17 with 577 floats (DDP bucket) where rank 0 called it "
        "with 1 float: a desync"
    )
    after = "rank 0 failed (killed by SIGABRT) after rank 1's desync in all_reduce #17: a "
    after += "consequence, not a cause"
    assert desync_line([after, desync]) == desync
    assert desync_line(["rank 1 failed first: killed by SIGKILL"]) is None


def test_others_label_counts_states_when_there_are_many():
    state, now = multi_node_state(4, 8, failed=0)
    rows = run_frame(state, now).rows
    assert others_label(rows, 0) == "31 stopped"
    small, now = multi_node_state(1, 3, failed=0)
    assert others_label(run_frame(small, now).rows, 0) == "rank 1 stopped, rank 2 stopped"


def test_node_summaries_only_for_more_than_one_node():
    state, now = multi_node_state(1, 3)
    assert node_summaries(run_frame(state, now).rows) == ()
    fresh = RunState("r", 4)  # nobody said where they run yet: one unknown group
    assert node_summaries(run_frame(fresh, 0.0).rows) == ()


def test_ranks_still_starting_are_no_node_of_their_own():
    """A single-node run while its ranks start: the first rank that said its host and the
    ranks not yet heard from were two groups, and the table showed them as two nodes
    (``node ?  1 rank  vm``) until the last rank started."""
    starting = RunState("r", 3)
    starting.apply(Status(run="r", rank=0, t=0.0, seq=0, state="started", host="vm"), now=0.0)
    frame = run_frame(starting, 0.5)
    assert node_summaries(frame.rows) == () and frame.nodes == ()
    assert table_columns(frame) == RANK_COLUMNS
    assert [line.key for line in table_lines(frame)] == [0, 1, 2]
    # Two hosts heard of: two nodes, and the rank not yet heard from in a group of its own.
    starting.apply(Status(run="r", rank=1, t=0.0, seq=0, state="started", host="b"), now=0.0)
    groups = [summary.ranks for summary in node_summaries(run_frame(starting, 0.5).rows)]
    assert sorted(groups) == [(0,), (1,), (2,)]


# -- the system panel's per-node model -------------------------------------------------------
def test_node_system_lines_from_snapshots_dicts_and_nothing():
    nodes = [(0, "node-0"), (1, "node-1"), (2, "node-2"), (3, "node-3")]
    busy = gpu_snapshots(1)[0]
    eight = to_dict(busy)
    eight["gpu"]["devices"] = eight["gpu"]["devices"] * 4  # 8 GPUs
    samples = {0: busy, 1: eight, 3: to_dict(no_gpu_snapshots(1)[0])}
    lines = node_system_lines(nodes, samples, now=busy.time + 3)
    assert [line.sampled for line in lines] == [True, True, False, True]
    assert lines[0].host_load == "cpu 40% of 16  ram 20/64G"
    assert lines[0].gpus == ("GPU0 60% 12/40G 55°C", "GPU1 89% 18/40G 58°C")
    assert lines[0].age == "3s ago"
    assert lines[1].gpus == ("8 GPUs util 74% (min 60%)  mem 120/320G  max 58°C",)
    assert lines[2].host_load == "no sample yet" and lines[2].gpus == ()
    assert lines[3].gpus == ("no GPU: NVML Shared Library Not Found",)


def test_node_system_lines_survive_hostile_samples():
    idle = to_dict(idle_and_busy_snapshots(6)[3])  # one GPU's utilisation not available
    hostile = {
        "time": "yesterday",
        "host": {"cpu_percent": float("inf"), "cpu_count": True, "memory_used": "x"},
        "gpu": {"devices": [{"index": None, "utilization_gpu": 1e400, "memory_total": 0}]},
    }
    lines = node_system_lines([(0, "a"), (1, "b"), (2, "c")], {0: idle, 1: hostile, 2: []}, 0.0)
    assert lines[0].gpus[0].startswith("GPU0 ?")
    assert lines[1].host_load == "cpu ?  ram ?" and lines[1].age is None
    assert lines[1].gpus == ("GPU? ? ?",)
    assert lines[2].gpus == ("no GPU",)


def test_local_node_is_node_zero_else_the_matching_host():
    assert local_node([(1, "b"), (0, "a")], "zzz") == 0
    assert local_node([("a", "a"), ("b", "b")], "b") == "b"
    assert local_node([("a", "a")], "zzz") is None


# -- the real table at 64+ ranks -------------------------------------------------------------
def _open(source):
    from tests.tui_fixtures.fakes import primed_app

    app = primed_app("replay", replay_source=source, snapshots=no_gpu_snapshots())
    return app


async def test_table_scrolls_with_worst_rank_on_top_at_96_ranks():
    from ddptui.tui.widgets.ranks import HealthLine, RankTable

    stragglers = (70, 71, 72, 73, 74, 75)
    source = multi_node_source(12, 8, slow=stragglers, crashed=45)
    app = _open(source)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.app.workers.wait_for_complete()
        await pilot.pause()
        await pilot.pause()
        table = app.screen.query_one(RankTable)
        assert len(table.lines) == 96 + 12
        assert table.size.height < len(table.lines)  # bounded: the rest scrolls
        assert table.max_scroll_y > 0
        # Top line: the failed rank's node summary, then the failed rank itself.
        assert table.lines[0].kind == "node" and table.lines[0].cells[0] == "node 5"
        assert table.lines[1].key == 45
        assert "45" in table.render_line(2).text and "failed" in table.render_line(2).text
        # Then the stragglers' node.
        assert table.lines[9].cells[0] == "node 8" and table.lines[9].cells[-3] == "straggler"
        table.scroll_end(animate=False)
        await pilot.pause()
        assert table.scroll_y == table.max_scroll_y
        assert table.render_line(0).text.split()[:2] == ["node", "rank"]  # header stays
        last = table.render_line(table.size.height - 1).text
        assert table.lines[-1].cells[2] in last.split()  # the last rank is reachable
        failure = str(app.screen.query_one("#failure").render())
        assert "rank 45 on node 5 (node-5) failed: RuntimeError: boom" in failure
        assert "other ranks: 95 started" in failure
        health = str(app.screen.query_one(HealthLine).render()).splitlines()
        assert len(health) == 4 and "(+2 more ranks need attention" in health[-1]
        # The system feed tracks only this machine's ranks (node 0), never another node's pids.
        assert sorted(app.feed._ranks) == list(range(8))
        # 96 ranks: header and table refresh at most LARGE_RUN_HZ.
        screen = app.screen
        assert screen._view_hz == LARGE_RUN_HZ < screen.refresh_hz == screen.view_hz(8)


async def test_a_run_that_grows_past_64_ranks_refreshes_its_table_less_often():
    source = multi_node_source(1, 8)
    app = _open(source)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        await pilot.pause()
        screen = app.screen
        assert screen._view_hz == screen.refresh_hz > LARGE_RUN_HZ
        before = screen._redraw_timers[0]
        source.state.grow(LARGE_RUN_RANKS + 1)
        screen.refresh_view()
        assert screen._view_hz == LARGE_RUN_HZ and screen._redraw_timers[0] is not before
        await pilot.pause(0.5)
        assert screen.frame is not None and len(screen.frame.rows) == LARGE_RUN_RANKS + 1


def test_long_host_names_are_cut_so_the_state_stays_in_view():
    state, now = multi_node_state(2, 1)
    state.ranks[1].host = "gpu-node-017.cluster.example.com"
    lines = table_lines(run_frame(state, now))
    hosts = {line.cells[3] for line in lines}
    assert "gpu-node-017.clus…" in hosts and all(len(h) <= 18 for h in hosts)
    assert run_frame(state, now).nodes[1].host == "gpu-node-017.cluster.example.com"


def test_a_join_agents_node_sample_shows_in_the_system_lines():
    from ddptui import protocol
    from ddptui.tui.node_system import node_system_lines

    state = RunState("r", 2)
    gpu = protocol.GpuSample(index=0, util=85.0, mem_used=30 * 2**30, mem_total=80 * 2**30, temp=61)
    state.apply(
        protocol.NodeSample(
            run="r",
            rank=0,
            t=100.0,
            seq=0,
            node=1,
            host="b",
            cpu_percent=45.0,
            mem_used=20 * 2**30,
            mem_total=64 * 2**30,
            gpus=[gpu],
        )
    )
    (line,) = node_system_lines([(1, "b")], state.node_samples, now=103.0)
    assert line.sampled and line.host_load == "cpu 45%  ram 20/64G"
    assert line.gpus == ("GPU0 85% 30/80G 61°C",) and line.age == "3s ago"
