"""A reference workload: a model, its data and how to train it (the bench's unit of measurement).

The named workloads are in ``bench/workloads.py``; ``bench/data_workload.py`` extends this class
with files served over HTTP.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

__all__ = ["Workload"]


@dataclass(frozen=True)
class Workload:
    name: str
    unit: str  # what samples/s counts per sample: tokens, images
    units_per_sample: int
    batch_size: int
    make_model: Callable[[], nn.Module]
    loss_fn: Callable
    make_dataset: Callable[[int], TensorDataset]  # seed -> dataset
    lr: float

    def optimizer_fn(self, params) -> torch.optim.Optimizer:
        return torch.optim.AdamW(params, lr=self.lr)

    def loader(self, batch_size: int | None = None, seed: int = 0, shuffle: bool = True, **kwargs) -> DataLoader:
        g = torch.Generator().manual_seed(seed)
        return DataLoader(
            self.make_dataset(seed),
            batch_size=batch_size or self.batch_size,
            shuffle=shuffle,
            generator=g,
            drop_last=True,
            **kwargs,
        )

    def build(self, seed: int = 0) -> tuple[nn.Module, torch.optim.Optimizer]:
        """A freshly initialised model (same weights for the same seed) and its optimizer."""
        torch.manual_seed(seed)
        model = self.make_model()
        return model, self.optimizer_fn(model.parameters())
