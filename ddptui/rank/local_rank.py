"""Whether a script reads its local rank from an option torchrun does not pass.

Scripts of the ``python -m torch.distributed.launch`` era declare ``--local_rank`` (or
``--local-rank``), which the launch module passed each rank. torchrun passes none: where the
option is not required, argparse leaves its default, and such a script runs as the wrong local
rank. MONAI's ``unet_training_ddp.py`` (``--local_rank``, type int, no default) read None on
every rank: each took itself for a secondary rank, sent its output and its errors to
``os.devnull``, generated no data and failed on an empty loader with ``ZeroDivisionError``,
which said nothing of why. Here every parser's result is looked at once it has parsed: an
option of that name, not among the arguments parsed, that read other than the rank's
``LOCAL_RANK`` is a note (``local_rank_arg``); the dashboard says it only beside a failure
(a script that reads ``LOCAL_RANK`` itself and leaves the option unused is healthy).
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

#: The spellings of a local-rank option (torch 1's launch passed the first, torch 2's the
#: second).
FLAGS = ("--local_rank", "--local-rank")

#: Most arguments looked through for the option (a parser given more is not judged).
MAX_ARGS = 10_000
#: The largest number a note carries (``protocol.MAX_NOTE_NUMBER``, without loading it).
MAX_NUMBER = 1_000_000_000


def watch(note: Callable[..., None], environ: Mapping[str, str] = os.environ) -> Callable[[], None]:
    """Look at what each ``argparse`` parser of this process parsed, until one has a
    local-rank option; ``note(code, **numbers)`` sends the finding. Returns the undo (the
    parser class as it was). Nothing without a whole-number ``LOCAL_RANK``."""
    raw = environ.get("LOCAL_RANK", "").strip()
    if not (raw.isascii() and raw.isdigit() and int(raw) <= MAX_NUMBER):
        return lambda: None
    local_rank = int(raw)
    original = argparse.ArgumentParser.__dict__["parse_known_args"]
    done = False

    @functools.wraps(original)
    def parse_known_args(parser: Any, args: Any = None, namespace: Any = None) -> Any:
        nonlocal done
        result = original(parser, args, namespace)
        if not done:
            try:
                found = local_rank_read(parser, args, result[0], local_rank)
            except Exception:  # a parser of the script's own kind: not ours to judge
                found = None
            if found is not None:
                done = True
                try:
                    note("local_rank_arg", **found)
                except Exception:
                    pass
        return result

    argparse.ArgumentParser.parse_known_args = parse_known_args  # type: ignore[method-assign]

    def undo() -> None:
        if argparse.ArgumentParser.__dict__.get("parse_known_args") is parse_known_args:
            argparse.ArgumentParser.parse_known_args = original  # type: ignore[method-assign]

    return undo


def local_rank_read(
    parser: argparse.ArgumentParser, args: Sequence[str] | None, parsed: Any, local_rank: int
) -> dict[str, Any] | None:
    """The note's numbers where ``parser`` has a local-rank option that ``args`` (or, as
    argparse reads it, ``sys.argv[1:]``) did not give and ``parsed`` holds other than
    ``local_rank``: ``local_rank``, the value read (``read``: None where it is no whole
    number) and whether the option is spelled ``--local-rank`` (``dashed``); else None."""
    given = list(sys.argv[1:] if args is None else args)[:MAX_ARGS]
    for action in parser._actions:
        flags = [f for f in action.option_strings if f in FLAGS]
        if not flags:
            continue
        options = action.option_strings
        if any(arg == f or arg.startswith(f + "=") for arg in given for f in options):
            return None  # given: the script has its local rank
        value = getattr(parsed, action.dest, None)
        if type(value) is int and value == local_rank:
            return None  # its default is right on this rank (LOCAL_RANK read into it)
        whole = type(value) is int and abs(value) <= MAX_NUMBER
        dashed = flags[0] != FLAGS[0]
        return {"local_rank": local_rank, "read": value if whole else None, "dashed": dashed}
    return None
