"""A small model compiled for a run of 8 steps, which ends by itself.

Compiling takes seconds; 8 steps of a small MLP take milliseconds, so no compiled step could win the compile back
in this run (llm.c's train_gpt2.py --compile 1 defaults to 10 iterations: 73 s compiling, 14 s training).
"""

import torch
from torch import nn


def main(steps=8):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
    compiled = torch.compile(model)
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    x = torch.randn(256, 32)
    y = x[:, :1] - x[:, 1:2]
    for step in range(steps):
        xb, yb = x[step * 32 % 256 :][:32], y[step * 32 % 256 :][:32]
        loss = nn.functional.mse_loss(compiled(xb), yb)  # doctor: compile-pays-back
        opt.zero_grad()
        loss.backward()
        opt.step()


if __name__ == "__main__":
    main()
