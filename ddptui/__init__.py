"""ddptui: launch PyTorch DDP runs and watch every rank live.

The public reporting API for training scripts. Importing this module is cheap: no Textual,
no torch, no CUDA initialisation. Both calls are no-ops unless the script runs under ddptui
(which sets ``DDPTUI_ENDPOINT``), so the same script runs unchanged under plain torchrun::

    import ddptui
    ddptui.log(epoch=epoch, loss=loss, samples=len(x))   # one training step on this rank
    ddptui.log_eval(accuracy=acc, loss=val_loss)         # an all-reduced evaluation
    with ddptui.phase("augment"): ...                    # a custom phase of the step

Rank, step number, timing and throughput are derived; ``epoch=`` is optional; any extra
keyword metrics are carried along in the event's ``metrics``.

Values may be numbers, numpy scalars or one-element torch tensors: pass ``loss`` as it is,
without ``.item()``. A CUDA tensor is read lazily: the call queues a copy to pinned host
memory and a CUDA event and returns at once, and the value is sent when the copy has
landed, so logging never waits for the GPU (``.item()`` would, every step). Step numbers
and step times are taken at the call; only the value arrives later. ``samples`` is a host
number (``len(x)``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["log", "log_eval", "started", "finished", "phase"]
__version__ = "0.1.0"

_get_reporter: Callable[[], Any] | None = None  # ddptui.rank.reporter.get_reporter, once imported


def _reporter() -> Any:
    """This process's reporter (importing the reporter module on first use only)."""
    global _get_reporter
    if _get_reporter is None:
        # on first use: `import ddptui` stays free of msgspec, sockets and the protocol
        from ddptui.rank.reporter import get_reporter

        _get_reporter = get_reporter
    return _get_reporter()


#: The zero-code instrumentation of this rank (``ddptui.rank.instrument``), when installed.
_instrument: Any = None


class _NoPhase:
    """``ddptui.phase`` when nothing measures phases: does nothing."""

    __slots__ = ()

    def __enter__(self) -> _NoPhase:
        return self

    def __exit__(self, *exc: object) -> bool:
        return False


_NO_PHASE = _NoPhase()


def log(**metrics: Any) -> None:
    """Report one training step on this rank (``loss``, ``samples``, ``epoch``, extras).

    ``loss`` and extras may be tensors; CUDA ones are read without waiting for the GPU."""
    if _instrument is not None:  # explicit calls win over the hooks; they get the phases
        _instrument.explicit_log(metrics)
    (_get_reporter or _reporter)().log(**metrics)


def phase(name: str) -> Any:
    """A custom phase of the training step: ``with ddptui.phase("augment"): ...``.

    Its host time is reported with the step's phases (beside the built-in ones, which it
    overlaps). A no-op unless the rank runs under ddptui with its instrumentation on.
    """
    inst = _instrument
    if inst is None:
        return _NO_PHASE
    return inst.phase(name)


def log_eval(**metrics: Any) -> None:
    """Report an all-reduced evaluation (``accuracy``, ``loss``, ``count``, ``epoch``);
    values may be tensors, as for :func:`log`."""
    if _instrument is not None:  # the script's own: none are taken from its framework's
        _instrument.explicit_eval = True
    _reporter().log_eval(**metrics)


def started(
    device: str | None = None,
    device_uuid: str | None = None,
    epochs: int | None = None,
    steps_per_epoch: int | None = None,
) -> None:
    """Announce this rank with its device, planned epochs and steps per epoch, for progress
    and ETA (optional: the first ``log`` announces the rank too, without them)."""
    _reporter().started(
        device=device, device_uuid=device_uuid, epochs=epochs, steps_per_epoch=steps_per_epoch
    )


def finished(error: str | None = None) -> None:
    """Announce that this rank finished, or failed with ``error`` (optional: done at exit)."""
    _reporter().finished(error=error)
