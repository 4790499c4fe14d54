"""Calibration pair batch_costly_samples: one sample a batch, as in batch_one, but every sample costs real
work to load (a per-sample, pure-Python transform, as decoding or tokenising would): a larger batch spreads
the model's per-op overhead over more samples, not the loading.

slow: DataLoader(batch_size=1); fixed: batch_size=8 (the fix's gain is in samples/s).
"""
# calibrates: small-batch
# expect: about x2 in samples/s (the model's part shrinks eight-fold per sample, the loading not at all)
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from calib_clock import steps_from_argv, timed_steps

BATCH = 1


class CostlySamples(Dataset):
    def __init__(self, n: int):
        self.x = torch.randn(n, 64)
        self.y = torch.randint(0, 10, (n,))

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        checksum = 0
        for j in range(6000):  # one sample's decoding, in plain Python
            checksum = (checksum * 31 + j) % 1_000_003
        return self.x[i] + checksum * 0.0, self.y[i]


steps = steps_from_argv()
torch.manual_seed(0)
model = nn.Sequential(*[layer for _ in range(16) for layer in (nn.Linear(64, 64), nn.LayerNorm(64), nn.ReLU())],
                      nn.Linear(64, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loader = DataLoader(CostlySamples(8 * (steps + 10)), batch_size=BATCH, shuffle=True)
for step, (x, y) in zip(timed_steps(steps, samples=BATCH), loader):
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
