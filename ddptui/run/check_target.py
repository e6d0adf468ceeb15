"""Checks of what a run starts: a registered trainer, its model and data, the arguments after
``--`` (with the trainer's own parser), or a user script or module (Python that compiles)."""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import io
import keyword
import os
import sys
import tokenize
from importlib.machinery import PathFinder
from pathlib import Path
from typing import Any

from ddptui.run.options import (
    MAX_SCRIPT_BYTES,
    ConfigError,
    first_line,
    os_reason,
    parse_path,
    quoted,
)
from ddptui.run.registry import Registry, TrainerSpec, registry


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
        f"unknown trainer {quoted(text)} (choose from {', '.join(trainers.specs) or 'none'})",
    )


def check_script(text: Any) -> str:
    """The script's resolved path, when it is a readable ``.py`` file of Python that compiles."""
    shown = str(text).strip()
    path = parse_path("script", text)
    try:
        if not path.is_file():
            if path.is_dir():  # a folder (`--script .`): no file to run in it, named as such
                raise ConfigError("script", f"--script names a directory, not a file: {shown}")
            if path.exists():  # a device, a FIFO, a socket: never opened here
                raise ConfigError("script", f"--script names no regular file: {shown}")
            raise ConfigError("script", f"script not found: {shown}")
        if path.suffix != ".py":
            raise ConfigError("script", f"script must be a Python file ending in .py: {shown}")
        stat = path.stat()
        resolved = path.resolve()
    except OSError as exc:
        raise ConfigError("script", f"cannot read script {shown}: {os_reason(exc)}") from None
    if stat.st_size > MAX_SCRIPT_BYTES:
        raise ConfigError("script", f"script {shown} is too large to be a training script")
    problem = _script_problem(str(resolved), stat.st_mtime_ns, stat.st_size)
    if problem:
        raise ConfigError("script", f"script {shown} {problem}")
    return str(resolved)


#: Longest module name ``--module`` takes (``python -m`` has no limit; a name is a few words).
MAX_MODULE_NAME = 200


def check_module(text: Any) -> tuple[str, str]:
    """``(name, file)`` of the module ``--module NAME`` runs as ``python -m NAME`` (torchrun's
    ``-m``) would: found from the current directory and ``sys.path`` (``PYTHONPATH``
    included), a package by its ``__main__``; its file must be Python that compiles. Found
    without importing anything: a package's ``__init__`` (torch, say) is not run here."""
    name = str(text).strip()
    shown = quoted(name[:MAX_MODULE_NAME])
    parts = name.split(".")
    if len(name) > MAX_MODULE_NAME or not all(
        part.isidentifier() and not keyword.iskeyword(part) for part in parts
    ):
        raise ConfigError("script", f"--module {shown} is not a module name (like package.train)")
    try:
        origin = _module_file(parts)
    except (ImportError, OSError, ValueError) as exc:
        raise ConfigError(
            "script", f"--module {shown} cannot be found: {first_line(exc)}"
        ) from None
    if isinstance(origin, _Missing):
        raise ConfigError("script", f"--module {shown}: {origin.why}")
    if not origin.endswith(".py"):
        raise ConfigError("script", f"--module {shown} is not Python source: {origin}")
    try:
        stat = os.stat(origin)
    except OSError as exc:
        raise ConfigError("script", f"cannot read module {shown}: {os_reason(exc)}") from None
    if stat.st_size > MAX_SCRIPT_BYTES:
        raise ConfigError("script", f"module {shown} is too large to be a training script")
    problem = _script_problem(origin, stat.st_mtime_ns, stat.st_size)
    if problem:
        raise ConfigError("script", f"module {shown} ({origin}) {problem}")
    return name, origin


class _Missing:
    """Why ``python -m`` would find nothing to run."""

    def __init__(self, why: str) -> None:
        self.why = why


def _module_file(parts: list[str]) -> str | _Missing:
    """The file ``python -m`` would run for the dotted name ``parts``, or why there is none."""
    # The top package through the path finder over the current directory and sys.path (a
    # console script's sys.path[0] is its bin directory, not where the user is), then the
    # import system's other finders (an editable install's, say); neither runs any code.
    top = parts[0]
    spec = PathFinder.find_spec(top, [os.getcwd(), *sys.path])
    if spec is None:
        spec = importlib.util.find_spec(top)
    for depth in range(1, len(parts) + 1):
        if spec is None:
            return _Missing(
                f"no module {'.'.join(parts[:depth])!r} in the current directory or on "
                "sys.path (PYTHONPATH)"
            )
        if depth == len(parts):
            break
        if spec.submodule_search_locations is None:
            return _Missing(f"{'.'.join(parts[:depth])!r} is a module, not a package")
        below = list(spec.submodule_search_locations)
        spec = PathFinder.find_spec(".".join(parts[: depth + 1]), below)
    assert spec is not None
    if spec.submodule_search_locations is not None:  # a package runs its __main__
        below = list(spec.submodule_search_locations)
        spec = PathFinder.find_spec(".".join([*parts, "__main__"]), below) if below else None
        if spec is None:
            return _Missing("a package without a __main__ module cannot be run")
    origin = spec.origin
    if not isinstance(origin, str) or origin in ("built-in", "frozen"):
        return _Missing("it is built into Python, not a file that can be run")
    return origin


@functools.lru_cache(maxsize=32)
def _script_problem(path: str, mtime_ns: int, size: int) -> str | None:
    """Why the file is not Python source (cached by path, time and size: the form asks often)."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        return f"cannot be read: {os_reason(exc)}"
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


def check_model(spec: TrainerSpec, text: str) -> str:
    value = text.strip().lower()
    if value not in spec.models:
        raise ConfigError(
            "model",
            f"unknown model {quoted(text)} for the {spec.name} trainer "
            f"(choose from {', '.join(spec.models)})",
        )
    return value


def missing_data(spec: TrainerSpec, data_dir: str) -> str | None:
    try:
        if spec.missing_data is not None:
            return spec.missing_data(data_dir)
        if spec.needs_data_dir and not Path(data_dir).is_dir():
            return f"data directory not found: {data_dir}"
    except OSError as exc:
        return f"cannot read the data directory {data_dir}: {os_reason(exc)}"
    return None


class _ArgumentError(Exception):
    pass


def trainer_args_problem(spec: TrainerSpec, argv: tuple[str, ...]) -> str | None:
    """Parse ``argv`` with the trainer's own parser in this process: its refusal, or None."""
    assert spec.arg_parser is not None
    module, _, attr = spec.arg_parser.partition(":")
    try:
        parser = getattr(importlib.import_module(module), attr or "build_arg_parser")()
    except Exception as exc:  # the trainer cannot even be imported: the run would fail too
        return f"cannot load the {spec.name} trainer ({type(exc).__name__}: {first_line(exc)})"

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
