"""Each built-in trainer's command line, built without torch.

ddptui checks the arguments given after ``--`` with the trainer's own parser before it
launches (``TrainerSpec.arg_parser``). Built in the trainer's module, that check imported the
trainer and torch with it: 1.6 s of CPU in ``ddptui`` itself before the first rank started
on 2 cores, and torch's hundreds of MiB in the dashboard's process for the rest of its life.
A trainer's module builds its parser here too (with its docstring for ``--help``).
"""

from __future__ import annotations

import argparse

from trainers.options import (
    add_data_on_device_option,
    add_download_option,
    build_parser,
    positive_int,
)
from trainers.specs import BUILTIN

#: The imagefolder trainer's training crop (pytorch/examples' ImageNet recipe).
DEFAULT_IMAGE_SIZE = 224
#: Each trainer's defaults (its recipe's).
_DEFAULTS = {
    "synthetic": {"epochs": 3, "batch_size": 32, "lr": 3e-3, "train_size": 4000, "test_size": 1001},
    "mnist": {"epochs": 14, "batch_size": 64, "lr": 1.0},
    "cifar10": {"epochs": 30, "batch_size": 128, "lr": 0.1},
    "imagefolder": {"epochs": 90, "batch_size": 32, "lr": 0.1},
}
_MODELS = {spec.name: spec.models for spec in BUILTIN}


def _base(name: str, description: str | None) -> argparse.ArgumentParser:
    return build_parser(name, description=description, models=_MODELS[name], **_DEFAULTS[name])


def synthetic(description: str | None = None) -> argparse.ArgumentParser:
    parser = _base("synthetic", description)
    add_data_on_device_option(parser)
    return parser


def mnist(description: str | None = None) -> argparse.ArgumentParser:
    parser = _base("mnist", description)
    add_download_option(parser)
    add_data_on_device_option(parser)
    return parser


def cifar10(description: str | None = None) -> argparse.ArgumentParser:
    parser = _base("cifar10", description)
    add_download_option(parser)
    parser.add_argument(
        "--no-verify",
        action="store_true",
        help="skip the md5 check of the batch files (re-packed or subset data)",
    )
    add_data_on_device_option(parser)
    return parser


def imagefolder(description: str | None = None) -> argparse.ArgumentParser:
    parser = _base("imagefolder", description)
    parser.add_argument(
        "--image-size",
        type=positive_int,
        default=DEFAULT_IMAGE_SIZE,
        metavar="PX",
        help=f"training crop size; validation resizes to size*256/224 and centre-crops "
        f"(default: {DEFAULT_IMAGE_SIZE})",
    )
    return parser
