"""Run options: one validated, frozen :class:`RunConfig`, built the same way for the CLI
and the dashboard form, so both refuse bad input with the same one-line messages.

Everything that can be known before a process starts is checked here: numbers (finite, in
range), choices, the device and the world size this machine can hold, paths (NUL bytes,
names too long), the script (Python that compiles), the trainer's model and data, the
checkpoint given to ``--resume`` (its header), the rendezvous URL, and the arguments after
``--`` (with the trainer's own parser). The last two read torch or the trainer module, so they
run only when ``--resume`` or such arguments are given (``deep`` checks).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import io
import ipaddress
import math
import os
import re
import secrets
import time
import tokenize
import urllib.parse
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddptui.constants import (
    AMP_MODES,
    BACKEND_CHOICES,
    DEFAULT_CPU_WORLD_SIZE,
    DEVICE_CHOICES,
    DEVICE_ENV,
    JOB_LAUNCHERS,
    MAX_HANG_TIMEOUT_S,
    MAX_RANKS_PER_CORE,
    MAX_RESTARTS,
    NO_INSTRUMENT_ENV,
    ON_HANG,
)
from ddptui.cpus import usable_cpus
from ddptui.flight_rank import BUFFER_ENV as FR_BUFFER_ENV
from ddptui.flight_rank import DEFAULT_BUFFER as FR_DEFAULT_BUFFER
from ddptui.registry import DEFAULT_TRAINER, Registry, TrainerSpec, registry
from ddptui.rundir import RunDir

# -- limits (a value beyond these is a typo or an attack, not a run) -----------------------------
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
class Machine:
    """What this machine can run: the CUDA devices torch sees (or why it sees none), and the
    CPU cores this process may use (its affinity, not the machine's core count)."""

    cuda_devices: int = 0
    cuda_reason: str = "CUDA is not available"
    cpu_count: int = field(default_factory=usable_cpus)

    @classmethod
    def detect(cls) -> Machine:
        """Ask torch (imported here, not at module import: it takes seconds).

        Without an NVIDIA driver CUDA cannot be available, so torch is not imported at all:
        that keeps ``ddptui --no-ui`` on a CPU machine from paying for one more torch import.
        """
        if not nvidia_driver_present():
            return cls(0, "no NVIDIA driver loaded (/proc/driver/nvidia is missing)")
        try:
            import torch
        except ImportError as exc:  # pragma: no cover - torch is a dependency
            return cls(0, f"torch not importable: {exc}")
        if not torch.cuda.is_available():
            reason = (
                "torch has no CUDA support"
                if torch.version.cuda is None
                else ("no CUDA device visible (driver missing or CUDA_VISIBLE_DEVICES empty)")
            )
            return cls(0, reason)
        return cls(torch.cuda.device_count(), "")


@dataclass(frozen=True)
class RunConfig:
    """Everything that defines a run. ``None`` means "the trainer's default"."""

    trainer: str = DEFAULT_TRAINER
    script: str | None = None
    script_args: tuple[str, ...] = ()
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
        return f"script {Path(self.script).name}" if self.script else self.trainer

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
        the user set it); ``--no-flight-recorder`` sets it to 0.
        """
        env = {DEVICE_ENV: self.device}
        if self.device == "cpu":
            env["CUDA_VISIBLE_DEVICES"] = ""
        if not self.instrument:
            env[NO_INSTRUMENT_ENV] = "1"
        if not self.flight_recorder:
            env[FR_BUFFER_ENV] = "0"
        elif FR_BUFFER_ENV not in os.environ:
            env[FR_BUFFER_ENV] = str(FR_DEFAULT_BUFFER)
        return env


def resume_command(cfg: RunConfig) -> str:
    """The command line that continues ``cfg``'s run from its checkpoint, with its options."""
    import shlex

    checkpoint = RunDir(cfg.run_dir or ".").checkpoint
    argv = ["ddptui", "--resume", str(checkpoint)]
    argv += ["--script", cfg.script] if cfg.script else ["--trainer", cfg.trainer]
    for flag, value in (
        ("--launcher", cfg.launcher),
        ("--device", cfg.device),
        ("--backend", cfg.backend),
        ("--amp", cfg.amp),
        ("--world-size", cfg.world_size),
        ("--workers", None if cfg.script else cfg.workers),
        ("--epochs", cfg.epochs),
        ("--batch-size", cfg.batch_size),
        ("--lr", cfg.lr),
        ("--seed", cfg.seed),
        ("--model", cfg.model),
        ("--data-dir", cfg.data_dir),
        ("--init-method", cfg.init_method),
        ("--max-restarts", cfg.max_restarts or None),
    ):
        if value is not None:
            argv += [flag, str(value)]
    argv += ["--sync-bn"] if cfg.sync_bn else []
    argv += ["--oversubscribe"] if cfg.oversubscribe else []
    if cfg.script_args:
        argv += ["--", *cfg.script_args]
    return shlex.join(argv)


