"""Run options as values: the frozen :class:`RunConfig`, the one-line :class:`ConfigError`,
the limits, and the parsers of single values that argparse and the dashboard form share.

Checking a whole set of options is :mod:`ddptui.run.config`; this module imports nothing of
the checks, so the cluster and launcher modules can raise and carry options freely.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddptui.constants import (
    DEFAULT_CPU_WORLD_SIZE,
    DEVICE_ENV,
    LOCAL_RANK_ARG_ENV,
    NO_INSTRUMENT_ENV,
    THREADS_ENV,
)
from ddptui.formatting import printable, target_label
from ddptui.rank.flight_recorder import BUFFER_ENV as FR_BUFFER_ENV
from ddptui.rank.flight_recorder import DEFAULT_BUFFER as FR_DEFAULT_BUFFER
from ddptui.run.registry import DEFAULT_TRAINER
from ddptui.runfiles import RunDir

#: Ranks ddptui starts on one machine, even with ``--oversubscribe``.
MAX_LOCAL_RANKS = 1024


MAX_EPOCHS = 1_000_000


MAX_BATCH_SIZE = 2**20


#: Seeds go to torch, numpy and random alike: numpy's range is the narrowest.
MAX_SEED = 2**32 - 1


#: DataLoader workers per rank.
MAX_WORKERS = 64


#: The default on CUDA: a fair share of the usable cores per local rank, at most this many.
MAX_DEFAULT_WORKERS = 8


#: POSIX limits of a file name (one path component) and a whole path, in bytes.
NAME_MAX = 255


PATH_MAX = 4096


#: Nodes of one multi-node run.
MAX_NODES = 4096


#: A training script larger than this is refused without being read.
MAX_SCRIPT_BYTES = 16 * 2**20


class ConfigError(ValueError):
    """A run option that cannot work; ``field`` names the option, ``str()`` is the message."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class RunConfig:
    """Everything that defines a run. ``None`` means "the trainer's default"."""

    trainer: str = DEFAULT_TRAINER
    script: str | None = None
    #: ``--module NAME``: the user's code is a module, run as ``python -m NAME`` (torchrun's
    #: ``-m``); :attr:`script` is then its file (every check of a script holds for it).
    script_module: str | None = None
    script_args: tuple[str, ...] = ()
    #: ``--local-rank-arg``: each rank's script gets ``FLAG=LOCAL_RANK`` before its own
    #: arguments, as ``python -m torch.distributed.launch`` gave it (``--local_rank``); None:
    #: not passed (torchrun's way: ``LOCAL_RANK`` in the environment only).
    local_rank_arg: str | None = None
    launcher: str = "spawn"
    device: str = "cpu"  # resolved: never "auto" once built
    backend: str = "gloo"  # resolved: never "auto" once built
    amp: str = "off"
    world_size: int = DEFAULT_CPU_WORLD_SIZE
    workers: int = 0  # DataLoader workers per rank (built-in trainers)
    oversubscribe: bool = False
    epochs: int | None = None
    batch_size: int | None = None
    lr: float | None = None
    seed: int = 0
    data_dir: str | None = None
    run_dir: str | None = None
    resume: str | None = None
    init_method: str | None = None
    sync_bn: bool = False
    model: str | None = None
    #: Restarts of the whole group after a rank fails (torchrun's ``--max-restarts``).
    max_restarts: int = 0
    trainer_module: str | None = None  # the module every rank runs (None for a script)
    run_id: str = ""
    #: Seconds without progress before a rank counts as hung (None: the default rule, 0: off).
    hang_timeout: float | None = None
    #: What to do with a hung run: ``stop`` (exit code 3) or ``keep`` it running.
    on_hang: str = "stop"
    #: Zero-code instrumentation hooks in every rank (``--no-instrument`` turns them off).
    instrument: bool = True
    #: torch's Flight Recorder in every rank (``--no-flight-recorder`` turns it off).
    flight_recorder: bool = True
    #: Multi-node runs (torchrun's c10d rendezvous): nodes, the rendezvous HOST:PORT that
    #: node 0 hosts, and the address the telemetry and join sockets bind on node 0.
    nnodes: int = 1
    rdzv_endpoint: str | None = None
    bind: str | None = None

    @property
    def multinode(self) -> bool:
        """Ranks on other nodes (or under Slurm): CURVE telemetry, ``ddptui join`` agents."""
        return self.nnodes > 1 or self.launcher == "slurm"

    @property
    def nproc_per_node(self) -> int:
        return self.world_size // max(1, self.nnodes)

    @property
    def target_label(self) -> str:
        return target_label(
            {"trainer": self.trainer, "script": self.script, "script_module": self.script_module}
        )

    def to_json_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def trainer_argv(self) -> list[str]:
        """Arguments for the trainer module (or the user's script, which gets its own)."""
        if self.script:
            return list(self.script_args)
        argv = ["--backend", self.backend, "--device", self.device, "--amp", self.amp]
        argv += ["--seed", str(self.seed), "--workers", str(self.workers)]
        for flag, value in (
            ("--epochs", self.epochs),
            ("--batch-size", self.batch_size),
            ("--lr", self.lr),
            ("--data-dir", self.data_dir),
            ("--resume", self.resume),
            ("--init-method", self.init_method),
            ("--model", self.model),
        ):
            if value is not None:
                argv += [flag, str(value)]
        if self.sync_bn:
            argv.append("--sync-bn")
        if self.run_dir:
            argv += ["--checkpoint", str(RunDir(self.run_dir).checkpoint)]
        return argv + list(self.script_args)

    def rank_environment(self) -> dict[str, str]:
        """Environment every rank gets on top of the launcher's, for trainers and scripts alike.

        ``DDPTUI_DEVICE`` is ``cuda`` (rank ``LOCAL_RANK`` uses ``cuda:LOCAL_RANK``) or ``cpu``.
        Under ``cpu`` the GPUs are also hidden (``CUDA_VISIBLE_DEVICES=""``): CPU ranks are then
        CPU ranks for every script, including one that picks CUDA whenever it sees a GPU, and
        no rank creates a CUDA context on a GPU it does not use. A script that wants the GPUs
        runs with ``--device cuda`` (or ``auto``). ``--no-instrument`` sets
        ``DDPTUI_NO_INSTRUMENT=1`` (the rank entry then installs no zero-code hooks).
        Collectives are recorded by torch's Flight Recorder (``TORCH_FR_BUFFER_SIZE``, unless
        the user set it); ``--no-flight-recorder`` sets it to 0. The user's own
        ``OMP_NUM_THREADS`` (a whole number, 1 to 4096) is each rank's threads, as under
        torchrun, unless ``DDPTUI_THREADS`` says otherwise: the launchers and the rank entry
        otherwise set every rank to its share of the cores.
        """
        env = {DEVICE_ENV: self.device}
        omp = os.environ.get("OMP_NUM_THREADS", "").strip()
        if (
            THREADS_ENV not in os.environ
            and omp.isascii()
            and omp.isdigit()
            and 0 < int(omp) <= 4096
        ):
            env[THREADS_ENV] = str(int(omp))
        if self.device == "cpu":
            env["CUDA_VISIBLE_DEVICES"] = ""
        if not self.instrument:
            env[NO_INSTRUMENT_ENV] = "1"
        if self.local_rank_arg:
            env[LOCAL_RANK_ARG_ENV] = self.local_rank_arg
        if not self.flight_recorder:
            env[FR_BUFFER_ENV] = "0"
        elif FR_BUFFER_ENV not in os.environ:
            env[FR_BUFFER_ENV] = str(FR_DEFAULT_BUFFER)
        return env


