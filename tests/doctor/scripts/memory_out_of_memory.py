"""A model that runs out of memory at its batch size: a radial-basis expansion makes every sample's activations
2048x its input (B x 64 x 2048 floats), so the script's 2**18 rows ask for 128 GiB at once, which no allocator
grants. The doctor must say at which step, phase and line, what held the memory at a batch that fits, and which
fix fits (micro-batches with accumulation do).

``memory_out_of_memory.py ROWS CENTRES``: a smaller step for ``doctor --memory-limit``; 512 rows of 512 centres
peak at about 129 MiB, 256 rows at about 65 MiB, so under a 96 MiB limit two micro-batches fit. A third argument,
``adamw``, trains with AdamW instead of SGD: its state (twice the parameters) exists only after a first step the
run never finishes."""

import sys

import torch
from torch import nn


class Expansion(nn.Module):
    """Each feature against the centres: exp(-(x - c)^2), weighted and summed back to one value per feature."""

    def __init__(self, features, centres):
        super().__init__()
        self.register_buffer("centres", torch.linspace(-3, 3, centres))
        self.weight = nn.Parameter(torch.randn(features, centres) / centres)

    def forward(self, x):
        basis = torch.exp(-(x.unsqueeze(-1) - self.centres).pow(2))  # doctor: out-of-memory
        return (basis * self.weight).sum(-1)


class Net(nn.Module):
    def __init__(self, centres):
        super().__init__()
        self.expand = Expansion(64, centres)
        self.head = nn.Linear(64, 10)

    def forward(self, x):
        return self.head(torch.relu(self.expand(x)))


def main(rows=2**18, centres=2048, optimizer="sgd"):
    torch.manual_seed(0)
    model = Net(centres)
    opt = torch.optim.AdamW(model.parameters()) if optimizer == "adamw" else torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(3):
        x, y = torch.randn(rows, 64), torch.randint(0, 10, (rows,))
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()


if __name__ == "__main__":
    main(*map(int, sys.argv[1:3]), *sys.argv[3:])
