"""A deep, narrow MLP trained with an exponential moving average of its weights, updated one tensor at a time
after every step (the way many training scripts keep an EMA): 2 small ops per tensor, 50 tensors."""
import copy
import sys

import torch
from torch import nn

torch.manual_seed(0)
steps = int(sys.argv[sys.argv.index("--steps") + 1]) if "--steps" in sys.argv else 300
DECAY = 0.999

model = nn.Sequential(*[m for _ in range(24) for m in (nn.Linear(32, 32), nn.ReLU())], nn.Linear(32, 10))
ema = copy.deepcopy(model)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
data, labels = torch.randn(512, 32), torch.randint(0, 10, (512,))
for step in range(steps):
    i = step * 16 % 512
    loss = nn.functional.cross_entropy(model(data[i:i + 16]), labels[i:i + 16])
    opt.zero_grad()
    loss.backward()
    opt.step()
    with torch.no_grad():
        for e, p in zip(ema.parameters(), model.parameters()):  # doctor: non-foreach-update
            e.mul_(DECAY).add_(p, alpha=1 - DECAY)
print(f"ema loss {nn.functional.cross_entropy(ema(data), labels).item():.4f}")
