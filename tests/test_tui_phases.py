"""The phase bars and the diagnosis lines of the run screen."""

import pytest

from ddptui.run.state import RunState
from ddptui.tui.widgets.phases import PhasePanel, diagnosis_text, phase_bars
from tests.tui_fixtures.fakes import FINISHED_RUN, primed_app, replay

SIZE = (120, 40)


def _state_with_phases():
    state = RunState("r", 3)
    for _ in range(5):
        state.phase_history.add(
            0,
            {
                "data": 0.001,
                "forward": 0.01,
                "backward": 0.02,
                "comm": 0.066,
                "optimizer": 0.002,
                "other": 0.001,
            },
        )
        state.phase_history.add(
            1,
            {
                "data": 0.07,
                "forward": 0.01,
                "backward": 0.015,
                "comm": 0.003,
                "optimizer": 0.001,
                "other": 0.001,
            },
        )
    return state


def test_no_phases_draws_nothing():
    assert phase_bars(RunState("r", 2)).plain == ""


def test_each_rank_gets_a_full_width_bar_culprit_first_when_cut():
    text = phase_bars(_state_with_phases(), width=20).plain.splitlines()
    assert text[0].startswith("phases ") and "comm" in text[0]
    bars = {line.split()[1]: line for line in text[1:]}
    assert set(bars) == {"0", "1"}  # rank 2 sent no phases
    for line in bars.values():
        bar = line[len("rank   0 ") :][:20]
        assert len(bar) == 20 and set(bar) <= {"█", "·"}
    assert bars["1"].endswith("data 70 %") and bars["0"].endswith("comm 66 %")
    only = phase_bars(_state_with_phases(), width=20, max_bars=1).plain
    assert "rank   1" in only and "rank   0" not in only and "+1 more ranks" in only


def test_diagnoses_show_the_newest_lines():
    lines = [f"d{i}" for i in range(5)]
    assert diagnosis_text(lines, max_lines=3).plain.splitlines() == ["◆ d2", "◆ d3", "◆ d4"]


async def test_run_screen_shows_phases_and_diagnoses():
    source = replay(FINISHED_RUN)
    state = _state_with_phases()
    source.state.phase_history = state.phase_history
    source.recorded_diagnoses = ["rank 1 straggler: input (data wait 71 % of step vs 1 % median)"]
    app = primed_app("replay", replay_source=source)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        panel = app.screen.query_one(PhasePanel)
        assert panel.display
        shown = str(panel.content)
        assert "rank   1" in shown and "rank 1 straggler: input" in shown


async def test_phase_bars_show_after_a_diagnosis_alone_had_the_panel():
    """rasbt/LLMs-from-scratch's DDP script in the dashboard: while its ranks compiled, a
    diagnosis alone had the panel (one line), the screen limited the panel to that line, and
    once the bars came (three lines) they did not fit it: the panel drew nothing, hid, and a
    hidden panel was given no lines, so its bars never showed (2 runs of 4; ``ddptui attach``
    on the same run showed them)."""
    source = replay(FINISHED_RUN)
    source.state.phase_history = RunState("r", 3).phase_history  # no phases yet
    source.recorded_diagnoses = ["rank 0 has made no step for 25 s"]
    app = primed_app("replay", replay_source=source)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        screen = app.screen
        panel = screen.query_one(PhasePanel)
        assert panel.display and panel.max_lines == 1
        source.recorded_diagnoses = []
        source.state.phase_history = _state_with_phases().phase_history
        for _ in range(3):
            screen.refresh_slow()
            await pilot.pause()
        assert panel.display
        assert "rank   0" in str(panel.content) and "rank   1" in str(panel.content)


def _source_with_phases(ranks: int):
    from tests.tui_fixtures.nodes import multi_node_source

    source = multi_node_source(1, ranks)
    for rank in range(ranks):
        comm = 0.02 + rank / 1000  # rank 0 waits least: the likeliest culprit
        for _ in range(5):
            source.state.phase_history.add(
                rank, {"data": 0.01, "forward": 0.03, "backward": 0.04, "comm": comm}
            )
    source.recorded_diagnoses = ["communication-bound: the ranks wait 22 % of their step"]
    return source


