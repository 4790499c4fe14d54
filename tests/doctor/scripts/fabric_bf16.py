"""A Fabric script (no Trainer) on an fp32 MLP: the mixed-precision fix is said the Fabric way."""
import lightning as L
import torch
from torch import nn

torch.manual_seed(0)
fabric = L.Fabric(accelerator="cpu", devices=1)
model = nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 1024), nn.GELU(), nn.Linear(1024, 256))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
model, opt = fabric.setup(model, opt)
data = torch.randn(1024, 256)
for step in range(400):
    x = data[torch.randint(0, len(data), (128,))]
    loss = (model(x) - x).square().mean()  # doctor: no-mixed-precision
    fabric.backward(loss)
    opt.step()
    opt.zero_grad()
