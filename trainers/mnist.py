"""MNIST with the pytorch/examples CNN and Adadelta (needs the dataset in --data-dir).

torchrun --nproc-per-node 2 -m trainers.mnist --data-dir data [--download]
"""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Iterable, Sequence

import torch
from torch import nn
from torch.optim.lr_scheduler import LRScheduler, StepLR

from trainers import datasets, parsers
from trainers.distributed import DistContext, rank_zero_first
from trainers.loop import Task, run
from trainers.models import MnistNet
from trainers.options import TrainConfig, parse_config


def build_data(config: TrainConfig, ctx: DistContext, device: torch.device) -> datasets.DataSplits:
    if config.download:
        fetch = functools.partial(datasets.download_dataset, "mnist", config.data_dir)
        rank_zero_first(fetch, ctx, device)
    return datasets.mnist_splits(config.data_dir)


def build_model(config: TrainConfig, num_classes: int) -> nn.Module:
    return MnistNet(num_classes)


def build_optimizer(config: TrainConfig, params: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
    return torch.optim.Adadelta(params, lr=config.lr)


def build_scheduler(config: TrainConfig, optimizer: torch.optim.Optimizer) -> LRScheduler:
    return StepLR(optimizer, step_size=1, gamma=0.7)


TASK = Task(
    data=build_data, model=build_model, optimizer=build_optimizer, scheduler=build_scheduler
)


def build_arg_parser() -> argparse.ArgumentParser:
    """This trainer's command line (ddptui checks arguments given after ``--`` with
    :func:`trainers.parsers.mnist`, the same parser without torch)."""
    return parsers.mnist(__doc__)


def main(argv: Sequence[str] | None = None) -> int:
    run(parse_config(build_arg_parser(), argv), TASK)
    return 0


if __name__ == "__main__":
    sys.exit(main())
