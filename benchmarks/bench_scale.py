"""Dashboard cost at scale: 256 ranks on 32 nodes, 10 step events/s each (2,560 events/s).

The dashboard is node 0 of a multi-node run, as ``ddptui --nnodes 32`` makes it: its join
service and its CURVE inbox are up, and simulated senders (a few processes) send over the
real telemetry paths. Node 0's own ranks send straight to the dashboard's Collector (ZeroMQ
PUSH, a step to a message, as a rank's reporter sends at 10 steps a second); every other
node joins as its ``ddptui join`` agent does (the join service, with the run's token) and
sends its ranks' events over its own CURVE connection as its agent relays them (each as it
comes; ``--relay-every S``: gathered into one message every S seconds, each node's sends
spread over the interval), asks node 0 how the run stands every 0.5 s and sends its system
sample every 2 s. Then on:
events.jsonl → RunState → the screen. ``--direct`` makes every rank send straight to the
dashboard instead (the bench's only way before: no node agents, no CURVE). Each rank's
``started`` Status names its host ``node-K`` and its node rank ``K`` (8 ranks per node), as
a multi-node run's ranks do, and a pid: node 0's ranks a live one (the sender's), the other
nodes' a pid no process here has (another machine's pid means nothing on this one). The
dashboard runs in a pseudo-terminal (120x40) exactly as
``ddptui --start`` would, except that the senders replace the launcher (the method of
``bench_tui.py``). Each rank also sends a heartbeat (``beat``) every second, as a real rank's
heartbeat thread does, and each step its phases (data, forward, backward, comm, optimizer),
as the built-in trainers and the hooks do. Measured, over ``--repeat`` runs (3 by default;
the range is printed):

* CPU of the dashboard process (all threads: pump, monitor sampler, UI), % of one core: the
  process's CPU seconds (user + system) per second of the window, so that other load on the
  machine does not count;
* delay from an event's sending (its ``t``: by its rank, or for another node's rank by the
  simulated rank behind its agent) to the first refresh that shows it (on every fourth pump of
  events, :data:`DELAY_SAMPLE`: reading them costs the measured process): the time in its
  agent, in the socket and until the screen shows it;
* collector drops: per rank, events sent (by seq) against events received.

``--profile`` adds the CPU time spent in each of the screen's drawing calls, and every
thread's stack sampled from inside the process (a sample needs the GIL, so a busy thread is
seen only where it lets the GIL go: at 256 ranks it put the pump thread at its ``sleep``).
``--py-spy`` says where the CPU goes instead: py-spy samples the dashboard from outside
during the measured window (``pyspy.py``; not with ``--profile``, whose sampler it would
see). ``BENCH_THREADS=1`` prints the CPU of each of the dashboard's threads.

Prints numbers; it is not a test. Usage::

    python benchmarks/bench_scale.py                          # 256 ranks x 10/s, 3 x 20 s
    python benchmarks/bench_scale.py --nodes 8 --seconds 10 --transport tcp
    python benchmarks/bench_scale.py --direct                 # no node agents
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import machine_ref  # noqa: E402
from bench_tui import (  # noqa: E402
    PY_SPY_HELP,
    WARMUP_S,
    _NullSampler,
    delays,
    print_ranges,
    run_child,
    run_figures,
    run_line,
    simulated_phases,
)

GOAL_CPU = 10.0
#: The event-to-screen delay is measured on every DELAY_SAMPLE-th pump of events.
DELAY_SAMPLE = 4
GOAL_P95_MS = 500.0


def simulated_step(rank: int, step: int, step_s: float) -> dict:
    """A simulated rank's step as the benchmarks make it (``bench_charts.py`` too): the ranks
    a little apart in step time, the loss falling and a little apart, 32 samples a step."""
    step_time = step_s * (1.0 + 0.001 * rank)
    return {
        "step": step,
        "epoch": 1 + step // 100,
        "loss": 2.0 / (1 + step / 100) + rank / 1000,
        "samples": 32,
        "samples_per_s": 32 / step_time,
        "step_time": step_time,
    }


def table_cell(step: int) -> tuple[int, int]:
    """(epoch, step in epoch) that the rank table shows once a simulated rank has sent every
    step up to ``step`` (:func:`simulated_step`'s epochs; the table counts the steps of each
    epoch from 1, as ``RunState`` does)."""
    epoch = 1 + step // 100
    first = max(1, 100 * (epoch - 1))  # the epoch's first step
    return epoch, step - first + 1


class SimRanks:
    """``count`` simulated ranks from ``first`` (``per_node`` to a node) of a run of ``world``
    ranks: the events each sends, step by step, with its own ``seq``."""

    def __init__(
        self, run_id: str, first: int, count: int, per_node: int, world: int, rate: float
    ) -> None:
        from ddptui.rank.heartbeat import BEAT_S

        self.run_id, self.per_node, self.world, self.rate = run_id, per_node, world, rate
        self.ranks = range(first, first + count)
        self.seq = dict.fromkeys(self.ranks, 0)
        self.ticks_per_beat = max(1, round(BEAT_S * rate))

    def _common(self, rank: int) -> dict:
        self.seq[rank] += 1
        return {"run": self.run_id, "rank": rank, "t": time.time(), "seq": self.seq[rank] - 1}

    def started(self) -> list:
        from ddptui import protocol

        return [
            protocol.Status(
                state="started",
                # Node 0's ranks run here (a live process); another node's pid means nothing
                # on this machine: one beyond the largest pid Linux gives (2**22).
                pid=os.getpid() if rank < self.per_node else (1 << 22) + 1 + rank,
                host=f"node-{rank // self.per_node}",
                local_rank=rank % self.per_node,
                world_size=self.world,
                device="cpu",
                node=rank // self.per_node,  # the node rank, as the multi-node engine adds it
                **self._common(rank),
            )
            for rank in self.ranks
        ]

    def step(self, step: int) -> list:
        """Every rank's events of its step ``step``: the step, and every second its beat."""
        from ddptui import protocol

        events = []
        for rank in self.ranks:
            fields = simulated_step(rank, step, 1 / self.rate)
            step_time = fields["step_time"]
            events.append(
                protocol.Step(
                    **fields,
                    phases=simulated_phases(step_time, 0.0001 * rank),
                    **self._common(rank),
                )
            )
            if (step + rank) % self.ticks_per_beat == 0:  # its beat, spread over the ticks
                events.append(
                    protocol.Beat(
                        frame="train_step (train.py:42)",
                        digest=f"{step:x}",  # the stack moves from step to step
                        cpu=time.process_time(),
                        steps=step,
                        wakes=step,  # the sampled thread's wakes (a real beat's count grows too)
                        **self._common(rank),
                    )
                )
        return events

    def finished(self) -> list:
        from ddptui import protocol

        return [protocol.Status(state="finished", **self._common(r)) for r in self.ranks]

    def steps(self, seconds: float):
        """The steps' numbers, each yielded when it is due (``rate`` a second, in lock-step:
        DDP), for ``seconds``."""
        start = time.monotonic()
        step = 0
        while True:
            step += 1
            delay = start + step / self.rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            if time.monotonic() - start > seconds:
                return
            yield step


