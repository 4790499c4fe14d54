"""Calibration pair validate_often: a full validation pass (16 batches, under no_grad) every 5 steps.

slow: validation every 5 steps; fixed: every 50 steps.
"""
# calibrates: periodic-work
# fixed-every: 50
# expect: large (validation is most of the run)
import torch
from torch import nn

from calib_clock import steps_from_argv, timed_steps

VALIDATE_EVERY = 50
steps = steps_from_argv()
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
val = [(torch.randn(256, 256), torch.randint(0, 10, (256,))) for _ in range(16)]
for step in timed_steps(steps, samples=len(x)):
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    if (step + 1) % VALIDATE_EVERY == 0:
        model.eval()
        with torch.no_grad():
            val_loss = sum(nn.functional.cross_entropy(model(vx), vy) for vx, vy in val) / len(val)
        model.train()
