"""The per-rank table, drawn as one block of text.

A DataTable re-renders cell by cell and, at 4 refreshes a second with 16 changing rows, cost
most of the dashboard's CPU; this widget rebuilds one Text only when a value changed.
"""

from __future__ import annotations

from rich.text import Text

from ddptui.tui.model import RankRow
from ddptui.tui.widgets.text import QuietStatic

COLUMNS = (
    "rank",
    "pid",
    "host",
    "device",
    "epoch/step",
    "loss",
    "samples/s",
    "step time",
    "last seen",
    "state",
)
_RIGHT = {"rank", "pid", "loss", "samples/s", "step time", "last seen"}
_GAP = "  "

STATE_STYLE = {
    "pending": "dim",
    "started": "green",
    "finished": "bold green",
    "failed": "bold red",
    "stopped": "yellow",
}
PROBLEM_STYLE = "bold black on yellow"


def state_label(row: RankRow) -> tuple[str, str]:
    """The state column's text and style: a straggler or silent rank says so."""
    if row.problem and row.state != "failed":
        return f"⚠ {row.problem.split(':', 1)[0]}", PROBLEM_STYLE
    return row.state, STATE_STYLE.get(row.state, "")


class RankTable(QuietStatic):
    """One line per rank; stragglers, silent and failed ranks are highlighted."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._signature: tuple = ()
        #: rank -> the cells as shown (state column as labelled), for tests and tools.
        self.shown: dict[int, tuple[str, ...]] = {}

    def show(self, rows: tuple[RankRow, ...]) -> None:
        signature = tuple((row.cells(), row.problem) for row in rows)
        if signature == self._signature:
            return
        self._signature = signature
        table = []
        for row in rows:
            label, style = state_label(row)
            table.append((row, (*row.cells()[:-1], label), style))
        widths = [len(name) for name in COLUMNS]
        for _, cells, _ in table:
            widths = [max(w, len(c)) for w, c in zip(widths, cells, strict=True)]
        text = Text(no_wrap=True, overflow="ellipsis")
        text.append(_line(COLUMNS, widths), style="bold")
        for row, cells, state_style in table:
            text.append("\n")
            line_style = ""
            if row.problem:
                line_style = "red" if row.state == "failed" else "yellow"
            text.append(_line(cells[:-1], widths[:-1]) + _GAP, style=line_style)
            text.append(cells[-1].ljust(widths[-1]), style=state_style)
        self.shown = {row.rank: cells for row, cells, _ in table}
        self.show_text(text)


def _line(cells, widths) -> str:
    return " " + _GAP.join(
        c.rjust(w) if name in _RIGHT else c.ljust(w)
        for name, c, w in zip(COLUMNS, cells, widths, strict=False)
    )


class HealthLine(QuietStatic):
    """Why a rank is highlighted: one line per straggler or silent rank."""

    def show(self, problems: dict[int, str]) -> None:
        if self.display != bool(problems):
            self.display = bool(problems)
        if not problems:
            return
        self.show_text(
            Text(
                "\n".join(f"⚠ rank {rank} {why}" for rank, why in sorted(problems.items())),
                style="bold yellow",
            )
        )
