"""The phase bars and the diagnosis lines of the run screen."""

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
