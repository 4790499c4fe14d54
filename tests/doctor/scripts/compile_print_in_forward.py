"""A compiled model that prints a statistic from inside its forward: torch.compile cannot trace print.

Each call ends the graph at the print, runs it in Python, and starts a new graph after it: two graphs and a
trip through the interpreter a step, for a line most authors added while debugging and forgot.
"""

import torch
from torch import nn


class Regressor(nn.Module):
    def __init__(self, width=64):
        super().__init__()
        self.encode = nn.Sequential(nn.Linear(16, width), nn.GELU())
        self.head = nn.Linear(width, 1)

    def forward(self, x):
        h = self.encode(x)
        print("mean activation", h.mean())  # doctor: compile-graph-break
        return self.head(h)


def main(steps=30):
    torch.manual_seed(0)
    model = Regressor()
    # The eager backend keeps the corpus fast; Inductor breaks the graph at the same line.
    compiled = torch.compile(model, backend="eager")
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    x = torch.randn(512, 16)
    y = x.sum(dim=1, keepdim=True)
    for step in range(steps):
        xb, yb = x[step * 32 % 512 :][:32], y[step * 32 % 512 :][:32]
        loss = nn.functional.mse_loss(compiled(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()


if __name__ == "__main__":
    main()
