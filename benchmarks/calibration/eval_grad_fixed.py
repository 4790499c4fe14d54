"""Calibration pair eval_grad: validation every 10 steps runs model.eval() with autograd still on, so
every activation is kept for a backward that never comes.

slow: the validation loop without a grad guard; fixed: the validation loop under torch.no_grad().
"""
# calibrates: grad-in-validation
# expect: moderate (validation is a large share of the run; autograd makes its forward slower)
import torch
from torch import nn

from calib_clock import steps_from_argv, timed_steps

steps = steps_from_argv()
torch.manual_seed(0)
model = nn.Sequential(*[layer for _ in range(4) for layer in (nn.Linear(512, 512), nn.GELU())], nn.Linear(512, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(64, 512), torch.randint(0, 10, (64,))
val = [(torch.randn(256, 512), torch.randint(0, 10, (256,))) for _ in range(8)]


def evaluate():
    model.eval()
    correct = 0
    with torch.no_grad():
        for vx, vy in val:
            correct += (model(vx).argmax(1) == vy).sum()
    model.train()
    return correct


for step in timed_steps(steps, samples=len(x)):
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    if (step + 1) % 10 == 0:
        evaluate()
