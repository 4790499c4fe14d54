"""Slow storage: every sample is a file on a remote HTTP server, read without a cache.

argv[1]: the server URL; argv[2] (optional): a cache directory, filled before training (the fix).
"""
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader

import turbotrain as tt


def decode(data: bytes):
    x = torch.frombuffer(bytearray(data), dtype=torch.uint8)[:32].float() / 255
    return x, int(data[0]) % 4


def main(url, cache=None):
    files = tt.data.FileDataset(f"{url}/*.bin", decode=decode, cache=cache)
    if cache:
        files.fill()  # every file fetched once, many in flight; training then reads locally
    loader = DataLoader(files, batch_size=8, shuffle=True)  # doctor: slow-storage
    model = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for _ in range(5):
        for x, y in loader:
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()


if __name__ == "__main__":
    main(*sys.argv[1:])
