"""Formatters for numbers and durations, shared by the console, the dashboard and replay."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from typing import Any


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


def ranks_text(ranks: Iterable[int]) -> str:
    """``rank 3``, ``ranks 0, 2``: ranks in order, named as one or many."""
    ranks = sorted(ranks)
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``1 worker``, ``2 workers``: a count and its noun, singular for one (``plural`` where
    it is not the noun and an s: ``process``, ``processes``)."""
    return f"{n} {noun}" if n == 1 else f"{n} {plural or noun + 's'}"


def fmt_eta(state: Any, now: float) -> str:
    """A run's ETA (``RunState.eta``) as :func:`fmt_duration` writes it; once the run steps
    with no number of epochs known (a script that does not say it, started without
    ``--epochs``), why there is none and how to have one: ``-- (epochs unknown: ddptui --epochs
    N)`` (timm's ``train.py``, Lightning's examples: none says it, and ddptui's ``--epochs``,
    which only tells the dashboard, was found in the README alone). Not for steps that come
    in no epoch at all (nanoGPT draws its batches from a memmap, neither a DataLoader nor a
    sampler: its ETA said "--epochs N", which could not give it one), nor before an epoch's
    length is known (its loader's batches, or an epoch that ended): steps from a loader of no
    length that never ends a pass (detectron2's infinite ``TrainingSampler``, its run
    iteration-based) come in epoch 0 to the end, where ``--epochs N`` gives no ETA either."""
    eta = state.eta(now)
    if (
        eta is None
        and not state.epochs
        and state.steps_per_epoch
        and state.first_step_at is not None
        and not state.outcome
        and any(view.epoch is not None for view in state.ranks.values())
    ):
        return "-- (epochs unknown: ddptui --epochs N)"
    return fmt_duration(eta)


def fmt_epoch(state: Any, epoch: int | None) -> str:
    """An epoch as a line shows it: ``2/10`` once the run's number of epochs is known, the
    second of ten whatever the script's numbering (a script that counts from 0, ``for epoch in
    range(10): sampler.set_epoch(epoch)``, is in its epoch 1: ``epoch 1/10`` at the end of such
    a run read as one epoch still to go, beside 100 %); else the script's own number; ``-``
    when there is none."""
    if epoch is None:
        return "-"
    if not state.epochs:
        return str(epoch)
    return f"{epoch_ordinal(state, epoch)}/{state.epochs}"


def epoch_ordinal(state: Any, epoch: int) -> int:
    """Which epoch of the run ``epoch`` (the script's number) is, counted from 1, once the
    run's number of epochs is known (:func:`fmt_epoch`); else the script's own number."""
    if not state.epochs:
        return epoch
    ordinal = epoch - state.epoch_base + 1
    return ordinal if ordinal >= 0 else epoch


def target_label(config: dict) -> str:
    """What a run ran, from its config: ``synthetic``, ``script train.py`` or ``module
    package.train``."""
    if config.get("script_module"):
        return f"module {config['script_module']}"
    script = config.get("script")
    if script:
        return f"script {str(script).replace(chr(92), '/').rsplit('/', 1)[-1]}"
    return str(config.get("trainer") or "?")


#: torch's re-raise of an error from another thread or process (``ExceptionWrapper``): a
#: DataLoader worker's, a pin-memory thread's, a DataParallel replica's.
_WRAPPED = re.compile(
    r"(?:[\w.]+: )?Caught [\w.]+ in (.{1,120}?)\.[ \t]*\r?\n"
    r"Original Traceback \(most recent call last\):\r?\n"
)


def error_head(text: str) -> tuple[str, bool]:
    """An error's first line that says something (``UnpicklingError: Weights only load
    failed…``: its type and fault; torch's messages go on with advice) and whether more
    lines follow. An error torch re-raised from a DataLoader worker: the worker's own error,
    and where (``ValueError: bits must be between or equal to 1 and 8 (in DataLoader worker
    process 0)``; DeiT's RandAugment under a newer Pillow read ``ValueError: Caught
    ValueError in DataLoader worker process 0.``)."""
    stripped = text.lstrip()
    wrapped = _WRAPPED.match(stripped)
    if wrapped:
        after = stripped[wrapped.end() :].splitlines()
        inner = next((line.strip() for line in after if line[:1].strip()), None)
        if inner:
            return f"{inner} (in {wrapped.group(1)})", True
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return (lines[0], len(lines) > 1) if lines else (text.strip(), False)


