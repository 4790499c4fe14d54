"""Two DataLoader workers that take 30 ms a batch (storage latency) feed a tiny model: the loop waits
~15 ms a step for data. The first step is slow (0.3 s, as a first step that compiles or builds caches),
so by the time it ends the workers have queued every batch they may (num_workers x prefetch_factor, 8)."""
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class SlowBatches(Dataset):
    def __len__(self):
        return 400

    def __getitem__(self, i):
        time.sleep(0.03)  # the read: a whole batch from slow storage
        g = torch.Generator().manual_seed(i)
        return torch.randn(16, 32, generator=g), torch.randint(0, 4, (16,), generator=g)


if __name__ == "__main__":
    torch.manual_seed(0)
    loader = DataLoader(SlowBatches(), batch_size=None, num_workers=2, prefetch_factor=4)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step, (x, y) in enumerate(loader):
        if step == 0:
            time.sleep(0.3)  # a slow first step: the workers fill their queue meanwhile
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