def write_sent(out: str, sims: list[SimRanks]) -> None:
    """What each simulated rank sent (its last ``seq``), for the drop count."""
    sent = {str(r): n for sim in sims for r, n in sim.seq.items()}
    Path(out).write_text(json.dumps(sent))


# -- a sender: ``count`` simulated ranks from ``first``, each straight to the dashboard ----------
def send(
    endpoint: str,
    run_id: str,
    first: int,
    count: int,
    per_node: int,
    world: int,
    rate: float,
    seconds: float,
    out: str,
) -> None:
    import zmq

    from ddptui import protocol

    sock = zmq.Context().socket(zmq.PUSH)
    sock.setsockopt(zmq.LINGER, 5000)
    sock.setsockopt(zmq.SNDHWM, 100_000)
    sock.connect(endpoint)
    sim = SimRanks(run_id, first, count, per_node, world, rate)
    for event in sim.started():
        sock.send(protocol.encode_batch([event]))
    for step in sim.steps(seconds):
        for event in sim.step(step):
            sock.send(protocol.encode_batch([event]))  # a rank's reporter: a step a message
    for event in sim.finished():
        sock.send(protocol.encode_batch([event]))
    sock.close()
    write_sent(out, [sim])


# -- a relay: ``nodes`` simulated nodes from ``first_node``, as their ``ddptui join`` agents ------
def relay(
    run_id: str,
    first_node: int,
    nodes: int,
    per_node: int,
    world: int,
    rate: float,
    seconds: float,
    relay_every: float,
    out: str,
) -> None:
    """Nodes other than node 0, each as its ``ddptui join`` agent meets node 0: it joins over
    the join service (CURVE, the run's join token from ``BENCH_JOIN_TOKEN``), sends its ranks'
    events over its own authenticated connection (``Channel.send``) gathered every
    ``relay_every`` seconds (0: each by itself, as the agents relay them),
    asks node 0 how the run stands every ``STATUS_EVERY_S`` and sends its system sample every
    ``SAMPLE_EVERY_S``."""
    from ddptui import protocol
    from ddptui.join.agent import SAMPLE_EVERY_S
    from ddptui.join.channel import STATUS_EVERY_S, Channel
    from ddptui.run.cluster.token import JoinToken

    token = JoinToken.decode(os.environ["BENCH_JOIN_TOKEN"])
    sims, channels = [], []
    for node in range(first_node, first_node + nodes):
        channel = Channel(token)
        reply = channel.ask({"op": "join", "v": 1, "node": node, "host": f"node-{node}"}, 30)
        if not reply or not reply.get("ok"):
            raise SystemExit(f"node {node} could not join: {reply}")
        channel.open_telemetry(reply["telemetry"])
        sims.append(SimRanks(run_id, node * per_node, per_node, per_node, world, rate))
        channels.append(channel)
    gathered: list[list] = [sim.started() for sim in sims]
    began = time.monotonic()
    # Each agent sends every ``relay_every`` from when it started: the nodes' sends spread over
    # the interval (their agents started at different times), not in step with the ranks'.
    sends = [began + relay_every * (node + 1) / len(sims) for node in range(len(sims))]
    step, next_status, next_sample, samples = 0, began, began, 0
    while True:
        now = time.monotonic()
        if now - began > seconds:
            break
        if now >= began + (step + 1) / rate:  # the ranks' next step (lock-step: DDP)
            step += 1
            for node, sim in enumerate(sims):
                gathered[node] += sim.step(step)
        for node, channel in enumerate(channels):
            if relay_every <= 0:
                for event in gathered[node]:
                    channel.send([event])
                gathered[node] = []
            elif now >= sends[node]:
                sends[node] += relay_every
                if gathered[node]:
                    channel.send(gathered[node])
                    gathered[node] = []
        if now >= next_sample:
            next_sample += SAMPLE_EVERY_S
            samples += 1
            for node, channel in enumerate(channels):
                sample = protocol.NodeSample(
                    run=run_id, rank=0, t=time.time(), seq=samples, node=first_node + node,
                    host=f"node-{first_node + node}", cpu_percent=50.0, load1=8.0,
                    mem_used=1 << 34, mem_total=1 << 36, gpu_reason="a simulated node",
                )  # fmt: skip
                channel.send([sample])
        if now >= next_status:
            next_status += STATUS_EVERY_S
            for node, channel in enumerate(channels):
                channel.answer()
                channel.ask_later({"op": "status", "v": 1, "node": first_node + node})
        due = [began + (step + 1) / rate, next_status, next_sample]
        if relay_every > 0:
            due.append(min(sends))
        time.sleep(max(0.0, min(due) - time.monotonic()))
    for node, (sim, channel) in enumerate(zip(sims, channels, strict=True)):
        channel.send(gathered[node] + sim.finished())
        channel.close()
    write_sent(out, sims)