def nvidia_driver_present() -> bool:
    return os.path.exists("/proc/driver/nvidia/version") or os.path.exists("/dev/nvidiactl")


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(2)


def default_workers(device: str, local_world_size: int, cpu_count: int) -> int:
    """DataLoader workers per rank when ``--workers`` is not given: on CUDA a fair share of
    the usable cores per local rank (at least 1, at most 8); 0 on CPU, where the ranks
    themselves use the cores."""
    if device != "cuda":
        return 0
    return max(1, min(MAX_DEFAULT_WORKERS, cpu_count // max(1, local_world_size)))


# -- parsing single values (shared by argparse and the dashboard form) ------------------
def parse_int(name: str, text: Any, minimum: int | None = None, maximum: int | None = None) -> int:
    try:
        value = int(str(text).strip())
    except ValueError:
        raise ConfigError(
            name, f"{_flag(name)} must be a whole number, got {_shown(text)}"
        ) from None
    if minimum is not None and value < minimum:
        raise ConfigError(name, f"{_flag(name)} must be at least {minimum}, got {_num(value)}")
    if maximum is not None and value > maximum:
        raise ConfigError(name, f"{_flag(name)} must be at most {maximum}, got {_num(value)}")
    return value


def parse_float(name: str, text: Any, positive: bool = True, maximum: float | None = None) -> float:
    try:
        value = float(str(text).strip())
    except ValueError:
        raise ConfigError(name, f"{_flag(name)} must be a number, got {_shown(text)}") from None
    if not math.isfinite(value):
        raise ConfigError(name, f"{_flag(name)} must be a finite number, got {_shown(text)}")
    if positive and not value > 0:
        raise ConfigError(name, f"{_flag(name)} must be greater than 0, got {value:g}")
    if maximum is not None and value > maximum:
        raise ConfigError(name, f"{_flag(name)} must be at most {maximum:g}, got {value:g}")
    return value


def parse_choice(name: str, text: Any, choices: tuple[str, ...] | list[str]) -> str:
    value = str(text).strip().lower()
    if value not in choices:
        raise ConfigError(
            name,
            f"unknown {name.replace('_', ' ')} {_shown(text)} (choose from {', '.join(choices)})",
        )
    return value


def parse_path(name: str, text: Any, label: str | None = None) -> Path:
    """A path the filesystem can take: no NUL byte, encodable, every name at most 255 bytes
    and the whole under 4096 (checked before any system call, which would raise). Messages
    name the option (``--run-dir``), or ``label`` when given."""
    value = str(text).strip()
    flag = label or _flag(name)
    if "\x00" in value:
        raise ConfigError(name, f"{flag} contains a NUL byte: {_shown(value)}")
    try:
        encoded = os.fsencode(value)
    except UnicodeEncodeError:
        raise ConfigError(
            name, f"{flag} {_shown(value)} has characters no file name can hold here"
        ) from None
    if max((len(part) for part in encoded.split(b"/")), default=0) > NAME_MAX:
        raise ConfigError(name, f"{flag} has a name longer than {NAME_MAX} bytes: {_shown(value)}")
    if len(encoded) >= PATH_MAX:
        raise ConfigError(name, f"{flag} is longer than {PATH_MAX - 1} bytes: {_shown(value)}")
    try:
        return Path(value).expanduser()
    except RuntimeError:  # "~" without a home directory
        return Path(value)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _shown(value: Any, limit: int = 60) -> str:
    """``repr`` of a value for a one-line message: escapes control characters, clips."""
    text = repr(value if isinstance(value, str) else str(value))
    return text if len(text) <= limit else text[: limit - 2] + "…" + text[-1]


def _num(value: int) -> str:
    text = str(value)
    return text if len(text) <= 20 else f"{text[:8]}… ({len(text)} digits)"


def _blank(value: Any) -> bool:
    return value is None or (isinstance(value, str) and not value.strip())


# -- building a whole config -------------------------------------------------------------
def build_config(
    raw: Mapping[str, Any], machine: Machine | None = None, *, deep: bool = True
) -> RunConfig:
    """Validate raw option values (strings or typed) into a :class:`RunConfig`.

    Raises :class:`ConfigError` for the first bad value. ``machine`` is detected when needed
    (device ``auto``/``cuda``, backend ``nccl``, AMP ``fp16``, ``--sync-bn``) and not given.
    ``deep=False`` skips the checks that import torch or the trainer (the ``--resume`` header
    and the arguments after ``--``).
    """
    errors: list[ConfigError] = []
    cfg = _build(raw, machine, errors, deep)  # one pass: the machine is asked at most once
    if errors:
        raise errors[0]
    return cfg


def check_options(
    raw: Mapping[str, Any], machine: Machine | None = None, *, deep: bool = True
) -> list[ConfigError]:
    """Every problem with ``raw``, in form order (empty when it can run)."""
    errors: list[ConfigError] = []
    _build(raw, machine, errors, deep)
    return errors


class _Checks:
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


def _build(
    raw: Mapping[str, Any], machine: Machine | None, errors: list[ConfigError], deep: bool
) -> RunConfig:
    """The config ``raw`` describes, with every problem appended to ``errors`` (a value that
    failed is replaced by its default so that the remaining options are still judged)."""
    checks = _Checks(errors)
    attempt = checks.attempt

    # -- what runs: a registered trainer or the user's script
    is_script = not _blank(raw.get("script"))
    script_args = tuple(str(a) for a in (raw.get("script_args") or ()))
    trainers = registry()
    trainer, spec, script = DEFAULT_TRAINER, None, None
    if is_script:
        script = attempt(check_script, raw["script"])
    else:
        name = raw.get("trainer")
        trainer = attempt(parse_trainer, DEFAULT_TRAINER if _blank(name) else name, trainers)
        trainer = trainer or DEFAULT_TRAINER
        spec = trainers.specs.get(trainer)

    launcher_raw = raw.get("launcher")
    if _blank(launcher_raw):
        launcher = "torchrun" if is_script else "spawn"
    else:
        launcher = attempt(parse_choice, "launcher", launcher_raw, JOB_LAUNCHERS) or "spawn"
    nnodes = _optional(raw, "nnodes", lambda v: parse_int("nnodes", v, 1, MAX_NODES), attempt)
    nproc = _optional(
        raw,
        "nproc_per_node",
        lambda v: parse_int("nproc_per_node", v, 1, MAX_LOCAL_RANKS),
        attempt,
    )
    if launcher == "slurm":
        from ddptui.cluster.slurm import slurm_layout

        environ = raw.get("environ")
        layout = attempt(slurm_layout, os.environ if environ is None else environ, nnodes, nproc)
        if layout is not None:
            nnodes, nproc = layout

    # -- numbers
    world_size = _optional(raw, "world_size", lambda v: parse_int("world_size", v, 1), attempt)
    workers = _optional(raw, "workers", lambda v: parse_int("workers", v, 0, MAX_WORKERS), attempt)
    epochs = _optional(raw, "epochs", lambda v: parse_int("epochs", v, 1, MAX_EPOCHS), attempt)
    batch_size = _optional(
        raw, "batch_size", lambda v: parse_int("batch_size", v, 1, MAX_BATCH_SIZE), attempt
    )
    lr = _optional(raw, "lr", lambda v: parse_float("lr", v), attempt)
    seed = attempt(parse_int, "seed", _default(raw, "seed", 0), 0, MAX_SEED)
    max_restarts = attempt(
        parse_int, "max_restarts", _default(raw, "max_restarts", 0), 0, MAX_RESTARTS
    )

    # -- where ranks compute, and how they talk
    device = attempt(parse_choice, "device", _default(raw, "device", "auto"), DEVICE_CHOICES)
    backend = attempt(parse_choice, "backend", _default(raw, "backend", "auto"), BACKEND_CHOICES)
    amp = attempt(parse_choice, "amp", _default(raw, "amp", "off"), AMP_MODES) or "off"
    sync_bn = bool(raw.get("sync_bn"))
    oversubscribe = bool(raw.get("oversubscribe"))
    device = device or "auto"
    if machine is None:
        needs_cuda_answer = device != "cpu" or backend == "nccl" or amp == "fp16" or sync_bn
        machine = Machine.detect() if needs_cuda_answer else Machine(0, "not asked (--device cpu)")
    resolved, backend = _resolve_device(checks, machine, device, backend)
    if amp == "fp16":
        _needs_cuda_ranks(checks, machine, resolved, "amp")
    if sync_bn:
        _needs_cuda_ranks(checks, machine, resolved, "sync_bn")
    if nnodes is None and nproc is None:  # one node, as ever
        nnodes = 1
        if world_size is None:
            gpus = machine.cuda_devices
            world_size = gpus if resolved == "cuda" and gpus > 0 else DEFAULT_CPU_WORLD_SIZE
        else:
            _check_world_size(checks, machine, resolved, world_size, oversubscribe)
    else:
        nnodes = nnodes or 1
        if nproc is None:
            gpus = machine.cuda_devices
            nproc = gpus if resolved == "cuda" and gpus > 0 else DEFAULT_CPU_WORLD_SIZE
        else:
            _check_world_size(checks, machine, resolved, nproc, oversubscribe, per_node=True)
        if world_size is not None and world_size != nnodes * nproc:
            checks.fail(
                "world_size",
                f"--world-size {_num(world_size)} disagrees with --nnodes {nnodes} x "
                f"--nproc-per-node {nproc} = {nnodes * nproc} ranks (leave --world-size out "
                "of a multi-node run)",
            )
        world_size = nnodes * nproc
    rdzv_endpoint, bind = _multinode_addresses(checks, raw, launcher, nnodes, is_script)
    if nnodes > 1 and launcher == "spawn":
        launcher = "torchrun"
    if max_restarts and (nnodes > 1 or launcher == "slurm"):
        checks.fail(
            "max_restarts",
            "--max-restarts restarts the ranks of one node; it does not work with --nnodes > 1 "
            "or --launcher slurm yet",
        )
    if workers is None:
        workers = default_workers(resolved, world_size, machine.cpu_count)
    elif is_script and not _blank(raw.get("workers")):
        checks.fail(
            "workers",
            "--workers is an option of the trainers; a --script reads its own (after --)",
        )

    # -- the trainer's model, data and checkpoint
    model = None if _blank(raw.get("model")) else str(raw["model"]).strip()
    if model is not None and spec is not None and spec.models:
        model = attempt(_check_model, spec, model)
    data_dir = None
    if not _blank(raw.get("data_dir")):
        data_dir = attempt(lambda v: str(parse_path("data_dir", v)), raw["data_dir"])
    if spec is not None and "--download" not in script_args:
        problem = _missing_data(spec, data_dir or "data")
        if problem:
            checks.fail("data_dir", problem)

    resume = None
    if not _blank(raw.get("resume")):
        resume = attempt(_readable_file, "resume", raw["resume"], "resume checkpoint")
        if resume is not None and spec is not None and deep and not checks.failed:
            attempt(_check_checkpoint, resume, spec, model)

    init_method = None
    if not _blank(raw.get("init_method")):
        init_method = attempt(check_init_method, raw["init_method"])

    hang_timeout = _optional(raw, "hang_timeout", _parse_hang_timeout, attempt)
    on_hang = attempt(parse_choice, "on_hang", _default(raw, "on_hang", "stop"), ON_HANG) or "stop"

    run_id = str(raw.get("run_id") or new_run_id())
    run_dir = attempt(_check_run_dir, raw.get("run_dir"), run_id)

    cfg = RunConfig(
        trainer=trainer,
        script=script,
        script_args=script_args,
        launcher=launcher,
        device=resolved,
        backend=backend or "gloo",
        amp=amp,
        world_size=world_size,
        workers=workers if not is_script else 0,
        oversubscribe=oversubscribe,
        epochs=epochs,
        batch_size=batch_size,
        lr=lr,
        seed=seed if seed is not None else 0,
        data_dir=data_dir,
        run_dir=run_dir,
        resume=resume,
        init_method=init_method,
        sync_bn=sync_bn,
        model=model,
        max_restarts=max_restarts or 0,
        trainer_module=spec.module if spec is not None else None,
        run_id=run_id,
        hang_timeout=hang_timeout,
        on_hang=on_hang,
        instrument=not bool(raw.get("no_instrument")),
        flight_recorder=not bool(raw.get("no_flight_recorder")),
        nnodes=nnodes,
        rdzv_endpoint=rdzv_endpoint,
        bind=bind,
    )
    if deep and spec is not None and spec.arg_parser and script_args and not checks.failed:
        problem = _trainer_args_problem(spec, tuple(cfg.trainer_argv()))
        if problem:
            checks.fail("script_args", problem)
    return cfg


# -- the target ---------------------------------------------------------------------------------
def parse_trainer(text: Any, trainers: Registry | None = None) -> str:
    """A registered trainer's name (the registry's problems explain a broken one)."""
    trainers = trainers or registry()
    value = str(text).strip().lower()
    if value in trainers.specs:
        return value
    if value in trainers.problems:
        raise ConfigError(
            "trainer", f"trainer {value!r} cannot be used: {trainers.problems[value]}"
        )
    raise ConfigError(
        "trainer",
        f"unknown trainer {_shown(text)} (choose from {', '.join(trainers.specs) or 'none'})",
    )


def check_script(text: Any) -> str:
    """The script's resolved path, when it is a readable ``.py`` file of Python that compiles."""
    shown = str(text).strip()
    path = parse_path("script", text)
    try:
        if not path.is_file():
            raise ConfigError("script", f"script not found: {shown}")
        if path.suffix != ".py":
            raise ConfigError("script", f"script must be a Python file ending in .py: {shown}")
        stat = path.stat()
        resolved = path.resolve()
    except OSError as exc:
        raise ConfigError("script", f"cannot read script {shown}: {_why(exc)}") from None
    if stat.st_size > MAX_SCRIPT_BYTES:
        raise ConfigError("script", f"script {shown} is too large to be a training script")
    problem = _script_problem(str(resolved), stat.st_mtime_ns, stat.st_size)
    if problem:
        raise ConfigError("script", f"script {shown} {problem}")
    return str(resolved)


@functools.lru_cache(maxsize=32)
def _script_problem(path: str, mtime_ns: int, size: int) -> str | None:
    """Why the file is not Python source (cached by path, time and size: the form asks often)."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        return f"cannot be read: {_why(exc)}"
    if b"\x00" in data:
        return "is not Python: it holds binary data"
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
        source = data.decode(encoding)
    except (SyntaxError, LookupError, UnicodeDecodeError):
        return "is not Python text: it is not valid UTF-8 (or its declared encoding)"
    try:
        compile(source, path, "exec", dont_inherit=True)
    except SyntaxError as exc:
        return f"is not valid Python: line {exc.lineno}: {exc.msg}"
    except (ValueError, MemoryError, RecursionError) as exc:
        return f"cannot be compiled: {type(exc).__name__}"
    return None


def _check_model(spec: TrainerSpec, text: str) -> str:
    value = text.strip().lower()
    if value not in spec.models:
        raise ConfigError(
            "model",
            f"unknown model {_shown(text)} for the {spec.name} trainer "
            f"(choose from {', '.join(spec.models)})",
        )
    return value


def _missing_data(spec: TrainerSpec, data_dir: str) -> str | None:
    try:
        if spec.missing_data is not None:
            return spec.missing_data(data_dir)
        if spec.needs_data_dir and not Path(data_dir).is_dir():
            return f"data directory not found: {data_dir}"
    except OSError as exc:
        return f"cannot read the data directory {data_dir}: {_why(exc)}"
    return None


# -- the device, the backend and the world size (one check for CUDA ranks) ----------------------
def _resolve_device(
    checks: _Checks, machine: Machine, device: str, backend: str | None
) -> tuple[str, str | None]:
    """(resolved device, resolved backend): auto means cuda when a GPU is visible; backend
    auto means nccl for CUDA ranks, gloo for CPU ranks."""
    gpus = machine.cuda_devices
    if device == "cuda" and gpus == 0:
        checks.fail("device", f"--device cuda needs a CUDA GPU: {machine.cuda_reason}")
    resolved = "cuda" if device == "cuda" or (device == "auto" and gpus > 0) else "cpu"
    if backend == "auto":
        backend = "nccl" if resolved == "cuda" else "gloo"
    elif backend == "nccl" and resolved == "cpu":
        if gpus == 0:
            checks.fail("backend", f"backend nccl needs a CUDA GPU: {machine.cuda_reason}")
        else:
            checks.fail(
                "backend",
                "backend nccl needs CUDA ranks, and --device cpu runs CPU ranks "
                "(use --backend gloo or auto)",
            )
    return resolved, backend


def _needs_cuda_ranks(checks: _Checks, machine: Machine, resolved: str, field: str) -> None:
    """AMP fp16 and SyncBatchNorm run only on CUDA ranks."""
    if resolved == "cuda":
        return  # (no GPU at all under --device cuda is the device's own error)
    reason = machine.cuda_reason
    if field == "amp":
        checks.fail(
            field,
            f"AMP fp16 needs a CUDA GPU ({reason}); use --amp bf16 on CPU"
            if machine.cuda_devices == 0
            else "AMP fp16 needs CUDA ranks, not --device cpu (use --amp bf16 on CPU)",
        )
    else:
        checks.fail(
            field,
            f"--sync-bn needs a CUDA GPU: torch's SyncBatchNorm runs only on GPUs ({reason})"
            if machine.cuda_devices == 0
            else "--sync-bn needs CUDA ranks, not --device cpu: SyncBatchNorm runs only on GPUs",
        )


def _check_world_size(
    checks: _Checks,
    machine: Machine,
    device: str,
    world_size: int,
    oversubscribe: bool,
    per_node: bool = False,
) -> None:
    """The one check of how many ranks fit on this machine: one GPU per CUDA rank; without
    CUDA, at most 4 per usable core unless --oversubscribe; never more than 1024.
    ``per_node``: ``world_size`` is a multi-node run's ranks per node (each node is judged
    like this one), and the messages name --nproc-per-node."""
    if per_node:
        errors: list[ConfigError] = []
        _check_world_size(_Checks(errors), machine, device, world_size, oversubscribe)
        for error in errors:
            checks.fail(
                "nproc_per_node",
                str(error)
                .replace("world size", "--nproc-per-node")
                .replace("--world-size", "--nproc-per-node"),
            )
        return
    gpus, cores = machine.cuda_devices, machine.cpu_count
    if device == "cuda" and gpus > 0 and world_size > gpus:
        checks.fail(
            "world_size",
            f"world size {_num(world_size)} is more than the {gpus} GPU(s) visible here: each "
            f"CUDA rank needs its own GPU (use --world-size {gpus} or less, or --device cpu "
            "for CPU ranks)",
        )
    elif device == "cpu" and world_size > MAX_RANKS_PER_CORE * cores and not oversubscribe:
        checks.fail(
            "world_size",
            f"world size {_num(world_size)} is more than {MAX_RANKS_PER_CORE * cores} ranks "
            f"for the {cores} usable CPU core(s) here ({MAX_RANKS_PER_CORE} per core): use "
            "fewer ranks, or --oversubscribe to start them anyway",
        )
    elif world_size > MAX_LOCAL_RANKS:
        checks.fail(
            "world_size",
            f"world size {_num(world_size)} is more than the {MAX_LOCAL_RANKS} ranks ddptui "
            "starts on one machine, even with --oversubscribe",
        )


# -- multi-node addresses ------------------------------------------------------------------------
def _multinode_addresses(
    checks: _Checks, raw: Mapping[str, Any], launcher: str, nnodes: int, is_script: bool
) -> tuple[str | None, str | None]:
    """(rendezvous HOST:PORT, bind address) of a multi-node run; (None, None) on one node."""
    given_rdzv, given_bind = raw.get("rdzv_endpoint"), raw.get("bind")
    if nnodes == 1 and launcher != "slurm":
        for name, value in (("rdzv_endpoint", given_rdzv), ("bind", given_bind)):
            if not _blank(value):
                checks.fail(name, f"{_flag(name)} is for multi-node runs (--nnodes 2 or more)")
        return None, None
    if launcher == "spawn" and not _blank(raw.get("launcher")):
        checks.fail(
            "launcher",
            "a multi-node run starts its ranks under torchrun's c10d rendezvous: use "
            "--launcher torchrun (or slurm), or leave --launcher out",
        )
    from ddptui.cluster.addresses import (
        check_bind,
        check_endpoint,
        default_endpoint,
        outbound_address,
    )

    if _blank(given_rdzv):
        rdzv = checks.attempt(default_endpoint, launcher, raw.get("environ"))
    else:
        rdzv = checks.attempt(check_endpoint, "rdzv_endpoint", given_rdzv)
    bind = None
    if not _blank(given_bind):
        bind = checks.attempt(check_bind, given_bind)
    elif launcher == "slurm":  # ddptui may run on a login host: its own outbound address
        bind = checks.attempt(check_bind, outbound_address())
    elif rdzv is not None:  # node 0 hosts the rendezvous: the same interface
        bind = checks.attempt(check_bind, rdzv.rpartition(":")[0].strip("[]"))
    return rdzv, bind


# -- files ---------------------------------------------------------------------------------------
def _readable_file(name: str, text: Any, what: str) -> str:
    shown = str(text).strip()
    path = parse_path(name, text)
    try:
        if not path.is_file() or not os.access(path, os.R_OK):
            raise ConfigError(name, f"cannot read {what}: {shown}")
        return str(path.resolve())
    except OSError as exc:
        raise ConfigError(name, f"cannot read {what} {shown}: {_why(exc)}") from None


def _check_checkpoint(path: str, spec: TrainerSpec, model: str | None) -> None:
    """Read the checkpoint's header (mmap, tensors not loaded) and compare it with the run."""
    try:
        stat = os.stat(path)
    except OSError as exc:
        raise ConfigError("resume", f"cannot read --resume {path}: {_why(exc)}") from None
    problem, header = _checkpoint_header(path, stat.st_mtime_ns, stat.st_size)
    if problem:
        raise ConfigError("resume", f"--resume {path} {problem}")
    assert header is not None
    saved_trainer, saved_model = header["trainer"], header["model"]
    if saved_trainer != spec.name:
        raise ConfigError(
            "resume",
            f"--resume {path} was saved by the {_shown(saved_trainer)} trainer, not {spec.name!r}",
        )
    wanted = model or spec.model
    if wanted is not None and saved_model != wanted:
        hint = f" (pass --model {saved_model})" if saved_model in spec.models else ""
        raise ConfigError(
            "resume",
            f"--resume {path} holds a {_shown(saved_model)} model, but this run trains "
            f"{wanted!r}{hint}",
        )
    if header["body_problem"]:  # after trainer and model: those say best what to do
        raise ConfigError("resume", f"--resume {path} is not usable: {header['body_problem']}")


def check_restart_checkpoint(cfg: RunConfig, path: str) -> tuple[str | None, int | None]:
    """``(problem, epoch)`` of the checkpoint a restarted attempt of ``cfg`` would resume from.

    The same checks as ``--resume`` before launch: a built-in trainer's checkpoint must be a
    readable trainer checkpoint of this trainer and model (``epoch`` is the epoch it holds); a
    user script's only has to be a non-empty file (its format is the script's business).
    """
    try:
        stat = os.stat(path)
    except OSError as exc:
        return f"cannot read checkpoint {path}: {_why(exc)}", None
    if cfg.script:
        return (f"checkpoint {path} is an empty file" if stat.st_size == 0 else None), None
    spec = registry().specs.get(cfg.trainer)
    if spec is None:
        return f"unknown trainer {cfg.trainer!r}", None
    try:
        _check_checkpoint(path, spec, cfg.model)
    except ConfigError as exc:
        return str(exc).replace("--resume ", "checkpoint ", 1), None
    _, header = _checkpoint_header(path, stat.st_mtime_ns, stat.st_size)
    return None, header["epoch"] if header else None


@functools.lru_cache(maxsize=16)
def _checkpoint_header(path: str, mtime_ns: int, size: int) -> tuple[str | None, dict | None]:
    """(problem, header) of a checkpoint written by the trainers' loop."""
    if size == 0:
        return "is an empty file, not a checkpoint", None
    try:
        if not zipfile.is_zipfile(path):
            return "is not a checkpoint (not a torch.save archive)", None
    except OSError as exc:
        return f"cannot be read: {_why(exc)}", None
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - torch is a dependency
        return f"cannot be checked without torch ({exc})", None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as exc:  # anything torch raises on a foreign or corrupt archive
        return f"is not a readable checkpoint ({type(exc).__name__}: {_first_line(exc)})", None
    config = state.get("config") if isinstance(state, dict) else None
    if not isinstance(state, dict) or not {"epoch", "config", "model"} <= state.keys():
        return "is not a trainer checkpoint (no epoch, config and model in it)", None
    if not isinstance(config, dict) or not isinstance(state["epoch"], int):
        return "is not a trainer checkpoint (its config or epoch is malformed)", None
    body = _checkpoint_body_problem(state, torch)
    return None, {
        "trainer": config.get("trainer"),
        "model": config.get("model"),
        "epoch": state["epoch"] if body is None else None,
        "body_problem": body,
    }


def _checkpoint_body_problem(state: dict, torch: Any) -> str | None:
    """What in a checkpoint's body would make every rank fail on resume (None: nothing):
    the whole file is checked before launch, not only its header."""
    epoch = state["epoch"]
    if isinstance(epoch, bool) or not 0 <= epoch <= MAX_EPOCHS:
        return f"its epoch {_num(epoch)} is not in 0..{MAX_EPOCHS}"
    model = state["model"]
    if not isinstance(model, dict) or not model:
        return "it holds no model weights"
    if not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in model.items()):
        return "its model weights are not a state_dict of named tensors"
    if not isinstance(state.get("optimizer"), dict):
        return "it holds no optimizer state"
    partial = state.get("partial")
    if partial is not None and not (
        isinstance(partial, dict)
        and all(isinstance(v, int) and not isinstance(v, bool) for v in partial.values())
    ):
        return "its record of a stopped epoch is malformed"
    return None


