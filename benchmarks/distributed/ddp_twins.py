"""One DDP training script (gloo) whose flags make it a slow or a fixed twin of benchmarks/doctor_distributed.py.

Slow habits: ``--threads-all`` (every rank sizes torch's threads to all cores), ``--find-unused``
(find_unused_parameters=True with every parameter used), ``--accumulate K`` without ``--no-sync`` (each
micro-batch's backward all-reduced), ``--rank0-save`` (rank 0 saves a checkpoint every step while the others
wait at the next all-reduce), ``--rank0-eval N`` (rank 0 alone evaluates 20 held-out batches every N steps),
``--slow-data-rank R`` (rank R waits 15 ms for every batch; with ``--loader`` the batches come from a
DataLoader without workers, whose dataset waits), and DDP's default
buckets (fixed by ``--bucket-settings``: gradient_as_bucket_view=True; the model's 6 tensors keep 2 buckets
at any bucket size). ``--fsdp`` shards each layer and the model with ``fully_shard`` instead of DDP (every
all-gather and reduce-scatter blocks the step on CPU); its fixed twin adds ``--no-reshard``
(reshard_after_forward=False: one all-gather per layer a step instead of two); with ``--accumulate K``
``--no-sync`` is ``set_requires_gradient_sync(False)`` on every micro-batch but the last. ``--unused-head`` adds
a head no loss uses (DDP then needs ``--find-unused``); its fixed twin adds ``--static-graph``.

Rank 0 times the loop itself: every step after ``--warmup`` with time.perf_counter, and prints
``STEP_MS <median ms per optimizer step>`` (every rank ends a step at the same all-reduce, so rank 0's step
is the job's); with ``--mean``, the mean step (work every few steps is in the mean only).
"""
import argparse
import contextlib
import os
import statistics
import tempfile
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=60)
parser.add_argument("--warmup", type=int, default=5)
parser.add_argument("--threads-all", action="store_true")
parser.add_argument("--find-unused", action="store_true")
parser.add_argument("--bucket-settings", action="store_true")  # the fixed twin of DDP's default buckets
parser.add_argument("--accumulate", type=int, default=1)
parser.add_argument("--no-sync", action="store_true")
parser.add_argument("--rank0-save", action="store_true")
parser.add_argument("--rank0-eval", type=int, default=0)
parser.add_argument("--slow-data-rank", type=int, default=-1)
parser.add_argument("--loader", action="store_true")
parser.add_argument("--mean", action="store_true")
parser.add_argument("--fsdp", action="store_true")
parser.add_argument("--no-reshard", action="store_true")  # the fixed twin of --fsdp
parser.add_argument("--unused-head", action="store_true")
parser.add_argument("--static-graph", action="store_true")  # the fixed twin of --find-unused --unused-head
args = parser.parse_args()

torch.set_num_threads(os.cpu_count() if args.threads_all else 1)
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
net = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1))


class WithUnusedHead(nn.Module):
    def __init__(self, body):
        super().__init__()
        self.body, self.aux = body, nn.Linear(1024, 10)  # aux: in no loss, so DDP must look for unused parameters

    def forward(self, x):
        return self.body(x)


keywords = dict(gradient_as_bucket_view=True) if args.bucket_settings else {}
if args.static_graph:
    keywords["static_graph"] = True
if args.fsdp:
    from torch.distributed.fsdp import fully_shard

    reshard = dict(reshard_after_forward=False) if args.no_reshard else {}
    for layer in net[::2]:
        fully_shard(layer, **reshard)
    model = fully_shard(net, **reshard)
else:
    wrapped = WithUnusedHead(net) if args.unused_head else net
    model = DistributedDataParallel(wrapped, find_unused_parameters=args.find_unused, **keywords)
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
data = [(torch.randn(64, 256), torch.randn(64, 1)) for _ in range(16)]
folder = tempfile.mkdtemp()
held_out = [(torch.randn(256, 256), torch.randn(256, 1)) for _ in range(20)]


def evaluate():
    net.eval()
    with torch.no_grad():
        total = sum(float(nn.functional.mse_loss(net(x), y)) for x, y in held_out)
    net.train()
    return total / len(held_out)


def batch(i):
    if rank == args.slow_data_rank:
        time.sleep(0.015)  # a slow disk or a costly transform on this rank only
    return data[i % len(data)]


class Batches(Dataset):
    """Each item a whole batch, read as ``batch`` reads it."""

    def __len__(self):
        return 1_000_000

    def __getitem__(self, i):
        return batch(i)


batches = iter(DataLoader(Batches(), batch_size=None)) if args.loader else None


times = []
for step in range(args.warmup + args.steps):
    started = time.perf_counter()
    for micro in range(args.accumulate):
        last = micro == args.accumulate - 1
        if args.fsdp:
            model.set_requires_gradient_sync(last or not args.no_sync)
            quiet = contextlib.nullcontext()
        else:
            quiet = model.no_sync() if args.no_sync and not last else contextlib.nullcontext()
        with quiet:
            x, y = next(batches) if batches is not None else batch(step * args.accumulate + micro)
            loss = nn.functional.mse_loss(model(x), y) / args.accumulate
            loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    if args.rank0_save and rank == 0:
        torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, os.path.join(folder, "last.pt"))
    if args.rank0_eval and rank == 0 and step % args.rank0_eval == 0:
        evaluate()
    if step >= args.warmup:
        times.append(time.perf_counter() - started)
if rank == 0:
    step_s = statistics.fmean(times) if args.mean else statistics.median(times)
    print(f"STEP_MS {step_s * 1e3:.3f}", flush=True)
dist.destroy_process_group()
