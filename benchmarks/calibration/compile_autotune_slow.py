"""Calibration pair compile_autotune: an MLP compiled by Inductor in mode="max-autotune", which benchmarks GEMM
kernels while compiling.

slow: torch.compile(model, mode="max-autotune"); fixed: torch.compile(model), the default mode.
"""
# calibrates: compile-mode
# doctor-args: --what-if-budget 240
# expect: measured (both modes compiled fresh and the step timed, interleaved)
import torch
from torch import nn

from calib_clock import steps_from_argv, timed_steps

steps = steps_from_argv()
torch.manual_seed(0)
net = nn.Sequential(nn.Linear(256, 512), nn.GELU(), nn.Linear(512, 512), nn.GELU(), nn.Linear(512, 1))
model = torch.compile(net, mode="max-autotune")
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
x = torch.randn(128, 256)
y = x[:, :1] * 0.5
for step in timed_steps(steps, warmup=min(steps, 8), samples=len(x)):
    loss = ((model(x) - y) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
