"""A loop that gathers every step's predictions to score them at the end: each step's detached logits (no graph)
stay in a list, so memory grows with every step. The doctor must name the ``preds.append(...)`` line (a metric
updated each step, or a running count, keeps nothing)."""

import torch
from torch import nn


def main():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    preds, labels = [], []
    for step in range(40):
        x = torch.randn(256, 32)
        y = torch.randint(0, 10, (256,))
        logits = model(x)
        loss = nn.functional.cross_entropy(logits, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        preds.append(logits.detach())  # doctor: tensors-kept
        labels.append(y)
    accuracy = (torch.cat(preds).argmax(1) == torch.cat(labels)).float().mean()
    print(f"accuracy {accuracy.item():.3f}")


if __name__ == "__main__":
    main()