#: Run options only the built-in trainers read: a ``--script`` reads its own arguments (after
#: ``--``), so one of these beside it would be taken and ignored, a silent lie.
TRAINER_OPTIONS = ("trainer", "model", "batch_size", "lr", "seed", "workers", "data_dir", "sync_bn")


def script_option_problem(values: dict[str, Any]) -> str | None:
    """Why options given with ``--script`` or ``--module`` cannot be (a built-in trainer's
    option, an AMP mode ddptui cannot switch on in a script, or both of them), as one line;
    None when there is none.
    ``values``: option name -> value as given (None or False: not given)."""
    if values.get("script_module") is not None:
        if values.get("script") is not None:
            return "--script and --module both name your code: give one of them"
        given = "--module runs your own module"
    elif values.get("script") is not None:
        given = "--script runs your own script"
    else:
        return None
    for key in TRAINER_OPTIONS:
        if values.get(key) not in (None, False):
            return (
                f"{given}: {option_flag(key)} is for the built-in "
                "trainers (pass your script's options after --)"
            )
    amp = values.get("amp")  # one mode, or bench's list of them; None or "off": no AMP
    if any(mode not in (None, "off") for mode in (amp if isinstance(amp, list) else [amp])):
        return (
            f"{given}: --amp is for the built-in trainers (your script "
            "does its own autocast, or none; pass its options after --)"
        )
    return None


