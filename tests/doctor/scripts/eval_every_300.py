"""A character bigram model that estimates its loss over 400 batches every 300 steps, as makemore-style
scripts do: a large share of the run's wall time, and a window of 20 steps never holds one."""
import torch
from torch import nn

torch.manual_seed(0)
vocab, block, batch = 65, 8, 32
eval_interval, eval_iters = 300, 400
data = torch.randint(0, vocab, (100_000,))


class Bigram(nn.Module):
    def __init__(self):
        super().__init__()
        self.table = nn.Embedding(vocab, vocab)

    def forward(self, idx):
        return self.table(idx)


def get_batch():
    ix = torch.randint(len(data) - block - 1, (batch,))
    offsets = ix[:, None] + torch.arange(block)
    return data[offsets], data[offsets + 1]


@torch.no_grad()
def estimate_loss():
    model.eval()
    losses = torch.zeros(eval_iters)
    for k in range(eval_iters):
        x, y = get_batch()
        logits = model(x)  # doctor: periodic-work
        losses[k] = nn.functional.cross_entropy(logits.view(-1, vocab), y.view(-1))
    model.train()
    return losses.mean()


model = Bigram()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
for step in range(100_000):
    if step % eval_interval == 0:
        print(f"step {step}: val loss {estimate_loss():.4f}")
    x, y = get_batch()
    loss = nn.functional.cross_entropy(model(x).view(-1, vocab), y.view(-1))
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
