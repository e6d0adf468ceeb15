"""Values that live on the GPU, read without waiting for it.

Reading a CUDA tensor on the host (``.item()``, ``float()``, ``.cpu()``) waits until the GPU
has run everything queued before it. Once per training step, that stall costs a fast GPU
several percent of its throughput. Instead, :class:`DeviceRead` queues a copy of each value
into a small pinned host buffer (``non_blocking=True``) and records a CUDA event behind the
copies; the values are read once ``event.query()`` says the copies have landed. Nothing on
the caller's path waits for the device.

:class:`PendingQueue` keeps such reads (or anything with ``query()`` and ``values()``) in
call order and hands out the ready prefix: an item still waiting holds back the items queued
after it, so whoever consumes the queue sees them in the order they were pushed. The
reporter uses it for the values of ``ddptui.log``; code that times phases on the GPU
(zero-code hooks) pushes a :class:`DeviceTiming` on the same kind of queue.

This module never imports torch: only a caller that already holds a tensor gets to the
torch code, which finds torch in ``sys.modules``. ``import ddptui`` stays free of torch.
"""

from __future__ import annotations

import sys
import time
from collections import deque
from collections.abc import Callable, Hashable
from typing import Any, Generic, Protocol, TypeVar

#: Items the reporter lets wait for their device values before dropping the oldest.
DEFAULT_CAPACITY = 1024
#: At close, how long :meth:`PendingQueue.drain` waits for the device at most.
DRAIN_TIMEOUT_S = 2.0

T = TypeVar("T")


