"""Validation in eval mode but with autograd on (no torch.no_grad / inference_mode), after every step."""
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
train_x, train_y = torch.randn(2048, 256), torch.randint(0, 10, (2048,))
val_x, val_y = torch.randn(1024, 256), torch.randint(0, 10, (1024,))


def validate():
    model.eval()
    correct = 0
    for i in range(0, len(val_x), 128):
        out = model(val_x[i:i + 128])  # doctor: grad-in-validation
        correct += (out.argmax(1) == val_y[i:i + 128]).sum()
    model.train()
    return correct


for step in range(500):
    idx = torch.randint(0, 2048, (64,))
    loss = nn.functional.cross_entropy(model(train_x[idx]), train_y[idx])
    opt.zero_grad()
    loss.backward()
    opt.step()
    acc = validate()
