"""The data module that sits next to the Trainer-class script (as ``datautils.py`` does in
pytorch/examples' ddp-tutorial-series): imported by bare name, so it only resolves when the
script's own directory is on ``sys.path``, as under plain ``python script.py``/torchrun."""

import torch
from torch.utils.data import Dataset


class RandomPairs(Dataset):
    """``size`` random (20 features -> 1 target) regression pairs, the same on every rank."""

    def __init__(self, size: int, seed: int = 0):
        gen = torch.Generator().manual_seed(seed)
        self.x = torch.randn(size, 20, generator=gen)
        self.y = self.x[:, :5].sum(dim=1, keepdim=True) + 0.1 * torch.randn(size, 1, generator=gen)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, index):
        return self.x[index], self.y[index]
