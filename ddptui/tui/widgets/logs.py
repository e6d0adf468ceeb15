"""The logs pane: each rank's output (``rank-N.log`` in the run directory), followed
incrementally, filterable by rank, bounded."""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Iterable
from pathlib import Path

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Log, Select

from ddptui import safeio
from ddptui.formatting import printable
from ddptui.tui.widgets.text import QuietStatic

#: Lines kept per rank and shown in the pane.
MAX_LINES = 1000
#: Most bytes read from one file per poll; a first look at a big file reads only its end.
MAX_READ = 64 * 1024
ALL = -1
#: Most bytes of a line kept while its newline has not come; a longer one is shown as it is.
MAX_PARTIAL = MAX_READ


class LogFollower:
    """Reads new complete lines appended to each rank's log file since the last poll.

    Pure file I/O, no Textual: the screen calls :meth:`poll` at a low rate.
    """

    def __init__(self, path_for_rank: Callable[[int], Path | None], keep: int = MAX_LINES):
        self._path_for_rank = path_for_rank
        self._offsets: dict[int, int] = {}
        self._partial: dict[int, bytes] = {}
        #: Rank -> its log's path, asked for once (every rank, every poll adds up at scale).
        self._paths: dict[int, Path] = {}
        self.by_rank: dict[int, deque[str]] = {}
        self.merged: deque[tuple[int, str]] = deque(maxlen=keep)
        self._keep = keep
        #: Rank -> the latest state of its progress bar: a line still being redrawn with
        #: carriage returns, its newline not yet come (tqdm writing to a file), newest last.
        self.live: dict[int, str] = {}

    def poll(self, ranks: Iterable[int]) -> list[tuple[int, str]]:
        """New (rank, line) pairs, rank by rank, oldest first."""
        new: list[tuple[int, str]] = []
        listed: dict[Path, frozenset[str] | None] = {}
        for rank in ranks:
            for line in self._read(rank, listed):
                self.by_rank.setdefault(rank, deque(maxlen=self._keep)).append(line)
                self.merged.append((rank, line))
                new.append((rank, line))
        return new

    def lines(self, rank: int = ALL) -> list[tuple[int, str]]:
        if rank == ALL:
            return list(self.merged)
        return [(rank, line) for line in self.by_rank.get(rank, ())]

    def _read(self, rank: int, listed: dict[Path, frozenset[str] | None]) -> list[str]:
        """``rank``'s new complete lines. ``listed``: each folder's file names as listed
        in this poll (one listing instead of a failed open per rank whose log is not here:
        in a multi-node run only this node's ranks have their logs on this machine)."""
        path = self._paths.get(rank)
        if path is None:
            path = self._path_for_rank(rank)
            if path is None:
                return []
            self._paths[rank] = path
        folder = path.parent
        if folder not in listed:
            try:
                listed[folder] = frozenset(os.listdir(folder))
            except OSError:
                listed[folder] = None  # unreadable: open each file as before
        names = listed[folder]
        if names is not None and path.name not in names:
            return []
        try:
            with safeio.open_regular(path) as f:  # a FIFO or device: no lines, never a wait
                size = os.fstat(f.fileno()).st_size
                offset = self._offsets.get(rank)
                skip_partial, skipped = False, 0
                if offset is None or offset > size:  # first look, or the file was replaced
                    offset = max(0, size - MAX_READ)
                    skip_partial = offset > 0
                    self._partial.pop(rank, None)
                elif size - offset > MAX_READ:
                    # The rank writes faster than the pane reads: its latest lines, not a
                    # backlog that would grow for as long as the run lasts.
                    skipped = size - MAX_READ - offset
                    offset, skip_partial = size - MAX_READ, True
                    self._partial.pop(rank, None)
                f.seek(offset)
                data = f.read(MAX_READ)
        except OSError:
            return []
        self._offsets[rank] = offset + len(data)
        data = self._partial.pop(rank, b"") + data
        if skip_partial:
            data = data.partition(b"\n")[2]
        *complete, rest = data.split(b"\n")
        if b"\r" in rest:
            # A progress bar redrawn with carriage returns and no newline (tqdm writing to a
            # file: one line for the whole loop): only its latest state is kept, as on a
            # terminal, so that the line waiting for its newline stays one state long.
            rest = rest[rest.rfind(b"\r") :]
        if len(rest) > MAX_PARTIAL:  # no newline coming: shown as a line of its own
            complete.append(rest)
            rest = b""
        if rest:
            self._partial[rank] = rest
        bar = rest.decode("utf-8", "replace") if rest.startswith(b"\r") and rest.strip() else None
        if bar != self.live.get(rank):  # a bar that changed goes last: newest last
            self.live.pop(rank, None)
            if bar is not None:
                self.live[rank] = bar
        lines = [line.decode("utf-8", "replace").rstrip("\r") for line in complete if line.strip()]
        if skipped:
            lines.insert(0, f"… {skipped:,} bytes written faster than shown: all in {path.name}")
        return lines


