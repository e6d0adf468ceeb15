"""Dashboard cost under load: CPU of the dashboard process and event-to-screen delay.

A feeder process sends a synthetic run over the real telemetry path (ZeroMQ PUSH →
the dashboard's Collector → events.jsonl → RunState), N ranks × R step events per second
each. The dashboard runs in a pseudo-terminal (120x40) exactly as ``ddptui --start`` would,
except that the feeder replaces the launcher; each step carries its phases (data, forward,
backward, comm, optimizer), and each rank also sends a heartbeat (``beat``) every second.
Measured, over ``--repeat`` runs (3 by default; the range is printed):

* CPU of the dashboard process (all its threads: pump, monitor sampler, UI), as a percent of
  one core: its CPU seconds (user + system) per second of a steady window, so that other load
  on the machine does not count; with ``--ingest-only`` the same for an ingest-only process
  (the same session pumped with no UI), to show what the UI itself costs, and with
  ``--headless`` for ``ddptui --no-ui`` (its own loop and console, the console's lines to
  /dev/null) on the same feed;
* delay from an event's sending (the rank's, its ``t``) to the first screen refresh that shows
  it (median, p95, max): the time it waited in the socket for the pump thread to take it, and
  then for the screen (before, from its taking: what the pump's interval added was not seen);
* events lost: sent (by seq) against received, and seq gaps.

Prints numbers; it is not a test. Usage::

    uv run python benchmarks/bench_tui.py                      # 8 ranks x 50/s, 3 x 20 s
    uv run python benchmarks/bench_tui.py --ranks 16 --seconds 30
"""

from __future__ import annotations

import argparse
import bisect
import fcntl
import json
import os
import pty
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import termios
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import machine_ref  # noqa: E402
import pyspy  # noqa: E402

#: ``--py-spy``: where the dashboard's CPU goes (see pyspy.py).
PY_SPY_HELP = "profile the measured window with py-spy, from outside the process (by thread)"
WARMUP_S = 5.0  # start-up (imports, first layout) is not what we measure
SIZE = (120, 40)


def simulated_phases(step_time: float, skew: float) -> dict[str, float]:
    """Where a simulated step went, as the built-in trainers and the hooks report it: ``skew``
    (a share of the step) moved from comm to the optimizer, so that ranks differ a little."""
    return {
        "data": 0.05 * step_time,
        "forward": 0.3 * step_time,
        "backward": 0.4 * step_time,
        "comm": (0.2 - skew) * step_time,
        "optimizer": (0.05 + skew) * step_time,
    }


