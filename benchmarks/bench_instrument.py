"""Zero-code instrumentation costs, printed as numbers (not a test).

Run: uv run python benchmarks/bench_instrument.py [--pairs N] [--rounds N]

1. Training step time with vs without the hooks (the built-in synthetic trainer's SmallCNN, DDP over
   gloo with one rank, on CPU, one thread, its batch sized for 10 ms and for 3 ms steps; a live
   collector in another process receives the steps): blocks of 0.8 s (four of the drainer's
   intervals: each holds its share of its work, ``bench_telemetry.BLOCK_S``) with and without,
   alternating in one run; each pair of blocks gives a ratio, and the figure is their median with a
   90 % distribution-free interval. Wall time (the goal) and the process's CPU time, and a step's
   extra microseconds split into the stepping thread's own CPU, its waiting (wall beyond its CPU:
   the GIL, a core) and the other threads' CPU (the drainer's, ZeroMQ's, gloo's). Goals: <= 1 % at
   10 ms steps, <= 3 % at 3 ms (``bench_telemetry.GOALS``).
2. The cost per hook call: a step of a near-empty model with vs without the hooks (fastest
   blocks), divided by the hook calls the step makes (DDP forward pre, pre/post on its inner
   module, one gradient hook once learned, ``backward``, optimizer pre/post);
   and the hooks' own Python bodies alone, called directly.
3. Why the forward hooks sit on DDP modules only: a torch *global* module hook (even a no-op)
   puts every submodule call on torch's slow path. The ratio of a 64-layer forward with one
   to without.

``--control`` measures the bench against itself (an A/A run): the "with" arm installs the
instrumentation and removes it again before its steps, so nothing of ddptui is on their path.
Its interval is the bench's own noise floor at that many pairs: a figure for the hooks whose
interval is no narrower than it says nothing finer. ``--step-ms 10`` (or 3) measures one step
size only, so that the pairs go where the question is.

``--without PART`` measures the step overhead with one part of the instrumentation left out
(``module``: the DDP forward hooks; ``optimizer``: the optimizer step hooks; ``backward``:
the ``Tensor.backward`` wrapper; ``collectives``: the collective wrappers; ``delivery``: the
steps are made but never handed to the reporter), so that where the overhead goes is a
number, not a guess: a part whose removal leaves the figure where it was costs less than the
interval shows. It may be repeated; ``--without all`` leaves every part out, so that what is
left is the cost of installing the instrumentation at all (its threads, its socket). The parts'
figures do not add up: without the optimizer hooks no step ends, so the gradient hooks never
learn the last parameter and stay on every parameter.

The step overhead is measured twice (``--allocator both``): with glibc's default allocator,
where SmallCNN's 10 ms step has activations over 32 MB that glibc maps and unmaps at every
step (hundreds to thousands of page faults per step, printed beside the figure, which make
the figure swing between runs), and in a child process whose allocator keeps its memory
(``KEEP_MEMORY_ENV``: as with jemalloc or tcmalloc, and on a GPU) to show what the hooks
cost without that noise.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from bench_telemetry import (  # noqa: E402
    BLOCK_S,
    GOALS,
    MIN_PAIRS,
    Clocks,
    allocator_line,
    load,
    paired_blocks,
    print_overhead,
    run_keeping_memory,
    settle,
    smallcnn_batch,
    smallcnn_step,
    start_collector_process,
)
from torch import nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

from ddptui.constants import ENDPOINT_ENV, RUN_ID_ENV  # noqa: E402
from ddptui.rank import instrument, reporter  # noqa: E402
from ddptui.rank.net import free_port  # noqa: E402
from trainers.models import SmallCNN  # noqa: E402

#: What ``--without`` leaves out: the Instrument method made a no-op for it.
WITHOUT = {
    "module": "watch",
    "optimizer": "_attach_optimizer",
    "backward": "_attach_backward",
    "collectives": "_attach_collectives",
    "delivery": "_deliver",
}


def leave_out(part: str) -> None:
    """Make the instrumentation run without ``part`` (see :data:`WITHOUT`)."""
    setattr(instrument.Instrument, WITHOUT[part], lambda self, *args, **kwargs: None)


#: ``--control``: the "with" arm installs and at once removes the instrumentation.
CONTROL = False


def hooks(on: bool, model: DistributedDataParallel) -> None:
    """Switch the instrumentation on (installed, watching ``model``) or off (removed); under
    :data:`CONTROL` "on" installs it and removes it again (nothing on the step path)."""
    instrument.uninstall()
    if on:
        instrument.install(force=True).watch(model)
        if CONTROL:
            instrument.uninstall()


def faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def overhead(pairs: int, goals: tuple[tuple[float, float], ...] = GOALS) -> None:
    """The hooks on vs off, at each goal's step time."""
    model = DistributedDataParallel(SmallCNN())
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def make_step(batch: int) -> Callable[[], None]:
        return smallcnn_step(model, opt, batch)

    for target, goal in goals:
        before = load()
        hooks(False, model)
        step = make_step(smallcnn_batch(make_step, target))

        faulted = [0, 0]  # page faults, steps (hooks off)

        def block(on: bool, steps: int, step=step, faulted=faulted) -> tuple[float, float]:
            hooks(on, model)
            # the hooks learn the last gradient; the new drainer starts (once a run)
            settle(step, instrument.LEARN_STEPS + 1)
            before_faults = faults()
            clocks = Clocks()
            for _ in range(steps):
                step()
            took = clocks.since(steps)
            if not on:
                faulted[0] += faults() - before_faults
                faulted[1] += steps
            return took

        off, on = paired_blocks(block, pairs, max(5, round(BLOCK_S / target)))
        hooks(False, model)
        print_overhead(f"{target * 1e3:.0f} ms steps", off, on, goal, before)
        print(f"  (the step without hooks takes {faulted[0] / faulted[1]:.0f} page faults)")


