"""Node 0's side of a multi-node run: the run's CURVE keys, the ZAP authenticator that admits
only the run's client key, the telemetry inbox (a CURVE PULL collector on the interface the
other nodes reach) and the join service (a CURVE REP socket answered by a thread).

The join service hands a node its configuration and its node slot, refuses a node that comes
late, twice, or after the run has ended, and answers the agents' status polls (so an agent
tears its node down when the run failed elsewhere). A peer without the run's client key never
completes the CURVE handshake: nothing it sends reaches the collector or ``events.jsonl``.
"""

from __future__ import annotations

import logging
import threading
import time
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import zmq
from zmq.auth.thread import ThreadAuthenticator

from ddptui.run import flight
from ddptui.run.cluster.addresses import join_endpoint
from ddptui.run.cluster.token import JoinToken, RunKeys
from ddptui.run.collector import Collector
from ddptui.run.options import RunConfig
from ddptui.runfiles import trace_name, write_json_atomic

ZAP_DOMAIN = "ddptui"
#: Largest join request read (bytes); libzmq drops a peer that sends more. A rank's Flight
#: Recorder trace, compressed, is the largest (a few hundred KB for 2,000 entries).
MAX_REQUEST_BYTES = 8 * 1024 * 1024
PROTOCOL = 1
#: An agent that has not polled for this long has ended (it polls every 0.5 s): no trace
#: request waits for it.
AGENT_GONE_S = 2.0
#: How long node 0 waits at its end for the agents still polling to learn the outcome.
LINGER_S = 3.0


class JoinRequest(msgspec.Struct, forbid_unknown_fields=True):
    op: str
    v: int = PROTOCOL
    node: int | None = None
    host: str | None = None
    #: ``trace``: which trace request it answers, the rank, its trace (zlib-compressed JSON)
    ask: int | None = None
    rank: int | None = None
    trace: bytes | None = None


@dataclass
class NodeInfo:
    slot: int
    host: str


@dataclass
class JoinBook:
    """Who joined, and how the run stands (read by the service thread, written by the session)."""

    slots: tuple[int, ...]
    joined: dict[int, NodeInfo] = field(default_factory=dict)
    #: Slots whose agent has been told the outcome (node 0 waits a moment for the others).
    told: set[int] = field(default_factory=set)
    outcome: str | None = None
    failure: str | None = None
    #: The latest Flight Recorder trace request (0: none yet); every status answer says it.
    trace_ask: int = 0
    #: rank -> the trace request its node last answered for it.
    traced: dict[int, int] = field(default_factory=dict)
    #: slot -> when its agent last asked for the run's status (monotonic): still there?
    polled: dict[int, float] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def polling(self, now: float) -> set[int]:
        """With the lock held: the slots whose agent polled within :data:`AGENT_GONE_S`
        (joining counts as a poll); the others' nodes have ended."""
        return {slot for slot, at in self.polled.items() if now - at < AGENT_GONE_S}

    def join(self, slot: int | None, host: str) -> tuple[int | None, str | None]:
        """(slot, None) for an admitted node, (None, why) otherwise."""
        with self.lock:
            if self.outcome is not None:
                return None, f"the run has ended ({self.outcome}): it takes no more nodes"
            free = [s for s in self.slots if s not in self.joined]
            if slot is None:
                if not free:
                    return None, (
                        f"too late: all {len(self.slots)} node(s) this run waits for have "
                        "joined already"
                    )
                slot = free[0]
            elif slot not in self.slots:
                return None, f"node {slot} is not a node this run waits for ({_span(self.slots)})"
            elif slot in self.joined:
                return None, (
                    f"node {slot} has joined already (from {self.joined[slot].host}): a node "
                    "joins once"
                )
            self.joined[slot] = NodeInfo(slot, host)
            self.polled[slot] = time.monotonic()  # joining is its first sign of life
            return slot, None


def _span(slots: tuple[int, ...]) -> str:
    return f"nodes {slots[0]}-{slots[-1]}" if len(slots) > 1 else f"node {slots[0]}"


#: How long closing waits for the join service's thread to see it is stopped (it polls every
#: 0.1 s; a request it is answering finishes first).
SERVE_STOP_S = 10.0


