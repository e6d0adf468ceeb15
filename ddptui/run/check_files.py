"""Checks of the files a run reads and writes: the ``--resume`` checkpoint (its header, without
loading tensors), a restarted attempt's checkpoint, the rendezvous ``--init-method`` and the
run directory."""

from __future__ import annotations

import functools
import ipaddress
import os
import urllib.parse
import zipfile
from pathlib import Path
from typing import Any

from ddptui.run.cluster.addresses import split_endpoint
from ddptui.run.options import (
    MAX_EPOCHS,
    NAME_MAX,
    PATH_MAX,
    ConfigError,
    RunConfig,
    clipped_number,
    first_line,
    is_blank,
    os_reason,
    parse_path,
    quoted,
)
from ddptui.run.registry import TrainerSpec, registry
from ddptui.runfiles import RunDir


def readable_file(name: str, text: Any, what: str) -> str:
    shown = str(text).strip()
    path = parse_path(name, text)
    try:
        if not path.is_file() or not os.access(path, os.R_OK):
            raise ConfigError(name, f"cannot read {what}: {shown}")
        return str(path.resolve())
    except OSError as exc:
        raise ConfigError(name, f"cannot read {what} {shown}: {os_reason(exc)}") from None


def check_checkpoint(path: str, spec: TrainerSpec, model: str | None) -> None:
    """Read the checkpoint's header (mmap, tensors not loaded) and compare it with the run."""
    try:
        stat = os.stat(path)
    except OSError as exc:
        raise ConfigError("resume", f"cannot read --resume {path}: {os_reason(exc)}") from None
    problem, header = _checkpoint_header(path, stat.st_mtime_ns, stat.st_size)
    if problem:
        raise ConfigError("resume", f"--resume {path} {problem}")
    assert header is not None
    saved_trainer, saved_model = header["trainer"], header["model"]
    if saved_trainer != spec.name:
        raise ConfigError(
            "resume",
            f"--resume {path} was saved by the {quoted(saved_trainer)} trainer, not {spec.name!r}",
        )
    wanted = model or spec.model
    if wanted is not None and saved_model != wanted:
        hint = f" (pass --model {saved_model})" if saved_model in spec.models else ""
        raise ConfigError(
            "resume",
            f"--resume {path} holds a {quoted(saved_model)} model, but this run trains "
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
        return f"cannot read checkpoint {path}: {os_reason(exc)}", None
    if cfg.script:
        return (f"checkpoint {path} is an empty file" if stat.st_size == 0 else None), None
    spec = registry().specs.get(cfg.trainer)
    if spec is None:
        return f"unknown trainer {cfg.trainer!r}", None
    try:
        check_checkpoint(path, spec, cfg.model)
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
        return f"cannot be read: {os_reason(exc)}", None
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - torch is a dependency
        return f"cannot be checked without torch ({exc})", None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as exc:  # anything torch raises on a foreign or corrupt archive
        return f"is not a readable checkpoint ({type(exc).__name__}: {first_line(exc)})", None
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
        return f"its epoch {clipped_number(epoch)} is not in 0..{MAX_EPOCHS}"
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
        raise ConfigError("init_method", f"{usage}, got {quoted(value)}")
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
                    "init_method", f"--init-method {quoted(value)}: an IPv6 host needs a closing ]"
                ) from None
            raise ConfigError(
                "init_method",
                f"--init-method {quoted(value)}: the port must be a number from 1 to 65535",
            ) from None
        if not parts.hostname:
            raise ConfigError(
                "init_method", f"--init-method {quoted(value)} has no host (tcp://HOST:PORT)"
            )
        if not port:
            raise ConfigError(
                "init_method",
                f"--init-method {quoted(value)} needs a port from 1 to 65535 (tcp://HOST:PORT)",
            )
        if parts.path not in ("", "/"):
            raise ConfigError("init_method", f"--init-method {quoted(value)} has a path")
        _check_tcp_host(value, parts.hostname, port)
        return value
    if scheme == "file":
        try:
            parts = urllib.parse.urlsplit(value)
        except ValueError:  # 'Invalid IPv6 URL': a '[' in the host part
            raise ConfigError(
                "init_method",
                f"--init-method {quoted(value)} needs an absolute path: file:///dir/name",
            ) from None
        if parts.netloc not in ("", "localhost") or not parts.path.startswith("/"):
            raise ConfigError(
                "init_method",
                f"--init-method {quoted(value)} needs an absolute path: file:///dir/name",
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
            raise ConfigError("init_method", f"--init-method {path}: {os_reason(exc)}") from None
        return value
    raise ConfigError("init_method", f"{usage}, got {quoted(value)}")


def _check_tcp_host(value: str, host: str, port: int) -> None:
    """The host of ``tcp://HOST:PORT`` must be an address or a name with the same rule as
    ``--rdzv-endpoint`` (so ``256.256.256.256`` is refused here, not after a hang)."""
    try:
        split_endpoint(f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
    except ValueError as exc:
        raise ConfigError("init_method", f"--init-method {quoted(value)} {exc}") from None
    if all(part.isdigit() for part in host.split(".")):  # dotted digits: must be IPv4
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            raise ConfigError(
                "init_method", f"--init-method {quoted(value)}: {host} is not an IPv4 address"
            ) from None


def check_run_dir(text: Any, run_id: str) -> str:
    path = Path("runs") / run_id if is_blank(text) else parse_path("run_dir", text)
    try:
        resolved = path.expanduser().resolve()
        if len(os.fsencode(str(resolved))) >= PATH_MAX - NAME_MAX:
            raise ConfigError("run_dir", f"run directory path is too long: {quoted(str(path))}")
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
        why = os_reason(exc) if isinstance(exc, OSError) else str(exc)
        raise ConfigError(
            "run_dir", f"cannot use run directory {quoted(str(path))}: {why}"
        ) from None
    return str(resolved)


def _can_create(path: Path) -> bool:
    """Whether ``path`` is, or can be made, a writable directory (by its nearest ancestor)."""
    for candidate in (path, *path.parents):
        if candidate.exists():
            return candidate.is_dir() and os.access(candidate, os.W_OK | os.X_OK)
    return False
