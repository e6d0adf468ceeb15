"""Formatters for numbers and durations, shared by the console, the dashboard and replay."""

from __future__ import annotations

import math


def fmt_duration(seconds: float | None) -> str:
    """``42s``, ``3m07s``, ``2h05m``; ``--`` when unknown."""
    if seconds is None or not math.isfinite(seconds):
        return "--"
    seconds = int(round(max(0.0, seconds)))
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    if seconds >= 60:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds}s"


def fmt_num(value: float | None, spec: str = ".4f") -> str:
    """``value`` in ``spec``; ``--`` when unknown (``nan`` and ``inf`` are shown as such)."""
    return "--" if value is None else format(value, spec)
