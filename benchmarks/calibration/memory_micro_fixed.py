"""Calibration pair memory_micro: the wide blocks of memory_ckpt, the batch in two micro-batches.

slow: the batch of 2,048 rows in one forward and backward; fixed: two micro-batches of 1,024, their gradients
accumulated before the one optimizer step, as activation-memory's micro-batches fix measures it.
"""
# calibrates: activation-memory
# memory-fix: micro-batches
# doctor-args: --what-if-budget 120
# expect: activations halved, the step about as fast (each matmul half as tall)
import torch
from torch import nn

from calib_clock import steps_from_argv, timed_steps
from memory_blocks import Net

MICRO = 2  # micro-batches a step, their gradients accumulated
steps = steps_from_argv(20)
torch.manual_seed(0)
model = Net()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(2048, 64), torch.randint(0, 10, (2048,))
for step in timed_steps(steps, warmup=3, samples=len(x)):
    opt.zero_grad()
    for xs, ys in zip(x.chunk(MICRO), y.chunk(MICRO)):
        loss = nn.functional.cross_entropy(model(xs), ys) / MICRO
        loss.backward()
    opt.step()
