"""Where each rank's step time goes: a stacked bar per rank, and what the diagnosis found.

Drawn from ``RunState.phase_history`` (the median share of the step per phase over each
rank's recent steps) and the run's diagnoses; hidden until a rank sends phases.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text

from ddptui.constants import PHASES
from ddptui.run.state import RunState
from ddptui.tui.widgets.text import QuietStatic, text_height

#: Colour of each built-in phase in the bars and the legend.
PHASE_STYLES = {
    "data": "yellow",
    "forward": "green",
    "backward": "blue",
    "comm": "red",
    "optimizer": "magenta",
    "other": "bright_black",
    "eval": "cyan",
}
#: Ranks drawn at most (the ones waiting least in communication first: the likely culprits).
MAX_BARS = 8
#: How old the medians a bar shows may be (s): the straggler rule's, from its last check.
BARS_MAX_AGE_S = 1.0
#: Diagnosis lines shown at most (the newest).
MAX_DIAGNOSES = 3


def phase_bars(state: RunState, width: int = 40, max_bars: int = MAX_BARS) -> Text:
    """A legend line, then one stacked bar per rank (``width`` cells, one per 1/width of the
    step), ranks that wait least in ``comm`` first; empty when no rank sent phases."""
    history = state.phase_history
    ranks = history.ranks()
    if not ranks:
        return Text()
    # Medians up to a second old will do for the bars: the straggler rule computed them
    # (every rank's, once a second) a moment ago, and the bars are redrawn once a second.
    shares = {rank: history.median_shares(rank, max_age=BARS_MAX_AGE_S) for rank in ranks}
    shown = sorted(ranks, key=lambda r: (shares[r]["comm"], r))[:max_bars]
    text = Text("phases  ")
    for phase in PHASES:
        text.append("█", style=PHASE_STYLES[phase])
        text.append(f" {phase}  ")
    # Short enough that the legend stays one line at 120 columns (with a scrollbar beside it).
    text.append(f"(median share, last {history.covered()} steps)", style="dim")
    for rank in sorted(shown):
        text.append(f"\nrank {rank:>3} ")
        cells = 0
        for phase in PHASES:
            n = round(shares[rank][phase] * width)
            n = min(n, width - cells)
            text.append("█" * n, style=PHASE_STYLES[phase])
            cells += n
        text.append("·" * (width - cells), style="dim")
        top = max(PHASES, key=lambda p: shares[rank][p])
        text.append(f" {top} {shares[rank][top] * 100:.0f} %")
    if len(ranks) > len(shown):
        text.append(f"\n(+{len(ranks) - len(shown)} more ranks)", style="dim")
    return text


def diagnosis_text(details: Sequence[str], max_lines: int = MAX_DIAGNOSES) -> Text:
    """The newest diagnoses, one line each."""
    text = Text()
    for i, detail in enumerate(list(details)[-max_lines:]):
        if i:
            text.append("\n")
        text.append("◆ ", style="bold cyan")
        text.append(detail)
    return text


class PhasePanel(QuietStatic):
    """Stacked phase bars per rank and the latest diagnoses; hidden while there are none.

    The screen may give it fewer lines than it wants (:attr:`max_lines`): then it draws fewer
    bars (the likeliest culprits stay) and keeps every diagnosis line."""

    #: Lines the panel may take (None: as many as it wants); set with :meth:`limit`.
    max_lines: int | None = None
    #: Lines the panel's content wants, as of its latest drawing (0: nothing to show), whether
    #: or not the lines it was given let it draw them.
    wanted_lines: int = 0

    def limit(self, lines: int) -> bool:
        """Take at most ``lines`` lines (the bars drawn next fit them; until then the panel is
        clipped to them). False when that was the limit already."""
        if lines == self.max_lines:
            return False
        self.max_lines = lines
        self.styles.max_height = lines
        return True

    def show(self, state: RunState, diagnoses: Sequence[str] = ()) -> None:
        width = max(10, min(60, (self.content_region.width or 80) - 30))
        found = diagnosis_text(diagnoses)
        found_lines = (
            text_height(found.plain, self.content_region.width) or len(found.plain.splitlines())
            if found.plain
            else 0
        )
        ranks = len(state.phase_history.ranks())
        drawn = min(ranks, MAX_BARS)
        # The legend, a bar per rank drawn, "(+N more ranks)", the diagnoses.
        bar_lines = 1 + drawn + (ranks > drawn) if ranks else 0
        self.wanted_lines = bar_lines + found_lines
        max_bars = MAX_BARS
        if self.max_lines is not None and self.wanted_lines > self.max_lines:
            max_bars = self.max_lines - found_lines - 2  # the legend and "(+N more ranks)"
        bars = phase_bars(state, width, max_bars) if max_bars > 0 else Text()
        text = bars
        if found.plain:
            text = bars + Text("\n") + found if bars.plain else found
        visible = bool(text.plain)
        if self.display != visible:
            self.display = visible
        if visible:
            self.show_text(text)
