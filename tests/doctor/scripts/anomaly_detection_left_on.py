"""Anomaly detection switched on while chasing a NaN, and left on: every step records every op's stack."""
import torch
from torch import nn

torch.manual_seed(0)
torch.autograd.set_detect_anomaly(True)  # doctor: anomaly-detection-on
model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
data, labels = torch.randn(512, 64), torch.randint(0, 10, (512,))
for step in range(300):
    i = step * 32 % 512
    loss = nn.functional.cross_entropy(model(data[i:i + 32]), labels[i:i + 32])
    opt.zero_grad()
    loss.backward()
    opt.step()
