"""The fault matrix: one fault on one rank, does ddptui name it right, and how fast?

Runs ``tests/scripts/faults/fault_ddp.py`` (a plain DDP script, gloo on CPU) under
``ddptui --no-ui`` once per fault and launcher, and prints one row per run: the verdict, the
rank named, the op and ``#N`` named, the user's file:line named, and the seconds from the
fault (the faulty rank writes down when it commits it) to the verdict's line on ddptui's
console. A fault is named right when the rank, the op and the sequence number match what the
faulty rank wrote down, within ``--hang-timeout`` + 5 s; a healthy control is right when no
verdict is given and the run finishes.

    uv run python benchmarks/fault_matrix.py [--launchers spawn,torchrun] [--world 2]
        [--hang-timeout 6] [--faults sleep,loop,...]

Every run's processes are found by run id and killed, whatever happens.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ddptui.rank.net import free_port  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "scripts" / "faults" / "fault_ddp.py"
#: fault -> what a right verdict names: the op (None: any), or None for a healthy control.
FAULTS: dict[str, str | None] = {
    "extra": "broadcast",  # named first: "rank 1 called broadcast #N where rank 0 …"
    "skip": "all_reduce",
    "sleep": "all_reduce",
    "shape": "all_reduce",
    "dtype": "all_reduce",
    "loader": "all_reduce",
    "kill": "all_reduce",
    "loop": "all_reduce",
}
#: Faults whose right answer is the waiting note, not a verdict -> the function the note
#: must name. An endless loop keeps its rank busy with its stack in one place, which one long
#: call (a checkpoint pickled in one go) does too: ddptui gives no verdict on a busy rank, and
#: its note names the rank, where it is and that its stack has not moved. The others' op is
#: the one they wait in; the run never ends by itself, so the matrix interrupts it (SIGINT).
NOTED = {"loop": "spin"}
HEALTHY = ("slow_start", "slow_step", "uneven")
_NOTE = re.compile(r"\(in ([a-z_]+)\), waiting for rank (\d+), which works \(at (\w+) \(")
_OP = re.compile(r"\b([a-z_]+) #(\d+)")
_WHERE = re.compile(r"[\w.-]+\.py:\d+")


@dataclass
class Row:
    fault: str
    launcher: str
    world: int
    verdict: str
    rank: int | None
    op: str | None
    seq: int | None
    where: str | None
    latency: float | None
    ok: bool
    note: str = ""


def _kill_run(run_id: str) -> None:
    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.environ().get("DDPTUI_RUN_ID") == run_id:
                proc.kill()
        except (psutil.Error, OSError):
            continue


def run_case(
    fault: str,
    launcher: str,
    world: int,
    hang_timeout: float,
    base: Path,
    timeout: float = 120.0,
) -> Row:
    """One ddptui run with ``fault``; its row of the matrix."""
    name = f"{fault}-{launcher}-{world}"
    run_dir, mark_path = base / name, base / f"{name}.mark.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "FAULT": fault, "FAULT_MARK": str(mark_path)}
    if fault == "slow_start":
        env["FAULT_SLEEP_S"] = str(2 * hang_timeout)
    elif fault == "slow_step":
        env["FAULT_SLEEP_S"] = "0.1"  # ten times a ~10 ms step
    cmd = [sys.executable, "-m", "ddptui.cli", "--no-ui", "--script", str(SCRIPT)]
    cmd += ["--world-size", str(world), "--launcher", launcher, "--run-dir", str(run_dir)]
    cmd += ["--hang-timeout", str(hang_timeout)]
    lines: list[tuple[float, str]] = []
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT
    )

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append((time.time(), line.rstrip("\n")))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + timeout
        while proc.poll() is None and time.monotonic() < deadline:
            if fault in NOTED and any(_NOTE.search(line) for _, line in lines):
                proc.send_signal(signal.SIGINT)  # the note came: the run would go on forever
                break
            time.sleep(0.2)
        proc.wait(timeout=max(1.0, min(30.0, deadline - time.monotonic())))
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    finally:
        reader.join(5)
        try:
            run_id = json.loads((run_dir / "config.json").read_text())["run_id"]
            _kill_run(run_id)
        except (OSError, ValueError, KeyError):
            pass
    return judge(fault, launcher, world, hang_timeout, run_dir, mark_path, lines, proc.returncode)


NETNS = ROOT / "scripts" / "ci" / "netns.sh"
JOIN = re.compile(r"^ddptui join (\S+)$")


def netns_up(name: str) -> dict[str, str]:
    """A network namespace joined to this one by a veth pair (``scripts/ci/netns.sh``):
    its NETNS, NETNS_HOST_IP, NETNS_NS_IP, NETNS_HOST_IF, NETNS_NS_IF; OSError (one line)
    when it cannot be made (root and iproute2 are needed)."""
    proc = subprocess.run(
        ["bash", str(NETNS), "up", name], capture_output=True, text=True, timeout=30
    )
    values = dict(ln.split("=", 1) for ln in proc.stdout.splitlines() if "=" in ln)
    if proc.returncode != 0 or "NETNS" not in values:
        raise OSError((proc.stdout or proc.stderr).strip().splitlines()[-1:] or ["netns failed"])
    return values


def netns_down(name: str) -> None:
    subprocess.run(["bash", str(NETNS), "down", name], capture_output=True, timeout=30)


def run_two_nodes(fault: str, hang_timeout: float, base: Path, timeout: float = 150.0) -> Row:
    """One run on two nodes over torchrun's c10d rendezvous, one rank each: node 0 here,
    node 1 (``ddptui join``) in its own network namespace, the fault on the last rank."""
    name = f"{fault}-2nodes-2"
    run_dir, mark_path = base / name, base / f"{name}.mark.json"
    ns = f"ddptui-fm-{os.getpid()}"
    try:
        net = netns_up(ns)
    except (OSError, subprocess.SubprocessError) as exc:
        return Row(fault, "2 nodes", 2, "-", None, None, None, None, None, False, f"{exc}")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "FAULT": fault, "FAULT_MARK": str(mark_path)}
    if fault == "slow_start":
        env["FAULT_SLEEP_S"] = str(2 * hang_timeout)
    elif fault == "slow_step":
        env["FAULT_SLEEP_S"] = "0.1"
    port = free_port(net["NETNS_HOST_IP"])
    cmd = [sys.executable, "-m", "ddptui.cli", "--no-ui", "--script", str(SCRIPT)]
    cmd += ["--nnodes", "2", "--nproc-per-node", "1", "--device", "cpu"]
    cmd += ["--rdzv-endpoint", f"{net['NETNS_HOST_IP']}:{port}", "--run-dir", str(run_dir)]
    cmd += ["--hang-timeout", str(hang_timeout)]
    lines: list[tuple[float, str]] = []
    procs: list[subprocess.Popen] = []

    def start(argv: list[str], extra: dict[str, str], keep: bool) -> subprocess.Popen:
        proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**env, **extra},
            cwd=ROOT,
            start_new_session=True,
        )
        procs.append(proc)

        def read() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                if keep:
                    lines.append((time.time(), line.rstrip("\n")))

        threading.Thread(target=read, daemon=True).start()
        return proc

    try:
        node0 = start(cmd, {"GLOO_SOCKET_IFNAME": net["NETNS_HOST_IF"]}, True)
        deadline = time.monotonic() + 60
        token = None
        while token is None and time.monotonic() < deadline and node0.poll() is None:
            token = next((m.group(1) for _, ln in lines if (m := JOIN.match(ln))), None)
            time.sleep(0.1)
        if token is not None:
            join = ["ip", "netns", "exec", net["NETNS"], "env"]
            join += [f"GLOO_SOCKET_IFNAME={net['NETNS_NS_IF']}", sys.executable, "-m"]
            join += ["ddptui.cli", "join", token, "--run-dir", str(base / f"{name}-node1")]
            start(join, {}, False)
        try:
            node0.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass
    finally:
        for proc in procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, 9)
                except ProcessLookupError:
                    pass
            proc.wait()
        try:
            _kill_run(json.loads((run_dir / "config.json").read_text())["run_id"])
        except (OSError, ValueError, KeyError):
            pass
        netns_down(ns)
    return judge(fault, "2 nodes", 2, hang_timeout, run_dir, mark_path, lines, node0.returncode)


def judge(fault, launcher, world, hang_timeout, run_dir, mark_path, lines, code) -> Row:
    """The row: what ddptui said (summary.json), against what the faulty rank wrote down."""
    try:
        diagnoses = json.loads((run_dir / "summary.json").read_text()).get("diagnoses") or []
    except (OSError, ValueError):
        diagnoses = []
    try:
        mark = json.loads(mark_path.read_text())
    except (OSError, ValueError):
        mark = None
    if fault in NOTED:
        return judge_note(fault, launcher, world, hang_timeout, diagnoses, mark, lines)
    named = [d for d in diagnoses if d.get("cause") in ("hang", "desync") and "#" in d["detail"]]
    verdicts = named or [
        d for d in diagnoses if d.get("cause") in ("hang", "desync", "crash", "oom")
    ]
    if not verdicts:
        healthy = fault in HEALTHY
        return Row(
            fault,
            launcher,
            world,
            "none",
            None,
            None,
            None,
            None,
            None,
            healthy and code == 0,
            f"exit {code}",
        )
    first = verdicts[0]
    # a crash names the rank; the collective comes from the ranks' traces (``context``)
    context = [d for d in diagnoses if d.get("cause") == "context" and "#" in d["detail"]]
    named_by = first if "#" in first["detail"] or not context else context[0]
    found = _OP.search(named_by["detail"])
    where = _WHERE.search(named_by["detail"])
    latency = None
    if mark is not None:
        for t, line in lines:
            if first["detail"][:60] in line:
                latency = t - mark["t"]
                break
    ok = False
    if fault not in HEALTHY and mark is not None:
        ok = (
            first.get("rank") == mark["rank"]
            and found is not None
            and found.group(1) == FAULTS[fault]
            and int(found.group(2)) == mark["seq"]
            and latency is not None
            and latency <= hang_timeout + 5
        )
    return Row(
        fault,
        launcher,
        world,
        first["cause"],
        first.get("rank"),
        found.group(1) if found else None,
        int(found.group(2)) if found else None,
        where.group(0) if where else None,
        latency,
        ok,
        truth(mark),
    )


def truth(mark: dict | None) -> str:
    """What the faulty rank wrote down, for the row's last column."""
    return "" if mark is None else f"fault: rank {mark['rank']} #{mark['seq']}"


