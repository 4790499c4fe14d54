"""Calibration pair compile_branch: a model compiled by Inductor whose every block branches in Python on a tensor's
value (halving its activations when any is above 1): a graph break per block.

slow: `if h.abs().amax() > 1.0: h = h / 2`; fixed: the same as one torch.where (both sides computed, no break).
"""
# calibrates: compile-graph-break
# doctor-args: --what-if-budget 120
# expect: measured (the branch as torch.where on a copy of the model, timed fresh against the model as it runs)
import torch
from torch import nn

from calib_clock import steps_from_argv, timed_steps


class ClippedBlock(nn.Module):
    def __init__(self, width=128):
        super().__init__()
        self.linear = nn.Linear(width, width)

    def forward(self, x):
        h = torch.tanh(self.linear(x)) * 2
        if h.abs().amax() > 1.0:
            h = h / 2
        return x + h


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.Sequential(*(ClippedBlock() for _ in range(4)))
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
