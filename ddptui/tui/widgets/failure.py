"""What went wrong: which rank failed, how, its stderr tail, and the other ranks' states."""

from __future__ import annotations

from rich.text import Text

from ddptui.rundir import rank_log_name
from ddptui.state import RankFailureInfo
from ddptui.tui.model import RankRow
from ddptui.tui.widgets.text import QuietStatic

#: stderr lines shown (the rest is in the logs pane and the rank's log file).
TAIL_LINES = 6


class FailurePanel(QuietStatic):
    """Hidden until a rank fails."""

    def show(
        self,
        failure: RankFailureInfo | None,
        rows: tuple[RankRow, ...],
        log_name: str | None = None,
    ) -> None:
        failed = [r for r in rows if r.state == "failed"]
        if failure is None and not failed:
            if self.display:
                self.display = False
            return
        if not self.display:
            self.display = True
        if failure is not None:
            headline = failure.describe()
            tail = failure.stderr_tail
            rank = failure.rank
            own = next((r.problem for r in rows if r.rank == rank), None)
            if not failure.error and own and own != headline:
                headline += f": {own}"  # what the rank itself reported before it died
        else:  # a rank said it failed; the launcher has not concluded yet
            first = failed[0]
            headline = f"rank {first.rank} failed: {first.problem}"
            tail = ()
            rank = first.rank
        others = ", ".join(f"rank {r.rank} {r.state}" for r in rows if r.rank != rank)
        parts = [Text.assemble(("✖ FAILED  ", "bold white on red"), " ", (headline, "bold red"))]
        if others:
            parts.append(Text(f"other ranks: {others}", style="yellow"))
        if tail:
            where = log_name or rank_log_name(rank)
            parts.append(Text(f"last lines of {where}:", style="dim"))
            parts.extend(
                Text(f"  │ {line}", style="red", no_wrap=True, overflow="ellipsis")
                for line in tail[-TAIL_LINES:]
            )
        self.show_text(Text("\n").join(parts))