def torch_tensor(value: Any) -> bool:
    """True when ``value`` is a torch tensor (without importing torch)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def on_device(value: Any) -> bool:
    """True for a CUDA tensor: reading it on the host now would wait for the GPU.

    Tensors on the CPU (and on devices other than CUDA, which have no events here) are read
    at once by the caller.
    """
    return torch_tensor(value) and value.device.type == "cuda"


class Read(Protocol):
    """What :class:`PendingQueue` needs of a read in flight."""

    def query(self) -> bool:
        """True once the values can be read without waiting."""
        ...

    def values(self) -> list[tuple[Hashable, Any]]:
        """``(key, value)`` pairs, read on the host (only after ``query()`` is true)."""
        ...

    def keys(self) -> list[Hashable]:
        """The keys, for when the values are lost."""
        ...


class DeviceRead:
    """The CUDA values of one call, copied to pinned host memory behind a CUDA event.

    ``tensors`` are ``(key, tensor)`` pairs of one-element CUDA tensors. Creating the read
    queues the copies on each tensor's device's current stream and records one event per
    device after them; it never waits. Raises ``ValueError`` for a tensor of more than one
    element.
    """

    __slots__ = ("_keys", "_hosts", "_events")

    def __init__(self, tensors: list[tuple[Hashable, Any]]) -> None:
        torch = sys.modules["torch"]
        self._keys: list[Hashable] = []
        self._hosts: list[Any] = []
        devices: list[Any] = []
        for key, tensor in tensors:
            if tensor.numel() != 1:
                raise ValueError(
                    f"ddptui: {key!s} must be a number or a one-element tensor, "
                    f"got a tensor of shape {tuple(tensor.shape)}"
                )
            value = tensor.detach().reshape(())  # no autograd graph kept alive by the copy
            host = torch.empty((), dtype=value.dtype, pin_memory=True)
            host.copy_(value, non_blocking=True)
            self._keys.append(key)
            self._hosts.append(host)
            if value.device not in devices:
                devices.append(value.device)
        self._events = []
        for device in devices:
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(device))
            self._events.append(event)

    def query(self) -> bool:
        return all(event.query() for event in self._events)

    def values(self) -> list[tuple[Hashable, Any]]:
        return [(key, host.item()) for key, host in zip(self._keys, self._hosts, strict=True)]

    def keys(self) -> list[Hashable]:
        return list(self._keys)


class DeviceTiming:
    """GPU time between :meth:`start` and :meth:`stop` on a CUDA stream, in seconds, read
    once the stop event has completed (``value`` is ``(key, seconds)``). For hooks that time
    forward/backward/optimizer phases without synchronising: push it on a PendingQueue.
    """

    __slots__ = ("_key", "_start", "_stop")

    def __init__(self, key: Hashable) -> None:
        self._key = key
        self._start: Any = None
        self._stop: Any = None

    def start(self, stream: Any = None) -> DeviceTiming:
        """Record the start on ``stream`` (default: the current stream)."""
        torch = sys.modules["torch"]
        self._start = torch.cuda.Event(enable_timing=True)
        self._start.record(stream)
        return self

    def stop(self, stream: Any = None) -> DeviceTiming:
        """Record the stop on ``stream`` (default: the current stream)."""
        torch = sys.modules["torch"]
        self._stop = torch.cuda.Event(enable_timing=True)
        self._stop.record(stream)
        return self

    def query(self) -> bool:
        return self._stop is not None and self._stop.query()

    def values(self) -> list[tuple[Hashable, Any]]:
        return [(self._key, self._start.elapsed_time(self._stop) / 1000.0)]

    def keys(self) -> list[Hashable]:
        return [self._key]


class PendingQueue(Generic[T]):
    """Items in call order, each with the read it waits for (or none).

    :meth:`pop_ready` returns the ready prefix as ``(item, values)`` pairs, where ``values``
    is the read's ``(key, value)`` list (``None`` for an item pushed without a read). A read
    that raises (a broken device) counts in ``failed`` and gives ``(key, None)`` pairs: the
    item still leaves, in its place. Bounded: pushing onto a full queue drops the oldest
    item, counted in ``dropped``. Not thread-safe: the owner locks.
    """

    def __init__(
        self, capacity: int = DEFAULT_CAPACITY, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self.dropped = 0
        self.failed = 0
        self._clock = clock
        self._items: deque[tuple[T, Read | None]] = deque()

    def __len__(self) -> int:
        return len(self._items)

    def __bool__(self) -> bool:
        return bool(self._items)

    def push(self, item: T, read: Read | None = None) -> int:
        """Queue ``item`` behind the others; return how many old items were dropped (0/1)."""
        dropped = 0
        if len(self._items) >= self.capacity:
            self._items.popleft()
            dropped = 1
            self.dropped += 1
        self._items.append((item, read))
        return dropped

    def pop_ready(self) -> list[tuple[T, list[tuple[Hashable, Any]] | None]]:
        """Remove and return the items at the front whose reads have completed."""
        out: list[tuple[T, list[tuple[Hashable, Any]] | None]] = []
        items = self._items
        while items:
            item, read = items[0]
            values = None
            if read is not None:
                try:
                    if not read.query():
                        break
                    values = read.values()
                except Exception:  # a device error: the values are lost, the item is not
                    self.failed += 1
                    values = _lost(read)
            items.popleft()
            out.append((item, values))
        return out

    def drain(
        self, timeout: float = DRAIN_TIMEOUT_S, poll: float = 0.001
    ) -> list[tuple[T, list[tuple[Hashable, Any]] | None]]:
        """Wait (polling, at most ``timeout`` s) for every read; return all items in order.

        Reads still in flight at the deadline count in ``failed`` and give ``None`` values.
        For close: it never waits forever on a device that hangs.
        """
        out = self.pop_ready()
        deadline = self._clock() + timeout
        while self._items and self._clock() < deadline:
            time.sleep(poll)
            out += self.pop_ready()
        while self._items:
            item, read = self._items.popleft()
            if read is not None:
                self.failed += 1
            out.append((item, None if read is None else _lost(read)))
        return out


def _lost(read: Read) -> list[tuple[Hashable, Any]]:
    try:
        return [(key, None) for key in read.keys()]
    except Exception:
        return []
