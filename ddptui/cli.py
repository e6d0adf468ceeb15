"""Command line: one parser per command.

``ddptui [run options] [-- ARGS]`` opens the dashboard on a run (``--no-ui``: headless,
``--start``: launch at once); ``ddptui run ...`` says the same. ``ddptui monitor`` watches
GPUs and the host, ``ddptui replay RUN_DIR`` reopens a run; further commands (bench, compare,
export, and later join, attach) plug into :data:`COMMANDS` as modules with
``add_arguments(parser)`` and ``run(args) -> int``.

Every bad value is refused before any process starts: one line on stderr, exit code 2.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ddptui.commands import (
    USAGE_ERROR,
    CommandParser,
    UsageError,
    command_main,
    fail,
    no_terminal,
    tolerant_output,
)
from ddptui.constants import AMP_MODES, BACKEND_CHOICES, DEVICE_CHOICES, JOB_LAUNCHERS
from ddptui.headless import run_headless
from ddptui.monitor import cli as monitor_cli
from ddptui.run.cluster.slurm import sbatch_script
from ddptui.run.config import build_config, check_options
from ddptui.run.options import (
    TRAINER_OPTIONS,
    ConfigError,
    option_flag,
    parse_int,
    parse_path,
    script_option_problem,
)
from ddptui.run.registry import DEFAULT_TRAINER, registry
from ddptui.run.rundir import RunDirError, read_config
from ddptui.runfiles import RunDir
from ddptui.runs import attach, bench_report, compare
from ddptui.runs.bench import BenchOptions
from ddptui.runs.compare import RunFacts
from ddptui.runs.replay import print_replay

__all__ = ["COMMANDS", "USAGE_ERROR", "main", "run_parser", "add_run_arguments"]


@dataclass(frozen=True)
class Command:
    """A ``ddptui NAME`` command: where its arguments are declared and where it runs."""

    name: str
    summary: str
    arguments: str  # "module:function" adding the command's arguments to a parser
    handler: str  # "module:function" running it with the parsed arguments -> exit code
    passthrough: bool = False  # arguments after "--" land in args.script_args

    def available(self) -> bool:
        return all(
            importlib.util.find_spec(ref.partition(":")[0]) is not None
            for ref in (self.arguments, self.handler)
        )

    def main(self, argv: Sequence[str], prog: str | None = None) -> int:
        module = importlib.import_module(self.arguments.partition(":")[0])
        description = getattr(module, "DESCRIPTION", None) or (
            self.summary[:1].upper() + self.summary[1:] + "."
        )
        return command_main(
            prog or f"ddptui {self.name}",
            RUN_DESCRIPTION if self.name == "run" else description,
            _resolve(self.arguments),
            _resolve(self.handler),
            list(argv),
            passthrough=self.passthrough,
        )


def _resolve(ref: str):
    module, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module), attr)


RUN_DESCRIPTION = "Launch a PyTorch DDP run and watch every rank live."

COMMANDS: dict[str, Command] = {
    command.name: command
    for command in (
        Command(
            "run",
            "launch a run (the default command)",
            "ddptui.cli:add_run_arguments",
            "ddptui.cli:run_command",
            passthrough=True,
        ),
        Command(
            "monitor",
            "GPU (NVML), CPU and RAM monitor",
            "ddptui.monitor.cli:add_arguments",
            "ddptui.cli:monitor_command",
        ),
        Command(
            "replay",
            "reopen a finished or crashed run",
            "ddptui.cli:add_replay_arguments",
            "ddptui.cli:replay_command",
        ),
        Command(
            "bench",
            "measure a matrix of configurations",
            "ddptui.runs.bench:add_arguments",
            "ddptui.cli:bench_command",
            passthrough=True,
        ),
        Command(
            "compare",
            "runs side by side",
            "ddptui.runs.compare:add_arguments",
            "ddptui.cli:compare_command",
        ),
        Command(
            "export",
            "a run's events as CSV/TensorBoard",
            "ddptui.runs.export:add_arguments",
            "ddptui.runs.export:run",
        ),
        Command(
            "join",
            "join a multi-node run as one more node",
            "ddptui.join.command:add_arguments",
            "ddptui.join.command:run",
        ),
        Command(
            "attach",
            "watch a run another ddptui is running",
            "ddptui.runs.attach:add_arguments",
            "ddptui.cli:attach_command",
        ),
    )
}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    tolerant_output()
    word = argv[0] if argv else ""
    try:
        if word in COMMANDS:
            command = COMMANDS[word]
            if not command.available():
                return fail(f"'ddptui {word}' is not part of this installation")
            return command.main(argv[1:])
        if word and not word.startswith("-"):
            names = ", ".join(name for name, c in COMMANDS.items() if c.available())
            return fail(f"unknown command {word!r} (commands: {names}; run options start with --)")
        return COMMANDS["run"].main(argv, prog="ddptui")
    except (UsageError, ConfigError) as exc:
        return fail(str(exc))
    except KeyboardInterrupt:
        return 130
    except SystemExit as exc:  # --help, --version: argparse's own exit
        return exc.code if isinstance(exc.code, int) else 0


# -- run ------------------------------------------------------------------------------------------
def add_run_arguments(p: argparse.ArgumentParser) -> None:
    specs = registry().specs
    models = "; ".join(
        f"{name}: {' | '.join(spec.models)}" for name, spec in specs.items() if len(spec.models) > 1
    )
    commands = ", ".join(
        f"'ddptui {n}' ({c.summary})" for n, c in COMMANDS.items() if n != "run" and c.available()
    )
    p.epilog = (
        f"Commands: {commands}. Arguments after '--' go to your --script or --module (or to "
        "the trainer)."
    )
    p.add_argument("--no-ui", action="store_true", help="headless: log to the console")
    p.add_argument("--start", action="store_true", help="dashboard: launch at once, skip form")
    g = p.add_argument_group("run")
    g.add_argument(
        "--trainer", metavar="NAME", help=f"trainer: {', '.join(specs)} (default {DEFAULT_TRAINER})"
    )
    g.add_argument("--script", metavar="PATH", help="your own training script (run under torchrun)")
    g.add_argument(
        "--module",
        dest="script_module",
        metavar="NAME",
        help="your own training module, run as python -m NAME (torchrun's -m), found from the "
        "current directory and PYTHONPATH",
    )
    g.add_argument(
        "--launcher",
        metavar="NAME",
        help=f"{' | '.join(JOB_LAUNCHERS)} (default spawn; torchrun for --script and for "
        "--nnodes 2+; slurm: inside an allocation, one node agent per node via srun)",
    )
    g.add_argument(
        "--device",
        metavar="DEVICE",
        help=f"{' | '.join(DEVICE_CHOICES)} (default auto: cuda when a GPU is visible)",
    )
    g.add_argument(
        "--backend",
        metavar="NAME",
        help=f"{' | '.join(BACKEND_CHOICES)} (default auto: nccl for CUDA ranks)",
    )
    g.add_argument("--amp", metavar="MODE", help=f"{' | '.join(AMP_MODES)} (default off)")
    g.add_argument(
        "--world-size",
        metavar="N",
        help="number of ranks (default: one per visible GPU on CUDA, 2 on CPU)",
    )
    g.add_argument(
        "--oversubscribe",
        action="store_true",
        help="allow more than 4 CPU ranks per usable core (at most 1024 ranks)",
    )
    g.add_argument(
        "--workers",
        metavar="N",
        help="DataLoader workers per rank (default: a share of the cores on CUDA, 0 on CPU)",
    )
    g.add_argument(
        "--epochs",
        metavar="N",
        help="epochs (default: the trainer's); with --script, how many your script runs: "
        "the dashboard's progress and ETA only",
    )
    g.add_argument("--batch-size", metavar="N", help="batch size per rank")
    g.add_argument("--lr", metavar="LR", help="learning rate")
    g.add_argument("--seed", metavar="N", help="random seed (default 0)")
    g.add_argument("--model", metavar="NAME", help=f"model ({models})" if models else "model")
    g.add_argument(
        "--data-dir", metavar="DIR", help="dataset directory (mnist, cifar10, imagefolder)"
    )
    g.add_argument(
        "--run-dir", metavar="DIR", help="where to write the run (default runs/<run-id>)"
    )
    g.add_argument(
        "--resume",
        metavar="CHECKPOINT",
        help="checkpoint to resume from (continues at the next epoch)",
    )
    g.add_argument(
        "--init-method",
        metavar="URL",
        help="process-group init: tcp://HOST:PORT, file:///PATH or env://",
    )
    g.add_argument("--sync-bn", action="store_true", help="convert BatchNorm to SyncBatchNorm")
    g.add_argument(
        "--local-rank-arg",
        nargs="?",
        const="--local_rank",
        metavar="FLAG",
        help="pass each rank's script FLAG=LOCAL_RANK before its own arguments, as "
        "python -m torch.distributed.launch did (FLAG: --local_rank unless given, as in "
        "--local-rank-arg=--local-rank), for a script that takes its local rank as an argument",
    )
    d = p.add_argument_group("diagnosis")
    d.add_argument(
        "--hang-timeout",
        help="seconds without progress before a rank counts as hung "
        "(default: the larger of 60 s and 20x the median step time; 0: off)",
    )
    d.add_argument("--on-hang", help="when the run hangs: stop (tear it down, exit code 3) | keep")
    d.add_argument(
        "--no-instrument",
        action="store_true",
        help="no zero-code hooks in the ranks (steps only from ddptui.log)",
    )
    d.add_argument(
        "--no-flight-recorder",
        action="store_true",
        help="ranks do not record their collectives (torch's Flight Recorder, which names "
        "the rank and collective of a hang or desync)",
    )
    g.add_argument(
        "--max-restarts",
        metavar="N",
        help="after a rank fails, restart the whole group from the last checkpoint up to N "
        "times (default 0)",
    )
    m = p.add_argument_group("multi-node (torchrun's c10d rendezvous; names follow torchrun)")
    m.add_argument("--nnodes", metavar="N", help="nodes of the run (default 1)")
    m.add_argument("--nproc-per-node", metavar="P", help="ranks per node (world size = N x P)")
    m.add_argument(
        "--rdzv-endpoint",
        metavar="HOST:PORT",
        help="rendezvous hosted by this node (default: this machine's outbound address)",
    )
    m.add_argument(
        "--bind",
        metavar="ADDRESS",
        help="address the other nodes reach this one on (default: the rendezvous host)",
    )
    m.add_argument(
        "--print-sbatch",
        action="store_true",
        help="with --launcher slurm: print a ready sbatch script for these options",
    )


def run_parser() -> argparse.ArgumentParser:
    """The run command's parser (``ddptui [run options]``)."""
    p = CommandParser(prog="ddptui", description=RUN_DESCRIPTION)
    add_run_arguments(p)
    return p


