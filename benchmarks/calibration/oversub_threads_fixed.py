"""Calibration pair oversub_threads: eight intra-op threads on a two-core machine (a value copied from
a bigger box): OpenMP threads wait on each other at every op's barrier.

slow: torch.set_num_threads(2); fixed: torch.set_num_threads(2).
"""
# calibrates: cpu-oversubscribed
# expect: large (every parallel op waits for threads that are not running)
import torch
from torch import nn

from calib_clock import steps_from_argv, timed_steps

torch.set_num_threads(2)
steps = steps_from_argv()
torch.manual_seed(0)
model = nn.Sequential(*[layer for _ in range(6) for layer in (nn.Linear(256, 256), nn.LayerNorm(256), nn.GELU())],
                      nn.Linear(256, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(128, 256), torch.randint(0, 10, (128,))
for step in timed_steps(steps, samples=len(x)):
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
