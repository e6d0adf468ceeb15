"""The built-in trainers as ddptui sees them before starting one: name, module, models, data
check, argument parser. No torch here: ddptui's registry reads this module (through the
``ddptui.trainers`` entry points in pyproject.toml) on every start.
"""

from __future__ import annotations

import functools

from ddptui.run.registry import TrainerSpec
from trainers.data_files import missing_data_message

#: torchvision ResNets the cifar10 and imagefolder trainers build.
RESNETS = ("resnet18", "resnet50")


def _spec(name: str, models: tuple[str, ...], description: str, data: bool) -> TrainerSpec:
    return TrainerSpec(
        name=name,
        module=f"trainers.{name}",
        models=models,
        needs_data_dir=data,
        missing_data=functools.partial(missing_data_message, name) if data else None,
        arg_parser=f"trainers.parsers:{name}",  # no torch: see trainers/parsers.py
        description=description,
    )


SYNTHETIC = _spec("synthetic", ("smallcnn",), "learnable synthetic images, no data", False)
MNIST = _spec("mnist", ("mnistnet",), "MNIST, the pytorch/examples CNN", True)
CIFAR10 = _spec("cifar10", RESNETS, "CIFAR-10 with a torchvision ResNet", True)
IMAGEFOLDER = _spec("imagefolder", RESNETS, "an ImageNet-style folder with a ResNet", True)

#: In listing order.
BUILTIN = (SYNTHETIC, MNIST, CIFAR10, IMAGEFOLDER)
