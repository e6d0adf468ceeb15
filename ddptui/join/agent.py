"""The work of a ``ddptui join`` node: its ranks under torchrun, their telemetry relayed to
node 0, the run's outcome followed (a failure anywhere ends this node too)."""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from ddptui import protocol
from ddptui.join.channel import LOST_AFTER_S, STATUS_EVERY_S, Channel
from ddptui.monitor import SystemMonitor
from ddptui.monitor.snapshot import is_na
from ddptui.rank.flight_recorder import SOCKET_DIR_ENV
from ddptui.run import flight
from ddptui.run.cluster.addresses import route_address, split_endpoint
from ddptui.run.collector import Collector
from ddptui.run.launcher import Launcher, LaunchResult, Rendezvous
from ddptui.run.options import RunConfig
from ddptui.run.rundir import EXIT_CODES
from ddptui.run.session import make_launcher
from ddptui.run.signals import Interrupted, signals_deferred, signals_interrupt
from ddptui.run.state import RankFailureInfo
from ddptui.runfiles import trace_name, write_json_atomic

#: After the ranks end, keep relaying this long for events still in flight.
DRAIN_S = 0.5
#: How often the node's system (host load, GPUs) is sampled and sent to node 0.
SAMPLE_EVERY_S = 2.0
#: How long this node's ranks have to write their traces, and node 0 to take each.
TRACE_TIMEOUT_S = 5.0
#: Once node 0 says the run finished, how long this node's torchrun has to exit by itself:
#: every rank has ended, and its agent is past torchrun's exit barrier or about to be.
FINISHED_GRACE_S = 10.0


def _value(value: object) -> object:
    """A monitor value, None where it is not available (``NA``)."""
    return None if is_na(value) else value


def node_sample(snapshot, run_id: str, slot: int, host: str, seq: int) -> protocol.NodeSample:
    """The bounded, wire-safe form of a monitor snapshot."""
    gpus = [
        protocol.GpuSample(
            index=gpu.index,
            name=str(_value(gpu.name))[:128] if _value(gpu.name) is not None else None,
            util=_float(_value(gpu.utilization_gpu)),
            mem_used=_value(gpu.memory_used),
            mem_total=_value(gpu.memory_total),
            temp=_value(gpu.temperature),
            power=_float(_value(gpu.power_draw)),
        )
        for gpu in snapshot.gpus[: protocol.MAX_NODE_GPUS]
    ]
    load = _value(snapshot.host.load_average)
    return protocol.NodeSample(
        run=run_id,
        rank=0,
        t=snapshot.time,
        seq=seq,
        node=slot,
        host=host[:128],
        cpu_percent=_float(_value(snapshot.host.cpu_percent)),
        load1=float(load[0]) if load is not None else None,
        mem_used=snapshot.host.memory_used,
        mem_total=snapshot.host.memory_total,
        gpus=gpus,
        gpu_reason=(snapshot.gpu.reason or None) and str(snapshot.gpu.reason)[:200],
    )


def _float(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) else None


