"""Calibration pair eval_long_period: a loss estimate over 400 validation batches of 256 (no_grad) every 300 steps,
far beyond the doctor's 20-step window: found by watching the step clock after it.

slow: the estimate every 300 steps; fixed: every 3000 steps.
"""
# calibrates: periodic-work
# fixed-every: 3000
# expect: about x1.3 (the estimate is about a quarter of the run)
import torch
from torch import nn

from calib_clock import steps_from_argv, timed_steps

EVAL_EVERY = 300
EVAL_ITERS = 400
steps = steps_from_argv(default=1000)
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 10))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
x, y = torch.randn(64, 128), torch.randint(0, 10, (64,))
val_x, val_y = torch.randn(256, 128), torch.randint(0, 10, (256,))


@torch.no_grad()
def estimate_loss():
    model.eval()
    losses = torch.zeros(EVAL_ITERS)
    for k in range(EVAL_ITERS):
        losses[k] = nn.functional.cross_entropy(model(val_x), val_y)
    model.train()
    return losses.mean()


for step in timed_steps(steps, samples=len(x)):
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    if (step + 1) % EVAL_EVERY == 0:
        val_loss = estimate_loss()
