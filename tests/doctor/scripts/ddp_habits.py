"""DDP on gloo with three habits that cost every rank, each switched on by a flag:

``--threads-all`` every rank sizes torch's threads to all the machine's cores (as ``fabric run`` does);
``--find-unused`` DistributedDataParallel(find_unused_parameters=True) with every parameter used;
``--accumulate K`` K micro-batches per optimizer step, each one's backward all-reduced (no ``no_sync``);
``--unused-head`` a head no loss uses: with ``--find-unused`` the same parameters are unused at every step, a
static graph not declared (``static_graph``).
"""
import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=300)
parser.add_argument("--threads-all", action="store_true")
parser.add_argument("--find-unused", action="store_true")
parser.add_argument("--accumulate", type=int, default=1)
parser.add_argument("--unused-head", action="store_true")
args = parser.parse_args()

torch.set_num_threads(os.cpu_count() if args.threads_all else 1)
dist.init_process_group("gloo")
torch.manual_seed(0)
net = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 1))


class WithUnusedHead(nn.Module):
    def __init__(self, body):
        super().__init__()
        self.body, self.aux = body, nn.Linear(512, 10)  # in no loss

    def forward(self, x):
        return self.body(x)


model = DistributedDataParallel(WithUnusedHead(net) if args.unused_head else net, find_unused_parameters=args.find_unused)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
data = [(torch.randn(64, 256), torch.randn(64, 1)) for _ in range(16)]

for step in range(args.steps):
    for micro in range(args.accumulate):
        x, y = data[(step * args.accumulate + micro) % len(data)]
        loss = nn.functional.mse_loss(model(x), y) / args.accumulate
        loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
dist.destroy_process_group()