class NodeAgent:
    def __init__(
        self,
        cfg: RunConfig,
        slot: int,
        channel: Channel,
        telemetry: str,
        host: str,
        is_host: bool = False,
    ) -> None:
        self.cfg = cfg
        self.slot = slot
        self.channel = channel
        self.telemetry = telemetry
        self.host = host
        self.is_host = is_host
        self.relayed = 0
        self.dropped = 0
        self.node0_outcome: str | None = None
        self.node0_failure: str | None = None
        self._monitor = None
        self._samples = 0
        self._next_sample = 0.0
        #: The private directory of this node's ranks' trace sockets (None: recorder off).
        self.fr_dir: Path | None = None
        self._traces_sent = 0  # the last trace request of node 0's answered

    def describe(self, failure: RankFailureInfo) -> str:
        """``node K (host H): rank R was killed by signal SIGKILL`` (the rank's global number)."""
        return f"node {self.slot} (host {self.host}): {failure.describe()}"

    def run(self, out: TextIO) -> int:
        """Run this node's ranks to the run's end; the exit code for ``ddptui join``."""
        try:
            return self._run(out)
        finally:  # kept until the end: node 0 may ask for the traces after the ranks ended
            flight.remove_socket_dir(self.fr_dir)
            self.fr_dir = None

    def _run(self, out: TextIO) -> int:
        cfg = self.cfg

        def say(text: str) -> None:
            out.write(f"ddptui join: {text}\n")
            out.flush()

        assert cfg.run_dir is not None and cfg.rdzv_endpoint is not None
        Path(cfg.run_dir).mkdir(parents=True, exist_ok=True)
        write_json_atomic(Path(cfg.run_dir) / "config.json", cfg.to_json_dict())
        collector = Collector(cfg.run_id, world_size=cfg.world_size)
        self.channel.open_telemetry(self.telemetry)
        rendezvous = Rendezvous(
            cfg.nnodes,
            self.slot,
            cfg.rdzv_endpoint,
            cfg.run_id,
            is_host=self.is_host,
            local_addr=route_address(split_endpoint(cfg.rdzv_endpoint)[0]),
        )
        launcher = make_launcher(cfg, collector.endpoint, rendezvous=rendezvous)
        if cfg.flight_recorder:
            try:
                self.fr_dir = flight.make_socket_dir()
                launcher.extra_env[SOCKET_DIR_ENV] = str(self.fr_dir)
            except OSError:
                self.fr_dir = None  # the run goes on; node 0 names hangs without these traces
        say(
            f"node {self.slot} of run {cfg.run_id}: {cfg.nproc_per_node} rank(s) of "
            f"{cfg.world_size} under torchrun (c10d {cfg.rdzv_endpoint}) -> {cfg.run_dir}"
        )
        result: LaunchResult | None = None
        code: int | None = None
        with signals_interrupt() as guard:
            try:
                with signals_deferred():
                    launcher.start()
                result = self._follow(launcher, collector)
            except Interrupted as exc:
                say(f"interrupted ({exc}): stopping this node's ranks")
                result = launcher.stop()
                code = 128 + exc.signum
            finally:
                guard.armed = False
                if result is None:
                    result = launcher.stop()
                self._relay(collector, DRAIN_S)
                collector.close()
                self.close()
        if code is not None:
            return code
        return self._conclude(result, say)

    def _conclude(self, result: LaunchResult, say: Callable[[str], None]) -> int:
        """How this node ended, said and as ``ddptui join``'s exit code, from its launcher's
        ``result`` and what node 0 said of the run."""
        failure = result.failure
        if not result.ok and (failure is None or failure.signal is None):
            self._await_verdict()  # a rank here may only have lost its peer elsewhere
        if self.node0_outcome is not None and self.node0_outcome != "finished":
            say(f"the run ended {self.node0_outcome}: {self.node0_failure or 'on another node'}")
            return EXIT_CODES.get(self.node0_outcome, 1)
        # Stopped by this agent once node 0 said every rank finished (its torchrun slower to
        # exit than the grace): the node finished. It said "FAILED: ... exited with code -15"
        # and exited 1 when node 0's answer came as this node's torchrun was on its way out.
        stopped_finished = self.node0_outcome == "finished" and result.stopped
        if (result.failure is not None or not result.ok) and not (
            stopped_finished and result.failure is None
        ):
            failure = result.failure or RankFailureInfo(rank=None, exit_code=result.exit_code)
            line = self.describe(failure)
            self._report_failure(failure, line)
            say(f"FAILED: {line}")
            return 1
        say(f"node {self.slot} finished: {self.relayed} events relayed ({self.dropped} dropped)")
        return 0

    def _follow(self, launcher: Launcher, collector: Collector) -> LaunchResult:
        """Relay until the ranks end, or node 0 says the run has ended (then stop them)."""
        next_status = 0.0
        heard_at = time.monotonic()
        while True:
            result = launcher.poll()
            if result is not None:
                return result
            self._relay(collector, 0.1)
            now = time.monotonic()
            answer = self.channel.answer()
            if answer is not None and answer.get("ok"):
                heard_at = now
                self._send_traces(answer.get("traces"))
                outcome = answer.get("outcome")
                if isinstance(outcome, str):
                    self.node0_outcome = outcome[:32]
                    failure = answer.get("failure")
                    self.node0_failure = str(failure)[:500] if failure else None
                    if self.node0_outcome == "finished":
                        ended = self._await_exit(launcher, collector, FINISHED_GRACE_S)
                        if ended is not None:
                            return ended
                    return launcher.stop()
            if now >= next_status:
                next_status = now + STATUS_EVERY_S
                self.channel.ask_later({"op": "status", "v": 1, "node": self.slot})
            if now >= self._next_sample:
                self._next_sample = now + SAMPLE_EVERY_S
                self._send_sample()
            if now - heard_at > LOST_AFTER_S:
                self.node0_outcome = "failed"
                self.node0_failure = f"node 0 has not answered for {LOST_AFTER_S:.0f} s"
                return launcher.stop()

    def _await_exit(
        self, launcher: Launcher, collector: Collector, seconds: float
    ) -> LaunchResult | None:
        """The launcher's result once it exits by itself within ``seconds`` (relaying what
        its ranks still send meanwhile), else None."""
        deadline = time.monotonic() + seconds
        while True:
            result = launcher.poll()
            if result is not None or time.monotonic() >= deadline:
                return result
            self._relay(collector, 0.1)

    def _send_traces(self, ask: object) -> None:
        """Node 0 asked for the Flight Recorder traces (request ``ask``, newer than the last
        one answered): ask this node's ranks for theirs (their sockets in :attr:`fr_dir`) and
        send each to node 0, compressed, over the authenticated channel."""
        if not isinstance(ask, int) or ask <= self._traces_sent or self.fr_dir is None:
            return
        self._traces_sent = ask
        assert self.cfg.run_dir is not None
        ranks = [int(p.stem) for p in self.fr_dir.glob("*.sock") if p.stem.isdigit()]
        flight.request_traces(self.fr_dir, ranks, TRACE_TIMEOUT_S)
        # every trace there: fresh ones, and those a rank left when it failed (node 0 keeps
        # only the ones written by the processes it knows)
        for rank in sorted(ranks):
            path = Path(self.cfg.run_dir) / trace_name(rank)
            try:
                data = zlib.compress(path.read_bytes()[: flight.MAX_TRACE_BYTES])
            except OSError:
                continue
            request = {"op": "trace", "v": 1, "node": self.slot, "ask": ask, "rank": rank}
            self.channel.ask({**request, "trace": data}, TRACE_TIMEOUT_S)

    def _await_verdict(self, seconds: float = 3.0) -> None:
        """Ask node 0 how the run stands for up to ``seconds`` (until it has an outcome)."""
        deadline = time.monotonic() + seconds
        while self.node0_outcome is None and time.monotonic() < deadline:
            self.channel.ask_later({"op": "status", "v": 1, "node": self.slot})
            answer = self.channel.answer(give_up_after=1.0)
            if answer is not None:
                self._send_traces(answer.get("traces"))  # node 0 names the crash with them
            if answer is not None and isinstance(answer.get("outcome"), str):
                self.node0_outcome = answer["outcome"][:32]
                failure = answer.get("failure")
                self.node0_failure = str(failure)[:500] if failure else None
                return
            time.sleep(0.05)

    def _send_sample(self) -> None:
        """This node's host load and GPUs, to node 0 (never fatal: it is only a view)."""
        try:
            if self._monitor is None:
                self._monitor = SystemMonitor(pcie=False)
            snapshot = self._monitor.sample()
            sample = node_sample(snapshot, self.cfg.run_id, self.slot, self.host, self._samples)
        except Exception:  # a monitor that cannot sample: the run goes on without it
            return
        self._samples += 1
        if protocol.implausible(sample) is None:
            self.channel.send([sample])

    def close(self) -> None:
        if self._monitor is not None:
            try:
                self._monitor.close()
            except Exception:
                pass
            self._monitor = None

    def _relay(self, collector: Collector, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            events = collector.poll(min(0.1, max(0.0, deadline - time.monotonic())))
            if events:
                self.dropped += self.channel.send(events)
                self.relayed += len(events)
            if time.monotonic() >= deadline or (not events and timeout <= 0.1):
                return

    def _report_failure(self, failure: RankFailureInfo, line: str) -> None:
        """Tell node 0 which rank failed here and how (a SIGKILLed rank cannot say it)."""
        rank = failure.rank
        if rank is None or not 0 <= rank < self.cfg.world_size:
            rank = self.slot * self.cfg.nproc_per_node if self.slot < self.cfg.nnodes else 0
        event = protocol.Status(
            run=self.cfg.run_id,
            rank=rank,
            t=time.time(),
            seq=0,  # not the rank's own sequence: 0 is never counted as a gap
            state="failed",
            host=self.host,
            error=line[: protocol.MAX_ERROR_CHARS],
        )
        self.channel.send([event])
