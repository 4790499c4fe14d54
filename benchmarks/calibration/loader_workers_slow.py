"""Calibration pair loader_workers: every sample is read (0.4 ms of storage latency) and jittered in
Python, in the training process.

slow: DataLoader(num_workers=0); fixed: DataLoader(num_workers=4, persistent_workers=True), the doctor's fix.
"""
# calibrates: num-workers
# expect: large (the batch takes longer to build than the model takes to train on it)
import time

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from calib_clock import steps_from_argv, timed_steps

BATCH = 32


class Augmented(Dataset):
    def __init__(self, n):
        self.images = np.random.default_rng(0).standard_normal((256, 32, 32)).astype(np.float32)
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        time.sleep(0.0004)  # the read: a file on network storage answers after ~0.4 ms
        img = self.images[i % len(self.images)]
        rng = np.random.default_rng(i)
        out = img.copy()
        for r in range(0, len(img), 4):  # a hand-written per-row jitter, as augmentations often are
            out[r] = np.roll(img[r], int(rng.integers(-2, 3))) * rng.uniform(0.9, 1.1)
        return torch.from_numpy(out.reshape(-1)), i % 10


steps = steps_from_argv()
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(1024, 128), nn.ReLU(), nn.Linear(128, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loader = DataLoader(Augmented(BATCH * (steps + 10)), batch_size=BATCH, num_workers=0)
for step, (x, y) in zip(timed_steps(steps, samples=BATCH), loader):
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
