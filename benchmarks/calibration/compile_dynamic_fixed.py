"""Calibration pair compile_dynamic: a compiled model of pointwise blocks over sequences whose length changes from
batch to batch (12 lengths in turn). Compiled with dynamic=False, each new length recompiles until torch's recompile
limit (8): nine lengths run compiled, one graph each, and the three past the limit eagerly; with dynamic=True one
graph serves every length.

slow: torch.compile(model, dynamic=False); fixed: torch.compile(model, dynamic=True).
"""
# calibrates: compile-recompile
# doctor-args: --what-if-budget 120
# expect: measured (dynamic=True timed fresh against the eager fallback, stepped on the lengths the guards name)
import torch
from torch import nn

from calib_clock import steps_from_argv, timed_steps


class Block(nn.Module):
    def __init__(self, width=128):
        super().__init__()
        self.lin = nn.Linear(width, width)

    def forward(self, x):
        h = self.lin(x)
        return x + h * torch.sigmoid(1.702 * h) * 0.5 + 0.5 * torch.tanh(h) * h.abs()


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.Sequential(*(Block() for _ in range(3)))
        self.head = nn.Linear(128, 4)

    def forward(self, x):
        return self.head(self.blocks(x).mean(dim=1))


steps = steps_from_argv()
torch.manual_seed(0)
model = torch.compile(Model(), dynamic=True)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
lengths = [24 + 4 * i for i in range(12)]
batches = [(torch.randn(16, n, 128), torch.randint(0, 4, (16,))) for n in lengths]
# The warm-up covers the first compile, the eight recompiles and the limit.
for step in timed_steps(steps, warmup=min(steps, 12), samples=16):
    x, y = batches[step % len(batches)]
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
