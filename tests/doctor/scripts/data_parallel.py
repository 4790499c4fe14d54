"""nn.DataParallel instead of DistributedDataParallel."""
import torch
from torch import nn

torch.manual_seed(0)
net = nn.Sequential(nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 10))
model = nn.DataParallel(net)  # doctor: data-parallel
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(512, 128), torch.randint(0, 10, (512,))
for step in range(300):
    idx = torch.randint(0, 512, (64,))
    loss = nn.functional.cross_entropy(model(x[idx]), y[idx])
    opt.zero_grad()
    loss.backward()
    opt.step()
