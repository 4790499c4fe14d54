"""Samples built with torch.tensor(python_list), as public GPT scripts do: no NumPy array anywhere."""
import random

import torch
from torch import nn

torch.manual_seed(0)
random.seed(0)
data = [random.randrange(64) for _ in range(20_000)]
model = nn.Sequential(nn.Embedding(64, 32), nn.Flatten(), nn.Linear(32 * 8, 64))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

for step in range(500):
    starts = [random.randrange(len(data) - 9) for _ in range(16)]
    x = torch.stack([torch.tensor(data[i:i + 8]) for i in starts])
    y = torch.tensor([data[i + 8] for i in starts])
    loss = nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
