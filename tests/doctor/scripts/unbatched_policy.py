"""A policy trained on one environment state at a time, as pytorch/examples' actor-critic does: each state is a `[4]`
vector with no batch dimension, so every step is one sample and per-op overhead is the step. Batching states (several
environments, or a replay buffer) is the fix; the doctor must read the batch as 1, not 4."""
import torch
from torch import nn

torch.manual_seed(0)
policy = nn.Sequential(nn.Linear(4, 64), nn.ReLU(), nn.Linear(64, 2))
optimizer = torch.optim.Adam(policy.parameters(), lr=1e-3)
state = torch.zeros(4)

for step in range(2000):
    state = 0.9 * state + 0.1 * torch.randn(4)  # the environment moves on
    logits = policy(state)  # doctor: small-batch
    loss = -torch.log_softmax(logits, dim=-1)[int(state[0] > 0)]
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
