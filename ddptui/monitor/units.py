"""Human-readable rendering of snapshot values; ``NA`` renders as ``N/A`` everywhere."""

from __future__ import annotations

from ddptui.monitor.snapshot import NA, NotAvailable

__all__ = ["GiB", "MiB", "format_bytes", "format_percent", "format_rate", "format_value"]

KiB = 1024
MiB = 1024**2
GiB = 1024**3
_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def format_bytes(value: int | float | NotAvailable, precision: int = 1) -> str:
    """``10.2 GiB``; bytes below 1 KiB print as ``512 B``."""
    if value is NA:
        return "N/A"
    size = float(value)
    for unit in _UNITS:
        if abs(size) < 1024 or unit == _UNITS[-1]:
            return f"{int(size)} B" if unit == "B" else f"{size:.{precision}f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def format_rate(value: int | float | NotAvailable) -> str:
    """``1.5 GiB/s``."""
    return "N/A" if value is NA else f"{format_bytes(value)}/s"


def format_percent(value: int | float | NotAvailable, precision: int = 0) -> str:
    """``97%``."""
    return "N/A" if value is NA else f"{value:.{precision}f}%"


def format_value(value: object, unit: str = "", precision: int | None = None) -> str:
    """Any scalar with an optional unit suffix: ``61C``, ``312 W`` (``N/A`` for NA)."""
    if value is NA:
        return "N/A"
    text = f"{value:.{precision}f}" if precision is not None else str(value)
    return f"{text}{unit}"
