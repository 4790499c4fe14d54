"""Calibration pair channels_last: a small conv net in NCHW; oneDNN's CPU convolutions prefer NHWC.

slow: model and images in the default NCHW layout; fixed: both in torch.channels_last.
"""
# calibrates: channels-last
# expect: measured (oneDNN reorders NCHW tensors around each convolution)
import torch
from torch import nn

from calib_clock import steps_from_argv, timed_steps


def block(cin, cout):
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU())


steps = steps_from_argv()
torch.manual_seed(0)
model = nn.Sequential(block(3, 16), block(16, 32), nn.MaxPool2d(2), block(32, 32), block(32, 64),
                      nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10))
x, y = torch.randn(32, 3, 16, 16), torch.randint(0, 10, (32,))
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
for step in timed_steps(steps, samples=len(x)):
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
