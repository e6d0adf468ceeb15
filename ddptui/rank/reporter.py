"""The worker side of telemetry: a PUSH socket that never blocks training.

A :class:`Reporter` is created lazily inside each rank process (after spawn/fork, never
inherited), from ``DDPTUI_ENDPOINT`` (any ZeroMQ endpoint: ``tcp://`` or ``ipc://``) and
``DDPTUI_RUN_ID``. Sends are non-blocking (``zmq.DONTWAIT``) into a bounded queue
(``SNDHWM``); when the queue is full the events are dropped and counted (the rank's ``seq``
numbers show the gap). Closing waits at most ``LINGER`` for queued events to leave.

Step events are batched and made off the step path. ``log`` keeps the step's numbers (read
at the call: a CPU tensor's value then, its step count, its times) in a queue and returns;
a sender thread (:class:`ddptui.rank.drainer.Drainer`) makes the events and hands them to
ZeroMQ together, at most ``FLUSH_INTERVAL_S`` later. Making and sending after a step's
kernels is cold-cache Python, tens of microseconds each time (a send also wakes ZeroMQ's
I/O thread); the thread pays that once per batch, mostly while torch's kernels have released
the GIL. Any other event (an evaluation, an epoch's end, the rank's end, a heartbeat) first
makes the steps queued before it, so every event keeps its call's order and ``seq``; it
goes out at once, with whatever is waiting. More than ``MAX_QUEUED_STEPS`` queued steps (a
thread starved of the GIL) are made and sent on the caller's thread.

**Nobody listening costs nothing.** The socket sets ``IMMEDIATE``: ZeroMQ queues only to a
peer whose connection has completed, so a dead listener never fills a queue that closing
would then wait ``LINGER`` on. Events made before the first connection completes (the
``started`` status comes first thing, while the handshake is still under way) are held here
instead, at most ``HOLD_EVENTS`` of them, and sent in order once the connection is up; a
new reporter waits up to ``CONNECT_WAIT_S`` for it, once. When the connection never comes,
the held events are dropped and counted at close, which waits for it only while the
reporter is younger than ``CONNECT_GRACE_S``. While the queue is known to be full (or the
hold is, with nobody listening), ``log`` drops its step without building an event.

**Values may be tensors.** Loss, accuracy, count and every extra metric may be a Python or
numpy number or a one-element torch tensor. CPU tensors are read at once. CUDA tensors are
read lazily (:mod:`ddptui.rank.pending`): the call queues a copy to pinned host memory and a CUDA
event, and the event waits here until the copy has landed, checked at later calls and at
:meth:`Reporter.flush`; close waits for the device (at most
:data:`ddptui.rank.pending.DRAIN_TIMEOUT_S`). Step number, step time and samples/s are taken at
the call; only the values arrive later. Per-rank order is kept: an event waiting for its
values holds back the events made after it, and every event keeps the ``seq`` and ``t`` of
its call, so ``seq`` increases along ``events.jsonl`` for each rank. At most
``PENDING_EVENTS`` events wait; beyond that the oldest is dropped and counted.
"""

from __future__ import annotations

import atexit
import math
import os
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from ddptui import protocol
from ddptui.constants import (
    ATTEMPT_ENV,
    ENDPOINT_ENV,
    NNODES_ENV,
    RESTART_COUNT_ENV,
    RUN_ID_ENV,
)
from ddptui.rank import pending, world
from ddptui.rank.drainer import Drainer

#: Messages (batches of up to MAX_BATCH_EVENTS events) queued before sends start dropping.
SEND_HWM = 1_000
LINGER_MS = 1_000
#: After a send finds the queue full, drop (and count) without trying for this long.
FULL_BACKOFF_S = 0.01
#: Step events wait at most this long before the sender thread makes and sends them (as the
#: zero-code hooks' steps wait for their drainer, ``instrument.SEND_INTERVAL_S``: each batch
#: has a fixed cost, which a longer interval shares among more steps).
FLUSH_INTERVAL_S = 0.2
#: Steps queued unmade beyond this are made and sent on the caller's thread (a script logging
#: 5,000 steps a second fills it in one interval).
MAX_QUEUED_STEPS = 1024
#: Events kept for a peer whose connection has not completed yet (status events: a few more).
HOLD_EVENTS = 256
_HOLD_STATUS_EXTRA = 16
#: A new reporter waits this long, once, for its connection (its ``started`` goes out then).
CONNECT_WAIT_S = 0.05
#: Close waits for a connection that never came only while the reporter is this young.
CONNECT_GRACE_S = 0.15
#: Events waiting for device (CUDA) values before the oldest is dropped.
PENDING_EVENTS = pending.DEFAULT_CAPACITY
#: ZeroMQ retries a refused connection at this interval, backing off up to the maximum.
RECONNECT_IVL_MS = 100
RECONNECT_IVL_MAX_MS = 2_000