class FollowingLog(Log):
    """A :class:`Log` that keeps its newest line in view for as long as it is scrolled to its
    end, whatever else changes; scrolled up by its user, it stays where it is until scrolled
    back to the end.

    Textual's Log follows only when it is at its end at the moment of a write, counted with
    the horizontal scrollbar it had then: once the pane shrank (the phase bars took rows from
    it as the ranks started) or a line wider than the pane brought that scrollbar, its view
    stayed where it was: open_clip's run showed the same four early lines to its end."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.follows = True

    def watch_scroll_y(self, old_value: float, new_value: float) -> None:
        super().watch_scroll_y(old_value, new_value)
        self.follows = new_value >= self.max_scroll_y  # the user's scroll, or ours to the end

    def write_lines(self, lines: Iterable[str], scroll_end: bool | None = None) -> Log:
        follow = self.follows if scroll_end is None else scroll_end
        super().write_lines(lines, scroll_end=False)
        if follow:
            self.follows = True
            self._to_end()
        return self

    def on_resize(self) -> None:
        if self.follows:
            self._to_end()

    def watch_show_horizontal_scrollbar(self, shown: bool) -> None:
        if self.follows:  # the bar takes a row (or gives it back) after the write's layout
            self._to_end()
            self.call_after_refresh(self._to_end)

    def _to_end(self) -> None:
        if self.follows and self.scroll_y < self.max_scroll_y:
            self.scroll_end(animate=False, immediate=True, x_axis=False)


class RankLogs(Vertical):
    """Rank filter + a bounded Log of the selected ranks' output."""

    def __init__(self, path_for_rank: Callable[[int], Path | None], **kwargs) -> None:
        super().__init__(**kwargs)
        self.follower = LogFollower(path_for_rank)
        self._ranks: tuple[int, ...] = ()
        self.rank_filter = ALL

    def compose(self) -> ComposeResult:
        yield Select(
            [("all ranks", ALL)], value=ALL, allow_blank=False, compact=True, id="log-filter"
        )
        yield FollowingLog(max_lines=MAX_LINES, id="log-lines")
        yield QuietStatic(id="log-live")

    def set_ranks(self, ranks: Iterable[int]) -> None:
        ranks = tuple(sorted(ranks))
        if ranks != self._ranks:
            self._ranks = ranks
            self.query_one(Select).set_options(
                [("all ranks", ALL)] + [(f"rank {r}", r) for r in ranks]
            )
            self.query_one(Select).value = self.rank_filter

    def poll(self) -> None:
        new = self.follower.poll(self._ranks)
        log = self.query_one(Log)
        lines = [_fmt(r, line) for r, line in new if self.rank_filter in (ALL, r)]
        if lines:
            log.write_lines(lines)
        self._show_live()

    def _show_live(self) -> None:
        """Under the lines, the progress bar a rank is redrawing now (the newest, of the ranks
        shown), until its newline puts it among the lines."""
        live = self.query_one("#log-live", QuietStatic)
        bars = [(r, bar) for r, bar in self.follower.live.items() if self.rank_filter in (ALL, r)]
        if live.display != bool(bars):
            live.display = bool(bars)
        if bars:
            live.show_text(_fmt(*bars[-1]))

    def cycle_filter(self) -> None:
        options = [ALL, *self._ranks]
        i = options.index(self.rank_filter) if self.rank_filter in options else 0
        self.query_one(Select).value = options[(i + 1) % len(options)]

    def on_select_changed(self, event: Select.Changed) -> None:
        event.stop()
        value = event.value if isinstance(event.value, int) else ALL
        self.rank_filter = value
        log = self.query_one(Log)
        log.clear()
        log.write_lines([_fmt(r, line) for r, line in self.follower.lines(value)], scroll_end=True)
        self._show_live()


def _fmt(rank: int, line: str) -> str:
    """A rank's output line as shown: its colours and cursor moves (a coloured logger, a
    progress bar's ``\r``) left out, so that they never reach the terminal."""
    return f"r{rank}│ {printable(line, newlines=False)}"
