"""Calibration pair amsgrad_foreach: 400 small parameter tensors under AdamW(amsgrad=True) with the
per-tensor loop: the optimizer's Python loop of tiny kernels is most of the step.

slow: AdamW(..., amsgrad=True, foreach=False); fixed: AdamW(..., amsgrad=True, fused=True), the doctor's fix.
"""
# calibrates: non-foreach-optimizer
# expect: large (the optimizer is most of the step)
import torch
from torch import nn

from calib_clock import steps_from_argv, timed_steps


class ManySmall(nn.Module):
    def __init__(self, n=400, dim=16):
        super().__init__()
        self.rows = nn.ParameterList(nn.Parameter(torch.randn(dim) * 0.1) for _ in range(n))
        self.head = nn.Linear(n, 1)

    def forward(self, x):
        return self.head(x @ torch.stack(tuple(self.rows)).t())


steps = steps_from_argv()
torch.manual_seed(0)
model = ManySmall()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, amsgrad=True, fused=True)
x, y = torch.randn(64, 16), torch.randn(64, 1)
for step in timed_steps(steps, samples=len(x)):
    loss = nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
