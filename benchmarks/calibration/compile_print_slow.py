"""Calibration pair compile_print: a compiled MLP that prints a statistic inside its forward, a graph break.

slow: print("mean activation", h.mean()) in the compiled forward; fixed: the print taken out.
"""
# calibrates: compile-graph-break
# doctor-args: --what-if-budget 90
# expect: measured (the print is timed as a no-op that torch traces)
import torch
from torch import nn

from calib_clock import steps_from_argv, timed_steps


class Regressor(nn.Module):
    def __init__(self, width=128):
        super().__init__()
        self.encode = nn.Sequential(nn.Linear(64, width), nn.GELU(), nn.Linear(width, width), nn.GELU())
        self.head = nn.Linear(width, 1)

    def forward(self, x):
        h = self.encode(x)
        print("mean activation", h.mean())
        return self.head(h)


steps = steps_from_argv()
torch.manual_seed(0)
model = torch.compile(Regressor(), backend="eager")  # Inductor breaks the graph at the same line
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(64, 64)
y = x.sum(dim=1, keepdim=True)
for step in timed_steps(steps, samples=len(x)):
    loss = nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
