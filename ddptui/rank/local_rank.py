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

A script may also read ``LOCAL_RANK`` into the option's attribute itself: timm's
``train.py`` parses ``--local_rank`` (default 0) and then sets ``args.local_rank`` from the
environment. Its run on CPU failed in the DDP constructor (``device_ids`` on a CPU module, its
own bug) and the failure read "rank 1's script has a --local_rank option that no launcher passed
it: it read 0 where the rank's LOCAL_RANK is 1; add --local-rank-arg", a cause it did not have.
So the parsed namespace is looked at again, before each heartbeat and before the rank reports
its failure (:meth:`LocalRankWatch.settle`): once the attribute holds the rank's
``LOCAL_RANK``, the note is taken back (the same note, ``read`` equal to ``local_rank``).
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

#: The spellings of a local-rank option (torch 1's launch passed the first, torch 2's the
#: second).
FLAGS = ("--local_rank", "--local-rank")

#: Most arguments looked through for the option (a parser given more is not judged).
MAX_ARGS = 10_000
#: The largest number a note carries (``protocol.MAX_NOTE_NUMBER``, without loading it).
MAX_NUMBER = 1_000_000_000


class LocalRankWatch:
    """The watch :func:`watch` installs: :meth:`undo` puts argparse back; :meth:`settle`
    takes the note back once the script has set the option's attribute to its
    ``LOCAL_RANK`` itself."""

    def __init__(self, note: Callable[..., None], local_rank: int | None) -> None:
        self._note = note
        self._local_rank = local_rank
        self._original: Any = None
        self._installed: Any = None
        #: What was sent: the parsed namespace (weakly: the script's to keep), the option's
        #: attribute and the note's numbers; None before a note, and once taken back.
        self._sent: tuple[weakref.ref[Any], str, dict[str, Any]] | None = None
        self._done = local_rank is None

    def install(self) -> LocalRankWatch:
        if self._local_rank is None:
            return self
        self._original = original = argparse.ArgumentParser.__dict__["parse_known_args"]

        @functools.wraps(original)
        def parse_known_args(parser: Any, args: Any = None, namespace: Any = None) -> Any:
            result = original(parser, args, namespace)
            if not self._done:
                self._judge(parser, args, result[0])
            return result

        self._installed = parse_known_args
        argparse.ArgumentParser.parse_known_args = parse_known_args  # type: ignore[method-assign]
        return self

    def _judge(self, parser: Any, args: Any, parsed: Any) -> None:
        assert self._local_rank is not None
        try:
            found = local_rank_read(parser, args, parsed, self._local_rank)
        except Exception:  # a parser of the script's own kind: not ours to judge
            return
        if found is None:
            return
        self._done = True
        try:
            self._note("local_rank_arg", **found)
        except Exception:
            return
        try:
            dest = local_rank_option(parser).dest  # type: ignore[union-attr]
            self._sent = (weakref.ref(parsed), dest, found)
        except Exception:  # a namespace that takes no weak reference: the note stands
            pass

    def settle(self) -> None:
        """Take the note back where the namespace it was read from now holds the rank's
        ``LOCAL_RANK`` in the option's attribute (the script set it itself). Called from the
        heartbeat's thread and before a failure is reported; never raises."""
        sent = self._sent
        if sent is None:
            return
        ref, dest, found = sent
        try:
            value = getattr(ref(), dest, None)
            if type(value) is not int or value != found["local_rank"]:
                return
            self._sent = None
            # Not announcing the rank again: from the heartbeat's thread torch's current
            # device is that thread's, not the one the script chose.
            self._note("local_rank_arg", announce=False, **{**found, "read": value})
        except Exception:  # telemetry never changes how a rank runs
            pass

    def undo(self) -> None:
        installed = self._installed
        if (
            installed is not None
            and argparse.ArgumentParser.__dict__.get("parse_known_args") is installed
        ):
            argparse.ArgumentParser.parse_known_args = self._original  # type: ignore[method-assign]


def watch(note: Callable[..., None], environ: Mapping[str, str] = os.environ) -> LocalRankWatch:
    """Look at what each ``argparse`` parser of this process parsed, until one has a
    local-rank option; ``note(code, *, announce=True, **numbers)`` sends the finding (the
    rank announced first unless ``announce`` is False). Returns the watch (its
    ``undo`` puts the parser class back, its ``settle`` takes a note back). Nothing is
    watched without a whole-number ``LOCAL_RANK``."""
    raw = environ.get("LOCAL_RANK", "").strip()
    if not (raw.isascii() and raw.isdigit() and int(raw) <= MAX_NUMBER):
        return LocalRankWatch(note, None)
    return LocalRankWatch(note, int(raw)).install()


def local_rank_option(parser: argparse.ArgumentParser) -> argparse.Action | None:
    """The parser's local-rank option (the first action spelled as one of :data:`FLAGS`)."""
    return next((a for a in parser._actions if set(a.option_strings) & set(FLAGS)), None)


def local_rank_read(
    parser: argparse.ArgumentParser, args: Sequence[str] | None, parsed: Any, local_rank: int
) -> dict[str, Any] | None:
    """The note's numbers where ``parser`` has a local-rank option that ``args`` (or, as
    argparse reads it, ``sys.argv[1:]``) did not give and ``parsed`` holds other than
    ``local_rank``: ``local_rank``, the value read (``read``: None where it is no whole
    number) and whether the option is spelled ``--local-rank`` (``dashed``); else None."""
    action = local_rank_option(parser)
    if action is None:
        return None
    given = list(sys.argv[1:] if args is None else args)[:MAX_ARGS]
    options = action.option_strings
    if any(arg == f or arg.startswith(f + "=") for arg in given for f in options):
        return None  # given: the script has its local rank
    value = getattr(parsed, action.dest, None)
    if type(value) is int and value == local_rank:
        return None  # its default is right on this rank (LOCAL_RANK read into it)
    whole = type(value) is int and abs(value) <= MAX_NUMBER
    dashed = next(f for f in options if f in FLAGS) != FLAGS[0]
    return {"local_rank": local_rank, "read": value if whole else None, "dashed": dashed}
