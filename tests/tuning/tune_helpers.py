"""Helpers for the tuner's tests: a tiny model and loader, fake trials (imported by the tests)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from turbotrain.measure import Trial


def tiny_mlp(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))


def tiny_loader(samples: int = 256, batch_size: int = 32, features: int = 32, seed: int = 0) -> DataLoader:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, features, generator=g)
    y = x[:, :10].argmax(1)
    return DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=True,
                      generator=torch.Generator().manual_seed(seed), drop_last=True)


def adamw(params):
    return torch.optim.AdamW(params, lr=1e-2)


loss_fn = F.cross_entropy


def fake_trial(plan, step_s: float, losses, warmup_s: float = 0.0, error: str | None = None,
               peak: int | None = 100 * 2**20, samples: int = 32, steps: int = 10) -> Trial:
    """A Trial as run_trial would report it, with chosen timings and losses."""
    trial = Trial(plan=plan, samples_per_step=samples, warmup_s=warmup_s, losses=list(losses),
                  peak_memory_bytes=peak, error=error)
    if error is None:
        trial.step_times_s = [step_s] * steps
    return trial
