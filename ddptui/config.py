"""Run options: one validated, frozen :class:`RunConfig`, built the same way for the CLI
and the dashboard form, so both refuse bad input with the same one-line messages."""

from __future__ import annotations

import dataclasses
import os
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddptui.constants import (
    AMP_MODES,
    BACKEND_CHOICES,
    LAUNCHERS,
    MAX_HANG_TIMEOUT_S,
    ON_HANG,
)
from ddptui.rundir import RunDir
from trainers import DEFAULT_TRAINER, TRAINERS
from trainers.data_files import missing_data_message


class ConfigError(ValueError):
    """A run option that cannot work; ``field`` names the option, ``str()`` is the message."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class Machine:
    """What this machine can run: the CUDA devices torch sees (or why it sees none)."""

    cuda_devices: int = 0
    cuda_reason: str = "CUDA is not available"
    cpu_count: int = field(default_factory=lambda: os.cpu_count() or 1)

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
    backend: str = "gloo"  # resolved: never "auto" once built
    amp: str = "off"
    world_size: int = 2
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
    run_id: str = ""
    #: Seconds without progress before a rank counts as hung (None: the default rule, 0: off).
    hang_timeout: float | None = None
    #: What to do with a hung run: ``stop`` (exit code 3) or ``keep`` it running.
    on_hang: str = "stop"
    #: Zero-code instrumentation hooks in every rank (``--no-instrument`` turns them off).
    instrument: bool = True

    @property
    def target_label(self) -> str:
        return f"script {Path(self.script).name}" if self.script else self.trainer

    def to_json_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def trainer_argv(self) -> list[str]:
        """Arguments for the trainer module (or the user's script, which gets its own)."""
        if self.script:
            return list(self.script_args)
        argv = ["--backend", self.backend, "--amp", self.amp, "--seed", str(self.seed)]
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


def nvidia_driver_present() -> bool:
    return os.path.exists("/proc/driver/nvidia/version") or os.path.exists("/dev/nvidiactl")


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(2)


# -- parsing single values (shared by argparse and the dashboard form) ------------------
def parse_int(name: str, text: Any, minimum: int | None = None) -> int:
    try:
        value = int(str(text).strip())
    except ValueError:
        raise ConfigError(name, f"{_flag(name)} must be a whole number, got {text!r}") from None
    if minimum is not None and value < minimum:
        raise ConfigError(name, f"{_flag(name)} must be at least {minimum}, got {value}")
    return value


def parse_float(name: str, text: Any, positive: bool = True) -> float:
    try:
        value = float(str(text).strip())
    except ValueError:
        raise ConfigError(name, f"{_flag(name)} must be a number, got {text!r}") from None
    if positive and not value > 0:
        raise ConfigError(name, f"{_flag(name)} must be greater than 0, got {value:g}")
    return value


def parse_choice(name: str, text: Any, choices: tuple[str, ...] | list[str]) -> str:
    value = str(text).strip().lower()
    if value not in choices:
        raise ConfigError(
            name, f"unknown {name.replace('_', ' ')} {text!r} (choose from {', '.join(choices)})"
        )
    return value


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _blank(value: Any) -> bool:
    return value is None or (isinstance(value, str) and not value.strip())


# -- building a whole config -------------------------------------------------------------
def build_config(raw: Mapping[str, Any], machine: Machine | None = None) -> RunConfig:
    """Validate raw option values (strings or typed) into a :class:`RunConfig`.

    Raises :class:`ConfigError` for the first bad value. ``machine`` is detected when needed
    (backend ``auto``/``nccl``, AMP ``fp16``) and not given.
    """
    errors = check_options(raw, machine)
    if errors:
        raise errors[0]
    return _build(raw, machine)


def check_options(raw: Mapping[str, Any], machine: Machine | None = None) -> list[ConfigError]:
    """Every problem with ``raw``, in form order (empty when it can run)."""
    errors: list[ConfigError] = []
    try:
        _build(raw, machine, errors)
    except ConfigError as exc:  # pragma: no cover - _build collects instead of raising
        errors.append(exc)
    return errors


def _build(
    raw: Mapping[str, Any], machine: Machine | None, errors: list[ConfigError] | None = None
) -> RunConfig:
    def attempt(fn, *args):  # collect into errors, or raise at once
        try:
            return fn(*args)
        except ConfigError as exc:
            if errors is None:
                raise
            errors.append(exc)
            return None

    script = None if _blank(raw.get("script")) else str(raw["script"]).strip()
    trainer = DEFAULT_TRAINER
    if script is None and not _blank(raw.get("trainer")):
        trainer = attempt(parse_choice, "trainer", raw["trainer"], list(TRAINERS)) or trainer
    if script is not None:
        path = Path(script).expanduser()
        if not path.is_file():
            attempt(_fail, "script", f"script not found: {script}")
        else:
            script = str(path.resolve())

    launcher_raw = raw.get("launcher")
    if _blank(launcher_raw):
        launcher = "torchrun" if script else "spawn"
    else:
        launcher = attempt(parse_choice, "launcher", launcher_raw, LAUNCHERS) or "spawn"

    world_size = attempt(parse_int, "world_size", _default(raw, "world_size", 2), 1) or 2
    epochs = _optional(raw, "epochs", lambda v: parse_int("epochs", v, 1), attempt)
    batch_size = _optional(raw, "batch_size", lambda v: parse_int("batch_size", v, 1), attempt)
    lr = _optional(raw, "lr", lambda v: parse_float("lr", v), attempt)
    seed = attempt(parse_int, "seed", _default(raw, "seed", 0), 0)
    backend = attempt(parse_choice, "backend", _default(raw, "backend", "auto"), BACKEND_CHOICES)
    amp = attempt(parse_choice, "amp", _default(raw, "amp", "off"), AMP_MODES) or "off"

    sync_bn = bool(raw.get("sync_bn"))
    needs_machine = backend in ("auto", "nccl") or amp == "fp16" or sync_bn
    if needs_machine and machine is None:
        machine = Machine.detect()
    if backend == "auto":
        backend = "nccl" if machine and machine.cuda_devices > 0 else "gloo"
    elif backend == "nccl" and machine is not None:
        if machine.cuda_devices == 0:
            attempt(_fail, "backend", f"backend nccl needs a CUDA GPU: {machine.cuda_reason}")
        elif world_size > machine.cuda_devices:
            attempt(
                _fail,
                "world_size",
                f"world size {world_size} is more than the {machine.cuda_devices} GPU(s) "
                "nccl can use on this machine (use --backend gloo, or fewer ranks)",
            )
    if amp == "fp16" and machine is not None and machine.cuda_devices == 0:
        attempt(
            _fail,
            "amp",
            f"AMP fp16 needs a CUDA GPU ({machine.cuda_reason}); use --amp bf16 on CPU",
        )

    if sync_bn and machine is not None and machine.cuda_devices == 0:
        attempt(
            _fail,
            "sync_bn",
            f"--sync-bn needs a CUDA GPU: torch's SyncBatchNorm runs only "
            f"on GPUs ({machine.cuda_reason})",
        )

    resume = None if _blank(raw.get("resume")) else str(raw["resume"]).strip()
    if resume is not None:
        path = Path(resume).expanduser()
        if not path.is_file() or not os.access(path, os.R_OK):
            attempt(_fail, "resume", f"cannot read resume checkpoint: {resume}")
        else:
            resume = str(path.resolve())

    data_dir = None if _blank(raw.get("data_dir")) else str(Path(raw["data_dir"]).expanduser())
    if script is None and "--download" not in (raw.get("script_args") or ()):
        problem = missing_data_message(trainer, data_dir or "data")
        if problem:
            attempt(_fail, "data_dir", problem)

    init_method = None if _blank(raw.get("init_method")) else str(raw["init_method"]).strip()
    if init_method is not None and not init_method.startswith(("tcp://", "file://", "env://")):
        attempt(
            _fail,
            "init_method",
            f"--init-method must be tcp://HOST:PORT, file://PATH or env://, got {init_method!r}",
        )

    hang_timeout = _optional(raw, "hang_timeout", _parse_hang_timeout, attempt)
    on_hang = attempt(parse_choice, "on_hang", _default(raw, "on_hang", "stop"), ON_HANG) or "stop"

    run_id = str(raw.get("run_id") or new_run_id())
    run_dir = None if _blank(raw.get("run_dir")) else str(raw["run_dir"])
    run_dir = str(Path(run_dir or Path("runs") / run_id).expanduser().resolve())
    if Path(run_dir).exists() and not Path(run_dir).is_dir():
        attempt(_fail, "run_dir", f"run directory is a file: {run_dir}")
    elif not _can_create(Path(run_dir)):
        attempt(_fail, "run_dir", f"cannot create or write the run directory: {run_dir}")
    elif (Path(run_dir) / "events.jsonl").exists():
        attempt(
            _fail,
            "run_dir",
            f"run directory already holds a run: {run_dir} "
            "(choose another --run-dir; replay it with 'ddptui replay')",
        )

    return RunConfig(
        trainer=trainer,
        script=script,
        script_args=tuple(raw.get("script_args") or ()),
        launcher=launcher,
        backend=backend or "gloo",
        amp=amp,
        world_size=world_size,
        epochs=epochs,
        batch_size=batch_size,
        lr=lr,
        seed=seed if seed is not None else 0,
        data_dir=data_dir,
        run_dir=run_dir,
        resume=resume,
        init_method=init_method,
        sync_bn=sync_bn,
        model=None if _blank(raw.get("model")) else str(raw["model"]),
        run_id=run_id,
        hang_timeout=hang_timeout,
        on_hang=on_hang,
        instrument=not bool(raw.get("no_instrument")),
    )


def _can_create(path: Path) -> bool:
    """Whether ``path`` is, or can be made, a writable directory (by its nearest ancestor)."""
    for candidate in (path, *path.parents):
        if candidate.exists():
            return candidate.is_dir() and os.access(candidate, os.W_OK | os.X_OK)
    return False


def _fail(field: str, message: str) -> None:
    raise ConfigError(field, message)


def _default(raw: Mapping[str, Any], key: str, default: Any) -> Any:
    value = raw.get(key)
    return default if _blank(value) else value


def _parse_hang_timeout(text: Any) -> float:
    value = parse_float("hang_timeout", text, positive=False)
    if not 0 <= value <= MAX_HANG_TIMEOUT_S:  # False for NaN too
        raise ConfigError(
            "hang_timeout",
            f"--hang-timeout must be 0 (off) or seconds up to {MAX_HANG_TIMEOUT_S:g}, got {text!r}",
        )
    return value


def _optional(raw, key, parse, attempt):
    value = raw.get(key)
    return None if _blank(value) else attempt(parse, value)