def module_in_script_field(text: str) -> str | None:
    """The module a form's script field names as ``python`` takes it (``-m package.train``,
    ``-mpackage.train``), else None (a path)."""
    text = text.strip()
    if not text.startswith("-m"):
        return None
    return text[2:].strip() or None


def resume_command(cfg: RunConfig) -> str:
    """The command line that continues ``cfg``'s run from its checkpoint, with its options."""
    import shlex

    checkpoint = RunDir(cfg.run_dir or ".").checkpoint
    argv = ["ddptui", "--resume", str(checkpoint)]
    if cfg.script_module:
        argv += ["--module", cfg.script_module]
    else:
        argv += ["--script", cfg.script] if cfg.script else ["--trainer", cfg.trainer]
    for flag, value in (
        ("--launcher", cfg.launcher),
        ("--device", cfg.device),
        ("--backend", cfg.backend),
        ("--amp", cfg.amp),
        ("--world-size", cfg.world_size),
        ("--workers", cfg.workers),
        ("--epochs", cfg.epochs),
        ("--batch-size", cfg.batch_size),
        ("--lr", cfg.lr),
        ("--seed", cfg.seed),
        ("--model", cfg.model),
        ("--data-dir", cfg.data_dir),
        ("--init-method", cfg.init_method),
        ("--max-restarts", cfg.max_restarts or None),
    ):
        # A script's run takes none of the trainers' options (they would be refused).
        if value is not None and not (cfg.script and flag[2:].replace("-", "_") in TRAINER_OPTIONS):
            argv += [flag, str(value)]
    argv += ["--sync-bn"] if cfg.sync_bn and not cfg.script else []
    argv += ["--oversubscribe"] if cfg.oversubscribe else []
    argv += [f"--local-rank-arg={cfg.local_rank_arg}"] if cfg.local_rank_arg else []
    if cfg.script_args:
        argv += ["--", *cfg.script_args]
    return shlex.join(argv)


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(2)


