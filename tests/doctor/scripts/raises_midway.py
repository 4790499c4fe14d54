"""Trains a few steps, then fails: the doctor must say where and still report what it measured."""
import torch
from torch import nn

model = nn.Linear(16, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(100):
    loss = model(torch.randn(32, 16)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step == 7:
        raise RuntimeError("the data ran out of disk")