def per_hook_call(rounds: int) -> tuple[float, float]:
    """Microseconds per hook call and hook calls per step, on a near-empty model (the
    difference of the fastest blocks with and without the hooks)."""
    model = DistributedDataParallel(nn.Linear(2, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    x, y = torch.randn(4, 2), torch.randn(4, 1)

    def step() -> None:
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    def block(on: bool, n: int = 200) -> float:
        hooks(on, model)
        for _ in range(20):
            step()
        t0 = time.perf_counter()
        for _ in range(n):
            step()
        return (time.perf_counter() - t0) / n

    plain, hooked = [], []
    for _ in range(rounds):
        plain.append(block(False))
        hooked.append(block(True))
    inst = instrument.current()
    before = inst.hook_calls
    step()
    calls = inst.hook_calls - before
    hooks(False, model)
    # the fastest block of each kind: the least disturbed by anything else on the machine
    extra = min(hooked) - min(plain)
    return extra / calls * 1e6, calls


def hook_bodies(n: int = 5000, repeats: int = 5) -> tuple[float, float]:
    """Microseconds per step of the hook functions themselves, called directly in step order
    (fastest of ``repeats``): instrumentation's own Python on the step path, without torch's
    dispatch; and of the drainer's work per step (making and sending the step events, off the
    step path: here with its thread stopped, all of a round's steps sent at once)."""
    model = DistributedDataParallel(nn.Linear(2, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    x, y = torch.randn(4, 2), torch.randn(4, 1)
    hooks(True, model)
    inst = instrument.current()
    for _ in range(10):
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
    (watch,) = inst._watches.values()
    grad_hook, param = watch._hook(0), watch.params[0]  # the gradient hook torch would call
    inner = model.module
    best = drained = float("inf")
    inst.flush()
    inst._drainer.stop()  # this function sends the steps itself, timed apart
    chunk = 50  # steps per drain: 50 ms of 1 ms steps
    for _ in range(repeats):
        on_path = off_path = 0.0
        for _ in range(n // chunk):
            t0 = time.perf_counter()
            for _ in range(chunk):
                inst._outer_pre(model, (x,), {})
                inst._inner_pre(inner, (x,), {})
                inst._inner_post(inner, (x,), y)
                inst._backward_call(loss)
                grad_hook(param)
                inst._backward_return()
                inst._opt_pre(opt, (), {})
                inst._opt_post(opt, (), {})
            t1 = time.perf_counter()
            inst.send_ready()
            on_path += t1 - t0
            off_path += time.perf_counter() - t1
        steps = n // chunk * chunk
        best = min(best, on_path / steps * 1e6)
        drained = min(drained, off_path / steps * 1e6)
    hooks(False, model)
    return best, drained


#: The hook entry points torch calls on a step's path (besides the gradient hook, a closure
#: made by ``_GradWatch._hook``), timed in situ by :func:`in_situ`.
IN_SITU = (
    "_outer_pre", "_inner_pre", "_inner_post", "_backward_call", "_backward_return", "_opt_pre",
    "_opt_post",
)  # fmt: skip


def in_situ(target: float, pairs: int) -> tuple[float, float, float, float, dict[str, float]]:
    """The hooks' own time per step *inside* a training step (SmallCNN at ``target`` seconds a
    step), where the kernels before each hook have pushed the interpreter's code and data out
    of the CPU caches, against the same entries with every body returning at once (the
    instrument disabled: torch's call of the hook and this timing wrapper, the floor; a
    disabled instrument arms no gradient hook); and the drainer thread's CPU time making and
    sending those steps' events, off the step path (its drains during the blocks with the
    bodies on, over their steps). Interleaved blocks, medians. Returns (hooks, floor, step,
    drainer) in microseconds per step, and each entry's bodies (its time with the bodies on less
    its time with them returning at once, medians) in microseconds per step."""
    names = (*IN_SITU, "gradient")
    spent, live, clock = dict.fromkeys(names, 0.0), [False], time.perf_counter
    drained = [0.0]

    def timed(fn: Callable[..., object], name: str) -> Callable[..., object]:
        def wrapper(*args: object, **kwargs: object) -> object:
            if not live[0]:
                return fn(*args, **kwargs)
            t0 = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[name] += clock() - t0

        return wrapper

    def drain_timed(fn: Callable[..., bool]) -> Callable[..., bool]:
        def wrapper(*args: object) -> bool:
            if not live[0]:
                return fn(*args)
            t0 = time.thread_time()
            try:
                return fn(*args)
            finally:
                drained[0] += time.thread_time() - t0

        return wrapper

    cls, watch_cls = instrument.Instrument, instrument._GradWatch
    originals = {name: cls.__dict__[name] for name in (*IN_SITU, "_drain")}
    original_hook = watch_cls.__dict__["_hook"]
    for name, fn in originals.items():
        setattr(cls, name, drain_timed(fn) if name == "_drain" else timed(fn, name))
    watch_cls._hook = lambda watch, index: timed(original_hook(watch, index), "gradient")
    try:
        model = DistributedDataParallel(SmallCNN())
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        hooks(False, model)
        step = smallcnn_step(
            model, opt, smallcnn_batch(lambda b: smallcnn_step(model, opt, b), target)
        )
        steps = max(5, round(BLOCK_S / target))
        per_step: dict[bool, list[float]] = {False: [], True: []}  # by "disabled"
        by_name: dict[bool, dict[str, list[float]]] = {
            off: {name: [] for name in names} for off in (False, True)
        }
        step_s: list[float] = []
        drainer: list[float] = []
        for i in range(pairs):
            for disabled in (False, True) if i % 2 == 0 else (True, False):
                hooks(True, model)
                instrument.current().disabled = disabled
                settle(step, instrument.LEARN_STEPS + 1)
                spent.update(dict.fromkeys(names, 0.0))
                drained[0] = 0.0
                live[0] = True
                t0 = clock()
                for _ in range(steps):
                    step()
                live[0] = False
                step_s.append((clock() - t0) / steps)
                per_step[disabled].append(sum(spent.values()) / steps)
                for name in names:
                    by_name[disabled][name].append(spent[name] / steps)
                if not disabled:
                    drainer.append(drained[0] / steps)
        hooks(False, model)
    finally:
        for name, fn in originals.items():
            setattr(cls, name, fn)
        watch_cls._hook = original_hook
    median = statistics.median
    return (
        median(per_step[False]) * 1e6,
        median(per_step[True]) * 1e6,
        median(step_s) * 1e6,
        median(drainer) * 1e6,
        {
            name: (median(by_name[False][name]) - median(by_name[True][name])) * 1e6
            for name in names
        },
    )


def print_in_situ(goals: tuple[tuple[float, float], ...], pairs: int, warm: float | None) -> None:
    """:func:`in_situ` at each goal's step size: the larger step's kernels push more of the
    interpreter's code and data out of the caches, and the same hooks cost more inside it."""
    for target, _ in goals:
        before = load()
        hooked, floor, step_us, drainer, bodies = in_situ(target, pairs)
        against = f", against {warm:.1f} us called directly, warm" if warm is not None else ""
        print(
            f"in situ, inside {step_us / 1e3:.1f} ms SmallCNN steps: the hooks take "
            f"{hooked:.1f} us a step ({hooked / step_us * 100:.2f} % of it); with every body "
            f"returning at once {floor:.1f} us (torch's call of the hook and the timing): the "
            f"bodies {hooked - floor:.1f} us{against}; off the step path, the drainer thread's "
            f"CPU {drainer:.1f} us a step ({before})"
        )
        # The gradient hook is not armed while disabled: its figure has torch's call in it.
        print(
            "  the bodies by entry, us a step: "
            + ", ".join(f"{name.lstrip('_')} {us:.1f}" for name, us in bodies.items())
        )


def global_hook_ratio(rounds: int) -> float:
    net = nn.Sequential(*[nn.Linear(8, 8) for _ in range(64)])
    x = torch.randn(4, 8)

    def block(n: int = 300) -> float:
        t0 = time.perf_counter()
        with torch.no_grad():
            for _ in range(n):
                net(x)
        return (time.perf_counter() - t0) / n

    plain, hooked = [], []
    for _ in range(rounds):
        plain.append(block())
        handle = nn.modules.module.register_module_forward_pre_hook(lambda m, a: None)
        hooked.append(block())
        handle.remove()
    return min(hooked) / min(plain)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--pairs", type=int, default=60, help=f"pairs of blocks per step size (>= {MIN_PAIRS})"
    )
    parser.add_argument("--rounds", type=int, default=10, help="rounds of the per-call figures")
    parser.add_argument(
        "--allocator",
        choices=("both", "default", "keep"),
        default="both",
        help="the step overhead with glibc's default allocator, with one that keeps its "
        "memory (KEEP_MEMORY_ENV, in a child process), or both (default)",
    )
    parser.add_argument(
        "--without",
        action="append",
        choices=[*sorted(WITHOUT), "all"],
        help="measure the step overhead with this part of the instrumentation left out "
        "(repeatable; all: every part, so that what is left is installing it at all; with "
        "an allocator that keeps its memory; the per-call figures are skipped)",
    )
    parser.add_argument(
        "--control",
        action="store_true",
        help="an A/A run: the 'with' arm installs and removes the instrumentation before its "
        "steps (the bench's own noise floor; the per-call figures are skipped)",
    )
    parser.add_argument(
        "--step-ms",
        type=int,
        choices=sorted(round(t * 1e3) for t, _ in GOALS),
        help="measure this step size only",
    )
    parser.add_argument(
        "--in-situ",
        action="store_true",
        help="only the hooks' own time inside steps (and the drainer's off them), at each step "
        "size: quick, and less swayed by the machine than the step overhead",
    )
    opts = parser.parse_args()
    global CONTROL
    CONTROL = opts.control
    goals = tuple(g for g in GOALS if opts.step_ms in (None, round(g[0] * 1e3)))
    if opts.pairs < MIN_PAIRS:
        parser.error(f"--pairs must be at least {MIN_PAIRS} (the interval needs them)")
    if opts.control and opts.without:
        parser.error("--control measures nothing of ddptui: not with --without")
    if opts.in_situ and (opts.control or opts.without):
        parser.error("--in-situ times ddptui's hooks themselves: not with --control or --without")
    if opts.without or opts.control or opts.in_situ:
        opts.allocator = "keep"
    if opts.without:
        opts.without = sorted(WITHOUT) if "all" in opts.without else sorted(set(opts.without))
        for part in opts.without:
            leave_out(part)
    if opts.allocator == "keep":
        run_keeping_memory()

    torch.set_num_threads(1)
    torch.manual_seed(0)
    endpoint, stop = start_collector_process()
    os.environ[ENDPOINT_ENV] = endpoint
    os.environ[RUN_ID_ENV] = "bench"
    reporter.reset_reporter()
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1
    )
    try:
        if opts.in_situ:
            print(f"== the hooks in situ ({allocator_line()}; {opts.rounds * 2} pairs of blocks)")
            print_in_situ(goals, opts.rounds * 2, None)
            return
        print(
            f"== training step overhead of the hooks (SmallCNN in DDP, gloo, 1 rank, CPU, "
            f"1 thread; {opts.pairs} pairs of interleaved blocks of about "
            f"{BLOCK_S * 1e3:.0f} ms; live collector in another process)"
        )
        if opts.allocator == "keep":
            print(f"({allocator_line()})")
        if opts.without:
            parts = ", ".join(f"{part} (Instrument.{WITHOUT[part]})" for part in opts.without)
            print(f"(without {parts}: made no-ops)")
        if opts.control:
            print("(control, A/A: the 'with' arm has the instrumentation installed and removed)")
        overhead(opts.pairs, goals)
        if opts.allocator == "keep":
            return
        if opts.allocator == "both":
            sys.stdout.flush()
            again = [sys.executable, __file__, "--pairs", str(opts.pairs), "--allocator", "keep"]
            if opts.step_ms is not None:
                again += ["--step-ms", str(opts.step_ms)]
            subprocess.run(again, check=False)
        before = load()
        per_call, calls = per_hook_call(opts.rounds * 2)
        print(
            f"cost per hook call (torch's dispatch included): {per_call:.2f} us ({calls} calls "
            f"per step: {per_call * calls:.1f} us per step; {before})"
        )
        before = load()
        bodies, drained = hook_bodies()
        print(
            f"our own code on the step path (the hooks' bodies): {bodies:.1f} us per step, "
            f"{bodies / calls:.2f} us per hook call; off it, the drainer thread making and "
            f"sending the events: {drained:.1f} us per step ({before})"
        )
        print_in_situ(goals, opts.rounds * 2, bodies)
        ratio = global_hook_ratio(opts.rounds)
        print(
            f"a global no-op module hook on a 64-layer forward: {ratio:.2f}x its time "
            "(why the hooks sit on DDP modules only)"
        )
        rep = reporter.get_reporter()
        print(f"({rep.sent} events sent, {rep.dropped} dropped)")
    finally:
        stop()
        instrument.uninstall()
        reporter.reset_reporter()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
