"""Sparklines a person can read: a fixed scale and a fixed time axis.

* **Fixed scale.** Each series is drawn against a range that means something (0-100 % for
  utilisation, 0-total for memory, 0-limit for power), never against its own min..max, so a
  GPU idle at 0 % draws a flat floor and a steady 42 degrees a steady low line, not a
  full-height bar.
* **Fixed time axis.** One column per sample, the newest at the right. Until the history
  fills the width, the columns on the left stay empty; a few samples are never stretched.

A sample's bar is at least one eighth of a row high (so a 0 is visible as a floor); a sample
that was not available (``None``) is a dim dot. Pure functions first (unit-tested), then the
widget that draws them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from rich.text import Text
from textual.widget import Widget

__all__ = [
    "BARS",
    "MISSING",
    "FixedSparkline",
    "scale_fraction",
    "spark_level",
    "spark_rows",
    "spark_text",
]

#: One to eight eighths of a row.
BARS = "▁▂▃▄▅▆▇█"
#: A sample whose value was not available.
MISSING = "·"
#: The colour of a column, by how full it is (as the dashboard's bars).
_STYLES = ((0.6, "green"), (0.85, "yellow"), (math.inf, "red"))


def scale_fraction(value: float, low: float, high: float) -> float:
    """Where ``value`` sits on the fixed scale ``low..high``, clamped to 0..1.

    A scale with no width (``high <= low``, or not finite) puts everything at 0.
    """
    if not (math.isfinite(low) and math.isfinite(high)) or high <= low:
        return 0.0
    if math.isnan(value):
        return 0.0
    return min(1.0, max(0.0, (value - low) / (high - low)))


def spark_level(value: float, low: float, high: float, height: int = 1) -> int:
    """Eighths of a row to fill for ``value``: 1 (at or below ``low``) to ``8 * height``
    (at or above ``high``), proportional in between."""
    top = 8 * height
    return 1 + round(scale_fraction(value, low, high) * (top - 1))


def _window(values: Iterable[float | None], width: int) -> tuple[int, list[float | None]]:
    """(empty columns on the left, the newest ``width`` samples)."""
    shown = list(values)[-width:] if width > 0 else []
    return width - len(shown), shown


def _is_missing(value: float | None) -> bool:
    return value is None or not math.isfinite(value)


def spark_rows(
    values: Iterable[float | None], width: int, low: float, high: float, height: int = 1
) -> list[str]:
    """The sparkline as ``height`` strings of ``width`` characters, top row first."""
    pad, shown = _window(values, width)
    levels = [None if _is_missing(v) else spark_level(v, low, high, height) for v in shown]
    rows = []
    for row in reversed(range(height)):
        cells = [" " * pad]
        for level in levels:
            if level is None:
                cells.append(MISSING if row == 0 else " ")
                continue
            filled = min(8, max(0, level - 8 * row))
            cells.append(BARS[filled - 1] if filled else " ")
        rows.append("".join(cells))
    return rows


def _style(fraction: float) -> str:
    return next(style for limit, style in _STYLES if fraction < limit)


def spark_text(
    values: Sequence[float | None] | Iterable[float | None],
    width: int,
    low: float,
    high: float,
    height: int = 1,
) -> Text:
    """:func:`spark_rows` coloured by how full each column is (green, yellow, red)."""
    pad, shown = _window(values, width)
    styles = [
        "dim" if _is_missing(v) else _style(scale_fraction(v, low, high))  # type: ignore[arg-type]
        for v in shown
    ]
    text = Text()
    for i, line in enumerate(spark_rows(shown, width, low, high, height)):
        if i:
            text.append("\n")
        text.append(line[:pad])
        for char, style in zip(line[pad:], styles, strict=True):
            text.append(char, style)
    return text


class FixedSparkline(Widget):
    """A sparkline on a fixed scale and time axis (see the module docstring).

    ``show(values, low, high)`` redraws only when something changed; the widget's width is
    the number of samples shown and its height the number of rows.
    """

    DEFAULT_CSS = """
    FixedSparkline {
        height: 1;
    }
    """

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._values: tuple[float | None, ...] = ()
        self._scale = (0.0, 1.0)

    @property
    def values(self) -> tuple[float | None, ...]:
        return self._values

    @property
    def scale(self) -> tuple[float, float]:
        return self._scale

    def show(self, values: Iterable[float | None], low: float, high: float) -> None:
        values = tuple(values)
        scale = (float(low), float(high))
        if values != self._values or scale != self._scale:
            self._values, self._scale = values, scale
            self.refresh()

    def render(self) -> Text:
        width, height = self.size.width, max(1, self.size.height)
        return spark_text(self._values, width, *self._scale, height=height)
