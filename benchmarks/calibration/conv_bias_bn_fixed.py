"""Calibration pair conv_bias_bn: every convolution adds a bias that the BatchNorm right after it cancels.

slow: nn.Conv2d(..., bias=True) before each BatchNorm2d; fixed: bias=False.
"""
# calibrates: conv-bias-before-bn
# expect: small (one broadcast add and its gradient per convolution)
import torch
from torch import nn

from calib_clock import steps_from_argv, timed_steps


def block(cin, cout):
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU())


steps = steps_from_argv()
torch.manual_seed(0)
model = nn.Sequential(block(3, 16), block(16, 16), nn.MaxPool2d(2), block(16, 32), block(32, 32),
                      nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
x, y = torch.randn(32, 3, 16, 16), torch.randint(0, 10, (32,))
for step in timed_steps(steps, samples=len(x)):
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
