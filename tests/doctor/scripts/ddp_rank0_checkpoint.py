"""DDP on gloo: rank 0 saves a checkpoint every step while the other ranks wait for it at the next gradient
all-reduce (work only one rank does)."""
import argparse
import os
import tempfile

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=300)
args = parser.parse_args()

torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DistributedDataParallel(nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                                              nn.Linear(1024, 1)))
opt = torch.optim.Adam(model.parameters(), lr=1e-3)  # its moments make the checkpoint 3x the model
data = [(torch.randn(8, 256), torch.randn(8, 1)) for _ in range(16)]
folder = tempfile.mkdtemp()

for step in range(args.steps):
    x, y = data[step % len(data)]
    loss = nn.functional.mse_loss(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    if rank == 0:
        torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, os.path.join(folder, "last.pt"))  # doctor: straggler
dist.destroy_process_group()
