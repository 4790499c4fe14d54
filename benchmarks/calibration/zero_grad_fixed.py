"""Calibration pair zero_grad: zero_grad(set_to_none=False) writes zeros into every gradient each step.

slow: opt.zero_grad(); fixed: opt.zero_grad().
"""
# calibrates: zero-grad-not-none
# expect: small (a memset per parameter against a whole forward and backward)
import torch
from torch import nn

from calib_clock import steps_from_argv, timed_steps

steps = steps_from_argv()
torch.manual_seed(0)
model = nn.Sequential(*[layer for _ in range(8) for layer in (nn.Linear(512, 512), nn.ReLU())], nn.Linear(512, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
x, y = torch.randn(64, 512), torch.randint(0, 10, (64,))
for step in timed_steps(steps, samples=len(x)):
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
