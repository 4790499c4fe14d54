"""Calibration pair compile_loss: a compiled classifier whose cross-entropy over 2,000 classes runs eagerly after it.

slow: torch.compile(model), F.cross_entropy on its output; fixed: the model and the loss compiled as one function.
"""
# calibrates: compile-loss-eager
# doctor-args: --what-if-budget 90
# expect: measured (Inductor fuses the loss with the head's output)
import torch
import torch.nn.functional as F
from torch import nn

from calib_clock import steps_from_argv, timed_steps

steps = steps_from_argv()
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 2000))
step_loss = torch.compile(lambda x, y: F.cross_entropy(model(x), y))
opt = torch.optim.SGD(model.parameters(), lr=1e-2)
x = torch.randn(256, 64)
y = torch.randint(0, 2000, (256,))
for step in timed_steps(steps, samples=len(x)):
    loss = step_loss(x, y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
