"""Written for a GPU: a batch whose activations no GPU holds. Every sample's 64 features are compared with 4096
centres (B x 64 x 4096 floats), so 2**18 rows ask for 256 GiB in the forward, more than an H200's 141 GB.
The doctor must say at which step, phase and line the step ran out, what held the memory at a batch that fits,
and which fix makes it fit (micro-batches with gradient accumulation do).

``gpu_out_of_memory.py ROWS CENTRES``: a smaller step for ``doctor --memory-limit``; 4096 rows of 1024 centres
hold about 3 GiB at the step's peak, so under a 1536 MiB limit they run out and four micro-batches fit (as the
doctor measured it on the CPU under the same limit)."""

import sys

import torch
from torch import nn

device = "cuda" if torch.cuda.is_available() else "cpu"


class RadialFeatures(nn.Module):
    def __init__(self, features=64, centres=4096):
        super().__init__()
        self.register_buffer("centres", torch.linspace(-3, 3, centres))
        self.mix = nn.Parameter(torch.randn(features, centres) / centres)

    def forward(self, x):
        distance = (x.unsqueeze(-1) - self.centres).square()  # doctor: out-of-memory
        return (torch.exp(-distance) * self.mix).sum(-1)


def main(rows=2**18, centres=4096):
    torch.manual_seed(0)
    model = nn.Sequential(RadialFeatures(centres=centres), nn.ReLU(), nn.Linear(64, 10)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in range(3):
        x = torch.randn(rows, 64, device=device)
        y = torch.randint(0, 10, (rows,), device=device)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()


if __name__ == "__main__":
    main(*map(int, sys.argv[1:]))
