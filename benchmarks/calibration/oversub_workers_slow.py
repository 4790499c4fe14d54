"""Calibration pair oversub_workers: four DataLoader workers on a two-core machine, beside a model that
already keeps both cores busy with its own intra-op threads.

slow: DataLoader(num_workers=4); fixed: DataLoader(num_workers=0), the doctor's fix on this 2-core machine.
"""
# calibrates: cpu-oversubscribed
# expect: small to moderate (the workers' total work is the same; only the contention differs)
import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from calib_clock import steps_from_argv, timed_steps

BATCH = 64


class Noisy(Dataset):
    def __init__(self, n):
        self.features = np.random.default_rng(0).standard_normal((1024, 512)).astype(np.float32)
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        row = self.features[i % len(self.features)]
        noise = np.random.default_rng(i).standard_normal(row.shape).astype(np.float32)
        return torch.from_numpy(row + 0.1 * noise), i % 10


steps = steps_from_argv()
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loader = DataLoader(Noisy(BATCH * (steps + 10)), batch_size=BATCH, num_workers=4)
for step, (x, y) in zip(timed_steps(steps, samples=BATCH), loader):
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