#: The line a Python traceback ends with: the exception's (dotted) name, named as exceptions
#: are (``RuntimeError``, ``torch.distributed.DistNetworkError``, ``KeyboardInterrupt``), and
#: its message.
_RAISED = re.compile(
    r"(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception|Exit|Interrupt|Warning|Failure|Timeout)"
    r"(?::.*)?"
)


#: The prefix torch puts on each line of a rank's uncaught error (``[rank0]: Traceback…``).
_RANK_PREFIX = re.compile(r"^\[(?:rank|default)\d+\]:")
#: The lines of a log's tail :func:`raised_in` reads, at most.
STDERR_LINES_READ = 64


def raised_in(lines: Sequence[str]) -> str | None:
    """The exception a log's last ``lines`` end with, where they end with a Python traceback
    (a ``File "…"`` frame, then an unindented ``Name: message`` as the last line); None
    otherwise. A process that died without reporting its error (a script's mp.spawn whose
    workers failed before they formed their process group: only the spawner's exit code 1 was
    known) is named by what it printed."""
    lines = [_RANK_PREFIX.sub("", line, count=1) for line in lines[-STDERR_LINES_READ:]]
    if not lines or not any(line.startswith('  File "') for line in lines[:-1]):
        return None
    last = lines[-1].rstrip()
    if not last or last[0].isspace() or not _RAISED.fullmatch(last):
        return None
    return last[:300]


def error_summary(text: str) -> str:
    """An error in one line: :func:`error_head`, `` …`` after it where more lines follow (a
    rank's console line, a failure's short form)."""
    head, more = error_head(text)
    return head + (" …" if more else "")


def amp_label(config: dict) -> str:
    """``amp bf16``; for a user script ``amp: script's`` (it does its own autocast, or not:
    ddptui's AMP option only configures the built-in trainers, so "amp off" would be wrong
    about a script that trains in bf16, as nanoGPT's does)."""
    if config.get("script"):
        return "amp: script's"
    return f"amp {config.get('amp') or 'off'}"


def fmt_num(value: float | None, spec: str = "z.4f") -> str:
    """``value`` in ``spec``; ``--`` when unknown (``nan`` and ``inf`` are shown as such).
    The default's ``z`` shows a value that rounds to zero as ``0.0000``, not ``-0.0000``: a
    script's loss of ``-0.0`` (pytorch/examples' ``multigpu_torchrun.py``, whose
    ``cross_entropy`` over one class is always zero) read ``-0.0000`` in its rank's row and
    ``0.0000`` in the header (the ranks' mean, ``0.0``)."""
    return "--" if value is None else format(value, spec)


def fmt_per_s(rate: float | None) -> str:
    """A rate of samples a second: ``1,234`` from 10 on, ``4.6`` from 1, ``0.43`` below (a
    step of 4 samples in 9.2 s, facebookresearch/vicreg's on 2 CPU cores, read ``0 samples/s``
    beside its rank's steps); ``--`` when unknown."""
    if rate is None:
        return "--"
    if not math.isfinite(rate) or abs(rate) >= 9.95:
        return f"{rate:,.0f}"
    return f"{rate:.1f}" if abs(rate) >= 0.995 else f"{rate:.2f}"


def fmt_rate(samples_per_s: float | None, counted: bool) -> str:
    """``1,234 samples/s``; ``-- samples/s`` when no rank has counted a sample (a script that
    logs steps without ``samples=``, a model fed without a DataLoader or DDP), or no rate is
    known yet (None): not a rate of 0."""
    return f"{fmt_per_s(samples_per_s)} samples/s" if counted else "-- samples/s"


