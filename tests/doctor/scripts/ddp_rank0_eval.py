"""DDP on gloo: rank 0 alone evaluates on held-out batches every other step, while rank 1 waits for it at the
next gradient all-reduce (work only one rank does, every few steps)."""
import argparse

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
net = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1))
model = DistributedDataParallel(net)
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
data = [(torch.randn(32, 256), torch.randn(32, 1)) for _ in range(16)]
held_out = [(torch.randn(256, 256), torch.randn(256, 1)) for _ in range(20)]
EVAL_EVERY = 2  # rank 0 alone evaluates, every other step


def evaluate():
    net.eval()
    with torch.no_grad():
        total = sum(nn.functional.mse_loss(net(x), y) for x, y in held_out)  # doctor: straggler
    net.train()
    return total / len(held_out)


parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=300)
args = parser.parse_args()

for step in range(args.steps):
    x, y = data[step % len(data)]
    loss = nn.functional.mse_loss(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    if rank == 0 and step % EVAL_EVERY == 0:
        print(step, float(evaluate()))
dist.destroy_process_group()
