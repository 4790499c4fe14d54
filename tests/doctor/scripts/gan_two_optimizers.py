"""A GAN: two optimizers per step, batches built by a Python generator doing slow per-sample work."""
import time

import numpy as np
import torch
from torch import nn


def real_batches(batch_size=32):
    rng = np.random.default_rng(0)
    while True:
        samples = []
        for _ in range(batch_size):
            time.sleep(0.0002)  # decoding one sample  # doctor: num-workers
            samples.append(rng.standard_normal(16).astype(np.float32))
        yield torch.from_numpy(np.stack(samples))


class GAN:
    def __init__(self):
        torch.manual_seed(0)
        self.G = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 16))
        self.D = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
        self.opt_g = torch.optim.Adam(self.G.parameters(), lr=2e-4)
        self.opt_d = torch.optim.Adam(self.D.parameters(), lr=2e-4)
        self.bce = nn.BCEWithLogitsLoss()

    def step(self, real):
        fake = self.G(torch.randn(len(real), 8))
        d_loss = self.bce(self.D(real), torch.ones(len(real), 1)) + \
            self.bce(self.D(fake.detach()), torch.zeros(len(real), 1))
        self.opt_d.zero_grad()
        d_loss.backward()
        self.opt_d.step()
        g_loss = self.bce(self.D(fake), torch.ones(len(real), 1))
        self.opt_g.zero_grad()
        g_loss.backward()
        self.opt_g.step()


gan = GAN()
for i, real in zip(range(500), real_batches()):
    gan.step(real)
