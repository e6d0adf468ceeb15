"""An ImageNet-style folder (train/<class>/*, val/<class>/*) with a torchvision ResNet.

torchrun --nproc-per-node 8 -m trainers.imagefolder --data-dir /data/imagenet --model resnet50
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Sequence

import torch
from torch import nn
from torch.optim.lr_scheduler import LRScheduler, StepLR

from trainers import datasets, parsers
from trainers.distributed import DistContext
from trainers.loop import Task, run
from trainers.models import resnet
from trainers.options import TrainConfig, parse_config
from trainers.parsers import DEFAULT_IMAGE_SIZE


def build_data(config: TrainConfig, ctx: DistContext, device: torch.device) -> datasets.DataSplits:
    return datasets.imagefolder_splits(
        config.data_dir, image_size=config.image_size or DEFAULT_IMAGE_SIZE
    )


def build_model(config: TrainConfig, num_classes: int) -> nn.Module:
    return resnet(config.model, num_classes)


def build_optimizer(config: TrainConfig, params: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=config.lr, momentum=0.9, weight_decay=1e-4)


def build_scheduler(config: TrainConfig, optimizer: torch.optim.Optimizer) -> LRScheduler:
    return StepLR(optimizer, step_size=30, gamma=0.1)  # as pytorch/examples imagenet


TASK = Task(
    data=build_data, model=build_model, optimizer=build_optimizer, scheduler=build_scheduler
)


def build_arg_parser() -> argparse.ArgumentParser:
    """This trainer's command line (ddptui checks arguments given after ``--`` with
    :func:`trainers.parsers.imagefolder`, the same parser without torch)."""
    return parsers.imagefolder(__doc__)


def main(argv: Sequence[str] | None = None) -> int:
    run(parse_config(build_arg_parser(), argv), TASK)
    return 0


if __name__ == "__main__":
    sys.exit(main())
