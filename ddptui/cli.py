"""Command line: ``ddptui [run options]`` (dashboard), ``--no-ui`` (headless),
``ddptui monitor``, ``ddptui replay RUN_DIR``.

Every bad value is refused before any process starts: one line on stderr, exit code 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import NoReturn

from ddptui.argv import split_passthrough
from ddptui.config import ConfigError, build_config
from ddptui.constants import AMP_MODES, BACKEND_CHOICES, LAUNCHERS

USAGE_ERROR = 2


class UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad option in one line instead of usage + traceback."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def run_parser() -> argparse.ArgumentParser:
    from trainers import TRAINERS

    p = _Parser(
        prog="ddptui",
        description="Launch a PyTorch DDP run and watch every rank live.",
        epilog="Subcommands: 'ddptui monitor' (GPU/system monitor), 'ddptui replay RUN_DIR'. "
        "Arguments after '--' go to your --script (or to the trainer).",
    )
    p.add_argument("--no-ui", action="store_true", help="headless: log to the console")
    p.add_argument("--start", action="store_true", help="dashboard: launch at once, skip form")
    g = p.add_argument_group("run")
    g.add_argument("--trainer", help=f"built-in trainer: {', '.join(TRAINERS)} (default synthetic)")
    g.add_argument("--script", help="your own training script (run under torchrun)")
    g.add_argument(
        "--launcher", help=f"{' | '.join(LAUNCHERS)} (default spawn; torchrun for --script)"
    )
    g.add_argument(
        "--backend", help=f"{' | '.join(BACKEND_CHOICES)} (default auto: nccl with CUDA)"
    )
    g.add_argument("--amp", help=f"{' | '.join(AMP_MODES)} (default off)")
    g.add_argument("--world-size", help="number of ranks (default 2)")
    g.add_argument("--epochs", help="epochs (default: the trainer's)")
    g.add_argument("--batch-size", help="batch size per rank")
    g.add_argument("--lr", help="learning rate")
    g.add_argument("--seed", help="random seed (default 0)")
    g.add_argument("--model", help="model for cifar10/imagefolder: resnet18 | resnet50")
    g.add_argument("--data-dir", help="dataset directory (mnist, cifar10, imagefolder)")
    g.add_argument("--run-dir", help="where to write the run (default runs/<run-id>)")
    g.add_argument("--resume", help="checkpoint to resume from (continues at the next epoch)")
    g.add_argument("--init-method", help="process-group init: tcp://HOST:PORT or file://PATH")
    g.add_argument("--sync-bn", action="store_true", help="convert BatchNorm to SyncBatchNorm")
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
    return p


def fail(message: str) -> int:
    print(f"ddptui: error: {message}", file=sys.stderr)
    return USAGE_ERROR


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] == "monitor":
            return monitor_main(argv[1:])
        if argv and argv[0] == "replay":
            return replay_main(argv[1:])
        return run_main(argv)
    except UsageError as exc:
        return fail(str(exc))
    except KeyboardInterrupt:
        return 130


def run_main(argv: list[str]) -> int:
    own, passthrough = split_passthrough(argv)
    args = run_parser().parse_args(own)
    raw = {k: v for k, v in vars(args).items() if k not in ("no_ui", "start")}
    raw["script_args"] = tuple(passthrough)
    try:
        cfg = build_config(raw)
    except ConfigError as exc:
        return fail(str(exc))
    if args.no_ui:
        from ddptui.headless import run_headless

        return run_headless(cfg)
    return _dashboard("run", cfg=cfg, raw=raw, start=args.start)


def monitor_main(argv: list[str]) -> int:
    p = _Parser(prog="ddptui monitor", description="Live GPU and system monitoring.")
    p.add_argument("--no-ui", action="store_true", help="print to the console")
    p.add_argument("--interval", default="1.0", help="seconds between samples (min 0.1)")
    p.add_argument("--count", help="stop after N samples")
    p.add_argument("--json", action="store_true", help="one JSON object per sample")
    args = p.parse_args(argv)
    from ddptui.config import parse_float, parse_int

    try:
        interval = parse_float("interval", args.interval)
        count = None if args.count is None else parse_int("count", args.count, 1)
    except ConfigError as exc:
        return fail(str(exc))
    if interval < 0.1:
        return fail(f"--interval must be at least 0.1 s, got {interval:g}")
    if args.no_ui or args.json:
        from ddptui.monitor.cli import run_monitor_headless

        return run_monitor_headless(interval=interval, count=count, as_json=args.json)
    return _dashboard("monitor", interval=interval)


def replay_main(argv: list[str]) -> int:
    p = _Parser(prog="ddptui replay", description="Open a finished or crashed run.")
    p.add_argument("run_dir")
    p.add_argument("--no-ui", action="store_true", help="print the run's summary instead")
    args = p.parse_args(argv)
    run_dir = Path(args.run_dir)
    from ddptui.rundir import RunDir, RunDirError, read_config

    if not RunDir(run_dir).events.is_file():
        return fail(f"not a run directory (no events.jsonl): {run_dir}")
    try:
        read_config(run_dir)
        if args.no_ui:
            from ddptui.replay import print_replay

            return print_replay(run_dir)
    except RunDirError as exc:
        return fail(str(exc))
    return _dashboard("replay", run_dir=run_dir)


def _dashboard(mode: str, **kwargs) -> int:
    try:
        from ddptui.tui.app import run_dashboard
    except ImportError as exc:
        return fail(f"the dashboard is not available ({exc}); use --no-ui")
    return run_dashboard(mode, **kwargs)


if __name__ == "__main__":
    sys.exit(main())
