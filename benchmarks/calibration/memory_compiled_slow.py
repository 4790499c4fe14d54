"""Calibration pair memory_compiled: a compiled wide MLP whose batch does not fit under the doctor's limit.

slow: the batch of 8,192 rows in one compiled forward and backward, which runs out of memory under the header's
``--memory-limit``; fixed: four micro-batches of 2,048 rows, compiled alike, their gradients accumulated before the one
optimizer step, as the out-of-memory finding's compiled run makes them.
"""
# calibrates: out-of-memory
# memory-fix: micro-batches
# memory-detail: 4 x 2048
# doctor-args: --memory-limit 320MiB --what-if-budget 1
# expect: the compiled step fits in about half the memory, about as fast (each matmul a quarter as tall)
import torch
from torch import nn

from calib_clock import steps_from_argv, timed_steps

MICRO = 1  # micro-batches a step, their gradients accumulated
steps = steps_from_argv(20)
torch.manual_seed(0)
model = torch.compile(nn.Sequential(nn.Linear(64, 8192), nn.ReLU(), nn.Linear(8192, 10)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(8192, 64), torch.randint(0, 10, (8192,))
for step in timed_steps(steps, warmup=3, samples=len(x)):
    opt.zero_grad()
    for xs, ys in zip(x.chunk(MICRO), y.chunk(MICRO)):
        loss = nn.functional.cross_entropy(model(xs), ys) / MICRO
        loss.backward()
    opt.step()