def check_init_method(text: Any) -> str:
    """``tcp://HOST:PORT`` (port 1-65535), ``file:///absolute/path`` in an existing directory,
    or ``env://``."""
    value = str(text).strip()
    usage = "--init-method must be tcp://HOST:PORT, file:///PATH or env://"
    if "\x00" in value or any(ch.isspace() for ch in value):
        raise ConfigError("init_method", f"{usage}, got {_shown(value)}")
    scheme = value.partition("://")[0].lower() if "://" in value else ""
    if scheme == "env":
        if value.lower() != "env://":
            raise ConfigError("init_method", "--init-method env:// takes nothing after it")
        return value
    if scheme == "tcp":
        try:
            parts = urllib.parse.urlsplit(value)
            port = parts.port
        except ValueError:  # a bracket that does not close: 'Invalid IPv6 URL'
            if "[" in value and "]" not in value.partition("[")[2]:
                raise ConfigError(
                    "init_method", f"--init-method {_shown(value)}: an IPv6 host needs a closing ]"
                ) from None
            raise ConfigError(
                "init_method",
                f"--init-method {_shown(value)}: the port must be a number from 1 to 65535",
            ) from None
        if not parts.hostname:
            raise ConfigError(
                "init_method", f"--init-method {_shown(value)} has no host (tcp://HOST:PORT)"
            )
        if not port:
            raise ConfigError(
                "init_method",
                f"--init-method {_shown(value)} needs a port from 1 to 65535 (tcp://HOST:PORT)",
            )
        if parts.path not in ("", "/"):
            raise ConfigError("init_method", f"--init-method {_shown(value)} has a path")
        _check_tcp_host(value, parts.hostname, port)
        return value
    if scheme == "file":
        try:
            parts = urllib.parse.urlsplit(value)
        except ValueError:  # 'Invalid IPv6 URL': a '[' in the host part
            raise ConfigError(
                "init_method",
                f"--init-method {_shown(value)} needs an absolute path: file:///dir/name",
            ) from None
        if parts.netloc not in ("", "localhost") or not parts.path.startswith("/"):
            raise ConfigError(
                "init_method",
                f"--init-method {_shown(value)} needs an absolute path: file:///dir/name",
            )
        path = parse_path("init_method", urllib.parse.unquote(parts.path))
        try:
            if not path.parent.is_dir():
                raise ConfigError(
                    "init_method", f"--init-method: directory {path.parent} does not exist"
                )
            if not os.access(path.parent, os.W_OK | os.X_OK):
                raise ConfigError("init_method", f"--init-method: cannot write in {path.parent}")
            if path.exists() and (not path.is_file() or path.stat().st_size > 0):
                raise ConfigError(
                    "init_method",
                    f"--init-method file {path} already exists and is not empty (left by "
                    "another run?): the rendezvous needs a new file",
                )
        except OSError as exc:
            raise ConfigError("init_method", f"--init-method {path}: {_why(exc)}") from None
        return value
    raise ConfigError("init_method", f"{usage}, got {_shown(value)}")


