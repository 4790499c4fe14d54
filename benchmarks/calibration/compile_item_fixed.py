"""Calibration pair compile_item: a model compiled by Inductor whose every block reads a Python number with .item()
in its forward (the largest activation, to scale by): a graph break per block, the float specialised on.

slow: .item() breaks the graph; fixed: torch._dynamo.config.capture_scalar_outputs = True (the scalar stays in the
graph).
"""
# calibrates: compile-graph-break
# doctor-args: --what-if-budget 120
# expect: measured (the scalar captured in the graph, timed fresh against the model as the script runs it)
import torch
from torch import nn

from calib_clock import steps_from_argv, timed_steps


class ScaledBlock(nn.Module):
    def __init__(self, width=128):
        super().__init__()
        self.linear = nn.Linear(width, width)

    def forward(self, x):
        h = torch.tanh(self.linear(x))
        peak = h.abs().max().item()
        return x + h / (peak + 1e-6)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.Sequential(*(ScaledBlock() for _ in range(4)))
        self.head = nn.Linear(128, 1)

    def forward(self, x):
        return self.head(self.blocks(x))


torch._dynamo.config.capture_scalar_outputs = True
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
