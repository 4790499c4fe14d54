"""A compiled model told to stay static (dynamic=False) and fed a new sequence length every step.

With dynamic=False torch compiles one graph per length; at its recompile limit (8 by default) it stops compiling
and runs the model eagerly for the rest of the run, saying so once in a warning most users never read.
dynamic=True compiles one graph for every length.
"""

import torch
from torch import nn

VOCAB = 48


class CharModel(nn.Module):
    def __init__(self, width=32):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, width)
        self.mix = nn.Sequential(nn.Linear(width, width), nn.GELU(), nn.Linear(width, width))
        self.out = nn.Linear(width, VOCAB)

    def forward(self, tokens):
        h = self.embed(tokens)
        h = h + self.mix(h)
        return self.out(h)


def batches(steps, batch=16):
    generator = torch.Generator().manual_seed(0)
    for step in range(steps):
        length = 12 + step % 20  # a new length at each of the first 20 steps
        tokens = torch.randint(0, VOCAB, (batch, length + 1), generator=generator)
        yield tokens[:, :-1], tokens[:, 1:]


def main(steps=40):
    torch.manual_seed(0)
    model = CharModel()
    # The eager backend keeps the corpus fast; Inductor hits the limit on the same guards.
    compiled = torch.compile(model, backend="eager", dynamic=False)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for inputs, targets in batches(steps):
        logits = compiled(inputs)  # doctor: compile-recompile
        loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()


if __name__ == "__main__":
    main()
