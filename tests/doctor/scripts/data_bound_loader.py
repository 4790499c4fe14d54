"""Data-bound: every sample is a slow read (simulated storage latency) and num_workers=0."""
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class SlowFiles(Dataset):
    def __init__(self, n=2048):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        time.sleep(0.0005)  # one file read from slow storage
        g = torch.Generator().manual_seed(i)
        return torch.randn(64, generator=g), i % 10


def main():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loader = DataLoader(SlowFiles(), batch_size=32, shuffle=True)  # doctor: num-workers
    for epoch in range(3):
        for x, y in loader:
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()


if __name__ == "__main__":
    main()
