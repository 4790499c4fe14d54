"""Batches built by a Python generator doing slow per-sample work, and first steps that take far longer
than the rest (a one-off pause: a garbage collection of a large heap, a lazily built cache)."""
import time

import torch
from torch import nn


def batches(batch_size=32):
    while True:
        samples = []
        for _ in range(batch_size):
            time.sleep(0.0002)  # decoding one sample  # doctor: num-workers
            samples.append(torch.randn(16))
        yield torch.stack(samples), torch.randint(0, 2, (batch_size,))


torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for i, (x, y) in zip(range(500), batches()):
    loss = nn.functional.cross_entropy(model(x), y)
    if i < 2:
        time.sleep(0.1)  # the one-off pause, inside the step
    opt.zero_grad()
    loss.backward()
    opt.step()
