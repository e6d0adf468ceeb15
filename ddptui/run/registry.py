"""The trainers ddptui can launch, found through the ``ddptui.trainers`` entry-point group.

A package adds a trainer by naming, in its metadata, either a :class:`TrainerSpec` or just the
module that has ``main(argv) -> int``::

    [project.entry-points."ddptui.trainers"]
    tiny = "mypkg.specs:TINY"      # a TrainerSpec: models, data check, argument check
    plain = "mypkg.train"          # a module: no models list, no checks before launch

Reading the registry imports only the modules that hold the specs, never a trainer itself, so
it stays free of torch: the command line and the dashboard form read it on every start.
A registered trainer is started like the built-in ones: ``main(argv)`` gets the shared trainer
options (``--backend``, ``--device``, ``--amp``, ``--epochs``, ... as built by
``trainers.options.build_parser``), then any arguments given after ``--``.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.metadata
import re
from collections.abc import Callable
from dataclasses import dataclass, field

#: The entry-point group trainers register in.
ENTRY_POINT_GROUP = "ddptui.trainers"
#: The trainer a run uses when none is named.
DEFAULT_TRAINER = "synthetic"
#: The distribution whose entry points hold the built-in trainers.
DISTRIBUTION = "ddptui"
#: Where the built-in specs live (read directly when the installed metadata predates them).
BUILTIN_SPECS = "trainers.specs"

_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")


@dataclass(frozen=True)
class TrainerSpec:
    """What ddptui needs to know about a trainer before starting it (no torch here)."""

    name: str
    """The name used with ``--trainer`` and listed in the form."""
    module: str
    """The module run on every rank: its ``main(argv)`` (``python -m MODULE`` standalone)."""
    models: tuple[str, ...] = ()
    """The ``--model`` choices; empty means the trainer checks ``--model`` itself."""
    default_model: str | None = None
    """The model used without ``--model`` (default: the first of ``models``)."""
    needs_data_dir: bool = False
    """Whether the trainer reads a dataset from ``--data-dir``."""
    missing_data: Callable[[str], str | None] | None = field(default=None, compare=False)
    """``missing_data(data_dir)``: why the dataset is not there, or None when it is. Must not
    import torch. Skipped when ``--download`` is among the trainer's arguments."""
    arg_parser: str | None = None
    """``"module:function"`` returning the trainer's ``argparse`` parser, used to refuse
    arguments after ``--`` before launch. May import torch: called only when such arguments
    are given."""
    description: str = ""
    """One line for help texts."""

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ValueError(f"trainer name {self.name!r} must be lower-case letters/digits/_.-")
        if not self.module or not all(part.isidentifier() for part in self.module.split(".")):
            raise ValueError(f"trainer {self.name!r}: {self.module!r} is not a module path")
        object.__setattr__(self, "models", tuple(self.models))
        if self.default_model is not None and self.models and self.default_model not in self.models:
            raise ValueError(f"trainer {self.name!r}: default model not among its models")

    @property
    def model(self) -> str | None:
        """The model a run trains without ``--model`` (None: only the trainer knows)."""
        return self.default_model or (self.models[0] if self.models else None)


@dataclass(frozen=True)
class Registry:
    """Every trainer found, in listing order (built-in first), and the entry points that
    could not be used, with why."""

    specs: dict[str, TrainerSpec]
    problems: dict[str, str]

    def names(self) -> list[str]:
        return list(self.specs)


@functools.cache
def registry() -> Registry:
    """The trainers installed now (cached: call ``registry.cache_clear()`` to look again)."""
    specs: dict[str, TrainerSpec] = {}
    problems: dict[str, str] = {}
    points = sorted(
        importlib.metadata.entry_points(group=ENTRY_POINT_GROUP),
        key=lambda ep: (_dist_name(ep) != DISTRIBUTION, _dist_name(ep)),  # stable: file order
    )
    if not any(_dist_name(ep) == DISTRIBUTION for ep in points):
        # Installed metadata older than the entry points (an editable install not yet
        # re-synced): read the built-in specs from their module.
        try:
            builtin = importlib.import_module(BUILTIN_SPECS).BUILTIN
        except (ImportError, AttributeError) as exc:  # pragma: no cover - broken install
            problems["(built-in)"] = f"cannot read {BUILTIN_SPECS}: {exc}"
        else:
            specs.update((spec.name, spec) for spec in builtin)
    for ep in points:
        try:
            spec = _spec_from(ep)
        except Exception as exc:  # a third-party package may be broken in any way
            problems[ep.name] = (
                f"entry point {ep.value!r} of {_dist_name(ep) or 'an unknown package'} "
                f"cannot be used ({type(exc).__name__}: {exc})"
            )
            continue
        if spec.name in specs:
            if specs[spec.name] != spec:
                problems.setdefault(
                    spec.name, f"{_dist_name(ep)} registers {spec.name!r} again (ignored)"
                )
            continue
        specs[spec.name] = spec
    return Registry(_builtin_first(specs), problems)


def _builtin_first(specs: dict[str, TrainerSpec]) -> dict[str, TrainerSpec]:
    """The built-in trainers in their own order (the default first: entry point metadata is
    sorted by name), then the others as found."""
    try:
        order = [spec.name for spec in importlib.import_module(BUILTIN_SPECS).BUILTIN]
    except (ImportError, AttributeError):  # pragma: no cover - broken install
        return specs
    first = {name: specs[name] for name in order if name in specs}
    return {**first, **{k: v for k, v in specs.items() if k not in first}}


def trainer_names() -> list[str]:
    return registry().names()


def get_spec(name: str) -> TrainerSpec:
    """The spec of trainer ``name``; KeyError when none is registered under it."""
    return registry().specs[name]


def _spec_from(ep: importlib.metadata.EntryPoint) -> TrainerSpec:
    if ep.attr is None:  # just a module: run it, check nothing before launch
        return TrainerSpec(name=ep.name, module=ep.module)
    obj = ep.load()
    if not isinstance(obj, TrainerSpec):
        raise TypeError(f"{ep.value} is a {type(obj).__name__}, not a ddptui TrainerSpec")
    return obj if obj.name == ep.name else dataclasses.replace(obj, name=ep.name)


def _dist_name(ep: importlib.metadata.EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    name = getattr(dist, "name", None) or ""
    return re.sub(r"[-_.]+", "-", name).lower()