_STEP_FIELDS = ("epoch", "loss", "samples", "step", "step_time", "samples_per_s")
_EVAL_FIELDS = ("epoch", "accuracy", "loss", "count")


def env_int(name: str, default: int | None = None) -> int | None:
    """A non-negative whole number from the environment, or ``default`` when it is unset or
    not one: a garbled variable must never crash the training script through telemetry."""
    text = (os.environ.get(name) or "").strip()
    return int(text) if text.isdigit() and len(text) < 10 else default


def _rank_from_env() -> int:
    return env_int("RANK", 0) or 0


def attempt_from_env() -> int:
    """This rank's attempt number: ``DDPTUI_ATTEMPT``, else torchrun's restart count, else 0."""
    for name in (ATTEMPT_ENV, RESTART_COUNT_ENV):
        text = os.environ.get(name, "").strip()
        if text.isdigit() and len(text) < 10:
            return min(int(text), protocol.MAX_ATTEMPT)  # beyond it every event is refused
    return 0


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
        self.attempt = attempt_from_env()
        self._step = 0
        #: Steps sent so far (0: the rank is still preparing).
        self.steps_logged = 0
        self._epoch: int | None = None
        self._epoch_started = time.monotonic()
        self._epoch_samples = 0
        self._epoch_open = False  # steps of self._epoch were logged and it has not ended
        self._last_step_at: float | None = None
        self._started_sent = False
        self._announced: dict[str, Any] = {}  # what the started status has told so far
        self._finished_sent = False
        self._muted = False
        self._lock = threading.Lock()
        self._full_until = 0.0  # until then, drop without trying (queue full, or nobody there)
        self._batch: list[protocol.AnyEvent] = []
        #: Steps logged, not made into events yet (made in order before any other event).
        self._steps: deque[tuple[Any, ...]] = deque()
        self._sender: Drainer | None = None  # makes and sends the steps (see _send_steps)
        self._urgent = False  # an event that must not wait for the flush interval is waiting
        self._pending: pending.PendingQueue[protocol.AnyEvent] = pending.PendingQueue(
            PENDING_EVENTS
        )
        self._held: list[protocol.AnyEvent] = []  # made before the connection completed
        self._connected = False
        self._created = time.monotonic()
        self._socket = None
        self._context = None
        self._before_send: Any = None  # see before_send
        if endpoint:
            import zmq  # imported only when there is somewhere to send

            self._zmq = zmq
            self._context = zmq.Context()
            sock = self._context.socket(zmq.PUSH)
            sock.setsockopt(zmq.SNDHWM, send_hwm)
            sock.setsockopt(zmq.LINGER, LINGER_MS)
            sock.setsockopt(zmq.IMMEDIATE, 1)
            sock.setsockopt(zmq.RECONNECT_IVL, RECONNECT_IVL_MS)
            sock.setsockopt(zmq.RECONNECT_IVL_MAX, RECONNECT_IVL_MAX_MS)
            try:
                sock.connect(endpoint)
            except zmq.ZMQError as exc:
                # A bad DDPTUI_ENDPOINT disables telemetry; training goes on.
                shown = endpoint if len(endpoint) <= 80 else f"{endpoint[:77]}..."
                why = str(exc).partition(" (addr=")[0][:120]  # zmq repeats the whole address
                print(
                    f"ddptui: telemetry off: cannot use DDPTUI_ENDPOINT {shown!r} ({why})",
                    file=sys.stderr,
                )
                sock.close(linger=0)
                self._context.term()
                self._context = None
                return
            self._socket = sock
            self._sender = Drainer(self._send_steps, FLUSH_INTERVAL_S, "ddptui-telemetry")
            # With IMMEDIATE, POLLOUT means a connection has completed: wait for it once, so
            # the first status goes out at once (a live listener answers within a millisecond).
            self._connected = bool(sock.poll(int(CONNECT_WAIT_S * 1000), zmq.POLLOUT))

    @property
    def enabled(self) -> bool:
        return self._socket is not None

    def mute(self) -> None:
        """Send nothing more from this process (a spawner whose workers are the ranks now);
        what is batched goes out first."""
        self.flush()
        self._muted = True

    # -- sending -------------------------------------------------------------------------
    def _send(
        self,
        cls: type[protocol.Event],
        urgent: bool = True,
        device_read: pending.Read | None = None,
        counted: bool = True,
        **fields: Any,
    ) -> None:
        """Queue one event; send the batch when ``urgent``, full, or due.

        ``device_read``: the event's device values in flight; it waits for them (and holds
        back the events after it) in the pending queue. (Not ``read``: a note's field of that
        name, what a script's ``--local_rank`` read, was taken for it and lost.)
        """
        if self._socket is None or self._muted:
            return
        if counted and self._before_send is not None:
            self._before_send()  # steps finished before this event go first
        with self._lock:
            if self._steps:
                self._make_steps()  # the steps logged before this event go first
            if counted:
                seq = self._seq
                self._seq += 1  # a dropped event still takes its number: the gap shows the drop
            else:
                # a heartbeat repeats the last number: beats are not data, a lost one is no
                # drop, and events.jsonl may leave them out without making a gap
                seq = max(0, self._seq - 1)
            event = cls(
                run=self.run_id,
                rank=self.rank,
                t=time.time(),
                seq=seq,
                attempt=self.attempt,
                **fields,
            )
            self._queue(event, urgent, device_read, time.monotonic())

    def _queue(
        self, event: protocol.AnyEvent, urgent: bool, read: pending.Read | None, now: float
    ) -> None:
        """With the lock held: put ``event`` in the batch (or, with ``read`` or events
        waiting for theirs, in the pending queue); send the batch when urgent, full or due."""
        if read is not None or self._pending:
            self.dropped += self._pending.push(event, read)  # urgent once released
            self._release(self._pending.pop_ready())
        else:
            self._batch.append(event)
            if urgent:
                self._urgent = True
        if self._urgent or len(self._batch) >= protocol.MAX_BATCH_EVENTS:
            self._flush(now)
        elif self._batch or self._pending:
            self._sender.poke()  # sent by the sender thread within FLUSH_INTERVAL_S

    def _drop(self, now: float) -> bool:
        """Drop one event without making it, while the queue is known to be full."""
        if now >= self._full_until:
            return False
        with self._lock:
            if self._steps:
                self._make_steps()  # their numbers come before the dropped one's
            self._seq += 1
            self.dropped += 1
        return True

    def _release(self, ready: list) -> None:
        """Move events whose device values have arrived into the batch, filling them in."""
        for event, values in ready:
            if values:
                _fill(event, values)
            self._batch.append(event)
            if type(event) is not protocol.Step:
                self._urgent = True

    def _flush(self, now: float) -> None:
        batch, self._batch = self._batch, []
        self._urgent = False
        if not (batch or self._held) or self._socket is None:
            return
        if now < self._full_until:
            self.dropped += len(batch)
            return
        if not self._connected:
            self._hold(batch, now)
            return
        self._deliver(batch, now)

    def _deliver(self, events: list[protocol.AnyEvent], now: float) -> None:
        """Hand ``events`` to ZeroMQ, at most MAX_BATCH_EVENTS per message. A message the
        collector would refuse whole (over MAX_MESSAGE_BYTES) or that cannot be encoded is
        halved until the event at fault is alone: only it is dropped (a script's 2 MB text
        metric once took the two steps batched with it)."""
        step = protocol.MAX_BATCH_EVENTS
        chunks = [events[start : start + step] for start in range(0, len(events), step)]
        while chunks:
            chunk = chunks.pop(0)
            try:
                data: bytes | None = protocol.encode_batch(chunk)
            except Exception:  # noqa: BLE001 - whatever a value does, the rest still goes
                data = None
            if data is None or len(data) > protocol.MAX_MESSAGE_BYTES:
                if len(chunk) == 1:
                    self.dropped += 1
                else:
                    half = len(chunk) // 2
                    chunks[:0] = [chunk[:half], chunk[half:]]
                continue
            try:
                self._socket.send(data, self._zmq.DONTWAIT)
            except self._zmq.Again:
                # Queue full (or the listener went away): drop without asking zmq again for a
                # while, so a stalled collector costs the training loop almost nothing.
                self.dropped += len(chunk) + sum(map(len, chunks))
                self._full_until = now + FULL_BACKOFF_S
                return
            self.sent += len(chunk)

    def _hold(self, batch: list[protocol.AnyEvent], now: float) -> None:
        """Keep ``batch`` until the connection completes; send everything held once it has."""
        held = self._held
        for event in batch:
            room = HOLD_EVENTS + (_HOLD_STATUS_EXTRA if type(event) is protocol.Status else 0)
            if len(held) < room:
                held.append(event)
            else:
                self.dropped += 1
        if self._socket.getsockopt(self._zmq.EVENTS) & self._zmq.POLLOUT:
            self._connected = True
            self._held = []
            self._deliver(held, now)
        elif len(held) >= HOLD_EVENTS:
            # Nobody there yet and no room: drop steps unmade until the next look.
            self._full_until = now + FLUSH_INTERVAL_S

    def flush(self) -> None:
        """Send the events still waiting: those in the batch, and those whose device values
        have arrived (an event still waiting for its values stays, with those after it)."""
        with self._lock:
            if self._steps:
                self._make_steps()
            if self._pending:
                self._release(self._pending.pop_ready())
            self._flush(time.monotonic())

    # -- lifecycle -----------------------------------------------------------------------
    def started(
        self,
        device: str | None = None,
        device_uuid: str | None = None,
        epochs: int | None = None,
        steps_per_epoch: int | None = None,
        guess_device: bool = True,
    ) -> None:
        """Announce this rank: pid, host, local rank, device, and what it knows of the plan
        (epochs, steps per epoch). Sent on the first call, and again only when a later call
        adds something new (a trainer learns its steps per epoch once its data is loaded).

        The rank entry announces the rank before the script runs, with ``guess_device``
        False (the script has not chosen its device yet); the first later call names it."""
        if self._socket is None:
            return
        if device is None and guess_device and "device" not in self._announced:
            device, device_uuid = _current_device()
        # What the script passes, as the event carries it (a torch.device as its name): one
        # value the collector refuses would lose the announcement, and the rank's pid with it.
        given = {
            "device": None if device is None else _text(device),
            "device_uuid": None if device_uuid is None else _text(device_uuid),
            "epochs": None if epochs is None else _whole("epochs", epochs),
            "steps_per_epoch": (
                None if steps_per_epoch is None else _whole("steps_per_epoch", steps_per_epoch)
            ),
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
            local_rank=env_int("LOCAL_RANK", self.rank),
            world_size=env_int("WORLD_SIZE"),
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
        if traceback is not None and not isinstance(traceback, str):
            traceback = str(traceback)
        if traceback and len(traceback) > protocol.MAX_TRACEBACK_CHARS:
            traceback = "[…]\n" + traceback[-(protocol.MAX_TRACEBACK_CHARS - 4) :]
        self._finished_sent = True
        self._full_until = 0.0  # the final status always gets its chance
        self._send(
            protocol.Status,
            state="failed" if error else "finished",
            pid=os.getpid(),
            error=str(error)[-2000:] if error else None,  # an exception passed: its text
            traceback=traceback if error else None,
            dropped=self.dropped,
        )

    def close(self) -> None:
        if self._sender is not None:
            self._sender.stop()  # outside the lock: a send under way finishes first
        if self._socket is not None:
            with self._lock:
                if self._steps:
                    self._make_steps()
                if self._pending:  # at close it is fine to wait for the device (bounded)
                    self._release(self._pending.drain(pending.DRAIN_TIMEOUT_S))
                self._full_until = 0.0  # what is left gets its chance
                self._flush(time.monotonic())
                if self._held:
                    self._wait_for_peer()
            # Nothing was ever queued to a peer that never came (IMMEDIATE): no linger then.
            self._socket.close(linger=LINGER_MS if self._connected else 0)
            self._socket = None
        if self._context is not None:
            self._context.term()
            self._context = None

    def _wait_for_peer(self) -> None:
        """At close, with events held and no connection: wait for it while the reporter is
        young (a short script may end before its handshake); otherwise drop them."""
        left = self._created + CONNECT_GRACE_S - time.monotonic()
        if left > 0 and self._socket.poll(int(left * 1000) + 1, self._zmq.POLLOUT):
            self._connected = True
            held, self._held = self._held, []
            self._deliver(held, time.monotonic())
        else:
            self.dropped += len(self._held)
            self._held = []

    # -- metrics -------------------------------------------------------------------------
    def before_send(self, flush: Any) -> None:
        """Call ``flush()`` before making any event other than a step or a heartbeat: the
        zero-code instrumentation sends its finished steps from a thread, and those must
        reach ddptui before an evaluation, an epoch's end or the rank's end made after them.
        """
        self._before_send = flush

    def log(
        self,
        *,
        epoch: int | None = None,
        samples: Any = 0,
        step: Any = None,
        step_time: float | None = None,
        samples_per_s: float | None = None,
        phases: Any = None,
        loss: Any = None,
        **values: Any,
    ) -> None:
        """One training step (see :func:`ddptui.log`); ``values`` are the extra metrics."""
        self._log_step(
            time.monotonic(),
            None,
            epoch,
            samples,
            step,
            step_time,
            samples_per_s,
            phases,
            loss,
            values,
        )

    def log_step_at(
        self,
        now: float,
        wall: float,
        *,
        epoch: int | None,
        samples: int,
        step_time: float | None,
        phases: dict[str, float] | None,
        loss: float | None,
        rated: bool = True,
        steps: int = 1,
    ) -> None:
        """A step that ended at ``now`` (``time.monotonic``) and ``wall`` (``time.time``),
        logged later (the zero-code instrumentation's steps, from its drainer thread, which
        calls :meth:`flush` itself: the sender thread is not woken for them). ``rated``
        False: its time is no measure of its rate (no samples/s is derived from it).
        ``step_time`` None: not known (a first step whose beginning nothing saw). ``steps``
        more than 1: that many steps in one event (see ``protocol.Step.steps``)."""
        self._log_step(
            now,
            wall,
            epoch,
            samples,
            step=None,
            step_time=step_time,
            samples_per_s=None,
            phases=phases,
            loss=loss,
            values=None,
            poke=False,
            rated=rated,
            count=steps,
        )

    def _log_step(
        self,
        now: float,
        wall: float | None,
        epoch: int | None,
        samples: Any,
        step: Any,
        step_time: float | None,
        samples_per_s: float | None,
        phases: Any,
        loss: Any,
        values: dict[str, Any] | None,
        poke: bool = True,
        rated: bool = True,
        count: int = 1,
    ) -> None:
        if self._socket is None:
            return
        if "device" not in self._announced:
            self.started()
        if epoch is not None and (type(epoch) is not int or not 0 <= epoch <= _INT_MAX):
            epoch = _whole("epoch", epoch)
        if step_time is not None and not (
            type(step_time) is float and 0.0 <= step_time <= protocol.MAX_SECONDS
        ):
            step_time = _within("step_time", step_time, protocol.MAX_SECONDS)
        if epoch is not None and epoch != self._epoch:
            if self._epoch_open:
                self._end_epoch()
            self._epoch = epoch
            # From the last step's end; the run's first step from its own start, where known
            # (an epoch 0 timed from its first step's end counted that step's samples in a
            # time without it: facebookresearch/moco's 12 steps of 4.2 s read 46 s, not 51).
            self._epoch_started = self._last_step_at or now - (step_time or 0.0)
            self._epoch_samples = 0
        if type(samples) is not int or not 0 <= samples <= _INT_MAX:
            samples = 0 if samples is None else (_whole("samples", samples) or 0)
        if step is not None and (type(step) is not int or not 0 <= step <= _INT_MAX):
            step = _whole("step", step)
        if not self.steps_logged:  # the first step: does it train with the others?
            world.first_step(self.note)
        self.steps_logged += count
        self._step = step if step is not None else self._step + count
        if samples_per_s is not None and not (
            type(samples_per_s) is float and 0.0 <= samples_per_s <= protocol.MAX_RATE
        ):
            samples_per_s = _within("samples_per_s", samples_per_s, protocol.MAX_RATE)
        if step_time is None and self._last_step_at is not None:
            step_time = now - self._last_step_at
        self._last_step_at = now
        if samples_per_s is None and step_time and samples and rated:
            samples_per_s = samples / step_time
        if phases is not None:
            phases = protocol.clean_phases(phases)
        self._epoch_samples += samples
        self._epoch_open = self._epoch is not None
        if now < self._full_until and self._drop(now):  # known full: not even made or read
            return
        device: list[tuple[Any, Any]] = []  # CUDA values, read later
        if loss is not None and type(loss) is not float:
            loss = _number("loss", loss, device)
        metrics = _metrics(values, device) if values else {}
        read = pending.DeviceRead(device) if device else None
        if self._muted:
            return
        numbers = (
            time.time() if wall is None else wall,
            self._step,
            self._epoch,
            loss,
            samples,
            samples_per_s,
            step_time,
            metrics,
            phases,
            count,
        )
        if read is None and not self._pending:
            # Off the step path: the sender thread makes the event and sends it.
            steps = self._steps
            steps.append(numbers)
            if len(steps) < MAX_QUEUED_STEPS:
                if poke:
                    self._sender.poke()  # an attribute test while the thread is awake
                return
            with self._lock:  # the thread is starved of the GIL: make and send them here
                self._make_steps()
                self._flush(now)
            return
        with self._lock:  # device values in flight: the event waits in the pending queue
            self._steps.append(numbers)
            self._make_steps()  # those queued before it, then it (the batch's last)
            self._queue(self._batch.pop(), False, read, now)

    def _make_steps(self) -> None:
        """With the lock held: make the queued steps into events, in order, into the batch."""
        steps, batch = self._steps, self._batch
        run, rank, attempt = self.run_id, self.rank, self.attempt
        while steps:
            t, step, epoch, loss, samples, samples_per_s, step_time, metrics, phases, count = (
                steps.popleft()
            )
            batch.append(
                protocol.Step(
                    run=run,
                    rank=rank,
                    t=t,
                    seq=self._seq,
                    attempt=attempt,
                    step=step,
                    epoch=epoch,
                    loss=loss,
                    samples=samples,
                    samples_per_s=samples_per_s,
                    step_time=step_time,
                    metrics=metrics,
                    phases=phases,
                    steps=count,
                )
            )
            self._seq += 1

    def _send_steps(self) -> bool:
        """The sender thread's work: make the queued steps, release the events whose device
        values have arrived, send the batch. Returns whether to stay awake (steps came, or
        device values are still on the way)."""
        with self._lock:
            if self._socket is None:
                return False
            if self._steps:
                self._make_steps()
            if self._pending:
                self._release(self._pending.pop_ready())
            work = bool(self._batch)
            if work or self._held:
                self._flush(time.monotonic())
            return work or bool(self._pending)

    def beat(
        self,
        frame: str | None,
        waiting: str | None,
        digest: str | None,
        cpu: float | None,
        collectives: list[dict[str, Any]] | None = None,
        io: int | None = None,
        ddp: bool | None = None,
        evaluations: Any = 0,
        wakes: Any = None,
    ) -> None:
        """Send a heartbeat (see :mod:`ddptui.rank.heartbeat`); callable from any thread.
        ``ddp`` False: the rank holds no DDP module (sent only then). ``evaluations``: the
        evaluation batches run so far; ``wakes``: the sampled thread's (None: not known)."""
        if self._socket is None:
            return
        marks = []
        for mark in (collectives or [])[: protocol.MAX_BEAT_GROUPS]:
            try:
                marks.append(
                    protocol.CollectiveMark(
                        pg=str(mark.get("pg", "?"))[:128],
                        op=None if mark.get("op") is None else str(mark["op"])[:128],
                        started=_seq_or_none(mark.get("started")),
                        completed=_seq_or_none(mark.get("completed")),
                        backend=None if mark.get("backend") is None else str(mark["backend"])[:128],
                    )
                )
            except (AttributeError, TypeError, ValueError):
                continue
        self._send(
            protocol.Beat,
            counted=False,
            frame=frame[: protocol.MAX_FRAME_CHARS] if frame else None,
            waiting=waiting[:128] if waiting else None,
            digest=digest[:32] if digest else None,
            cpu=cpu if cpu is not None and 0.0 <= cpu <= protocol.MAX_SECONDS else None,
            io=_count(io),
            steps=self.steps_logged,
            collectives=marks,
            ddp=False if ddp is False else None,
            evaluations=_count(evaluations) or 0,
            wakes=_count(wakes),
        )

    def log_eval(self, **values: Any) -> None:
        if self._socket is None:
            return
        self.started()
        epoch = values.pop("epoch", self._epoch)
        if epoch is not None and (type(epoch) is not int or not 0 <= epoch <= _INT_MAX):
            epoch = _whole("epoch", epoch)
        if self._epoch_open:
            self._end_epoch()
        device: list[tuple[Any, Any]] = []
        accuracy = _number("accuracy", values.pop("accuracy", None), device)
        loss = _number("loss", values.pop("loss", None), device)
        count = values.pop("count", None)
        if count is not None:
            if pending.on_device(count):
                _one_value("count", count)
                device.append(("count", count))
                count = None
            else:
                count = _whole("count", count)
        metrics = _metrics(values, device)
        self._send(
            protocol.Eval,
            device_read=pending.DeviceRead(device) if device else None,
            epoch=epoch,
            accuracy=accuracy,
            loss=loss,
            count=count,
            metrics=metrics,
        )
        # Evaluation time is not training time: the next step's interval starts now.
        self._last_step_at = time.monotonic()

    def note(self, code: str, *, announce: bool = True, **numbers: int | None) -> None:
        """A finding of the rank's instrumentation (:class:`protocol.Note`): a code and
        numbers only; ddptui words it. ``announce``: the rank announces itself first (its
        device, where it has a new one); not from a process whose workers took its rank
        over, whose status would be taken for theirs."""
        if self._socket is None:
            return
        if announce:
            self.started()
        self._send(protocol.Note, code=code, **numbers)

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


def _count(value: Any) -> int | None:
    """A count as the wire takes it (an int, not a bool, from 0 to 2**63 - 1), else None."""
    return value if type(value) is int and 0 <= value < 2**63 else None


def _seq_or_none(value: Any) -> int | None:
    """A collective sequence number as the wire takes it (a non-negative int), else None."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


def _node_rank() -> int | None:
    """This rank's node (torch's ``GROUP_RANK``) in a multi-node run; None on one node."""
    if NNODES_ENV not in os.environ:
        return None
    try:
        return int(os.environ.get("GROUP_RANK", ""))
    except ValueError:
        return None


# -- values: numbers now, CUDA tensors later -----------------------------------------------
#: Key of an extra metric among a call's device values (loss, accuracy, count are plain names).
_METRIC = "metric"


def _one_value(name: str, tensor: Any) -> None:
    if tensor.numel() != 1:
        raise ValueError(
            f"ddptui: {name} must be a number or a one-element tensor, "
            f"got a tensor of shape {tuple(tensor.shape)}"
        )


def _number(name: str, value: Any, device: list[tuple[Any, Any]]) -> float | None:
    """``value`` as a float now; a CUDA tensor goes to ``device`` (None until it is read);
    None, said once, for what is no number (text, an integer beyond a float's range)."""
    if value is None or type(value) is float:
        return value
    if pending.torch_tensor(value):
        # On the step path, where each call into torch costs microseconds (its code is cold
        # after the step's kernels): ``is_cuda`` makes no device object, and a CPU tensor's
        # ``item()`` itself refuses more than one element (then said as below).
        if value.is_cuda:
            _one_value(name, value)
            device.append((name, value))
            return None
        try:
            return float(value.item())  # a CPU tensor: read now
        except RuntimeError:
            _one_value(name, value)
            raise
    try:
        return float(value)  # ints, numpy scalars
    except (TypeError, ValueError, OverflowError):
        _unusable(name, value, "a number")
        return None


#: The largest count or index an event carries (msgpack's signed 64 bits).
_INT_MAX = 2**63 - 1
_said: set[str] = set()


def _whole(name: str, value: Any) -> int | None:
    """A count or index the script passed (``epoch``, ``step``, ``samples``, ``count``) as
    the int an event carries: an integral number as it is, a fraction's whole part (a
    fractional epoch, 1.5: in epoch 1), numpy's and one-element tensors read; None, said
    once, for anything else (text, a bool, a negative or non-finite number, one beyond 64
    bits). Sent as given, one such value made the whole message invalid, and the collector
    refused it with every step batched beside it."""
    if pending.torch_tensor(value) and value.numel() == 1:
        value = value.item()
    elif not isinstance(value, bool | int | float) and hasattr(value, "item"):
        try:
            value = value.item()  # numpy scalars
        except Exception:  # noqa: BLE001 - an .item() that is no number's
            pass
    if isinstance(value, float) and math.isfinite(value):
        value = math.floor(value)
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= _INT_MAX:
        return int(value)
    _unusable(name, value, "a whole number of 0 or more")
    return None


#: Longest device name or UUID sent.
MAX_DEVICE_TEXT = 128


def _text(value: Any) -> str:
    """A device name or UUID as text (``torch.device("cuda", 0)``: ``cuda:0``), cut to
    :data:`MAX_DEVICE_TEXT` characters."""
    return (value if isinstance(value, str) else str(value))[:MAX_DEVICE_TEXT]


def _within(name: str, value: Any, most: float) -> float | None:
    """A duration or rate the script passed, as a float from 0 to ``most``; None, said once,
    otherwise (the collector refuses an event with a negative or NaN one)."""
    number = _number(name, value, [])
    if number is not None and 0.0 <= number <= most:
        return number
    if number is not None:
        _unusable(name, value, f"from 0 to {most:g}")
    return None


def _unusable(name: str, value: Any, wanted: str) -> None:
    """Say once per name, on stderr, that a value was not sent."""
    if name in _said:
        return
    _said.add(name)
    shown = repr(value)
    shown = shown if len(shown) <= 40 else f"{shown[:37]}..."
    print(
        f"ddptui: {name}={shown} is not {wanted}: sent without it (said once)",
        file=sys.stderr,
    )


#: Longest extra metric name and text value sent (cut beyond): with MAX_METRICS of them an
#: event stays small, and no value makes the message it travels in too big for the collector.
MAX_METRIC_NAME = 64
MAX_METRIC_TEXT = 256


def _metrics(values: dict[str, Any], device: list[tuple[Any, Any]]) -> dict[str, Any]:
    """Extra metrics as wire-safe scalars: numbers as they are, CPU tensors and numpy
    scalars read now, CUDA tensors into ``device`` (None until read), anything else as text.
    Whatever the script passes, the event stays valid: the first ``protocol.MAX_METRICS``,
    names and text cut to MAX_METRIC_NAME and MAX_METRIC_TEXT characters, an integer beyond
    64 bits as a float (None beyond a float's range)."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        if len(out) >= protocol.MAX_METRICS:
            break
        name = str(key)[:MAX_METRIC_NAME]
        if pending.torch_tensor(value):
            _one_value(name, value)
            if value.device.type == "cuda":
                device.append(((_METRIC, name), value))
                out[name] = None
                continue
            value = value.item()
        elif not isinstance(value, bool | int | float | str) and hasattr(value, "item"):
            value = value.item()  # numpy scalars
        out[name] = _wire_scalar(value)
    return out


def _wire_scalar(value: Any) -> Any:
    """``value`` as msgpack can carry it and the collector accepts it. A subclass of float or
    int as the plain number: msgpack refuses numpy's ``float64`` (a float subclass), and the
    event it was in was dropped (open_clip's evaluation metrics, logged to TensorBoard)."""
    if value is None or type(value) is bool or type(value) is float:
        return value
    if isinstance(value, float):
        return float(value)
    if isinstance(value, int):
        value = int(value)
        if -(2**63) <= value < 2**64:
            return value
        try:
            return float(value)
        except OverflowError:
            return None
    text = value if isinstance(value, str) else str(value)
    return text[:MAX_METRIC_TEXT]


def _fill(event: Any, values: list[tuple[Any, Any]]) -> None:
    """Put values read from the device into ``event`` (None where they were lost)."""
    for key, value in values:
        if type(key) is tuple:
            event.metrics[key[1]] = value
        elif value is None:
            setattr(event, key, None)
        elif key == "count":
            event.count = int(value)
        else:
            setattr(event, key, float(value))


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
    """This process's reporter, created on first use (and again in a forked child).

    The hot path is one global read: a fork forgets the parent's reporter in the child
    (``os.register_at_fork``) instead of every call asking for the pid.
    """
    rep = _reporter
    if rep is not None:
        return rep
    return _create_reporter()


def _create_reporter() -> Reporter:
    global _reporter, _reporter_pid
    pid = os.getpid()
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


def _forget_after_fork() -> None:
    """In a forked child the parent's reporter (its socket, its ZeroMQ threads) is not ours:
    the child makes its own on first use. The parent's is left alone, never closed here."""
    global _reporter, _reporter_pid, _reporter_lock
    _reporter, _reporter_pid = None, None
    _reporter_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_after_fork)


def reset_reporter() -> None:
    """Close and forget this process's reporter (tests; a new run in the same process)."""
    global _reporter, _reporter_pid
    if _reporter is not None:
        _reporter.close()
    _reporter, _reporter_pid = None, None


#: Whether this process ends unheard: set in a worker the script started (see
#: :func:`spawned.unranked`), which is no rank unless it forms a process group.
_unheard_at_exit: Callable[[], bool] | None = None


def unheard_at_exit(check: Callable[[], bool]) -> None:
    """At this process's exit, send no ``finished`` when ``check()`` holds then."""
    global _unheard_at_exit
    _unheard_at_exit = check


def _at_exit(reporter: Reporter) -> None:
    if reporter is _reporter and reporter.enabled:
        from ddptui.rank import heartbeat  # loaded with the rank entry

        heartbeat.quiet_at_end(reporter)  # a process whose workers are the ranks ends unheard
        unheard = _unheard_at_exit
        if unheard is None or not unheard():  # and so does a worker of the script's, no rank
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