# -- where the dashboard's time goes -------------------------------------------------------------
class StackSampler:
    """Every thread's Python stack, sampled ``hz`` times a second (``--profile``): cheap
    enough not to distort what it measures (unlike a tracing profiler, which multiplies the
    cost of small calls), and it sees the pump thread as well as the UI."""

    #: A thread whose innermost frame is one of these waits (it costs no CPU).
    IDLE = {"select", "poll", "wait", "sleep", "_wait_for_tstate_lock", "_worker"}

    def __init__(self, hz: float = 200.0, depth: int = 12) -> None:
        import collections
        import threading

        self.interval = 1 / hz
        self.depth = depth
        self.own: collections.Counter = collections.Counter()
        self.cumulative: collections.Counter = collections.Counter()
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        import threading

        me, main = threading.get_ident(), threading.main_thread().ident
        while not self._stop.wait(self.interval):
            self.samples += 1
            for ident, frame in sys._current_frames().items():
                if ident == me or frame.f_code.co_name in self.IDLE:
                    continue
                seen = set()
                f, depth = frame, 0
                where = "ui " if ident == main else "bg "
                leaf = f"{where}{Path(frame.f_code.co_filename).name}:{frame.f_code.co_name}"
                self.own[leaf] += 1
                while f is not None and depth < self.depth:
                    name = f"{where}{Path(f.f_code.co_filename).name}:{f.f_code.co_name}"
                    if name not in seen:
                        seen.add(name)
                        self.cumulative[name] += 1
                    f, depth = f.f_back, depth + 1

    def report(self, top: int = 45) -> str:
        n = max(1, self.samples)
        lines = [f"stack samples: {self.samples} ({n * self.interval:.0f} s), % of one core"]
        for title, counter in (("own", self.own), ("cumulative", self.cumulative)):
            lines.append(f"-- {title}")
            lines += [f"{100 * c / n:6.2f} %  {name}" for name, c in counter.most_common(top)]
        return "\n".join(lines)


