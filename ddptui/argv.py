"""Command lines of the form ``OWN ARGS -- ARGS FOR THE TARGET``."""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence


def split_passthrough(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """Split at the first ``--``: (our own arguments, arguments passed through untouched)."""
    argv = list(argv)
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1 :]
    return argv, []


def target_args(module: str | None, script: str | None, script_module: str | None) -> list[str]:
    """What a rank runs, as the driver and the rank entry take it: a trainer module
    (``--module``, its ``main(args)``), the user's module (``--run-module``, as ``python -m``)
    or the user's script (``--script``)."""
    if module:
        return ["--module", module]
    if script_module:
        return ["--run-module", script_module]
    return ["--script", str(script)]


def add_target_arguments(parser: argparse.ArgumentParser) -> None:
    """The options :func:`target_args` makes, exactly one of them required."""
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--module")
    target.add_argument("--run-module")
    target.add_argument("--script")


#: The names public training scripts give their number of epochs (argparse's ``--epochs``
#: above all: pytorch/examples, timm, torchvision's references, MoCo, VICReg; ``--num_epochs``,
#: ``--max_epochs``; HF's ``--num_train_epochs``; Lightning's ``--trainer.max_epochs`` and
#: Hydra's ``trainer.max_epochs=N`` by their last dotted part; SpeechBrain's
#: ``--number_of_epochs``; yacs's ``KEY VALUE`` pairs, ``OPTIM.MAX_EPOCH 100`` in
#: facebookresearch/pycls and ``SOLVER.MAX_EPOCH`` in SlowFast, by their last part in lower
#: case).
EPOCH_NAMES = frozenset(
    {
        "epochs",
        "num-epochs",
        "num_epochs",
        "n-epochs",
        "n_epochs",
        "nepochs",
        "max-epochs",
        "max_epochs",
        "max_epoch",
        "total-epochs",
        "total_epochs",
        "train-epochs",
        "train_epochs",
        "num-train-epochs",
        "num_train_epochs",
        "number-of-epochs",
        "number_of_epochs",
    }
)
_MAX_SCRIPT_EPOCHS = 1_000_000
_MAX_FLAG = 80


def epochs_in_args(args: object) -> tuple[int, str] | None:
    """How many epochs a script's own arguments say it runs, and the argument that says it
    (``(90, "--epochs")``): the last of ``--epochs N``, ``--epochs=N``, ``epochs=N`` or a
    yacs pair ``OPTIM.MAX_EPOCH N`` (a dotted key in capitals, then its value: yacs's
    ``merge_from_list``) under one of :data:`EPOCH_NAMES` (argparse keeps the last), a whole
    number in 1..1,000,000 (a
    fractional ``--num_train_epochs 2.5`` says no whole count); None when none says it.
    Arguments after a bare ``--`` are the script's positionals, not options. ``args`` is
    untrusted (a run directory's ``config.json``): anything but a list of strings is none."""
    if not isinstance(args, (list, tuple)):
        return None
    found = None
    items = [a for a in args if isinstance(a, str)]
    for i, arg in enumerate(items):
        if arg == "--":
            break
        flag, eq, value = arg.partition("=")
        dashed = flag.startswith("-")
        yacs = not dashed and not eq and "." in flag and flag.isupper()
        if not eq:
            if not (dashed or yacs) or i + 1 >= len(items):
                continue
            value = items[i + 1]
        if len(flag) > _MAX_FLAG:
            continue  # a Hydra path of any length is no name the console should repeat
        name = flag.lstrip("-+").rsplit(".", 1)[-1]
        name = name.lower() if yacs else name
        if name not in EPOCH_NAMES or (not dashed and "." not in flag and flag.lstrip("+") != name):
            continue
        text = value.strip()
        if not (0 < len(text) <= 8 and text.isascii() and text.isdigit()):
            continue
        number = int(text)
        if 1 <= number <= _MAX_SCRIPT_EPOCHS:
            found = (number, flag if dashed or yacs else flag + "=")
    return found


def config_script_epochs(config: object) -> tuple[int, str] | None:
    """:func:`epochs_in_args` of a run's config (``RunConfig.to_json_dict()``, or a run
    directory's ``config.json``) when it runs the user's script or module: the built-in
    trainers say their epochs themselves."""
    if not isinstance(config, Mapping) or not (config.get("script") or config.get("script_module")):
        return None
    return epochs_in_args(config.get("script_args"))
