"""Text widgets that redraw cheaply: :class:`QuietStatic` and :class:`TextLines`.

``Static.update`` asks for a layout of the whole screen each time, which at a few updates
per second per widget made layout and full-screen repaints the dashboard's main cost.
:meth:`QuietStatic.show_text` skips unchanged content and asks for a layout only when the
height the text needs may have changed (its line count, wrapped lines included).
"""

from __future__ import annotations

from collections.abc import Iterable

from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.geometry import Region, Size
from textual.strip import Strip
from textual.widget import Widget
from textual.widgets import Static

from ddptui.formatting import printable


def text_height(plain: str, width: int) -> int | None:
    """Rows ``plain`` needs at ``width`` columns, counting wrapped lines (an estimate by
    characters); None when the widget has no width yet (the first layout measures it)."""
    if not width:
        return None
    return sum(max(1, -(-len(line) // width)) for line in plain.split("\n"))


def printable_text(text: Text) -> Text:
    """``text`` with :func:`~ddptui.formatting.printable` applied to its words, its styles
    kept: nothing in it a terminal would act on (a rank's coloured output, a host name
    with an escape sequence). ``text`` itself when there is nothing to change."""
    plain = text.plain
    if plain.isprintable() or printable(plain) == plain:
        return text
    # Cut at every style's edges, so that each piece is styled throughout and keeps its
    # styles however much cleaning shortens it.
    edges = sorted({edge for span in text.spans for edge in (span.start, span.end)})
    out = Text(style=text.style, justify=text.justify, no_wrap=text.no_wrap, end=text.end)
    for piece in text.divide(edges):
        start, cleaned = len(out), printable(piece.plain)
        out.append(cleaned)
        for span in piece.spans:
            if span.end > span.start:
                out.stylize(span.style, start, start + len(cleaned))
    return out


def as_text(value: object, style: str = "", newlines: bool = False) -> Text:
    """A value from outside ddptui (a path, a run's name, a process name) as a Text: never
    read as markup (Textual and Rich read ``[...]`` in a plain string as markup: a
    ``[/]`` in a file name raised), nothing in it a terminal would act on."""
    return Text(printable(str(value), newlines), style=style)


class QuietStatic(Static):
    """Static with :meth:`show_text`: no-op when unchanged, repaint-only when it can be."""

    _shown_text: Text | str | None = None
    _shown_height: int | None = None

    def show_text(self, text: Text | str) -> None:
        """Show ``text`` (a str is never read as markup), made printable."""
        text = printable_text(Text(text) if isinstance(text, str) else text)
        if self._shown_text is not None and text == self._shown_text:
            return
        height = text_height(text.plain, self.content_region.width)
        layout = height is None or height != self._shown_height
        self._shown_text, self._shown_height = text, height
        self.update(text, layout=layout)


class TextLines(Widget):
    """Lines of text painted with Textual's line API, for a panel of many lines that change a
    few at a time (every node's load in a multi-node run: 32 nodes are 90-odd lines, each
    node's sample age changing every second).

    A Static re-renders all of its text on any change, lines out of view included (at 32
    nodes 10 ms a second, the dashboard's costliest widget at 256 ranks). :meth:`show_lines`
    instead marks dirty only the lines that changed, and painting renders only the lines in
    view (a line taken from its cache when unchanged). A line longer than the widget is
    wide wraps, as in a Static; the widget is as tall as its lines.
    """

    DEFAULT_CSS = "TextLines { height: auto; }"

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        #: The texts as given, and as shown: wrapped to :attr:`_width` cells.
        self._texts: tuple[Text, ...] = ()
        self._lines: list[Text] = []
        self._width = 0
        #: Line -> its strip as painted (dropped when the line changes or the style does).
        self._strips: dict[int, Strip] = {}
        self._base: Style | None = None

    @property
    def plain(self) -> str:
        """The text shown, one line per line of the widget (for tests and tools)."""
        return "\n".join(line.plain for line in self._lines)

    def show_lines(self, texts: Iterable[Text | str]) -> None:
        """Show these lines (a str is never read as markup), made printable, repainting
        only the ones that changed."""
        texts = tuple(printable_text(Text(t) if isinstance(t, str) else t) for t in texts)
        if texts == self._texts:
            return
        self._texts = texts
        self._fold(self.content_size.width)

    def _wrapped(self, width: int) -> list[Text]:
        if width <= 0:
            return list(self._texts)
        lines: list[Text] = []
        for text in self._texts:
            if text.cell_len <= width and "\n" not in text.plain:
                lines.append(text)
            else:
                lines.extend(text.wrap(self.app.console, width))
        return lines

    def _fold(self, width: int) -> None:
        """Fold the texts at ``width`` and mark what changed dirty."""
        old, lines = self._lines, self._wrapped(width)
        self._lines = lines
        if len(lines) != len(old) or width != self._width:
            self._width = width
            self._strips.clear()
            self.refresh(layout=True)
            return
        for y, (line, was) in enumerate(zip(lines, old, strict=True)):
            if line != was:
                self._strips.pop(y, None)
                self.refresh(Region(0, y, width, 1))

    def on_resize(self) -> None:
        if self.content_size.width != self._width:
            self._fold(self.content_size.width)

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return len(self._wrapped(width)) if width != self._width else len(self._lines)

    def render_line(self, y: int) -> Strip:
        width = self.content_size.width
        if self._base is None:
            self._base = self.rich_style
        if y >= len(self._lines):
            return Strip.blank(width, Style(bgcolor=self._base.bgcolor))
        strip = self._strips.get(y)
        if strip is None or strip.cell_length != width:
            line, console = self._lines[y], self.app.console
            # A Text's own style is its renderer's to apply (Text.render applies only spans).
            style = self._base + console.get_style(line.style) if line.style else self._base
            # Blank cells take the background only, as a Static's do.
            blank = Style(bgcolor=self._base.bgcolor)
            segments = Segment.apply_style(line.render(console), style)
            strip = Strip(segments).crop_extend(0, width, blank)
            self._strips[y] = strip
        return strip

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._strips.clear()
        self._base = None
