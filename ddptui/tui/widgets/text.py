"""A Static that redraws cheaply.

``Static.update`` asks for a layout of the whole screen each time, which at a few updates
per second per widget made layout and full-screen repaints the dashboard's main cost.
:meth:`QuietStatic.show_text` skips unchanged content and asks for a layout only when the
height the text needs may have changed (its line count, wrapped lines included).
"""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static


def text_height(plain: str, width: int) -> int | None:
    """Rows ``plain`` needs at ``width`` columns, counting wrapped lines (an estimate by
    characters); None when the widget has no width yet (the first layout measures it)."""
    if not width:
        return None
    return sum(max(1, -(-len(line) // width)) for line in plain.split("\n"))


class QuietStatic(Static):
    """Static with :meth:`show_text`: no-op when unchanged, repaint-only when it can be."""

    _shown_text: Text | str | None = None
    _shown_height: int | None = None

    def show_text(self, text: Text | str) -> None:
        if isinstance(text, str):
            text = Text(text)
        if self._shown_text is not None and text == self._shown_text:
            return
        height = text_height(text.plain, self.content_region.width)
        layout = height is None or height != self._shown_height
        self._shown_text, self._shown_height = text, height
        self.update(text, layout=layout)
