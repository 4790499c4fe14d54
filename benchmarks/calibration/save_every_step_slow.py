"""Calibration pair save_every_step: a 6 MB checkpoint written with torch.save after every step.

slow: torch.save every step; fixed: every 50 steps (the same loop, one condition added).
"""
# calibrates: save-in-loop
# expect: large (serialising 6 MB costs more than the step)
import os
import shutil
import tempfile

import torch
from torch import nn

from calib_clock import steps_from_argv, timed_steps

steps = steps_from_argv()
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(256, 2048), nn.ReLU(), nn.Linear(2048, 512), nn.ReLU(), nn.Linear(512, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
folder = tempfile.mkdtemp(prefix="calib-ckpt-")
for step in timed_steps(steps, samples=len(x)):
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    torch.save({"model": model.state_dict(), "step": step}, os.path.join(folder, "last.pt"))
shutil.rmtree(folder)