def time_calls():
    """Wrap the dashboard's drawing calls to add up the CPU time (of the thread that runs
    them) spent in each, and how often they ran (``--profile``)."""
    import collections

    from textual.app import App
    from textual.screen import Screen

    from ddptui.tui.screens import run
    from ddptui.tui.widgets import charts, failure, header, phases, ranks, system

    totals: collections.Counter = collections.Counter()
    counts: collections.Counter = collections.Counter()
    targets = [
        (run.RunScreen, "refresh_view"),
        (run.RunScreen, "refresh_charts"),
        (run.RunScreen, "refresh_slow"),
        (run, "run_frame"),
        (run, "chart_data"),
        (ranks.RankTable, "show"),
        (ranks.RankTable, "render_line"),
        (ranks.HealthLine, "show"),
        (header.RunHeader, "show"),
        (phases.PhasePanel, "show"),
        (failure.FailurePanel, "show"),
        (system.SystemPanel, "show"),
        (charts.LossChart, "show"),
        (charts.AccuracyChart, "show"),
        (charts.ThroughputChart, "show"),
        (Screen, "_compositor_refresh"),
        (App, "_display"),
    ]
    for owner, name in targets:
        original = getattr(owner, name)
        key = f"{getattr(owner, '__name__', owner)}.{name}"

        def wrapped(*a, _original=original, _key=key, **k):
            began = time.thread_time()
            try:
                return _original(*a, **k)
            finally:
                totals[_key] += time.thread_time() - began
                counts[_key] += 1

        setattr(owner, name, wrapped)
    # Which widgets the compositor paints, and at what cost.
    from textual.widget import Widget

    original_lines = Widget.render_lines

    def render_lines(self, crop):
        began = time.thread_time()
        try:
            return original_lines(self, crop)
        finally:
            key = f"Widget.render_lines[{type(self).__name__}]"
            totals[key] += time.thread_time() - began
            counts[key] += 1

    Widget.render_lines = render_lines
    original_refresh = Widget.refresh

    def refresh(self, *regions, **kwargs):
        if kwargs.get("layout"):  # a layout makes the compositor paint the whole screen
            counts[f"Widget.refresh(layout=True)[{type(self).__name__}]"] += 1
        else:
            counts[f"Widget.refresh()[{type(self).__name__}]"] += 1
        return original_refresh(self, *regions, **kwargs)

    Widget.refresh = refresh
    # How much of the screen each compositor update paints: a partial update renders (from
    # their line caches) every widget whose clip overlaps the box around the regions made
    # dirty since the last update (a child of the screen: its clip is the whole screen).
    from textual._compositor import Compositor
    from textual.geometry import Region

    original_full = Compositor.render_full_update
    original_partial = Compositor.render_partial_update

    def full_update(self, *a, **k):
        counts["Compositor.update full screen"] += 1
        return original_full(self, *a, **k)

    def partial_update(self, *a, **k):
        if self._dirty_regions:
            box = Region.from_union(list(self._dirty_regions))
            counts["Compositor.update partial"] += 1
            counts[f"Compositor.update partial, lines {box.y}-{box.bottom}"] += 1
        return original_partial(self, *a, **k)

    Compositor.render_full_update, Compositor.render_partial_update = full_update, partial_update
    return totals, counts


