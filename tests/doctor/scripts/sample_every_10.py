"""A character model that generates a sample every 10 steps (token by token, 48 forwards): sampling, not
validation, though its forwards run in eval mode under no_grad."""
import torch
from torch import nn


class CharModel(nn.Module):
    def __init__(self, vocab=32, dim=64):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.body = nn.Sequential(nn.Linear(dim, 256), nn.ReLU(), nn.Linear(256, vocab))

    def forward(self, idx):
        return self.body(self.embed(idx))

    @torch.no_grad()
    def generate(self, idx, tokens):
        for _ in range(tokens):
            logits = self(idx)[:, -1]  # doctor: periodic-work
            idx = torch.cat([idx, logits.softmax(-1).multinomial(1)], dim=1)
        return idx


torch.manual_seed(0)
data = torch.randint(0, 32, (4096,))
model = CharModel()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(200):
    start = torch.randint(0, len(data) - 33, (16,))
    x = torch.stack([data[s:s + 32] for s in start.tolist()])
    loss = nn.functional.cross_entropy(model(x[:, :-1]).flatten(0, 1), x[:, 1:].flatten())
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step % 10 == 0:
        model.eval()
        model.generate(x[:1, :8], 48)
        model.train()
