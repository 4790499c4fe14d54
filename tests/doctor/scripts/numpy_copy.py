"""torch.tensor(ndarray) every step: a full copy of each batch that torch.from_numpy would avoid."""
import numpy as np
import torch
from torch import nn

rng = np.random.default_rng(0)
images = rng.standard_normal((512, 3, 64, 64), dtype=np.float32)
labels = rng.integers(0, 10, 512)

model = nn.Sequential(nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(3 * 4 * 4, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)

for step in range(400):
    start = (step * 128) % 512
    x = torch.tensor(images[start:start + 128])  # doctor: tensor-from-numpy-copy
    y = torch.tensor(labels[start:start + 128])
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
