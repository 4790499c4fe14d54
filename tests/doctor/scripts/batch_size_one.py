"""Batch size 1: a generator yields one sample at a time, so per-op overhead dominates the step."""
import torch
from torch import nn

torch.manual_seed(0)
X = torch.randn(10_000, 16)
Y = (X.sum(1, keepdim=True) > 0).float()


def one_sample_at_a_time():
    while True:
        for i in range(len(X)):
            yield X[i:i + 1], Y[i:i + 1]


model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
loss_fn = nn.BCEWithLogitsLoss()

for step, (x, y) in zip(range(3000), one_sample_at_a_time()):
    optimizer.zero_grad()
    loss_fn(model(x), y).backward()
    optimizer.step()
