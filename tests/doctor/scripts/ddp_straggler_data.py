"""DDP on gloo: one rank (``--slow-rank``) waits longer for each batch than the others, as if its shard sat on a
slower disk; every other rank waits for it at the gradient all-reduce."""
import argparse
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset

parser = argparse.ArgumentParser()
parser.add_argument("--slow-rank", type=int, default=1)
parser.add_argument("--delay-ms", type=float, default=25.0)
parser.add_argument("--steps", type=int, default=300)
args = parser.parse_args()

torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()


class Shard(Dataset):
    def __len__(self):
        return 100_000

    def __getitem__(self, i):
        if rank == args.slow_rank and i % 64 == 0:
            time.sleep(args.delay_ms / 1e3)  # the slow rank's storage
        return torch.randn(128), torch.randn(1)


torch.manual_seed(0)
model = DistributedDataParallel(nn.Sequential(nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loader = DataLoader(Shard(), batch_size=64)  # doctor: straggler

for step, (x, y) in enumerate(loader):
    if step == args.steps:
        break
    loss = nn.functional.mse_loss(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
dist.destroy_process_group()
