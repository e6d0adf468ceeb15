"""Synthetic image classification: learnable, in memory, no downloads (the default trainer).

Ten classes of 1x16x16 images (a fixed smooth pattern per class, shifted, plus noise) and a
small CNN. The defaults reach >= 0.95 test accuracy within seconds on two CPU ranks::

    torchrun --nproc-per-node 2 -m trainers.synthetic
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Sequence

import torch
from torch import nn

from trainers import parsers
from trainers.datasets import DataSplits, synthetic_splits
from trainers.distributed import DistContext
from trainers.loop import Task, run
from trainers.models import SmallCNN
from trainers.options import TrainConfig, parse_config


def build_data(config: TrainConfig, ctx: DistContext, device: torch.device) -> DataSplits:
    assert config.train_size is not None and config.test_size is not None
    return synthetic_splits(config.train_size, config.test_size, config.seed)


def build_model(config: TrainConfig, num_classes: int) -> nn.Module:
    return SmallCNN(in_channels=1, num_classes=num_classes)


def build_optimizer(config: TrainConfig, params: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
    return torch.optim.Adam(params, lr=config.lr)


TASK = Task(data=build_data, model=build_model, optimizer=build_optimizer)


def build_arg_parser() -> argparse.ArgumentParser:
    """This trainer's command line (ddptui checks arguments given after ``--`` with
    :func:`trainers.parsers.synthetic`, the same parser without torch)."""
    return parsers.synthetic(__doc__)


def main(argv: Sequence[str] | None = None) -> int:
    run(parse_config(build_arg_parser(), argv), TASK)
    return 0


if __name__ == "__main__":
    sys.exit(main())
