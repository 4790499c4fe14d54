"""A checkpoint written after every optimizer step."""
import os
import sys
import tempfile

import torch
from torch import nn

out_dir = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp()
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 512))
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
x = torch.randn(64, 512)

for step in range(300):
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step},  # doctor: save-in-loop
               os.path.join(out_dir, "last.pt"))
