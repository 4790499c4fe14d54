"""FSDP2 (``fully_shard``) on gloo: four residual blocks sharded one by one, then the root. On CPU every
all-gather and reduce-scatter blocks the step; ``--slow-rank`` makes one rank compute more in its forward.
``--fsdp1``: the older ``FullyShardedDataParallel`` wrapping each block instead. ``--accumulate K``: K
micro-batches per optimizer step, each one's gradients reduce-scattered (no set_requires_gradient_sync)."""
import argparse

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard

parser = argparse.ArgumentParser()
parser.add_argument("--slow-rank", type=int, default=-1)
parser.add_argument("--extra", type=int, default=24)
parser.add_argument("--width", type=int, default=768)
parser.add_argument("--steps", type=int, default=200)
parser.add_argument("--fsdp1", action="store_true")
parser.add_argument("--accumulate", type=int, default=1)
args = parser.parse_args()

torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()


class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.a, self.b = nn.Linear(width, width), nn.Linear(width, width)

    def forward(self, x):
        return x + self.b(torch.relu(self.a(x)))


class Net(nn.Module):
    def __init__(self, width, extra):
        super().__init__()
        self.blocks = nn.ModuleList(Block(width) for _ in range(4))
        self.head = nn.Linear(width, 1)
        self.extra = extra
        self.register_buffer("mix", torch.randn(width, width) / width**0.5)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        for _ in range(self.extra):
            x = torch.tanh(x @ self.mix)  # the slow rank's extra work
        return self.head(x)


torch.manual_seed(0)
model = Net(args.width, args.extra if rank == args.slow_rank else 0)
if args.fsdp1:
    from torch.distributed.fsdp import FullyShardedDataParallel
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    model = FullyShardedDataParallel(model, device_id=torch.device("cpu"), auto_wrap_policy=ModuleWrapPolicy({Block}))
else:
    for block in model.blocks:
        fully_shard(block)  # doctor: exposed-gradient-sync
    model = fully_shard(model)  # the sharded model comes back (FSDP2 shards in place)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
data = [(torch.randn(32, args.width), torch.randn(32, 1)) for _ in range(8)]
for step in range(args.steps):
    for micro in range(args.accumulate):
        x, y = data[(step * args.accumulate + micro) % len(data)]
        loss = nn.functional.mse_loss(model(x), y) / args.accumulate
        loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
dist.destroy_process_group()
