"""A compiled model whose every block reads a Python number with .item() in forward: a graph break per block.

torch.compile ends the graph at each .item() and runs the rest of the block as a new graph, so each step runs
many small graphs with Python in between, and the float it returns is specialised on (a recompile when it changes).
"""

import torch
from torch import nn


class ScaledBlock(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.linear = nn.Linear(width, width)

    def forward(self, x):
        h = torch.tanh(self.linear(x))
        peak = h.abs().max().item()  # doctor: compile-graph-break
        return x + h / (peak + 1e-6)


class Net(nn.Module):
    def __init__(self, width=32, depth=3):
        super().__init__()
        self.blocks = nn.ModuleList(ScaledBlock(width) for _ in range(depth))
        self.head = nn.Linear(width, 1)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def main(steps=30):
    torch.manual_seed(0)
    model = Net()
    # The eager backend keeps the corpus fast; Inductor breaks the graph at the same lines.
    compiled = torch.compile(model, backend="eager")
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    x = torch.randn(512, 32)
    y = x[:, :1] * 0.5
    for step in range(steps):
        xb, yb = x[step * 16 % 512 :][:16], y[step * 16 % 512 :][:16]
        loss = ((compiled(xb) - yb) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


if __name__ == "__main__":
    main()
