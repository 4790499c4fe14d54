"""Data-bound with num_workers from the command line (default 0): the fix is a value the user passes, so
doctor --fix lists it "by hand" with the line, and edits nothing."""
import argparse
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class SlowReads(Dataset):
    def __len__(self):
        return 4096

    def __getitem__(self, i):
        time.sleep(0.0005)  # one read from slow storage
        return torch.full((64,), float(i % 7)), i % 10


parser = argparse.ArgumentParser()
parser.add_argument("--workers", type=int, default=0)
args = parser.parse_args()
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
loader = DataLoader(SlowReads(), batch_size=32, shuffle=True, num_workers=args.workers)  # doctor: num-workers
for x, y in loader:
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
