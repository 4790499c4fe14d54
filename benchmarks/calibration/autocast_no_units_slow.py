"""Calibration pair autocast_no_units: a small transformer-shaped MLP under bfloat16 autocast on a CPU without bf16
instructions (no AVX512-BF16, no AMX), where bf16 matmuls are emulated and every op pays casts.

slow: the forward and loss under torch.autocast('cpu', dtype=torch.bfloat16); fixed: the same autocast with
enabled=False (float32), the doctor's own edit.
"""
# calibrates: slow-mixed-precision
# expect: not found on a CPU with bf16 units (the rule fires only where the hardware has none); measured elsewhere
import torch
from torch import nn

from calib_clock import steps_from_argv, timed_steps

steps = steps_from_argv()
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(256, 512), nn.GELU(), nn.Linear(512, 256), nn.GELU(), nn.Linear(256, 256))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
x, y = torch.randn(64, 256), torch.randn(64, 256)
for step in timed_steps(steps, samples=len(x)):
    with torch.autocast('cpu', dtype=torch.bfloat16):
        loss = nn.functional.mse_loss(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
