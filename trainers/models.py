"""The trainers' models: two small CNNs and torchvision's ResNets (randomly initialised)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from trainers.specs import RESNETS  # the model names live with the trainer specs

__all__ = ["RESNETS", "SmallCNN", "MnistNet", "resnet"]


class SmallCNN(nn.Module):
    """A two-block CNN for the synthetic 1x16x16 images (about 25k parameters)."""

    def __init__(self, in_channels: int = 1, num_classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 16, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.classifier = nn.Linear(32 * 4 * 4, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x).flatten(1))


class MnistNet(nn.Module):
    """The pytorch/examples MNIST network: two convolutions, dropout, two linear layers."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = self.dropout2(x)
        return self.fc2(x)


def resnet(name: str, num_classes: int) -> nn.Module:
    """``torchvision.models.resnet18/resnet50`` with ``num_classes`` outputs, no weights."""
    if name not in RESNETS:
        raise ValueError(f"unknown model {name!r}; choose from {', '.join(RESNETS)}")
    from torchvision import models as tv_models  # slow to import; only ResNet trainers pay

    return getattr(tv_models, name)(weights=None, num_classes=num_classes)
