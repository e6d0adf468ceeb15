"""A rank under ddptui vs the same script under plain torchrun: time from launch to the first
step and peak RSS per rank, printed as ratios measured in one run (not a test).

Run: python benchmarks/bench_startup.py [--rounds N] [--steps N] [--models N --width W]

The script is ``benchmarks/startup_ddp.py`` (plain DDP, gloo, 2 ranks on the CPU, no ddptui
import). Arms, interleaved and rotated each round so a busy machine weighs on all alike:

- ``plain``: ``python -m torch.distributed.run --standalone --nproc-per-node 2 script``;
- ``ddptui``: ``ddptui --no-ui --script script --launcher torchrun --world-size 2``;
- ``ddptui --no-instrument``: the same without the zero-code hooks (what instrumentation costs).

Each rank reports wall-clock times of its script's start, torch imported, process group ready
and first step, the page faults between those two, and its peak RSS (``ru_maxrss``: the whole
rank process, ddptui's rank side included). Printed: medians over the rounds (range in
brackets), the ratios ddptui / plain (goal: <= 1.05 on both), the phases of launch -> first
step per arm (where ddptui's extra goes), and what ddptui's rank-side imports cost on top of
``import torch`` (time and memory, and which heavy modules they pull in).

``--models N --width W``: each rank trains N models one after another, each let go before the
next is made (a fold after a fold), with W hidden features: the peak RSS ratio then says
whether a rank under ddptui lets each model's memory go as plain torch does (sixty-third
session: the gradient watch kept every DDP module's parameters to the end).
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from ddptui.runs import benchmath

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "startup_ddp.py"
WORLD = 2
GOAL = 1.05
RUN_TIMEOUT_S = 180.0
#: Phases of launch -> first step, from the rank's own timestamps (rank 0's).
PHASES = (
    ("launch -> torchrun agent created", None, "agent_created"),
    ("agent -> rank process created", "agent_created", "rank_created"),
    ("rank created -> script starts", "rank_created", "script_start"),
    ("script -> torch imported", "script_start", "torch_imported"),
    ("torch -> process group", "torch_imported", "group_ready"),
    ("group -> first step", "group_ready", "first_step"),
)
#: Rank 0's minor page faults from the process group to the first step: DDP's constructor
#: imports ``torch._dynamo`` there, and where the interpreter's frame stack grows and shrinks
#: across a chunk's end at every import, each crossing maps fresh memory (see
#: ``ddptui.rank.headroom``): 15,000 more faults and 0.08-0.1 s under ddptui until the
#: sixty-fifth session.
FAULTS = "page faults, group -> first step"
#: What the rank side of ddptui imports (the rank entry, the reporter, the hooks).
RANK_SIDE = ("ddptui.rank.entry", "ddptui.rank.reporter", "ddptui.rank.instrument")
HEAVY = ("torchvision", "textual", "rich", "psutil", "msgspec", "zmq", "numpy", "yaml")


def ddptui_command() -> list[str]:
    exe = shutil.which("ddptui", path=str(Path(sys.executable).parent)) or shutil.which("ddptui")
    # Not installed (a checkout on PYTHONPATH): the same entry point through the interpreter.
    return [exe] if exe else [sys.executable, "-m", "ddptui.console"]


def arm_command(arm: str, run_dir: Path) -> list[str]:
    if arm == "plain":
        return [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    ddptui = [*ddptui_command(), "--no-ui", "--script", str(SCRIPT), "--launcher", "torchrun"]
    ddptui += ["--world-size", str(WORLD), "--device", "cpu", "--run-dir", str(run_dir)]
    return ddptui + (["--no-instrument"] if arm == "ddptui --no-instrument" else [])


def run_arm(arm: str, steps: int, workdir: Path, models: int = 1, width: int = 128) -> dict:
    """Launch one arm once; the ranks' records, with ``launch`` (wall time just before start)."""
    out = workdir / "out"
    out.mkdir(parents=True)
    cmd = arm_command(arm, workdir / "run")
    if arm == "plain":
        cmd += ["--nproc-per-node", str(WORLD), str(SCRIPT)]
    env = {**os.environ, "STARTUP_OUT": str(out), "STARTUP_STEPS": str(steps)}
    env |= {"STARTUP_MODELS": str(models), "STARTUP_WIDTH": str(width)}
    env.setdefault("OMP_NUM_THREADS", "1")  # what torchrun sets for nproc > 1; same for both
    # Plain torchrun leaves a torchelastic_* log directory in the temporary folder at every
    # launch (60 of them from two runs of 30 rounds): each arm's go in its own, removed.
    env["TMPDIR"] = str(workdir)
    log = open(workdir / "console.txt", "wb")  # noqa: SIM115 - closed below
    launch = time.time()
    proc = subprocess.Popen(
        cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    # Process creation times (from /proc: boot time + ticks) are off the wall clock by up to a
    # second; the launched process's own creation time, taken the same way, is the zero for
    # them (it was created within milliseconds of ``launch``).
    try:
        created = psutil.Process(proc.pid).create_time()
    except psutil.Error:
        created = None
    # CPU the launched process spends itself (its children not counted): for ddptui, the
    # dashboard-less front end (collector, monitor, console) that shares the cores with the
    # ranks; for plain, torchrun's agent. Sampled until it exits.
    own_cpu = 0.0
    deadline = time.monotonic() + RUN_TIMEOUT_S
    try:
        watched = psutil.Process(proc.pid)
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                times = watched.cpu_times()
                own_cpu = times.user + times.system
            except psutil.Error:
                pass
            time.sleep(0.1)
    except psutil.Error:
        pass
    try:
        proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # this run's own session: nothing else
        proc.wait()
        raise SystemExit(f"bench_startup: {arm} did not finish in {RUN_TIMEOUT_S:.0f} s") from None
    finally:
        log.close()
    ranks = [json.loads(p.read_text()) for p in sorted(out.glob("rank-*.json"))]
    if len(ranks) != WORLD:  # a rank never reached its first step: nothing to measure
        tail = (workdir / "console.txt").read_text(errors="replace")[-2000:]
        raise SystemExit(f"bench_startup: {arm} exited {proc.returncode}:\n{tail}")
    # Every rank wrote its record (after its first step). A non-zero exit after that is
    # counted, not fatal: plain torchrun on this torch now and then ends 1 when a rank aborts
    # in native teardown after its last line, which says nothing about its start-up.
    end = time.time()
    return {
        "launch": launch,
        "created": created,
        "end": end,
        "ranks": ranks,
        "cpu": own_cpu,
        "exit": proc.returncode,
    }


def figures(record: dict) -> dict:
    launch = record["launch"]
    ranks = record["ranks"]
    rank0 = next(r for r in ranks if r["rank"] == 0)
    out = {
        "first step (s)": min(r["first_step"] for r in ranks) - launch,
        "peak RSS/rank (MiB)": max(r["maxrss_kib"] for r in ranks) / 1024,
        "launch -> exit (s)": record["end"] - launch,
        "launcher process CPU (s)": record["cpu"],
    }
    chain = rank0["ancestors"]
    agent = next(
        (a for a in chain[1:] if "torch.distributed.run" in a["cmd"] or "torchrun" in a["cmd"]),
        chain[1],
    )
    offset = (record["created"] - launch) if record["created"] is not None else 0.0
    rank0["rank_created"] = chain[0]["started"] - offset
    rank0["agent_created"] = agent["started"] - offset
    for name, start, end in PHASES:
        begin = launch if start is None else rank0[start]
        out[name] = rank0[end] - begin
    out[FAULTS] = rank0["faults_group_to_first_step"]
    out["modules"] = rank0["modules"]
    out["torch before script"] = rank0["torch_before_script"]
    out["exit"] = record["exit"]
    return out


def import_cost() -> dict:
    """What importing ddptui's rank side costs on top of ``import torch``, in a fresh process."""
    code = (
        "import resource, sys, time, json\n"
        "import torch\n"
        "r0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "t0 = time.perf_counter()\n"
        f"for name in {RANK_SIDE!r}: __import__(name)\n"
        "t1 = time.perf_counter()\n"
        "r1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "new = sorted(m for m in sys.modules if m.split('.')[0] in "
        f"{HEAVY!r} and '.' not in m)\n"
        "print(json.dumps({'s': t1 - t0, 'kib': r1 - r0, 'heavy': new}))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    # Which of our modules cost most, from -X importtime, torch already imported.
    times = subprocess.run(
        [
            sys.executable,
            "-X",
            "importtime",
            "-c",
            "import torch\n" + "\n".join(f"import {name}" for name in RANK_SIDE),
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stderr
    after_torch = times[times.index("| torch\n") :] if "| torch\n" in times else times
    rows = []
    for line in after_torch.splitlines():
        parts = [p.strip() for p in line.removeprefix("import time:").split("|")]
        if len(parts) == 3 and parts[1].isdigit():
            name = parts[2]
            depth = len(line.split("|")[2]) - len(line.split("|")[2].lstrip())
            if depth <= 3:  # top-level imports of that code (and their direct children)
                rows.append((int(parts[1]), name))
    result["top"] = sorted(rows, reverse=True)[:8]
    return result


#: Peak RSS of a fresh interpreter after each of these (the synthetic trainer: its modules,
#: data and model, as its rank builds them before training).
IMPORTS = (
    ("python alone", "pass"),
    ("import torch", "import torch"),
    ("import torch, torchvision", "import torch, torchvision"),
    (
        "synthetic trainer rank (modules, data, model)",
        "import ddptui.rank.entry\n"
        "from trainers import synthetic\n"
        "from trainers.options import parse_config\n"
        "config = parse_config(synthetic.build_arg_parser(), ['--epochs', '1'])\n"
        "data = synthetic.build_data(config, None, None)\n"
        "synthetic.build_model(config, data.num_classes)",
    ),
)


def import_rss() -> list[tuple[str, float, float]]:
    """(what, peak RSS MiB, seconds) of a fresh interpreter doing each of ``IMPORTS``."""
    out = []
    for name, code in IMPORTS:
        probe = (
            "import resource, time\nt0 = time.perf_counter()\n" + code + "\n"
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "
            "time.perf_counter() - t0)\n"
        )
        done = subprocess.run(
            [sys.executable, "-c", probe], capture_output=True, text=True, check=True
        )
        kib, seconds = done.stdout.split()[-2:]
        out.append((name, int(kib) / 1024, float(seconds)))
    return out


def median_range(values: list[float]) -> str:
    med = statistics.median(values)
    return f"{med:7.2f} ({min(values):.2f}–{max(values):.2f})"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3, help="rounds of every arm (default 3)")
    p.add_argument("--steps", type=int, default=20, help="steps per run (default 20)")
    p.add_argument(
        "--models", type=int, default=1, help="models trained one after another (default 1)"
    )
    p.add_argument("--width", type=int, default=128, help="their hidden features (default 128)")
    p.add_argument(
        "--no-instrument-arm",
        action="store_true",
        help="also run ddptui --no-instrument (what the hooks cost)",
    )
    args = p.parse_args()
    arms = ["plain", "ddptui"] + (["ddptui --no-instrument"] if args.no_instrument_arm else [])
    # torch comes with bytecode (uv installs with compile-bytecode), and so does ddptui when
    # installed as a wheel. A source checkout under PYTHONDONTWRITEBYTECODE has none for
    # ddptui: every ddptui process would compile its modules anew (~0.1 s each), a cost of
    # this checkout, not of ddptui. Compile them once, as an install would have.
    if sys.dont_write_bytecode:
        import ddptui

        compileall.compile_dir(Path(ddptui.__file__).parent, quiet=1)
    load_before = os.getloadavg()
    results: dict[str, list[dict]] = {arm: [] for arm in arms}
    with tempfile.TemporaryDirectory(prefix="ddptui-startup-") as tmp:
        for n in range(args.rounds):
            order = arms[n % len(arms) :] + arms[: n % len(arms)]
            for arm in order:
                work = Path(tmp) / f"{n}-{arm.replace(' ', '_')}"
                run = run_arm(arm, args.steps, work, args.models, args.width)
                results[arm].append(figures(run))
                print(
                    f"round {n + 1}/{args.rounds} {arm}: first step "
                    f"{results[arm][-1]['first step (s)']:.2f} s",
                    flush=True,
                )
    load_after = os.getloadavg()
    for arm in arms:
        failed = sum(r["exit"] != 0 for r in results[arm])
        if failed:
            print(
                f"{arm}: exited non-zero after every rank's first step in {failed} of "
                f"{args.rounds} rounds (counted: start-up was measured)"
            )
    cores = len(os.sched_getaffinity(0))
    print(
        f"\n{WORLD} CPU ranks, gloo, {args.steps} steps"
        + (f" of each of {args.models} models of width {args.width}" if args.models > 1 else "")
        + f", {args.rounds} rounds; {cores} usable "
        f"cores, load average {load_before[0]:.1f} before, {load_after[0]:.1f} after "
        "(a loaded machine: read the ratios, not the seconds)"
    )
    keys = ["first step (s)", "peak RSS/rank (MiB)", "launch -> exit (s)"]
    keys += ["launcher process CPU (s)"]
    keys += [name for name, _, _ in PHASES] + [FAULTS]
    width = max(len(k) for k in keys)
    print(f"{'median (range)':{width}}  " + "  ".join(f"{arm:>24}" for arm in arms))
    for key in keys:
        cells = [median_range([r[key] for r in results[arm]]) for arm in arms]
        print(f"{key:{width}}  " + "  ".join(f"{c:>24}" for c in cells))
    print()
    for key in ("first step (s)", "peak RSS/rank (MiB)"):
        for arm in arms[1:]:
            # Paired by round (the arms of a round ran back to back, under the same load).
            ratios = [
                ours[key] / plain[key]
                for ours, plain in zip(results[arm], results["plain"], strict=True)
            ]
            around = benchmath.median_interval(ratios)
            if around.source == benchmath.FROM_NOTHING:
                verdict = "one round: no interval, run more rounds"
            elif around.high <= GOAL:
                verdict = "within the goal"
            elif around.low > GOAL:
                verdict = "over the goal"
            else:
                verdict = "not resolved on this machine (the interval spans the goal)"
            print(
                f"{key}: {arm} / plain = {around.median:.3f} per round, interval "
                f"{around.low:.3f}–{around.high:.3f} over {around.count} rounds "
                f"(goal <= {GOAL}): {verdict}"
            )
    for arm in arms:
        mods = results[arm][-1]["modules"]
        held = ", ".join(k for k, v in mods.items() if v is True) or "none"
        print(
            f"{arm}: at the first step the rank holds {held}; "
            f"{mods.get('ddptui_modules', 0)} ddptui modules; torch imported before the "
            f"script: {results[arm][-1]['torch before script']}"
        )
    cost = import_cost()
    print(
        f"\nddptui rank side ({', '.join(RANK_SIDE)}) on top of import torch: "
        f"{cost['s'] * 1000:.0f} ms, +{cost['kib'] / 1024:.1f} MiB peak RSS; heavy modules "
        f"then loaded: {', '.join(cost['heavy']) or 'none'}"
    )
    print(
        "largest of its imports (cumulative ms): "
        + ", ".join(f"{name} {us / 1000:.0f}" for us, name in cost["top"])
    )
    print("\nin a fresh interpreter (peak RSS, and the time of the code after start-up):")
    for name, mib, seconds in import_rss():
        print(f"  {name:46} {mib:6.0f} MiB  {seconds:5.2f} s")


if __name__ == "__main__":
    main()
