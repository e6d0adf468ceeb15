"""The per-rank table: one line per rank, and per node in a multi-node run.

Drawn line by line (Textual's line API): each refresh compares the new lines with the ones
shown and repaints only when something changed, and painting renders only the lines in
view. At 256 ranks on 32 nodes that keeps a refresh to building the lines' text; a Static
(or a DataTable) would re-render every line of the table on every change.
"""

from __future__ import annotations

from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.geometry import Size
from textual.scroll_view import ScrollView
from textual.strip import Strip

from ddptui.formatting import printable
from ddptui.tui.model import (
    RANK_COLUMNS,
    RankRow,
    RunFrame,
    TableLine,
    node_summaries,
    table_columns,
    table_lines,
)
from ddptui.tui.widgets.text import QuietStatic

#: The rank columns (single-node runs); multi-node runs add "node" in front.
COLUMNS = RANK_COLUMNS
#: Where the state column stands, counted from the end (the columns after it are plain).
STATE_FROM_END = len(RANK_COLUMNS) - RANK_COLUMNS.index("state")
_RIGHT = {"rank", "pid", "loss", "samples/s", "step time", "last seen"}
_GAP = "  "
#: The columns a table too narrow for its state column leaves out, the first first, until the
#: state column fits (an 80-column terminal: pid and device go). The rank, its epoch and step,
#: loss, speed and state stay; "collective" and "where" run off the right edge as before.
NARROW_DROP = ("pid", "device", "host", "last seen", "step time")


def fit_columns(columns: tuple[str, ...], widths: list[int], room: int) -> tuple[int, ...]:
    """The indices of the columns to show in ``room`` cells: every column when the table up
    to its state column fits (or ``room`` is not known yet, 0), else fewer, leaving out
    :data:`NARROW_DROP` in turn until it fits or none of them is left."""
    keep = list(range(len(columns)))
    if room <= 0 or "state" not in columns:
        return tuple(keep)
    state = columns.index("state")

    def needed() -> int:
        return 1 + sum(widths[i] + len(_GAP) for i in keep if i < state) + widths[state]

    for name in NARROW_DROP:
        if needed() <= room:
            break
        if name in columns:
            keep.remove(columns.index(name))
    return tuple(keep)


STATE_STYLE = {
    "pending": "dim",
    "preparing": "cyan",
    "evaluating": "magenta",
    "started": "green",
    "finished": "bold green",
    "failed": "bold red",
    "stopped": "yellow",
}
PROBLEM_STYLE = "bold black on yellow"
NODE_STYLE = "bold cyan"
NODE_STATE_STYLE = {
    "failed": "bold white on red",
    "silent": PROBLEM_STYLE,
    "behind": PROBLEM_STYLE,
    "straggler": PROBLEM_STYLE,
}


def state_label(row: RankRow) -> tuple[str, str]:
    """The state column's text and style: a straggler or silent rank says so."""
    if row.problem and row.state != "failed":
        return f"⚠ {row.problem.split(':', 1)[0]}", PROBLEM_STYLE
    return row.state, STATE_STYLE.get(row.state, "")


def _printable(cells: tuple[str, ...]) -> tuple[str, ...]:
    """The cells with nothing a terminal would act on, each one line (a host, a device, a
    collective or a frame as a rank or another node sent it); one check a line at C speed."""
    if "".join(cells).isprintable():
        return cells
    return tuple(printable(cell, newlines=False) for cell in cells)


def _styled(line: TableLine) -> tuple[tuple[str, ...], str, str]:
    """(cells as shown, the line's style, the state cell's style)."""
    if line.row is None:  # a node's summary
        cells = _printable(line.cells)
        return cells, NODE_STYLE, NODE_STATE_STYLE.get(line.severity, NODE_STYLE)
    row = line.row
    label, state_style = state_label(row)
    label = printable(label, newlines=False)
    line_style = ""
    if row.problem:
        line_style = "red" if row.state == "failed" else "yellow"
    cells = _printable(line.cells)
    return (
        (*cells[:-STATE_FROM_END], label, *cells[len(cells) - STATE_FROM_END + 1 :]),
        (line_style),
        state_style,
    )


