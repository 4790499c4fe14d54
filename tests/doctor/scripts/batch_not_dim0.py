"""A tiny model fed 4 rows of 8 features it flattens into one sample (as a GAN's discriminator reads a whole
draw of a distribution): dimension 0 looks like a batch of 4 and is not one."""
import torch
from torch import nn


class WholeDraw(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 16), nn.ReLU(), nn.Linear(16, 1))

    def forward(self, draw):
        return self.net(draw.reshape(1, -1))


model = WholeDraw()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(400):
    draw = torch.randn(4, 8)
    loss = model(draw).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
