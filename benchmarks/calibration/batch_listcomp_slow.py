"""Calibration pair batch_listcomp: a language model's batch built per step by a list comprehension of
slices, stacked (one indexing op per sample), against the same batch built with one gather.

slow: torch.stack([data[i:i + BLOCK + 1] for i in ix]); fixed: data[ix[:, None] + torch.arange(BLOCK + 1)].
"""
# calibrates: per-sample-batch
# expect: about x2 (building the batch is about half of the step)
import torch
from torch import nn

from calib_clock import steps_from_argv, timed_steps

VOCAB, BLOCK, BATCH = 96, 8, 256
steps = steps_from_argv(default=300)
torch.manual_seed(0)
data = torch.randint(0, VOCAB, (200_000,))
model = nn.Sequential(nn.Embedding(VOCAB, 16), nn.Linear(16, VOCAB))
opt = torch.optim.SGD(model.parameters(), lr=0.1)


def get_batch():
    ix = torch.randint(len(data) - BLOCK - 1, (BATCH,))
    chunk = torch.stack([data[i:i + BLOCK + 1] for i in ix])
    return chunk[:, :-1], chunk[:, 1:]


for _step in timed_steps(steps, samples=BATCH):
    x, y = get_batch()
    loss = nn.functional.cross_entropy(model(x).reshape(-1, VOCAB), y.reshape(-1))
    opt.zero_grad()
    loss.backward()
    opt.step()
