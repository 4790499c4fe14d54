"""A model whose activations hold most of its memory: a wide block on a long batch, where what the forward saves
for backward is far more than the weights. The doctor must name ``wide`` (a ``WideBlock``) as the module that
holds the most, and checkpointing it must shrink what the step keeps."""

import torch
from torch import nn


class WideBlock(nn.Module):
    """Up to 512 features and back: each of its activations is 8x the size of its input."""

    def __init__(self, features, hidden):
        super().__init__()
        self.up = nn.Linear(features, hidden)
        self.act = nn.GELU()
        self.down = nn.Linear(hidden, features)

    def forward(self, x):  # doctor: activation-memory
        return x + self.down(self.act(self.up(x)))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Linear(64, 64)
        self.wide = WideBlock(64, 512)
        self.head = nn.Linear(64, 10)

    def forward(self, x):
        return self.head(torch.relu(self.wide(self.stem(x))))


def make_batch(n=256, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 64, generator=g), torch.randint(0, 10, (n,), generator=g)


def main():
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in range(40):
        x, y = make_batch(seed=step)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        print(f"step {step}: loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
