"""A compiled character model fed batches of a new sequence length every step: torch.compile recompiles.

The batches are not padded, so the length changes from step to step; the first new length makes torch compile
the model again for the new shape (dynamic=True, torch._dynamo.mark_dynamic or padding to a few lengths avoid it).
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
        length = 16 + step * 5 % 24  # a new length most steps: sentences as they come
        tokens = torch.randint(0, VOCAB, (batch, length + 1), generator=generator)
        yield tokens[:, :-1], tokens[:, 1:]


def main(steps=30):
    torch.manual_seed(0)
    model = CharModel()
    # The eager backend keeps the corpus fast; Inductor recompiles on the same guards.
    compiled = torch.compile(model, backend="eager")
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for inputs, targets in batches(steps):
        logits = compiled(inputs)  # doctor: compile-recompile
        loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()


if __name__ == "__main__":
    main()
