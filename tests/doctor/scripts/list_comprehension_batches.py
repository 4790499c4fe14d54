"""A language model's batches built per step by a Python list comprehension of slices, stacked: one indexing op
per sample, and the step waits on it (data loading leads). One gather (``data[ix[:, None] + arange]``) builds
the same batch."""
import torch
from torch import nn

torch.manual_seed(0)
vocab, block, batch = 96, 8, 256
data = torch.randint(0, vocab, (200_000,))


def get_batch():
    ix = torch.randint(len(data) - block - 1, (batch,))
    x = torch.stack([data[i:i + block] for i in ix])  # doctor: per-sample-batch
    y = torch.stack([data[i + 1:i + block + 1] for i in ix])
    return x, y


model = nn.Sequential(nn.Embedding(vocab, 16), nn.Linear(16, vocab))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(100_000):
    x, y = get_batch()
    loss = nn.functional.cross_entropy(model(x).view(-1, vocab), y.view(-1))
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
