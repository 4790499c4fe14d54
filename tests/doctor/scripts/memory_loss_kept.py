"""A loop that keeps every step's loss in a list to average it at the end: each kept loss keeps its step's
autograd graph alive, so memory grows with every step. The doctor must name the ``losses.append(loss)`` line
(``.item()`` or ``.detach()`` there is the fix)."""

import torch
from torch import nn


def main():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    losses = []
    for step in range(40):
        x = torch.randn(64, 32)
        y = torch.randint(0, 4, (64,))
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss)  # doctor: graph-kept-alive
    print(f"mean loss {torch.stack(losses).mean().item():.4f}")


if __name__ == "__main__":
    main()
