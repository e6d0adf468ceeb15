"""ddptui: launch PyTorch DDP runs and watch every rank live.

The public reporting API for training scripts. Importing this module is cheap: no Textual,
no torch, no CUDA initialisation. Both calls are no-ops unless the script runs under ddptui
(which sets ``DDPTUI_ENDPOINT``), so the same script runs unchanged under plain torchrun::

    import ddptui
    ddptui.log(loss=loss.item(), samples=len(batch))     # one training step on this rank
    ddptui.log_eval(accuracy=acc, loss=val_loss)         # an all-reduced evaluation
    with ddptui.phase("augment"): ...                    # a custom phase of the step

Rank, step number, timing and throughput are derived; ``epoch=`` is optional; any extra
keyword metrics are carried along in the event's ``metrics``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["log", "log_eval", "started", "finished", "phase"]
__version__ = "0.1.0"

#: The zero-code instrumentation of this rank (``ddptui.instrument``), when installed.
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
    """Report one training step on this rank (``loss``, ``samples``, ``epoch``, extras)."""
    from ddptui.reporter import get_reporter  # cached after the first call

    if _instrument is not None:  # explicit calls win over the hooks; they get the phases
        _instrument.explicit_log(metrics)
    get_reporter().log(**metrics)


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
    """Report an all-reduced evaluation (``accuracy``, ``loss``, ``count``, ``epoch``)."""
    from ddptui.reporter import get_reporter

    get_reporter().log_eval(**metrics)


def started(
    device: str | None = None,
    device_uuid: str | None = None,
    epochs: int | None = None,
    steps_per_epoch: int | None = None,
) -> None:
    """Announce this rank with its device, planned epochs and steps per epoch, for progress
    and ETA (optional: the first ``log`` announces the rank too, without them)."""
    from ddptui.reporter import get_reporter

    get_reporter().started(
        device=device, device_uuid=device_uuid, epochs=epochs, steps_per_epoch=steps_per_epoch
    )


def finished(error: str | None = None) -> None:
    """Announce that this rank finished, or failed with ``error`` (optional: done at exit)."""
    from ddptui.reporter import get_reporter

    get_reporter().finished(error=error)
