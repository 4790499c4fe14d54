"""Validation every 20 steps over many batches, with autograd on: a window of 20-30 steps holds one or two
of them, so a doctor that does not amortise them names a different bottleneck from run to run."""
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
train = DataLoader(TensorDataset(torch.randn(4096, 64), torch.randint(0, 10, (4096,))), batch_size=32, shuffle=True)
val_x = torch.randn(256 * 64, 64)


def validate():
    model.eval()
    total = 0.0
    for i in range(0, len(val_x), 64):
        total += model(val_x[i:i + 64]).float().mean()  # doctor: periodic-work
    model.train()
    return total


step = 0
for epoch in range(100):
    for x, y in train:
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        if step % 20 == 0:
            validate()
