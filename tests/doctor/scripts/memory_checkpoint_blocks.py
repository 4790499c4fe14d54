"""Blocks whose activations hold most of the step's peak, called in a loop over a ``ModuleList``: recomputing them
in the backward lowers the peak. Each hidden activation is 40 MiB (1,024 rows of 10,240), over glibc's largest
mmap threshold, so the process's resident peak follows the live tensors. The doctor must name the blocks (not the
list, whose forward never runs) and ``--fix`` wrap the loop's call in torch.utils.checkpoint."""

import torch
from torch import nn


class WideBlock(nn.Module):
    """16 features up to 10,240 and back."""

    def __init__(self, features=16, hidden=10240):
        super().__init__()
        self.up = nn.Linear(features, hidden)
        self.act = nn.GELU()
        self.down = nn.Linear(hidden, features)

    def forward(self, x):
        return x + self.down(self.act(self.up(x)))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(WideBlock() for _ in range(2))
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def main():
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(1024, 16), torch.randint(0, 4, (1024,))
    for step in range(40):
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()


if __name__ == "__main__":
    main()
