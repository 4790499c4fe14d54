"""Gradient accumulation under DistributedDataParallel without no_sync(): every micro-batch all-reduces."""
import os
import tempfile

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

if not dist.is_initialized():
    store = os.path.join(tempfile.mkdtemp(), "store")
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)

model = DistributedDataParallel(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
ACCUM = 4
try:
    for i in range(400):
        loss = model(torch.randn(16, 32)).pow(2).mean() / ACCUM
        loss.backward()
        if (i + 1) % ACCUM == 0:
            opt.step()
            opt.zero_grad()
finally:
    dist.destroy_process_group()
