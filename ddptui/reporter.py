"""The worker side of telemetry: a PUSH socket that never blocks training.

A :class:`Reporter` is created lazily inside each rank process (after spawn/fork, never
inherited), from ``DDPTUI_ENDPOINT`` and ``DDPTUI_RUN_ID``. Sends are non-blocking
(``zmq.DONTWAIT``) into a bounded queue (``SNDHWM``); when the queue is full the events are
dropped and counted. Closing waits at most ``LINGER`` for queued events to leave.

Step events are batched: they go out together at most every ``FLUSH_INTERVAL_S`` (or when
``MAX_BATCH_EVENTS`` are waiting), and any other event goes out at once with whatever is
waiting. Each send wakes ZeroMQ's I/O thread, which costs tens of microseconds when training
keeps the cores busy; batching makes that a cost per 50 ms instead of per step.

``IMMEDIATE`` is deliberately *not* set: with it, events sent before the TCP handshake
completes (the rank's ``started`` status, sent first thing) would be dropped. The bounded
HWM already caps memory when nobody listens.
"""

from __future__ import annotations

import atexit
import os
import socket
import sys
import threading
import time
from typing import Any

from ddptui import protocol
from ddptui.constants import ENDPOINT_ENV, NNODES_ENV, RUN_ID_ENV

#: Messages (batches of up to MAX_BATCH_EVENTS events) queued before sends start dropping.
SEND_HWM = 1_000
LINGER_MS = 1_000
#: After a send finds the queue full, drop (and count) without trying for this long.
FULL_BACKOFF_S = 0.01
#: Step events wait at most this long (or for the next step after it) before they are sent.
FLUSH_INTERVAL_S = 0.05

_STEP_FIELDS = ("epoch", "loss", "samples", "step", "step_time", "samples_per_s")
_EVAL_FIELDS = ("epoch", "accuracy", "loss", "count")


def _rank_from_env() -> int:
    return int(os.environ.get("RANK", "0") or 0)


