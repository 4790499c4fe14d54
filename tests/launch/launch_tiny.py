"""The tiny training set-up shared by the launched workers and the single-process references."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

SAMPLES, VAL_SAMPLES = 64, 16
BATCH = 4          # per process and micro-batch
ACCUM = 2
MAX_STEPS = 7      # 4 optimizer steps per epoch on 2 processes: crosses an epoch boundary
SEED = 0
CONFIGS = ("plain", "dropout")


def make_model(config: str) -> nn.Module:
    torch.manual_seed(SEED)
    layers = [nn.Linear(8, 16), nn.Tanh()]
    if config == "dropout":
        layers.append(nn.Dropout(0.25))
    layers.append(nn.Linear(16, 4))
    return nn.Sequential(*layers)


def make_optimizer(model: nn.Module):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return optimizer, torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5)


def _dataset(n: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    return TensorDataset(x, torch.sin(x[:, :4]) + 0.1 * torch.randn(n, 4, generator=g))


def train_loader(batch: int = BATCH) -> DataLoader:
    """What a user writes: a shuffled loader; under DDP the Trainer swaps in a DistributedSampler."""
    return DataLoader(_dataset(SAMPLES, 1), batch_size=batch, shuffle=True,
                      generator=torch.Generator().manual_seed(SEED))


def reference_loader(world: int) -> DataLoader:
    """One process, global batch: the same permutation a DistributedSampler draws (seed, then + epoch)."""
    sampler = DistributedSampler(_dataset(SAMPLES, 1), num_replicas=1, rank=0, shuffle=True, seed=SEED)
    return DataLoader(sampler.dataset, batch_size=BATCH * world, sampler=sampler)


def val_loader(batch: int = BATCH) -> DataLoader:
    return DataLoader(_dataset(VAL_SAMPLES, 2), batch_size=batch)


loss_fn = F.mse_loss


def trainer_kwargs(**overrides):
    return {"max_steps": MAX_STEPS, "log_every_n_steps": 1, "progress": False, "warmup_steps": 0, **overrides}