class RankTable(ScrollView, can_focus=True):
    """The rank table; stragglers, silent and failed ranks are highlighted. In a multi-node
    run each node has a summary line above its ranks. Taller than its space, it scrolls."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._columns: tuple[str, ...] = COLUMNS
        self._lines: list[tuple[tuple[str, ...], str, str]] = []
        self._widths: list[int] = [len(c) for c in COLUMNS]
        #: Line index -> ((scroll x, width), the line as painted): repainted only on change.
        self._strips: dict[int, tuple[tuple[int, int], Strip]] = {}
        self._header: tuple[tuple[int, int], Strip] | None = None
        self._base: Style | None = None
        #: rank -> its cells (state column as labelled; every column, also those a narrow
        #: table leaves out), for tests and tools.
        self.shown: dict[int, tuple[str, ...]] = {}
        #: The frame shown last, drawn again when a new width shows other columns.
        self._frame: RunFrame | None = None
        #: What was shown last: (its columns, the width it had) and its styled lines with
        #: every column (before a narrow table left any out).
        self._shape: tuple[tuple[str, ...], int] | None = None
        self._full: list[tuple[tuple[str, ...], str, str]] = []
        #: The table's lines in the order shown (node summaries and ranks).
        self.lines: tuple[TableLine, ...] = ()

    def show(self, rows_or_frame: RunFrame | tuple[RankRow, ...]) -> None:
        """Show a frame's ranks (and nodes); a plain tuple of rows is a single-node table."""
        frame = rows_or_frame
        if not isinstance(frame, RunFrame):
            frame = _rows_frame(tuple(rows_or_frame))
        self._frame = frame
        lines = table_lines(frame)
        columns = table_columns(frame)
        styled = [_styled(line) for line in lines]
        room = self.scrollable_content_region.width
        if (columns, room) == self._shape and styled == self._full:
            return
        self._shape, self._full = (columns, room), styled
        # Column by column (256 ranks on 32 nodes: 288 lines a refresh, at C speed).
        widths = [len(name) for name in columns]
        if styled:
            by_column = zip(*(cells for cells, _, _ in styled), strict=True)
            widths = [
                max(w, max(map(len, column))) for w, column in zip(widths, by_column, strict=True)
            ]
        keep = fit_columns(columns, widths, room)
        self.lines = lines
        self.shown = {
            line.key: cells
            for line, (cells, _, _) in zip(lines, styled, strict=True)
            if line.row is not None
        }
        if len(keep) < len(columns):  # a narrow terminal: the state column stays in view
            columns = tuple(columns[i] for i in keep)
            widths = [widths[i] for i in keep]
            styled = [(tuple(cells[i] for i in keep), line, state) for cells, line, state in styled]
        if columns != self._columns or widths != self._widths:
            self._strips.clear()
            self._header = None
        else:  # forget only the lines that changed
            old = self._lines
            for i, line in enumerate(styled):
                if i >= len(old) or old[i] != line:
                    self._strips.pop(i, None)
            for i in range(len(styled), len(old)):
                self._strips.pop(i, None)
        self._columns, self._widths, self._lines = columns, widths, styled
        width = 1 + sum(widths) + len(_GAP) * (len(widths) - 1)
        size = Size(width, len(styled) + 1)
        if size != self.virtual_size:
            self.virtual_size = size
            self.refresh(layout=True)
        else:
            self.refresh()

    def on_resize(self) -> None:
        """Another width may show other columns (see :func:`fit_columns`)."""
        if self._frame is not None:
            self.show(self._frame)

    # -- painting -------------------------------------------------------------------------------
    def render_line(self, y: int) -> Strip:
        """The header stays on the first line; the lines below it scroll."""
        scroll_x, scroll_y = self.scroll_offset
        width = self.scrollable_content_region.width
        key = (scroll_x, width)
        if self._base is None:
            self._base = self.rich_style
        if y == 0:
            if self._header is None or self._header[0] != key:
                strip = self._render_header().crop_extend(scroll_x, scroll_x + width, self._base)
                self._header = (key, strip)
            return self._header[1]
        index = y - 1 + scroll_y
        if index >= len(self._lines):
            return Strip.blank(width, self._base)
        cached = self._strips.get(index)
        if cached is None or cached[0] != key:
            strip = self._render(self._lines[index]).crop_extend(
                scroll_x, scroll_x + width, self._base
            )
            cached = self._strips[index] = (key, strip)
        return cached[1]

    def _render_header(self) -> Strip:
        base = self._base or self.rich_style
        text = _line(self._columns, self._columns, self._widths)
        return Strip([Segment(text, base + Style.parse("bold"))])

    def _render(self, line: tuple[tuple[str, ...], str, str]) -> Strip:
        cells, line_style, state_style = line
        base = self._base or self.rich_style
        # the state cell has its own style; the columns after it (collective, where) are plain
        k = STATE_FROM_END
        first = _line(self._columns[:-k], cells[:-k], self._widths[:-k]) + _GAP
        after = _GAP.join(
            c.ljust(w) for c, w in zip(cells[-k + 1 :], self._widths[-k + 1 :], strict=False)
        )
        return Strip(
            [
                Segment(first, base + Style.parse(line_style) if line_style else base),
                Segment(
                    cells[-k].ljust(self._widths[-k]) + _GAP,
                    base + Style.parse(state_style) if state_style else base,
                ),
                Segment(after, base),
            ]
        )

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._strips.clear()
        self._header = None
        self._base = None


def _rows_frame(rows: tuple[RankRow, ...]) -> RunFrame:
    return RunFrame(
        status="",
        elapsed="",
        eta="",
        progress=None,
        epoch="",
        summary="",
        rows=rows,
        problems={},
        failure=None,
        rank_devices={},
        events_applied=0,
        nodes=node_summaries(rows),
    )


def _line(columns, cells, widths) -> str:
    return " " + _GAP.join(
        c.rjust(w) if name in _RIGHT else c.ljust(w)
        for name, c, w in zip(columns, cells, widths, strict=False)
    )


#: Most ranks named one per line under the table; the rest are counted.
HEALTH_LINES = 4


class HealthLine(QuietStatic):
    """Why ranks are highlighted: one line per straggler or silent rank (the first few)."""

    def show(self, problems: dict[int, str]) -> None:
        if self.display != bool(problems):
            self.display = bool(problems)
        if not problems:
            return
        ranked = sorted(problems.items())
        if len(ranked) > HEALTH_LINES:  # many: the silent ones first
            ranked.sort(key=lambda kv: not kv[1].startswith("silent"))
        lines = [f"⚠ rank {rank} {why}" for rank, why in ranked[:HEALTH_LINES]]
        more = len(ranked) - HEALTH_LINES
        if more > 0:
            lines[-1] += f"   (+{more} more ranks need attention: see the table)"
        self.show_text(Text("\n".join(lines), style="bold yellow"))
