"""A DataLoader with a worker over a small dataset: every epoch of 4 batches starts the worker anew."""
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
data = TensorDataset(torch.randn(256, 32), torch.randint(0, 4, (256,)))
loader = DataLoader(data, batch_size=64, num_workers=1)  # doctor: persistent-workers
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(100):
    for x, y in loader:
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