def judge_note(fault, launcher, world, hang_timeout, diagnoses, mark, lines) -> Row:
    """A :data:`NOTED` fault's row: right when no verdict came and the waiting note named the
    faulty rank, at the function :data:`NOTED` gives, its stack in one place, the op the
    others wait in, within the timeout + 5 s of the fault."""
    verdict = next((d for d in diagnoses if d.get("cause") in ("hang", "desync")), None)
    note = next(((t, ln) for t, ln in lines if _NOTE.search(ln)), None)
    if verdict is not None or note is None:
        cause = verdict["cause"] if verdict is not None else "none"
        return Row(fault, launcher, world, cause, None, None, None, None, None, False, truth(mark))
    t, line = note
    op, rank, function = _NOTE.search(line).groups()
    where = _WHERE.search(line)
    latency = t - mark["t"] if mark is not None else None
    ok = (
        mark is not None
        and int(rank) == mark["rank"]
        and op == FAULTS[fault]
        and function == NOTED[fault]
        and "in one place" in line
        and latency is not None
        and latency <= hang_timeout + 5
    )
    return Row(
        fault,
        launcher,
        world,
        "waiting",
        int(rank),
        op,
        None,
        where.group(0) if where else None,
        latency,
        ok,
        truth(mark),
    )


def table(rows: list[Row]) -> str:
    head = f"{'fault':<11}{'launcher':<10}{'ranks':>5}  {'verdict':<8}{'rank':>5}  {'op #N':<16}"
    head += f"{'file:line':<20}{'s':>6}  right  truth"
    out = [head, "-" * len(head)]
    for r in rows:
        op = (f"{r.op} #{r.seq}" if r.seq is not None else r.op) if r.op else "-"
        lat = f"{r.latency:.1f}" if r.latency is not None else "-"
        rank = "-" if r.rank is None else str(r.rank)
        out.append(
            f"{r.fault:<11}{r.launcher:<10}{r.world:>5}  {r.verdict:<8}{rank:>5}  {op:<16}"
            f"{r.where or '-':<20}{lat:>6}  {'yes' if r.ok else 'NO':<5}  {r.note}"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--launchers", default="spawn,torchrun")
    p.add_argument("--world", default="2", help="world sizes, comma-separated (2,4)")
    p.add_argument("--hang-timeout", type=float, default=6.0)
    p.add_argument("--faults", default=",".join([*FAULTS, *HEALTHY]))
    p.add_argument("--keep", metavar="DIR", help="keep every run's directory under DIR")
    p.add_argument(
        "--nodes",
        default="1",
        help="1, 2 or 1,2: 2 runs each fault on two nodes (one rank each, node 1 in a "
        "network namespace: needs root)",
    )
    args = p.parse_args(argv)
    faults = [f for f in args.faults.split(",") if f]
    unknown = [f for f in faults if f not in FAULTS and f not in HEALTHY]
    if unknown:
        print(f"fault_matrix: unknown fault {unknown[0]!r}", file=sys.stderr)
        return 2
    rows = []
    start = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="fault-matrix-") as tmp:
        if args.keep:
            Path(args.keep).mkdir(parents=True, exist_ok=True)
            tmp = args.keep
        nodes = args.nodes.split(",")
        for world in [int(w) for w in args.world.split(",")] if "1" in nodes else []:
            for launcher in args.launchers.split(","):
                for fault in faults:
                    row = run_case(fault, launcher, world, args.hang_timeout, Path(tmp))
                    rows.append(row)
                    print(table([row]).splitlines()[-1], flush=True)
        for fault in faults if "2" in nodes else []:
            row = run_two_nodes(fault, args.hang_timeout, Path(tmp))
            rows.append(row)
            print(table([row]).splitlines()[-1], flush=True)
    print()
    print(table(rows))
    right = sum(r.ok for r in rows)
    print(f"\n{right}/{len(rows)} right (hang timeout {args.hang_timeout:g} s)")
    end = os.getloadavg()
    print(
        f"load average (1, 5, 15 min): {start[0]:.1f} {start[1]:.1f} {start[2]:.1f} at the "
        f"start, {end[0]:.1f} {end[1]:.1f} {end[2]:.1f} at the end; {os.cpu_count()} CPUs"
    )
    return 0 if right == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
