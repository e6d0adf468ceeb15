"""A join node's line to node 0: CURVE client sockets (REQ for the join request and the run's
status, PUSH for this node's telemetry), authenticated with the join token's keys."""

from __future__ import annotations

import time
from typing import Any

import msgspec
import zmq

from ddptui import protocol
from ddptui.run.cluster.token import JoinToken

#: How often the agent asks node 0 how the run stands (and whether it wants the ranks' traces:
#: a hang verdict waits for this poll).
STATUS_EVERY_S = 0.5

#: Node 0 unreachable this long (after it answered once): the run is over there.
LOST_AFTER_S = 20.0

MAX_REPLY_BYTES = 1024 * 1024


class Channel:
    """The CURVE client sockets to node 0: REQ for join/status, PUSH for telemetry."""

    def __init__(self, token: JoinToken) -> None:
        self.token = token
        self.context = zmq.Context()
        self._req: zmq.Socket | None = None
        self._pending_since: float | None = None
        self.push: zmq.Socket | None = None

    def _secure(self, sock: zmq.Socket) -> zmq.Socket:
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, MAX_REPLY_BYTES)
        sock.curve_serverkey = self.token.server_public
        sock.curve_publickey = self.token.client_public
        sock.curve_secretkey = self.token.client_secret
        return sock

    def _new_req(self) -> zmq.Socket:
        if self._req is not None:
            self._req.close(linger=0)
        self._req = self._secure(self.context.socket(zmq.REQ))
        self._req.connect(f"tcp://{self.token.endpoint}")  # HOST:PORT or [V6]:PORT
        self._pending_since = None
        return self._req

    def ask(self, request: dict[str, Any], timeout: float) -> dict | None:
        """Send ``request`` and wait for the answer (None: no answer in time)."""
        sock = self._new_req()
        sock.send(msgspec.json.encode(request))
        if not sock.poll(int(timeout * 1000)):
            self._new_req()
            return None
        return _reply(sock.recv())

    def ask_later(self, request: dict[str, Any]) -> None:
        """Send ``request`` without waiting; :meth:`answer` picks the reply up."""
        if self._pending_since is not None:
            return
        sock = self._req or self._new_req()
        sock.send(msgspec.json.encode(request))
        self._pending_since = time.monotonic()

    def answer(self, give_up_after: float = 5.0) -> dict | None:
        if self._req is None or self._pending_since is None:
            return None
        if self._req.poll(0):
            self._pending_since = None
            return _reply(self._req.recv())
        if time.monotonic() - self._pending_since > give_up_after:
            self._new_req()  # a REQ socket cannot send again before it has an answer
        return None

    def open_telemetry(self, endpoint: str) -> None:
        push = self._secure(self.context.socket(zmq.PUSH))
        push.setsockopt(zmq.SNDHWM, 1_000)
        push.setsockopt(zmq.LINGER, 3_000)
        push.connect(endpoint)
        self.push = push

    def send(self, events: list[protocol.AnyEvent]) -> int:
        """Relay ``events`` (in batches the collector accepts); how many were dropped."""
        dropped = 0
        if self.push is None:
            return len(events)
        for start in range(0, len(events), protocol.MAX_BATCH_EVENTS):
            batch = events[start : start + protocol.MAX_BATCH_EVENTS]
            try:
                self.push.send(protocol.encode_batch(batch), zmq.DONTWAIT)
            except zmq.Again:
                dropped += len(batch)
        return dropped

    def close(self) -> None:
        if self._req is not None:
            self._req.close(linger=0)
        if self.push is not None:
            self.push.close()  # LINGER: the last events get their chance
        self.context.term()


def _reply(data: bytes) -> dict | None:
    try:
        value = msgspec.json.decode(data)
    except msgspec.DecodeError:
        return None
    return value if isinstance(value, dict) else None
