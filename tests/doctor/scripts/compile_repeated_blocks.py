"""A compiled model of eight identical residual blocks, compiled whole: torch.compile traces every block into one
graph, so compiling takes time in proportion to the depth; compiling each block instead traces one and reuses it.
"""

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up, self.down = nn.Linear(width, 2 * width), nn.Linear(2 * width, width)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


class Net(nn.Module):
    def __init__(self, width=32, depth=8):
        super().__init__()
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))
        self.head = nn.Linear(width, 1)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def main(steps=40):
    torch.manual_seed(0)
    model = Net()
    # The eager backend keeps the corpus fast; its compile time is dynamo's tracing, which grows with the depth too.
    compiled = torch.compile(model, backend="eager")  # doctor: compile-regional
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    x = torch.randn(64, 32)
    y = x[:, :1] * 0.5
    for _ in range(steps):
        loss = ((compiled(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


if __name__ == "__main__":
    main()
