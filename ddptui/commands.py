"""What every ``ddptui <command>`` module shares: a parser that reports bad usage in one line,
and the one-line error. A command module has ``add_arguments(parser)``, ``run(args) -> int``
and ``main(argv) -> int`` (built by :func:`command_main`)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from ddptui.argv import split_passthrough

#: Exit code of a usage error (bad option or value), before anything starts.
USAGE_ERROR = 2


class UsageError(Exception):
    """A bad command line; ``str()`` is the one-line message."""


class CommandParser(argparse.ArgumentParser):
    """argparse that raises :class:`UsageError` instead of printing usage and exiting."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def fail(message: str, code: int = USAGE_ERROR) -> int:
    """Print ``ddptui: error: MESSAGE`` (one line) on stderr; return ``code``."""
    text = " ".join(str(message).split())
    print(f"ddptui: error: {text}", file=sys.stderr)
    return code


def command_main(
    prog: str,
    description: str,
    add_arguments: Callable[[argparse.ArgumentParser], None],
    run: Callable[[argparse.Namespace], int],
    argv: Sequence[str] | None = None,
    passthrough: bool = False,
) -> int:
    """Parse ``argv`` (``sys.argv[1:]`` by default) and run the command. With
    ``passthrough``, arguments after ``--`` land in ``args.script_args``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if passthrough:
        argv, extra = split_passthrough(argv)
    parser = CommandParser(prog=prog, description=description)
    add_arguments(parser)
    try:
        args = parser.parse_args(argv)
    except UsageError as exc:
        return fail(str(exc))
    if passthrough:
        args.script_args = tuple(extra)
    try:
        return run(args)
    except UsageError as exc:
        return fail(str(exc))
    except KeyboardInterrupt:
        return 130
