"""Evaluation twice after every optimizer step, one eval forward per mask of the same validation batch: the
same output computed twice, and a third of each step goes to it with no finding of its own."""
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
train_x, train_y = torch.randn(4096, 128), torch.randint(0, 10, (4096,))
val_x, val_y = torch.randn(512, 128), torch.randint(0, 10, (512,))
seen, unseen = val_y < 5, val_y >= 5


def accuracy(mask):
    model.eval()
    with torch.no_grad():
        out = model(val_x)  # doctor: eval-every-step
    model.train()
    return (out.argmax(1) == val_y)[mask].float().mean()


for step in range(100_000):
    idx = torch.randint(0, 4096, (64,))
    loss = nn.functional.cross_entropy(model(train_x[idx]), train_y[idx])
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    acc_seen, acc_unseen = accuracy(seen), accuracy(unseen)