def fmt_first_step(mean: float, after: tuple[float, float] | None) -> str:
    """`` (4,263 after its first step of 15.5 s)``: a run's rate after its first step
    (``after``: that rate and the first step's seconds, :meth:`RunState.rate_after_first_step`)
    beside its mean ``mean`` over every step, where the first step held the mean down by a
    tenth or more (a first step that holds torch.compile's compilation or CUDA's warm-up);
    else nothing (a first step no slower than the others explains nothing, and two rates
    that read the same neither)."""
    if after is None or not math.isfinite(after[0]) or after[0] <= 0.0:
        return ""
    rate, first = after
    if rate < 1.1 * mean or fmt_per_s(rate) == fmt_per_s(mean):  # the same as shown: no news
        return ""
    if first < 0.99995:  # a step of 2 ms read "first step of 0.0 s"
        took = fmt_step_time(first)
    else:
        took = f"{first:.1f} s" if first < 59.95 else fmt_duration(first)
    return f" ({fmt_per_s(rate)} after its first step of {took})"


def fmt_step_time(seconds: float | None) -> str:
    """A step's time: ``123.4 ms``; ``9.23 s`` from a second on (``9,230.4 ms`` was
    vicreg's); ``--`` when unknown."""
    if seconds is None:
        return "--"
    return f"{seconds:,.2f} s" if seconds >= 0.99995 else f"{seconds * 1000:,.1f} ms"


def fmt_samples(state: Any) -> str:
    """A run's samples (``RunState``): ``12,345 samples``; ``samples not counted`` once its
    ranks step without counting any (see :func:`fmt_rate`); ``0 samples`` before any step
    (while a run's ranks started, or of a run that failed before its first step, it said
    "samples not counted" of runs that would have counted them)."""
    if state.samples_counted:
        return f"{state.samples_total:,} samples"
    return "0 samples" if state.first_step_at is None else "samples not counted"


def fmt_eval(evaluation: Any, accuracy: str = "acc") -> str:
    """An evaluation (anything with ``accuracy`` and ``loss``, or None) in a line: its
    accuracy, named ``accuracy``; or its loss when it carries no accuracy (the HF Trainer's
    ``eval_loss`` alone)."""
    acc = getattr(evaluation, "accuracy", None)
    loss = getattr(evaluation, "loss", None)
    if acc is None and loss is not None:
        return f"eval loss {fmt_num(loss)}"
    return f"{accuracy} {fmt_num(acc)}"


#: Terminal escape sequences: CSI (``ESC [`` … final byte, or the C1 ``CSI``), OSC, DCS, SOS,
#: PM and APC strings (to BEL or ``ESC \``, or to the end of the text), and any other
#: two-character ``ESC`` sequence.
_ESCAPES = re.compile(
    r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]?"
    r"|(?:\x1b[\]P^_X]|[\x9d\x90\x9e\x9f\x98])[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"
    r"|\x1b[ -~]?"
)
#: What is left that a terminal would act on rather than show: C0 controls (but tab and
#: newline, handled apart), DEL, C1 controls, and the Unicode line and paragraph separators.
_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029]")


def _as_shown(line: str) -> str:
    """A line with carriage returns as a terminal shows it: each part after a ``\\r``
    written over the start of what was there (a progress bar's last state)."""
    parts = line.split("\r")
    shown = parts[0]
    for part in parts[1:]:
        shown = part + shown[len(part) :]
    return shown


def printable(text: str, newlines: bool = True) -> str:
    """``text`` as it may go to a terminal: no escape sequence or control character that
    would move the cursor, clear the screen, ring, retitle the window or recolour what
    follows. Text from outside ddptui (a rank's output, its exception, a host or process
    name, a path) passes through this before it is drawn.

    Escape sequences are removed (a script's coloured log line keeps its words); carriage
    returns are resolved as a terminal would (``10%\\r20%`` shows ``20%``); tabs become
    spaces; other controls become ``�``. Newlines stay, unless ``newlines`` is false (a
    table cell, one line): then each becomes a space. Text with nothing to change (nearly
    all of it) is returned as it is, after one check at C speed.
    """
    if text.isprintable():
        return text
    text = _ESCAPES.sub("", text)
    if "\r" in text:
        text = "\n".join(_as_shown(line) for line in text.split("\n"))
    if "\t" in text:
        text = text.expandtabs(4)
    text = _CONTROLS.sub("\ufffd", text)
    return text if newlines else text.replace("\n", " ")


def escaped(text: str) -> str:
    """``text`` with each control character written as its escape (``\\x1b``, ``\\r``): for a
    message that quotes what a user gave (a path with an escape sequence in its name), so
    that they see what was there, and the terminal acts on none of it. Tabs and newlines
    stay."""
    if text.isprintable():
        return text
    return _CONTROLS.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)
