"""A small language model with the GPT-2 vocabulary size, 50257: not a multiple of 8."""
import torch
from torch import nn

VOCAB = 50257
torch.manual_seed(0)
tokens = torch.randint(0, VOCAB, (2048, 9))


class TinyLM(nn.Module):
    def __init__(self, vocab=VOCAB, dim=32):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)  # doctor: dims-not-multiple-of-8
        self.mix = nn.Linear(dim, dim)
        self.lm_head = nn.Linear(dim, vocab)  # doctor: dims-not-multiple-of-8

    def forward(self, ids):
        return self.lm_head(torch.relu(self.mix(self.embed(ids))))


model = TinyLM()
opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)
for step in range(200):
    batch = tokens[torch.randint(0, len(tokens), (4,))]
    logits = model(batch[:, :-1])
    loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), batch[:, 1:].reshape(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
