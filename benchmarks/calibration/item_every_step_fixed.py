"""Calibration pair item_every_step: loss.item() after every step to keep a running loss; on a CPU the
call itself is cheap, so this fix should buy almost nothing here.

slow: running += loss.item(); fixed: running += loss.detach() (read once at the end).
"""
# calibrates: host-sync-in-loop
# expect: none on CPU (no device queue to drain)
import torch
from torch import nn

from calib_clock import steps_from_argv, timed_steps

steps = steps_from_argv()
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(128, 256), torch.randint(0, 10, (128,))
running = 0.0
for step in timed_steps(steps, samples=len(x)):
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    running += loss.detach()
print(f"mean loss {float(running) / (step + 1):.4f}")