def default_workers(device: str, local_world_size: int, cpu_count: int) -> int:
    """DataLoader workers per rank when ``--workers`` is not given: on CUDA a fair share of
    the usable cores per local rank (at least 1, at most 8); 0 on CPU, where the ranks
    themselves use the cores."""
    if device != "cuda":
        return 0
    return max(1, min(MAX_DEFAULT_WORKERS, cpu_count // max(1, local_world_size)))


def parse_int(name: str, text: Any, minimum: int | None = None, maximum: int | None = None) -> int:
    try:
        value = int(str(text).strip())
    except ValueError:
        raise ConfigError(
            name, f"{option_flag(name)} must be a whole number, got {quoted(text)}"
        ) from None
    if minimum is not None and value < minimum:
        raise ConfigError(
            name, f"{option_flag(name)} must be at least {minimum}, got {clipped_number(value)}"
        )
    if maximum is not None and value > maximum:
        raise ConfigError(
            name, f"{option_flag(name)} must be at most {maximum}, got {clipped_number(value)}"
        )
    return value


def parse_float(name: str, text: Any, positive: bool = True, maximum: float | None = None) -> float:
    try:
        value = float(str(text).strip())
    except ValueError:
        raise ConfigError(
            name, f"{option_flag(name)} must be a number, got {quoted(text)}"
        ) from None
    if not math.isfinite(value):
        raise ConfigError(name, f"{option_flag(name)} must be a finite number, got {quoted(text)}")
    if positive and not value > 0:
        raise ConfigError(name, f"{option_flag(name)} must be greater than 0, got {value:g}")
    if maximum is not None and value > maximum:
        raise ConfigError(name, f"{option_flag(name)} must be at most {maximum:g}, got {value:g}")
    return value


def parse_choice(name: str, text: Any, choices: tuple[str, ...] | list[str]) -> str:
    value = str(text).strip().lower()
    if value not in choices:
        raise ConfigError(
            name,
            f"unknown {name.replace('_', ' ')} {quoted(text)} (choose from {', '.join(choices)})",
        )
    return value


#: An option's name as ``--local-rank-arg`` takes it: letters, digits, ``_`` and ``-``.
_OPTION_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,63}")


def parse_local_rank_arg(text: Any) -> str:
    """The flag ``--local-rank-arg`` names, with its dashes: ``local_rank``, ``--local_rank``
    or ``--local-rank`` (a word of letters, digits, ``_`` and ``-``, at most 64)."""
    value = str(text).strip()
    name = value.lstrip("-")
    if value.startswith("---") or not _OPTION_NAME.fullmatch(name):
        raise ConfigError(
            "local_rank_arg",
            "--local-rank-arg must name an option of your script, such as --local_rank "
            f"(letters, digits, _ and -), got {quoted(text)}",
        )
    return "--" + name if not value.startswith("-") else value


def parse_path(name: str, text: Any, label: str | None = None) -> Path:
    """A path the filesystem can take: no NUL byte, encodable, every name at most 255 bytes
    and the whole under 4096 (checked before any system call, which would raise). Messages
    name the option (``--run-dir``), or ``label`` when given."""
    value = str(text).strip()
    flag = label or option_flag(name)
    if "\x00" in value:
        raise ConfigError(name, f"{flag} contains a NUL byte: {quoted(value)}")
    try:
        encoded = os.fsencode(value)
    except UnicodeEncodeError:
        raise ConfigError(
            name, f"{flag} {quoted(value)} has characters no file name can hold here"
        ) from None
    if max((len(part) for part in encoded.split(b"/")), default=0) > NAME_MAX:
        raise ConfigError(name, f"{flag} has a name longer than {NAME_MAX} bytes: {quoted(value)}")
    if len(encoded) >= PATH_MAX:
        raise ConfigError(name, f"{flag} is longer than {PATH_MAX - 1} bytes: {quoted(value)}")
    try:
        return Path(value).expanduser()
    except RuntimeError:  # "~" without a home directory
        return Path(value)


class Checks:
    """Collects every problem, in the order the options are judged (the form's order)."""

    def __init__(self, errors: list[ConfigError]) -> None:
        self.errors = errors

    def fail(self, field: str, message: str) -> None:
        self.errors.append(ConfigError(field, message))

    def attempt(self, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except ConfigError as exc:
            self.errors.append(exc)
            return None

    @property
    def failed(self) -> bool:
        return bool(self.errors)


def option_flag(name: str) -> str:
    """The command line's flag of the option ``name`` (a config field, an argparse dest)."""
    return _FLAGS.get(name) or "--" + name.replace("_", "-")


#: Options whose flag is not their name: ``--module`` fills ``script_module``.
_FLAGS = {"script_module": "--module"}


def quoted(value: Any, limit: int = 60) -> str:
    """``repr`` of a value for a one-line message: escapes control characters, clips."""
    text = repr(value if isinstance(value, str) else str(value))
    return text if len(text) <= limit else text[: limit - 2] + "…" + text[-1]


def clipped_number(value: int) -> str:
    text = str(value)
    return text if len(text) <= 20 else f"{text[:8]}… ({len(text)} digits)"


def is_blank(value: Any) -> bool:
    return value is None or (isinstance(value, str) and not value.strip())


def os_reason(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__


def first_line(exc: BaseException) -> str:
    text = printable(str(exc)).strip().splitlines()  # an exception's colours never printed
    line = text[0] if text else ""
    return line if len(line) <= 120 else line[:119] + "…"
