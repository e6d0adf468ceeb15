"""Command lines of the form ``OWN ARGS -- ARGS FOR THE TARGET``."""

from __future__ import annotations

import argparse
from collections.abc import Sequence


def split_passthrough(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """Split at the first ``--``: (our own arguments, arguments passed through untouched)."""
    argv = list(argv)
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1 :]
    return argv, []


def target_args(module: str | None, script: str | None, script_module: str | None) -> list[str]:
    """What a rank runs, as the driver and the rank entry take it: a trainer module
    (``--module``, its ``main(args)``), the user's module (``--run-module``, as ``python -m``)
    or the user's script (``--script``)."""
    if module:
        return ["--module", module]
    if script_module:
        return ["--run-module", script_module]
    return ["--script", str(script)]


def add_target_arguments(parser: argparse.ArgumentParser) -> None:
    """The options :func:`target_args` makes, exactly one of them required."""
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--module")
    target.add_argument("--run-module")
    target.add_argument("--script")
