"""Text from outside ddptui reaches the terminal without anything a terminal would act on.

A rank's coloured log line, a progress bar's ``\\r``, an exception message with colour codes,
a host or process name, a run directory named ``exp[/]``: each is drawn as words. Before,
escape sequences went to the terminal as they were (a rank printing ``ESC[2J`` blanked half
of the dashboard in tmux) and ``[...]`` in a path was read as Textual or Rich markup (``[/]``
raised ``MarkupError`` in the launch form and in the recent-runs table).
"""

from __future__ import annotations

import io
import json
import re
import shutil

import pytest
from hypothesis import given
from hypothesis import strategies as st
from rich.text import Text

from ddptui.commands import fail
from ddptui.formatting import escaped, printable
from ddptui.headless import HeadlessConsole
from ddptui.tui.widgets.logs import _fmt
from ddptui.tui.widgets.text import as_text, printable_text

#: What a terminal acts on: C0 controls but newline, DEL, C1 controls, line separators.
pytestmark = pytest.mark.waits  # mostly waits on timers: run beside real runs (tests/conftest.py)

ACTED_ON = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029]")


# -- printable ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("plain text", "plain text"),
        ("\x1b[32mINFO\x1b[0m step 3", "INFO step 3"),  # a coloured logger keeps its words
        ("\x1b[2J\x1b[HCLEARED", "CLEARED"),  # clear screen, cursor home
        ("10%|██   |\r 20%|████ |\r 30%|██████|", " 30%|██████|"),  # a progress bar's last state
        ("abc\rX", "Xbc"),  # a carriage return writes over the line's start
        ("progress 50%\x1b[A\r", "progress 50%"),  # cursor up, then back to the start
        ("title\x1b]0;pwned\x07 after", "title after"),  # OSC: set the window's title
        ("bell\x07 here", "bell\ufffd here"),
        ("csi\x9b31m c1", "csi c1"),  # the one-byte C1 CSI
        ("unterminated\x1b]0;title", "unterminated"),
        ("lone escape\x1b", "lone escape"),
        ("tab\there", "tab here"),
        ("nel\x85 sep\u2028end", "nel\ufffd sep\ufffdend"),
        ("émoji 👍 中文 zwj 👩\u200d💻", "émoji 👍 中文 zwj 👩\u200d💻"),
        ("", ""),
    ],
)
def test_printable_keeps_the_words_and_drops_what_a_terminal_acts_on(raw, shown):
    assert printable(raw) == shown
    assert printable(raw, newlines=False) == shown


def test_newlines_stay_unless_the_text_is_one_line():
    assert printable("line 1\nline \x1b[1m2") == "line 1\nline 2"
    assert printable("line 1\nline 2", newlines=False) == "line 1 line 2"


def test_printable_text_returns_the_same_object_when_nothing_changes():
    text = "rank 0 on node-0: 1,234 samples/s"
    assert printable(text) is text
    rich = Text("fine\nlines")
    assert printable_text(rich) is rich


@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=200))
def test_printable_leaves_nothing_a_terminal_acts_on_and_is_stable(raw):
    shown = printable(raw)
    assert not ACTED_ON.search(shown) and "\x1b" not in shown
    assert printable(shown) == shown
    one_line = printable(raw, newlines=False)
    assert "\n" not in one_line and not ACTED_ON.search(one_line)


@given(st.text(max_size=100))
def test_escaped_shows_every_control_and_hides_none(raw):
    shown = escaped(raw)
    assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]", shown)
    if raw.isprintable():
        assert shown is raw


def test_escaped_writes_an_escape_as_it_is_typed():
    assert escaped("x\x1b[2Jy.py") == "x\\x1b[2Jy.py"


# -- Rich texts --------------------------------------------------------------------------------
def test_a_styled_text_keeps_its_styles_around_what_is_removed():
    text = Text.assemble(("node 1", "bold cyan"), " evil\x1b[2J host", (" 3s ago", "dim"))
    clean = printable_text(text)
    assert clean.plain == "node 1 evil host 3s ago"
    styles = {clean.plain[s.start : s.end]: str(s.style) for s in clean.spans}
    assert styles == {"node 1": "bold cyan", " 3s ago": "dim"}


def test_as_text_is_never_markup():
    assert as_text("exp[/]run").plain == "exp[/]run"
    assert as_text("[bold red]x").plain == "[bold red]x"
    assert as_text("a\nb").plain == "a b" and as_text("a\nb", newlines=True).plain == "a\nb"


# -- where it is drawn or printed ----------------------------------------------------------------
def test_a_ranks_log_line_is_drawn_as_words():
    assert _fmt(1, "\x1b[32mINFO\x1b[0m step 3 loss 0.5") == "r1│ INFO step 3 loss 0.5"
    assert _fmt(0, "epoch 1: 10%\r epoch 1: 20%") == "r0│  epoch 1: 20%"


