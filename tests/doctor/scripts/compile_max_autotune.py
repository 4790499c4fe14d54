"""A small regression model compiled with mode="max-autotune" for a short run.

max-autotune benchmarks kernel choices while it compiles: its compile costs more than the default mode's, and a
run of a few hundred steps may never win it back (the default mode, or max-autotune only for long runs).
"""

import torch
from torch import nn


def main(steps=40):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 128), nn.GELU(), nn.Linear(128, 128), nn.GELU(), nn.Linear(128, 1))
    compiled = torch.compile(model, mode="max-autotune")  # doctor: compile-mode
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    x = torch.randn(1024, 32)
    y = x[:, :1] - x[:, 1:2]
    for step in range(steps):
        xb, yb = x[step * 64 % 1024 :][:64], y[step * 64 % 1024 :][:64]
        loss = nn.functional.mse_loss(compiled(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()


if __name__ == "__main__":
    main()
