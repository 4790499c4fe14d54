"""Tiny models and loaders shared by the tests (imported as ``from tiny import ...``)."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def make_mlp(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))


def make_data(n: int = 64, seed: int = 1) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    return TensorDataset(x, x[:, :3].argmax(1))


def make_loader(n: int = 64, batch_size: int = 8, shuffle: bool = True, seed: int = 2, **kwargs) -> DataLoader:
    return DataLoader(make_data(n), batch_size=batch_size, shuffle=shuffle,
                      generator=torch.Generator().manual_seed(seed) if shuffle else None, **kwargs)


class ConvBNNet(nn.Module):
    """conv(bias) -> BN pairs, plus one conv -> ReLU -> BN chain that must not be rewritten."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1, bias=True)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1, bias=True)
        self.bn2 = nn.BatchNorm2d(8)
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        x = torch.relu(self.bn1(self.conv1(x)))
        x = self.bn2(torch.relu(self.conv2(x)))  # ReLU between conv2 and bn2: bias matters here
        return self.head(x.mean((2, 3)))


def image_loader(n: int = 32, batch_size: int = 8, seed: int = 3) -> DataLoader:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, 8, 8, generator=g)
    return DataLoader(TensorDataset(x, torch.randint(0, 4, (n,), generator=g)), batch_size=batch_size)
