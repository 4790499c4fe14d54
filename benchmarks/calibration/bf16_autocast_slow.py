"""Calibration pair bf16_autocast: a matmul-heavy MLP in float32 on a CPU with native bfloat16
(avx512_bf16): autocast runs its matmuls in bfloat16.

slow: plain float32 forward; fixed: the forward and loss under torch.autocast('cpu', dtype=torch.bfloat16).
"""
# calibrates: no-mixed-precision
# expect: measured (depends on the CPU's bf16 matmul kernels against the casts autocast adds)
import torch
from torch import nn

from calib_clock import steps_from_argv, timed_steps

steps = steps_from_argv()
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(128, 1024), torch.randint(0, 10, (128,))
for step in timed_steps(steps, samples=len(x)):
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