class NodeHost:
    """Owns the run's keys, the authenticator, the inbox and the join service."""

    def __init__(self, cfg: RunConfig, world_size: int | None = None) -> None:
        if not cfg.bind:
            raise ValueError("a multi-node RunConfig has a bind address")
        self.cfg = cfg
        self.keys = RunKeys.generate()
        slots = range(cfg.nnodes) if cfg.launcher == "slurm" else range(1, cfg.nnodes)
        self.book = JoinBook(tuple(slots))
        self.context = zmq.Context()
        self.auth: ThreadAuthenticator | None = None
        self.inbox: Collector | None = None
        self._service: zmq.Socket | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._shown: set[int] = set()
        try:
            quiet = logging.getLogger("ddptui.zap")
            quiet.addHandler(logging.NullHandler())
            quiet.propagate = False
            self.auth = ThreadAuthenticator(self.context, log=quiet)
            self.auth.start()
            self.auth.configure_curve_callback(ZAP_DOMAIN, credentials_provider=self)
            self.inbox = Collector(
                cfg.run_id,
                world_size=world_size or cfg.world_size,
                transport="tcp",
                host=cfg.bind,
                curve_secret=self.keys.server_secret,
                context=self.context,
            )
            self._service = self._curve_socket(zmq.REP)
            self._service.bind(f"tcp://{_zmq_host(cfg.bind)}:0")
            self.service_port = int(
                self._service.getsockopt_string(zmq.LAST_ENDPOINT).rpartition(":")[2]
            )
            self.telemetry_endpoint = self.inbox.endpoint
        except BaseException:
            self.close()
            raise
        self._thread = threading.Thread(target=self._serve, name="ddptui-join", daemon=True)
        self._thread.start()

    # -- ZAP: the credentials provider -----------------------------------------------------
    def callback(self, domain: str, key: bytes) -> bool:
        return domain == ZAP_DOMAIN and key == self.keys.client_public

    def _curve_socket(self, kind: int) -> zmq.Socket:
        sock = self.context.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, MAX_REQUEST_BYTES)
        sock.curve_server = True
        sock.curve_secretkey = self.keys.server_secret
        sock.zap_domain = ZAP_DOMAIN.encode()
        return sock

    # -- what node 0 prints ------------------------------------------------------------------
    def token(self) -> JoinToken:
        assert self.cfg.bind is not None
        return JoinToken(
            join_endpoint(self.cfg.bind, self.service_port),
            self.keys.server_public,
            self.keys.client_secret,
        )

    def join_line(self) -> str:
        """The exact command every other node runs."""
        return f"ddptui join {self.token().encode()}"

    # -- the service thread --------------------------------------------------------------------
    def _serve(self) -> None:
        assert self._service is not None
        poller = zmq.Poller()
        poller.register(self._service, zmq.POLLIN)
        decode = msgspec.json.Decoder(JoinRequest).decode
        while not self._stop.is_set():
            try:
                if not poller.poll(100):
                    continue
                data = self._service.recv(zmq.NOBLOCK)
            except zmq.Again:
                continue
            except zmq.ZMQError:
                return  # closed
            try:
                reply = self._answer(decode(data))
            except (msgspec.DecodeError, msgspec.ValidationError):
                reply = {"ok": False, "error": "not a ddptui join request"}
            try:
                self._service.send(msgspec.json.encode(reply))
            except zmq.ZMQError:
                return

    def _answer(self, request: JoinRequest) -> dict:
        if request.v != PROTOCOL:
            return {"ok": False, "error": f"join protocol {request.v}: this ddptui speaks 1"}
        host = (request.host or "?")[:128]
        if request.op == "status":
            with self.book.lock:
                if self.book.outcome is not None and request.node is not None:
                    self.book.told.add(request.node)
                if request.node in self.book.joined:
                    self.book.polled[request.node] = time.monotonic()
                return {
                    "ok": True,
                    "outcome": self.book.outcome,
                    "failure": self.book.failure,
                    "traces": self.book.trace_ask,
                }
        if request.op == "trace":
            return self._take_trace(request)
        if request.op != "join":
            return {"ok": False, "error": f"unknown request {request.op[:20]!r}"}
        if request.node is not None and not 0 <= request.node < 1_000_000:
            return {"ok": False, "error": f"node {request.node} is not a node rank"}
        slot, why = self.book.join(request.node, host)
        if slot is None:
            return {"ok": False, "error": why}
        config = self.cfg.to_json_dict()
        return {
            "ok": True,
            "node": slot,
            "config": config,
            "telemetry": self.telemetry_endpoint,
        }

    def _take_trace(self, request: JoinRequest) -> dict:
        """A joined node's answer to a trace request: one rank's trace, checked like a local
        one (:func:`ddptui.run.flight.parse_trace`) and written as ``fr-rank-N.json`` into
        node 0's run directory, where the analysis reads every rank's."""
        with self.book.lock:
            joined = request.node in self.book.joined
        rank, data = request.rank, request.trace
        if not joined or rank is None or data is None or request.ask is None:
            return {"ok": False, "error": "a trace from a node that has not joined, or no trace"}
        if not 0 <= rank < self.cfg.world_size:
            return {"ok": False, "error": f"rank {rank} is not a rank of this run"}
        try:
            inflate = zlib.decompressobj()
            text = inflate.decompress(data, flight.MAX_TRACE_BYTES)
            if inflate.unconsumed_tail:
                raise flight.TraceError(f"larger than {flight.MAX_TRACE_BYTES} bytes")
            doc = flight.parse_trace(text)
            if doc["rank"] != rank:
                raise flight.TraceError(f"written by rank {doc['rank']}")
            assert self.cfg.run_dir is not None
            write_json_atomic(Path(self.cfg.run_dir) / trace_name(rank), doc)
        except (zlib.error, flight.TraceError, OSError) as exc:
            return {"ok": False, "error": f"rank {rank}'s trace: {exc}"[:300]}
        with self.book.lock:
            self.book.traced[rank] = request.ask
        return {"ok": True}

    # -- the session's side ----------------------------------------------------------------------
    def fetch_traces(self, ranks: Iterable[int], timeout: float) -> dict[int, str]:
        """Ask every joined node for the Flight Recorder traces of its ranks (its agent asks
        them at its next status poll and sends each back, see :meth:`_take_trace`); wait up
        to ``timeout`` seconds. rank -> ``ok`` (``fr-rank-N.json`` is in the run directory)
        or why not."""
        ranks = sorted(set(ranks))
        with self.book.lock:
            self.book.trace_ask += 1
            ask = self.book.trace_ask
        deadline = time.monotonic() + timeout
        while True:
            now = time.monotonic()
            with self.book.lock:
                done = {r for r in ranks if self.book.traced.get(r) == ask}
                # an agent that stopped polling (its node has ended) sends nothing more
                there = bool(self.book.polling(now))
            if len(done) == len(ranks) or now >= deadline or not there:
                break
            time.sleep(0.05)
        return {r: "ok" if r in done else f"no trace from its node in {timeout:g} s" for r in ranks}

    def _agents_to_tell(self) -> set[int]:
        """The joined agents that have not been told the outcome and still poll (none before
        the run has an outcome)."""
        now = time.monotonic()
        with self.book.lock:
            if self.book.outcome is None:
                return set()
            return self.book.polling(now) - self.book.told

    def new_joins(self) -> list[NodeInfo]:
        """The nodes that joined since the last call (for the console and the dashboard)."""
        with self.book.lock:
            fresh = [info for slot, info in self.book.joined.items() if slot not in self._shown]
            self._shown.update(info.slot for info in fresh)
        return fresh

    def set_outcome(self, outcome: str, failure: str | None) -> None:
        with self.book.lock:
            self.book.outcome = outcome
            self.book.failure = failure

    def close(self, linger: float = LINGER_S) -> None:
        """Close everything; once the run has an outcome, first wait up to ``linger`` seconds
        until every joined agent still polling has asked for it (so each tears its node down
        at once). An agent whose node ended on its own stopped polling: it is not waited for
        (it cost every finished multi-node run the whole ``linger``)."""
        deadline = time.monotonic() + linger
        while self._thread is not None and time.monotonic() < deadline:
            if not self._agents_to_tell():
                break
            time.sleep(0.05)
        self._stop.set()
        thread, self._thread = self._thread, None
        busy = False
        if thread is not None:
            thread.join(timeout=SERVE_STOP_S)
            busy = thread.is_alive()
        if self._service is not None and not busy:
            self._service.close(linger=0)
            self._service = None
        if self.inbox is not None:
            self.inbox.close()
            self.inbox = None
        if self.auth is not None:
            self.auth.stop()
            self.auth = None
        if busy:
            # Still answering (on a machine so loaded that its thread has not run for
            # seconds): its socket is its own, as a ZeroMQ socket is used by one thread only,
            # and closing it from here under it is a use from two threads at once. It and the
            # context (whose ``term`` would wait for that socket) are left to the process's
            # exit; the thread, a daemon, ends with it.
            return
        if not self.context.closed:
            self.context.term()


def _zmq_host(address: str) -> str:
    return f"[{address}]" if ":" in address else address
