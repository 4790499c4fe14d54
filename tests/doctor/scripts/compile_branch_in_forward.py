"""A compiled model whose every block branches in Python on a tensor's value: a graph break per block.

`if h.abs().amax() > 1.0:` asks for the tensor's value as a Python bool, which torch.compile cannot keep in a graph:
each block ends its graph at the `if`, runs the test in Python, and starts a new graph after it. The branch says the
same as one torch.where (both sides computed), which compiles whole.
"""

import torch
from torch import nn


class ClippedBlock(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.linear = nn.Linear(width, width)

    def forward(self, x):
        h = torch.tanh(self.linear(x)) * 2
        if h.abs().amax() > 1.0:  # doctor: compile-graph-break
            h = h / 2
        return x + h


class Net(nn.Module):
    def __init__(self, width=32, depth=3):
        super().__init__()
        self.blocks = nn.ModuleList(ClippedBlock(width) for _ in range(depth))
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
