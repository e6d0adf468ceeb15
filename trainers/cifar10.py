"""CIFAR-10 with a torchvision ResNet (needs the python batches in --data-dir).

torchrun --nproc-per-node 2 -m trainers.cifar10 --data-dir data --model resnet18
"""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Iterable, Sequence

import torch
from torch import nn
from torch.optim.lr_scheduler import CosineAnnealingLR, LRScheduler

from trainers import datasets, parsers
from trainers.distributed import DistContext, rank_zero_first
from trainers.loop import Task, run
from trainers.models import resnet
from trainers.options import TrainConfig, parse_config


def build_data(config: TrainConfig, ctx: DistContext, device: torch.device) -> datasets.DataSplits:
    if config.download:
        fetch = functools.partial(datasets.download_dataset, "cifar10", config.data_dir)
        rank_zero_first(fetch, ctx, device)
    return datasets.cifar10_splits(config.data_dir, verify=config.verify_data)


def build_model(config: TrainConfig, num_classes: int) -> nn.Module:
    return resnet(config.model, num_classes)


def build_optimizer(config: TrainConfig, params: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=config.lr, momentum=0.9, weight_decay=5e-4)


def build_scheduler(config: TrainConfig, optimizer: torch.optim.Optimizer) -> LRScheduler:
    return CosineAnnealingLR(optimizer, T_max=config.epochs)


TASK = Task(
    data=build_data, model=build_model, optimizer=build_optimizer, scheduler=build_scheduler
)


def build_arg_parser() -> argparse.ArgumentParser:
    """This trainer's command line (ddptui checks arguments given after ``--`` with
    :func:`trainers.parsers.cifar10`, the same parser without torch)."""
    return parsers.cifar10(__doc__)


def main(argv: Sequence[str] | None = None) -> int:
    run(parse_config(build_arg_parser(), argv), TASK)
    return 0


if __name__ == "__main__":
    sys.exit(main())
