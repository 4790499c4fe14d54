"""Calibration pair hand_layers: an MLP of wide blocks whose LayerNorm is a module written by hand (a mean, a
variance and a scale as separate ops), as LLMs-from-scratch writes it.

slow: the hand-written forward; fixed: torch.nn.functional.layer_norm with the same parameters.
"""
# calibrates: hand-written-layer
# expect: measured (each hand-written op is a pass over the 64 x 64 x 256 activations, forward and backward)
import torch
from torch import nn
from torch.nn import functional as F

from calib_clock import steps_from_argv, timed_steps

DIM = 256


class LayerNorm(nn.Module):
    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.eps, self.scale, self.shift = eps, nn.Parameter(torch.ones(dim)), nn.Parameter(torch.zeros(dim))

    def forward(self, x):
        return F.layer_norm(x, self.scale.shape, self.scale, self.shift, self.eps)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm, self.act, self.fc = LayerNorm(DIM), nn.GELU(approximate="tanh"), nn.Linear(DIM, DIM)

    def forward(self, x):
        return x + self.fc(self.act(self.norm(x)))


steps = steps_from_argv()
torch.manual_seed(0)
model = nn.Sequential(*[Block() for _ in range(4)], LayerNorm(DIM), nn.Linear(DIM, 16))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(64, 64, DIM), torch.randint(0, 16, (64 * 64,))
for step in timed_steps(steps, samples=len(x)):
    loss = F.cross_entropy(model(x).reshape(-1, 16), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
