"""Calibration pair compile_pointwise: a small MLP of hand-written pointwise activations (each its own
kernel) at a batch small enough that per-op overhead rules.

slow: eager; fixed: model = torch.compile(model).
"""
# calibrates: jit-script
# doctor-args: --compile --what-if-budget 90
# expect: measured (inductor fuses the pointwise chains; compiling takes seconds once)
import torch
from torch import nn

from calib_clock import steps_from_argv, timed_steps


class Swish(nn.Module):
    def forward(self, x):
        return x * torch.sigmoid(1.702 * x) * 0.5 + 0.5 * x * torch.tanh(x).abs()


steps = steps_from_argv()
torch.manual_seed(0)
model = nn.Sequential(*[layer for _ in range(4) for layer in (nn.Linear(256, 256), Swish())], nn.Linear(256, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
for step in timed_steps(steps, samples=len(x)):
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