# -- the dashboard side ----------------------------------------------------------------------------
def make_session_class(args: argparse.Namespace, sent_dir: Path):
    from ddptui import protocol
    from ddptui.run.collector import Collector
    from ddptui.run.launcher import LaunchResult
    from ddptui.run.session import RunSession

    world = args.nodes * args.per_node

    class Senders:
        """Launcher stand-in: runs the sender processes instead of the ranks. ``--direct``:
        every rank straight to the dashboard's collector. Else as a multi-node run is made:
        node 0's ranks straight to it, every other node's through its agent (``relay``)."""

        def __init__(self, endpoint: str, run_id: str, seconds: float, token: str | None):
            self.env = {**os.environ, "BENCH_JOIN_TOKEN": token} if token else None
            tail = [str(args.per_node), str(world), str(args.rate), str(seconds)]
            if token is None:
                per = -(-world // args.senders)
                self.cmds = [
                    [sys.executable, __file__, "--send", endpoint, run_id, str(first),
                     str(min(per, world - first)), *tail, str(sent_dir / f"sent-{first}.json")]
                    for first in range(0, world, per)
                ]  # fmt: skip
                return
            # node 0's ranks: one sender; the other nodes shared among the rest
            self.cmds = [
                [sys.executable, __file__, "--send", endpoint, run_id, "0", str(args.per_node),
                 *tail, str(sent_dir / "sent-0.json")]
            ]  # fmt: skip
            relays = max(1, args.senders - 1)
            per = -(-(args.nodes - 1) // relays)
            self.cmds += [
                [sys.executable, __file__, "--relay", run_id, str(first),
                 str(min(per, args.nodes - first)), *tail, str(args.relay_every),
                 str(sent_dir / f"sent-node-{first}.json")]
                for first in range(1, args.nodes, per)
            ]  # fmt: skip
            self.procs: list[subprocess.Popen] = []

        def start(self) -> None:
            self.procs = [subprocess.Popen(cmd, cwd=ROOT, env=self.env) for cmd in self.cmds]

        def poll(self) -> LaunchResult | None:
            codes = [p.poll() for p in self.procs]
            return None if None in codes else LaunchResult(max(codes, key=abs))

        def stop(self, grace: float | None = None) -> LaunchResult:
            for p in self.procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
            return LaunchResult(0, stopped=True)

    class ScaleSession(RunSession):
        arrivals: list[tuple[float, dict[int, int] | None, int]] = []
        pumps = 0

        def _new_collector(self) -> Collector:
            return Collector(self.cfg.run_id, world_size=world, transport=args.transport)

        def _new_launcher(self) -> Senders:
            assert self.collector is not None
            token = None
            if not args.direct:  # node 0 of a multi-node run: its join service and inbox
                self._open_host()
                assert self.host is not None
                token = self.host.token().encode()
            # The senders end before the dashboard does, so that everything sent arrives.
            return Senders(self.collector.endpoint, self.cfg.run_id, args.seconds + WARMUP_S, token)

        def _record(self, events) -> None:
            super()._record(events)
            # Each rank's newest step in this pump, turned into what the table shows for it
            # after the run (table_cell). This runs in the measured process, so only every
            # DELAY_SAMPLE-th pump is read (the others count their events only): reading
            # every pump cost about 1 % of a core at 256 ranks, a tenth of the goal, which
            # the dashboard would have been charged for. The delays are a sample of pumps,
            # each weighted by its events, as before.
            if self.pumps % DELAY_SAMPLE:
                self.arrivals.append((time.monotonic(), None, len(events)))
            else:
                step = protocol.Step
                newest = {event.rank: event.step for event in events if type(event) is step}
                if newest:  # how long ago each was sent (the same machine's clock)
                    wall = time.time()
                    lags = [round(wall - event.t, 4) for event in events]
                    self.arrivals.append((time.monotonic(), newest, len(events), lags))
            self.pumps += 1

    return ScaleSession


def child(args: argparse.Namespace) -> None:
    """The dashboard process (in a pty)."""
    from ddptui.run.machine import Machine
    from ddptui.run.options import RunConfig
    from ddptui.tui.app import DdpTuiApp, Deps
    from ddptui.tui.machine import HostInfo
    from ddptui.tui.screens.run import RunScreen

    out = Path(args.out)
    sent_dir = out.with_suffix(".sent")
    sent_dir.mkdir(exist_ok=True)
    Session = make_session_class(args, sent_dir)
    world = args.nodes * args.per_node
    run_dir = Path(tempfile.mkdtemp(prefix="bench-scale-"))
    cfg = RunConfig(
        world_size=world, epochs=None, run_dir=str(run_dir / "run"), run_id="scale", backend="gloo"
    )
    if not args.direct:  # node 0 of a multi-node run, its join service on loopback
        cfg = dataclasses.replace(
            cfg, launcher="torchrun", nnodes=args.nodes, bind="127.0.0.1",
            rdzv_endpoint="127.0.0.1:29400",
        )  # fmt: skip
    if args.ingest_only:  # the same session pumped with no UI: what ingest alone costs
        session = Session(cfg)
        session.start()
        deadline = time.monotonic() + WARMUP_S + args.seconds + 4
        while time.monotonic() < deadline and session.poll() is None:
            session.pump(0.1)
        session.stop()
        session.close()
        shutil.rmtree(run_dir, ignore_errors=True)
        shutil.rmtree(sent_dir, ignore_errors=True)
        out.write_text("{}")
        return
    paints: list[tuple[float, dict[int, int]]] = []
    host = HostInfo(Machine(0, "benchmark", os.cpu_count() or 1), None)
    deps = Deps(
        detect_host=lambda: host,
        session_factory=Session,
        refresh_hz=args.refresh_hz,
        runs_root=run_dir,
    )
    if args.no_monitor:
        deps.make_sampler = lambda interval: _NullSampler()
    profiler = StackSampler() if args.profile else None
    call_times = time_calls() if args.profile else None

    def on_frame(frame) -> None:
        shown = {}
        for row in frame.rows:
            epoch, _, step = row.epoch_step.partition("/")
            if epoch.isdigit() and step.isdigit():
                shown[row.rank] = (int(epoch), int(step))
        paints.append((time.monotonic(), shown))

    class BenchApp(DdpTuiApp):
        def on_mount(self) -> None:
            self.set_timer(WARMUP_S + args.seconds + 4, self._finish)
            self.call_after_refresh(self._probe)
            if profiler is not None:
                self.set_timer(WARMUP_S, profiler.start)

        hard_deadline = time.monotonic() + WARMUP_S + args.seconds + 20

        def _finish(self) -> None:
            # Wait (a little) for the senders to end: they write what they sent as they end.
            running = self.live_sources and self.live_sources[0].running
            if running and time.monotonic() < self.hard_deadline:
                self.set_timer(0.5, self._finish)
                return
            if profiler is not None:
                profiler.stop()
            if os.environ.get("BENCH_THREADS"):  # thread names, for the parent's breakdown
                import threading

                names = {t.native_id: t.name for t in threading.enumerate()}
                out.with_suffix(".threads.json").write_text(json.dumps(names))
            self.exit(0)

        def _probe(self) -> None:
            if isinstance(self.screen, RunScreen):
                self.screen.on_frame_drawn = on_frame
            else:
                self.set_timer(0.05, self._probe)

    app = BenchApp("run", deps=deps, cfg=cfg, start=True, host_info=host)
    app.run()
    app.stop_everything()
    source = app.live_sources[0] if app.live_sources else None
    received: dict[int, list[int]] = {}
    stats = {}
    if source is not None:
        state = source.state
        received = {r: [v.events, v.last_seq, v.gaps] for r, v in state.ranks.items()}
        collector_stats = getattr(source.session, "stats", None)
        if collector_stats is not None:
            stats = {
                k: v
                for k, v in vars(collector_stats).items()
                if isinstance(v, int) and not isinstance(v, bool)
            }
    if profiler is not None:
        seconds = WARMUP_S + args.seconds + 4
        lines = [f"CPU of the calling thread in (inclusive), % of one core over {seconds:g} s:"]
        lines += [
            f"{100 * t / seconds:6.2f} %  {name} ({calls[name]} calls)"
            for name, t in sorted(call_times[0].items(), key=lambda kv: -kv[1])
            for calls in [call_times[1]]
        ]
        lines += [
            f"{n:6d} x  {name}"
            for name, n in sorted(call_times[1].items())
            if "refresh(" in name or "Compositor" in name
        ]
        out.with_suffix(".prof.txt").write_text(profiler.report() + "\n" + "\n".join(lines))
    shutil.rmtree(run_dir, ignore_errors=True)  # 64k events: ~13 MB of events.jsonl
    out.write_text(
        json.dumps(
            {
                "paints": paints,
                "arrivals": Session.arrivals,
                "received": received,
                "stats": stats,
                "sent_dir": str(sent_dir),
            }
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=32)
    parser.add_argument("--per-node", type=int, default=8)
    parser.add_argument("--rate", type=float, default=10.0, help="step events/s per rank")
    parser.add_argument("--seconds", type=float, default=20.0, help="measured window")
    parser.add_argument("--repeat", type=int, default=3, help="runs (the range is printed)")
    parser.add_argument("--senders", type=int, default=4, help="sender processes")
    parser.add_argument("--transport", choices=("ipc", "tcp"), default="ipc")
    parser.add_argument("--refresh-hz", type=float, default=4.5)
    parser.add_argument("--no-monitor", action="store_true", help="no system sampling thread")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="time the screen's drawing calls, and sample every thread's stack from inside"
        " (only where a thread lets the GIL go: --py-spy tells where the CPU goes)",
    )
    parser.add_argument(
        "--ingest-only", action="store_true", help="also measure the session with no UI"
    )
    parser.add_argument("--py-spy", action="store_true", help=PY_SPY_HELP)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument(
        "--direct",
        action="store_true",
        help="every rank straight to the dashboard (before: the bench's only way) instead of"
        " node 0's ranks only and every other node through its join agent, over CURVE",
    )
    parser.add_argument(
        "--relay-every",
        type=float,
        default=0.0,
        help="seconds a simulated node's agent gathers its ranks' events before it sends them"
        " on in one message (default 0: each as it comes, as ddptui join's agent relays them)",
    )
    parser.add_argument("--send", nargs=9, help=argparse.SUPPRESS)
    parser.add_argument("--relay", nargs=9, help=argparse.SUPPRESS)
    # bench_tui.run_child passes these through; accepted and unused here.
    parser.add_argument("--ranks", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    if not 0.0 <= args.relay_every <= 10.0:  # nan and inf fail too
        parser.error("--relay-every must be 0 to 10 seconds")
    if min(args.nodes, args.per_node, args.senders) < 1 or not 0.0 < args.rate <= 1000.0:
        parser.error("--nodes, --per-node and --senders must be at least 1, --rate 0 to 1000")
    if args.nodes == 1:
        args.direct = True  # one node: no other node's agent to relay
    if args.send:
        e, run_id, first, count, per_node, world, rate, seconds, out = args.send
        send(e, run_id, int(first), int(count), int(per_node), int(world), float(rate),
             float(seconds), out)  # fmt: skip
        return
    if args.relay:
        run_id, first, nodes, per_node, world, rate, seconds, every, out = args.relay
        relay(run_id, int(first), int(nodes), int(per_node), int(world), float(rate),
              float(seconds), float(every), out)  # fmt: skip
        return
    if args.child:
        child(args)
        return
    if args.py_spy:
        os.environ["BENCH_PYSPY"] = "1"  # run_child reads it
    world = args.nodes * args.per_node
    common = [
        "--nodes", str(args.nodes), "--per-node", str(args.per_node), "--rate", str(args.rate),
        "--seconds", str(args.seconds), "--senders", str(args.senders),
        "--transport", args.transport, "--refresh-hz", str(args.refresh_hz),
        "--relay-every", str(args.relay_every),
    ]  # fmt: skip
    if args.direct:
        common.append("--direct")
    if args.no_monitor:
        common.append("--no-monitor")
    if args.profile:
        common.append("--profile")
    from ddptui.tui.screens.run import LARGE_RUN_HZ, LARGE_RUN_RANKS

    table_hz = min(args.refresh_hz, LARGE_RUN_HZ) if world > LARGE_RUN_RANKS else args.refresh_hz
    if args.direct:
        path = f"every rank straight to the dashboard over {args.transport}"
    else:
        gathered = (
            f"gathered every {args.relay_every:g} s" if args.relay_every > 0 else "one by one"
        )
        path = (
            f"node 0's ranks straight to the dashboard over {args.transport}, the other "
            f"{args.nodes - 1} nodes' through their join agents over CURVE ({gathered}; status "
            "asked every 0.5 s, a system sample every 2 s)"
        )
    print(
        f"ddptui scale benchmark: {world} ranks on {args.nodes} nodes x {args.rate:g} events/s "
        f"({world * args.rate:g} events/s) from {args.senders} sender processes, {path}, "
        f"beats every second per rank, refresh {args.refresh_hz:g} Hz "
        f"(header and table {table_hz:g} Hz at {world} ranks; phase bars 1 Hz), "
        f"{args.repeat} x {args.seconds:g} s window, {os.cpu_count()} CPUs"
    )
    ingest = []
    runs = []
    refs: list[float] = []  # this machine's speed beside each run
    for i in range(args.repeat):
        refs.append(machine_ref.reference_ms())
        if args.ingest_only:
            cpu, _ = run_child([*common, "--ingest-only"], args.seconds, False, __file__)
            ingest.append(cpu)
        run = one_run(common, args, world)
        if run is None:
            print("no measurements: the dashboard did not run (see the child's output)")
            return
        runs.append(run)
        print(
            run_line(i, args.repeat, run, ingest)
            + f", ranks heard {run['ranks']}/{world}, {run['batches']} batches"
            f" ({run['per_batch']:.0f} events each)",
            flush=True,
        )
        if run["profile"]:
            print(run["profile"])
    print_ranges(runs, GOAL_CPU, GOAL_P95_MS, ingest)
    print(machine_ref.line(refs))


def one_run(common: list[str], args: argparse.Namespace, world: int) -> dict | None:
    """One dashboard run: its CPU, event-to-screen delays and drops (None: it did not run)."""
    cpu, out = _run(common, args.seconds)
    data = json.loads(out.read_text())
    out.unlink()
    paints = [(t, {int(r): tuple(s) for r, s in shown.items()}) for t, shown in data["paints"]]
    arrivals = [
        (t, None if newest is None else {int(r): table_cell(s) for r, s in newest.items()}, n)
        + tuple(lags)
        for t, newest, n, *lags in data["arrivals"]
    ]
    if not arrivals or not paints:
        return None
    first = arrivals[0][0]
    window = (first + WARMUP_S, first + WARMUP_S + args.seconds)
    waits = sorted(delays(paints, arrivals, *window)) or [float("nan")]
    sent: dict[int, int] = {}
    for path in Path(data["sent_dir"]).glob("sent-*.json"):
        sent.update({int(r): n for r, n in json.loads(path.read_text()).items()})
    shutil.rmtree(data["sent_dir"], ignore_errors=True)
    received = {int(r): v for r, v in data["received"].items()}
    missing = {r: n - received.get(r, [0])[0] for r, n in sent.items()}
    batches = [n for t, _, n, *_ in arrivals if window[0] <= t <= window[1]]
    prof = out.with_suffix(".prof.txt")
    profile = prof.read_text()[:8000] if prof.exists() else ""
    prof.unlink(missing_ok=True)
    return {
        **run_figures(cpu, waits, len(paints)),
        "lost": sum(max(0, m) for m in missing.values()),
        "gaps": sum(v[2] for v in received.values()),
        "sent": sum(sent.values()),
        "ranks": len(sent),
        "batches": len(batches),
        "per_batch": sum(batches) / max(1, len(batches)),
        "profile": profile,
    }


def _run(common: list[str], seconds: float) -> tuple[float, Path]:
    return run_child([*common], seconds, pty_mode=True, script=__file__)


if __name__ == "__main__":
    main()