class Reporter:
    """Sends this rank's events. Use the module functions in :mod:`ddptui` instead."""

    def __init__(
        self, endpoint: str | None, run_id: str, rank: int, send_hwm: int = SEND_HWM
    ) -> None:
        self.endpoint = endpoint
        self.run_id = run_id
        self.rank = rank
        self.sent = 0
        self.dropped = 0
        self._seq = 0
        self._step = 0
        self._epoch: int | None = None
        self._epoch_started = time.monotonic()
        self._epoch_samples = 0
        self._epoch_open = False  # steps of self._epoch were logged and it has not ended
        self._last_step_at: float | None = None
        self._started_sent = False
        self._announced: dict[str, Any] = {}  # what the started status has told so far
        self._finished_sent = False
        self._lock = threading.Lock()
        self._full_until = 0.0
        self._batch: list[protocol.AnyEvent] = []
        self._flushed_at = time.monotonic()
        self._socket = None
        self._context = None
        if endpoint:
            import zmq  # imported only when there is somewhere to send

            self._zmq = zmq
            self._context = zmq.Context()
            sock = self._context.socket(zmq.PUSH)
            sock.setsockopt(zmq.SNDHWM, send_hwm)
            sock.setsockopt(zmq.LINGER, LINGER_MS)
            sock.connect(endpoint)
            self._socket = sock

    @property
    def enabled(self) -> bool:
        return self._socket is not None

    # -- sending -------------------------------------------------------------------------
    def _send(self, cls: type[protocol.Event], urgent: bool = True, **fields: Any) -> None:
        """Queue one event; send the batch when ``urgent``, full, or due."""
        if self._socket is None:
            return
        with self._lock:
            seq = self._seq
            self._seq += 1  # a dropped event still takes its number: the gap shows the drop
            self._batch.append(
                cls(run=self.run_id, rank=self.rank, t=time.time(), seq=seq, **fields)
            )
            now = time.monotonic()
            if (
                urgent
                or len(self._batch) >= protocol.MAX_BATCH_EVENTS
                or now - self._flushed_at >= FLUSH_INTERVAL_S
            ):
                self._flush(now)

    def _flush(self, now: float) -> None:
        batch, self._batch = self._batch, []
        self._flushed_at = now
        if not batch or self._socket is None:
            return
        if now < self._full_until:
            self.dropped += len(batch)
            return
        try:
            self._socket.send(protocol.encode_batch(batch), self._zmq.DONTWAIT)
            self.sent += len(batch)
        except self._zmq.Again:
            # Queue full (or nobody listening): drop without asking zmq again for a while,
            # so a stalled collector costs the training loop almost nothing.
            self.dropped += len(batch)
            self._full_until = now + FULL_BACKOFF_S

    def flush(self) -> None:
        """Send the step events still waiting in the batch."""
        with self._lock:
            self._flush(time.monotonic())

    # -- lifecycle -----------------------------------------------------------------------
    def started(
        self,
        device: str | None = None,
        device_uuid: str | None = None,
        epochs: int | None = None,
        steps_per_epoch: int | None = None,
    ) -> None:
        """Announce this rank: pid, host, local rank, device, and what it knows of the plan
        (epochs, steps per epoch). Sent on the first call, and again only when a later call
        adds something new (a trainer learns its steps per epoch once its data is loaded)."""
        if self._socket is None:
            return
        if not self._started_sent and device is None:
            device, device_uuid = _current_device()
        given = {
            "device": device,
            "device_uuid": device_uuid,
            "epochs": epochs,
            "steps_per_epoch": steps_per_epoch,
        }
        news = {k: v for k, v in given.items() if v is not None and self._announced.get(k) != v}
        if self._started_sent and not news:
            return
        self._started_sent = True
        self._announced.update(news)
        self._send(
            protocol.Status,
            state="started",
            pid=os.getpid(),
            host=socket.gethostname(),
            local_rank=int(os.environ.get("LOCAL_RANK", self.rank)),
            world_size=int(os.environ["WORLD_SIZE"]) if "WORLD_SIZE" in os.environ else None,
            node=_node_rank(),
            **self._announced,
        )

    def finished(self, error: str | None = None, traceback: str | None = None) -> None:
        """Announce the end of this rank: finished, or failed with ``error`` and its Python
        ``traceback`` (by default, the exception being handled when called from an
        ``except`` block). Sent once; long texts keep their end."""
        if self._finished_sent or self._socket is None:
            return
        self.started()
        if self._epoch_open:
            self._end_epoch()
        if error and traceback is None and sys.exc_info()[1] is not None:
            import traceback as tb

            traceback = "".join(tb.format_exception(sys.exc_info()[1]))
        if traceback and len(traceback) > protocol.MAX_TRACEBACK_CHARS:
            traceback = "[…]\n" + traceback[-(protocol.MAX_TRACEBACK_CHARS - 4) :]
        self._finished_sent = True
        self._full_until = 0.0  # the final status always gets its chance
        self._send(
            protocol.Status,
            state="failed" if error else "finished",
            pid=os.getpid(),
            error=error[-2000:] if error else None,
            traceback=traceback if error else None,
            dropped=self.dropped,
        )

    def close(self) -> None:
        if self._socket is not None:
            self.flush()
            self._socket.close(linger=LINGER_MS)
            self._socket = None
        if self._context is not None:
            self._context.term()
            self._context = None

    # -- metrics -------------------------------------------------------------------------
    def log(self, **values: Any) -> None:
        if self._socket is None:
            return
        now = time.monotonic()
        if not self._started_sent:
            self.started()
        epoch = values.pop("epoch", None)
        if epoch is not None and epoch != self._epoch:
            if self._epoch_open:
                self._end_epoch()
            self._epoch = epoch
            self._epoch_started = self._last_step_at or now
            self._epoch_samples = 0
        samples = int(values.pop("samples", 0) or 0)
        step = values.pop("step", None)
        self._step = int(step) if step is not None else self._step + 1
        step_time = values.pop("step_time", None)
        if step_time is None and self._last_step_at is not None:
            step_time = now - self._last_step_at
        self._last_step_at = now
        samples_per_s = values.pop("samples_per_s", None)
        if samples_per_s is None and step_time and samples:
            samples_per_s = samples / step_time
        loss = values.pop("loss", None)
        self._epoch_samples += samples
        self._epoch_open = self._epoch is not None
        self._send(
            protocol.Step,
            urgent=False,
            step=self._step,
            epoch=self._epoch,
            loss=None if loss is None else float(loss),
            samples=samples,
            samples_per_s=samples_per_s,
            step_time=step_time,
            metrics=_plain(values) if values else {},
        )

    def log_eval(self, **values: Any) -> None:
        if self._socket is None:
            return
        self.started()
        epoch = values.pop("epoch", self._epoch)
        if self._epoch_open:
            self._end_epoch()
        accuracy = values.pop("accuracy", None)
        loss = values.pop("loss", None)
        count = values.pop("count", None)
        self._send(
            protocol.Eval,
            epoch=epoch,
            accuracy=None if accuracy is None else float(accuracy),
            loss=None if loss is None else float(loss),
            count=None if count is None else int(count),
            metrics=_plain(values),
        )
        # Evaluation time is not training time: the next step's interval starts now.
        self._last_step_at = time.monotonic()

    def _end_epoch(self) -> None:
        end = self._last_step_at or time.monotonic()
        self._send(
            protocol.EpochEnd,
            epoch=self._epoch,
            time=max(0.0, end - self._epoch_started),
            samples=self._epoch_samples,
        )
        self._epoch_samples = 0
        self._epoch_open = False


