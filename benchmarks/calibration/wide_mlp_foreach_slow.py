"""Calibration pair wide_mlp_foreach: Adam's per-tensor loop over 24 large tensors of a compute-bound
MLP: the loop is a handful of big kernels, so foreach has little to win.

slow: Adam(..., foreach=False); fixed: Adam(..., fused=True), the doctor's fix.
"""
# calibrates: non-foreach-optimizer
# expect: small (the matmuls dominate the step)
import torch
from torch import nn

from calib_clock import steps_from_argv, timed_steps

steps = steps_from_argv()
torch.manual_seed(0)
model = nn.Sequential(*[layer for _ in range(12) for layer in (nn.Linear(256, 256), nn.ReLU())])
opt = torch.optim.Adam(model.parameters(), lr=1e-4, foreach=False)
x = torch.randn(128, 256)
for step in timed_steps(steps, samples=len(x)):
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
