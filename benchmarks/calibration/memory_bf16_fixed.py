"""Calibration pair memory_bf16: the wide blocks of memory_ckpt, their activations kept in bfloat16 under autocast.

slow: float32 activations; fixed: the forward and the loss under torch.autocast("cpu", dtype=torch.bfloat16),
as activation-memory's bf16-autocast fix measures it.
"""
# calibrates: activation-memory
# memory-fix: bf16-autocast
# doctor-args: --what-if-budget 120
# expect: activations halved; the step faster where the CPU has fast bf16, slower where not
import torch
from torch import nn

from calib_clock import steps_from_argv, timed_steps
from memory_blocks import Net

steps = steps_from_argv(20)
torch.manual_seed(0)
model = Net()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(2048, 64), torch.randint(0, 10, (2048,))
for step in timed_steps(steps, warmup=3, samples=len(x)):
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=True):
        loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