def _node_rank() -> int | None:
    """This rank's node (torch's ``GROUP_RANK``) in a multi-node run; None on one node."""
    if NNODES_ENV not in os.environ:
        return None
    try:
        return int(os.environ.get("GROUP_RANK", ""))
    except ValueError:
        return None


def _plain(values: dict[str, Any]) -> dict[str, Any]:
    """Extra metrics as wire-safe scalars (tensors and numpy scalars become floats)."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        if value is None or isinstance(value, bool | int | float | str):
            out[str(key)] = value
        elif hasattr(value, "item"):
            out[str(key)] = value.item()
        else:
            out[str(key)] = str(value)
    return out


def _current_device() -> tuple[str, str | None]:
    """This rank's device without initialising CUDA ourselves.

    Only when the script has already initialised CUDA do we ask torch which device is
    current and its UUID (the key the GPU monitor joins ranks to GPUs by).
    """
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        index = torch.cuda.current_device()
        return f"cuda:{index}", cuda_uuid(index)
    return "cpu", None


def cuda_uuid(index: int) -> str | None:
    """NVML-style UUID (``GPU-…``) of CUDA device ``index``, or None."""
    import torch

    try:
        uuid = str(torch.cuda.get_device_properties(index).uuid)
    except (AttributeError, RuntimeError):
        return None
    return uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"


_reporter: Reporter | None = None
_reporter_pid: int | None = None
_reporter_lock = threading.Lock()


def get_reporter() -> Reporter:
    """This process's reporter, created on first use (and again after a fork)."""
    global _reporter, _reporter_pid
    pid = os.getpid()
    if _reporter is not None and _reporter_pid == pid:
        return _reporter
    with _reporter_lock:
        if _reporter is None or _reporter_pid != pid:
            _reporter = Reporter(
                os.environ.get(ENDPOINT_ENV) or None,
                os.environ.get(RUN_ID_ENV, "local"),
                _rank_from_env(),
            )
            _reporter_pid = pid
            if _reporter.enabled:
                atexit.register(_at_exit, _reporter)
                _install_excepthook()
    return _reporter


def reset_reporter() -> None:
    """Close and forget this process's reporter (tests; a new run in the same process)."""
    global _reporter, _reporter_pid
    if _reporter is not None:
        _reporter.close()
    _reporter, _reporter_pid = None, None


def _at_exit(reporter: Reporter) -> None:
    if reporter is _reporter and reporter.enabled:
        reporter.finished()
        reporter.close()


def _install_excepthook() -> None:
    previous = sys.excepthook

    def hook(exc_type, exc, tb):  # type: ignore[no-untyped-def]
        if _reporter is not None and exc_type is not SystemExit:
            import traceback

            trace = "".join(traceback.format_exception(exc_type, exc, tb))
            _reporter.finished(error=f"{exc_type.__name__}: {exc}", traceback=trace)
        previous(exc_type, exc, tb)

    sys.excepthook = hook
