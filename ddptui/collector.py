"""The ddptui side of telemetry: one PULL socket, validated events out.

Bound to 127.0.0.1 on a free port by default. Every message (a batch of events) is
size-capped and decoded against the schema; malformed and oversized messages and foreign
events (another run id) are counted and ignored — they never stop the collector.
"""

from __future__ import annotations

from dataclasses import dataclass

import zmq

from ddptui import protocol

#: libzmq drops a peer that sends more than this, before it reaches us (memory safety);
#: anything between MAX_MESSAGE_BYTES and this is received and counted as oversized.
_SOCKET_MAX_BYTES = 4 * protocol.MAX_MESSAGE_BYTES


@dataclass
class CollectorStats:
    received: int = 0
    malformed: int = 0
    foreign: int = 0
    oversized: int = 0

    @property
    def rejected(self) -> int:
        return self.malformed + self.foreign + self.oversized


class Collector:
    """PULL socket owned by ddptui. ``endpoint`` goes to the ranks as ``DDPTUI_ENDPOINT``."""

    def __init__(
        self,
        run_id: str,
        host: str = "127.0.0.1",
        port: int = 0,
        max_batch: int = 10_000,
        receive_hwm: int = 100_000,
    ) -> None:
        self.run_id = run_id
        self.max_batch = max_batch
        self.stats = CollectorStats()
        self._context = zmq.Context()
        self._socket = self._context.socket(zmq.PULL)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.setsockopt(zmq.RCVHWM, receive_hwm)
        self._socket.setsockopt(zmq.MAXMSGSIZE, _SOCKET_MAX_BYTES)
        if port:
            self._socket.bind(f"tcp://{host}:{port}")
        else:
            self._socket.bind(f"tcp://{host}:0")
        self.endpoint: str = self._socket.getsockopt_string(zmq.LAST_ENDPOINT)
        self._poller = zmq.Poller()
        self._poller.register(self._socket, zmq.POLLIN)

    def poll(self, timeout: float = 0.1) -> list[protocol.AnyEvent]:
        """Return what has arrived, waiting up to ``timeout`` seconds when nothing has."""
        events: list[protocol.AnyEvent] = []
        # The hot loop of ingest: names bound locally, no poll while messages are queued.
        recv, noblock, again = self._socket.recv, zmq.NOBLOCK, zmq.Again
        decode, invalid = protocol.decode_batch, protocol.InvalidEvent
        limit, run_id, stats = protocol.MAX_MESSAGE_BYTES, self.run_id, self.stats
        waited = False
        for _ in range(self.max_batch):
            try:
                data = recv(noblock)
            except again:
                if waited or events or not self._poller.poll(int(timeout * 1000)):
                    break
                waited = True
                continue
            if len(data) > limit:
                stats.oversized += 1
                continue
            try:
                batch = decode(data)
            except invalid:
                stats.malformed += 1
                continue
            for event in batch:
                if event.run == run_id:
                    events.append(event)
                else:
                    stats.foreign += 1
        stats.received += len(events)
        return events

    def close(self) -> None:
        if not self._socket.closed:
            self._socket.close(linger=0)
        self._context.term()

    def __enter__(self) -> Collector:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
