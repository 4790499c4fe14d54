"""DDP on gloo where the ranks' batches have sequence lengths of their own every step, as unbucketed text batches
do: here the long batch (448 tokens) and the short one (64) go to the ranks in turns, so whichever rank has the
short batch waits for the other, and no rank is late every step."""
import argparse

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=300)
parser.add_argument("--same-length", action="store_true", help="every rank the same length each step")
args = parser.parse_args()

torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DistributedDataParallel(nn.Sequential(nn.Linear(128, 512), nn.ReLU(), nn.Linear(512, 128)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)

for step in range(args.steps):
    length = 448 if args.same_length or (step + rank) % 2 == 0 else 64
    x = torch.randn(8, length, 128)
    loss = model(x).pow(2).mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
dist.destroy_process_group()
