"""The pipeline tests' set-up, shared by the launched workers and the single-process references."""

from __future__ import annotations

import contextlib
import functools

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
        out = self.head(x)
        return out * self.scale if hasattr(self, "scale") else out  # a buffer some tests register


class Stack(nn.Module):
    """Identical blocks only: every stage of an even split holds exactly its share of the bytes."""

    def __init__(self, width: int = 8, blocks: int = 4):
        super().__init__()
        self.blocks = nn.ModuleList(Block(width) for _ in range(blocks))

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


def stack_loss(out, y):
    return F.mse_loss(out[:, :4], y)


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


STAGE_GROUPS = (("embed.", "blocks.0.", "blocks.1."), ("blocks.2.", "blocks.3.", "head."))  # 2 stages


@contextlib.contextmanager
def like_a_worker():
    """As torchrun's workers run the tests' scripts: one thread (OMP_NUM_THREADS=1, so the same reduction order
    in each kernel) and deterministic algorithms; both restored afterwards."""
    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic)


def _single_thread(fn):
    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        with like_a_worker():
            return fn(*args, **kwargs)
    return wrapped


def _accumulate(model, x, y, microbatches: int) -> torch.Tensor:
    """The schedule's arithmetic: each micro-batch's loss backward, the gradients then divided by their number;
    the step's loss is the micro-batch losses summed, then divided."""
    losses = []
    for xm, ym in zip(torch.tensor_split(x, microbatches), torch.tensor_split(y, microbatches)):
        loss = loss_fn(model(xm), ym)
        loss.backward()
        losses.append(loss.detach())
    for p in model.parameters():
        p.grad.div_(microbatches)
    return torch.stack(losses).sum() / microbatches


def _clip(model, clip, groups) -> None:
    if groups is None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip, foreach=True)
        return
    for prefixes in groups:
        torch.nn.utils.clip_grad_norm_([p for n, p in model.named_parameters() if n.startswith(prefixes)], clip,
                                       foreach=True)


@_single_thread
def reference(microbatches: int, steps: int = STEPS, clip: float | None = None, clip_groups=None):
    """One process, gradient accumulation over the same micro-batches: final weights and per-step losses."""
    model = make_model()
    optimizer = make_optimizer(model)
    losses = []
    for step, (x, y) in enumerate(loader()):
        if step == steps:
            break
        loss = _accumulate(model, x, y, microbatches)
        if clip is not None:
            _clip(model, clip, clip_groups)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, losses


@_single_thread
def reference_data_parallel(microbatches: int, replicas: int, steps: int):
    """Pipeline x data parallel in one process: each replica's batch (DistributedSampler order, unshuffled)
    accumulated as above, the replicas' gradients and logged losses averaged."""
    model = make_model()
    optimizer = make_optimizer(model)
    data = dataset()
    losses = []
    for step in range(steps):
        grads, step_losses = [], []
        for r in range(replicas):
            idx = torch.arange(r, SAMPLES, replicas)[step * BATCH:(step + 1) * BATCH]
            step_losses.append(_accumulate(model, data.tensors[0][idx], data.tensors[1][idx], microbatches).item())
            grads.append([p.grad.clone() for p in model.parameters()])
            optimizer.zero_grad()
        for p, *gs in zip(model.parameters(), *grads):
            p.grad = torch.stack(gs).mean(0)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(sum(step_losses) / replicas)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, losses


@_single_thread
@torch.no_grad()
def validation_loss(weights: dict[str, torch.Tensor], microbatches: int, n: int = 32, batch: int = BATCH) -> float:
    """The Trainer's validation: each batch's mean micro-batch loss, weighted by the batch's samples."""
    model = make_model()
    model.load_state_dict(weights)
    total, count = torch.zeros((), dtype=torch.float64), 0
    for x, y in loader(batch=batch, n=n):
        losses = [loss_fn(model(xm), ym) for xm, ym in zip(torch.tensor_split(x, microbatches),
                                                            torch.tensor_split(y, microbatches))]
        total += (torch.stack(losses).sum() / microbatches).double() * x.shape[0]
        count += x.shape[0]
    return float(total) / count