# -- the feeder: a synthetic run over the real wire protocol ------------------------------------
def feed(endpoint: str, run_id: str, ranks: int, rate: float, seconds: float, out: str) -> None:
    import zmq

    from ddptui import protocol
    from ddptui.rank.heartbeat import BEAT_S

    sock = zmq.Context().socket(zmq.PUSH)
    sock.setsockopt(zmq.LINGER, 1000)
    sock.connect(endpoint)
    seq = [0] * ranks
    steps_per_epoch = int(rate * 10)  # an epoch (and an eval) every 10 s

    def send(*events) -> None:  # one message per rank per step, as the reporter batches
        sock.send(protocol.encode_batch(list(events)))

    def common(rank: int) -> dict:
        seq[rank] += 1
        return {"run": run_id, "rank": rank, "t": time.time(), "seq": seq[rank] - 1}

    for rank in range(ranks):
        send(
            protocol.Status(
                state="started",
                pid=os.getpid(),
                host="bench",
                local_rank=rank,
                world_size=ranks,
                epochs=max(1, int(seconds // 10)),
                device="cpu",
                **common(rank),
            )
        )
    start = time.monotonic()
    step = 0
    ticks_per_beat = max(1, round(BEAT_S * rate))
    while True:
        step += 1
        due = start + step / rate
        delay = due - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        if time.monotonic() - start > seconds:
            break
        epoch = 1 + (step - 1) // steps_per_epoch
        for rank in range(ranks):
            step_time = (1 / rate) * (1.0 + 0.02 * rank)
            events = [
                protocol.Step(
                    step=step,
                    epoch=epoch,
                    loss=2.0 / (1 + step / 100) + rank / 100,
                    samples=32,
                    samples_per_s=32 / step_time,
                    step_time=step_time,
                    phases=simulated_phases(step_time, 0.01 * rank),
                    **common(rank),
                )
            ]
            if step % steps_per_epoch == 0:
                events.append(
                    protocol.EpochEnd(
                        epoch=epoch, time=10.0, samples=32 * steps_per_epoch, **common(rank)
                    )
                )
                events.append(
                    protocol.Eval(
                        epoch=epoch, accuracy=1 - 0.5 / epoch, loss=0.1, count=1000, **common(rank)
                    )
                )
            if (step + rank) % ticks_per_beat == 0:  # a heartbeat every BEAT_S per rank
                events.append(
                    protocol.Beat(
                        frame="train_step (train.py:42)",
                        digest=f"{step:x}",
                        cpu=time.process_time(),
                        steps=step,
                        wakes=step,  # the sampled thread's wakes (a real beat's count grows too)
                        **common(rank),
                    )
                )
            send(*events)
    for rank in range(ranks):
        send(protocol.Status(state="finished", **common(rank)))
    sock.close()
    Path(out).write_text(json.dumps(seq))


# -- the dashboard side ------------------------------------------------------------------------
def make_session_class():
    from ddptui import protocol
    from ddptui.run.launcher import LaunchResult
    from ddptui.run.session import RunSession

    class FeedLauncher:
        """Launcher stand-in: runs the feeder instead of the ranks."""

        def __init__(
            self, endpoint: str, run_id: str, ranks: int, rate: float, seconds: float, out: str
        ):
            self.cmd = [
                sys.executable,
                __file__,
                "--feed",
                endpoint,
                run_id,
                str(ranks),
                str(rate),
                str(seconds),
                out,
            ]
            self.process: subprocess.Popen | None = None

        def start(self) -> None:
            self.process = subprocess.Popen(self.cmd, cwd=ROOT)

        def poll(self) -> LaunchResult | None:
            code = self.process.poll() if self.process else 0
            return None if code is None else LaunchResult(code)

        def stop(self, grace: float | None = None) -> LaunchResult:
            if self.process and self.process.poll() is None:
                self.process.kill()
                self.process.wait()
            return LaunchResult(0, stopped=True)

    class FeedSession(RunSession):
        """A real RunSession (collector, events.jsonl, RunState) fed by the feeder; it also
        notes when each batch of events arrived, for the delay measurement."""

        ranks = 8
        rate = 50.0
        seconds = 20.0
        sent_path = ""
        arrivals: list[tuple[float, dict[int, int], int]] = []

        def _new_launcher(self) -> FeedLauncher:
            assert self.collector is not None
            return FeedLauncher(
                self.collector.endpoint,
                self.cfg.run_id,
                self.ranks,
                self.rate,
                self.seconds,
                self.sent_path,
            )

        def _record(self, events) -> None:
            super()._record(events)
            # What the table will show for each rank that stepped: (epoch, step in epoch), as
            # the state has it now (the event's own step goes on across epochs; the table's
            # count starts again at each).
            ranks = {event.rank for event in events if type(event) is protocol.Step}
            newest = {r: (self.state.ranks[r].epoch or 0, self.state.ranks[r].steps_in_epoch)
                      for r in ranks}  # fmt: skip
            if newest:  # how long ago each was sent (the same machine's clock)
                wall = time.time()
                lags = [round(wall - event.t, 4) for event in events]
                self.arrivals.append((time.monotonic(), newest, len(events), lags))

    return FeedSession


def child(args: argparse.Namespace) -> None:
    """The dashboard process (in a pty), or the ingest-only process (``--ingest-only``)."""
    FeedSession = make_session_class()
    FeedSession.ranks, FeedSession.rate, FeedSession.seconds = (
        args.ranks,
        args.rate,
        args.seconds + WARMUP_S,  # it ends before the dashboard: everything sent arrives
    )
    FeedSession.sent_path = str(Path(args.out).with_suffix(".sent.json"))
    run_dir = Path(tempfile.mkdtemp(prefix="bench-tui-"))
    try:
        _child_in(args, FeedSession, run_dir)
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)  # the fed run's events: nothing to keep


def _child_in(args: argparse.Namespace, FeedSession: type, run_dir: Path) -> None:  # noqa: N803
    from ddptui.run.machine import Machine
    from ddptui.run.options import RunConfig
    from ddptui.tui.machine import HostInfo

    cfg = RunConfig(
        world_size=args.ranks,
        epochs=None,
        run_dir=str(run_dir / "run"),
        run_id="bench",
        backend="gloo",
    )
    if args.headless:  # ``ddptui --no-ui``'s own loop and console, on the same feed
        from ddptui import headless

        headless.RunSession = FeedSession
        with open(os.devnull, "w") as out:
            headless.run_headless(cfg, out=out)
        return
    if args.ingest_only:
        session = FeedSession(cfg)
        session.start()
        deadline = time.monotonic() + WARMUP_S + args.seconds + 3
        while time.monotonic() < deadline and session.poll() is None:
            session.pump(0.1)
        session.stop()
        session.close()
        return

    from ddptui.tui.app import DdpTuiApp, Deps
    from ddptui.tui.screens.run import RunScreen

    paints: list[tuple[float, dict[int, int]]] = []
    host = HostInfo(Machine(0, "benchmark", os.cpu_count() or 1), None)
    deps = Deps(
        detect_host=lambda: host,
        session_factory=FeedSession,
        refresh_hz=args.refresh_hz,
        runs_root=run_dir,
    )
    if args.no_monitor:
        deps.make_sampler = lambda interval: _NullSampler()

    def on_frame(frame) -> None:
        shown = {}
        for row in frame.rows:
            epoch, _, step = row.epoch_step.partition("/")
            if epoch.isdigit() and step.isdigit():
                shown[row.rank] = (int(epoch), int(step))
        paints.append((time.monotonic(), shown))

    class BenchApp(DdpTuiApp):
        """The dashboard as ``ddptui --start`` runs it, plus a probe on each refresh."""

        hard_deadline = time.monotonic() + WARMUP_S + args.seconds + 20

        def on_mount(self) -> None:  # Textual runs DdpTuiApp.on_mount as well
            self.set_timer(WARMUP_S + args.seconds + 3, self._finish)
            self.call_after_refresh(self._probe)

        def _finish(self) -> None:
            # Wait (a little) for the feeder to end: it writes what it sent as it ends.
            running = self.live_sources and self.live_sources[0].running
            if running and time.monotonic() < self.hard_deadline:
                self.set_timer(0.5, self._finish)
                return
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
    received = {}
    if source is not None:
        received = {r: [v.events, v.gaps] for r, v in source.state.ranks.items()}
    Path(args.out).write_text(
        json.dumps({"paints": paints, "arrivals": FeedSession.arrivals, "received": received})
    )


class _NullSampler:
    """No system sampling (``--no-monitor``: to see what the monitor thread costs)."""

    def start(self):
        return self

    def stop(self, timeout=None):
        pass

    def latest(self):
        return None

    def set_pids(self, pids):
        pass


def delays(paints, arrivals, start: float, end: float) -> list[float]:
    """For every event arriving in [start, end]: time from its sending (its arrival less how
    long before it was sent: ``lags``, one an event) to the first paint that shows it
    (arrivals whose ``newest`` is None were not sampled: left out)."""
    times = [p[0] for p in paints]
    out: list[float] = []
    for arrived, newest, count, *lags in arrivals:
        if newest is None or not start <= arrived <= end:
            continue
        i = bisect.bisect_left(times, arrived)
        for t, shown in paints[i:]:
            if all(r in shown and shown[r] >= s for r, s in newest.items()):
                out.extend(t - arrived + lag for lag in (lags[0] if lags else [0.0] * count))
                break
    return out


# -- the parent: runs the children and measures them ---------------------------------------------
def run_child(
    extra: list[str], seconds: float, pty_mode: bool, script: str = __file__
) -> tuple[float, Path]:
    """Start a child (``script --child``), return (CPU % of one core over the steady window,
    output path)."""
    import psutil

    out = Path(tempfile.mkstemp(prefix="bench-tui-", suffix=".json")[1])
    cmd = [sys.executable, script, "--child", "--out", str(out), *extra]
    env = dict(os.environ, TERM="xterm-256color", COLUMNS=str(SIZE[0]), LINES=str(SIZE[1]))
    if pty_mode:
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", SIZE[1], SIZE[0], 0, 0))
        proc = subprocess.Popen(
            cmd, stdin=slave, stdout=slave, stderr=slave, env=env, cwd=ROOT, start_new_session=True
        )
        os.close(slave)

        def drain() -> None:  # the terminal: read everything the app draws
            while True:
                try:
                    if not os.read(master, 65536):
                        break
                except OSError:
                    break

        threading.Thread(target=drain, daemon=True).start()
    else:
        proc = subprocess.Popen(cmd, env=env, cwd=ROOT)
    ps = psutil.Process(proc.pid)
    time.sleep(WARMUP_S)
    t0, times0, threads0 = time.monotonic(), ps.cpu_times(), _thread_times(ps)
    c0 = sum(times0[:2])
    spy = pyspy.start(proc.pid, seconds) if os.environ.get("BENCH_PYSPY") else None
    time.sleep(seconds)
    t1, times1, threads1 = time.monotonic(), ps.cpu_times(), _thread_times(ps)
    c1 = sum(times1[:2])
    profile = pyspy.finish(spy, seconds)
    proc.wait(timeout=60)
    if profile:
        print(profile)
    if os.environ.get("BENCH_THREADS"):  # where the process's CPU went, thread by thread
        used = {tid: threads1[tid][1] - threads0.get(tid, ("", 0.0))[1] for tid in threads1}
        named = out.with_suffix(".threads.json")  # Python's names, where the child wrote them
        if named.exists():
            names = {int(k): v for k, v in json.loads(named.read_text()).items()}
            named.unlink()
            threads1 = {
                tid: (f"{names[tid]}[{tid}]" if tid in names else name, c)
                for tid, (name, c) in threads1.items()
            }
        user, system = (100 * (times1[i] - times0[i]) / (t1 - t0) for i in (0, 1))
        print(f"  CPU in user space {user:.1f} %, in the kernel {system:.1f} %")
        print(
            "  CPU by thread: "
            + ", ".join(
                f"{threads1[tid][0]} {100 * c / (t1 - t0):.1f} %"
                for tid, c in sorted(used.items(), key=lambda kv: -kv[1])
                if c > 0
            )
        )
    return 100.0 * (c1 - c0) / (t1 - t0), out


def _thread_times(ps) -> dict[int, tuple[str, float]]:
    """Thread id -> (its name as the kernel knows it, CPU seconds so far)."""
    out = {}
    try:
        for t in ps.threads():
            try:
                name = Path(f"/proc/{ps.pid}/task/{t.id}/comm").read_text().strip()
            except OSError:
                name = "?"
            out[t.id] = (f"{name}[{t.id}]", t.user_time + t.system_time)
    except Exception:  # psutil.Error: the process ended
        pass
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--rate", type=float, default=50.0, help="step events/s per rank")
    parser.add_argument("--seconds", type=float, default=20.0, help="measured window")
    parser.add_argument("--repeat", type=int, default=3, help="runs (the range is printed)")
    parser.add_argument("--refresh-hz", type=float, default=4.5)
    parser.add_argument(
        "--no-monitor",
        action="store_true",
        help="no GPU/system sampling thread (to see what it costs)",
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--ingest-only", action="store_true", help="also measure the session with no UI"
    )
    parser.add_argument(
        "--headless",
        action="store_true",
        help="also measure ddptui --no-ui (its loop and console, the console to /dev/null)",
    )
    parser.add_argument("--py-spy", action="store_true", help=PY_SPY_HELP)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--feed", nargs=6, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.py_spy:
        os.environ["BENCH_PYSPY"] = "1"  # run_child reads it
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    if args.feed:
        endpoint, run_id, ranks, rate, seconds, out = args.feed
        feed(endpoint, run_id, int(ranks), float(rate), float(seconds), out)
        return
    if args.child:
        child(args)
        return

    common = [
        "--ranks",
        str(args.ranks),
        "--rate",
        str(args.rate),
        "--seconds",
        str(args.seconds),
        "--refresh-hz",
        str(args.refresh_hz),
    ]
    if args.no_monitor:
        common.append("--no-monitor")
    print(
        f"ddptui dashboard benchmark: {args.ranks} ranks x {args.rate:g} events/s "
        f"({args.ranks * args.rate:g} events/s), beats every second per rank, refresh "
        f"{args.refresh_hz:g} Hz, {args.repeat} x {args.seconds:g} s window, "
        f"{os.cpu_count()} CPUs"
    )
    runs, ingest, headless = [], [], []
    refs: list[float] = []  # this machine's speed beside each run
    for i in range(args.repeat):
        refs.append(machine_ref.reference_ms())
        for wanted, flag, into in (
            (args.ingest_only, "--ingest-only", ingest),
            (args.headless, "--headless", headless),
        ):
            if wanted:
                cpu, out = run_child([*common, flag], args.seconds, pty_mode=False)
                out.unlink(missing_ok=True)
                out.with_suffix(".sent.json").unlink(missing_ok=True)
                into.append(cpu)
        if headless:
            print(f"run {i + 1}/{args.repeat}: ddptui --no-ui {headless[-1]:.1f} % of one core")
        run = one_run(common, args.seconds)
        if run is None:
            print("no measurements: the dashboard did not run (see the child's output)")
            return
        runs.append(run)
        print(run_line(i, args.repeat, run, ingest), flush=True)
    print_ranges(runs, GOAL_CPU, GOAL_P95_MS, ingest)
    if headless:
        print(f"  CPU, ddptui --no-ui: {min(headless):.1f}-{max(headless):.1f} % of one core")
    print(machine_ref.line(refs))


def run_line(i: int, repeat: int, run: dict, ingest: list[float]) -> str:
    """One run's figures: the dashboard's CPU, event-to-screen delays and drops."""
    return (
        f"run {i + 1}/{repeat}: CPU {run['cpu']:5.1f} % of one core (load {run['load']:.1f})"
        + (f" (ingest only {ingest[-1]:.1f} %)" if ingest else "")
        + f", event sent -> screen median {run['median']:.0f} ms p95 {run['p95']:.0f} ms"
        f" max {run['max']:.0f} ms ({run['events']} events), refreshes {run['refreshes']},"
        f" dropped {run['lost']} of {run['sent']} (seq gaps {run['gaps']})"
    )


GOAL_CPU = 7.0
GOAL_P95_MS = 250.0


def one_run(common: list[str], seconds: float) -> dict | None:
    """One dashboard run: its CPU, event-to-screen delays and drops (None: it did not run)."""
    cpu, out = run_child(common, seconds, pty_mode=True)
    data = json.loads(out.read_text())
    out.unlink()
    sent_path = out.with_suffix(".sent.json")
    sent = json.loads(sent_path.read_text()) if sent_path.exists() else []
    sent_path.unlink(missing_ok=True)
    # JSON turned the rank keys into strings: back to ints.
    paints = [(t, {int(r): s for r, s in shown.items()}) for t, shown in data["paints"]]
    arrivals = [
        (t, {int(r): s for r, s in newest.items()}, n, *lags)
        for t, newest, n, *lags in data["arrivals"]
    ]
    if not arrivals or not paints:
        return None
    first = arrivals[0][0]
    waits = sorted(delays(paints, arrivals, first + WARMUP_S, first + WARMUP_S + seconds))
    waits = waits or [float("nan")]
    received = {int(r): v for r, v in data.get("received", {}).items()}
    return {
        **run_figures(cpu, waits, len(paints)),
        "lost": sum(max(0, n - received.get(r, [0])[0]) for r, n in enumerate(sent)),
        "gaps": sum(v[1] for v in received.values()),
        "sent": sum(sent),
    }


def run_figures(cpu: float, waits: list[float], refreshes: int) -> dict:
    """A run's CPU and load, and its sorted event-to-screen ``waits`` (s) as ms figures."""
    return {
        "cpu": cpu,
        # The machine's 1-minute load average at the window's end (this benchmark's own
        # processes included): CPU time per second grows on a busy machine (shared caches).
        "load": os.getloadavg()[0],
        "median": statistics.median(waits) * 1000,
        "p95": waits[int(0.95 * (len(waits) - 1))] * 1000,
        "max": waits[-1] * 1000,
        "events": len(waits),
        "refreshes": refreshes,
    }


def print_ranges(
    runs: list[dict], goal_cpu: float, goal_p95_ms: float, ingest: list[float] = ()
) -> None:
    """The range (min-max) over the runs of CPU, p95 delay and drops, against the goals."""

    def span(key: str, fmt: str) -> str:
        values = [r[key] for r in runs]
        return f"{min(values):{fmt}}-{max(values):{fmt}}"

    cpu_ok = max(r["cpu"] for r in runs) <= goal_cpu
    p95_ok = max(r["p95"] for r in runs) <= goal_p95_ms
    lost = max(r["lost"] + r["gaps"] for r in runs)
    print(f"over {len(runs)} runs (min-max):")
    print(
        f"  CPU, dashboard process: {span('cpu', '.1f')} % of one core "
        f"(goal <= {goal_cpu:g} %: {'ok' if cpu_ok else 'MISSED'}), "
        f"load average {span('load', '.1f')}"
    )
    if ingest:
        low, high = min(ingest), max(ingest)
        print(f"  CPU, ingest only (same session, no UI): {low:.1f}-{high:.1f} % of one core")
    print(
        f"  event sent -> on screen p95: {span('p95', '.0f')} ms "
        f"(goal <= {goal_p95_ms:g} ms: {'ok' if p95_ok else 'MISSED'})"
    )
    print(
        f"  events dropped: {span('lost', 'd')} (seq gaps {span('gaps', 'd')}) "
        f"(goal 0: {'ok' if lost == 0 else 'MISSED'})"
    )


if __name__ == "__main__":
    main()
