"""Runs a model forward and never steps an optimizer (inference only)."""
import torch
from torch import nn

model = nn.Linear(16, 4)
with torch.no_grad():
    for _ in range(10):
        model(torch.randn(8, 16))
print("done")
