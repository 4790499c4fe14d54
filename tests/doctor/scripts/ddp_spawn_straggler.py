"""DDP the PyTorch tutorials' way: ``python ddp_spawn_straggler.py`` spawns its ranks with
``torch.multiprocessing.spawn``, each running ``train(rank, world, args)``; one rank (``--slow-rank``) computes
more in its forward, and every other rank waits for it at the gradient all-reduce."""
import argparse
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel


class Net(nn.Module):
    def __init__(self, extra):
        super().__init__()
        self.inp, self.hidden, self.out = nn.Linear(128, 256), nn.Linear(256, 256), nn.Linear(256, 1)
        self.extra = extra

    def forward(self, x):
        h = torch.relu(self.inp(x))
        for _ in range(1 + self.extra):
            h = torch.tanh(self.hidden(h))  # the slow rank runs this many more times
        return self.out(h)


def train(rank, world, args):  # the ranks run this
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = DistributedDataParallel(Net(args.extra if rank == args.slow_rank else 0))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = [(torch.randn(64, 128), torch.randn(64, 1)) for _ in range(16)]
    for step in range(args.steps):
        x, y = data[step % len(data)]
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--slow-rank", type=int, default=1)
    parser.add_argument("--extra", type=int, default=48)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--world", type=int, default=2)
    args = parser.parse_args()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    mp.spawn(train, args=(args.world, args), nprocs=args.world, join=True)  # the ranks start here
