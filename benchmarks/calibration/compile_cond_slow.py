"""Calibration pair compile_cond: a model compiled by Inductor whose every block gates in Python on a tensor's value,
each side setting two names over several statements: a graph break per block.

slow: `if g.mean() > 0:` with its two sides; fixed: the same as torch.cond, written as the doctor's fix writes it
(only the side taken runs, no break).
"""
# calibrates: compile-graph-break
# doctor-args: --what-if-budget 120
# expect: measured (the branch as torch.cond on a copy of the model, timed fresh against the model as it runs)
import torch
from torch import nn

from calib_clock import steps_from_argv, timed_steps


class GatedBlock(nn.Module):
    def __init__(self, width=128):
        super().__init__()
        self.gate = nn.Linear(width, width)
        self.value = nn.Linear(width, width)

    def forward(self, x):
        g = self.gate(x)
        if g.mean() > 0:
            v = torch.sigmoid(g) * self.value(x)
            scale = v.std()
        else:
            v = self.value(x)
            scale = v.abs().mean()
        return x + v / (1 + scale)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.Sequential(*(GatedBlock() for _ in range(4)))
        self.head = nn.Linear(128, 1)

    def forward(self, x):
        return self.head(self.blocks(x))


steps = steps_from_argv()
torch.manual_seed(0)
model = torch.compile(Net())
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
x = torch.randn(64, 128)
y = x[:, :1] * 0.5
for step in timed_steps(steps, warmup=min(steps, 12), samples=len(x)):
    loss = ((model(x) - y) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
