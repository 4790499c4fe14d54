"""The pipeline tests' set-up, shared by the launched workers and the single-process references."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

SAMPLES, BATCH, STEPS, SEED = 160, 8, 20, 0
WIDTH = 16

# name -> Plan settings and split points: 2 stages (GPipe, 1F1B), 4 interleaved stages on 2 processes
CONFIGS = {
    "gpipe": ({"pipeline_stages": 2, "microbatches": 4, "schedule": "gpipe"}, ["blocks.2"]),
    "1f1b": ({"pipeline_stages": 2, "microbatches": 4, "schedule": "1f1b"}, ["blocks.2"]),
    "interleaved": ({"pipeline_stages": 4, "microbatches": 4, "schedule": "interleaved-1f1b"},
                    ["blocks.1", "blocks.2", "blocks.3"]),
}


class Block(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc = nn.Linear(width, width)

    def forward(self, x):
        return x + torch.tanh(self.fc(self.norm(x)))


class Net(nn.Module):
    def __init__(self, width: int = WIDTH, blocks: int = 4):
        super().__init__()
        self.embed = nn.Linear(8, width)
        self.blocks = nn.ModuleList(Block(width) for _ in range(blocks))
        self.head = nn.Linear(width, 4)

    def forward(self, x):
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def make_model() -> Net:
    torch.manual_seed(SEED)
    return Net()


def make_optimizer(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)


def dataset(n: int = SAMPLES, seed: int = 1) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    return TensorDataset(x, torch.sin(x[:, :4]) + 0.1 * torch.randn(n, 4, generator=g))


def loader(batch: int = BATCH, n: int = SAMPLES) -> DataLoader:
    return DataLoader(dataset(n), batch_size=batch, shuffle=False)


loss_fn = F.mse_loss


def reference(microbatches: int, steps: int = STEPS):
    """One process, gradient accumulation as the schedule does it: the micro-batches' gradients summed, then
    divided by their number; the step's loss the mean of theirs (summed, then divided)."""
    torch.use_deterministic_algorithms(True)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as torchrun's workers (OMP_NUM_THREADS=1): the same reduction order in each kernel
    try:
        return _reference(microbatches, steps)
    finally:
        torch.set_num_threads(threads)


def _reference(microbatches: int, steps: int):
    model = make_model()
    optimizer = make_optimizer(model)
    losses = []
    for step, (x, y) in enumerate(loader()):
        if step == steps:
            break
        mb_losses = []
        for xm, ym in zip(torch.tensor_split(x, microbatches), torch.tensor_split(y, microbatches)):
            loss = loss_fn(model(xm), ym)
            loss.backward()
            mb_losses.append(loss.detach())
        for p in model.parameters():
            p.grad.div_(microbatches)
        optimizer.step()
        optimizer.zero_grad()
        losses.append((torch.stack(mb_losses).sum() / microbatches).item())
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, losses
