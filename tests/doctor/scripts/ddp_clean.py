"""DDP on gloo, every rank doing the same work: no rank holds the others back.

``--kill-rank R --kill-at N`` kills rank R (SIGKILL, as the OOM killer would) at its step N;
``--hang-rank R --hang-at N`` makes rank R wait forever at step N (a dead NFS mount, a deadlock)."""
import argparse
import os
import signal
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=300)
parser.add_argument("--kill-rank", type=int, default=-1)
parser.add_argument("--hang-rank", type=int, default=-1)
parser.add_argument("--kill-at", type=int, default=5)
parser.add_argument("--hang-at", type=int, default=5)
args = parser.parse_args()

torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DistributedDataParallel(nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                                              nn.Linear(512, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
data = [(torch.randn(128, 256), torch.randn(128, 1)) for _ in range(16)]

for step in range(args.steps):
    if rank == args.kill_rank and step == args.kill_at:
        os.kill(os.getpid(), signal.SIGKILL)
    if rank == args.hang_rank and step == args.hang_at:
        time.sleep(3600)
    x, y = data[step % len(data)]
    loss = nn.functional.mse_loss(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
dist.destroy_process_group()