def _check_tcp_host(value: str, host: str, port: int) -> None:
    """The host of ``tcp://HOST:PORT`` must be an address or a name with the same rule as
    ``--rdzv-endpoint`` (so ``256.256.256.256`` is refused here, not after a hang)."""
    from ddptui.cluster.addresses import split_endpoint

    try:
        split_endpoint(f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
    except ValueError as exc:
        raise ConfigError("init_method", f"--init-method {_shown(value)} {exc}") from None
    if all(part.isdigit() for part in host.split(".")):  # dotted digits: must be IPv4
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            raise ConfigError(
                "init_method", f"--init-method {_shown(value)}: {host} is not an IPv4 address"
            ) from None


def _check_run_dir(text: Any, run_id: str) -> str:
    path = Path("runs") / run_id if _blank(text) else parse_path("run_dir", text)
    try:
        resolved = path.expanduser().resolve()
        if len(os.fsencode(str(resolved))) >= PATH_MAX - NAME_MAX:
            raise ConfigError("run_dir", f"run directory path is too long: {_shown(str(path))}")
        if resolved.exists() and not resolved.is_dir():
            raise ConfigError("run_dir", f"run directory is a file: {resolved}")
        if not _can_create(resolved):
            raise ConfigError("run_dir", f"cannot create or write the run directory: {resolved}")
        if RunDir(resolved).holds_run():
            raise ConfigError(
                "run_dir",
                f"run directory already holds a run: {resolved} "
                "(choose another --run-dir; replay it with 'ddptui replay')",
            )
    except (OSError, RuntimeError) as exc:
        why = _why(exc) if isinstance(exc, OSError) else str(exc)
        raise ConfigError(
            "run_dir", f"cannot use run directory {_shown(str(path))}: {why}"
        ) from None
    return str(resolved)


def _can_create(path: Path) -> bool:
    """Whether ``path`` is, or can be made, a writable directory (by its nearest ancestor)."""
    for candidate in (path, *path.parents):
        if candidate.exists():
            return candidate.is_dir() and os.access(candidate, os.W_OK | os.X_OK)
    return False


# -- the trainer's own command line --------------------------------------------------------------
class _ArgumentError(Exception):
    pass


def _trainer_args_problem(spec: TrainerSpec, argv: tuple[str, ...]) -> str | None:
    """Parse ``argv`` with the trainer's own parser in this process: its refusal, or None."""
    assert spec.arg_parser is not None
    module, _, attr = spec.arg_parser.partition(":")
    try:
        parser = getattr(importlib.import_module(module), attr or "build_arg_parser")()
    except Exception as exc:  # the trainer cannot even be imported: the run would fail too
        return f"cannot load the {spec.name} trainer ({type(exc).__name__}: {_first_line(exc)})"

    def refuse(message: str) -> None:
        raise _ArgumentError(message)

    parser.error = refuse  # type: ignore[method-assign]
    sink = io.StringIO()
    try:
        with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            parser.parse_args(list(argv))
    except _ArgumentError as exc:
        return f"the {spec.name} trainer refuses its arguments: {exc}"
    except SystemExit:
        return f"the {spec.name} trainer's arguments make it exit without training (--help?)"
    return None


# -- small helpers -------------------------------------------------------------------------------
def _why(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__


def _first_line(exc: BaseException) -> str:
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc)).strip().splitlines()
    line = text[0] if text else ""
    return line if len(line) <= 120 else line[:119] + "…"


def _default(raw: Mapping[str, Any], key: str, default: Any) -> Any:
    value = raw.get(key)
    return default if _blank(value) else value


def _parse_hang_timeout(text: Any) -> float:
    value = parse_float("hang_timeout", text, positive=False)
    if not 0 <= value <= MAX_HANG_TIMEOUT_S:  # False for NaN too
        raise ConfigError(
            "hang_timeout",
            f"--hang-timeout must be 0 (off) or seconds up to {MAX_HANG_TIMEOUT_S:g}, "
            f"got {_shown(text)}",
        )
    return value


def _optional(raw, key, parse, attempt):
    value = raw.get(key)
    return None if _blank(value) else attempt(parse, value)