def command_line_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the run command line as a whole, before any value is judged: an
    option given an empty value (on the command line a blank is a mistake, not "default"),
    or options that contradict each other. None when there is nothing."""
    for key, value in vars(args).items():
        if isinstance(value, str) and not value.strip():
            return f"{option_flag(key)} needs a value (it was given an empty one)"
    if args.no_ui and args.start:
        return "--start is for the dashboard; --no-ui always starts at once"
    return script_option_problem(vars(args))


def run_command(args: argparse.Namespace) -> int:
    problem = command_line_problem(args)
    if problem:
        return fail(problem)
    if args.print_sbatch:
        return _print_sbatch(args)
    raw = {k: v for k, v in vars(args).items() if k not in ("no_ui", "start", "print_sbatch")}
    raw["script_args"] = tuple(getattr(args, "script_args", ()))
    try:
        raw = continue_run_dir(raw)
        cfg = build_config(raw)
    except ConfigError as exc:
        return fail(str(exc))
    if args.no_ui:
        return run_headless(cfg)
    return _dashboard("run", cfg=cfg, raw=raw, start=args.start)


#: Options of a saved run that ``--resume RUN_DIR`` takes over (unless given again).
_CONTINUED = (
    "trainer", "script", "script_module", "launcher", "device", "backend", "amp", "world_size",
    "workers", "oversubscribe", "epochs", "batch_size", "lr", "seed", "data_dir", "init_method",
    "sync_bn", "model", "max_restarts", "local_rank_arg",
)  # fmt: skip


def continue_run_dir(raw: dict) -> dict:
    """``--resume RUN_DIR``: the run's options from its config.json (options given on this
    command line win) and its checkpoint; a new run directory. Other raws pass unchanged.
    Raises ConfigError (one line)."""
    resume = raw.get("resume")
    try:
        if not resume or not Path(str(resume)).is_dir():
            return raw
    except (OSError, ValueError):  # a name too long, a NUL: build_config says why
        return raw
    try:
        saved = read_config(resume)
    except RunDirError as exc:
        raise ConfigError("resume", f"--resume {resume}: {exc}") from None
    checkpoint = RunDir(resume).checkpoint
    if not checkpoint.is_file():
        raise ConfigError("resume", f"--resume {resume}: the run has no {checkpoint.name}")
    merged = dict(raw)
    given_target = raw.get("trainer") or raw.get("script") or raw.get("script_module")
    script_run = bool(
        raw.get("script") or raw.get("script_module") or (not given_target and saved.get("script"))
    )
    for key in _CONTINUED:
        if key in ("trainer", "script", "script_module") and given_target:
            continue
        if key == "script" and saved.get("script_module"):
            continue  # a module's run: its file is found again from its name
        if script_run and key in TRAINER_OPTIONS:
            continue  # a script's run has none (its saved seed, say, is only the default)
        if merged.get(key) in (None, False) and saved.get(key) not in (None, ""):
            merged[key] = saved[key]
    if not merged.get("script_args") and isinstance(saved.get("script_args"), list):
        merged["script_args"] = tuple(str(a) for a in saved["script_args"])
    if merged.get("script") or merged.get("script_module"):
        merged.pop("trainer", None)
        # ``--resume RUN_DIR --lr 0.1`` of a script's run: refused as with --script itself
        problem = script_option_problem(merged)
        if problem:
            raise ConfigError("resume", problem)
    merged["resume"] = str(checkpoint)
    return merged


#: Options --print-sbatch leaves to the allocation (not checked here, passed through).
_ALLOCATION_OPTIONS = (
    "no_ui", "start", "print_sbatch", "launcher", "nnodes", "nproc_per_node", "rdzv_endpoint",
    "bind", "device", "backend", "amp", "world_size", "oversubscribe", "script_args",
)  # fmt: skip
#: Fields whose problems --print-sbatch reports: they are wrong on any machine.
_JOB_INDEPENDENT = frozenset(
    {"trainer", "script", "script_module", "model", "epochs", "batch_size", "lr", "seed",
     "max_restarts", "hang_timeout", "on_hang", "workers", "init_method"}
)  # fmt: skip


def _print_sbatch(args: argparse.Namespace) -> int:
    """``--launcher slurm --print-sbatch``: the sbatch script for the same options."""
    if (args.launcher or "").strip().lower() != "slurm":
        return fail("--print-sbatch goes with --launcher slurm")
    # The same checks as a run, but only of values that do not depend on the allocation the
    # job will get (its nodes, GPUs and Slurm environment are not here yet).
    raw = {k: v for k, v in vars(args).items() if k not in _ALLOCATION_OPTIONS}
    raw["script_args"] = tuple(getattr(args, "script_args", ()))
    for problem in check_options(raw, deep=False):
        if problem.field in _JOB_INDEPENDENT:
            return fail(str(problem))

    nnodes = None if args.nnodes is None else parse_int("nnodes", args.nnodes, 1)
    nproc = (
        None if args.nproc_per_node is None else parse_int("nproc_per_node", args.nproc_per_node, 1)
    )
    argv: list[str] = []
    for key, value in vars(args).items():
        if key in ("no_ui", "start", "print_sbatch", "script_args") or value in (None, False):
            continue
        if isinstance(value, str) and value.startswith("-"):  # --local-rank-arg=--local_rank
            argv.append(f"{option_flag(key)}={value}")
        else:
            argv += [option_flag(key)] + ([] if value is True else [str(value)])
    extra = list(getattr(args, "script_args", ()))
    print(sbatch_script(argv + (["--", *extra] if extra else []), nnodes, nproc), end="")
    return 0


# -- monitor ------------------------------------------------------------------------------------
def monitor_command(args: argparse.Namespace) -> int:
    if args.no_ui or args.json:
        return monitor_cli.run(args)
    return _dashboard("monitor", interval=args.interval, pcie=args.pcie)


# -- replay -------------------------------------------------------------------------------------
def add_replay_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run directory")
    p.add_argument("--no-ui", action="store_true", help="print the run's summary instead")


def replay_command(args: argparse.Namespace) -> int:
    """Open a finished or crashed run."""
    try:
        run_dir = parse_path("run_dir", args.run_dir, label="RUN_DIR")
        ok = RunDir(run_dir).holds_run()
    except ConfigError as exc:  # a NUL byte, a name too long
        return fail(f"cannot open run directory: {exc}")
    except OSError as exc:
        return fail(f"cannot open run directory {args.run_dir}: {exc.strerror or exc}")
    if not ok:
        return fail(f"not a run directory (no events.jsonl): {run_dir}")
    try:
        read_config(run_dir)
        if args.no_ui:
            return print_replay(run_dir)
    except RunDirError as exc:
        return fail(str(exc))
    return _dashboard("replay", run_dir=run_dir)


# -- bench, compare, attach: the runs package does the work, the dashboard is opened here ------
def bench_command(args: argparse.Namespace) -> int:
    return bench_report.run(args, dashboard=_bench_dashboard)


def compare_command(args: argparse.Namespace) -> int:
    return compare.run(args, dashboard=_compare_dashboard)


def attach_command(args: argparse.Namespace) -> int:
    return attach.run(args, dashboard=_attach_dashboard)


# -- the dashboard: Textual is imported only here, so no --no-ui path ever loads it ------------
def _not_available(exc: ImportError, hint: str = "; use --no-ui") -> int:
    return fail(f"the dashboard is not available ({exc}){hint}")


def _dashboard(mode: str, **kwargs) -> int:
    if no_terminal():
        return fail(no_terminal())
    try:
        from ddptui.tui.app import run_dashboard  # Textual, only when a dashboard opens
    except ImportError as exc:
        return _not_available(exc)
    return run_dashboard(mode, **kwargs)


def _bench_dashboard(opts: BenchOptions) -> int:
    try:
        from ddptui.tui.screens.bench import run_bench_dashboard  # Textual, only now
    except ImportError as exc:
        return _not_available(exc)
    return run_bench_dashboard(opts)


def _compare_dashboard(runs: list[RunFacts]) -> int:
    try:
        from ddptui.tui.screens.compare import run_compare  # Textual, only now
    except ImportError as exc:
        return _not_available(exc)
    return run_compare(runs)


def _attach_dashboard(run_dir: Path) -> int:
    try:
        from ddptui.tui.attach_app import run_attach  # Textual, only now
    except ImportError as exc:
        return _not_available(exc, "")
    return run_attach(run_dir)


if __name__ == "__main__":
    sys.exit(main())
