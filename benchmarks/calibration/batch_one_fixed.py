"""Calibration pair batch_one: a deep, narrow MLP trained one sample at a time: every op's dispatch costs more
than its arithmetic.

slow: DataLoader(batch_size=1); fixed: batch_size=8 (the fix's gain is in samples/s).
"""
# calibrates: small-batch
# expect: large in samples/s (eight samples for about the price of one)
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from calib_clock import steps_from_argv, timed_steps

BATCH = 8
steps = steps_from_argv()
torch.manual_seed(0)
data = TensorDataset(torch.randn(8 * (steps + 10), 64), torch.randint(0, 10, (8 * (steps + 10),)))
model = nn.Sequential(*[layer for _ in range(16) for layer in (nn.Linear(64, 64), nn.LayerNorm(64), nn.ReLU())],
                      nn.Linear(64, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loader = DataLoader(data, batch_size=BATCH, shuffle=True)
for step, (x, y) in zip(timed_steps(steps, samples=BATCH), loader):
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