@pytest.mark.parametrize("ranks, logs", [(8, True), (16, True), (16, False), (256, True)])
async def test_the_run_screen_fits_a_120x40_terminal_whatever_the_ranks(ranks, logs):
    """The rank table and the phase panel share what the header, the charts' least, the
    logs and the footer leave: nothing scrolls but the table, the phase panel draws the bars
    that fit (the likeliest culprits first) and keeps its diagnosis line."""
    from ddptui.tui.screens.run import CHARTS_MIN_LINES
    from ddptui.tui.widgets.ranks import RankTable

    app = primed_app("replay", replay_source=_source_with_phases(ranks))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        if not logs:
            await pilot.press("l")
        for _ in range(3):
            app.screen.refresh_view()
            app.screen.refresh_slow()
            await pilot.pause()
        screen = app.screen
        assert screen.max_scroll_y == 0, "the screen itself scrolls"
        assert screen.query_one("#run-body").size.height >= CHARTS_MIN_LINES
        table = screen.query_one(RankTable)
        panel = screen.query_one(PhasePanel)
        shown = str(panel.content).splitlines()
        assert panel.size.height == len(shown)  # nothing of it clipped
        assert shown[-1].startswith("◆ communication-bound")
        assert "rank   0" in str(panel.content)  # the likeliest culprit keeps its bar
        if ranks == 8:  # fits whole: every rank's line and every bar
            assert table.size.height == ranks + 1 and len(shown) == 1 + ranks + 1
            return
        assert "more ranks" in shown[-2] and len(shown) < 1 + 8 + 2  # fewer bars than 8
        if logs:  # the table scrolls
            assert table.size.height < len(table.lines) + 1 and table.max_scroll_y > 0
        else:  # the logs' lines let every rank in
            assert table.size.height == ranks + 1


@pytest.mark.parametrize("ranks", [2, 8, 256])
async def test_the_run_screen_fits_an_80x24_terminal(ranks):
    """A default terminal: the screen does not scroll, the system panel and the lower charts
    make room (the loss chart keeps its least lines), and the rank table leaves out pid and
    device so that each rank's state is in view."""
    from ddptui.tui.screens.run import SHORT_CHARTS_MIN_LINES, RunScreen
    from ddptui.tui.widgets.ranks import RankTable, _line
    from ddptui.tui.widgets.system import SystemPanel

    app = primed_app("replay", replay_source=_source_with_phases(ranks))
    async with app.run_test(size=(80, 24)) as pilot:
        for _ in range(3):
            await pilot.pause()
            app.screen.refresh_view()
            app.screen.refresh_slow()
        screen = app.screen
        assert isinstance(screen, RunScreen) and screen.has_class("-narrow", "-short")
        assert screen.max_scroll_y == 0, "the screen itself scrolls"
        assert not screen.query_one(SystemPanel).display
        assert not screen.query_one("#charts-lower").display
        assert screen.query_one("#run-body").size.height >= SHORT_CHARTS_MIN_LINES
        table = screen.query_one(RankTable)
        header = _line(table._columns, table._columns, table._widths)
        assert "state" in header and header.index("state") + len("state") <= table.size.width
        assert "pid" not in table._columns and "device" not in table._columns
        assert {"rank", "epoch/step", "loss", "samples/s", "state"} <= set(table._columns)
        # Every column is back on a wide, tall screen, and the panels with it.
        await pilot.resize_terminal(120, 40)
        for _ in range(3):
            await pilot.pause()
            screen.refresh_view()
        assert not screen.has_class("-narrow") and not screen.has_class("-short")
        assert screen.query_one(SystemPanel).display
        assert "pid" in table._columns and "device" in table._columns


def test_a_narrow_table_leaves_out_columns_in_order_until_the_state_fits():
    from ddptui.tui.model import RANK_COLUMNS
    from ddptui.tui.widgets.ranks import NARROW_DROP, fit_columns

    widths = [max(len(c), 6) for c in RANK_COLUMNS]
    everything = tuple(range(len(RANK_COLUMNS)))
    assert fit_columns(RANK_COLUMNS, widths, 0) == everything  # not laid out yet
    assert fit_columns(RANK_COLUMNS, widths, 500) == everything
    state = RANK_COLUMNS.index("state")
    through_state = 1 + sum(w + 2 for w in widths[:state]) + widths[state]
    assert fit_columns(RANK_COLUMNS, widths, through_state) == everything  # fits exactly
    fewer = fit_columns(RANK_COLUMNS, widths, through_state - 1)
    assert [RANK_COLUMNS[i] for i in everything if i not in fewer] == ["pid"]
    least = fit_columns(RANK_COLUMNS, widths, 10)  # never fits: every droppable one goes
    assert {RANK_COLUMNS[i] for i in everything if i not in least} == set(NARROW_DROP)
    assert "state" in {RANK_COLUMNS[i] for i in least}


async def test_a_failed_run_on_an_80x24_terminal_shows_the_failure_whole():
    """The failure panel (9 lines at 120x40) made the short screen scroll: there it drops the
    charts and keeps the stderr's last lines, where the error is."""
    from tests.tui_fixtures.fakes import FAILED_RUN

    app = primed_app("replay", replay_source=replay(FAILED_RUN))
    async with app.run_test(size=(80, 24)) as pilot:
        for _ in range(3):
            await pilot.pause()
            app.screen.refresh_view()
        await pilot.pause()
        screen = app.screen
        assert screen.max_scroll_y == 0, "the screen itself scrolls"
        assert not screen.query_one("#run-body").display
        panel = screen.query_one("#failure")
        shown = str(panel.content).splitlines()
        assert panel.size.height == len(shown)  # nothing of it clipped
        assert shown[0].startswith("✖ FAILED") and shown[-1].endswith(
            "RuntimeError: boom on rank 1"
        )
