"""Command lines of the form ``OWN ARGS -- ARGS FOR THE TARGET``."""

from __future__ import annotations

from collections.abc import Sequence


def split_passthrough(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """Split at the first ``--``: (our own arguments, arguments passed through untouched)."""
    argv = list(argv)
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1 :]
    return argv, []
