"""What went wrong: which rank failed, how, its stderr tail, and the other ranks' states."""

from __future__ import annotations

from rich.text import Text

from ddptui.run.state import RankFailureInfo
from ddptui.runfiles import rank_log_name
from ddptui.tui.model import RankRow
from ddptui.tui.widgets.text import QuietStatic

#: stderr lines shown (the rest is in the logs pane and the rank's log file).
TAIL_LINES = 6
#: Other ranks named one by one up to this many; more are counted by state.
OTHERS_NAMED = 8


def rank_place(row: RankRow | None, multi_node: bool) -> str:
    """``on node 1 (gpu-b)``: where a rank ran, when the run has more than one node (or the
    rank said its node); empty when unknown or when it is the only machine."""
    if row is None:
        return ""
    host = row.host if row.host != "--" else None
    if row.node is not None:
        return f"on node {row.node}" + (f" ({host})" if host else "")
    if multi_node and host:
        return f"on {host}"
    return ""


def others_label(rows: tuple[RankRow, ...], rank: int | None) -> str:
    """``rank 0 stopped, rank 2 finished``; with many ranks ``250 stopped, 5 finished``."""
    others = [r for r in rows if r.rank != rank]
    if len(others) <= OTHERS_NAMED:
        return ", ".join(f"rank {r.rank} {r.state}" for r in others)
    counts: dict[str, int] = {}
    for r in others:
        counts[r.state] = counts.get(r.state, 0) + 1
    return ", ".join(f"{n} {state}" for state, n in sorted(counts.items(), key=lambda kv: -kv[1]))


def desync_line(diagnoses: list[str]) -> str | None:
    """The line naming a desync among the diagnoses (torch's analyzer found a rank that
    called a collective differently), or None: it, not the first rank to die, is the cause."""
    return next((d for d in diagnoses if d.endswith(": a desync")), None)


class FailurePanel(QuietStatic):
    """Hidden until a rank fails."""

    def show(
        self,
        failure: RankFailureInfo | None,
        rows: tuple[RankRow, ...],
        log_name: str | None = None,
        multi_node: bool = False,
        desync: str | None = None,
        tail_lines: int = TAIL_LINES,
    ) -> None:
        """Show the failure; ``desync`` (a diagnosis line) is what set it off, when known;
        the last ``tail_lines`` lines of the rank's stderr."""
        failed = [r for r in rows if r.state == "failed"]
        if failure is None and not failed:
            if self.display:
                self.display = False
            return
        if not self.display:
            self.display = True
        if failure is not None:
            headline = failure.describe(short=bool(failure.stderr_tail))  # the tail follows
            tail = failure.stderr_tail
            rank = failure.rank
            row = next((r for r in rows if r.rank == rank), None)
            own = row.problem if row else None
            if not failure.error and own and own != headline:
                headline += f": {own}"  # what the rank itself reported before it died
            place = rank_place(row, multi_node)
            if place and rank is not None:
                headline = headline.replace(f"rank {rank}", f"rank {rank} {place}", 1)
        else:  # a rank said it failed; the launcher has not concluded yet
            first = failed[0]
            place = rank_place(first, multi_node)
            headline = f"rank {first.rank}{' ' + place if place else ''} failed: {first.problem}"
            tail = ()
            rank = first.rank
        others = others_label(rows, rank)
        parts = [Text.assemble(("✖ FAILED  ", "bold white on red"), " ", (headline, "bold red"))]
        if desync:
            parts.append(Text(f"set off by a desync: {desync}", style="bold yellow"))
        if others:
            parts.append(Text(f"other ranks: {others}", style="yellow"))
        if tail:
            where = log_name or rank_log_name(rank)
            parts.append(Text(f"last lines of {where}:", style="dim"))
            parts.extend(
                Text(f"  │ {line}", style="red", no_wrap=True, overflow="ellipsis")
                for line in tail[-max(1, tail_lines) :]
            )
        self.show_text(Text("\n").join(parts))
