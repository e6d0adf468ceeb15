"""What every ``ddptui <command>`` module shares: a parser that reports bad usage in one line,
and the one-line error. A command module has ``add_arguments(parser)``, ``run(args) -> int``
and ``main(argv) -> int`` (built by :func:`command_main`)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from ddptui.argv import split_passthrough
from ddptui.formatting import escaped

#: Exit code of a usage error (bad option or value), before anything starts.
USAGE_ERROR = 2
#: Longest error line printed.
MAX_MESSAGE = 600


class UsageError(Exception):
    """A bad command line; ``str()`` is the one-line message."""


class CommandParser(argparse.ArgumentParser):
    """argparse that raises :class:`UsageError` instead of printing usage and exiting."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def fail(message: str, code: int = USAGE_ERROR) -> int:
    """Print ``ddptui: error: MESSAGE`` (one line) on stderr; return ``code``."""
    text = " ".join(escaped(str(message)).split())
    if len(text) > MAX_MESSAGE:  # a safety net: every echoed value is clipped where it is shown
        text = text[: MAX_MESSAGE - 1] + "…"
    print(f"ddptui: error: {text}", file=sys.stderr)
    return code


def tolerant_output() -> None:
    """Let stdout and stderr replace what their encoding cannot hold (``PYTHONIOENCODING=ascii``
    and an em dash) instead of raising in the middle of a line."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            try:
                reconfigure(errors="replace")
            except (ValueError, OSError):  # closed or detached: nothing to print to anyway
                pass


def no_terminal(hint: str = "use --no-ui") -> str | None:
    """Why the dashboard cannot run here (stdin or stdout is not a terminal), or None.

    Textual would otherwise write escape codes into a pipe or a file and wait for keys
    that never come."""
    for name, stream in (("stdin", sys.stdin), ("stdout", sys.stdout)):
        try:
            tty = stream is not None and stream.isatty()
        except (AttributeError, ValueError, OSError):
            tty = False
        if not tty:
            return f"the dashboard needs a terminal ({name} is not one); {hint}"
    return None


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
