"""A Q-learning loop that redraws its progress when an episode ends, as PyTorch's DQN tutorial does (plot_durations
at each episode's end): in a few steps only, the untimed time before the next forward holds the redraw, at episodes
of 2 to 4 steps (as a new agent's first CartPole episodes are short). There is no DataLoader and no batch is built
there: the fix is to redraw less often, never workers.
"""
import random

import torch
from torch import nn

random.seed(0)
torch.manual_seed(0)
q_net = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 4))
optimizer = torch.optim.SGD(q_net.parameters(), lr=1e-3)
memory = torch.randn(512, 8)
durations = []


def redraw(history):
    # stands in for matplotlib: pure Python, about 60 ms (a sampler that sees one occurrence catches it often)
    canvas = [[(x * i + len(history)) % 7 for x in range(1000)] for i in range(900)]  # doctor: periodic-work
    return sum(map(sum, canvas))


episode_length, t = random.randint(2, 4), 0
for step in range(3000):
    batch = memory[torch.randint(0, 512, (32,))]
    loss = q_net(batch).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    t += 1
    if t == episode_length:  # the episode ends: when the environment says, not every N steps
        durations.append(t)
        redraw(durations)
        episode_length, t = random.randint(2, 4), 0