def test_headless_lines_never_carry_escapes():
    out = io.StringIO()
    console = HeadlessConsole(out, tty=False)
    console.line("rank 1 failed: \x1b[31mValueError\x1b[0m: bad\x1b]0;title\x07 input")
    assert out.getvalue() == "rank 1 failed: ValueError: bad input\n"


def test_a_usage_error_shows_the_escape_it_quotes(capsys):
    assert fail("script not found: x\x1b[2Jy.py") == 2
    assert capsys.readouterr().err == "ddptui: error: script not found: x\\x1b[2Jy.py\n"


async def test_the_launch_form_shows_a_bracketed_path_as_typed():
    from tests.tui_fixtures.fakes import primed_app

    app = primed_app("run", raw={"script": "exp[/]run/a[bold]b.py"})
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        await pilot.pause(0.3)
        lines = [s.text for s in app.screen._compositor.render_strips()]
        assert any("✖ script not found: exp[/]run/a[bold]b.py" in line for line in lines)
        await pilot.press("f5")  # launching anyway: the refusal is a notification, as typed
        await pilot.pause()
        (note,) = list(app._notifications)
        assert note.message == "script not found: exp[/]run/a[bold]b.py" and not note.markup


async def test_recent_runs_named_with_brackets_and_escapes_are_listed_as_words(tmp_path):
    from textual.widgets import DataTable

    from tests.tui_fixtures.fakes import FAILED_RUN, fake_deps, primed_app

    run = tmp_path / "exp[b]1"
    shutil.copytree(FAILED_RUN, run)
    config = json.loads((run / "config.json").read_text())
    config["run_id"] = "exp[/]1\x1b[2J"
    (run / "config.json").write_text(json.dumps(config))
    app = primed_app("run", deps=fake_deps(runs_root=tmp_path))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        await pilot.pause(0.5)
        table = app.screen.query_one("#recent", DataTable)
        assert table.row_count == 1
        assert str(table.get_row_at(0)[0]) == "exp[/]1"
        screen = "\n".join(s.text for s in app.screen._compositor.render_strips())
        assert "exp[/]1" in screen and "\x1b" not in screen


def _failed_run(tmp_path, coloured_error: bool = False):
    """A copy of the recorded failed run; its rank 1's error in colour, with a clear-screen."""
    from tests.tui_fixtures.fakes import FAILED_RUN

    run = tmp_path / "run"
    shutil.copytree(FAILED_RUN, run)
    if coloured_error:
        events = run / "events.jsonl"
        events.write_text(
            events.read_text().replace(
                "RuntimeError: boom on rank 1",
                "\\u001b[31mRuntimeError\\u001b[0m: boom\\u001b[2J",
            )
        )
    return run


async def _replayed_screen(run) -> list[str]:
    """The screen's lines (right ends stripped) of the run replayed at 120x40."""
    from tests.tui_fixtures.fakes import no_gpu_snapshots, primed_app, replay

    app = primed_app("replay", replay_source=replay(run), snapshots=no_gpu_snapshots())
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        await pilot.pause(1.2)
        return [s.text.rstrip() for s in app.screen._compositor.render_strips()]


async def test_a_failure_with_colour_codes_and_a_rank_log_with_escapes_reach_no_terminal(
    tmp_path,
):
    run = _failed_run(tmp_path, coloured_error=True)
    with open(run / "rank-1.log", "a") as log:
        log.write("\x1b[2J\x1b[H\x1b[41mCLEARED BY RANK\x1b[0m\nstep\r step 2\n")
    lines = await _replayed_screen(run)
    screen = "\n".join(lines)
    assert not ACTED_ON.search(screen) and "\x1b" not in screen
    assert "RuntimeError: boom" in screen
    assert any(line.startswith("r1│ CLEARED BY RANK") for line in lines)


async def test_the_logs_pane_shows_a_progress_bar_being_redrawn_under_the_lines(tmp_path):
    run = _failed_run(tmp_path)
    with open(run / "rank-0.log", "a") as log:
        log.write("epoch 1\n\r 10%|#         | 1/10\r 40%|####      | 4/10")
    lines = await _replayed_screen(run)
    pane = next(i for i, line in enumerate(lines) if line.startswith("all ranks"))
    assert "r0│  40%|####      | 4/10" in lines[pane:-1]  # above the footer, its last state
    assert not any("10%" in line for line in lines)


def test_replay_without_the_ui_prints_a_runs_errors_as_words(tmp_path):
    from ddptui.runs.replay import print_replay

    run = _failed_run(tmp_path, coloured_error=True)
    out = io.StringIO()
    print_replay(run, out)
    text = out.getvalue()
    assert "error: RuntimeError: boom" in text
    assert "\x1b" not in text and not ACTED_ON.search(text)


def test_a_path_in_a_message_shows_its_escapes_as_typed():
    from ddptui.safeio import shown

    assert shown("runs/x\x1b[2Jy") == "runs/x\\x1b[2Jy"
