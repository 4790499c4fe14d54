"""Evaluation on a large held-out set every other optimizer step: work in half the steps, which a median step
time would count as ordinary."""
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
train_x, train_y = torch.randn(4096, 128), torch.randint(0, 10, (4096,))
val_x, val_y = torch.randn(16384, 128), torch.randint(0, 10, (16384,))


def accuracy():
    model.eval()
    with torch.no_grad():
        out = model(val_x)  # doctor: periodic-work
    model.train()
    return (out.argmax(1) == val_y).float().mean()


for step in range(100_000):
    idx = torch.randint(0, 4096, (64,))
    loss = nn.functional.cross_entropy(model(train_x[idx]), train_y[idx])
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    if step % 2 == 0:
        acc = accuracy()
